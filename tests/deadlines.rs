//! Deadlines: the scheduler times out unanswered calls, never an answered one, once; the
//! index is durable and re-armed at boot; tombstones expire after retention.

mod common;

use std::sync::Arc;

use common::{calls_then_text, editor_runtime, temp_store, tool_result, RecordingHooks};
use dormant::types::{ChunkKind, ToolOutcome};
use dormant::{ManualClock, SessionId, SledStore, Status};
use dormant::{Submit, SubmitOutcome};
use serde_json::json;

#[tokio::test]
async fn an_unanswered_call_times_out_and_resume_sees_client_tool_timeout() -> anyhow::Result<()> {
    let clock = ManualClock::new(0);
    let hooks = Arc::new(RecordingHooks::default());
    let script = calls_then_text(&[("tc-1", "edit")], "gave up");
    let runtime = editor_runtime(temp_store()?, clock.clone(), script, Arc::default(), |b| {
        b.hooks(hooks.clone())
    })?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    clock.advance(29_999);
    assert_eq!(runtime.sweep_deadlines().await?.fired, 0);
    assert_eq!(
        runtime.find_expired_pending(clock_now(&clock)).await?.len(),
        0
    );
    clock.advance(1);
    let expired = runtime.find_expired_pending(30_000).await?;
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].tool_call_id, "tc-1");
    assert_eq!(runtime.sweep_deadlines().await?.fired, 1);
    // A second sweep writes nothing more.
    let chunks = runtime.chunks(&id, 0).await?.len();
    assert_eq!(runtime.sweep_deadlines().await?.fired, 0);
    assert_eq!(runtime.chunks(&id, 0).await?.len(), chunks);
    let timeout_end = runtime.chunks(&id, 0).await?.into_iter().any(|c| {
        matches!(&c.kind, ChunkKind::ToolEnd { outcome: ToolOutcome::Error(e), .. } if e.starts_with("client_tool_timeout"))
    });
    assert!(timeout_end, "the timeout is reported on the stream");
    assert!(hooks.names.lock().contains(&"after_tool"));
    assert_eq!(runtime.client_tool_stats().timeouts, 1);
    // The deadline is authoritative: a late submit changes nothing.
    let late = runtime
        .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 1 })))
        .await?;
    assert_eq!(late, SubmitOutcome::AlreadyCompleted);
    let resumed = runtime.resume(&id).await?;
    assert_eq!(resumed.status, Status::Completed);
    match tool_result(&runtime.messages(&id).await?, "tc-1") {
        Some(ToolOutcome::Error(error)) => assert!(error.starts_with("client_tool_timeout")),
        other => anyhow::bail!("expected a timeout, got {other:?}"),
    }
    Ok(())
}

/// As in the reference framework: when a client-tool deadline elapses the runtime appends the synthetic tool error,
/// emits its `tool_end` and fires the hooks with the timeout payload, once. The resume that
/// follows fires none of them again for that call.
#[tokio::test]
async fn a_timeout_fires_its_hooks_once_at_expiry_in_the_canonical_order() -> anyhow::Result<()> {
    let clock = ManualClock::new(0);
    let hooks = Arc::new(RecordingHooks::default());
    let script = calls_then_text(&[("tc-1", "edit")], "gave up");
    let runtime = editor_runtime(temp_store()?, clock.clone(), script, Arc::default(), |b| {
        b.hooks(hooks.clone())
    })?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    clock.advance(30_000);
    assert_eq!(runtime.sweep_deadlines().await?.fired, 1);
    let at_expiry = ["on_state_change", "on_message", "after_tool"];
    assert_eq!(hooks.tool_hooks_of("tc-1"), at_expiry);
    match tool_result(&runtime.messages(&id).await?, "tc-1") {
        Some(ToolOutcome::Error(error)) => assert!(error.starts_with("client_tool_timeout")),
        other => anyhow::bail!("the timeout is recorded at expiry, got {other:?}"),
    }
    runtime.evict(&id).await;
    let resumed = runtime.resume(&id).await?;
    assert_eq!(resumed.status, Status::Completed);
    assert_eq!(
        hooks.tool_hooks_of("tc-1"),
        at_expiry,
        "the resume fires nothing more for the timed-out call"
    );
    let messages = runtime.messages(&id).await?;
    let results = messages
        .iter()
        .filter(
            |m| matches!(m, dormant::Message::Tool { tool_call_id, .. } if tool_call_id == "tc-1"),
        )
        .count();
    assert_eq!(results, 1, "one result for the call");
    let ends = runtime
        .chunks(&id, 0).await?
        .into_iter()
        .filter(|c| matches!(&c.kind, ChunkKind::ToolEnd { tool_call_id, .. } if tool_call_id == "tc-1"))
        .count();
    assert_eq!(ends, 1, "one tool_end for the call");
    Ok(())
}

/// Wakes a waiter when a timeout is recorded.
#[derive(Default)]
struct TimeoutHooks {
    timed_out: tokio::sync::Notify,
}

impl dormant::Hooks for TimeoutHooks {
    fn on_event(&self, event: &dormant::types::HookEvent) {
        if let dormant::types::HookEvent::AfterTool {
            outcome: ToolOutcome::Error(error),
            ..
        } = event
        {
            if error.starts_with("client_tool_timeout") {
                self.timed_out.notify_one();
            }
        }
    }
}

fn clock_now(clock: &ManualClock) -> u64 {
    use dormant::types::Clock;
    clock.now_ms()
}

#[tokio::test]
async fn an_answer_accepted_before_the_deadline_is_never_overwritten() -> anyhow::Result<()> {
    let clock = ManualClock::new(0);
    let script = calls_then_text(&[("tc-1", "edit")], "ok");
    let runtime = editor_runtime(temp_store()?, clock.clone(), script, Arc::default(), |b| b)?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    runtime
        .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 7 })))
        .await?;
    assert!(
        runtime.find_expired_pending(u64::MAX - 1).await?.is_empty(),
        "the deadline was disarmed"
    );
    clock.advance(60_000);
    assert_eq!(runtime.sweep_deadlines().await?.fired, 0);
    runtime.resume(&id).await?;
    assert_eq!(
        tool_result(&runtime.messages(&id).await?, "tc-1"),
        Some(&ToolOutcome::Result(json!({ "applied": 7 })))
    );
    assert_eq!(runtime.client_tool_stats().timeouts, 0);
    Ok(())
}

#[tokio::test]
async fn a_timeout_of_zero_expires_at_once() -> anyhow::Result<()> {
    let clock = ManualClock::new(0);
    let agent = dormant::AgentDefinition::builder("quick")
        .tool(dormant::ToolDefinition::client("ask").timeout_ms(0))
        .build()?;
    let runtime = dormant::Runtime::builder()
        .store(temp_store()?)
        .llm(Arc::new(
            dormant::ScriptedLlm::new().script("quick", calls_then_text(&[("q", "ask")], "x")),
        ))
        .clock(Arc::new(clock))
        .background_deadlines(false)
        .agent(agent)
        .build()?;
    let run = runtime.execute("quick", "go").await?;
    assert_eq!(run.status, Status::SuspendedClientTool);
    assert!(run.pending.is_empty(), "an expired call is not pending");
    assert_eq!(runtime.sweep_deadlines().await?.fired, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overdue_deadlines_fire_after_a_restart_by_themselves() -> anyhow::Result<()> {
    overdue_after_a_restart(false).await
}

/// The boot's read of the deadline index fails (here it panics): the scheduler reads it again
/// later, rather than sleeping until some new deadline is armed, which may be never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overdue_deadlines_fire_after_a_restart_whose_first_read_of_them_fails(
) -> anyhow::Result<()> {
    overdue_after_a_restart(true).await
}

/// A call whose deadline passed while no process ran fires by itself once a process runs
/// again; `first_read_fails`: that process's first scan of the deadline index panics.
async fn overdue_after_a_restart(first_read_fails: bool) -> anyhow::Result<()> {
    use dormant::types::Clock;
    let dir = tempfile::tempdir()?;
    let script = calls_then_text(&[("tc-1", "edit")], "ok");
    let id: SessionId = "s1".parse()?;
    {
        let runtime = editor_runtime(
            Arc::new(SledStore::open(dir.path())?),
            ManualClock::new(0),
            script.clone(),
            Arc::default(),
            |b| b,
        )?;
        runtime.execute_on(&id, "editor", "go").await?;
        runtime.shutdown().await?;
    }
    // Reopen "later": the deadline passed while nothing ran. The background scheduler re-arms
    // from the durable index at boot and fires the overdue entry without being asked.
    let clock = ManualClock::new(31_000);
    let hooks = Arc::new(TimeoutHooks::default());
    let store = dormant::testkit::DelegatingStore::wrap(
        Arc::new(SledStore::open(dir.path())?),
        PanicsOnceOnDeadlines {
            armed: first_read_fails.into(),
        },
    );
    let runtime = editor_runtime(
        Arc::new(store),
        clock.clone(),
        script,
        Arc::default(),
        |b| b.background_deadlines(true).hooks(hooks.clone()),
    )?;
    // Wait for the timeout's after_tool hook: the notification, not the passing of time.
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        hooks.timed_out.notified(),
    )
    .await?;
    let pending = runtime.pending(&id).await?;
    assert_eq!(
        pending[0].answer,
        Some(dormant::types::Answer::TimedOut),
        "at {}",
        clock.now_ms()
    );
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn tombstones_answer_duplicates_until_retention_ends_then_are_reaped() -> anyhow::Result<()> {
    let clock = ManualClock::new(0);
    let script = calls_then_text(&[("tc-1", "edit")], "ok");
    let runtime = editor_runtime(temp_store()?, clock.clone(), script, Arc::default(), |b| {
        b.tombstone_retention_ms(1_000)
    })?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    runtime
        .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 1 })))
        .await?;
    runtime.resume(&id).await?;
    runtime.evict(&id).await;
    let dup = Submit::result("s1", "tc-1", json!({ "applied": 1 }));
    assert_eq!(
        runtime.submit_tool_result(dup.clone()).await?,
        SubmitOutcome::AlreadyCompleted
    );
    clock.advance(1_000);
    assert_eq!(
        runtime.submit_tool_result(dup.clone()).await?,
        SubmitOutcome::UnknownToolCall
    );
    assert_eq!(runtime.sweep_deadlines().await?.reaped, 1);
    assert_eq!(runtime.sweep_deadlines().await?.reaped, 0);
    assert_eq!(
        runtime.submit_tool_result(dup).await?,
        SubmitOutcome::UnknownToolCall
    );
    Ok(())
}

/// A store whose next range read of the deadline index panics once armed (a store that
/// panics on a damaged entry).
#[derive(Debug, Default)]
struct PanicsOnceOnDeadlines {
    armed: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl dormant::testkit::Delegate for PanicsOnceOnDeadlines {
    async fn before(&self, call: dormant::testkit::Call<'_>) -> Result<(), dormant::store::Error> {
        if let dormant::testkit::Call::ScanRange {
            tree: dormant::store::Tree::Deadlines,
            ..
        } = call
        {
            let armed = self.armed.swap(false, std::sync::atomic::Ordering::SeqCst);
            assert!(!armed, "the deadline index panics");
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_sweep_that_panics_fails_and_the_next_one_fires() -> anyhow::Result<()> {
    let clock = ManualClock::new(0);
    let store = Arc::new(dormant::testkit::DelegatingStore::wrap(
        temp_store()?,
        PanicsOnceOnDeadlines::default(),
    ));
    let script = calls_then_text(&[("tc-1", "edit")], "gave up");
    let runtime = editor_runtime(
        Arc::clone(&store) as Arc<dyn dormant::store::Store>,
        clock.clone(),
        script,
        Arc::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    clock.advance(30_000);
    store
        .delegate()
        .armed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    // The scheduler is one task for every session: the panic fails this sweep only.
    let failed = runtime.sweep_deadlines().await;
    match &failed {
        Err(dormant::Error::Store(error)) => {
            assert!(
                error.to_string().contains("the deadline index panics"),
                "{error}"
            );
        }
        other => panic!("the sweep should fail with the panic, got {other:?}"),
    }
    assert_eq!(runtime.sweep_deadlines().await?.fired, 1);
    let resumed = runtime.resume(&id).await?;
    assert_eq!(resumed.status, Status::Completed);
    match tool_result(&runtime.messages(&id).await?, "tc-1") {
        Some(ToolOutcome::Error(text)) => {
            assert!(text.starts_with("client_tool_timeout"), "{text}")
        }
        other => panic!("tc-1 should have timed out, got {other:?}"),
    }
    runtime.shutdown().await?;
    Ok(())
}

/// The lease table as another node owns every session named `other-…` (its activation here
/// is refused), this node the rest.
#[derive(Debug)]
struct OthersOwnTheirs;

#[async_trait::async_trait]
impl dormant::cluster::leases::Leases for OthersOwnTheirs {
    fn is_shared(&self) -> bool {
        true
    }

    async fn acquire(&self, _session: &str, lease: &str) -> Result<(), dormant::store::Error> {
        if lease.starts_with("other-") {
            return Err(dormant::store::Error::LeaseHeld {
                session: lease.to_string(),
                owner: "b".into(),
            });
        }
        Ok(())
    }

    fn release_session(&self, _session: &str) {}

    fn holds_current(&self, session: &str) -> bool {
        !session.starts_with("other-")
    }

    fn holds(&self, lease: &str) -> bool {
        !lease.starts_with("other-")
    }

    async fn owner(
        &self,
        _lease: &str,
    ) -> Result<Option<dormant::cluster::leases::LeaseOwner>, dormant::store::Error> {
        Ok(None)
    }

    fn peer_key(&self) -> Option<dormant::cluster::leases::PeerKey> {
        None
    }
}

/// More expired entries than a sweep reads at once, all of sessions another node owns (left
/// to it), do not keep this node's own expired call after them from firing.
#[tokio::test]
async fn deadlines_left_to_their_owners_do_not_keep_this_nodes_own_from_firing(
) -> anyhow::Result<()> {
    let clock = ManualClock::new(0);
    let store = temp_store()?;
    // 1,100 expired entries of other nodes' sessions, earlier than any of this node's.
    let mut batch = dormant::store::Batch::new(dormant::store::CommitKind::Other);
    for n in 0..1_100 {
        let session: SessionId = format!("other-{n:04}").parse()?;
        batch.put(
            dormant::store::Tree::Deadlines,
            dormant::store::schema::deadline_key(1, &session, "c"),
            Vec::new(),
        );
    }
    store.commit(batch).await?;
    let script = calls_then_text(&[("tc-1", "edit")], "gave up");
    let runtime = editor_runtime(store, clock.clone(), script, Arc::default(), |b| {
        b.leases(Arc::new(OthersOwnTheirs))
    })?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    clock.advance(30_000);

    let report = runtime.sweep_deadlines().await?;

    assert_eq!(report.fired, 1, "{report:?}");
    assert_eq!(report.deferred, 1_100, "{report:?}");
    match tool_result(&runtime.messages(&id).await?, "tc-1") {
        Some(ToolOutcome::Error(error)) => assert!(error.starts_with("client_tool_timeout")),
        other => anyhow::bail!("this node's call should have timed out, got {other:?}"),
    }
    Ok(())
}

/// A resume drains a call that expired unswept into its timeout while an approved tool of the
/// same step runs; a late answer (or the sweep) for that call meanwhile finds it timed out
/// already and records nothing: the call has one result, not two.
#[tokio::test]
async fn a_call_that_expired_unswept_gets_one_result_while_its_steps_tool_runs(
) -> anyhow::Result<()> {
    use dormant::{AgentDefinition, Approval, Message, ModelReply, Runtime, ScriptedLlm};
    use dormant::{ToolCall, ToolDefinition, ToolError};
    let started = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Notify::new());
    let deploy = {
        let (started, release) = (Arc::clone(&started), Arc::clone(&release));
        ToolDefinition::server("deploy", move |_input, _ctx| {
            let (started, release) = (Arc::clone(&started), Arc::clone(&release));
            async move {
                started.notify_one();
                release.notified().await;
                Ok::<_, ToolError>(json!("deployed"))
            }
        })
        .require_approval(Approval::Always)
    };
    let ops = AgentDefinition::builder("ops")
        .tool(ToolDefinition::client("pick").timeout_ms(100))
        .tool(deploy)
        .build()?;
    let llm = ScriptedLlm::new().script(
        "ops",
        vec![
            ModelReply::tool_calls(vec![
                ToolCall::new("p1", "pick", json!({})),
                ToolCall::new("d1", "deploy", json!({})),
            ]),
            ModelReply::text("done"),
        ],
    );
    let clock = ManualClock::new(1_000);
    let runtime = Runtime::builder()
        .llm(Arc::new(llm))
        .clock(Arc::new(clock.clone()))
        .background_deadlines(false)
        .agent(ops)
        .build()?;
    let id: SessionId = "s1".parse()?;
    let run = runtime.execute_on(&id, "ops", "go").await?;
    let approve = Submit::approval("s1", "d1", format!("{}::d1", run.run_id), true, None);
    assert_eq!(
        runtime.submit_tool_result(approve).await?,
        SubmitOutcome::Accepted
    );
    clock.advance(200);
    let resumed = tokio::spawn({
        let runtime = runtime.clone();
        let id = id.clone();
        async move { runtime.resume(&id).await }
    });
    tokio::time::timeout(std::time::Duration::from_secs(10), started.notified()).await?;
    let late = runtime
        .submit_tool_result(Submit::result("s1", "p1", json!("late")))
        .await?;
    assert_eq!(late, SubmitOutcome::AlreadyCompleted);
    // The sweep meanwhile (it waits for the session to settle, so it runs beside).
    let swept = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.sweep_deadlines().await }
    });
    // The sweep fired the call while the tool runs: its deadline entry went.
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while !runtime.find_expired_pending(10_000).await?.is_empty() {
            tokio::task::yield_now().await;
        }
        Ok::<_, dormant::Error>(())
    })
    .await??;
    release.notify_one();
    let resumed = tokio::time::timeout(std::time::Duration::from_secs(10), resumed).await???;
    assert_eq!(resumed.status, Status::Completed);
    tokio::time::timeout(std::time::Duration::from_secs(10), swept).await???;
    // Nothing of the call is left for a sweep to fire.
    assert_eq!(runtime.sweep_deadlines().await?.fired, 0);
    assert!(runtime.find_expired_pending(10_000).await?.is_empty());
    let results = runtime
        .messages(&id)
        .await?
        .into_iter()
        .filter(
            |message| matches!(message, Message::Tool { tool_call_id, .. } if tool_call_id == "p1"),
        )
        .count();
    assert_eq!(results, 1, "one result for the expired call");
    Ok(())
}

/// An expired entry whose session has no such call (its owner handled the timeout and did
/// nothing) is cleared by the sweep that fired it, not fired again by every sweep after: left,
/// it kept the background timer sweeping at once, for good.
#[tokio::test]
async fn a_stale_entry_is_cleared_by_the_sweep_that_fires_it() -> anyhow::Result<()> {
    let clock = ManualClock::new(0);
    let store = temp_store()?;
    let ghost: SessionId = "ghost".parse()?;
    let mut batch = dormant::store::Batch::new(dormant::store::CommitKind::Other);
    batch.put(
        dormant::store::Tree::Deadlines,
        dormant::store::schema::deadline_key(1, &ghost, "c"),
        Vec::new(),
    );
    store.commit(batch).await?;
    let script = calls_then_text(&[("tc-1", "edit")], "gave up");
    let runtime = editor_runtime(
        Arc::clone(&store),
        clock.clone(),
        script,
        Arc::default(),
        |b| b,
    )?;
    clock.advance(10);

    let report = runtime.sweep_deadlines().await?;

    assert_eq!((report.fired, report.cleared), (0, 1), "{report:?}");
    let left = store
        .scan_prefix(dormant::store::Tree::Deadlines, b"")
        .await?;
    assert!(left.is_empty(), "{} entries left", left.len());
    Ok(())
}

/// `find_expired_pending` lists calls only: not the runtime's own entries in the index (a
/// look at a remote sub-agent, a resume owed).
#[tokio::test]
async fn find_expired_pending_lists_calls_not_the_runtime_s_own_entries() -> anyhow::Result<()> {
    let clock = ManualClock::new(0);
    let store = temp_store()?;
    let parent: SessionId = "parent".parse()?;
    let mut batch = dormant::store::Batch::new(dormant::store::CommitKind::Other);
    for name in ["\u{1}look d1", "\u{1}resume"] {
        batch.put(
            dormant::store::Tree::Deadlines,
            dormant::store::schema::deadline_key(1, &parent, name),
            Vec::new(),
        );
    }
    store.commit(batch).await?;
    let script = calls_then_text(&[("tc-1", "edit")], "gave up");
    let runtime = editor_runtime(store, clock.clone(), script, Arc::default(), |b| b)?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    clock.advance(60_000);

    let expired = runtime.find_expired_pending(clock_now(&clock)).await?;

    let names: Vec<(String, String)> = expired
        .into_iter()
        .map(|call| (call.session.to_string(), call.tool_call_id))
        .collect();
    assert_eq!(names, vec![("s1".to_string(), "tc-1".to_string())]);
    Ok(())
}
