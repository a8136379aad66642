//! A store wrapper that fails chosen commits, to exercise every error path and crash window
//! ("cold code is buggy code").

use std::sync::Arc;

use parking_lot::Mutex;

use super::delegating::{Call, Delegate, DelegatingStore};
use super::{CommitKind, Error, Store};

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

/// The [`Delegate`] of a [`FaultyStore`]: the armed fault and what it failed.
#[derive(Debug, Default)]
pub struct Faults {
    state: Mutex<State>,
}

/// Wraps a store and fails the commits a [`Fault`] names; reads always pass through. Test
/// tooling: only with the `test-util` feature. It is a [`DelegatingStore`] whose delegate,
/// [`Faults`], decides each commit.
///
/// ```
/// use std::sync::Arc;
/// use dormant::MemoryStore;
/// use dormant::store::{Batch, CommitKind, Store, Tree};
/// use dormant::testkit::{Fault, FaultyStore};
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
pub type FaultyStore = DelegatingStore<Faults>;

impl DelegatingStore<Faults> {
    /// Wraps `inner`, with no fault armed.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        DelegatingStore::wrap(inner, Faults::default())
    }

    /// Arms a fault (replacing any armed one).
    pub fn arm(&self, fault: Fault) {
        self.delegate().state.lock().armed = Some(fault);
    }

    /// Disarms every fault and revives a store a `CrashBefore` fault killed.
    pub fn clear(&self) {
        let mut state = self.delegate().state.lock();
        state.armed = None;
        state.dead = false;
    }

    /// How many commits were failed.
    pub fn failed_commits(&self) -> u64 {
        self.delegate().state.lock().failed
    }
}

impl Faults {
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
impl Delegate for Faults {
    async fn before(&self, call: Call<'_>) -> Result<(), Error> {
        match call {
            Call::Commit(batch) if self.trips(batch.kind()) => {
                Err(Error::backend(InjectedFault { kind: batch.kind() }))
            }
            _ => Ok(()),
        }
    }

    /// Only a store nobody else holds: tests keep the inner store to restart on it after a
    /// simulated crash.
    fn release(&self, inner: &Arc<dyn Store>) {
        if Arc::strong_count(inner) == 1 {
            inner.release();
        }
    }
}
