//! Group commit on a thread of the store's own, for the embedded stores (sled's flusher,
//! fjall's persister): the queue between committers and the thread, which takes every batch
//! queued since its last round as one group, serves it (apply, one flush or sync) and answers
//! each committer.

use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};
use tokio::sync::oneshot;

use super::Error;

/// How a committer hears that its batch is durable, or why not.
pub(crate) type Done = oneshot::Sender<Result<(), Error>>;

/// A committer waiting for the thread: its batch (`None` for a bare flush) and its wake-up.
pub(crate) struct Pending<B> {
    pub(crate) batch: Option<B>,
    pub(crate) done: Done,
}

struct Queue<B> {
    state: Mutex<QueueState<B>>,
    wake: Condvar,
}

struct QueueState<B> {
    pending: Vec<Pending<B>>,
    /// Set by the store's drop: serve what is queued, then exit.
    shutdown: bool,
    /// Set when the thread has exited (normally or by a panic): refuse new waiters.
    closed: bool,
}

/// The group-commit thread and its queue; stops the thread when dropped, once it has served
/// every queued commit.
pub(crate) struct GroupThread<B> {
    queue: Arc<Queue<B>>,
    thread: Option<JoinHandle<()>>,
}

impl<B: Send + 'static> GroupThread<B> {
    /// Starts thread `name`, which hands each group to `serve`.
    pub(crate) fn start(
        name: &str,
        mut serve: impl FnMut(Vec<Pending<B>>) + Send + 'static,
    ) -> std::io::Result<Self> {
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
            .name(name.into())
            .spawn(move || {
                let _guard = ExitGuard(&thread_queue);
                while let Some(group) = next_group(&thread_queue) {
                    serve(group);
                }
            })?;
        Ok(Self {
            queue,
            thread: Some(thread),
        })
    }

    /// Queues a batch (or a bare flush) for the next group.
    pub(crate) fn enqueue(
        &self,
        batch: Option<B>,
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

impl<B> Drop for GroupThread<B> {
    fn drop(&mut self) {
        self.queue.state.lock().shutdown = true;
        self.queue.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            // Joining makes sure the thread's handle on the store is gone (so the directory
            // can be reopened at once). A panic in the thread was already reported to waiters.
            let _ = thread.join();
        }
    }
}

/// The next group, once there is one; `None` once the store shut down and nothing is left.
fn next_group<B>(queue: &Queue<B>) -> Option<Vec<Pending<B>>> {
    let mut state = queue.state.lock();
    while state.pending.is_empty() && !state.shutdown {
        queue.wake.wait(&mut state);
    }
    if state.pending.is_empty() {
        return None;
    }
    Some(std::mem::take(&mut state.pending))
}

/// Marks the queue closed and fails the queued waiters when the thread exits, even by a panic.
struct ExitGuard<'a, B>(&'a Queue<B>);

impl<B> Drop for ExitGuard<'_, B> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        state.closed = true;
        // Dropping the senders wakes their receivers with `Error::Closed`.
        state.pending.clear();
    }
}
