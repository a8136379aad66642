//! Group commit: one task makes the commits, one transaction at a time; every commit that
//! arrived while a transaction was in flight goes into the next one, which costs one WAL
//! flush for all of them. Within a group, the writes to one key are folded in arrival order
//! (the last wins), so the transaction leaves each key as applying the batches one after the
//! other would; all of a group's batches are acknowledged together, once it committed, or
//! all get its error (but a transaction refused for what one batch holds is split until that
//! batch fails alone: `commit_in_halves`). A batch of a session is written only if this node
//! still holds the session's lease with the epoch it took, checked in the same transaction
//! with the lease row locked (a takeover waits for the transaction): the others of the group
//! get [`Error::LeaseLost`] and nothing of theirs is written.

use std::sync::Arc;

use deadpool_postgres::Pool;
use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use super::commit::commit_group;
use super::lease::Leases;
use super::{is_retryable, Counts};
use crate::store::{Batch, Error};

/// The most batches one transaction takes.
const MAX_GROUP: usize = 512;

/// A group that holds this many bytes of keys and values takes no more batches (the last it
/// took may carry it past; a first batch larger than this goes alone): far below what one
/// statement may carry (1 GiB a parameter).
const MAX_GROUP_BYTES: usize = 64 * 1024 * 1024;

/// A commit waiting for its group.
pub(super) struct Pending {
    pub(super) batch: Batch,
    pub(super) reply: oneshot::Sender<Result<(), Error>>,
}

/// What the committer is told.
pub(super) enum Msg {
    Commit(Pending),
    /// Make every commit queued before this one, then stop.
    Close(oneshot::Sender<()>),
}

pub(super) async fn run(
    pool: Pool,
    leases: Arc<Leases>,
    counts: Arc<Counts>,
    mut queue: mpsc::UnboundedReceiver<Msg>,
) {
    let mut closing = None;
    while closing.is_none() {
        let Some(first) = queue.recv().await else {
            return;
        };
        let mut group = Vec::new();
        let mut bytes = 0;
        match first {
            Msg::Commit(pending) => {
                bytes += pending.batch.byte_len();
                group.push(pending);
            }
            Msg::Close(done) => closing = Some(done),
        }
        while closing.is_none() && group.len() < MAX_GROUP && bytes < MAX_GROUP_BYTES {
            match queue.try_recv() {
                Ok(Msg::Commit(pending)) => {
                    bytes += pending.batch.byte_len();
                    group.push(pending);
                }
                Ok(Msg::Close(done)) => closing = Some(done),
                Err(_) => break,
            }
        }
        if group.is_empty() {
            continue;
        }
        let batches: Vec<&Batch> = group.iter().map(|pending| &pending.batch).collect();
        let answers = commit_in_halves(&pool, &leases, &counts, &batches).await;
        for (pending, answer) in group.into_iter().zip(answers) {
            let answer = match (answer, pending.batch.session()) {
                (Ok(true), Some(session)) => Err(Error::LeaseLost {
                    session: session.to_string(),
                }),
                (Ok(_), _) => Ok(()),
                (Err(error), _) => Err(error),
            };
            let _ = pending.reply.send(answer);
        }
    }
    if let Some(done) = closing {
        let _ = done.send(());
    }
}

/// Commits `batches` as one transaction, and answers for each whether it was fenced (its
/// session's lease lost: nothing of it written), or the error. A transaction PostgreSQL
/// refuses for what one batch holds (a key past an index row's limit, a value it cannot
/// take) is split in halves, each committed on its own, in order, down to that batch alone:
/// one bad batch no longer fails every commit it was grouped with. Committed in order, the
/// halves leave each key as the whole group would.
fn commit_in_halves<'a>(
    pool: &'a Pool,
    leases: &'a Leases,
    counts: &'a Counts,
    batches: &'a [&'a Batch],
) -> BoxFuture<'a, Vec<Result<bool, Error>>> {
    Box::pin(async move {
        match commit_retrying(pool, leases, batches).await {
            Ok(fenced) => {
                counts.commit();
                (0..batches.len())
                    .map(|index| Ok(fenced.get(index).copied().unwrap_or(false)))
                    .collect()
            }
            Err(error) if batches.len() > 1 && refuses_the_data(&error) => {
                tracing::warn!(%error, batches = batches.len(), "store.postgres_group_split");
                let (first, second) = batches.split_at(batches.len() / 2);
                let mut answers = commit_in_halves(pool, leases, counts, first).await;
                answers.extend(commit_in_halves(pool, leases, counts, second).await);
                answers
            }
            Err(error) => {
                tracing::error!(%error, batches = batches.len(), "store.postgres_commit_failed");
                batches
                    .iter()
                    .map(|_| Err(Error::backend(error.to_string())))
                    .collect()
            }
        }
    })
}

/// One group's transaction; tried again (twice at most) when a deadlock with a lease take or
/// takeover aborted it (rare: a take locks one lease row, a commit locks its rows in order),
/// or its connection was lost. A connection lost as the `COMMIT` went may have committed it;
/// writing the group again is safe, as its writes set keys to values and delete keys (the
/// same again changes nothing) and nothing else of this node writes in between. Told a
/// failure instead, a committer would take back what the database may hold: an accepted
/// answer forgotten in memory, while the store keeps it, its deadline gone.
async fn commit_retrying(
    pool: &Pool,
    leases: &Leases,
    batches: &[&Batch],
) -> Result<Vec<bool>, Error> {
    let mut result = commit_group(pool, leases, batches).await;
    for _ in 0..2 {
        match &result {
            Err(error) if is_retryable(error) || lost_connection(error) => {
                tracing::info!(%error, "store.postgres_commit_retried");
                result = commit_group(pool, leases, batches).await;
            }
            _ => break,
        }
    }
    result
}

/// Whether the transaction failed for its connection (closed, or an I/O error on it), not
/// for anything the server said.
fn lost_connection(error: &Error) -> bool {
    error
        .downcast_ref::<tokio_postgres::Error>()
        .is_some_and(|error| {
            error.is_closed()
                || std::error::Error::source(error)
                    .is_some_and(|cause| cause.is::<std::io::Error>())
        })
}

/// Whether PostgreSQL refused the transaction for what it held: a data exception (SQLSTATE
/// class 22) or a program limit exceeded (class 54, such as an index row too large). The same
/// batch fails again, alone or grouped; the others need not fail with it.
fn refuses_the_data(error: &Error) -> bool {
    // `postgres::db` writes the code as "PostgreSQL ERROR 54000: …".
    error.to_string().split(' ').any(|word| {
        word.len() == 6 && word.ends_with(':') && (word.starts_with("22") || word.starts_with("54"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_for_the_data_is_told_from_any_other_failure() {
        let refused = |text: &str| refuses_the_data(&Error::backend(text.to_string()));
        assert!(refused(
            "PostgreSQL ERROR 54000: index row size 3000 exceeds btree version 4 maximum 2704"
        ));
        assert!(refused(
            "PostgreSQL ERROR 22021: invalid byte sequence for encoding"
        ));
        assert!(!refused("PostgreSQL ERROR 40P01: deadlock detected"));
        assert!(!refused("PostgreSQL FATAL 57P01: terminating connection"));
        assert!(!refused("connection closed"));
    }
}
