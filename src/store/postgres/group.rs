//! Group commit: one task makes the commits, one transaction at a time; every commit that
//! arrived while a transaction was in flight goes into the next one, which costs one WAL
//! flush for all of them. Within a group, the writes to one key are folded in arrival order
//! (the last wins), so the transaction leaves each key as applying the batches one after the
//! other would; all of a group's batches are acknowledged together, once it committed, or
//! all get its error.

use std::collections::BTreeMap;

use deadpool_postgres::Pool;
use tokio::sync::{mpsc, oneshot};

use super::tree_id;
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

pub(super) async fn run(pool: Pool, mut queue: mpsc::UnboundedReceiver<Msg>) {
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
        let result = commit_group(&pool, &group).await;
        if let Err(error) = &result {
            tracing::error!(%error, batches = group.len(), "store.postgres_commit_failed");
        }
        for pending in group {
            let answer = match &result {
                Ok(()) => Ok(()),
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

fn fold(group: &[Pending]) -> Folded {
    let mut folded = Folded::new();
    for pending in group {
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

/// One transaction: every put in one statement, every delete in another.
async fn commit_group(pool: &Pool, group: &[Pending]) -> Result<(), Error> {
    let folded = fold(group);
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
    let mut client = pool.get().await.map_err(Error::backend)?;
    let transaction = client.transaction().await.map_err(Error::backend)?;
    if !put_keys.is_empty() {
        let statement = transaction
            .prepare_cached(
                "INSERT INTO dormant_kv (tree, key, value) \
                 SELECT * FROM unnest($1::int2[], $2::bytea[], $3::bytea[]) \
                 ON CONFLICT (tree, key) DO UPDATE SET value = excluded.value",
            )
            .await
            .map_err(Error::backend)?;
        transaction
            .execute(&statement, &[&put_trees, &put_keys, &put_values])
            .await
            .map_err(Error::backend)?;
    }
    if !delete_keys.is_empty() {
        let statement = transaction
            .prepare_cached(
                "DELETE FROM dormant_kv USING unnest($1::int2[], $2::bytea[]) AS gone(tree, key) \
                 WHERE dormant_kv.tree = gone.tree AND dormant_kv.key = gone.key",
            )
            .await
            .map_err(Error::backend)?;
        transaction
            .execute(&statement, &[&delete_trees, &delete_keys])
            .await
            .map_err(Error::backend)?;
    }
    transaction.commit().await.map_err(Error::backend)
}
