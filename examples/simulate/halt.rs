//! A store error ends the simulation at once.
//!
//! A simulated client cannot tell a slow deadline from a store that no longer commits: a
//! never-answered call whose timeout could not be recorded leaves its turn waiting on the
//! stream for a chunk that will never come. So the first [`dormant::Error::Store`] of any
//! call (execute, resume, submit, a read) is not a problem to list at the end but the end of
//! the run: it is recorded here, every task waiting on [`Halt::raised`] stops, and the
//! process exits with that error.

use parking_lot::Mutex;
use tokio::sync::watch;

/// The store failed under the simulation.
#[derive(Debug, thiserror::Error)]
#[error("store error, simulation stopped: {context}: {source}")]
pub(crate) struct StoreFailure {
    /// What the simulation was doing.
    pub(crate) context: String,
    /// The runtime's error (always [`dormant::Error::Store`]).
    #[source]
    pub(crate) source: dormant::Error,
}

/// The first store failure of a run, and a signal that one happened.
#[derive(Debug)]
pub(crate) struct Halt {
    first: Mutex<Option<StoreFailure>>,
    raised: watch::Sender<bool>,
}

impl Default for Halt {
    fn default() -> Self {
        Self {
            first: Mutex::new(None),
            raised: watch::Sender::new(false),
        }
    }
}

impl Halt {
    /// Describes `error` for a problem list: a store error also halts the run (only the
    /// first is kept), any other error is just described.
    pub(crate) fn check(
        &self,
        context: impl Into<String>,
        error: impl Into<dormant::Error>,
    ) -> String {
        let (context, error) = (context.into(), error.into());
        let described = format!("{context}: {error}");
        if matches!(error, dormant::Error::Store(_)) {
            self.raise(StoreFailure {
                context,
                source: error,
            });
        }
        described
    }

    /// Records `failure` if it is the first and wakes every task waiting on [`Halt::raised`].
    pub(crate) fn raise(&self, failure: StoreFailure) {
        let mut first = self.first.lock();
        if first.is_none() {
            *first = Some(failure);
        }
        self.raised.send_replace(true);
    }

    /// Returns once a store failure has been raised (at once if one was).
    pub(crate) async fn raised(&self) {
        let mut raised = self.raised.subscribe();
        // The sender lives in `self`, so the channel cannot close while this waits.
        let _ = raised.wait_for(|raised| *raised).await;
    }

    /// The first store failure, if one was raised.
    pub(crate) fn take(&self) -> Option<StoreFailure> {
        self.first.lock().take()
    }
}

/// An error of a step that runs alone (the end check): a store error becomes a
/// [`StoreFailure`], any other error keeps its own type under `context`.
pub(crate) fn fatal(context: impl Into<String>, error: impl Into<dormant::Error>) -> anyhow::Error {
    let (context, error) = (context.into(), error.into());
    if matches!(error, dormant::Error::Store(_)) {
        return StoreFailure {
            context,
            source: error,
        }
        .into();
    }
    anyhow::Error::new(error).context(context)
}
