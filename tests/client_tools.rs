//! Client tools: a run suspends on them, survives eviction and restart while it waits, and
//! goes on exactly once when the answer comes.

mod common;

use std::sync::Arc;

use common::{calls_then_text, editor_runtime, temp_store, tool_result};
use dormant::types::ToolOutcome;
use dormant::{ManualClock, SessionId, SledStore, Status};
use dormant::{Submit, SubmitOutcome};
use serde_json::json;

#[tokio::test]
async fn a_client_tool_suspends_and_a_submitted_result_resumes_the_run() -> anyhow::Result<()> {
    let script = calls_then_text(&[("tc-1", "edit")], "All done.");
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        script,
        Arc::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    let run = runtime.execute_on(&id, "editor", "edit it").await?;
    assert_eq!(run.status, Status::SuspendedClientTool);
    assert_eq!(run.pending, vec!["tc-1".to_string()]);
    let pending = runtime.pending(&id).await?;
    assert_eq!(
        pending[0].deadline_at_ms, 30_000,
        "the tool's own timeout wins"
    );
    // Nothing waits in memory: the actor can go at once.
    runtime.evict(&id).await;
    assert!(!runtime.is_resident(&id));
    let outcome = runtime
        .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 1 })))
        .await?;
    assert_eq!(outcome, SubmitOutcome::Accepted);
    // Submitting only writes; the session stays suspended until a resume.
    assert_eq!(runtime.status(&id).await?, Status::SuspendedClientTool);
    let resumed = runtime.resume(&id).await?;
    assert_eq!(
        (resumed.status, resumed.text.as_deref()),
        (Status::Completed, Some("All done."))
    );
    let messages = runtime.messages(&id).await?;
    assert_eq!(
        tool_result(&messages, "tc-1"),
        Some(&ToolOutcome::Result(json!({ "applied": 1 })))
    );
    let runs = runtime.runs(&id).await?;
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[1].previous_run_id, Some(runs[0].run_id));
    assert_eq!(runs[0].status, Status::SuspendedClientTool);
    // A duplicate answers already_completed, and nothing changes.
    let again = runtime
        .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 2 })))
        .await?;
    assert_eq!(again, SubmitOutcome::AlreadyCompleted);
    assert_eq!(runtime.messages(&id).await?, messages);
    Ok(())
}

#[tokio::test]
async fn a_session_waiting_across_a_restart_resumes_with_the_answer_once() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(0);
    let script = calls_then_text(&[("tc-1", "edit")], "done");
    let id: SessionId = "s1".parse()?;
    {
        let store = Arc::new(SledStore::open(dir.path())?);
        let runtime = editor_runtime(store, clock.clone(), script.clone(), Arc::default(), |b| b)?;
        runtime.execute_on(&id, "editor", "go").await?;
        runtime.shutdown().await?;
    }
    {
        let store = Arc::new(SledStore::open(dir.path())?);
        let runtime = editor_runtime(store, clock.clone(), script.clone(), Arc::default(), |b| b)?;
        assert_eq!(
            runtime.status(&id).await?,
            Status::SuspendedClientTool,
            "waiting is not a crash"
        );
        let outcome = runtime
            .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 3 })))
            .await?;
        assert_eq!(outcome, SubmitOutcome::Accepted);
        runtime.shutdown().await?;
    }
    let store = Arc::new(SledStore::open(dir.path())?);
    let runtime = editor_runtime(store, clock, script, Arc::default(), |b| b)?;
    let resumed = runtime.resume(&id).await?;
    assert_eq!(resumed.status, Status::Completed);
    let messages = runtime.messages(&id).await?;
    let results = messages
        .iter()
        .filter(|m| matches!(m, dormant::Message::Tool { .. }))
        .count();
    assert_eq!(results, 1, "the answer was applied exactly once");
    let duplicate = runtime
        .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 3 })))
        .await?;
    assert_eq!(
        duplicate,
        SubmitOutcome::AlreadyCompleted,
        "the tombstone survives restarts"
    );
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn parallel_calls_form_a_barrier_and_one_continuation_sees_every_result() -> anyhow::Result<()>
{
    let script = calls_then_text(&[("a", "edit"), ("b", "lookup"), ("c", "edit")], "both in");
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        script,
        Arc::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    let run = runtime.execute_on(&id, "editor", "go").await?;
    assert_eq!(run.pending, vec!["a".to_string(), "c".to_string()]);
    // The server tool of the same step already ran and is recorded.
    assert!(tool_result(&runtime.messages(&id).await?, "b").is_some());
    runtime
        .submit_tool_result(Submit::result("s1", "c", json!({ "applied": 2 })))
        .await?;
    let early = runtime.resume(&id).await?;
    assert_eq!(
        (early.status, early.pending.clone()),
        (Status::SuspendedClientTool, vec!["a".to_string()])
    );
    assert_eq!(
        runtime.runs(&id).await?.len(),
        1,
        "a resume held by the barrier runs nothing"
    );
    runtime
        .submit_tool_result(Submit::result("s1", "a", json!({ "applied": 1 })))
        .await?;
    let done = runtime.resume(&id).await?;
    assert_eq!(done.status, Status::Completed);
    let messages = runtime.messages(&id).await?;
    let order: Vec<&str> = messages
        .iter()
        .filter_map(|m| match m {
            dormant::Message::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        order,
        vec!["b", "a", "c"],
        "answers are drained in call order"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submits_for_different_calls_never_clobber_each_other() -> anyhow::Result<()> {
    let calls: Vec<(String, &str)> = (0..32).map(|i| (format!("c{i}"), "edit")).collect();
    let refs: Vec<(&str, &str)> = calls
        .iter()
        .map(|(id, tool)| (id.as_str(), *tool))
        .collect();
    let script = calls_then_text(&refs, "all in");
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        script,
        Arc::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    let submits = calls.iter().enumerate().map(|(i, (call, _))| {
        let runtime = runtime.clone();
        let call = call.clone();
        async move {
            runtime
                .submit_tool_result(Submit::result("s1", call, json!({ "applied": i })))
                .await
        }
    });
    for outcome in futures::future::join_all(submits).await {
        assert_eq!(outcome?, SubmitOutcome::Accepted);
    }
    let done = runtime.resume(&id).await?;
    assert_eq!(done.status, Status::Completed);
    let messages = runtime.messages(&id).await?;
    for (i, (call, _)) in calls.iter().enumerate() {
        assert_eq!(
            tool_result(&messages, call),
            Some(&ToolOutcome::Result(json!({ "applied": i })))
        );
    }
    Ok(())
}

#[tokio::test]
async fn concurrent_resumes_are_single_flight() -> anyhow::Result<()> {
    let script = calls_then_text(&[("tc-1", "edit")], "done");
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
        .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 1 })))
        .await?;
    let (first, second) = tokio::join!(runtime.resume(&id), runtime.resume(&id));
    let outcomes = [first, second];
    let completed = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(o) if o.status == Status::Completed))
        .count();
    assert!(completed >= 1, "{outcomes:?}");
    for outcome in &outcomes {
        assert!(
            matches!(outcome, Ok(o) if o.status == Status::Completed)
                || matches!(outcome, Err(dormant::Error::NotResumable { .. })),
            "{outcome:?}"
        );
    }
    assert_eq!(runtime.runs(&id).await?.len(), 2, "one resume run, not two");
    Ok(())
}

#[tokio::test]
async fn auto_resume_continues_as_soon_as_every_call_is_answered() -> anyhow::Result<()> {
    let script = calls_then_text(&[("tc-1", "edit")], "done");
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        script,
        Arc::default(),
        |b| b.auto_resume(true),
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    runtime
        .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 1 })))
        .await?;
    runtime.wait_settled(&id).await;
    assert_eq!(runtime.status(&id).await?, Status::Completed);
    assert_eq!(runtime.runs(&id).await?.len(), 2);
    Ok(())
}

/// Counts the scans of the log tree, where a session's conversation is read back from.
#[derive(Debug, Default)]
struct LogScans {
    scans: std::sync::atomic::AtomicUsize,
}

impl LogScans {
    fn count(&self) -> usize {
        self.scans.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl dormant::testkit::Delegate for LogScans {
    async fn before(&self, call: dormant::testkit::Call<'_>) -> Result<(), dormant::store::Error> {
        if let dormant::testkit::Call::ScanPrefix {
            tree: dormant::store::Tree::Log,
            ..
        } = call
        {
            self.scans.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_resident_suspended_session_resumes_without_reading_its_conversation_back(
) -> anyhow::Result<()> {
    let store = Arc::new(dormant::testkit::DelegatingStore::wrap(
        Arc::new(dormant::MemoryStore::new()),
        LogScans::default(),
    ));
    let script = calls_then_text(&[("tc-1", "edit")], "All done.");
    let runtime = editor_runtime(
        store.clone(),
        ManualClock::new(0),
        script,
        Arc::default(),
        |b| b,
    )?;
    let answer = |session: &str| Submit::result(session, "tc-1", json!({ "applied": 1 }));

    // Resident while it waits: the resume finds the conversation still in memory.
    let resident: SessionId = "resident".parse()?;
    runtime.execute_on(&resident, "editor", "edit it").await?;
    assert_eq!(
        runtime.submit_tool_result(answer("resident")).await?,
        SubmitOutcome::Accepted
    );
    let before = store.delegate().count();
    let done = runtime.resume(&resident).await?;
    assert_eq!(done.status, Status::Completed);
    assert_eq!(
        store.delegate().count(),
        before,
        "the resume read the conversation back"
    );

    // Evicted while it waits: the conversation comes back from the store, whole.
    let evicted: SessionId = "evicted".parse()?;
    runtime.execute_on(&evicted, "editor", "edit it").await?;
    runtime.evict(&evicted).await;
    assert_eq!(
        runtime.submit_tool_result(answer("evicted")).await?,
        SubmitOutcome::Accepted
    );
    let before = store.delegate().count();
    let done = runtime.resume(&evicted).await?;
    assert_eq!(done.status, Status::Completed);
    assert!(store.delegate().count() > before);
    assert_eq!(
        runtime.messages(&evicted).await?,
        runtime.messages(&resident).await?
    );
    Ok(())
}
