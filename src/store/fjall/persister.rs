//! Group commit for [`FjallStore`](super::FjallStore): the queue between committers and the
//! persister thread, which applies every batch queued so far, syncs fjall's journal once for
//! all of them, and answers their committers.

use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};
use tokio::sync::oneshot;

use super::engine::{self, Engine, Open};
use crate::store::keyspace::stored_key;
use crate::store::{Batch, Error, Op};

/// fjall's longest key (its keys carry a 16-bit length); the tag byte comes on top of the
/// caller's key.
const MAX_KEY: usize = u16::MAX as usize;

type Waiter = oneshot::Sender<Result<(), Error>>;

/// A committer waiting for the persister: its batch (`None` for a bare sync) and its wake-up.
struct Pending {
    batch: Option<Batch>,
    done: Waiter,
}

struct Queue {
    state: Mutex<QueueState>,
    wake: Condvar,
}

struct QueueState {
    pending: Vec<Pending>,
    /// Set by the store's drop: serve what is queued, then exit.
    shutdown: bool,
    /// Set when the thread has exited (normally or by a panic): refuse new waiters.
    closed: bool,
}

/// The persister thread and its queue; stops the thread when dropped.
pub(super) struct Persister {
    queue: Arc<Queue>,
    thread: Option<JoinHandle<()>>,
}

impl Persister {
    pub(super) fn start(engine: Arc<Engine>) -> Result<Self, Error> {
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
            .name("dormant-fjall-persister".into())
            .spawn(move || run(&engine, &thread_queue))
            .map_err(Error::backend)?;
        Ok(Self {
            queue,
            thread: Some(thread),
        })
    }

    /// Queues a batch (or a bare sync) for the next group.
    pub(super) fn enqueue(
        &self,
        batch: Option<Batch>,
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

impl Drop for Persister {
    fn drop(&mut self) {
        self.queue.state.lock().shutdown = true;
        self.queue.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            // A panic in the thread was already reported to its waiters (their senders went).
            let _ = thread.join();
        }
    }
}

/// Marks the queue closed and fails the queued waiters when the thread exits, even by a panic.
struct ExitGuard<'a>(&'a Queue);

impl Drop for ExitGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        state.closed = true;
        state.pending.clear();
    }
}

fn run(engine: &Engine, queue: &Queue) {
    let _guard = ExitGuard(queue);
    loop {
        let group = {
            let mut state = queue.state.lock();
            while state.pending.is_empty() && !state.shutdown {
                queue.wake.wait(&mut state);
            }
            if state.pending.is_empty() {
                return;
            }
            std::mem::take(&mut state.pending)
        };
        serve(engine, group);
    }
}

/// Applies the group's batches, syncs once, and answers every committer. A batch fjall cannot
/// hold (a key too long) is refused alone; a failed write or sync fails the whole group.
fn serve(engine: &Engine, group: Vec<Pending>) {
    let mut refused: Vec<Option<Error>> = Vec::with_capacity(group.len());
    let written = engine.write(|open| {
        for pending in &group {
            let outcome = match &pending.batch {
                Some(batch) => apply(open, batch)?,
                None => None,
            };
            refused.push(outcome);
        }
        open.keyspace
            .persist(fjall::PersistMode::SyncData)
            .map_err(|e| engine::error(e, open.path()))?;
        engine.advance_mark(open)
    });
    if let Err(error) = &written {
        tracing::error!(%error, "store group commit failed; every commit of the group failed");
    }
    let mut refused = refused.into_iter();
    for Pending { done, .. } in group {
        let outcome = match (&written, refused.next().flatten()) {
            (_, Some(refusal)) => Err(refusal),
            (Ok(()), None) => Ok(()),
            (Err(error), None) => Err(duplicate(error)),
        };
        // The committer may have given up (its future was dropped); nothing to do then.
        let _ = done.send(outcome);
    }
}

/// Applies one batch as one fjall batch: `Ok(Some(refusal))` for a batch fjall cannot hold,
/// which writes nothing; `Err` when fjall fails.
fn apply(open: &Open, batch: &Batch) -> Result<Option<Error>, Error> {
    let too_long = batch.ops().iter().find_map(|op| {
        let (Op::Put { tree, key, .. } | Op::Delete { tree, key }) = op;
        (key.len() + 1 > MAX_KEY).then(|| (tree.name(), key.len()))
    });
    if let Some((tree, len)) = too_long {
        return Ok(Some(Error::backend(format!(
            "a key of {len} bytes in tree {tree} is longer than the store can hold ({} bytes)",
            MAX_KEY - 1
        ))));
    }
    let mut writes = open.keyspace.batch();
    for op in batch.ops() {
        match op {
            Op::Put { tree, key, value } => {
                writes.insert(&open.records, stored_key(*tree, key), value.as_slice());
            }
            Op::Delete { tree, key } => writes.remove(&open.records, stored_key(*tree, key)),
        }
    }
    writes.commit().map_err(|e| engine::error(e, open.path()))?;
    Ok(None)
}

/// The group's error again, for each of its committers (store errors are not cloneable).
fn duplicate(error: &Error) -> Error {
    match error {
        Error::StorageFull { path, kind } => Error::StorageFull {
            path: path.clone(),
            kind: *kind,
        },
        Error::Closed => Error::Closed,
        other => Error::backend(other.to_string()),
    }
}
