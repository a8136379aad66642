//! Group commit: one task makes the commits, one transaction at a time; every commit that
//! arrived while a transaction was in flight goes into the next one, which costs one WAL
//! flush for all of them. Within a group, the writes to one key are folded in arrival order
//! (the last wins), so the transaction leaves each key as applying the batches one after the
//! other would; all of a group's batches are acknowledged together, once it committed, or
//! all get its error. A batch of a session is written only if this node still holds the
//! session's lease with the epoch it took, checked in the same transaction with the lease row
//! locked (a takeover waits for the transaction): the others of the group get
//! [`Error::LeaseLost`] and nothing of theirs is written.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot};

use super::lease::Leases;
use super::tree_id;
use super::{db, is_retryable, Counts};
use crate::store::{Batch, Error, Op};

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
        let mut result = commit_group(&pool, &leases, &group).await;
        // A deadlock with a lease take or takeover is resolved by PostgreSQL aborting one
        // side (rare: a take locks one lease row, a commit locks its rows in order): try the
        // group again.
        for _ in 0..2 {
            match &result {
                Err(error) if is_retryable(error) => {
                    tracing::info!(%error, "store.postgres_commit_retried");
                    result = commit_group(&pool, &leases, &group).await;
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

/// The final value of each key the group writes (`None`: deleted), in key order.
type Folded = BTreeMap<(i16, Vec<u8>), Option<Vec<u8>>>;

fn fold(group: &[Pending], fenced: &[bool]) -> Folded {
    let mut folded = Folded::new();
    let allowed = group
        .iter()
        .zip(fenced)
        .filter(|(_, fenced)| !**fenced)
        .map(|(pending, _)| pending);
    for pending in allowed {
        for op in pending.batch.ops() {
            match op {
                Op::Put { tree, key, value } => {
                    folded.insert((tree_id(*tree), key.clone()), Some(value.clone()));
                }
                Op::Delete { tree, key } => {
                    folded.insert((tree_id(*tree), key.clone()), None);
                }
            }
        }
    }
    folded
}

/// One transaction: the leases of the group's sessions checked (and locked), then every put
/// of the batches that may write in one statement, every delete in another. Which batches
/// (by position) were refused for want of their lease.
///
/// Its statements are pipelined (tokio-postgres sends the requests of futures polled together
/// without waiting for each answer), so the transaction costs two round trips to the database
/// instead of five: `BEGIN` with the lease check, then the writes with `COMMIT`. The writes
/// need the check's answer (a fenced batch writes nothing), so that is where it waits. A
/// write that fails aborts the transaction, and the `COMMIT` sent behind it then ends it as a
/// rollback; the group's result is that write's error.
async fn commit_group(pool: &Pool, leases: &Leases, group: &[Pending]) -> Result<Vec<bool>, Error> {
    let client = pool.get().await.map_err(Error::backend)?;
    let result = transaction(&client, leases, group).await;
    if result.is_err() {
        // Whatever failed, the connection goes back to the pool outside any transaction (a
        // failure before the `COMMIT` was sent leaves it open).
        let _ = client.batch_execute("ROLLBACK").await;
    }
    result
}

/// The statements of [`commit_group`] on `client`.
async fn transaction(
    client: &deadpool_postgres::ClientWrapper,
    leases: &Leases,
    group: &[Pending],
) -> Result<Vec<bool>, Error> {
    let put = client
        .prepare_cached(
            "INSERT INTO dormant_kv (tree, key, value) \
             SELECT * FROM unnest($1::int2[], $2::bytea[], $3::bytea[]) \
             ON CONFLICT (tree, key) DO UPDATE SET value = excluded.value",
        )
        .await
        .map_err(db)?;
    let delete = client
        .prepare_cached(
            "DELETE FROM dormant_kv USING unnest($1::int2[], $2::bytea[]) AS gone(tree, key) \
             WHERE dormant_kv.tree = gone.tree AND dormant_kv.key = gone.key",
        )
        .await
        .map_err(db)?;
    let (begun, fenced) =
        futures::join!(client.batch_execute("BEGIN"), fence(client, leases, group));
    begun.map_err(db)?;
    let fenced = fenced?;
    let folded = fold(group, &fenced);
    let (mut put_trees, mut put_keys, mut put_values) = (Vec::new(), Vec::new(), Vec::new());
    let (mut delete_trees, mut delete_keys) = (Vec::new(), Vec::new());
    for ((tree, key), value) in folded {
        match value {
            Some(value) => {
                put_trees.push(tree);
                put_keys.push(key);
                put_values.push(value);
            }
            None => {
                delete_trees.push(tree);
                delete_keys.push(key);
            }
        }
    }
    let puts = async {
        if put_keys.is_empty() {
            return Ok(0);
        }
        client
            .execute(&put, &[&put_trees, &put_keys, &put_values])
            .await
    };
    let deletes = async {
        if delete_keys.is_empty() {
            return Ok(0);
        }
        client
            .execute(&delete, &[&delete_trees, &delete_keys])
            .await
    };
    let (put, deleted, committed) = futures::join!(puts, deletes, client.simple_query("COMMIT"));
    put.map_err(db)?;
    deleted.map_err(db)?;
    // Reached only if every statement before it succeeded: then `COMMIT` commits or fails
    // with an error of its own (a `COMMIT` of a transaction a statement aborted would answer
    // `ROLLBACK` without one, which is why the writes' own results are checked first).
    committed.map_err(db)?;
    Ok(fenced)
}

/// Which batches of the group this node may not write (by position): their writer does not
/// hold the lease, or holds it at an older epoch than the node took it at since (its memory
/// is stale), or the database says the node lost it (taken over, or this node's liveness
/// expired by the database's clock). The lease rows of the others stay locked until the transaction ends.
async fn fence(
    client: &deadpool_postgres::ClientWrapper,
    leases: &Leases,
    group: &[Pending],
) -> Result<Vec<bool>, Error> {
    // Each batch's (lease, epoch), read once.
    let claims: Vec<Option<(String, Option<i64>)>> = group
        .iter()
        .map(|pending| {
            let lease = pending.batch.session()?;
            let writer = pending.batch.writer().unwrap_or(lease);
            Some((lease.to_string(), leases.fence_epoch(writer, lease)))
        })
        .collect();
    let mut pairs: Vec<(String, i64)> = claims
        .iter()
        .flatten()
        .filter_map(|(lease, epoch)| epoch.map(|epoch| (lease.clone(), epoch)))
        .collect();
    pairs.sort();
    pairs.dedup();
    let mut valid = HashSet::new();
    if !pairs.is_empty() {
        let (sessions, epochs): (Vec<String>, Vec<i64>) = pairs.iter().cloned().unzip();
        let statement = client
            .prepare_cached(
                // In session order, so two commits never wait on each other in a cycle.
                // A lease is held while it is not given up and its owner (this node) is live.
                "SELECT l.session, l.epoch FROM dormant_leases l \
                 JOIN unnest($1::text[], $2::int8[]) AS h(session, epoch) \
                 ON l.session = h.session AND l.epoch = h.epoch \
                 JOIN dormant_nodes n ON n.node = l.owner AND n.expires_at > now() \
                 WHERE l.owner = $3 AND l.expires_at > now() \
                 ORDER BY l.session FOR SHARE OF l",
            )
            .await
            .map_err(db)?;
        let rows = client
            .query(&statement, &[&sessions, &epochs, &leases.node])
            .await
            .map_err(db)?;
        for row in rows {
            valid.insert((
                row.try_get::<_, String>(0).map_err(db)?,
                row.try_get::<_, i64>(1).map_err(db)?,
            ));
        }
        for pair in &pairs {
            if !valid.contains(pair) {
                tracing::warn!(session = %pair.0, epoch = pair.1, node = %leases.node, "store.commit_fenced");
                leases.forget(&pair.0, pair.1);
            }
        }
    }
    Ok(claims
        .into_iter()
        .map(|claim| match claim {
            None => false,
            Some((lease, Some(epoch))) => !valid.contains(&(lease, epoch)),
            Some((_, None)) => true,
        })
        .collect())
}
