//! Remote sub-agents across real processes: a parent `dormant-server` whose demo agent
//! delegates to the demo agent of a second `dormant-server` (`--delegate-to`), each with its
//! own sled store, on loopback. Both are SIGKILLed at the waiting points (the child suspended;
//! an answer accepted at the remote; a resume in flight) and restarted on their stores and
//! ports; every acknowledged answer is applied exactly once, and the approval-gated tool,
//! which is not safe to retry, runs once. The same kills run with the parent speaking A2A to
//! the remote's A2A endpoint (`--delegate-to a2a+http://…`): the SIGKILL test across the A2A
//! boundary of issue 33.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use common::binary::Binary;
use common::processes::{pending_named, Client};
use reqwest::StatusCode;
use serde_json::{json, Value};

const KEY_VAR: &str = "DORMANT_TEST_REMOTE_KEY";
const KEY: &str = "a-remote-key-of-at-least-16-chars";

fn remote(store: &Path, listen: &str) -> anyhow::Result<Binary> {
    Binary::start_with_env(
        store,
        listen,
        &["--api-key-env", KEY_VAR],
        &[(KEY_VAR, KEY)],
    )
}

fn parent(store: &Path, listen: &str, remote: &str) -> anyhow::Result<Binary> {
    Binary::start_with_env(
        store,
        listen,
        &["--delegate-to", remote, "--remote-key-env", KEY_VAR],
        &[(KEY_VAR, KEY)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_parents_and_remotes_apply_every_acknowledged_answer_once() -> anyhow::Result<()> {
    let dirs = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (parent_store, remote_store) = (dirs.0.path().join("parent"), dirs.1.path().join("remote"));
    let client = Client::new();

    let far = remote(&remote_store, "127.0.0.1:0")?;
    let far_listen = format!("127.0.0.1:{}", far.port()?);
    let near = parent(&parent_store, "127.0.0.1:0", &far.base)?;
    let near_listen = format!("127.0.0.1:{}", near.port()?);
    let base = near.base.clone();

    let (code, started) = client
        .post(
            &base,
            "/start",
            None,
            json!({ "agent": "demo", "message": "delegate weather in Porto" }),
        )
        .await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{started}");
    let root = started["session_id"]
        .as_str()
        .context("session_id")?
        .to_string();
    let token = started["token"].as_str().context("token")?.to_string();
    let child = format!("{root}-sub-delegate-1");

    // The remote child asks the user: the root lists the call, owned by the remote child.
    let status = client
        .until(&base, &root, &token, "the remote ask_user", |s| {
            pending_named(s, "ask_user").is_some()
        })
        .await?;
    assert_eq!(status["status"], "suspended_awaiting_children", "{status}");
    let ask = pending_named(&status, "ask_user")
        .context("ask_user")?
        .clone();
    assert_eq!(ask["session_id"], child.as_str());
    let call = ask["tool_call_id"].as_str().context("call")?.to_string();

    // What a status shows may be applied in the store and not yet flushed: once the tree is
    // settled, the root's suspension was acknowledged by the store (its commit returned), so
    // the kill cannot take it back.
    let response = client
        .http
        .get(format!("{base}/status"))
        .query(&[("session_id", root.as_str()), ("settle_ms", "10000")])
        .bearer_auth(&token)
        .send()
        .await?;
    let settled: Value = response.json().await?;
    assert_eq!(settled["settled"], true, "{settled}");

    // Kill the parent while the child waits; restart it on its store and port.
    near.kill()?;
    let near = parent(&parent_store, &near_listen, &far.base)?;
    let status = client.status(&base, &root, &token).await?;
    assert!(
        pending_named(&status, "ask_user").is_some(),
        "after the restart: {status}"
    );

    // The remote down: a submit at the root is retryable and stores nothing.
    far.kill()?;
    let answer =
        json!({ "session_id": root, "tool_call_id": call, "result": { "answer": "Sunny days" } });
    let (code, body) = client
        .post(&base, "/submit-tool-result", Some(&token), answer.clone())
        .await?;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["code"], "remote_unavailable");

    // Back: the same submit is accepted, then SIGKILL the remote right after it acknowledged.
    let far = remote(&remote_store, &far_listen)?;
    let (code, body) = client
        .post(&base, "/submit-tool-result", Some(&token), answer.clone())
        .await?;
    assert_eq!(code, StatusCode::OK, "{body}");
    far.kill()?;
    let far = remote(&remote_store, &far_listen)?;
    let (code, body) = client
        .post(&base, "/submit-tool-result", Some(&token), answer)
        .await?;
    assert_eq!(
        code,
        StatusCode::CONFLICT,
        "a duplicate after the restart: {body}"
    );

    // A resume in flight, and the parent killed: the restarted parent resumes again.
    let (code, body) = client
        .post(
            &base,
            "/resume",
            Some(&token),
            json!({ "session_id": root }),
        )
        .await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    near.kill()?;
    let near = parent(&parent_store, &near_listen, &far.base)?;
    let status = client.status(&base, &root, &token).await?;
    if pending_named(&status, "publish").is_none() {
        let (code, body) = client
            .post(
                &base,
                "/resume",
                Some(&token),
                json!({ "session_id": root }),
            )
            .await?;
        assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    }
    let status = client
        .until(&base, &root, &token, "the remote approval", |s| {
            pending_named(s, "publish").is_some()
        })
        .await?;
    let publish = pending_named(&status, "publish")
        .context("publish")?
        .clone();
    assert_eq!(publish["kind"], "approval");

    let approval = json!({
        "kind": "approval-response", "session_id": root,
        "tool_call_id": publish["tool_call_id"], "approval_id": publish["approval_id"], "approved": true,
    });
    let (code, body) = client
        .post(&base, "/submit-tool-result", Some(&token), approval)
        .await?;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, body) = client
        .post(
            &base,
            "/resume",
            Some(&token),
            json!({ "session_id": root }),
        )
        .await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    let status = client
        .until(&base, &root, &token, "the root to complete", |s| {
            s["status"] == "completed"
        })
        .await?;
    let text = status["text"].as_str().unwrap_or_default();
    assert!(text.contains("Published \"Sunny days\""), "{status}");

    // At the remote: the answer applied once, the tool that is not safe to retry ran once.
    let messages: Value = client
        .http
        .get(format!("{}/messages", far.base))
        .query(&[("session_id", child.as_str())])
        .header("x-api-key", KEY)
        .send()
        .await?
        .json()
        .await?;
    let results = |tool: &str| {
        messages["messages"]
            .as_array()
            .map(|all| {
                all.iter()
                    .filter(|m| m["role"] == "tool" && m["tool_name"] == tool)
                    .count()
            })
            .unwrap_or_default()
    };
    assert_eq!(results("ask_user"), 1, "{messages}");
    assert_eq!(results("publish"), 1, "{messages}");
    drop(near);
    drop(far);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_two_hops_answered_at_the_root_after_the_middle_is_killed(
) -> anyhow::Result<()> {
    let dirs = (
        tempfile::tempdir()?,
        tempfile::tempdir()?,
        tempfile::tempdir()?,
    );
    let client = Client::new();
    let far = remote(&dirs.0.path().join("far"), "127.0.0.1:0")?;
    // The middle both accepts the parent's key and sends it on.
    let middle_store = dirs.1.path().join("middle");
    let middle_args = |listen: &str| {
        Binary::start_with_env(
            &middle_store,
            listen,
            &[
                "--api-key-env",
                KEY_VAR,
                "--delegate-to",
                &far.base,
                "--remote-key-env",
                KEY_VAR,
            ],
            &[(KEY_VAR, KEY)],
        )
    };
    let middle = middle_args("127.0.0.1:0")?;
    let middle_listen = format!("127.0.0.1:{}", middle.port()?);
    let near = parent(&dirs.2.path().join("near"), "127.0.0.1:0", &middle.base)?;
    let base = near.base.clone();

    let (code, started) = client
        .post(
            &base,
            "/start",
            None,
            json!({ "agent": "demo", "message": "delegate delegate weather in Faro" }),
        )
        .await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{started}");
    let root = started["session_id"]
        .as_str()
        .context("session_id")?
        .to_string();
    let token = started["token"].as_str().context("token")?.to_string();
    let status = client
        .until(&base, &root, &token, "the ask_user two hops down", |s| {
            pending_named(s, "ask_user").is_some()
        })
        .await?;
    let ask = pending_named(&status, "ask_user")
        .context("ask_user")?
        .clone();
    assert_eq!(
        ask["session_id"],
        format!("{root}-sub-delegate-1-sub-delegate-1").as_str()
    );

    // The middle dies and comes back: the answer still finds its way two hops down.
    middle.kill()?;
    let middle = middle_args(&middle_listen)?;
    let answer = json!({ "session_id": root, "tool_call_id": ask["tool_call_id"], "result": { "answer": "Two hops" } });
    let (code, body) = client
        .post(&base, "/submit-tool-result", Some(&token), answer)
        .await?;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, body) = client
        .post(
            &base,
            "/resume",
            Some(&token),
            json!({ "session_id": root }),
        )
        .await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    let status = client
        .until(&base, &root, &token, "the approval two hops down", |s| {
            pending_named(s, "publish").is_some()
        })
        .await?;
    let publish = pending_named(&status, "publish")
        .context("publish")?
        .clone();
    let approval = json!({
        "kind": "approval-response", "session_id": root, "tool_call_id": publish["tool_call_id"],
        "approval_id": publish["approval_id"], "approved": false, "reason": "not today",
    });
    let (code, body) = client
        .post(&base, "/submit-tool-result", Some(&token), approval)
        .await?;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, body) = client
        .post(
            &base,
            "/resume",
            Some(&token),
            json!({ "session_id": root }),
        )
        .await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    let status = client
        .until(&base, &root, &token, "the root to complete", |s| {
            s["status"] == "completed"
        })
        .await?;
    let text = status["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("Not published"),
        "the denial travelled up two hops: {status}"
    );
    drop((near, middle, far));
    Ok(())
}

/// Where a process is SIGKILLed in [`kill_at`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Point {
    /// The remote child waits on its client tool.
    ChildSuspended,
    /// The remote acknowledged the answer forwarded from the root.
    AnswerAccepted,
    /// The root's resume was acknowledged; its cascade is on its way.
    ResumeInFlight,
}

/// One walk through the delegated demo with `who` (the parent, or the remote) SIGKILLed at
/// `point` and restarted on its store and port, the parent speaking dormant's own remote
/// protocol or, `over_a2a`, A2A (`a2a+…`) to the remote's A2A endpoint. Ends with the
/// remote's messages.
async fn kill_at(kill_parent: bool, point: Point, over_a2a: bool) -> anyhow::Result<Value> {
    let dirs = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (parent_store, remote_store) = (dirs.0.path().join("parent"), dirs.1.path().join("remote"));
    let client = Client::new();
    let mut far = remote(&remote_store, "127.0.0.1:0")?;
    let far_listen = format!("127.0.0.1:{}", far.port()?);
    let far_base = far.base.clone();
    let endpoint = if over_a2a {
        format!("a2a+{far_base}")
    } else {
        far_base.clone()
    };
    let mut near = parent(&parent_store, "127.0.0.1:0", &endpoint)?;
    let near_listen = format!("127.0.0.1:{}", near.port()?);
    let base = near.base.clone();
    let what = format!(
        "the {} killed at {point:?}, over A2A: {over_a2a}",
        if kill_parent { "parent" } else { "remote" }
    );
    // SIGKILL one of the two and start it again where it was.
    let crash = |near: Binary, far: Binary| -> anyhow::Result<(Binary, Binary)> {
        if kill_parent {
            near.kill()?;
            Ok((parent(&parent_store, &near_listen, &endpoint)?, far))
        } else {
            far.kill()?;
            Ok((near, remote(&remote_store, &far_listen)?))
        }
    };

    let (_, started) = client
        .post(
            &base,
            "/start",
            None,
            json!({ "agent": "demo", "message": "delegate weather in Porto" }),
        )
        .await?;
    let root = started["session_id"]
        .as_str()
        .context("session_id")?
        .to_string();
    let token = started["token"].as_str().context("token")?.to_string();
    let status = client
        .until(&base, &root, &token, "ask_user", |s| {
            pending_named(s, "ask_user").is_some()
        })
        .await?;
    let call = pending_named(&status, "ask_user").context("ask_user")?["tool_call_id"].clone();
    if point == Point::ChildSuspended {
        (near, far) = crash(near, far)?;
    }
    let answer =
        json!({ "session_id": root, "tool_call_id": call, "result": { "answer": "Once" } });
    let (code, body) = client
        .post(&base, "/submit-tool-result", Some(&token), answer.clone())
        .await?;
    assert_eq!(code, StatusCode::OK, "{point:?}: {body}");
    if point == Point::AnswerAccepted {
        (near, far) = crash(near, far)?;
    }
    let (code, body) = client
        .post(&base, "/submit-tool-result", Some(&token), answer)
        .await?;
    assert_eq!(code, StatusCode::CONFLICT, "{point:?}: a duplicate: {body}");
    let (code, body) = client
        .post(
            &base,
            "/resume",
            Some(&token),
            json!({ "session_id": root }),
        )
        .await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{point:?}: {body}");
    if point == Point::ResumeInFlight {
        (near, far) = crash(near, far)?;
    }
    // A crash may have cut the run: resume again until the approval is asked for. A parent
    // killed before it recorded what its watch of the child learned after the answer still
    // lists the answered call: a person answers it again, which is a duplicate there and
    // makes the parent look at the child.
    let started = Instant::now();
    let mut answered_again: Option<Instant> = None;
    let publish = loop {
        let status = client.status(&base, &root, &token).await?;
        if let Some(publish) = pending_named(&status, "publish") {
            break publish.clone();
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(20),
            "{what}: stuck at {status}"
        );
        let listed = pending_named(&status, "ask_user").is_some();
        if listed && answered_again.is_none_or(|at| at.elapsed() > Duration::from_secs(1)) {
            answered_again = Some(Instant::now());
            let again =
                json!({ "session_id": root, "tool_call_id": call, "result": { "answer": "Once" } });
            let (code, body) = client
                .post(&base, "/submit-tool-result", Some(&token), again)
                .await?;
            // A duplicate there, or the remote still restarting: never a second answer.
            assert!(
                code == StatusCode::CONFLICT || code == StatusCode::SERVICE_UNAVAILABLE,
                "{what}: answered again: {code} {body}"
            );
        }
        if status["status"] != "running" && !listed {
            let _ = client
                .post(
                    &base,
                    "/resume",
                    Some(&token),
                    json!({ "session_id": root }),
                )
                .await?;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let approval = json!({
        "kind": "approval-response", "session_id": root, "tool_call_id": publish["tool_call_id"],
        "approval_id": publish["approval_id"], "approved": true,
    });
    let (code, body) = client
        .post(&base, "/submit-tool-result", Some(&token), approval)
        .await?;
    assert_eq!(code, StatusCode::OK, "{point:?}: {body}");
    let (code, body) = client
        .post(
            &base,
            "/resume",
            Some(&token),
            json!({ "session_id": root }),
        )
        .await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{point:?}: {body}");
    let status = client
        .until(&base, &root, &token, &format!("completion ({what})"), |s| {
            s["status"] == "completed"
        })
        .await?;
    assert!(
        status["text"]
            .as_str()
            .unwrap_or_default()
            .contains("Published \"Once\""),
        "{point:?}: {status}"
    );
    let child = format!("{root}-sub-delegate-1");
    let messages: Value = client
        .http
        .get(format!("{}/messages", far.base))
        .query(&[("session_id", child.as_str())])
        .header("x-api-key", KEY)
        .send()
        .await?
        .json()
        .await?;
    drop((near, far));
    Ok(messages)
}

/// Every kill of [`kill_at`] over one protocol: each answer applied once at the remote, the
/// gated tool (not safe to retry) run once, and one child started (one user message).
async fn each_kill_applies_each_answer_once(over_a2a: bool) -> anyhow::Result<()> {
    for kill_parent in [true, false] {
        for point in [
            Point::ChildSuspended,
            Point::AnswerAccepted,
            Point::ResumeInFlight,
        ] {
            let messages = kill_at(kill_parent, point, over_a2a).await?;
            let count = |role: &str, tool: Option<&str>| {
                messages["messages"].as_array().map_or(0, |all| {
                    all.iter()
                        .filter(|m| m["role"] == role && tool.is_none_or(|t| m["tool_name"] == t))
                        .count()
                })
            };
            let who = if kill_parent { "parent" } else { "remote" };
            let how = if over_a2a {
                "A2A"
            } else {
                "dormant's protocol"
            };
            let what = format!("{who} killed at {point:?} over {how}: {messages}");
            assert_eq!(count("tool", Some("ask_user")), 1, "{what}");
            assert_eq!(count("tool", Some("publish")), 1, "{what}");
            assert_eq!(count("user", None), 1, "{what}");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_of_either_process_at_each_waiting_point_applies_each_answer_once(
) -> anyhow::Result<()> {
    each_kill_applies_each_answer_once(false).await
}

/// The same kills across the A2A boundary: the parent's A2A client and the remote's A2A
/// server (issue 33).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a2a_a_kill_of_either_process_at_each_waiting_point_applies_each_answer_once(
) -> anyhow::Result<()> {
    each_kill_applies_each_answer_once(true).await
}
