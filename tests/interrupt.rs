//! Interrupt, abort and a new message over pending calls.

mod common;

use std::sync::Arc;

use common::{calls_then_text, editor_runtime, temp_store, tool_result};
use dormant::types::{ErrorCode, ToolOutcome};
use dormant::{ManualClock, ModelReply, SessionId, Status};
use dormant::{Submit, SubmitOutcome};
use serde_json::json;

#[tokio::test]
async fn interrupt_clears_pending_calls_and_resume_continues() -> anyhow::Result<()> {
    let mut script = calls_then_text(&[("tc-1", "edit")], "resumed after interrupt");
    script.truncate(1);
    script.push(ModelReply::text("resumed after interrupt"));
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        script,
        Arc::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    runtime.interrupt(&id).await?;
    assert_eq!(runtime.status(&id).await?, Status::Interrupted);
    assert!(runtime.pending(&id).await?.is_empty());
    assert!(runtime.find_expired_pending(u64::MAX - 1).await?.is_empty());
    let late = runtime
        .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 1 })))
        .await?;
    assert_eq!(late, SubmitOutcome::UnknownToolCall);
    assert_eq!(runtime.client_tool_stats().aborted, 1);
    let resumed = runtime.resume(&id).await?;
    assert_eq!(resumed.status, Status::Completed);
    // The model never sees a call without its result.
    assert!(matches!(
        tool_result(&runtime.messages(&id).await?, "tc-1"),
        Some(ToolOutcome::Error(_))
    ));
    Ok(())
}

#[tokio::test]
async fn abort_after_completion_leaves_the_finished_run_and_its_stream_alone() -> anyhow::Result<()>
{
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        vec![ModelReply::text("done")],
        Arc::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    let (runs, chunks) = (runtime.runs(&id).await?, runtime.chunks(&id, 0).await?);
    runtime.abort(&id).await?;
    assert_eq!(runtime.status(&id).await?, Status::Completed);
    assert_eq!(
        runtime.runs(&id).await?,
        runs,
        "the run record is not rewritten"
    );
    assert_eq!(runtime.chunks(&id, 0).await?, chunks, "no second run_end");
    assert!(matches!(
        runtime.execute_on(&id, "editor", "again").await,
        Err(dormant::Error::Aborted(_))
    ));
    Ok(())
}

#[tokio::test]
async fn abort_is_terminal() -> anyhow::Result<()> {
    let script = calls_then_text(&[("tc-1", "edit")], "never");
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        script,
        Arc::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    runtime.abort(&id).await?;
    assert_eq!(runtime.status(&id).await?, Status::Failed);
    assert!(runtime.pending(&id).await?.is_empty());
    let runs = runtime.runs(&id).await?;
    assert_eq!(
        runs[0].error.as_ref().map(|e| e.code),
        Some(ErrorCode::Aborted)
    );
    assert!(matches!(
        runtime.resume(&id).await,
        Err(dormant::Error::Aborted(_))
    ));
    assert!(matches!(
        runtime.execute_on(&id, "editor", "again").await,
        Err(dormant::Error::Aborted(_))
    ));
    let late = runtime
        .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 1 })))
        .await?;
    assert_eq!(late, SubmitOutcome::UnknownToolCall);
    Ok(())
}

#[tokio::test]
async fn a_new_message_over_pending_calls_abandons_them_first() -> anyhow::Result<()> {
    let script = vec![
        ModelReply::tool_calls(vec![
            dormant::ToolCall::new("a", "edit", json!({})),
            dormant::ToolCall::new("b", "edit", json!({})),
        ]),
        ModelReply::text("new topic"),
    ];
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        script,
        Arc::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    runtime
        .submit_tool_result(Submit::result("s1", "a", json!({ "applied": 1 })))
        .await?;
    let next = runtime.execute_on(&id, "editor", "forget that").await?;
    assert_eq!((next.status, next.turn), (Status::Completed, 2));
    let messages = runtime.messages(&id).await?;
    assert_eq!(
        tool_result(&messages, "a"),
        Some(&ToolOutcome::Result(json!({ "applied": 1 })))
    );
    match tool_result(&messages, "b") {
        Some(ToolOutcome::Error(error)) => assert!(error.starts_with("client_tool_abandoned")),
        other => anyhow::bail!("expected abandoned, got {other:?}"),
    }
    assert_eq!(runtime.client_tool_stats().abandoned, 1);
    // Abandoned calls are tombstoned.
    let late = runtime
        .submit_tool_result(Submit::result("s1", "b", json!({ "applied": 1 })))
        .await?;
    assert_eq!(late, SubmitOutcome::AlreadyCompleted);
    Ok(())
}

#[tokio::test]
async fn resume_of_a_completed_session_is_not_resumable() -> anyhow::Result<()> {
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        vec![ModelReply::text("hi")],
        Arc::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    assert!(matches!(
        runtime.resume(&id).await,
        Err(dormant::Error::NotResumable { .. })
    ));
    assert!(matches!(
        runtime.resume(&"ghost".parse()?).await,
        Err(dormant::Error::UnknownSession(_))
    ));
    Ok(())
}

#[tokio::test]
async fn an_interrupt_keeps_the_answers_already_accepted() -> anyhow::Result<()> {
    let script = vec![
        ModelReply::tool_calls(vec![
            dormant::ToolCall::new("a", "edit", json!({})),
            dormant::ToolCall::new("b", "edit", json!({})),
        ]),
        ModelReply::text("carried on"),
    ];
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        script,
        Arc::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    let accepted = runtime
        .submit_tool_result(Submit::result("s1", "a", json!({ "applied": 1 })))
        .await?;
    assert_eq!(accepted, SubmitOutcome::Accepted);
    runtime.interrupt(&id).await?;
    let messages = runtime.messages(&id).await?;
    assert_eq!(
        tool_result(&messages, "a"),
        Some(&ToolOutcome::Result(json!({ "applied": 1 })))
    );
    let duplicate = runtime
        .submit_tool_result(Submit::result("s1", "a", json!({ "applied": 1 })))
        .await?;
    assert_eq!(
        duplicate,
        SubmitOutcome::AlreadyCompleted,
        "the kept answer is tombstoned"
    );
    let late = runtime
        .submit_tool_result(Submit::result("s1", "b", json!({ "applied": 2 })))
        .await?;
    assert_eq!(
        late,
        SubmitOutcome::UnknownToolCall,
        "the unanswered call was dropped"
    );
    let resumed = runtime.resume(&id).await?;
    assert_eq!(resumed.status, Status::Completed);
    let messages = runtime.messages(&id).await?;
    assert_eq!(
        tool_result(&messages, "a"),
        Some(&ToolOutcome::Result(json!({ "applied": 1 })))
    );
    assert!(matches!(
        tool_result(&messages, "b"),
        Some(ToolOutcome::Error(_))
    ));
    Ok(())
}
