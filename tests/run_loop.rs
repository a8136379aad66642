//! The server-tool run loop: steps, commits, hooks, run records, turns and limits.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{counting_tool, temp_store, worker_runtime, RecordingHooks};
use dormant::types::{ChunkKind, ErrorCode, ToolOutcome};
use dormant::{
    AgentDefinition, Error, ManualClock, Message, ModelReply, ReadError, Runtime, ScriptedLlm,
    SessionId, Status, ToolCall, ToolDefinition, ToolError,
};
use futures::StreamExt;
use serde_json::json;

#[tokio::test]
async fn server_tool_steps_run_and_the_run_completes() -> anyhow::Result<()> {
    let calls = Arc::new(AtomicUsize::new(0));
    let runtime = worker_runtime(temp_store()?, 3, calls.clone(), ManualClock::new(0))?;
    let outcome = runtime.execute("worker", "go").await?;
    assert_eq!(outcome.status, Status::Completed);
    assert_eq!(outcome.text.as_deref(), Some("done"));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let messages = runtime.messages(&outcome.session_id).await?;
    // user, 3 × (assistant + tool), final assistant
    assert_eq!(messages.len(), 8);
    assert!(
        matches!(&messages[2], Message::Tool { outcome: ToolOutcome::Result(v), .. } if v["echo"]["step"] == 0)
    );
    let runs = runtime.runs(&outcome.session_id).await?;
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (runs[0].turn, runs[0].steps, runs[0].status),
        (1, 4, Status::Completed)
    );
    Ok(())
}

#[tokio::test]
async fn a_completed_session_takes_a_new_turn_that_sees_the_conversation() -> anyhow::Result<()> {
    let calls = Arc::new(AtomicUsize::new(0));
    let agent = AgentDefinition::builder("chat").build()?;
    let llm = ScriptedLlm::new().script(
        "chat",
        vec![ModelReply::text("first"), ModelReply::text("second")],
    );
    let runtime = Runtime::builder()
        .store(temp_store()?)
        .llm(Arc::new(llm))
        .agent(agent)
        .build()?;
    drop(calls);
    let id: SessionId = "s1".parse()?;
    let first = runtime.execute_on(&id, "chat", "one").await?;
    let second = runtime.execute_on(&id, "chat", "two").await?;
    assert_eq!(first.text.as_deref(), Some("first"));
    assert_eq!(second.text.as_deref(), Some("second"));
    assert_eq!(second.turn, 2);
    assert_eq!(runtime.messages(&id).await?.len(), 4);
    let runs = runtime.runs(&id).await?;
    assert_eq!(runs.iter().map(|r| r.turn).collect::<Vec<_>>(), vec![1, 2]);
    Ok(())
}

#[tokio::test]
async fn a_script_that_runs_out_fails_with_script_exhausted() -> anyhow::Result<()> {
    let runtime = Runtime::builder()
        .store(temp_store()?)
        .agent(AgentDefinition::builder("mute").build()?)
        .build()?;
    let outcome = runtime.execute("mute", "hello?").await?;
    assert_eq!(outcome.status, Status::Failed);
    let error = outcome.error.ok_or_else(|| anyhow::anyhow!("no error"))?;
    assert_eq!(error.code, ErrorCode::ScriptExhausted);
    Ok(())
}

#[tokio::test]
async fn the_step_limit_fails_the_run_with_max_steps() -> anyhow::Result<()> {
    let calls = Arc::new(AtomicUsize::new(0));
    let agent = AgentDefinition::builder("loop")
        .tool(counting_tool("spin", calls.clone()))
        .max_steps(3)
        .build()?;
    let llm = ScriptedLlm::new().script("loop", common::tool_script("spin", 10));
    let runtime = Runtime::builder()
        .store(temp_store()?)
        .llm(Arc::new(llm))
        .agent(agent)
        .build()?;
    let outcome = runtime.execute("loop", "spin").await?;
    assert_eq!(outcome.status, Status::Failed);
    assert_eq!(outcome.error.map(|e| e.code), Some(ErrorCode::MaxSteps));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    Ok(())
}

#[tokio::test]
async fn finish_validates_against_the_output_schema() -> anyhow::Result<()> {
    let agent = AgentDefinition::builder("judge")
        .output_schema(json!({ "type": "object", "required": ["score"],
                               "properties": { "score": { "type": "integer" } } }))
        .build()?;
    let llm = ScriptedLlm::new().script(
        "judge",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new(
                "f1",
                "__finish__",
                json!({ "score": "high" }),
            )]),
            ModelReply::tool_calls(vec![ToolCall::new(
                "f2",
                "__finish__",
                json!({ "score": 9 }),
            )]),
        ],
    );
    let runtime = Runtime::builder()
        .store(temp_store()?)
        .llm(Arc::new(llm))
        .agent(agent)
        .build()?;
    let outcome = runtime.execute("judge", "rate it").await?;
    assert_eq!(outcome.status, Status::Completed);
    assert_eq!(outcome.output, Some(json!({ "score": 9 })));
    let messages = runtime.messages(&outcome.session_id).await?;
    assert!(
        matches!(&messages[2], Message::Tool { outcome: ToolOutcome::Error(e), .. } if e.starts_with("invalid_output"))
    );
    Ok(())
}

#[tokio::test]
async fn finish_with_tools_run_after_the_parallel_phase_and_end_the_run() -> anyhow::Result<()> {
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let record = |name: &'static str| {
        let order = Arc::clone(&order);
        ToolDefinition::server(
            name,
            move |_input, ctx: dormant::definition::ToolContext| {
                let order = Arc::clone(&order);
                async move {
                    order.lock().push(name);
                    ctx.set_state(name, json!(true));
                    Ok::<_, ToolError>(json!(name))
                }
            },
        )
    };
    let agent = AgentDefinition::builder("flow")
        .tool(record("submit").finish_with(true))
        .tool(record("prepare"))
        .build()?;
    let llm = ScriptedLlm::new().script(
        "flow",
        vec![ModelReply::tool_calls(vec![
            ToolCall::new("a", "submit", json!({})),
            ToolCall::new("b", "prepare", json!({})),
        ])],
    );
    let hooks = Arc::new(RecordingHooks::default());
    let runtime = Runtime::builder()
        .store(temp_store()?)
        .llm(Arc::new(llm))
        .hooks(hooks.clone())
        .agent(agent)
        .build()?;
    let outcome = runtime.execute("flow", "ship").await?;
    assert_eq!(outcome.status, Status::Completed);
    assert_eq!(outcome.output, Some(json!("submit")));
    assert_eq!(*order.lock(), vec!["prepare", "submit"]);
    let record = runtime.session(&outcome.session_id).await?;
    assert_eq!(record.custom_state.get("prepare"), Some(&json!(true)));
    let names = hooks.names.lock().clone();
    let position = |name| names.iter().position(|n| *n == name);
    assert!(position("before_tool") < position("on_state_change"));
    assert!(position("on_state_change") < names.iter().rposition(|n| *n == "after_tool"));
    Ok(())
}

/// A hook that panics on every event of one name.
struct PanickingHook(&'static str);

impl dormant::Hooks for PanickingHook {
    fn on_event(&self, event: &dormant::types::HookEvent) {
        assert_ne!(event.name(), self.0, "this hook panics");
    }
}

#[tokio::test]
async fn a_panicking_hook_is_logged_and_the_run_goes_on() -> anyhow::Result<()> {
    let calls = Arc::new(AtomicUsize::new(0));
    let agent = AgentDefinition::builder("worker")
        .tool(counting_tool("work", calls.clone()))
        .build()?;
    let llm = ScriptedLlm::new().script("worker", common::tool_script("work", 2));
    let runtime = Runtime::builder()
        .store(temp_store()?)
        .llm(Arc::new(llm))
        .hooks(Arc::new(PanickingHook("after_tool")))
        .agent(agent)
        .build()?;
    let outcome = runtime.execute("worker", "go").await?;
    assert_eq!(outcome.status, Status::Completed);
    assert_eq!(outcome.text.as_deref(), Some("done"));
    assert_eq!(calls.load(Ordering::SeqCst), 2, "each tool ran once");
    assert_eq!(runtime.stats().host.crashes, 0);
    Ok(())
}

/// A model adapter that panics: in the call itself, or in the future it returns.
struct PanickingLlm {
    in_the_future: bool,
}

impl dormant::llm::LlmAdapter for PanickingLlm {
    fn complete(
        &self,
        _request: dormant::llm::ModelRequest,
    ) -> futures::future::BoxFuture<'static, Result<ModelReply, dormant::llm::LlmError>> {
        assert!(self.in_the_future, "the adapter panics when called");
        Box::pin(async { panic!("the adapter's future panics") })
    }
}

#[tokio::test]
async fn a_panicking_model_adapter_fails_the_run_instead_of_leaving_it_waiting(
) -> anyhow::Result<()> {
    for in_the_future in [false, true] {
        let runtime = Runtime::builder()
            .store(temp_store()?)
            .llm(Arc::new(PanickingLlm { in_the_future }))
            .agent(AgentDefinition::builder("fragile").build()?)
            .build()?;
        let outcome = runtime.execute("fragile", "go").await?;
        assert_eq!(outcome.status, Status::Failed);
        let error = outcome.error.ok_or_else(|| anyhow::anyhow!("an error"))?;
        assert_eq!(error.code, dormant::types::ErrorCode::ModelError);
        assert!(error.message.contains("panic"), "{}", error.message);
        runtime.shutdown().await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_panicking_tool_becomes_a_tool_error() -> anyhow::Result<()> {
    let agent = AgentDefinition::builder("risky")
        .tool(ToolDefinition::server("boom", |_input, _ctx| async move {
            if true {
                panic!("kaboom");
            }
            Ok::<_, ToolError>(json!(null))
        }))
        .build()?;
    let llm = ScriptedLlm::new().script("risky", common::tool_script("boom", 1));
    let runtime = Runtime::builder()
        .store(temp_store()?)
        .llm(Arc::new(llm))
        .agent(agent)
        .build()?;
    let outcome = runtime.execute("risky", "go").await?;
    assert_eq!(outcome.status, Status::Completed);
    let messages = runtime.messages(&outcome.session_id).await?;
    assert!(
        matches!(&messages[2], Message::Tool { outcome: ToolOutcome::Error(e), .. } if e.contains("kaboom"))
    );
    Ok(())
}

#[tokio::test]
async fn a_tool_that_panics_before_its_future_begins_becomes_a_tool_error() -> anyhow::Result<()> {
    // The closure panics in its own body, before it hands back a future: a handler that
    // unwraps its input there, say. Unguarded, the step's task died with it and the run
    // waited for good: bounded here, so that the test fails instead of hanging.
    fn boom(
        _input: serde_json::Value,
        _ctx: dormant::definition::ToolContext,
    ) -> futures::future::Ready<Result<serde_json::Value, ToolError>> {
        panic!("kaboom before the future")
    }
    let agent = AgentDefinition::builder("risky")
        .tool(ToolDefinition::server("boom", boom))
        .build()?;
    let llm = ScriptedLlm::new().script("risky", common::tool_script("boom", 1));
    let runtime = Runtime::builder()
        .store(temp_store()?)
        .llm(Arc::new(llm))
        .agent(agent)
        .build()?;
    let outcome = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        runtime.execute("risky", "go"),
    )
    .await
    .map_err(|_| anyhow::anyhow!("the run never ended"))??;
    assert_eq!(outcome.status, Status::Completed);
    let messages = runtime.messages(&outcome.session_id).await?;
    assert!(
        matches!(&messages[2], Message::Tool { outcome: ToolOutcome::Error(e), .. }
            if e.starts_with("tool_panicked") && e.contains("kaboom before the future")),
        "{:?}",
        messages[2]
    );
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn unknown_sessions_and_agents_are_typed_errors() -> anyhow::Result<()> {
    let runtime = Runtime::builder().store(temp_store()?).build()?;
    let id: SessionId = "nobody".parse()?;
    assert!(matches!(
        runtime.status(&id).await,
        Err(ReadError::UnknownSession(_))
    ));
    assert!(matches!(
        runtime.messages(&id).await,
        Err(ReadError::UnknownSession(_))
    ));
    assert!(matches!(
        runtime.runs(&id).await,
        Err(ReadError::UnknownSession(_))
    ));
    assert!(matches!(
        runtime.chunks(&id, 0).await,
        Err(ReadError::UnknownSession(_))
    ));
    assert!(matches!(
        runtime.companions(&id).await,
        Err(ReadError::UnknownSession(_))
    ));
    assert!(matches!(
        runtime.execute("ghost", "hi").await,
        Err(Error::UnknownAgent(_))
    ));
    Ok(())
}

#[tokio::test]
async fn the_stream_can_be_followed_from_any_sequence() -> anyhow::Result<()> {
    let calls = Arc::new(AtomicUsize::new(0));
    let runtime = worker_runtime(temp_store()?, 2, calls, ManualClock::new(0))?;
    let outcome = runtime.execute("worker", "go").await?;
    let id = outcome.session_id;
    assert!(
        runtime.companions(&id).await?.is_empty(),
        "a session without companions"
    );
    let all = runtime.chunks(&id, 0).await?;
    let types: Vec<&str> = all.iter().map(|c| c.kind.type_name()).collect();
    assert_eq!(types.first(), Some(&"run_start"));
    assert_eq!(types.last(), Some(&"run_end"));
    assert!(all.iter().enumerate().all(|(i, c)| c.seq == i as u64));
    assert!(
        runtime.chunks(&id, all.len() as u64).await?.is_empty(),
        "past the end of a known session's stream is empty, not an unknown session"
    );
    let followed: Vec<_> = runtime.follow(&id, 3).take(all.len() - 3).collect().await;
    let seqs: Vec<u64> = followed
        .into_iter()
        .map(|c| c.map(|c| c.seq))
        .collect::<Result<_, _>>()?;
    assert_eq!(seqs, (3..all.len() as u64).collect::<Vec<_>>());
    // A follower that starts at the end sees the next turn's chunks live.
    let mut live = Box::pin(runtime.follow(&id, all.len() as u64));
    let next = runtime.execute_on(&id, "worker", "again");
    let (first_live, _) = tokio::join!(live.next(), next);
    let first_live = first_live.ok_or_else(|| anyhow::anyhow!("stream ended"))??;
    assert_eq!(first_live.seq, all.len() as u64);
    assert!(matches!(
        first_live.kind,
        ChunkKind::RunStart { turn: 2, .. }
    ));
    Ok(())
}

#[tokio::test]
async fn a_dropped_follower_releases_the_live_channel() -> anyhow::Result<()> {
    let calls = Arc::new(AtomicUsize::new(0));
    let runtime = worker_runtime(temp_store()?, 1, calls, ManualClock::new(0))?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "worker", "go").await?;
    let mut first = Box::pin(runtime.follow(&id, 0));
    let second = Box::pin(runtime.follow(&id, 0));
    first.next().await;
    drop(second);
    assert_eq!(
        runtime.live_followed_sessions(),
        1,
        "another follower still reads"
    );
    drop(first);
    assert_eq!(runtime.live_followed_sessions(), 0);
    Ok(())
}
