//! A cell's mailbox: a queue its task takes messages from in order, one at a time, and a stop
//! that ends the task before whatever is still queued.
//!
//! It is the whole of what the host needs of an actor runtime besides a task: activation,
//! supervision and passivation are the host's own (`cell.rs`, `host.rs`). An idle mailbox
//! holds no allocation but its one shared block: its queue gives its buffer back whenever it
//! empties, since most resident actors wait, empty, for their next message (a ractor actor
//! keeps four channels, two with a block of 32 slots allocated up front: 6.6 KB of RSS idle,
//! `cargo bench --bench host`).

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use parking_lot::Mutex;

struct Shared<M> {
    queue: Mutex<Queue<M>>,
    /// The cell's task, while it waits for a message.
    waiting: AtomicWaker,
}

struct Queue<M> {
    messages: VecDeque<M>,
    /// A stop was asked: the task ends at its next take, and nothing more is accepted.
    stopping: bool,
}

/// The sending end of a cell's mailbox; cheap to clone.
pub(crate) struct CellRef<M> {
    shared: Arc<Shared<M>>,
}

impl<M> Clone for CellRef<M> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<M> fmt::Debug for CellRef<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CellRef").field(&self.id()).finish()
    }
}

/// The receiving end, which the cell's task alone holds.
pub(crate) struct Inbox<M> {
    shared: Arc<Shared<M>>,
}

/// A new mailbox: its sending end and its receiving end.
pub(crate) fn mailbox<M>() -> (CellRef<M>, Inbox<M>) {
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue {
            messages: VecDeque::new(),
            stopping: false,
        }),
        waiting: AtomicWaker::new(),
    });
    (
        CellRef {
            shared: Arc::clone(&shared),
        },
        Inbox { shared },
    )
}

impl<M> CellRef<M> {
    /// Queues `msg` behind what is already there.
    ///
    /// # Errors
    /// Gives `msg` back once the cell was asked to stop (or its task ended).
    pub(crate) fn send(&self, msg: M) -> Result<(), M> {
        let mut queue = self.shared.queue.lock();
        if queue.stopping {
            return Err(msg);
        }
        queue.messages.push_back(msg);
        drop(queue);
        self.shared.waiting.wake();
        Ok(())
    }

    /// Ends the cell's task once the message it handles now (if any) is done, ahead of what is
    /// still queued (which [`Inbox::close`] then hands on); later sends are refused.
    pub(crate) fn stop(&self) {
        self.shared.queue.lock().stopping = true;
        self.shared.waiting.wake();
    }

    /// The mailbox's number, for logs: where it lies in memory, unique while it lives.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.shared).cast::<()>() as usize
    }
}

impl<M> Inbox<M> {
    /// The next message, in the order they were sent; `None` once a stop was asked.
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<M>> {
        let mut queue = self.shared.queue.lock();
        if queue.stopping {
            return Poll::Ready(None);
        }
        if let Some(msg) = queue.messages.pop_front() {
            if queue.messages.is_empty() {
                // An idle actor keeps no buffer.
                queue.messages = VecDeque::new();
            }
            return Poll::Ready(Some(msg));
        }
        // Registered under the lock: a sender queues under it too, and wakes after, so a
        // message sent from now on finds this waker.
        self.shared.waiting.register(cx.waker());
        Poll::Pending
    }

    /// Closes the mailbox (later sends are refused) and takes what is still in it: the
    /// messages a stop left unhandled.
    pub(crate) fn close(&mut self) -> VecDeque<M> {
        let mut queue = self.shared.queue.lock();
        queue.stopping = true;
        std::mem::take(&mut queue.messages)
    }
}

impl<M> Drop for Inbox<M> {
    /// The task ended without taking what was left (dropped with its runtime): refuse later
    /// sends, and drop what is queued outside the lock (a message's drop may send to another
    /// mailbox).
    fn drop(&mut self) {
        drop(self.close());
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use super::*;

    async fn next<M>(inbox: &mut Inbox<M>) -> Option<M> {
        poll_fn(|cx| inbox.poll_next(cx)).await
    }

    #[tokio::test]
    async fn messages_come_in_order_and_a_stop_ends_before_what_is_queued() {
        let (cell, mut inbox) = mailbox();
        for n in 0..3 {
            assert_eq!(cell.send(n), Ok(()));
        }
        assert_eq!(next(&mut inbox).await, Some(0));
        assert_eq!(next(&mut inbox).await, Some(1));
        cell.stop();
        assert_eq!(cell.send(9), Err(9));
        assert_eq!(next(&mut inbox).await, None);
        assert_eq!(inbox.close(), [2]);
    }

    #[tokio::test]
    async fn a_waiting_task_is_woken_by_a_send_from_another_task() {
        let (cell, mut inbox) = mailbox();
        let taker = tokio::spawn(async move { next(&mut inbox).await });
        tokio::task::yield_now().await;
        assert_eq!(cell.send("hello"), Ok(()));
        assert_eq!(taker.await.ok().flatten(), Some("hello"));
    }

    #[test]
    fn sends_to_a_mailbox_whose_task_ended_come_back() {
        let (cell, inbox) = mailbox();
        assert_eq!(cell.send(1), Ok(()));
        drop(inbox);
        assert_eq!(cell.send(2), Err(2));
    }
}
