//! An answer with its resume in one call (`POST /submit-tool-result?resume=true`, `POST
//! /approval`): the resume is asked for once the answer is in, even when the caller gave up
//! in between, and a retry of such a call resumes too.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::{calls_then_text, editor_runtime, run_ended, HoldsOne};
use dormant::store::Store;
use dormant::testkit::DelegatingStore;
use dormant::{ManualClock, MemoryStore, Runtime, SessionId, Status, Submit, SubmitOutcome};
use serde_json::json;

/// A runtime whose session `s1` waits on its client call `tc-1`; the stream's length then.
async fn suspended(
    store: Arc<DelegatingStore<HoldsOne>>,
) -> anyhow::Result<(Runtime, SessionId, u64)> {
    let runtime = editor_runtime(
        store as Arc<dyn Store>,
        ManualClock::new(0),
        calls_then_text(&[("tc-1", "edit")], "done"),
        Arc::default(),
        |builder| builder,
    )?;
    let id: SessionId = "s1".parse()?;
    let waiting = runtime.execute_on(&id, "editor", "go").await?;
    assert_eq!(waiting.status, Status::SuspendedClientTool);
    let from = runtime.chunks(&id, 0).await?.len() as u64;
    Ok((runtime, id, from))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_gives_up_once_its_answer_is_on_its_way_still_gets_the_run_resumed(
) -> anyhow::Result<()> {
    let store = Arc::new(DelegatingStore::wrap(
        Arc::new(MemoryStore::new()),
        HoldsOne::default(),
    ));
    let (runtime, id, from) = suspended(Arc::clone(&store)).await?;
    store.delegate().armed.store(true, Ordering::SeqCst);
    let answer = Submit::result("s1", "tc-1", json!({ "applied": 1 }));
    {
        // The caller is dropped (a request's timeout, a client gone) while the answer's
        // commit is held.
        let call = runtime.submit_and_resume(answer);
        tokio::select! {
            answered = call => anyhow::bail!("answered while its commit was held: {answered:?}"),
            () = store.delegate().reached.notified() => {}
        }
    }
    store.delegate().let_go.notify_one();
    assert_eq!(run_ended(&runtime, &id, from).await?, Status::Completed);
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_retry_of_an_answer_that_was_in_resumes_the_run() -> anyhow::Result<()> {
    let store = Arc::new(DelegatingStore::wrap(
        Arc::new(MemoryStore::new()),
        HoldsOne::default(),
    ));
    let (runtime, id, from) = suspended(store).await?;
    // The answer alone got in (its resume was never asked for).
    let answer = || Submit::result("s1", "tc-1", json!({ "applied": 1 }));
    assert_eq!(
        runtime.submit_tool_result(answer()).await?,
        SubmitOutcome::Accepted
    );
    let retried = runtime.submit_and_resume(answer()).await?;
    assert_eq!(retried.outcome, SubmitOutcome::AlreadyCompleted);
    assert!(
        matches!(retried.resumed, Some(Ok(_))),
        "{:?}",
        retried.resumed
    );
    assert_eq!(run_ended(&runtime, &id, from).await?, Status::Completed);
    runtime.shutdown().await?;
    Ok(())
}
