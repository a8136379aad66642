//! The checks of a store's end: close and release, then what a reopen finds.

use std::future::Future;
use std::sync::Arc;

use super::{batch, Check, ContractError, Reopen};
use crate::store::{self, Store, Tree};

/// Checks 13 and 14: `store` is closed, a second open released, a third checked.
pub(super) async fn close_then_release<F, Fut>(
    reopen: Reopen,
    store: Arc<dyn Store>,
    open: &mut F,
) -> Result<(), ContractError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Arc<dyn Store>, store::Error>>,
{
    let check = Check::new(13, &store);
    check
        .commit(batch(
            Tree::Children,
            &[(b"contract/kept/closed", Some(b"before close"))],
        ))
        .await?;
    store.close().await.map_err(|error| check.failed(error))?;
    if store.is_closed() {
        every_call_is_closed(&check).await?;
    } else {
        // The trait's default: close only flushes, and the store goes on.
        check
            .expect(
                Tree::Children,
                b"contract/kept/closed",
                Some(b"before close"),
            )
            .await?;
        check
            .commit(batch(
                Tree::Children,
                &[(b"contract/kept/after", Some(b"after close"))],
            ))
            .await?;
        check
            .expect(Tree::Children, b"contract/kept/after", Some(b"after close"))
            .await?;
    }
    drop(store);

    let store = open().await.map_err(ContractError::Open)?;
    let check = Check::new(14, &store);
    if reopen == Reopen::Same {
        check
            .expect(
                Tree::Children,
                b"contract/kept/closed",
                Some(b"before close"),
            )
            .await?;
        check
            .expect(Tree::Log, b"contract/rw/k", Some(b"log"))
            .await?;
        let found = check
            .scan_prefix(Tree::Tombstones, b"contract/concurrent/")
            .await?;
        check.ensure(found.len() == 100, || {
            format!(
                "after a reopen, {} of 100 concurrent commits are left",
                found.len()
            )
        })?;
    }
    let large: Vec<u8> = (0..100_000u32).map(|index| (index % 253) as u8).collect();
    check
        .commit(batch(
            Tree::Companions,
            &[
                (b"contract/kept/released", Some(&large)),
                (b"contract/kept/small", Some(b"s")),
            ],
        ))
        .await?;
    store.release();
    if store.is_closed() {
        every_call_is_closed(&check).await?;
    }
    drop(store);

    let store = open().await.map_err(ContractError::Open)?;
    let check = Check::new(14, &store);
    if reopen == Reopen::Same {
        check
            .expect(Tree::Companions, b"contract/kept/released", Some(&large))
            .await?;
        check
            .expect(Tree::Companions, b"contract/kept/small", Some(b"s"))
            .await?;
    }
    store.close().await.map_err(|error| check.failed(error))
}

/// Every call of a closed store fails with [`store::Error::Closed`].
async fn every_call_is_closed(check: &Check<'_>) -> Result<(), ContractError> {
    let store = check.store;
    let closed = |call: &str, result: Result<(), store::Error>| match result {
        Err(store::Error::Closed) => Ok(()),
        Err(error) => Err(ContractError::Broken {
            check: check.name,
            detail: format!("{call} of a closed store fails with {error:?}, not Closed"),
        }),
        Ok(()) => Err(ContractError::Broken {
            check: check.name,
            detail: format!("{call} of a closed store succeeds"),
        }),
    };
    closed(
        "commit",
        store
            .commit(batch(Tree::Pending, &[(b"contract/late", Some(b"x"))]))
            .await,
    )?;
    closed(
        "get",
        store.get(Tree::Pending, b"contract/late").await.map(drop),
    )?;
    closed(
        "scan_prefix",
        store
            .scan_prefix(Tree::Pending, b"contract/")
            .await
            .map(drop),
    )?;
    closed(
        "scan_prefix_rev",
        store
            .scan_prefix_rev(Tree::Pending, b"contract/", 1)
            .await
            .map(drop),
    )?;
    closed(
        "scan_range",
        store
            .scan_range(Tree::Pending, b"contract/", b"contract0", 1)
            .await
            .map(drop),
    )?;
    closed("flush", store.flush().await)?;
    Ok(())
}
