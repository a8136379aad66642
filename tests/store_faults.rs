//! A commit that fails is never acknowledged, changes nothing, and the session recovers from
//! its last durable state.

mod common;

use std::sync::Arc;

use common::{calls_then_text, editor_runtime};
use dormant::store::{CommitKind, Store};
use dormant::testkit::{Call, Delegate, DelegatingStore, Fault, FaultyStore, InjectedFault};
use dormant::MemoryStore;
use dormant::{Error, ManualClock, SessionId, Status};
use dormant::{Submit, SubmitOutcome};
use serde_json::json;

fn faulty() -> Arc<FaultyStore> {
    Arc::new(FaultyStore::new(Arc::new(MemoryStore::new())))
}

#[tokio::test]
async fn a_submit_whose_commit_fails_is_not_accepted_and_the_call_still_waits() -> anyhow::Result<()>
{
    let store = faulty();
    let runtime = editor_runtime(
        Arc::clone(&store) as Arc<dyn Store>,
        ManualClock::new(0),
        calls_then_text(&[("tc-1", "edit")], "done"),
        Arc::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    store.arm(Fault::NextCommit);
    let failed = runtime
        .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 1 })))
        .await;
    assert!(matches!(failed, Err(Error::Store(_))), "{failed:?}");
    assert_eq!(
        runtime.pending(&id).await?[0].answer,
        None,
        "nothing was stored"
    );
    // The session forgot the answer too: the barrier stops a resume from using it.
    let held = runtime.resume(&id).await?;
    assert_eq!(held.pending, vec!["tc-1".to_string()]);
    let retry = runtime
        .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 2 })))
        .await?;
    assert_eq!(retry, SubmitOutcome::Accepted);
    let done = runtime.resume(&id).await?;
    assert_eq!(done.status, Status::Completed);
    Ok(())
}

/// A store whose first commit once armed waits to be let go, then fails.
#[derive(Debug, Default)]
struct HoldThenFail {
    armed: std::sync::atomic::AtomicBool,
    held: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl Delegate for HoldThenFail {
    async fn before(&self, call: Call<'_>) -> Result<(), dormant::store::Error> {
        let first = matches!(call, Call::Commit(_))
            && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst);
        if first {
            self.held.notify_one();
            self.release.notified().await;
            return Err(dormant::store::Error::backend("the disk said no, once"));
        }
        Ok(())
    }
}

// One thread, so that the second answer reaches the session while the first one's commit is
// held (the session takes both from its mailbox before the commit's task runs).
#[tokio::test(flavor = "current_thread")]
async fn an_answer_sent_again_while_the_first_ones_commit_fails_is_accepted_not_already_completed(
) -> anyhow::Result<()> {
    let store = Arc::new(DelegatingStore::wrap(
        Arc::new(MemoryStore::new()),
        HoldThenFail::default(),
    ));
    let runtime = editor_runtime(
        Arc::clone(&store) as Arc<dyn Store>,
        ManualClock::new(0),
        calls_then_text(&[("tc-1", "edit")], "done"),
        Arc::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    store
        .delegate()
        .armed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let first = runtime.submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 1 })));
    let second = runtime.submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 2 })));
    let release = async {
        store.delegate().held.notified().await;
        store.delegate().release.notify_one();
    };
    let (first, second, ()) = tokio::join!(first, second, release);
    assert!(matches!(first, Err(Error::Store(_))), "{first:?}");
    // The first answer was never stored, so the second is not "already completed": it is the
    // answer (told `already_completed`, its sender would never send it again, and the run
    // would wait for good).
    assert_eq!(second?, SubmitOutcome::Accepted);
    let done = runtime.resume(&id).await?;
    assert_eq!(done.status, Status::Completed);
    let messages = runtime.messages(&id).await?;
    assert_eq!(
        common::tool_result(&messages, "tc-1"),
        Some(&dormant::types::ToolOutcome::Result(
            json!({ "applied": 2 })
        ))
    );
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_failed_step_commit_answers_a_store_error_and_the_session_reloads() -> anyhow::Result<()>
{
    let store = faulty();
    let runtime = editor_runtime(
        Arc::clone(&store) as Arc<dyn Store>,
        ManualClock::new(0),
        calls_then_text(&[("l1", "lookup")], "done"),
        Arc::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    store.arm(Fault::CrashBefore(CommitKind::ToolResults));
    let failed = runtime.execute_on(&id, "editor", "go").await;
    assert!(
        matches!(
            failed,
            Err(Error::Store(ref error))
                if error.downcast_ref::<InjectedFault>()
                    == Some(&InjectedFault { kind: CommitKind::ToolResults })
        ),
        "the caller learns it was the store: {failed:?}"
    );
    // Commit #1 landed, commit #2 did not: the run is recorded as running at its last step.
    assert_eq!(runtime.status(&id).await?, Status::Running);
    assert_eq!(runtime.messages(&id).await?.len(), 2);
    assert!(store.failed_commits() >= 1);
    Ok(())
}

/// A commit that fails while the process lives on (a disk full for a moment) cuts the run like
/// a crash: the session is read back with the run closed as interrupted, and it goes on under
/// the at-most-once rule. Before, the session stayed recorded as running (every resume
/// answered `already_running`), and once reloaded the approved tool was asked for again.
#[tokio::test]
async fn a_step_commit_that_fails_once_cuts_the_run_and_the_approved_tool_never_runs_twice(
) -> anyhow::Result<()> {
    let store = faulty();
    let deploys = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let runtime = editor_runtime(
        Arc::clone(&store) as Arc<dyn Store>,
        ManualClock::new(0),
        calls_then_text(&[("d1", "deploy")], "done"),
        Arc::clone(&deploys),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    let run = runtime.execute_on(&id, "editor", "go").await?;
    let approval_id = runtime.pending(&id).await?[0].approval_id();
    assert_eq!(run.status, Status::SuspendedClientTool);
    let yes = Submit::approval("s1", "d1", approval_id, true, None);
    assert_eq!(
        runtime.submit_tool_result(yes).await?,
        SubmitOutcome::Accepted
    );
    store.arm(Fault::NextCommitOf(CommitKind::ToolResults));
    assert!(matches!(runtime.resume(&id).await, Err(Error::Store(_))));
    assert_eq!(deploys.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(runtime.status(&id).await?, Status::Interrupted);
    let done = runtime.resume(&id).await?;
    assert_eq!(done.status, Status::Completed, "{done:?}");
    assert!(
        runtime.pending(&id).await?.is_empty(),
        "no second approval asked"
    );
    runtime.evict(&id).await;
    assert!(matches!(
        runtime.resume(&id).await,
        Err(Error::NotResumable { .. })
    ));
    assert_eq!(deploys.load(std::sync::atomic::Ordering::SeqCst), 1);
    match common::tool_result(&runtime.messages(&id).await?, "d1") {
        Some(dormant::types::ToolOutcome::Error(error)) => {
            assert!(error.starts_with("tool_durability_error"), "{error}");
        }
        other => anyhow::bail!("expected tool_durability_error, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn after_a_crash_only_safe_to_retry_tools_run_again() -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let inner: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let safe = Arc::new(AtomicUsize::new(0));
    let unsafe_calls = Arc::new(AtomicUsize::new(0));
    let build = |store: Arc<dyn Store>| -> anyhow::Result<dormant::Runtime> {
        let agent = dormant::AgentDefinition::builder("ops")
            .tool(common::counting_tool("read", safe.clone()).safe_to_retry(true))
            .tool(common::counting_tool("charge", unsafe_calls.clone()))
            .build()?;
        let script = calls_then_text(&[("r1", "read"), ("c1", "charge")], "done");
        Ok(dormant::Runtime::builder()
            .store(store)
            .llm(Arc::new(dormant::ScriptedLlm::new().script("ops", script)))
            .agent(agent)
            .build()?)
    };
    let id: SessionId = "s1".parse()?;
    {
        // The handlers run, then the process "dies" before their results are committed.
        let store = Arc::new(FaultyStore::new(Arc::clone(&inner)));
        store.arm(Fault::CrashBefore(CommitKind::ToolResults));
        let runtime = build(Arc::clone(&store) as Arc<dyn Store>)?;
        assert!(runtime.execute_on(&id, "ops", "go").await.is_err());
        runtime.shutdown().await.ok();
    }
    assert_eq!(
        (
            safe.load(Ordering::SeqCst),
            unsafe_calls.load(Ordering::SeqCst)
        ),
        (1, 1)
    );
    let runtime = build(Arc::clone(&inner))?;
    let resumed = runtime.resume(&id).await?;
    assert_eq!(resumed.status, Status::Completed);
    assert_eq!(
        safe.load(Ordering::SeqCst),
        2,
        "the safe_to_retry tool ran again"
    );
    assert_eq!(
        unsafe_calls.load(Ordering::SeqCst),
        1,
        "the other one did not"
    );
    let messages = runtime.messages(&id).await?;
    assert!(matches!(
        common::tool_result(&messages, "r1"),
        Some(dormant::types::ToolOutcome::Result(_))
    ));
    match common::tool_result(&messages, "c1") {
        Some(dormant::types::ToolOutcome::Error(error)) => {
            assert!(
                error.starts_with("tool_durability_error") && error.contains("charge"),
                "{error}"
            );
        }
        other => anyhow::bail!("expected a durability error, got {other:?}"),
    }
    let runs = runtime.runs(&id).await?;
    assert_eq!(
        runs[0].error.as_ref().map(|e| e.code),
        Some(dormant::types::ErrorCode::Crashed)
    );
    Ok(())
}

#[tokio::test]
async fn a_follower_that_read_a_crash_cut_run_sees_its_recovery_live() -> anyhow::Result<()> {
    use futures::StreamExt;
    let inner: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let build = |store: Arc<dyn Store>| {
        editor_runtime(
            store,
            ManualClock::new(0),
            calls_then_text(&[("l1", "lookup")], "done"),
            Arc::default(),
            |b| b,
        )
    };
    let id: SessionId = "s1".parse()?;
    {
        let store = Arc::new(FaultyStore::new(Arc::clone(&inner)));
        store.arm(Fault::CrashBefore(CommitKind::ToolResults));
        let cut = build(Arc::clone(&store) as Arc<dyn Store>)?;
        assert!(cut.execute_on(&id, "editor", "go").await.is_err());
        cut.shutdown().await.ok();
    }
    let runtime = build(Arc::clone(&inner))?;
    // A follower (a page's stream) reads what the crash left, before anything activates the
    // session: the run is still stored as running.
    let stored = runtime.chunks(&id, 0).await?.len();
    let mut follower = Box::pin(runtime.follow(&id, 0));
    for _ in 0..stored {
        follower.next().await.transpose()?;
    }
    // Activating it closes the cut run as interrupted: the follower hears it live. The bound
    // only turns a lost chunk into a failure instead of a hang.
    runtime.wait_settled(&id).await;
    let next = tokio::time::timeout(std::time::Duration::from_secs(10), follower.next()).await;
    let kind = match next {
        Ok(Some(Ok(chunk))) => chunk.kind,
        other => anyhow::bail!("the recovery's chunk never reached the follower: {other:?}"),
    };
    assert!(
        matches!(kind, dormant::types::ChunkKind::RunInterrupted { .. }),
        "{kind:?}"
    );
    Ok(())
}
