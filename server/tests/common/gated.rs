//! A store whose commits can be held back, to see what a request does when the store is slow.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use dormant::store::{Batch, Entry, Error, Tree};
use dormant::{MemoryStore, Store};
use tokio::sync::Notify;

#[derive(Debug, Default)]
pub struct GatedStore {
    inner: MemoryStore,
    closed: AtomicBool,
    opened: Notify,
}

impl GatedStore {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Commits wait from now on, until `open`.
    pub fn hold(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Held commits go through.
    pub fn open(&self) {
        self.closed.store(false, Ordering::SeqCst);
        self.opened.notify_waiters();
    }
}

#[async_trait]
impl Store for GatedStore {
    async fn commit(&self, batch: Batch) -> Result<(), Error> {
        loop {
            let opened = self.opened.notified();
            if !self.closed.load(Ordering::SeqCst) {
                break;
            }
            opened.await;
        }
        self.inner.commit(batch).await
    }

    async fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.inner.get(tree, key).await
    }

    async fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Entry>, Error> {
        self.inner.scan_prefix(tree, prefix).await
    }

    async fn scan_prefix_rev(
        &self,
        tree: Tree,
        prefix: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, Error> {
        self.inner.scan_prefix_rev(tree, prefix, limit).await
    }

    async fn scan_range(
        &self,
        tree: Tree,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, Error> {
        self.inner.scan_range(tree, from, to, limit).await
    }

    async fn flush(&self) -> Result<(), Error> {
        self.inner.flush().await
    }

    async fn size_on_disk(&self) -> Result<u64, Error> {
        self.inner.size_on_disk().await
    }
}
