//! `start_on` and `start_resume`: answered once the request's first commit is durable, with
//! where to follow the run from; the run goes on without a waiter.

mod common;

use std::sync::Arc;

use common::{calls_then_text, editor_runtime, temp_store};
use dormant::types::ChunkKind;
use dormant::{Error, ManualClock, Runtime, SessionId, Status};
use dormant::{Submit, SubmitOutcome};
use futures::StreamExt;
use serde_json::json;

/// Follows the session from `from` to the root's first settling chunk and returns its kind.
async fn settles(runtime: &Runtime, id: &SessionId, from: u64) -> anyhow::Result<String> {
    let mut stream = Box::pin(runtime.follow(id, from));
    let mut first = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        first.get_or_insert(chunk.seq);
        if chunk.kind.is_forwarded() {
            continue;
        }
        if let ChunkKind::RunEnd { .. }
        | ChunkKind::RunSuspended { .. }
        | ChunkKind::RunInterrupted { .. } = chunk.kind
        {
            assert_eq!(first, Some(from), "the stream begins at from_seq");
            return Ok(chunk.kind.type_name().to_string());
        }
    }
    anyhow::bail!("the stream ended before the run settled")
}

#[tokio::test]
async fn start_on_answers_once_started_and_start_resume_finds_a_barrier() -> anyhow::Result<()> {
    let script = calls_then_text(&[("tc-1", "edit")], "All done.");
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        script,
        Arc::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    let started = runtime.start_on(&id, "editor", "edit it").await?;
    assert_eq!(started.session_id, id);
    assert_eq!(started.from_seq, 0);
    assert_eq!(started.status, Status::Running);
    assert!(started.run_id.is_some());
    assert_eq!(settles(&runtime, &id, 0).await?, "run_suspended");

    // Nothing answered yet: the resume finds the barrier, and nothing runs.
    let waiting = runtime.start_resume(&id).await?;
    assert_eq!(waiting.status, Status::SuspendedClientTool);
    let outcome = runtime
        .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 1 })))
        .await?;
    assert_eq!(outcome, SubmitOutcome::Accepted);
    let before = runtime.session(&id).await?.chunk_count;
    let resumed = runtime.start_resume(&id).await?;
    assert_eq!(resumed.from_seq, before);
    assert_eq!(settles(&runtime, &id, resumed.from_seq).await?, "run_end");
    runtime.wait_settled(&id).await;
    assert_eq!(runtime.status(&id).await?, Status::Completed);

    // The refusals of execute_on and resume come back as they do there.
    assert!(matches!(
        runtime.start_on(&id, "nobody", "hi").await,
        Err(Error::UnknownAgent(_))
    ));
    assert!(matches!(
        runtime.start_resume(&id).await,
        Err(Error::NotResumable { .. })
    ));
    assert!(matches!(
        runtime.start_resume(&"nobody".parse()?).await,
        Err(Error::UnknownSession(_))
    ));
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn start_new_starts_a_session_once_and_a_replay_of_it_is_refused_and_runs_nothing(
) -> anyhow::Result<()> {
    let script = vec![dormant::ModelReply::text("hello")];
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        script,
        Arc::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    let started = runtime.start_new(&id, "editor", "hi").await?;
    assert_eq!(settles(&runtime, &id, started.from_seq).await?, "run_end");
    runtime.wait_settled(&id).await;
    let before = runtime.session(&id).await?;
    // Replayed (a parent that crashed after its start): refused, and no second turn.
    let again = runtime.start_new(&id, "editor", "hi").await;
    assert!(matches!(again, Err(Error::SessionExists(_))), "{again:?}");
    let after = runtime.session(&id).await?;
    assert_eq!(
        (after.run_count, after.chunk_count),
        (before.run_count, before.chunk_count)
    );
    // Read back by a new activation, it is refused as well.
    runtime.evict(&id).await;
    let evicted = runtime.start_new(&id, "editor", "hi").await;
    assert!(
        matches!(evicted, Err(Error::SessionExists(_))),
        "{evicted:?}"
    );
    runtime.shutdown().await?;
    Ok(())
}
