//! A store whose commits can be held back, to see what a request does when the store is slow.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use dormant::store::Error;
use dormant::testkit::{Call, Delegate, DelegatingStore};
use dormant::MemoryStore;
use tokio::sync::Notify;

/// Holds commits back while closed; every other call passes.
#[derive(Debug, Default)]
pub struct Gate {
    closed: AtomicBool,
    opened: Notify,
}

/// A [`MemoryStore`] behind a [`Gate`].
pub type GatedStore = DelegatingStore<Gate>;

/// A new store with its gate open.
pub fn gated_store() -> Arc<GatedStore> {
    Arc::new(DelegatingStore::wrap(
        Arc::new(MemoryStore::new()),
        Gate::default(),
    ))
}

impl Gate {
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
impl Delegate for Gate {
    async fn before(&self, call: Call<'_>) -> Result<(), Error> {
        if !matches!(call, Call::Commit(_)) {
            return Ok(());
        }
        loop {
            let opened = self.opened.notified();
            if !self.closed.load(Ordering::SeqCst) {
                return Ok(());
            }
            opened.await;
        }
    }
}
