//! A process killed with SIGKILL mid-run: the store reopens, nothing is corrupt, every session
//! is at a committed step, and every acknowledged run is there.
//!
//! The child is this same test binary, re-run with `--ignored --exact crash_child` and the
//! store path in an environment variable. The same test runs on `FjallStore` (feature
//! `fjall`) and `JournalStore` (feature `journal`): a store directory named `fjall` or
//! `journal` is opened as one.

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use dormant::store::Store;
use dormant::{ManualClock, SessionId, SledStore, Status};

const STORE_ENV: &str = "DORMANT_CRASH_CHILD_STORE";
/// Sessions the parent waits to see acknowledged before it kills the child.
const ACKED_BEFORE_KILL: usize = 40;

/// The child: runs sessions with several steps, 8 at a time, forever, printing the id of each
/// session whose run was acknowledged. Only runs when the parent starts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of killed_process_leaves_every_session_at_a_committed_step"]
async fn crash_child() -> anyhow::Result<()> {
    let Ok(path) = std::env::var(STORE_ENV) else {
        return Ok(());
    };
    let store = open_store(Path::new(&path))?;
    let runtime =
        common::worker_runtime(store, 6, Arc::new(AtomicUsize::new(0)), ManualClock::new(0))?;
    let mut next = 0u64;
    loop {
        let batch: Vec<_> = (next..next + 8)
            .map(|i| {
                let runtime = runtime.clone();
                async move {
                    let id: SessionId = format!("c{i}").parse()?;
                    let outcome = runtime.execute_on(&id, "worker", "go").await?;
                    anyhow::ensure!(outcome.status == Status::Completed);
                    println!("acked {id}");
                    Ok(())
                }
            })
            .collect();
        for result in futures::future::join_all(batch).await {
            result?;
        }
        next += 8;
    }
}

/// The store in `dir`: `FjallStore` for a directory named `fjall`, `JournalStore` for one named
/// `journal`, else `SledStore`.
fn open_store(dir: &Path) -> anyhow::Result<Arc<dyn Store>> {
    #[cfg(all(unix, feature = "journal"))]
    if dir.file_name().is_some_and(|name| name == "journal") {
        return Ok(Arc::new(dormant::JournalStore::open(dir)?));
    }
    #[cfg(feature = "fjall")]
    if dir.file_name().is_some_and(|name| name == "fjall") {
        return Ok(Arc::new(dormant::FjallStore::open(dir)?));
    }
    Ok(Arc::new(SledStore::open(dir)?))
}

#[test]
fn killed_process_leaves_every_session_at_a_committed_step() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    kill_and_check(&dir.path().join("sled"))
}

#[cfg(feature = "fjall")]
#[test]
fn killed_process_leaves_every_session_at_a_committed_step_on_fjall() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    kill_and_check(&dir.path().join("fjall"))
}

#[cfg(all(unix, feature = "journal"))]
#[test]
fn killed_process_leaves_every_session_at_a_committed_step_on_the_journal() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    kill_and_check(&dir.path().join("journal"))
}

/// Kills a child running sessions on the store in `dir` once it acknowledged
/// [`ACKED_BEFORE_KILL`] runs, then checks what the store reopened holds.
fn kill_and_check(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let (mut child, lines) = common::spawn_child("crash_child", STORE_ENV, dir)?;
    let mut acked = HashSet::new();
    for line in lines {
        let line = line?;
        if let Some(id) = line.strip_prefix("acked ") {
            acked.insert(id.to_string());
            if acked.len() >= ACKED_BEFORE_KILL {
                break;
            }
        }
    }
    // Child::kill sends SIGKILL on Unix: no destructor, no flush, no goodbye.
    child.kill()?;
    child.wait()?;
    anyhow::ensure!(
        acked.len() >= ACKED_BEFORE_KILL,
        "the child died before acking enough runs"
    );

    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let store = open_store(dir)?;
        let sessions =
            common::worker_runtime(store, 6, Arc::new(AtomicUsize::new(0)), ManualClock::new(0))?;
        let ids = sessions.session_ids().await?;
        let mut in_flight = 0;
        for id in &ids {
            // Every snapshot decodes, and its counters match what the same commits wrote.
            let record = sessions.session(id).await?;
            assert_eq!(
                sessions.messages(id).await?.len() as u64,
                record.message_count,
                "{id}"
            );
            assert_eq!(
                sessions.chunks(id, 0).await?.len() as u64,
                record.chunk_count,
                "{id}"
            );
            assert_eq!(
                sessions.runs(id).await?.len() as u32,
                record.run_count,
                "{id}"
            );
            match record.status {
                Status::Completed => {}
                Status::Running => in_flight += 1,
                other => anyhow::bail!("{id} has unexpected status {other}"),
            }
        }
        for id in &acked {
            let id: SessionId = id.parse()?;
            assert_eq!(
                sessions.status(&id).await?,
                Status::Completed,
                "acknowledged run of {id} lost"
            );
        }
        // A session cut mid-run is closed as interrupted when it is next activated, and then
        // takes a new turn.
        let mut running = None;
        for id in &ids {
            if sessions.status(id).await.ok() == Some(Status::Running) {
                running = Some(id);
                break;
            }
        }
        if let Some(id) = running {
            let outcome = sessions.execute_on(id, "worker", "again").await?;
            assert_eq!(outcome.turn, 2);
            let runs = sessions.runs(id).await?;
            assert_eq!(runs[0].status, Status::Interrupted);
        }
        eprintln!(
            "{} sessions on disk, {} acked, {in_flight} cut mid-run",
            ids.len(),
            acked.len()
        );
        sessions.shutdown().await?;
        anyhow::Ok(())
    })
}
