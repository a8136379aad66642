//! The store contract: what the runtime relies on from a [`Store`], checked against any
//! backend by one suite, [`store_contract`].
//!
//! Each item of the [`Store`] trait's documentation is a check here (the list is
//! [`CHECKS`]): a backend that passes them all behaves, as far as the runtime can tell, like
//! [`MemoryStore`](crate::MemoryStore). The checks write under their own key prefix
//! (`contract/…`) in every tree, so a store that already holds other keys can be checked too.

mod checks;
mod lifecycle;

use std::future::Future;
use std::sync::Arc;

use crate::store::{self, Batch, CommitKind, Entry, Store, Tree};

/// What becomes of a store's data when [`store_contract`] opens it again after closing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reopen {
    /// Each open is a new, empty store ([`MemoryStore`](crate::MemoryStore), a
    /// temporary [`SledStore`](crate::SledStore)): nothing is expected across opens.
    Empty,
    /// Each open sees what earlier opens committed (a sled directory, a database): every
    /// acknowledged commit, whole, survives a close and a release.
    Same,
}

/// A check of the store contract that did not hold.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ContractError {
    /// The store answered, but not as the contract says.
    #[error("store contract, {check}: {detail}")]
    Broken {
        /// The check (one of [`CHECKS`]).
        check: &'static str,
        /// What was expected and what the store answered.
        detail: String,
    },
    /// The store failed a call the contract says succeeds.
    #[error("store contract, {check}: the store failed")]
    Store {
        /// The check (one of [`CHECKS`]).
        check: &'static str,
        /// The store's error.
        #[source]
        source: store::Error,
    },
    /// Opening the store under test failed.
    #[error("store contract: opening the store failed")]
    Open(#[source] store::Error),
}

/// Every check [`store_contract`] runs, in order, as its errors name them.
pub const CHECKS: [&str; 15] = [
    "a missing key reads as nothing",
    "a commit is read back in every tree",
    "trees keep their keys apart",
    "a delete removes a key and a missing key is no error",
    "later ops of a batch win",
    "an empty batch commits and changes nothing",
    "scan_prefix returns the prefix's keys in order",
    "scan_prefix_rev returns the last keys first, up to its limit",
    "scan_range is half-open, in order, up to its limit",
    "large values come back whole",
    "a batch over several trees is visible all at once",
    "concurrent commits are all acknowledged and visible",
    "a healthy store flushes, reports its size and is not degraded",
    "after close every call fails with Closed, or the store still works",
    "after release every call fails with Closed, and reopening keeps every commit",
];

/// Runs the store contract on the store `open` gives.
///
/// `open` is called three times: the store it returns first is checked and then closed
/// ([`Store::close`]); the second is checked to hold (with [`Reopen::Same`]) what the first
/// committed before its close, and is then released ([`Store::release`]); the third to hold
/// what the second committed before its release. With [`Reopen::Empty`] each open may be a
/// new store. The first store must hold no key under `contract/` yet.
///
/// A store that closes ([`Store::is_closed`] is true after [`Store::close`]) must then fail
/// every call with [`store::Error::Closed`]; one that keeps the trait's default (`close` only
/// flushes) must keep working.
///
/// Run it on a tokio runtime (it spawns tasks, to read while another task commits).
///
/// ```
/// use std::sync::Arc;
/// use dormant::MemoryStore;
/// use dormant::store::Store;
/// use dormant::testkit::{store_contract, Reopen};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), dormant::testkit::ContractError> {
/// store_contract(Reopen::Empty, || async {
///     Ok(Arc::new(MemoryStore::new()) as Arc<dyn Store>)
/// })
/// .await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// The first check that did not hold, named as in [`CHECKS`].
pub async fn store_contract<F, Fut>(reopen: Reopen, mut open: F) -> Result<(), ContractError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Arc<dyn Store>, store::Error>>,
{
    let store = open().await.map_err(ContractError::Open)?;
    checks::reads_and_writes(&store).await?;
    checks::scans(&store).await?;
    checks::large_values(&store).await?;
    checks::atomic_batches(&store).await?;
    checks::concurrent_commits(&store).await?;
    checks::healthy(&store).await?;
    lifecycle::close_then_release(reopen, store, &mut open).await
}

/// One check under way: its name, for errors, and the store it checks.
pub(super) struct Check<'a> {
    pub(super) name: &'static str,
    pub(super) store: &'a Arc<dyn Store>,
}

impl<'a> Check<'a> {
    pub(super) fn new(index: usize, store: &'a Arc<dyn Store>) -> Self {
        Self {
            name: CHECKS[index],
            store,
        }
    }

    /// The check's failure with `detail`, unless `holds`.
    pub(super) fn ensure(
        &self,
        holds: bool,
        detail: impl FnOnce() -> String,
    ) -> Result<(), ContractError> {
        if holds {
            return Ok(());
        }
        Err(ContractError::Broken {
            check: self.name,
            detail: detail(),
        })
    }

    /// The store's error, as this check's.
    pub(super) fn failed(&self, source: store::Error) -> ContractError {
        ContractError::Store {
            check: self.name,
            source,
        }
    }

    pub(super) async fn commit(&self, batch: Batch) -> Result<(), ContractError> {
        self.store
            .commit(batch)
            .await
            .map_err(|error| self.failed(error))
    }

    pub(super) async fn get(
        &self,
        tree: Tree,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, ContractError> {
        self.store
            .get(tree, key)
            .await
            .map_err(|error| self.failed(error))
    }

    pub(super) async fn scan_prefix(
        &self,
        tree: Tree,
        prefix: &[u8],
    ) -> Result<Vec<Entry>, ContractError> {
        self.store
            .scan_prefix(tree, prefix)
            .await
            .map_err(|error| self.failed(error))
    }

    /// Checks that `tree` holds `expected` (`None`: nothing) at `key`.
    pub(super) async fn expect(
        &self,
        tree: Tree,
        key: &[u8],
        expected: Option<&[u8]>,
    ) -> Result<(), ContractError> {
        let found = self.get(tree, key).await?;
        self.ensure(found.as_deref() == expected, || {
            format!(
                "{} {} reads {}, expected {}",
                tree.name(),
                shown(key),
                shown_value(found.as_deref()),
                shown_value(expected)
            )
        })
    }
}

/// A batch of puts (`Some`) and deletes (`None`) in one tree.
pub(super) fn batch(tree: Tree, ops: &[(&[u8], Option<&[u8]>)]) -> Batch {
    let mut batch = Batch::new(CommitKind::Other);
    for (key, value) in ops {
        match value {
            Some(value) => batch.put(tree, key.to_vec(), value.to_vec()),
            None => batch.delete(tree, key.to_vec()),
        }
    }
    batch
}

/// The keys of `entries`, shown.
pub(super) fn keys(entries: &[Entry]) -> Vec<String> {
    entries.iter().map(|(key, _)| shown(key)).collect()
}

/// A key as text, its non-printable bytes escaped.
pub(super) fn shown(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

/// A value as text: short ones whole, long ones by their length.
pub(super) fn shown_value(value: Option<&[u8]>) -> String {
    match value {
        None => "nothing".to_owned(),
        Some(value) if value.len() > 64 => format!("{} bytes", value.len()),
        Some(value) => format!("\"{}\"", shown(value)),
    }
}
