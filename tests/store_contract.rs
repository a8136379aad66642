//! The store contract (`dormant::testkit::store_contract`) holds on every embedded backend:
//! memory, sled temporary, and sled on a directory opened again (PostgreSQL's is in
//! tests/postgres.rs).

use std::sync::Arc;

use dormant::store::{Durability, MemoryStore, SledStore, SledStoreBuilder, Store};
use dormant::testkit::{store_contract, Reopen};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_contract_holds_on_memory() -> anyhow::Result<()> {
    store_contract(Reopen::Empty, || async {
        Ok(Arc::new(MemoryStore::new()) as Arc<dyn Store>)
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_contract_holds_on_a_temporary_sled_store() -> anyhow::Result<()> {
    store_contract(Reopen::Empty, || async {
        Ok(Arc::new(SledStore::temporary()?) as Arc<dyn Store>)
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_contract_holds_on_a_sled_directory_across_reopens() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store");
    store_contract(Reopen::Same, || {
        let path = path.clone();
        async move { Ok(Arc::new(SledStore::open(path)?) as Arc<dyn Store>) }
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_contract_holds_on_sled_without_group_commit_safe_against_a_process_crash(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store");
    store_contract(Reopen::Same, || {
        let path = path.clone();
        async move {
            let store = SledStoreBuilder::new(path)
                .group_commit(false)
                .durability(Durability::ProcessCrash)
                .open()?;
            Ok(Arc::new(store) as Arc<dyn Store>)
        }
    })
    .await?;
    Ok(())
}
