//! A call past its deadline that no sweep has fired yet timed out, whatever comes first: an
//! interrupt or a new message records its `client_tool_timeout` (tombstoned) as a resume
//! does, instead of dropping it or calling it abandoned. Found by tests/model_long.rs.

mod common;

use common::{calls_then_text, editor_runtime, temp_store, tool_result};
use dormant::types::ToolErrorCode;
use dormant::{ManualClock, Runtime, SessionId, Status};
use dormant::{Submit, SubmitOutcome};
use serde_json::json;

/// A session whose client call `tc-1` is past its deadline, with no sweep run.
async fn past_the_deadline() -> anyhow::Result<(Runtime, SessionId)> {
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
    Ok((runtime, id))
}

/// The call ended as timed out; `tombstoned`, a late answer is `already_completed`, as it is
/// when the sweep came first (a dropped call would answer `unknown_tool_call`).
async fn timed_out(runtime: Runtime, id: &SessionId, tombstoned: bool) -> anyhow::Result<()> {
    if tombstoned {
        let late = Submit::result(id.as_str(), "tc-1", json!({ "applied": 1 }));
        assert_eq!(
            runtime.submit_tool_result(late).await?,
            SubmitOutcome::AlreadyCompleted
        );
    }
    let messages = runtime.messages(id).await?;
    let outcome =
        tool_result(&messages, "tc-1").ok_or_else(|| anyhow::anyhow!("tc-1 has no result"))?;
    assert_eq!(outcome.code(), Some(ToolErrorCode::ClientToolTimeout));
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn an_interrupt_after_the_deadline_records_the_timeout_not_a_drop() -> anyhow::Result<()> {
    let (runtime, id) = past_the_deadline().await?;
    runtime.interrupt(&id).await?;
    assert_eq!(runtime.status(&id).await?, Status::Interrupted);
    timed_out(runtime, &id, true).await
}

#[tokio::test]
async fn a_new_message_after_the_deadline_records_the_timeout_not_abandoned() -> anyhow::Result<()>
{
    let (runtime, id) = past_the_deadline().await?;
    let outcome = runtime.execute_on(&id, "editor", "again").await?;
    assert_eq!(outcome.status, Status::Completed);
    timed_out(runtime, &id, false).await
}

#[tokio::test]
async fn an_abort_after_the_deadline_records_the_timeout_not_a_drop() -> anyhow::Result<()> {
    let (runtime, id) = past_the_deadline().await?;
    runtime.abort(&id).await?;
    assert_eq!(runtime.status(&id).await?, Status::Failed);
    timed_out(runtime, &id, true).await
}
