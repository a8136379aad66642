//! The store contract (`dormant::testkit::store_contract`) holds on every embedded backend:
//! memory, sled temporary, sled, fjall (feature `fjall`) and the journal (feature `journal`) on a directory opened
//! again (PostgreSQL's is in
//! tests/postgres.rs), through the kit's delegating store too; and it names the check a broken
//! store fails.

use std::sync::Arc;

use dormant::store::{self, Batch, Durability, Op, SledStoreBuilder, Store};
use dormant::testkit::{store_contract, ContractError, Reopen, CHECKS};
use dormant::testkit::{Delegate, DelegatingStore, FaultyStore, Forward};
use dormant::{MemoryStore, SledStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_contract_holds_on_memory() -> anyhow::Result<()> {
    store_contract(Reopen::Empty, || async {
        Ok(Arc::new(MemoryStore::new()) as Arc<dyn Store>)
    })
    .await?;
    Ok(())
}

#[cfg(feature = "fjall")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_contract_holds_on_a_fjall_directory_across_reopens() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store");
    store_contract(Reopen::Same, || {
        let path = path.clone();
        async move { Ok(Arc::new(dormant::FjallStore::open(path)?) as Arc<dyn Store>) }
    })
    .await?;
    Ok(())
}

#[cfg(all(unix, feature = "journal"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_contract_holds_on_a_journal_directory_across_reopens() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store");
    store_contract(Reopen::Same, || {
        let path = path.clone();
        async move { Ok(Arc::new(dormant::JournalStore::open(path)?) as Arc<dyn Store>) }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_contract_holds_through_a_delegating_store_and_a_faulty_store_with_no_fault(
) -> anyhow::Result<()> {
    store_contract(Reopen::Empty, || async {
        let inner = Arc::new(MemoryStore::new());
        Ok(Arc::new(DelegatingStore::wrap(inner, Forward)) as Arc<dyn Store>)
    })
    .await?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store");
    store_contract(Reopen::Same, || {
        let path = path.clone();
        async move {
            let sled = Arc::new(SledStore::open(path)?);
            Ok(Arc::new(FaultyStore::new(sled)) as Arc<dyn Store>)
        }
    })
    .await?;
    Ok(())
}

/// Commits only the first write of each batch, or drops values over 4 KiB.
#[derive(Debug)]
enum Broken {
    FirstOpOnly,
    NoLargeValues,
}

#[async_trait::async_trait]
impl Delegate for Broken {
    async fn commit(&self, inner: &dyn Store, batch: Batch) -> Result<(), store::Error> {
        let mut kept = Batch::new(batch.kind());
        for (index, op) in batch.ops().iter().enumerate() {
            match (self, op) {
                (Broken::FirstOpOnly, _) if index > 0 => {}
                (Broken::NoLargeValues, Op::Put { value, .. }) if value.len() > 4096 => {}
                (_, Op::Put { tree, key, value }) => kept.put(*tree, key.clone(), value.clone()),
                (_, Op::Delete { tree, key }) => kept.delete(*tree, key.clone()),
            }
        }
        inner.commit(kept).await
    }
}

/// The check `store_contract` names for a store `broken` wraps.
async fn failed_check(reopen: Reopen, broken: fn() -> Broken) -> anyhow::Result<&'static str> {
    let failed = store_contract(reopen, || async move {
        let inner = Arc::new(MemoryStore::new());
        Ok(Arc::new(DelegatingStore::wrap(inner, broken())) as Arc<dyn Store>)
    })
    .await;
    match failed {
        Err(ContractError::Broken { check, .. }) => Ok(check),
        other => anyhow::bail!("a broken store passed or failed otherwise: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_contract_names_the_check_a_broken_store_fails() -> anyhow::Result<()> {
    assert_eq!(
        failed_check(Reopen::Empty, || Broken::FirstOpOnly).await?,
        CHECKS[1]
    );
    assert_eq!(
        failed_check(Reopen::Empty, || Broken::NoLargeValues).await?,
        "large values come back whole"
    );
    // A memory store forgets at each open: it is no store that keeps its data.
    let forgetful = store_contract(Reopen::Same, || async {
        Ok(Arc::new(MemoryStore::new()) as Arc<dyn Store>)
    })
    .await;
    match forgetful {
        Err(ContractError::Broken { check, .. }) => assert_eq!(check, CHECKS[14]),
        other => anyhow::bail!("a forgetful store passed or failed otherwise: {other:?}"),
    }
    Ok(())
}
