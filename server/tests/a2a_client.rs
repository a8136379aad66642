//! The A2A client (issue 33, item 2) against an agent built with the official SDK's server
//! side (`tests/a2a/agent.py`, the Python `a2a-sdk`): a `dormant-server` whose demo agent
//! delegates over A2A (`--delegate-to a2a+http://…`, what `ToolDefinition::a2a_agent`
//! records). The agent's request for input is a call answered at the parent's root; the
//! parent is SIGKILLed while it waits and restarted; a duplicate answer is refused; the task
//! is never started twice nor answered twice; an abort at the root cancels the task there.
//! Another `dormant-server` as the A2A agent, with SIGKILLs of either process at each waiting
//! point, is `remote_processes.rs`. Without the SDK it says it was skipped and how to install
//! it, unless `DORMANT_REQUIRE_A2A` is set.

mod common;

use std::path::Path;

use anyhow::Context;
use common::a2a_peer::{python, Agent};
use common::binary::Binary;
use common::processes::{pending_named, Client};
use reqwest::StatusCode;
use serde_json::{json, Value};

const KEY_VAR: &str = "DORMANT_TEST_REMOTE_KEY";
const KEY: &str = "a-remote-key-of-at-least-16-chars";

/// A parent server whose demo agent delegates to the A2A agent at `agent` (its base URL).
fn parent(store: &Path, listen: &str, agent: &str) -> anyhow::Result<Binary> {
    let endpoint = format!("a2a+{agent}");
    Binary::start_with_env(
        store,
        listen,
        &["--delegate-to", &endpoint, "--remote-key-env", KEY_VAR],
        &[(KEY_VAR, KEY)],
    )
}

/// Starts a root whose demo agent delegates `task`: its id and token.
async fn delegate(client: &Client, base: &str, task: &str) -> anyhow::Result<(String, String)> {
    let (code, started) = client
        .post(
            base,
            "/start",
            None,
            json!({ "agent": "demo", "message": format!("delegate {task}") }),
        )
        .await?;
    anyhow::ensure!(code == StatusCode::ACCEPTED, "{code}: {started}");
    Ok((
        started["session_id"]
            .as_str()
            .context("session_id")?
            .to_string(),
        started["token"].as_str().context("token")?.to_string(),
    ))
}

/// The root's status once its tree settled: what it shows is then acknowledged by its store,
/// so a kill cannot take it back.
async fn settled(client: &Client, base: &str, root: &str, token: &str) -> anyhow::Result<Value> {
    let status: Value = client
        .http
        .get(format!("{base}/status"))
        .query(&[("session_id", root), ("settle_ms", "10000")])
        .bearer_auth(token)
        .send()
        .await?
        .json()
        .await?;
    anyhow::ensure!(status["settled"] == true, "{status}");
    Ok(status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sdk_agents_request_for_input_is_answered_at_the_root_across_a_kill(
) -> anyhow::Result<()> {
    let Some(python) = python()? else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let agent = Agent::start(&python, &dir.path().join("agent.log"))?;
    let store = dir.path().join("parent");
    let near = parent(&store, "127.0.0.1:0", &agent.base)?;
    let listen = format!("127.0.0.1:{}", near.port()?);
    let base = near.base.clone();
    let client = Client::new();

    let (root, token) = delegate(&client, &base, "refund order 42").await?;
    let child = format!("{root}-sub-delegate-1");
    let status = client
        .until(&base, &root, &token, "the agent's request for input", |s| {
            pending_named(s, "a2a_input").is_some()
        })
        .await?;
    let ask = pending_named(&status, "a2a_input")
        .context("a2a_input")?
        .clone();
    assert_eq!(ask["session_id"], child.as_str(), "{ask}");
    assert_eq!(ask["kind"], "client", "{ask}");
    assert_eq!(
        ask["input"]["text"], "Which account should the refund go to?",
        "{ask}"
    );
    assert_eq!(ask["input"]["state"], "TASK_STATE_INPUT_REQUIRED", "{ask}");
    let call = ask["tool_call_id"].as_str().context("call")?.to_string();
    assert!(call.starts_with("a2a-input-"), "{call}");
    settled(&client, &base, &root, &token).await?;

    // SIGKILL the parent while the task waits; restarted, it knows the call (its record) and
    // finds the task again by its context (ListTasks), with nothing of it cached.
    near.kill()?;
    let near = parent(&store, &listen, &agent.base)?;
    let status = client.status(&base, &root, &token).await?;
    assert!(
        pending_named(&status, "a2a_input").is_some(),
        "after the restart: {status}"
    );

    let answer = json!({ "session_id": root, "tool_call_id": call, "result": "ACC-7" });
    let (code, body) = client
        .post(&base, "/submit-tool-result", Some(&token), answer.clone())
        .await?;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, body) = client
        .post(&base, "/submit-tool-result", Some(&token), answer)
        .await?;
    assert_eq!(code, StatusCode::CONFLICT, "a duplicate: {body}");
    assert_eq!(body["code"], "already_completed", "{body}");

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
    assert_eq!(
        status["text"], "The remote agent answered: refunded to ACC-7",
        "{status}"
    );

    // At the agent: one task, for the context the parent named; one answer.
    let started: Vec<Value> = agent
        .events()?
        .into_iter()
        .filter(|event| event["event"] == "started")
        .collect();
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0]["context"], child.as_str());
    assert_eq!(agent.count("answered")?, 1);
    drop(near);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_at_the_root_cancels_the_task_and_auth_required_is_a_call() -> anyhow::Result<()> {
    let Some(python) = python()? else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let agent = Agent::start(&python, &dir.path().join("agent.log"))?;
    let near = parent(&dir.path().join("parent"), "127.0.0.1:0", &agent.base)?;
    let base = near.base.clone();
    let client = Client::new();

    let (root, token) = delegate(&client, &base, "auth first").await?;
    let status = client
        .until(
            &base,
            &root,
            &token,
            "the agent's request for credentials",
            |s| pending_named(s, "a2a_input").is_some(),
        )
        .await?;
    let ask = pending_named(&status, "a2a_input").context("a2a_input")?;
    assert_eq!(ask["input"]["state"], "TASK_STATE_AUTH_REQUIRED", "{ask}");

    let (code, body) = client
        .post(&base, "/abort", Some(&token), json!({ "session_id": root }))
        .await?;
    assert!(code.is_success(), "{code}: {body}");
    let status = client
        .until(&base, &root, &token, "the root aborted", |s| {
            s["aborted"] == true && s["status"] != "running"
        })
        .await?;
    assert!(pending_named(&status, "a2a_input").is_none(), "{status}");
    assert_eq!(agent.count("canceled")?, 1, "{:?}", agent.events()?);
    drop(near);
    Ok(())
}

/// The transport itself, as a parent's replay after a crash uses it: a second start of the
/// same child (from a process with nothing cached) re-attaches to the task, and an answer
/// sent again from such a process is a duplicate by the task's history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_start_reattaches_and_a_replayed_answer_is_a_duplicate() -> anyhow::Result<()> {
    use dormant::remote::{RemoteAgents, RemoteParent, RemoteStart};
    use dormant::{Status, Submit, SubmitOutcome};
    use dormant_server::HttpRemoteAgents;
    use futures::StreamExt;

    let Some(python) = python()? else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let agent = Agent::start(&python, &dir.path().join("agent.log"))?;
    let endpoint = format!("a2a+{}", agent.base);
    let child: dormant::SessionId = "root-sub-pay-1".parse()?;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let parent = RemoteParent {
        parent: "root".parse()?,
        root: "root".parse()?,
        traceparent: Some(traceparent.into()),
    };
    let first = HttpRemoteAgents::new(None);
    let started = first
        .start(&endpoint, "a2a", &child, "refund order 7", &parent)
        .await?;
    assert_eq!(started, RemoteStart::Started);
    let replayed = HttpRemoteAgents::new(None);
    let again = replayed
        .start(&endpoint, "a2a", &child, "refund order 7", &parent)
        .await?;
    assert_eq!(again, RemoteStart::Existed);
    // The calling run's trace context went with the start, as dormant's protocol carries it.
    let started: Vec<Value> = agent
        .events()?
        .into_iter()
        .filter(|event| event["event"] == "started")
        .collect();
    assert_eq!(started.len(), 1);
    assert_eq!(started[0]["traceparent"], traceparent);

    // Followed until it stops working (the stream ends then), it waits on one call.
    let mut follow = replayed.chunks(&endpoint, &child, 0).await?;
    while let Some(chunk) = follow.next().await {
        chunk?;
    }
    let status = replayed.status(&endpoint, &child, 0).await?;
    assert_eq!(status.status, Status::SuspendedClientTool, "{status:?}");
    let [call] = status.pending.as_slice() else {
        anyhow::bail!("one call waits: {status:?}");
    };
    let approval = Submit::from_json(&json!({
        "session_id": child.as_str(), "tool_call_id": call.tool_call_id,
        "kind": "approval-response", "approval_id": "x", "approved": true,
    }))
    .map_err(anyhow::Error::msg)?;
    assert!(matches!(
        replayed.submit(&endpoint, &approval).await?,
        SubmitOutcome::InvalidRequest { .. }
    ));
    let unknown = Submit::result(child.to_string(), "a2a-input-never", json!("ACC-1"));
    assert_eq!(
        replayed.submit(&endpoint, &unknown).await?,
        SubmitOutcome::UnknownToolCall
    );
    let answer = Submit::result(child.to_string(), call.tool_call_id.clone(), json!("ACC-1"));
    assert_eq!(
        replayed.submit(&endpoint, &answer).await?,
        SubmitOutcome::Accepted
    );
    let fresh = HttpRemoteAgents::new(None);
    assert_eq!(
        fresh.submit(&endpoint, &answer).await?,
        SubmitOutcome::AlreadyCompleted
    );

    let mut follow = fresh.chunks(&endpoint, &child, 0).await?;
    while let Some(chunk) = follow.next().await {
        chunk?;
    }
    let status = fresh.status(&endpoint, &child, 0).await?;
    assert_eq!(status.status, Status::Completed, "{status:?}");
    assert_eq!(status.text.as_deref(), Some("refunded to ACC-1"));
    assert_eq!(agent.count("started")?, 1);
    assert_eq!(agent.count("answered")?, 1);
    Ok(())
}

/// A dormant server as the A2A agent, its child's call answered there directly (so its run is
/// suspended with every answer in, and nothing resumes it there): the task says the next
/// message resumes it, and the parent's resume sends that message, as over dormant's own
/// protocol. Without it the parent would wait on a task that reads as working forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dormant_childs_answered_run_is_resumed_by_the_parents_resume() -> anyhow::Result<()> {
    use std::sync::Arc;
    use std::time::Duration;

    use dormant::{
        AgentDefinition, ModelReply, Runtime, ScriptedLlm, SledStore, Status, Submit,
        SubmitOutcome, ToolCall, ToolDefinition,
    };
    use dormant_server::{Auth, HttpRemoteAgents, ServerConfig};

    let key = "an-operator-key-of-some-length";
    let far_runtime = Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(ScriptedLlm::new().script(
            "helper",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new("q1", "ask", json!({}))]),
                ModelReply::text("helper done"),
            ],
        )))
        .agent(
            AgentDefinition::builder("helper")
                .tool(ToolDefinition::client("ask"))
                .build()?,
        )
        .build()?;
    let far = common::serve(
        far_runtime,
        Auth::api_key(key),
        ServerConfig::default().page_agent("helper"),
    )
    .await?;
    let near = Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(ScriptedLlm::new().script(
            "lead",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new(
                    "d1",
                    "delegate",
                    json!({ "message": "ask" }),
                )]),
                ModelReply::text("lead done"),
            ],
        )))
        .agent(
            AgentDefinition::builder("lead")
                .tool(ToolDefinition::a2a_agent("delegate", &far.base))
                .build()?,
        )
        .remote_agents(Arc::new(HttpRemoteAgents::new(Some(key.into()))))
        .build()?;
    let root: dormant::SessionId = "root".parse()?;
    let run = near.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");

    // Answered at the remote itself: its run waits for a resume that nothing there sends.
    let child = "root-sub-d1";
    let outcome = far
        .runtime
        .submit_tool_result(Submit::result(child, "q1", json!({ "ok": true })))
        .await?;
    assert_eq!(outcome, SubmitOutcome::Accepted);

    let resumed = tokio::time::timeout(Duration::from_secs(30), near.resume(&root))
        .await
        .map_err(|_| anyhow::anyhow!("the parent's resume never came back"))??;
    assert_eq!(resumed.status, Status::Completed, "{resumed:?}");
    let child_record = far.runtime.session(&child.parse()?).await?;
    assert_eq!(child_record.status, Status::Completed);
    near.shutdown().await?;
    far.stop().await?.shutdown().await?;
    Ok(())
}
