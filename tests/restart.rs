//! Sessions survive a dropped runtime and a reopened store, and eviction mid-run; a dropped
//! runtime lets go of its store.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::worker_runtime;
use dormant::{ManualClock, SessionId, SledStore, Status};

#[tokio::test]
async fn sessions_are_intact_after_the_store_is_reopened() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let calls = Arc::new(AtomicUsize::new(0));
    let clock = ManualClock::new(0);
    let ids: Vec<SessionId> = (0..20)
        .map(|i| format!("s{i}").parse())
        .collect::<Result<_, _>>()?;
    let mut before = Vec::new();
    {
        let store = Arc::new(SledStore::open(dir.path())?);
        let runtime = worker_runtime(store, 3, calls.clone(), clock.clone())?;
        for id in &ids {
            let outcome = runtime.execute_on(id, "worker", "go").await?;
            assert_eq!(outcome.status, Status::Completed);
            before.push((
                runtime.messages(id).await?,
                runtime.runs(id).await?,
                runtime.chunks(id, 0).await?,
            ));
        }
        runtime.shutdown().await?;
    }
    let store = Arc::new(SledStore::open(dir.path())?);
    let runtime = worker_runtime(store, 3, calls.clone(), clock)?;
    assert_eq!(runtime.session_ids().await?.len(), ids.len());
    for (id, (messages, runs, chunks)) in ids.iter().zip(&before) {
        assert_eq!(runtime.status(id).await?, Status::Completed);
        assert_eq!(&runtime.messages(id).await?, messages);
        assert_eq!(&runtime.runs(id).await?, runs);
        assert_eq!(&runtime.chunks(id, 0).await?, chunks);
    }
    // A reopened session takes a new turn: its script index continues where it left off, so
    // with no replies left it fails with script_exhausted rather than replaying old answers.
    let again = runtime.execute_on(&ids[0], "worker", "more").await?;
    assert_eq!(again.turn, 2);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        60,
        "no tool ran twice across the restart"
    );
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_evicted_between_turns_rehydrate_with_their_conversation() -> anyhow::Result<()> {
    let calls = Arc::new(AtomicUsize::new(0));
    let store = common::temp_store()?;
    let agent = dormant::AgentDefinition::builder("worker")
        .tool(common::counting_tool("work", calls.clone()))
        .build()?;
    // Two turns, each one tool step then text.
    let mut script = common::tool_script("work", 1);
    script.extend(common::tool_script("work", 1));
    let llm = dormant::ScriptedLlm::new().script("worker", script);
    let runtime = dormant::Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .agent(agent)
        .max_resident(10)
        .build()?;
    let ids: Vec<SessionId> = (0..50)
        .map(|i| format!("r{i}").parse())
        .collect::<Result<_, _>>()?;
    for id in &ids {
        runtime.execute_on(id, "worker", "one").await?;
    }
    for id in &ids {
        let outcome = runtime.execute_on(id, "worker", "two").await?;
        assert_eq!((outcome.status, outcome.turn), (Status::Completed, 2));
        assert_eq!(runtime.messages(id).await?.len(), 8);
    }
    let stats = runtime.stats().host;
    assert!(stats.resident <= 10 + 1, "{stats:?}");
    assert!(
        stats.activations >= 100,
        "every second turn rehydrated: {stats:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 100);
    Ok(())
}

/// Opens the store in `dir` and runs one session `id` of the worker to completion on it.
async fn open_and_run(dir: &std::path::Path, id: &str) -> anyhow::Result<dormant::Runtime> {
    let store = Arc::new(SledStore::open(dir)?);
    let runtime = worker_runtime(store, 1, Arc::default(), ManualClock::new(0))?;
    runtime.execute_on(&id.parse()?, "worker", "go").await?;
    Ok(runtime)
}

#[tokio::test]
async fn after_shutdown_the_directory_reopens_at_once_and_its_size_is_known() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    for round in 0..5 {
        let store = Arc::new(SledStore::open(dir.path())?);
        let runtime = worker_runtime(store.clone(), 1, Arc::default(), ManualClock::new(0))?;
        runtime
            .execute_on(&format!("s{round}").parse()?, "worker", "go")
            .await?;
        runtime.shutdown().await?;
        runtime.shutdown().await?; // a second one has nothing to do, and says so with Ok
                                   // A runtime clone held elsewhere gets the typed `ShutDown`, not a hang, a panic or a
                                   // store error.
        let codes = [
            runtime.session_ids().await.map(|_| ()),
            runtime
                .status(&format!("s{round}").parse()?)
                .await
                .map(|_| ()),
            runtime
                .messages(&format!("s{round}").parse()?)
                .await
                .map(|_| ()),
            runtime.store_size_on_disk().await.map(|_| ()),
        ]
        .map(|result| result.err().map(|error| error.code()));
        assert_eq!(codes, [Some("shut_down"); 4]);
        // The closed store still knows what its directory holds.
        assert!(store.size_on_disk_bytes()? > 0);
    }
    Ok(())
}

// One thread: the actors' background shutdown cannot run while the test reopens the
// directory, so only the release inside the drop can let go of it.
#[tokio::test(flavor = "current_thread")]
async fn dropping_the_last_clone_without_shutdown_releases_a_store_nobody_else_holds(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    for round in 0..5 {
        // The directory opens at once: the previous round's runtime let go of it when its
        // last clone was dropped.
        let runtime = open_and_run(dir.path(), &format!("s{round}")).await?;
        let clone = runtime.clone();
        drop(runtime);
        // A clone keeps the runtime alive.
        assert_eq!(clone.session_ids().await?.len(), round + 1);
        drop(clone);
    }
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn a_shutdown_cancelled_half_way_leaves_the_release_to_the_drop() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    for round in 0..3 {
        let runtime = open_and_run(dir.path(), &format!("s{round}")).await?;
        // One poll: the shutdown starts stopping actors, then is dropped (as by a timeout).
        let mut shutdown = Box::pin(runtime.shutdown());
        assert!(futures::poll!(shutdown.as_mut()).is_pending());
        drop(shutdown);
        drop(runtime);
    }
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn a_weak_handle_does_not_keep_the_runtime_alive() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let runtime = open_and_run(dir.path(), "s0").await?;
    let weak = runtime.downgrade();
    let upgraded = weak
        .upgrade()
        .ok_or_else(|| anyhow::anyhow!("runtime alive"))?;
    assert_eq!(upgraded.status(&"s0".parse()?).await?, Status::Completed);
    drop(upgraded);
    drop(runtime);
    assert!(weak.upgrade().is_none());
    // The directory was released by the drop of the last strong handle.
    let store = Arc::new(SledStore::open(dir.path())?);
    let again = worker_runtime(store, 1, Arc::default(), ManualClock::new(0))?;
    assert_eq!(again.status(&"s0".parse()?).await?, Status::Completed);
    again.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_runtime_leaves_a_store_the_caller_holds_open() -> anyhow::Result<()> {
    let store: Arc<dyn dormant::store::Store> = Arc::new(SledStore::temporary()?);
    let runtime = worker_runtime(Arc::clone(&store), 1, Arc::default(), ManualClock::new(0))?;
    runtime.execute_on(&"s0".parse()?, "worker", "go").await?;
    drop(runtime);
    // A released store would refuse this with `Closed`.
    store.flush().await?;
    assert!(store.size_on_disk().await? > 0);
    Ok(())
}

#[test]
fn building_outside_a_tokio_runtime_is_a_typed_error() {
    let built = dormant::Runtime::builder()
        .store(Arc::new(dormant::MemoryStore::new()))
        .build();
    assert_eq!(
        built.err().map(|error| error.code()),
        Some("no_tokio_runtime")
    );
}
