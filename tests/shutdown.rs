//! One store has one runtime, and a shut-down runtime answers every call with `ShutDown`.

mod common;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use common::worker_runtime;
use dormant::store::Store;
use dormant::Submit;
use dormant::{AgentDefinition, BuildError, Error, ManualClock, MemoryStore, SessionId, SledStore};
use futures::StreamExt;
use serde_json::json;

fn runtime_on(store: Arc<dyn Store>) -> anyhow::Result<dormant::Runtime> {
    worker_runtime(store, 1, Arc::new(AtomicUsize::new(0)), ManualClock::new(0))
}

#[tokio::test]
async fn a_second_runtime_on_a_store_in_use_is_refused_until_the_first_shuts_down(
) -> anyhow::Result<()> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let first = runtime_on(Arc::clone(&store))?;
    match runtime_on(Arc::clone(&store)) {
        Err(error) => assert!(
            matches!(
                error.downcast_ref::<BuildError>(),
                Some(BuildError::StoreInUse)
            ),
            "{error}"
        ),
        Ok(_) => anyhow::bail!("two runtimes were built on one store"),
    }
    first.execute("worker", "go").await?;
    first.shutdown().await?;
    // A store that outlives its runtime's shutdown (a memory store is not closed) serves the
    // next one.
    let second = runtime_on(Arc::clone(&store))?;
    assert_eq!(second.session_ids().await?.len(), 1);
    second.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn after_shutdown_every_method_answers_shut_down() -> anyhow::Result<()> {
    let store: Arc<dyn Store> = Arc::new(SledStore::temporary()?);
    let runtime = runtime_on(Arc::clone(&store))?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "worker", "go").await?;
    runtime.shutdown().await?;
    // A call's `Error` or a read's `ReadError`, by the call error's code.
    fn code<E: Into<Error>>(result: Result<(), E>) -> Option<&'static str> {
        result.err().map(|error| error.into().code())
    }
    let shut_down = Some("shut_down");
    let agent = AgentDefinition::builder("late").build()?;
    assert_eq!(code(runtime.define(agent)), shut_down, "define");
    assert_eq!(
        code(runtime.execute("worker", "x").await.map(drop)),
        shut_down
    );
    assert_eq!(
        code(runtime.execute_on(&id, "worker", "x").await.map(drop)),
        shut_down
    );
    let submit = Submit::result("s1", "call-0", json!(1));
    assert_eq!(
        code(runtime.submit_tool_result(submit).await.map(drop)),
        shut_down
    );
    let envelope = json!({ "session_id": "s1", "tool_call_id": "call-0", "result": 1 });
    assert_eq!(
        code(runtime.submit_json(&envelope).await.map(drop)),
        shut_down
    );
    assert_eq!(
        code(runtime.resume(&id).await.map(drop)),
        shut_down,
        "resume"
    );
    assert_eq!(code(runtime.interrupt(&id).await), shut_down, "interrupt");
    assert_eq!(code(runtime.abort(&id).await), shut_down, "abort");
    assert_eq!(code(runtime.sweep_deadlines().await.map(drop)), shut_down);
    assert_eq!(
        code(runtime.find_expired_pending(0).await.map(drop)),
        shut_down
    );
    assert_eq!(
        code(runtime.pending(&id).await.map(drop)),
        shut_down,
        "pending"
    );
    assert_eq!(
        code(runtime.children(&id).await.map(drop)),
        shut_down,
        "children"
    );
    assert_eq!(
        code(runtime.companions(&id).await.map(drop)),
        shut_down,
        "companions"
    );
    assert_eq!(
        code(runtime.session(&id).await.map(drop)),
        shut_down,
        "session"
    );
    assert_eq!(
        code(runtime.session_ids().await.map(drop)),
        shut_down,
        "session_ids"
    );
    assert_eq!(
        code(runtime.status(&id).await.map(drop)),
        shut_down,
        "status"
    );
    assert_eq!(
        code(runtime.messages(&id).await.map(drop)),
        shut_down,
        "messages"
    );
    assert_eq!(code(runtime.runs(&id).await.map(drop)), shut_down, "runs");
    assert_eq!(
        code(runtime.chunks(&id, 0).await.map(drop)),
        shut_down,
        "chunks"
    );
    assert_eq!(
        code(runtime.store_size_on_disk().await.map(drop)),
        shut_down
    );
    let first = runtime.follow(&id, 0).boxed().next().await;
    assert!(
        matches!(first, Some(Err(Error::ShutDown))),
        "follow: {first:?}"
    );
    // The store a shutdown closed cannot serve a new runtime either.
    match runtime_on(store) {
        Err(error) => assert!(
            matches!(
                error.downcast_ref::<BuildError>(),
                Some(BuildError::StoreClosed)
            ),
            "{error}"
        ),
        Ok(_) => anyhow::bail!("a runtime was built on a closed store"),
    }
    Ok(())
}
