//! With `auto_resume`, the resume an answer makes owed is a message to the session's actor:
//! a process killed between the answer's commit and the resume's own is to resume the
//! session after a restart, not leave it suspended with nothing left to answer.
//!
//! The child is this same test binary, re-run with `--ignored --exact auto_resume_child`: its
//! store holds every resume's commit for good, so the kill always lands in between.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{calls_then_text, editor_runtime, run_ended, tool_result};
use dormant::store::{CommitKind, Error as StoreError, Store, Tree};
use dormant::testkit::{Call, Delegate, DelegatingStore};
use dormant::types::ToolOutcome;
use dormant::{ManualClock, MemoryStore, SessionId, SledStore, Status, Submit, SubmitOutcome};
use serde_json::json;

const STORE_ENV: &str = "DORMANT_AUTO_RESUME_CHILD_STORE";
const SESSIONS: usize = 8;

fn script() -> Vec<dormant::ModelReply> {
    calls_then_text(&[("tc-1", "edit")], "applied")
}

/// Holds up (`hang`) or fails every run's start once it is switched on: the starts of the
/// resumes, after the executes went through.
#[derive(Debug)]
struct ResumesNeverLand {
    on: AtomicBool,
    hang: bool,
}

impl ResumesNeverLand {
    fn new(hang: bool) -> Self {
        Self {
            on: AtomicBool::new(false),
            hang,
        }
    }
}

#[async_trait::async_trait]
impl Delegate for ResumesNeverLand {
    async fn before(&self, call: Call<'_>) -> Result<(), StoreError> {
        let Call::Commit(batch) = call else {
            return Ok(());
        };
        if batch.kind() != CommitKind::RunStart || !self.on.load(Ordering::SeqCst) {
            return Ok(());
        }
        if self.hang {
            std::future::pending::<()>().await;
        }
        Err(StoreError::backend("injected: the resume's commit failed"))
    }
}

/// The editor's runtime on `store`, resuming by itself.
fn auto_resuming(store: Arc<dyn Store>) -> anyhow::Result<dormant::Runtime> {
    editor_runtime(store, ManualClock::new(0), script(), Arc::default(), |b| {
        b.auto_resume(true)
    })
}

/// The answer to session `s1`'s call.
fn answer() -> Submit {
    Submit::result("s1", "tc-1", json!({ "applied": 1 }))
}

/// Runs session `s1` until it waits on its call.
async fn waiting(runtime: &dormant::Runtime) -> anyhow::Result<SessionId> {
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    Ok(id)
}

/// The child: suspends sessions on a client tool, answers them (each answer makes a resume
/// owed, whose commit never lands) and prints `accepted ID` for each; then waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of a_resume_owed_when_the_process_was_killed_runs_after_the_restart"]
async fn auto_resume_child() -> anyhow::Result<()> {
    let Ok(path) = std::env::var(STORE_ENV) else {
        return Ok(());
    };
    let store = Arc::new(DelegatingStore::wrap(
        Arc::new(SledStore::open(path)?),
        ResumesNeverLand::new(true),
    ));
    let runtime = auto_resuming(Arc::clone(&store) as Arc<dyn Store>)?;
    for i in 0..SESSIONS {
        let id: SessionId = format!("s{i}").parse()?;
        runtime.execute_on(&id, "editor", "go").await?;
    }
    store.delegate().on.store(true, Ordering::SeqCst);
    for i in 0..SESSIONS {
        let submit = Submit::result(format!("s{i}"), "tc-1", json!({ "applied": i }));
        anyhow::ensure!(runtime.submit_tool_result(submit).await? == SubmitOutcome::Accepted);
        println!("accepted s{i}");
    }
    std::future::pending::<()>().await;
    Ok(())
}

#[test]
fn a_resume_owed_when_the_process_was_killed_runs_after_the_restart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut child, lines) = common::spawn_child("auto_resume_child", STORE_ENV, dir.path())?;
    let mut accepted = Vec::new();
    for line in lines {
        if let Some(id) = line?.strip_prefix("accepted ") {
            accepted.push(id.to_string());
            if accepted.len() == SESSIONS {
                break;
            }
        }
    }
    child.kill()?;
    child.wait()?;
    anyhow::ensure!(accepted.len() == SESSIONS, "the child died early");

    tokio::runtime::Runtime::new()?.block_on(async {
        let store = Arc::new(SledStore::open(dir.path())?);
        let owed = store
            .scan_range(Tree::Deadlines, &[], &[0xff; 9], usize::MAX)
            .await?;
        assert_eq!(
            owed.len(),
            SESSIONS,
            "the kill landed after every answer's commit and before any resume's: {owed:?}"
        );
        // The background scheduler this time: its first sweep, at start, resumes them.
        let runtime = editor_runtime(
            Arc::clone(&store) as Arc<dyn Store>,
            ManualClock::new(0),
            script(),
            Arc::default(),
            |b| b.auto_resume(true).background_deadlines(true),
        )?;
        assert!(
            runtime.find_expired_pending(u64::MAX).await?.is_empty(),
            "a resume owed is no call's deadline"
        );
        for id in &accepted {
            let id: SessionId = id.parse()?;
            let index: i64 = id.as_str()[1..].parse()?;
            assert_eq!(
                run_ended(&runtime, &id, 0).await?,
                Status::Completed,
                "{id}"
            );
            let messages = runtime.messages(&id).await?;
            assert_eq!(
                tool_result(&messages, "tc-1"),
                Some(&ToolOutcome::Result(json!({ "applied": index })))
            );
            assert_eq!(runtime.runs(&id).await?.len(), 2, "one resume of {id}");
        }
        assert_no_deadline_entries(store.as_ref()).await?;
        runtime.shutdown().await?;
        anyhow::Ok(())
    })
}

/// The resume's commit failed: the session, read back suspended with its answer, resumes at
/// the next sweep, once.
#[tokio::test]
async fn a_resume_whose_commit_failed_runs_at_the_next_sweep() -> anyhow::Result<()> {
    let memory = Arc::new(MemoryStore::new());
    let store = Arc::new(DelegatingStore::wrap(
        Arc::clone(&memory) as Arc<dyn Store>,
        ResumesNeverLand::new(false),
    ));
    let failing = store.delegate();
    let runtime = auto_resuming(Arc::clone(&store) as Arc<dyn Store>)?;
    let id = waiting(&runtime).await?;
    failing.on.store(true, Ordering::SeqCst);
    runtime.submit_tool_result(answer()).await?;
    runtime.wait_settled(&id).await;
    assert_eq!(runtime.status(&id).await?, Status::SuspendedClientTool);
    failing.on.store(false, Ordering::SeqCst);
    runtime.sweep_deadlines().await?;
    runtime.wait_settled(&id).await;
    assert_eq!(runtime.status(&id).await?, Status::Completed);
    assert_eq!(runtime.runs(&id).await?.len(), 2, "one resume");
    runtime.sweep_deadlines().await?;
    assert_eq!(runtime.runs(&id).await?.len(), 2, "and no second one");
    assert_no_deadline_entries(memory.as_ref()).await?;
    Ok(())
}

/// An automatic resume that ran leaves nothing in the deadline index.
#[tokio::test]
async fn an_automatic_resume_that_ran_leaves_no_entry_behind() -> anyhow::Result<()> {
    let memory = Arc::new(MemoryStore::new());
    let runtime = auto_resuming(Arc::clone(&memory) as Arc<dyn Store>)?;
    let id = waiting(&runtime).await?;
    runtime.submit_tool_result(answer()).await?;
    runtime.wait_settled(&id).await;
    assert_eq!(runtime.status(&id).await?, Status::Completed);
    assert_no_deadline_entries(memory.as_ref()).await
}

async fn assert_no_deadline_entries(store: &dyn Store) -> anyhow::Result<()> {
    let left = store
        .scan_range(Tree::Deadlines, &[], &[0xff; 9], usize::MAX)
        .await?;
    anyhow::ensure!(left.is_empty(), "entries left: {left:?}");
    Ok(())
}
