//! Approval gates: the tool runs once, with its stored input, only if approved.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{calls_then_text, editor_runtime, temp_store, tool_result};
use dormant::session::NOT_APPROVED;
use dormant::types::{ChunkKind, ToolOutcome};
use dormant::{ManualClock, SessionId, Status};
use dormant::{Submit, SubmitOutcome};
use serde_json::json;

async fn approval_id(runtime: &dormant::Runtime, id: &SessionId) -> anyhow::Result<String> {
    runtime
        .chunks(id, 0)
        .await?
        .into_iter()
        .find_map(|chunk| match chunk.kind {
            ChunkKind::ToolApprovalRequest { approval_id, .. } => Some(approval_id),
            _ => None,
        })
        .ok_or_else(|| anyhow::anyhow!("no approval request on the stream"))
}

#[tokio::test]
async fn an_approved_tool_runs_once_with_its_stored_input() -> anyhow::Result<()> {
    let deploys = Arc::new(AtomicUsize::new(0));
    let script = vec![
        dormant::ModelReply::tool_calls(vec![dormant::ToolCall::new(
            "d1",
            "deploy",
            json!({ "env": "prod" }),
        )]),
        dormant::ModelReply::text("deployed"),
    ];
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        script,
        deploys.clone(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    let run = runtime.execute_on(&id, "editor", "ship").await?;
    assert_eq!(run.status, Status::SuspendedClientTool);
    assert_eq!(
        deploys.load(Ordering::SeqCst),
        0,
        "nothing runs before approval"
    );
    let approval = approval_id(&runtime, &id).await?;
    assert_eq!(approval, format!("{}::d1", run.run_id));
    let outcome = runtime
        .submit_tool_result(Submit::approval("s1", "d1", approval, true, None))
        .await?;
    assert_eq!(outcome, SubmitOutcome::Accepted);
    assert_eq!(deploys.load(Ordering::SeqCst), 0, "approval only writes");
    let resumed = runtime.resume(&id).await?;
    assert_eq!(resumed.status, Status::Completed);
    assert_eq!(deploys.load(Ordering::SeqCst), 1);
    let messages = runtime.messages(&id).await?;
    assert_eq!(
        tool_result(&messages, "d1"),
        Some(&ToolOutcome::Result(json!({ "echo": { "env": "prod" } })))
    );
    Ok(())
}

#[tokio::test]
async fn a_denied_tool_never_runs_and_records_the_denial() -> anyhow::Result<()> {
    let deploys = Arc::new(AtomicUsize::new(0));
    let script = calls_then_text(&[("d1", "deploy")], "ok, not deploying");
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        script,
        deploys.clone(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "ship").await?;
    let approval = approval_id(&runtime, &id).await?;
    let outcome = runtime
        .submit_tool_result(Submit::approval(
            "s1",
            "d1",
            approval,
            false,
            Some("not now".into()),
        ))
        .await?;
    assert_eq!(outcome, SubmitOutcome::Accepted);
    runtime.resume(&id).await?;
    assert_eq!(deploys.load(Ordering::SeqCst), 0);
    match tool_result(&runtime.messages(&id).await?, "d1") {
        Some(ToolOutcome::Error(error)) => assert!(error.starts_with(NOT_APPROVED), "{error}"),
        other => anyhow::bail!("expected the denial, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn an_error_only_submission_to_an_approval_is_accepted_and_the_tool_does_not_run(
) -> anyhow::Result<()> {
    let deploys = Arc::new(AtomicUsize::new(0));
    let script = calls_then_text(&[("d1", "deploy")], "fine");
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        script,
        deploys.clone(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "ship").await?;
    let outcome = runtime
        .submit_json(&json!({ "kind": "approval-response", "session_id": "s1",
                              "tool_call_id": "d1", "error": "dialog closed" }))
        .await?;
    assert_eq!(outcome, SubmitOutcome::Accepted);
    runtime.resume(&id).await?;
    assert_eq!(deploys.load(Ordering::SeqCst), 0);
    assert_eq!(
        tool_result(&runtime.messages(&id).await?, "d1"),
        Some(&ToolOutcome::Error("dialog closed".into()))
    );
    Ok(())
}

#[tokio::test]
async fn a_predicate_that_fails_or_panics_requires_approval() -> anyhow::Result<()> {
    std::panic::set_hook(Box::new(|_| {}));
    let calls = Arc::new(AtomicUsize::new(0));
    let gated = |name: &str, predicate: dormant::Approval| {
        common::counting_tool(name, calls.clone()).require_approval(predicate)
    };
    let agent = dormant::AgentDefinition::builder("gate")
        .tool(gated(
            "cheap",
            dormant::Approval::When(Arc::new(|_input| Ok(false))),
        ))
        .tool(gated(
            "erring",
            dormant::Approval::When(Arc::new(|_input| Err("no".into()))),
        ))
        .tool(gated(
            "panicking",
            dormant::Approval::When(Arc::new(|_input| panic!("bug"))),
        ))
        .build()?;
    let script = calls_then_text(&[("a", "cheap"), ("b", "erring"), ("c", "panicking")], "x");
    let runtime = dormant::Runtime::builder()
        .store(temp_store()?)
        .llm(Arc::new(dormant::ScriptedLlm::new().script("gate", script)))
        .agent(agent)
        .build()?;
    let run = runtime.execute("gate", "go").await?;
    assert_eq!(run.pending, vec!["b".to_string(), "c".to_string()]);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "only the call the predicate let through ran"
    );
    Ok(())
}
