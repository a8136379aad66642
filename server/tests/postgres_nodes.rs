//! Two `dormant-server` processes sharing one PostgreSQL database (a throwaway cluster), each
//! session owned by one node at a time. The fencing test of issue 18: node A holds a session;
//! A is paused (SIGSTOP) past its lease; node B takes the session over and serves a submit and
//! the resumes; A is continued, and every write it attempts is refused and invisible; the
//! approval-gated tool, which is not safe to retry, runs once. And any node answers any
//! request: one for a session another live node owns is sent on to it.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use common::binary::Binary;
use reqwest::StatusCode;
use serde_json::{json, Value};

fn node(url: &str, key: &Path, name: &str) -> anyhow::Result<Binary> {
    let key = key.to_string_lossy().into_owned();
    Binary::start_with_env(
        Path::new(url),
        "127.0.0.1:0",
        &["--token-key-file", &key, "--node-name", name],
        &[],
    )
}

/// Nodes A and B on a throwaway cluster, sharing a token key (fields drop in order: the
/// nodes before the database).
struct Pair {
    a: Binary,
    b: Binary,
    _dir: tempfile::TempDir,
    cluster: dormant::testkit::PgCluster,
}

/// Two nodes, or `None` (after saying why) where PostgreSQL is not installed.
fn two_nodes() -> anyhow::Result<Option<Pair>> {
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(None);
    };
    let url = format!("postgres://postgres@{}", cluster.address());
    let dir = tempfile::tempdir()?;
    let key = dir.path().join("token-key");
    Ok(Some(Pair {
        a: node(&url, &key, "a")?,
        b: node(&url, &key, "b")?,
        _dir: dir,
        cluster,
    }))
}

fn signal(binary: &Binary, which: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args([which, &binary.child.id().to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill {which} failed");
    Ok(())
}

async fn post(
    base: &str,
    path: &str,
    token: &str,
    body: Value,
) -> anyhow::Result<(StatusCode, Value)> {
    let response = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await?;
    let status = response.status();
    Ok((status, response.json().await.unwrap_or_default()))
}

async fn get(base: &str, path: &str, session: &str, token: &str) -> anyhow::Result<Value> {
    Ok(reqwest::Client::new()
        .get(format!("{base}{path}"))
        .query(&[("session_id", session)])
        .bearer_auth(token)
        .send()
        .await?
        .json()
        .await?)
}

/// Sends `call` to the node at `base` as a call another node routed there (`POST /peer`, with
/// the node's key from the shared database): the node serves it itself, never further.
async fn peer_call(
    sql: &tokio_postgres::Client,
    base: &str,
    node: &str,
    call: Value,
) -> anyhow::Result<Value> {
    let key: String = sql
        .query_one(
            "SELECT peer_key FROM dormant_nodes WHERE node = $1",
            &[&node],
        )
        .await?
        .get(0);
    let answer = reqwest::Client::new()
        .post(format!("{base}/peer"))
        .header(dormant_server::PEER_KEY, key)
        .json(&call)
        .send()
        .await?;
    anyhow::ensure!(answer.status() == StatusCode::OK, "{}", answer.status());
    Ok(answer.json().await?)
}

/// Whether a node's answer to a call it served itself says another node owns the session.
fn owned_elsewhere(answer: &Value) -> bool {
    answer["answer"] == "failed"
        && ["session_unavailable", "lease_held", "lease_lost"]
            .contains(&answer["code"].as_str().unwrap_or_default())
}

/// Polls `GET /status` on `base` until `done` holds (the run goes on in another process), for
/// at most 20 s.
async fn until(
    base: &str,
    session: &str,
    token: &str,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let started = Instant::now();
    loop {
        let status = get(base, "/status", session, token).await?;
        if done(&status) {
            return Ok(status);
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(20),
            "stuck at {status}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn waiting<'a>(status: &'a Value, tool: &str) -> Option<&'a Value> {
    status["pending"]
        .as_array()?
        .iter()
        .find(|call| call["tool_name"] == tool && call["waiting"] == true)
}

/// Starts a demo session on the node at `base` and waits until it asks the user: its id,
/// token and the waiting `ask_user` call.
async fn start_waiting(base: &str) -> anyhow::Result<(String, String, Value)> {
    let started: Value = reqwest::Client::new()
        .post(format!("{base}/start"))
        .json(&json!({ "agent": "demo", "message": "weather in Porto" }))
        .send()
        .await?
        .json()
        .await?;
    let id = started["session_id"]
        .as_str()
        .context("session_id")?
        .to_string();
    let token = started["token"].as_str().context("token")?.to_string();
    let status = until(base, &id, &token, |s| waiting(s, "ask_user").is_some()).await?;
    let ask = waiting(&status, "ask_user").context("ask_user")?.clone();
    Ok((id, token, ask))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_loses_its_session_to_another_and_cannot_write_after() -> anyhow::Result<()> {
    let Some(Pair { a, b, cluster, .. }) = two_nodes()? else {
        return Ok(());
    };

    // The session starts on A, which takes its lease, and waits on ask_user.
    let (id, token, ask) = start_waiting(&a.base).await?;

    // B itself cannot write while A is alive and holds the lease (a call served on B, as one
    // another node routed there, which B never sends further).
    let (sql, connection) = tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let answer = json!({ "session_id": id, "tool_call_id": ask["tool_call_id"], "result": { "answer": "Fenced" } });
    let call = json!({ "call": "submit", "envelope": answer });
    let refused = peer_call(&sql, &b.base, "b", call).await?;
    assert!(owned_elsewhere(&refused), "{refused}");

    // A pauses past its lease (its expiry, by the database's clock, moved to the past): B
    // takes the session over and serves it to the end.
    signal(&a, "-STOP")?;
    sql.execute(
        "UPDATE dormant_leases SET expires_at = now() - interval '1 second' WHERE session = $1",
        &[&id],
    )
    .await?;
    let (code, body) = post(&b.base, "/submit-tool-result", &token, answer).await?;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, body) = post(&b.base, "/resume", &token, json!({ "session_id": id })).await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    let status = until(&b.base, &id, &token, |s| waiting(s, "publish").is_some()).await?;
    let publish = waiting(&status, "publish").context("publish")?.clone();
    let approval = json!({
        "kind": "approval-response", "session_id": id, "tool_call_id": publish["tool_call_id"],
        "approval_id": publish["approval_id"], "approved": true,
    });
    let (code, body) = post(&b.base, "/submit-tool-result", &token, approval).await?;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, body) = post(&b.base, "/resume", &token, json!({ "session_id": id })).await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    until(&b.base, &id, &token, |s| s["status"] == "completed").await?;
    let before = get(&b.base, "/messages", &id, &token).await?;

    // A continues, with the session still in memory: every write it attempts itself is
    // refused (calls served on A, as ones another node routed there, which A never sends on
    // to B).
    signal(&a, "-CONT")?;
    for attempt in 0..3 {
        let call = json!({
            "call": "start", "session": id, "agent": "demo",
            "message": "echo from a paused node", "new_only": false,
        });
        let refused = peer_call(&sql, &a.base, "a", call).await?;
        assert!(owned_elsewhere(&refused), "attempt {attempt}: {refused}");
    }
    let after = get(&b.base, "/messages", &id, &token).await?;
    assert_eq!(before, after, "nothing of A's writes is visible");
    let published = after["messages"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|m| m["role"] == "tool" && m["tool_name"] == "publish")
                .count()
        })
        .unwrap_or_default();
    assert_eq!(
        published, 1,
        "the tool that is not safe to retry ran once: {after}"
    );
    let owner = sql
        .query_one(
            "SELECT owner, epoch FROM dormant_leases WHERE session = $1",
            &[&id],
        )
        .await?;
    assert_eq!(owner.get::<_, String>(0), "b");
    assert!(owner.get::<_, i64>(1) >= 2);
    drop((a, b));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_node_answers_a_request_for_a_session_another_node_owns() -> anyhow::Result<()> {
    let Some(Pair { a, b, cluster, .. }) = two_nodes()? else {
        return Ok(());
    };

    // The session starts on A, which owns it while it waits on ask_user.
    let (id, token, ask) = start_waiting(&a.base).await?;

    // Its stream, asked of B, comes from A.
    let stream = reqwest::Client::new()
        .get(format!("{}/sse", b.base))
        .query(&[("session_id", id.as_str())])
        .bearer_auth(&token)
        .timeout(Duration::from_secs(20))
        .send()
        .await?;
    assert_eq!(stream.status(), StatusCode::OK);
    let events = stream.text().await?;
    assert!(events.contains("ask_user"), "{events}");

    // Everything else asked of B is answered by A, which keeps the session.
    let answer = json!({ "session_id": id, "tool_call_id": ask["tool_call_id"], "result": { "answer": "Porto" } });
    let (code, body) = post(&b.base, "/submit-tool-result", &token, answer.clone()).await?;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, body) = post(&b.base, "/submit-tool-result", &token, answer).await?;
    assert_eq!(code, StatusCode::CONFLICT, "a duplicate, through B: {body}");
    assert_eq!(body["code"], "already_completed");
    let (code, body) = post(&b.base, "/resume", &token, json!({ "session_id": id })).await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    let status = until(&b.base, &id, &token, |s| waiting(s, "publish").is_some()).await?;
    let publish = waiting(&status, "publish").context("publish")?.clone();
    let approval = json!({
        "kind": "approval-response", "session_id": id, "tool_call_id": publish["tool_call_id"],
        "approval_id": publish["approval_id"], "approved": true,
    });
    let (code, body) = post(&b.base, "/submit-tool-result", &token, approval).await?;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, body) = post(&b.base, "/resume", &token, json!({ "session_id": id })).await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    until(&b.base, &id, &token, |s| s["status"] == "completed").await?;

    let (sql, connection) = tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let owner: String = sql
        .query_one(
            "SELECT owner FROM dormant_leases WHERE session = $1",
            &[&id],
        )
        .await?
        .get(0);
    assert_eq!(owner, "a", "A kept the session: B sent every request on");
    let nodes: i64 = sql
        .query_one("SELECT count(*) FROM dormant_nodes", &[])
        .await?
        .get(0);
    assert_eq!(nodes, 2, "both nodes advertise their address");
    drop((a, b));
    Ok(())
}

/// Nodes started without `--node-name` each have a name of their own (the address each was
/// bound to, a port 0 resolved), not the `--listen` text they share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_without_a_name_are_named_apart() -> anyhow::Result<()> {
    let Some(cluster) = dormant::testkit::PgCluster::start()? else {
        return Ok(());
    };
    let url = format!("postgres://postgres@{}", cluster.address());
    let dir = tempfile::tempdir()?;
    let key = dir.path().join("token-key").to_string_lossy().into_owned();
    let unnamed = || {
        Binary::start_with_env(
            Path::new(&url),
            "127.0.0.1:0",
            &["--token-key-file", &key],
            &[],
        )
    };
    let (a, b) = (unnamed()?, unnamed()?);
    let (sql, connection) = tokio_postgres::connect(&cluster.url(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let mut names: Vec<String> = sql
        .query("SELECT node FROM dormant_nodes", &[])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    names.sort();
    let mut expected: Vec<String> = [&a, &b]
        .iter()
        .map(|node| node.base.trim_start_matches("http://").to_string())
        .collect();
    expected.sort();
    assert_eq!(names, expected);
    drop((a, b));
    Ok(())
}
