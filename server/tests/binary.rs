//! The binary: it refuses to start without authentication (creating nothing), documents its
//! flags, inspects only stores that exist, keeps tokens and sessions across a graceful
//! restart, never loses or doubles an acknowledged answer when it is killed while a
//! submit is in flight, and inspects a damaged store only to salvage it, failing either way.

mod common;

use std::process::Command;
use std::time::Duration;

use common::binary::Binary;
use common::{answer, pending, text};
use reqwest::StatusCode;
use serde_json::{json, Value};

#[test]
fn without_authentication_it_refuses_to_start_and_help_documents_every_flag() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let output = Command::new(env!("CARGO_BIN_EXE_dormant-server"))
        .args(["--listen", "127.0.0.1:0", "--demo", "--store"])
        .arg(dir.path().join("store"))
        .output()?;
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr)?;
    assert!(stderr.contains("no authentication configured"), "{stderr}");
    assert!(stderr.contains("--allow-unauthenticated"), "{stderr}");
    assert!(stderr.contains("--api-key-env"), "{stderr}");
    // Refused before anything was opened or written.
    let left: Vec<_> = std::fs::read_dir(dir.path())?.collect();
    assert!(left.is_empty(), "{left:?}");

    let help = Command::new(env!("CARGO_BIN_EXE_dormant-server"))
        .arg("--help")
        .output()?;
    let help = String::from_utf8(help.stdout)?;
    for flag in [
        "--listen",
        "--store",
        "--demo",
        "--allow-unauthenticated",
        "--api-key-env",
        "--max-body-bytes",
        "--request-timeout-ms",
        "--sse-idle-timeout-ms",
        "--cors-origin",
        "--client-tool-timeout-ms",
        "--max-resident",
        "--token-key-file",
        "--node-name",
        "--lease-ttl-ms",
        "--advertise",
        "--delegate-to",
        "--remote-key-env",
        "inspect",
    ] {
        assert!(
            help.contains(flag),
            "--help does not mention {flag}:\n{help}"
        );
    }
    Ok(())
}

/// A node of a PostgreSQL cluster that listens on every interface and does not say where the
/// others reach it advertises the machine's name and its port (it would otherwise advertise
/// 0.0.0.0, and every node so started would share one name). Seen in its log before it
/// connects, so no database is needed here: the connection then fails.
#[test]
fn a_cluster_node_listening_everywhere_advertises_the_machines_name() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let output = Command::new(env!("CARGO_BIN_EXE_dormant-server"))
        .args(["--listen", "0.0.0.0:0", "--demo", "--allow-unauthenticated"])
        .args([
            "--store",
            "postgres://nobody@127.0.0.1:1/none",
            "--token-key-file",
        ])
        .arg(dir.path().join("token-key"))
        .env("RUST_LOG", "info")
        .output()?;
    let stderr = String::from_utf8(output.stderr)?;
    assert!(!output.status.success(), "{stderr}");
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")?;
    assert!(
        stderr.contains("server.advertised_by_machine_name"),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("{}:", name.trim())), "{stderr}");
    assert!(stderr.contains("PostgreSQL store"), "{stderr}");
    Ok(())
}

/// inspect only reads: where no store is (a typo, a database URL), it says so and creates none.
#[test]
fn inspect_creates_no_store_where_none_is() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    for store in [
        dir.path().join("typo"),
        "postgres://u@127.0.0.1:1/db".into(),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_dormant-server"))
            .current_dir(dir.path())
            .args(["inspect", "--store"])
            .arg(&store)
            .output()?;
        let stderr = String::from_utf8(output.stderr)?;
        assert!(!output.status.success(), "{store:?}: {stderr}");
        assert!(stderr.contains("inspect reads"), "{stderr}");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path())?.collect();
    assert!(left.is_empty(), "{left:?}");
    Ok(())
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    async fn post(
        &self,
        path: &str,
        token: Option<&str>,
        body: &Value,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let mut request = self.http.post(format!("{}{path}", self.base)).json(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        answer(request.send().await?).await
    }

    async fn status(&self, id: &str, token: &str) -> anyhow::Result<Value> {
        let response = self
            .http
            .get(format!("{}/status?session_id={id}", self.base))
            .bearer_auth(token)
            .send()
            .await?;
        Ok(answer(response).await?.1)
    }

    /// Starts a session and waits (through its stream) until it waits on ask_user.
    async fn suspended_session(&self) -> anyhow::Result<(String, String)> {
        let (code, started) = self
            .post(
                "/start",
                None,
                &json!({ "agent": "demo", "message": "weather in Porto" }),
            )
            .await?;
        anyhow::ensure!(code == StatusCode::ACCEPTED, "{started}");
        let (id, token) = (text(&started, "session_id")?, text(&started, "token")?);
        let stream = self
            .http
            .get(format!("{}/sse?session_id={id}&token={token}", self.base))
            .send()
            .await?;
        stream.text().await?; // ends when the run suspends
        Ok((id, token))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_restart_keeps_sessions_tokens_and_pending_calls() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let server = Binary::start(&store, "127.0.0.1:0", &[])?;
    let client = Client {
        http: reqwest::Client::new(),
        base: server.base.clone(),
    };
    let (id, token) = client.suspended_session().await?;
    let status = server.terminate()?;
    assert!(
        status.success(),
        "a graceful shutdown exits 0, not {status}"
    );

    let server = Binary::start(&store, "127.0.0.1:0", &[])?;
    let client = Client {
        http: reqwest::Client::new(),
        base: server.base.clone(),
    };
    let status = client.status(&id, &token).await?;
    let call = text(pending(&status, "client")?, "tool_call_id")?;
    let envelope = json!({ "session_id": id, "tool_call_id": call, "result": { "answer": "after a restart" } });
    let (code, _) = client
        .post("/submit-tool-result", Some(&token), &envelope)
        .await?;
    assert_eq!(
        code,
        StatusCode::OK,
        "the token issued before the restart still opens the session"
    );
    server.kill()?;

    // inspect reads the stopped store: the session, its answered call.
    let output = Command::new(env!("CARGO_BIN_EXE_dormant-server"))
        .args(["inspect", "--store"])
        .arg(&store)
        .output()?;
    let report = String::from_utf8(output.stdout)?;
    assert!(output.status.success(), "{report}");
    assert!(
        report.contains(&format!("session {id}: agent demo, suspended_client_tool")),
        "{report}"
    );
    assert!(
        report
            .contains("pending ask_user-1 ask_user (client tool), answered, waiting for a resume"),
        "{report}"
    );
    assert!(
        report.contains("tool lookup_weather (lookup_weather-1)"),
        "{report}"
    );
    Ok(())
}

/// A store whose mark of acknowledged commits is unreadable cannot tell what it lost: inspect
/// refuses it and exits non-zero; `--salvage` reports what is left under the damage, still
/// non-zero, and leaves the damage as it found it: inspect refuses the store again after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_refuses_a_damaged_store_and_salvage_reports_what_is_left() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let runtime = common::demo_runtime(std::sync::Arc::new(dormant::SledStore::open(&store)?))?;
    let id: dormant::SessionId = "damaged-1".parse()?;
    runtime.execute_on(&id, "demo", "hello").await?;
    runtime.shutdown().await?;
    let mark = store.join("acknowledged");
    assert!(
        mark.is_file(),
        "the store keeps its mark beside sled's files"
    );
    std::fs::write(&mark, [0xEE; 32])?;
    let refuses = || -> anyhow::Result<()> {
        let refused = Command::new(env!("CARGO_BIN_EXE_dormant-server"))
            .args(["inspect", "--store"])
            .arg(&store)
            .output()?;
        let stderr = String::from_utf8(refused.stderr)?;
        assert!(!refused.status.success(), "{stderr}");
        assert!(stderr.contains("damaged"), "{stderr}");
        assert!(stderr.contains("inspect --salvage"), "{stderr}");
        assert!(
            refused.stdout.is_empty(),
            "nothing is reported of a refused store"
        );
        Ok(())
    };
    refuses()?;

    let salvaged = Command::new(env!("CARGO_BIN_EXE_dormant-server"))
        .args(["inspect", "--salvage", "--store"])
        .arg(&store)
        .output()?;
    let report = String::from_utf8(salvaged.stdout)?;
    let stderr = String::from_utf8(salvaged.stderr)?;
    assert!(
        !salvaged.status.success(),
        "salvaged is still damaged: {report}"
    );
    assert!(report.starts_with("DAMAGED: "), "{report}");
    assert!(report.contains("1 session(s)"), "{report}");
    assert!(report.contains("session damaged-1: agent demo"), "{report}");
    assert!(stderr.contains("what is left"), "{stderr}");
    assert_eq!(std::fs::read(&mark)?, [0xEE; 32], "salvage writes no mark");
    refuses()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submit_racing_a_kill_is_applied_once_if_it_was_acknowledged() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let mut server = Binary::start(&store, "127.0.0.1:0", &[])?;
    let port = server.port()?.to_string();
    let listen = format!("127.0.0.1:{port}");
    let mut acknowledged = 0;
    for round in 0..6u64 {
        let client = Client {
            http: reqwest::Client::new(),
            base: server.base.clone(),
        };
        let (id, token) = client.suspended_session().await?;
        let answer_text = format!("round {round}");
        let envelope = json!({ "session_id": id, "tool_call_id": "ask_user-1", "result": { "answer": answer_text } });
        // The submit and the kill race: the kill lands before, during or after the commit.
        let submit = {
            let (client, token, envelope) = (
                Client {
                    http: client.http.clone(),
                    base: client.base.clone(),
                },
                token.clone(),
                envelope.clone(),
            );
            tokio::spawn(async move {
                client
                    .post("/submit-tool-result", Some(&token), &envelope)
                    .await
            })
        };
        // From at once to 16 ms: early kills find the submit unread, late ones acknowledged.
        tokio::time::sleep(Duration::from_millis((1 << round) / 2)).await;
        server.kill()?;
        let first = submit.await?;
        server = Binary::start(&store, &listen, &[])?;
        let client = Client {
            http: reqwest::Client::new(),
            base: server.base.clone(),
        };
        let (code, _) = client
            .post("/submit-tool-result", Some(&token), &envelope)
            .await?;
        match first {
            Ok((StatusCode::OK, _)) => {
                acknowledged += 1;
                assert_eq!(
                    code,
                    StatusCode::CONFLICT,
                    "an acknowledged answer survives the kill"
                );
            }
            // Not acknowledged: it may or may not have become durable; the retry settles it.
            _ => assert!(
                matches!(code, StatusCode::OK | StatusCode::CONFLICT),
                "{code}"
            ),
        }
        let (code, resumed) = client
            .post("/resume", Some(&token), &json!({ "session_id": id }))
            .await?;
        assert_eq!(code, StatusCode::ACCEPTED);
        // Follow the resumed run until it suspends at the approval gate.
        let path = format!(
            "{}/sse?session_id={id}&token={token}&from={}",
            client.base, resumed["from_seq"]
        );
        client.http.get(path).send().await?.text().await?;
        let status = client.status(&id, &token).await?;
        let approval = pending(&status, "approval")?;
        assert_eq!(
            approval["input"]["title"],
            answer_text.as_str(),
            "the answer was applied"
        );
        let response = client
            .http
            .get(format!("{}/messages?session_id={id}", client.base))
            .bearer_auth(&token)
            .send()
            .await?;
        let (_, messages) = answer(response).await?;
        let results: Vec<&Value> = messages["messages"]
            .as_array()
            .map(|all| {
                all.iter()
                    .filter(|message| message["tool_call_id"] == "ask_user-1")
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(
            results.len(),
            1,
            "the answer is applied exactly once: {messages}"
        );
        assert_eq!(
            results[0]["outcome"]["result"]["answer"],
            answer_text.as_str()
        );
    }
    eprintln!("{acknowledged} of 6 submits were acknowledged before their kill");
    Ok(())
}
