//! One group's transaction: the leases of its sessions checked (and locked), then every put
//! of the batches that may write in one statement, every delete in another.
//!
//! The statements are pipelined: tokio-postgres sends the requests of futures polled together
//! without waiting for each answer, so a group costs **one round trip** to the database when
//! every lease it claims is held, as it nearly always is: `BEGIN`, a lease check that fails
//! the transaction if any claimed lease is not held, the writes and `COMMIT`, sent together.
//! When the check fails, the group is written again in two round trips: `BEGIN` with a check
//! that says which leases are held, then the writes of the batches that may write, with
//! `COMMIT`. A statement that fails aborts the transaction, and the `COMMIT` sent behind it
//! then ends it as a rollback: each statement's own result says whether it committed.

use std::collections::{BTreeMap, HashSet};

use deadpool_postgres::{ClientWrapper, Pool};
use tokio_postgres::error::SqlState;
use tokio_postgres::Statement;

use super::lease::Leases;
use super::{db, tree_id};
use crate::store::{Batch, Error, Op};

/// Which of the claimed (lease, epoch) pairs (`$1`, `$2`) this node (`$3`) holds, their rows
/// locked `FOR SHARE` until the transaction ends (a takeover waits for it). A lease is held
/// while it is not given up and its owner, this node, is live. Each pair is one index lookup
/// (the `OFFSET 0` keeps the planner from turning them into a scan of the whole lease table,
/// which it did for a join with the pairs at a few thousand leases: a scan and a sort of every
/// lease for each group, ten times the cost of the lookups), and the rows
/// are locked in the pairs' order, which the caller sorts by lease name as lease takes do:
/// two transactions never wait on each other in a cycle.
const HELD: &str = "SELECT held.session, held.epoch \
     FROM unnest($1::text[], $2::int8[]) AS h(session, epoch) \
     CROSS JOIN LATERAL ( \
         SELECT l.session, l.epoch FROM dormant_leases l \
         WHERE l.session = h.session AND l.epoch = h.epoch \
           AND l.owner = $3 AND l.expires_at > now() \
         FOR SHARE OFFSET 0) AS held \
     WHERE EXISTS (SELECT 1 FROM dormant_nodes n WHERE n.node = $3 AND n.expires_at > now())";

/// The one-round-trip check: [`HELD`]'s rows locked, and a division by zero (which aborts the
/// transaction) unless there are as many as claimed (`$4`).
const ALL_HELD: &str = "SELECT 1 / (SELECT CASE WHEN count(*) = $4 THEN 1 ELSE 0 END \
     FROM unnest($1::text[], $2::int8[]) AS h(session, epoch) \
     CROSS JOIN LATERAL ( \
         SELECT l.session FROM dormant_leases l \
         WHERE l.session = h.session AND l.epoch = h.epoch \
           AND l.owner = $3 AND l.expires_at > now() \
         FOR SHARE OFFSET 0) AS held \
     WHERE EXISTS (SELECT 1 FROM dormant_nodes n WHERE n.node = $3 AND n.expires_at > now()))";

const PUT: &str = "INSERT INTO dormant_kv (tree, key, value) \
     SELECT * FROM unnest($1::int2[], $2::bytea[], $3::bytea[]) \
     ON CONFLICT (tree, key) DO UPDATE SET value = excluded.value";

const DELETE: &str =
    "DELETE FROM dormant_kv USING unnest($1::int2[], $2::bytea[]) AS gone(tree, key) \
     WHERE dormant_kv.tree = gone.tree AND dormant_kv.key = gone.key";

/// Commits `group` in one transaction; which batches (by position) were refused for want of
/// their lease (they wrote nothing; the others did).
pub(super) async fn commit_group(
    pool: &Pool,
    leases: &Leases,
    group: &[&Batch],
) -> Result<Vec<bool>, Error> {
    let connection = Connection(Some(pool.get().await.map_err(Error::backend)?));
    let Some(client) = connection.0.as_deref() else {
        return Err(Error::backend("no connection"));
    };
    let statements = Statements::prepare(client).await?;
    let claims = Claims::of(leases, group);
    let mut result = one_trip(client, &statements, leases, group, &claims).await;
    if matches!(result, Ok(None)) {
        result = two_trips(client, &statements, leases, group, &claims)
            .await
            .map(Some);
    }
    if result.is_err() {
        // Whatever failed, the connection goes back to the pool outside any transaction (a
        // failure before the `COMMIT` was sent leaves it open).
        let _ = client.batch_execute("ROLLBACK").await;
    }
    connection.release();
    result.map(|fenced| fenced.unwrap_or_default())
}

/// The group's pooled connection: back to the pool once its transaction is over (committed
/// or rolled back); closed instead if the commit's future is dropped midway, which ends the
/// transaction there (PostgreSQL rolls back a closed connection's), so no connection goes back
/// to the pool inside one.
struct Connection(Option<deadpool_postgres::Object>);

impl Connection {
    fn release(mut self) {
        // Dropped here, the object goes back to its pool.
        self.0.take();
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Some(object) = self.0.take() {
            drop(deadpool_postgres::Object::take(object));
        }
    }
}

/// The transaction's statements, prepared on its connection before it begins (the first
/// time; then remembered there): nothing is awaited between the requests a round trip
/// pipelines, so they go out in order, all of them. (A statement prepared inside the
/// transaction after a failed check would be refused, and the `COMMIT` behind it not sent.)
struct Statements {
    all_held: Statement,
    held: Statement,
    put: Statement,
    delete: Statement,
}

impl Statements {
    async fn prepare(client: &ClientWrapper) -> Result<Self, Error> {
        Ok(Self {
            all_held: client.prepare_cached(ALL_HELD).await.map_err(db)?,
            held: client.prepare_cached(HELD).await.map_err(db)?,
            put: client.prepare_cached(PUT).await.map_err(db)?,
            delete: client.prepare_cached(DELETE).await.map_err(db)?,
        })
    }
}

/// Each batch's lease and the epoch this node holds it at, read once.
struct Claims {
    /// By batch: `None` for a batch of no session, `Some((lease, None))` for one whose writer
    /// this node does not hold the lease of.
    each: Vec<Option<(String, Option<i64>)>>,
    /// The distinct (lease, epoch) pairs to check, in byte order of the lease names (the
    /// order the check locks their rows in, and lease takes theirs).
    pairs: Vec<(String, i64)>,
}

impl Claims {
    fn of(leases: &Leases, group: &[&Batch]) -> Self {
        let each: Vec<Option<(String, Option<i64>)>> = group
            .iter()
            .map(|batch| {
                let lease = batch.session()?;
                let writer = batch.writer().unwrap_or(lease);
                Some((lease.to_string(), leases.fence_epoch(writer, lease)))
            })
            .collect();
        let mut pairs: Vec<(String, i64)> = each
            .iter()
            .flatten()
            .filter_map(|(lease, epoch)| epoch.map(|epoch| (lease.clone(), epoch)))
            .collect();
        pairs.sort();
        pairs.dedup();
        Self { each, pairs }
    }

    /// Which batches may not write when the pairs in `valid` are held (`None`: every claimed
    /// pair is, as the one-round-trip path supposes).
    fn fenced(&self, valid: Option<&HashSet<(String, i64)>>) -> Vec<bool> {
        self.each
            .iter()
            .map(|claim| match claim {
                None => false,
                Some((lease, Some(epoch))) => {
                    valid.is_some_and(|valid| !valid.contains(&(lease.clone(), *epoch)))
                }
                Some((_, None)) => true,
            })
            .collect()
    }

    /// The pairs as the check's parameters.
    fn columns(&self) -> (Vec<String>, Vec<i64>) {
        self.pairs.iter().cloned().unzip()
    }
}

/// The group in one round trip, supposing every claimed lease is held: `None` if one is not
/// (nothing was written; ask which).
async fn one_trip(
    client: &ClientWrapper,
    statements: &Statements,
    leases: &Leases,
    group: &[&Batch],
    claims: &Claims,
) -> Result<Option<Vec<bool>>, Error> {
    let fenced = claims.fenced(None);
    let writes = Writes::of(group, &fenced);
    let (sessions, epochs) = claims.columns();
    let count = i64::try_from(claims.pairs.len()).unwrap_or(i64::MAX);
    let checked = async {
        if claims.pairs.is_empty() {
            return Ok(());
        }
        client
            .query(
                &statements.all_held,
                &[&sessions, &epochs, &leases.node, &count],
            )
            .await
            .map(drop)
    };
    let (begun, checked, written) = futures::join!(
        client.batch_execute("BEGIN"),
        checked,
        writes.send(client, statements)
    );
    begun.map_err(db)?;
    if let Err(error) = checked {
        if error.code() == Some(&SqlState::DIVISION_BY_ZERO) {
            // The `COMMIT` sent with the writes ended the transaction as a rollback.
            return Ok(None);
        }
        return Err(db(error));
    }
    written?;
    Ok(Some(fenced))
}

/// The group in two round trips: `BEGIN` with the check of which leases are held, then the
/// writes of the batches that may write, with `COMMIT`.
async fn two_trips(
    client: &ClientWrapper,
    statements: &Statements,
    leases: &Leases,
    group: &[&Batch],
    claims: &Claims,
) -> Result<Vec<bool>, Error> {
    let (begun, valid) = futures::join!(
        client.batch_execute("BEGIN"),
        held(client, &statements.held, leases, claims)
    );
    begun.map_err(db)?;
    let fenced = claims.fenced(Some(&valid?));
    Writes::of(group, &fenced).send(client, statements).await?;
    Ok(fenced)
}

/// Which of the claimed (lease, epoch) pairs this node holds, their rows locked until the
/// transaction ends; a pair it does not hold is forgotten (its writer's memory is stale: the
/// lease was taken over, or this node's liveness expired by the database's clock).
async fn held(
    client: &ClientWrapper,
    statement: &Statement,
    leases: &Leases,
    claims: &Claims,
) -> Result<HashSet<(String, i64)>, Error> {
    let mut valid = HashSet::new();
    if claims.pairs.is_empty() {
        return Ok(valid);
    }
    let (sessions, epochs) = claims.columns();
    let rows = client
        .query(statement, &[&sessions, &epochs, &leases.node])
        .await
        .map_err(db)?;
    for row in rows {
        valid.insert((
            row.try_get::<_, String>(0).map_err(db)?,
            row.try_get::<_, i64>(1).map_err(db)?,
        ));
    }
    for pair in &claims.pairs {
        if !valid.contains(pair) {
            tracing::warn!(session = %pair.0, epoch = pair.1, node = %leases.node, "store.commit_fenced");
            leases.forget(&pair.0, pair.1);
        }
    }
    Ok(valid)
}

/// The final value of each key the group's batches that may write leave (`None`: deleted),
/// as the columns of the put and delete statements. Within a group, the writes to one key are
/// folded in arrival order (the last wins), so the transaction leaves each key as applying the
/// batches one after the other would.
struct Writes {
    put_trees: Vec<i16>,
    put_keys: Vec<Vec<u8>>,
    put_values: Vec<Vec<u8>>,
    delete_trees: Vec<i16>,
    delete_keys: Vec<Vec<u8>>,
}

impl Writes {
    fn of(group: &[&Batch], fenced: &[bool]) -> Self {
        let mut folded: BTreeMap<(i16, Vec<u8>), Option<Vec<u8>>> = BTreeMap::new();
        let allowed = group
            .iter()
            .zip(fenced)
            .filter(|(_, fenced)| !**fenced)
            .map(|(batch, _)| batch);
        for batch in allowed {
            for op in batch.ops() {
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
        let mut writes = Self {
            put_trees: Vec::new(),
            put_keys: Vec::new(),
            put_values: Vec::new(),
            delete_trees: Vec::new(),
            delete_keys: Vec::new(),
        };
        for ((tree, key), value) in folded {
            match value {
                Some(value) => {
                    writes.put_trees.push(tree);
                    writes.put_keys.push(key);
                    writes.put_values.push(value);
                }
                None => {
                    writes.delete_trees.push(tree);
                    writes.delete_keys.push(key);
                }
            }
        }
        writes
    }

    /// Sends the put, the delete and `COMMIT` together, inside the transaction begun on
    /// `client`.
    async fn send(&self, client: &ClientWrapper, statements: &Statements) -> Result<(), Error> {
        let (put, delete) = (&statements.put, &statements.delete);
        let puts = async {
            if self.put_keys.is_empty() {
                return Ok(0);
            }
            client
                .execute(put, &[&self.put_trees, &self.put_keys, &self.put_values])
                .await
        };
        let deletes = async {
            if self.delete_keys.is_empty() {
                return Ok(0);
            }
            client
                .execute(delete, &[&self.delete_trees, &self.delete_keys])
                .await
        };
        let (put, deleted, committed) =
            futures::join!(puts, deletes, client.simple_query("COMMIT"));
        put.map_err(db)?;
        deleted.map_err(db)?;
        // Reached only if both writes succeeded: then `COMMIT` commits or fails with an error
        // of its own.
        committed.map_err(db)?;
        Ok(())
    }
}
