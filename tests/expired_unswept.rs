//! A call past its deadline that no sweep has fired yet timed out, whatever comes first: an
//! interrupt or a new message records its `client_tool_timeout` (tombstoned) as a resume
//! does, instead of dropping it or calling it abandoned. Found by tests/model_long.rs.

mod common;

use common::{calls_then_text, editor_runtime, temp_store, tool_result};
use dormant::submit::{Submit, SubmitOutcome};
use dormant::{ManualClock, SessionId, Status, ToolErrorCode};
use serde_json::json;

#[tokio::test]
async fn an_interrupt_after_the_deadline_records_the_timeout_not_a_drop() -> anyhow::Result<()> {
    let clock = ManualClock::new(0);
    let script = calls_then_text(&[("tc-1", "edit")], "done");
    let runtime = editor_runtime(
        temp_store()?,
        clock.clone(),
        script,
        Default::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    // Past the deadline; the sweep has not run.
    clock.advance(30_000);
    runtime.interrupt(&id).await?;
    assert_eq!(runtime.status(&id).await?, Status::Interrupted);
    // The call timed out and was tombstoned: a late answer is already_completed, as it is
    // when the sweep came first (a dropped call would answer unknown_tool_call).
    let late = Submit::result("s1", "tc-1", json!({ "applied": 1 }));
    assert_eq!(
        runtime.submit_tool_result(late).await?,
        SubmitOutcome::AlreadyCompleted
    );
    let messages = runtime.messages(&id).await?;
    let outcome = tool_result(&messages, "tc-1")
        .ok_or_else(|| anyhow::anyhow!("tc-1 has no result after the interrupt"))?;
    assert_eq!(outcome.code(), Some(ToolErrorCode::ClientToolTimeout));
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_new_message_after_the_deadline_records_the_timeout_not_abandoned() -> anyhow::Result<()>
{
    let clock = ManualClock::new(0);
    let script = calls_then_text(&[("tc-1", "edit")], "done");
    let runtime = editor_runtime(
        temp_store()?,
        clock.clone(),
        script,
        Default::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    clock.advance(30_000);
    let outcome = runtime.execute_on(&id, "editor", "again").await?;
    assert_eq!(outcome.status, Status::Completed);
    let messages = runtime.messages(&id).await?;
    let result = tool_result(&messages, "tc-1")
        .ok_or_else(|| anyhow::anyhow!("tc-1 has no result after the new message"))?;
    assert_eq!(result.code(), Some(ToolErrorCode::ClientToolTimeout));
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn an_abort_after_the_deadline_records_the_timeout_not_a_drop() -> anyhow::Result<()> {
    let clock = ManualClock::new(0);
    let script = calls_then_text(&[("tc-1", "edit")], "done");
    let runtime = editor_runtime(
        temp_store()?,
        clock.clone(),
        script,
        Default::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    clock.advance(30_000);
    runtime.abort(&id).await?;
    assert_eq!(runtime.status(&id).await?, Status::Failed);
    let late = Submit::result("s1", "tc-1", json!({ "applied": 1 }));
    assert_eq!(
        runtime.submit_tool_result(late).await?,
        SubmitOutcome::AlreadyCompleted
    );
    let messages = runtime.messages(&id).await?;
    let outcome = tool_result(&messages, "tc-1")
        .ok_or_else(|| anyhow::anyhow!("tc-1 has no result after the abort"))?;
    assert_eq!(outcome.code(), Some(ToolErrorCode::ClientToolTimeout));
    runtime.shutdown().await?;
    Ok(())
}
