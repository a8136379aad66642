//! The parts of a runtime that its clones share, and what happens when the last clone goes
//! away without [`Runtime::shutdown`](super::Runtime::shutdown).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dormant_actors::Host;

use super::claim::StoreClaim;
use crate::engine::actor::SessionActor;
use crate::engine::deadlines::Deadlines;
use crate::engine::shared::Shared;

/// Shared by every clone of a [`Runtime`](super::Runtime); dropped with the last one.
///
/// Its drop shuts the runtime down. Without that, a dropped runtime would live on for the
/// life of the process: its actors hold the shared state, which holds the store, its flusher
/// thread and sled's lock on the directory, so the directory could not be reopened.
#[derive(Debug)]
pub(super) struct Inner {
    pub(super) host: Host<SessionActor>,
    /// Where the deadline scheduler takes its requests.
    pub(super) deadlines: Deadlines,
    /// The deadline scheduler's task and the other background tasks, stopped with the
    /// runtime.
    background: Vec<tokio::task::AbortHandle>,
    pub(super) shared: Arc<Shared>,
    pub(super) max_result_bytes: usize,
    /// Captured at build (which needs a tokio runtime to start actors), so a handle dropped
    /// on a thread outside tokio can still stop them.
    tokio: tokio::runtime::Handle,
    /// Set when `shutdown` begins: from then on every method answers `ShutDown`.
    closing: AtomicBool,
    shut_down: AtomicBool,
    /// The runtime's hold on its store, released by `shutdown` (or with the last handle).
    claim: parking_lot::Mutex<Option<StoreClaim>>,
}

impl Inner {
    pub(super) fn new(
        host: Host<SessionActor>,
        deadlines: Deadlines,
        background: Vec<tokio::task::AbortHandle>,
        shared: Arc<Shared>,
        max_result_bytes: usize,
        tokio: tokio::runtime::Handle,
        claim: StoreClaim,
    ) -> Self {
        Self {
            host,
            deadlines,
            background,
            shared,
            max_result_bytes,
            tokio,
            closing: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            claim: parking_lot::Mutex::new(Some(claim)),
        }
    }

    /// `shutdown` began: new calls answer `ShutDown`.
    pub(super) fn mark_closing(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// Stops the deadline scheduler (a sweep in progress is dropped: its deadlines stay in the
    /// durable index for the next start) and the other background tasks.
    pub(super) fn stop_scheduler(&self) {
        for task in &self.background {
            task.abort();
        }
    }

    /// The tokio runtime the runtime was built in.
    #[cfg(feature = "otel")]
    pub(super) fn tokio(&self) -> &tokio::runtime::Handle {
        &self.tokio
    }

    /// Whether `shutdown` began.
    pub(super) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Lets another runtime be built on the store.
    pub(super) fn release_claim(&self) {
        self.claim.lock().take();
    }

    /// `shutdown` finished: dropping has nothing left to do.
    pub(super) fn mark_shut_down(&self) {
        self.shut_down.store(true, Ordering::Release);
        self.release_claim();
    }

    /// Whether `shutdown` finished.
    pub(super) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.is_shut_down() {
            return;
        }
        tracing::debug!("runtime.dropped_without_shutdown");
        // The store first, synchronously, so that its directory can be reopened as soon as the
        // drop returns. Every acknowledged commit is durable already; a commit still in flight
        // fails, as it would in a crash. A store the caller still holds is left open: they may
        // build another runtime on it.
        if Arc::strong_count(&self.shared.store) == 1 {
            self.shared.store.release();
        }
        self.shared.streams.clear();
        // Then the actors, which can only be stopped asynchronously. If tokio is shutting
        // down, the task is dropped, and so are the actors' own tasks.
        self.stop_scheduler();
        let host = self.host.clone();
        // The store stays claimed until the old actors have stopped: a runtime built on it
        // meanwhile would run beside them.
        let claim = self.claim.lock().take();
        drop(self.tokio.spawn(async move {
            host.shutdown().await;
            drop(claim);
        }));
    }
}
