//! A node whose lease lapsed reads its session again before it acts on it; an answer it
//! accepted before, still being committed beside the mailbox, is part of what it reads.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{calls_then_text, editor_runtime, HoldsOne};
use dormant::cluster::leases::{LeaseOwner, Leases, PeerKey};
use dormant::store::{Error as StoreError, Store};
use dormant::testkit::DelegatingStore;
use dormant::{ManualClock, MemoryStore, SessionId, Status, Submit, SubmitOutcome};
use serde_json::json;

/// Leases of a store other nodes share, held all along but once: the next look after
/// `lapse` says the lease was lost and taken again since.
#[derive(Debug, Default)]
struct LapsingOnce {
    lapsed: AtomicBool,
}

#[async_trait::async_trait]
impl Leases for LapsingOnce {
    fn is_shared(&self) -> bool {
        true
    }

    async fn acquire(&self, _session: &str, _lease: &str) -> Result<(), StoreError> {
        Ok(())
    }

    fn release_session(&self, _session: &str) {}

    fn holds_current(&self, _session: &str) -> bool {
        !self.lapsed.swap(false, Ordering::SeqCst)
    }

    fn holds(&self, _lease: &str) -> bool {
        true
    }

    async fn owner(&self, _lease: &str) -> Result<Option<LeaseOwner>, StoreError> {
        Ok(None)
    }

    fn peer_key(&self) -> Option<PeerKey> {
        None
    }
}

/// On one thread: once the actor looked at its lease, a few turns of the others run whatever
/// it does next without waiting on anything (the store is in memory), which is a read of the
/// store, unless it waits for the commit on its way.
#[tokio::test]
async fn an_answer_still_being_committed_when_the_lease_lapsed_is_read_back_with_the_session(
) -> anyhow::Result<()> {
    let store = Arc::new(DelegatingStore::wrap(
        Arc::new(MemoryStore::new()),
        HoldsOne::default(),
    ));
    let leases = Arc::new(LapsingOnce::default());
    let script = calls_then_text(&[("tc-1", "edit"), ("tc-2", "edit")], "done");
    let runtime = editor_runtime(
        Arc::clone(&store) as Arc<dyn Store>,
        ManualClock::new(0),
        script,
        Arc::default(),
        |builder| builder.leases(Arc::clone(&leases) as Arc<dyn Leases>),
    )?;
    let id: SessionId = "s1".parse()?;
    let waiting = runtime.execute_on(&id, "editor", "go").await?;
    assert_eq!(waiting.status, Status::SuspendedClientTool);

    store.delegate().armed.store(true, Ordering::SeqCst);
    let first = tokio::spawn({
        let runtime = runtime.clone();
        async move {
            runtime
                .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 1 })))
                .await
        }
    });
    store.delegate().reached.notified().await;
    // The lease lapses while the first answer's commit is on its way; the next message reads
    // the session again.
    leases.lapsed.store(true, Ordering::SeqCst);
    let second = tokio::spawn({
        let runtime = runtime.clone();
        async move {
            runtime
                .submit_tool_result(Submit::result("s1", "tc-2", json!({ "applied": 2 })))
                .await
        }
    });
    let mut turns = 0;
    while leases.lapsed.load(Ordering::SeqCst) {
        turns += 1;
        assert!(
            turns < 1_000_000,
            "the second answer never reached the actor"
        );
        tokio::task::yield_now().await;
    }
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    store.delegate().let_go.notify_one();
    assert_eq!(first.await??, SubmitOutcome::Accepted);
    assert_eq!(second.await??, SubmitOutcome::Accepted);

    let again = runtime
        .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 9 })))
        .await?;
    assert_eq!(
        again,
        SubmitOutcome::AlreadyCompleted,
        "the acknowledged answer is the call's, once"
    );
    let outcome = runtime.resume(&id).await?;
    assert_eq!(outcome.status, Status::Completed);
    let messages = runtime.messages(&id).await?;
    assert_eq!(
        common::tool_result(&messages, "tc-1"),
        Some(&dormant::types::ToolOutcome::Result(
            json!({ "applied": 1 })
        ))
    );
    runtime.shutdown().await?;
    Ok(())
}

/// A run at work (a server tool running) when the node's lease lapsed: the message that comes
/// next (the tool's result) finds the lease lost, and the run is cut as by a fenced commit: its
/// caller is answered `RunCut` (its run began: sending the call again would run it twice),
/// not left waiting for good on a run nobody finishes; the session reads back interrupted, and
/// a resume goes on with it.
#[tokio::test]
async fn a_run_at_work_when_the_lease_lapsed_answers_its_caller_that_it_was_cut(
) -> anyhow::Result<()> {
    let (started, gate) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let tool = dormant::ToolDefinition::server("slow", {
        let (started, gate) = (Arc::clone(&started), Arc::clone(&gate));
        move |_input, _ctx| {
            let (started, gate) = (Arc::clone(&started), Arc::clone(&gate));
            async move {
                started.notify_one();
                gate.notified().await;
                Ok::<_, dormant::ToolError>(json!("done"))
            }
        }
    });
    let agent = dormant::AgentDefinition::builder("worker")
        .tool(tool)
        .build()?;
    let script = calls_then_text(&[("tc-1", "slow")], "finished");
    let leases = Arc::new(LapsingOnce::default());
    let runtime = dormant::Runtime::builder()
        .store(Arc::new(MemoryStore::new()))
        .llm(Arc::new(
            dormant::ScriptedLlm::new().script("worker", script),
        ))
        .clock(Arc::new(ManualClock::new(0)))
        .background_deadlines(false)
        .leases(Arc::clone(&leases) as Arc<dyn Leases>)
        .agent(agent)
        .build()?;
    let id: SessionId = "s1".parse()?;
    let running = tokio::spawn({
        let (runtime, id) = (runtime.clone(), id.clone());
        async move { runtime.execute_on(&id, "worker", "go").await }
    });
    // The tool runs: the run waits on it.
    started.notified().await;
    leases.lapsed.store(true, Ordering::SeqCst);
    gate.notify_one();

    let answered = tokio::time::timeout(std::time::Duration::from_secs(30), running)
        .await
        .map_err(|_| anyhow::anyhow!("the caller was never answered"))??;
    match answered {
        Err(dormant::Error::RunCut { .. }) => {}
        other => anyhow::bail!("expected the run to be cut, got {other:?}"),
    }
    let cut = runtime.session(&id).await?;
    assert_eq!(cut.status, Status::Interrupted);
    let outcome = runtime.resume(&id).await?;
    assert_eq!(outcome.status, Status::Completed);
    runtime.shutdown().await?;
    Ok(())
}
