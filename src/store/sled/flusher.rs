//! Group commit: the queue between committers and the flusher thread, which applies every
//! batch queued so far as one group, does one flush for all of them, and wakes their
//! committers.

use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};
use tokio::sync::oneshot;

use super::database::Shared;
use super::error::{io_error, SledError};
use super::writes::SledWrites;
use crate::store::Error;

/// Duplicates an error for every commit that waited on the same failed flush.
fn duplicate(error: &Error) -> Error {
    match error {
        Error::Backend(backend) => match backend.downcast_ref::<SledError>() {
            Some(sled) => sled.duplicate().into(),
            // Only the sled backend's own errors come out of a flush; should another, its text
            // is kept.
            None => Error::backend(backend.to_string()),
        },
        Error::StorageFull { path, kind } => Error::StorageFull {
            path: path.clone(),
            kind: *kind,
        },
        Error::Locked { path } => Error::Locked { path: path.clone() },
        Error::Closed => Error::Closed,
        Error::LeaseLost { session } => Error::LeaseLost {
            session: session.clone(),
        },
        Error::LeaseHeld { session, owner } => Error::LeaseHeld {
            session: session.clone(),
            owner: owner.clone(),
        },
        Error::Damaged { path, damage } => Error::Damaged {
            path: path.clone(),
            damage: damage.clone(),
        },
        Error::ReadOnly { path } => Error::ReadOnly { path: path.clone() },
    }
}

type Waiter = oneshot::Sender<Result<(), Error>>;

/// A committer waiting for the flusher: its batch (`None` for a bare flush) and its wake-up.
struct Pending {
    batch: Option<SledWrites>,
    done: Waiter,
}

/// The queue between committers and the flusher thread.
struct Queue {
    state: Mutex<QueueState>,
    wake: Condvar,
}

struct QueueState {
    pending: Vec<Pending>,
    /// Set by the store's drop: serve what is queued, then exit.
    shutdown: bool,
    /// Set when the flusher thread has exited (normally or by a panic): refuse new waiters.
    closed: bool,
}

/// The group-commit flusher thread and its queue; stops the thread when dropped.
pub(super) struct GroupFlusher {
    queue: Arc<Queue>,
    thread: Option<JoinHandle<()>>,
}

impl GroupFlusher {
    pub(super) fn start(shared: Arc<Shared>) -> Result<Self, Error> {
        let queue = Arc::new(Queue {
            state: Mutex::new(QueueState {
                pending: Vec::new(),
                shutdown: false,
                closed: false,
            }),
            wake: Condvar::new(),
        });
        let thread_queue = Arc::clone(&queue);
        let thread = std::thread::Builder::new()
            .name("dormant-store-flusher".into())
            .spawn(move || run_flusher(&shared, &thread_queue))
            .map_err(io_error)?;
        Ok(Self {
            queue,
            thread: Some(thread),
        })
    }

    /// Queues a batch (or a bare flush) for the next group.
    pub(super) fn enqueue(
        &self,
        batch: Option<SledWrites>,
    ) -> Result<oneshot::Receiver<Result<(), Error>>, Error> {
        let (done, rx) = oneshot::channel();
        let mut state = self.queue.state.lock();
        if state.closed || state.shutdown {
            return Err(Error::Closed);
        }
        state.pending.push(Pending { batch, done });
        drop(state);
        self.queue.wake.notify_one();
        Ok(rx)
    }
}

impl Drop for GroupFlusher {
    fn drop(&mut self) {
        self.queue.state.lock().shutdown = true;
        self.queue.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            // Joining makes sure the thread's handle on the database is gone (so the directory
            // can be reopened at once). A panic in the thread was already reported to waiters.
            let _ = thread.join();
        }
    }
}

/// Marks the queue closed and fails the queued waiters when the flusher thread exits, even by
/// a panic.
struct ExitGuard<'a>(&'a Queue);

impl Drop for ExitGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        state.closed = true;
        // Dropping the senders wakes their receivers with `Error::Closed`.
        state.pending.clear();
    }
}

fn run_flusher(shared: &Arc<Shared>, queue: &Queue) {
    let _guard = ExitGuard(queue);
    loop {
        let pending = {
            let mut state = queue.state.lock();
            while state.pending.is_empty() && !state.shutdown {
                queue.wake.wait(&mut state);
            }
            if state.pending.is_empty() {
                // Shut down and nothing left to serve.
                return;
            }
            std::mem::take(&mut state.pending)
        };
        let mut batches = Vec::with_capacity(pending.len());
        let mut waiters = Vec::with_capacity(pending.len());
        for Pending { batch, done } in pending {
            batches.extend(batch);
            waiters.push(done);
        }
        // The flush starts after every batch of the group is applied, so it covers them all.
        // A failed group has had its database replaced before its committers hear of it.
        let result = shared.commit(&batches);
        drop(batches);
        for waiter in waiters {
            let outcome = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(duplicate(e)),
            };
            // The committer may have given up (its future was dropped); nothing to do then.
            let _ = waiter.send(outcome);
        }
        if let Err(e) = &result {
            tracing::error!(error = %e, "store group commit failed; every commit of the group failed");
        }
    }
}
