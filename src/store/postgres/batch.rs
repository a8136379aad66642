//! Requests of one kind sent to the database in groups: callers queue, and a task sends what
//! queued while earlier statements ran as one statement, so that many sessions' reads, lease
//! takes or lease releases cost one transaction and one round trip where each cost its own.
//! Alone, a request goes at once; under load, requests group by themselves, as commits do in
//! the committer (`group.rs`).

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::store::Error;

/// What a group's statement answers: each request's own outcome, in the requests' order; or
/// the statement's failure, which every request of the group gets.
pub(super) type Answers<O> = Result<Vec<Result<O, Error>>, Error>;

type Reply<O> = oneshot::Sender<Result<O, Error>>;

/// The queue of one kind of request; the task that sends them ends when this is dropped.
pub(super) struct Batcher<I, O> {
    queue: mpsc::UnboundedSender<(I, Option<Reply<O>>)>,
}

impl<I, O> std::fmt::Debug for Batcher<I, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").finish_non_exhaustive()
    }
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Starts the task: at most `in_flight` statements at once, each of at most `max`
    /// requests, made by `send`.
    pub(super) fn start<F, Fut>(in_flight: usize, max: usize, send: F) -> Self
    where
        F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Answers<O>> + Send + 'static,
    {
        let (queue, queued) = mpsc::unbounded_channel();
        tokio::spawn(run(queued, in_flight, max, send));
        Self { queue }
    }

    /// Sends `request` with the next group and waits for its outcome.
    pub(super) async fn call(&self, request: I) -> Result<O, Error> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send((request, Some(reply)))
            .map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }

    /// Sends `request` with the next group, without waiting for it (its failure is the
    /// statement's to log).
    pub(super) fn post(&self, request: I) {
        // Closed: the store is going, and nothing is left to send it to.
        let _ = self.queue.send((request, None));
    }
}

async fn run<I, O, F, Fut>(
    mut queued: mpsc::UnboundedReceiver<(I, Option<Reply<O>>)>,
    in_flight: usize,
    max: usize,
    send: F,
) where
    I: Send + 'static,
    O: Send + 'static,
    F: Fn(Vec<I>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Answers<O>> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(in_flight.max(1)));
    loop {
        // The permit first: requests that arrive while every statement is in flight wait
        // here and go together once one comes back.
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            return;
        };
        let Some(first) = queued.recv().await else {
            return;
        };
        let mut group = vec![first];
        while group.len() < max {
            match queued.try_recv() {
                Ok(next) => group.push(next),
                Err(_) => break,
            }
        }
        let (requests, replies): (Vec<I>, Vec<Option<Reply<O>>>) = group.into_iter().unzip();
        let statement = send(requests);
        tokio::spawn(async move {
            answer(statement.await, replies);
            drop(permit);
        });
    }
}

/// Hands each request its outcome.
fn answer<O>(answers: Answers<O>, replies: Vec<Option<Reply<O>>>) {
    match answers {
        Ok(outcomes) => {
            let mut outcomes = outcomes.into_iter();
            for reply in replies {
                let outcome = outcomes.next().unwrap_or_else(|| {
                    Err(Error::backend(
                        "a grouped statement answered fewer requests than it had",
                    ))
                });
                if let Some(reply) = reply {
                    // A caller that gave up (its future was dropped) needs no answer.
                    let _ = reply.send(outcome);
                }
            }
        }
        Err(error) => {
            let text = error.to_string();
            for reply in replies.into_iter().flatten() {
                let copy = match error {
                    Error::Closed => Error::Closed,
                    _ => Error::backend(text.clone()),
                };
                let _ = reply.send(Err(copy));
            }
        }
    }
}
