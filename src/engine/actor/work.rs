//! The work a session actor started and waits on (its model call, its step's tools), so that
//! an interrupt, an abort or the actor's end can cancel it.

use std::future::Future;

use tokio::task::AbortHandle;

/// Tasks in flight; dropping this cancels them (an actor that stops, or restarts after a
/// panic, leaves nothing running behind it).
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    tasks: Vec<AbortHandle>,
}

impl InFlight {
    /// Runs `work` on its own task, cancelled by [`InFlight::cancel`].
    pub(crate) fn spawn(&mut self, work: impl Future<Output = ()> + Send + 'static) {
        self.tasks.retain(|task| !task.is_finished());
        self.tasks.push(tokio::spawn(work).abort_handle());
    }

    /// Cancels every task in flight: its future is dropped at its next await, so nothing it
    /// would have reported arrives (and what it reported already is ignored by the core, whose
    /// run has ended).
    pub(crate) fn cancel(&mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.cancel();
    }
}
