//! A remote sub-agent's server that goes away for a while (a restart, a deploy) does not end
//! the delegation: a resume of the root meanwhile keeps the tree waiting, the parent tries
//! again by itself, and once the server is back the resume is carried out. Only a remote
//! away for longer than the runtime's patience is written off, and its child is aborted there
//! once it answers again. Time is the parent's manual clock; the remote is served in process
//! and comes back on the same port with the same store.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::serve;
use dormant::remote::{LookReason, RemotePolicy};
use dormant::types::ToolOutcome;
use dormant::{
    AgentDefinition, ManualClock, Message, ModelReply, Runtime, ScriptedLlm, SessionId, SledStore,
    Status, ToolCall, ToolDefinition,
};
use dormant::{Submit, SubmitOutcome};
use dormant_server::{Auth, HttpRemoteAgents, Server, ServerConfig};
use serde_json::json;

const KEY: &str = "operator-key-for-tests";
const PATIENCE: Duration = Duration::from_secs(600);

/// The remote's runtime: `helper` asks the user, then answers.
fn helper_runtime() -> anyhow::Result<Runtime> {
    let helper = AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("ask"))
        .build()?;
    let llm = ScriptedLlm::new().script(
        "helper",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new("q1", "ask", json!({}))]),
            ModelReply::text("helper done"),
        ],
    );
    Ok(Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(llm))
        .agent(helper)
        .background_deadlines(false)
        .build()?)
}

/// The parent: `lead` delegates to `helper` at `endpoint`; its clock is `clock`.
fn parent_runtime(endpoint: &str, clock: Arc<ManualClock>) -> anyhow::Result<Runtime> {
    let lead = AgentDefinition::builder("lead")
        .tool(ToolDefinition::remote_sub_agent(
            "delegate", endpoint, "helper",
        ))
        .build()?;
    let llm = ScriptedLlm::new().script(
        "lead",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new(
                "d1",
                "delegate",
                json!({ "message": "ask" }),
            )]),
            ModelReply::text("lead done"),
        ],
    );
    Ok(Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(llm))
        .clock(clock)
        .agent(lead)
        .remote_agents(Arc::new(HttpRemoteAgents::new(Some(KEY.into()))))
        .remote_policy(RemotePolicy {
            attempts: 2,
            backoff: Duration::from_millis(10),
            patience: PATIENCE,
            max_retry_wait: Duration::from_secs(30),
        })
        .background_deadlines(false)
        .build()?)
}

/// Serves `runtime` again on the address a stopped server had.
async fn serve_again(runtime: Runtime, base: &str) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let address = base.trim_start_matches("http://");
    let listener = tokio::net::TcpListener::bind(address).await?;
    let app = Server::new(runtime, Auth::api_key(KEY)).router()?;
    Ok(tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    }))
}

/// A tree whose remote child's call was answered at the root, and whose remote then went
/// away (its runtime kept, to serve again on the same address).
struct Outage {
    parent: Runtime,
    clock: Arc<ManualClock>,
    root: SessionId,
    /// Where the remote was served.
    base: String,
    remote: Runtime,
}

async fn answered_then_away(root: &str) -> anyhow::Result<Outage> {
    let served = serve(
        helper_runtime()?,
        Auth::api_key(KEY),
        ServerConfig::default(),
    )
    .await?;
    let clock = Arc::new(ManualClock::new(1_000));
    let parent = parent_runtime(&served.base, Arc::clone(&clock))?;
    let root: SessionId = root.parse()?;
    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");
    let accepted = parent
        .submit_tool_result(Submit::result(root.as_str(), "q1", json!("yes")))
        .await?;
    assert_eq!(accepted, SubmitOutcome::Accepted);
    let base = served.base.clone();
    let remote = served.stop().await?;
    Ok(Outage {
        parent,
        clock,
        root,
        base,
        remote,
    })
}

fn result_of(messages: &[Message], call: &str) -> Option<ToolOutcome> {
    messages.iter().find_map(|message| match message {
        Message::Tool {
            tool_call_id,
            outcome,
            ..
        } if tool_call_id == call => Some(outcome.clone()),
        _ => None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_during_an_outage_waits_and_is_carried_out_when_the_remote_is_back(
) -> anyhow::Result<()> {
    // The remote went away; the resume of the root keeps the tree waiting, visibly.
    let Outage {
        parent,
        clock,
        root,
        base,
        remote: remote_runtime,
    } = answered_then_away("out-1").await?;
    let run = parent.resume(&root).await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");
    assert_eq!(
        parent.status(&root).await?,
        Status::SuspendedAwaitingChildren
    );
    let children = parent.children(&root).await?;
    let look = children[0].remote_look.map(|look| look.why);
    assert!(
        matches!(look, Some(LookReason::Unreachable { wake: true, .. })),
        "{look:?}"
    );
    // GET /status of the root says what the tree waits on.
    let front = serve(parent.clone(), Auth::api_key(KEY), ServerConfig::default()).await?;
    let status: serde_json::Value = front
        .http
        .get(front.url("/status?session_id=out-1"))
        .header("x-api-key", KEY)
        .send()
        .await?
        .json()
        .await?;
    let unreachable = &status["unreachable"][0];
    assert_eq!(
        (
            &unreachable["session_id"],
            &unreachable["endpoint"],
            &unreachable["resume_pending"]
        ),
        (&json!("out-1-sub-d1"), &json!(base), &json!(true)),
        "{status}"
    );
    front.stop().await?;

    // Still away at the next try: nothing changes, and no tool error is recorded.
    clock.advance(1_000);
    parent.sweep_deadlines().await?;
    assert_eq!(
        parent.status(&root).await?,
        Status::SuspendedAwaitingChildren
    );
    assert_eq!(result_of(&parent.messages(&root).await?, "d1"), None);

    // Back on its port: the next try resumes the child there, and the root's resume goes on.
    let served = serve_again(remote_runtime.clone(), &base).await?;
    clock.advance(30_000);
    parent.sweep_deadlines().await?;
    parent.wait_settled(&root).await;
    assert_eq!(parent.status(&root).await?, Status::Completed);
    let messages = parent.messages(&root).await?;
    assert_eq!(
        result_of(&messages, "d1"),
        Some(ToolOutcome::Result(json!("helper done")))
    );
    let child = remote_runtime.session(&"out-1-sub-d1".parse()?).await?;
    assert_eq!(child.status, Status::Completed);
    served.abort();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_away_past_the_patience_is_written_off_and_its_child_aborted_when_it_is_back(
) -> anyhow::Result<()> {
    let Outage {
        parent,
        clock,
        root,
        base,
        remote: remote_runtime,
    } = answered_then_away("out-2").await?;
    let run = parent.resume(&root).await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");

    // Tries at growing intervals, then past the patience: written off, and the resume that
    // was asked for goes on with the tool error.
    let mut tries = 0;
    while parent.status(&root).await? == Status::SuspendedAwaitingChildren {
        tries += 1;
        anyhow::ensure!(tries < 100, "never written off");
        clock.advance(30_000);
        parent.sweep_deadlines().await?;
        parent.wait_settled(&root).await;
    }
    assert_eq!(parent.status(&root).await?, Status::Completed);
    let lost = result_of(&parent.messages(&root).await?, "d1");
    assert!(
        matches!(&lost, Some(ToolOutcome::Error(text)) if text.starts_with("remote_subagent_lost")),
        "{lost:?}"
    );
    assert!(tries >= 20, "gave up after {tries} tries of 30 s");
    assert_eq!(
        parent.retry_remote_stops().await?,
        1,
        "the remote is still away"
    );

    // Back: the orphan is aborted there, once.
    let served = serve_again(remote_runtime.clone(), &base).await?;
    assert_eq!(parent.retry_remote_stops().await?, 0);
    let child = remote_runtime.session(&"out-2-sub-d1".parse()?).await?;
    assert!(child.aborted, "{child:?}");
    assert_eq!(parent.retry_remote_stops().await?, 0);
    served.abort();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_aborted_while_its_remote_is_away_aborts_the_child_there_once_it_is_back(
) -> anyhow::Result<()> {
    let Outage {
        parent,
        root,
        base,
        remote: remote_runtime,
        ..
    } = answered_then_away("out-3").await?;

    // The abort is durable here at once; the remote could not be told, which the caller
    // learns, and which the runtime remembers.
    let aborted = parent.abort(&root).await;
    assert!(
        matches!(&aborted, Err(dormant::Error::Remote(error)) if error.is_retryable()),
        "{aborted:?}"
    );
    assert!(parent.session(&root).await?.aborted);
    assert_eq!(parent.retry_remote_stops().await?, 1);

    let served = serve_again(remote_runtime.clone(), &base).await?;
    assert_eq!(parent.retry_remote_stops().await?, 0);
    let child = remote_runtime.session(&"out-3-sub-d1".parse()?).await?;
    assert!(child.aborted, "{child:?}");
    served.abort();
    Ok(())
}

/// With the runtime's own background tasks (a real clock): a child written off after the
/// patience is aborted on its server by itself once the server is back, with no restart and
/// no call of `retry_remote_stops`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_written_off_child_is_aborted_by_the_background_task_once_its_server_is_back(
) -> anyhow::Result<()> {
    use futures::StreamExt;

    let served = serve(
        helper_runtime()?,
        Auth::api_key(KEY),
        ServerConfig::default(),
    )
    .await?;
    let lead = AgentDefinition::builder("lead")
        .tool(ToolDefinition::remote_sub_agent(
            "delegate",
            &served.base,
            "helper",
        ))
        .build()?;
    let llm = ScriptedLlm::new().script(
        "lead",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new(
                "d1",
                "delegate",
                json!({ "message": "ask" }),
            )]),
            ModelReply::text("lead done"),
        ],
    );
    let parent = Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(llm))
        .agent(lead)
        .remote_agents(Arc::new(HttpRemoteAgents::new(Some(KEY.into()))))
        .remote_policy(RemotePolicy {
            attempts: 1,
            backoff: Duration::from_millis(10),
            patience: Duration::from_millis(100),
            max_retry_wait: Duration::from_secs(1),
        })
        .build()?;
    let root: SessionId = "out-4".parse()?;
    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");
    let base = served.base.clone();
    let remote = served.stop().await?;
    let child: SessionId = "out-4-sub-d1".parse()?;
    let from = remote.session(&child).await?.chunk_count;

    // Away past the patience (its next look, a second on): written off by the parent's own
    // scheduler, and recorded to be stopped there.
    parent.resume(&root).await?;
    let mut ended = Box::pin(parent.follow(&root, 0));
    let written_off = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(chunk) = ended.next().await {
            if let dormant::types::ChunkKind::RunEnd { .. } = chunk?.kind {
                return Ok::<_, dormant::Error>(());
            }
        }
        Ok(())
    });
    written_off.await??;
    let lost = result_of(&parent.messages(&root).await?, "d1");
    assert!(
        matches!(&lost, Some(ToolOutcome::Error(text)) if text.starts_with("remote_subagent_lost")),
        "{lost:?}"
    );

    // Back: the background task aborts the child there (its abort ends its run).
    let again = serve_again(remote.clone(), &base).await?;
    let mut child_stream = Box::pin(remote.follow(&child, from));
    let stopped = tokio::time::timeout(Duration::from_secs(30), child_stream.next()).await?;
    assert!(stopped.is_some());
    assert!(remote.session(&child).await?.aborted);
    again.abort();
    Ok(())
}
