//! A store wrapper that fails chosen commits, to exercise every error path and crash window
//! ("cold code is buggy code").

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Batch, CommitKind, Entry, Error, Store, Tree};

/// Which commits a [`FaultyStore`] fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// The next commit fails; later ones succeed.
    NextCommit,
    /// The next commit of this kind fails; later ones succeed (a disk that was full for a
    /// moment: the process lives on).
    NextCommitOf(CommitKind),
    /// The next commit of this kind fails, and every commit after it, as if the process died
    /// just before it: nothing of it or after it lands, until [`FaultyStore::clear`].
    CrashBefore(CommitKind),
}

/// The error of a commit a [`FaultyStore`] failed, carried in [`Error::Backend`] (find it with
/// [`Error::downcast_ref`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("injected fault: commit of kind {kind:?} failed as if the process died")]
pub struct InjectedFault {
    /// The kind of the commit that failed.
    pub kind: CommitKind,
}

#[derive(Debug, Default)]
struct State {
    armed: Option<Fault>,
    dead: bool,
    failed: u64,
}

/// Wraps a store and fails the commits a [`Fault`] names; reads always pass through. Test
/// tooling: only with the `test-util` feature.
///
/// ```
/// use std::sync::Arc;
/// use dormant::store::{Batch, CommitKind, Fault, FaultyStore, MemoryStore, Store, Tree};
///
/// # futures::executor::block_on(async {
/// let store = FaultyStore::new(Arc::new(MemoryStore::new()));
/// store.arm(Fault::NextCommit);
/// let mut batch = Batch::new(CommitKind::Other);
/// batch.put(Tree::Sessions, b"k".to_vec(), b"v".to_vec());
/// assert!(store.commit(batch.clone()).await.is_err());
/// assert!(store.commit(batch).await.is_ok());
/// # });
/// ```
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    state: Mutex<State>,
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyStore")
            .field("inner", &self.inner)
            .field("state", &*self.state.lock())
            .finish()
    }
}

impl FaultyStore {
    /// Wraps `inner`, with no fault armed.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            state: Mutex::default(),
        }
    }

    /// Arms a fault (replacing any armed one).
    pub fn arm(&self, fault: Fault) {
        self.state.lock().armed = Some(fault);
    }

    /// Disarms every fault and revives a store a `CrashBefore` fault killed.
    pub fn clear(&self) {
        let mut state = self.state.lock();
        state.armed = None;
        state.dead = false;
    }

    /// How many commits were failed.
    pub fn failed_commits(&self) -> u64 {
        self.state.lock().failed
    }

    /// Whether this commit must fail; updates the fault's state.
    fn trips(&self, kind: CommitKind) -> bool {
        let mut state = self.state.lock();
        let trips = state.dead
            || match state.armed {
                Some(Fault::NextCommit) => {
                    state.armed = None;
                    true
                }
                Some(Fault::NextCommitOf(armed)) if armed == kind => {
                    state.armed = None;
                    true
                }
                Some(Fault::CrashBefore(armed)) if armed == kind => {
                    state.armed = None;
                    state.dead = true;
                    true
                }
                _ => false,
            };
        if trips {
            state.failed += 1;
        }
        trips
    }
}

#[async_trait::async_trait]
impl Store for FaultyStore {
    async fn commit(&self, batch: Batch) -> Result<(), Error> {
        if self.trips(batch.kind()) {
            return Err(Error::backend(InjectedFault { kind: batch.kind() }));
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

    async fn close(&self) -> Result<(), Error> {
        self.inner.close().await
    }

    /// Only a store nobody else holds: tests keep the inner store to restart on it after a
    /// simulated crash.
    fn release(&self) {
        if Arc::strong_count(&self.inner) == 1 {
            self.inner.release();
        }
    }

    fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    fn is_shared(&self) -> bool {
        self.inner.is_shared()
    }

    async fn size_on_disk(&self) -> Result<u64, Error> {
        self.inner.size_on_disk().await
    }
}
