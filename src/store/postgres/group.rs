//! Group commit: one task makes the commits, one transaction at a time; every commit that
//! arrived while a transaction was in flight goes into the next one, which costs one WAL
//! flush for all of them. Within a group, the writes to one key are folded in arrival order
//! (the last wins), so the transaction leaves each key as applying the batches one after the
//! other would; all of a group's batches are acknowledged together, once it committed, or
//! all get its error. A batch of a session is written only if this node still holds the
//! session's lease with the epoch it took, checked in the same transaction with the lease row
//! locked (a takeover waits for the transaction): the others of the group get
//! [`Error::LeaseLost`] and nothing of theirs is written.

use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot};

use super::commit::commit_group;
use super::lease::Leases;
use super::{is_retryable, Counts};
use crate::store::{Batch, Error};

/// The most batches one transaction takes.
const MAX_GROUP: usize = 512;

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
        match first {
            Msg::Commit(pending) => group.push(pending),
            Msg::Close(done) => closing = Some(done),
        }
        while closing.is_none() && group.len() < MAX_GROUP {
            match queue.try_recv() {
                Ok(Msg::Commit(pending)) => group.push(pending),
                Ok(Msg::Close(done)) => closing = Some(done),
                Err(_) => break,
            }
        }
        if group.is_empty() {
            continue;
        }
        let batches: Vec<&Batch> = group.iter().map(|pending| &pending.batch).collect();
        let mut result = commit_group(&pool, &leases, &batches).await;
        // A deadlock with a lease take or takeover is resolved by PostgreSQL aborting one
        // side (rare: a take locks one lease row, a commit locks its rows in order): try the
        // group again.
        for _ in 0..2 {
            match &result {
                Err(error) if is_retryable(error) => {
                    tracing::info!(%error, "store.postgres_commit_retried");
                    result = commit_group(&pool, &leases, &batches).await;
                }
                _ => break,
            }
        }
        if result.is_ok() {
            counts.commit();
        }
        if let Err(error) = &result {
            tracing::error!(%error, batches = group.len(), "store.postgres_commit_failed");
        }
        for (index, pending) in group.into_iter().enumerate() {
            let answer = match &result {
                Ok(fenced) => match pending.batch.session() {
                    Some(session) if fenced.get(index).copied().unwrap_or(false) => {
                        Err(Error::LeaseLost {
                            session: session.to_string(),
                        })
                    }
                    _ => Ok(()),
                },
                Err(error) => Err(Error::backend(error.to_string())),
            };
            let _ = pending.reply.send(answer);
        }
    }
    if let Some(done) = closing {
        let _ = done.send(());
    }
}
