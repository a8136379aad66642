//! Lease takes and releases, grouped ([`Batcher`]): the sessions that activate at once take
//! their trees' leases in one statement, and the leases their last sessions leave are given
//! up in one, where each was a transaction of its own.

use std::collections::HashMap;
use std::sync::Arc;

use deadpool_postgres::Pool;

use super::batch::{Answers, Batcher};
use super::{db, is_retryable, Counts};
use crate::store::Error;

/// The most leases one statement takes or gives up.
const MAX_LEASES: usize = 1024;

/// Takes leases for this node: each request's new epoch, or [`Error::LeaseHeld`].
#[derive(Debug)]
pub(super) struct Takes(Batcher<String, i64>);

impl Takes {
    pub(super) fn start(pool: Pool, node: String, counts: Arc<Counts>) -> Self {
        let node = Arc::new(node);
        // Two in flight: an activation waits on its take, so a take should not wait long for
        // another group's.
        Self(Batcher::start(2, MAX_LEASES, move |leases| {
            let (pool, node, counts) = (pool.clone(), Arc::clone(&node), Arc::clone(&counts));
            async move {
                let mut taken = take_group(&pool, &node, &counts, &leases).await;
                // A deadlock with a commit's fence, resolved by PostgreSQL aborting one side
                // (rare: both lock lease rows in name order): try again, as the committer does.
                for _ in 0..2 {
                    match &taken {
                        Err(error) if is_retryable(error) => {
                            tracing::info!(%error, "store.postgres_lease_take_retried");
                            taken = take_group(&pool, &node, &counts, &leases).await;
                        }
                        _ => break,
                    }
                }
                taken
            }
        }))
    }

    /// Takes `lease` (or takes it over from a node that is no longer live): its new epoch.
    pub(super) async fn take(&self, lease: String) -> Result<i64, Error> {
        self.0.call(lease).await
    }
}

/// Gives leases up for this node, in the background.
#[derive(Debug)]
pub(super) struct Releases(Batcher<(String, i64), ()>);

impl Releases {
    pub(super) fn start(pool: Pool, node: String, counts: Arc<Counts>) -> Self {
        let node = Arc::new(node);
        Self(Batcher::start(1, MAX_LEASES, move |leases| {
            let (pool, node, counts) = (pool.clone(), Arc::clone(&node), Arc::clone(&counts));
            async move { release_group(&pool, &node, &counts, leases).await }
        }))
    }

    /// Gives `lease` up if this node still holds it at `epoch` (it expires now; the epoch
    /// stays, so the next owner's is higher). A lease taken again since is not touched; one
    /// whose release fails expires by itself.
    pub(super) fn give_up(&self, lease: String, epoch: i64) {
        self.0.post((lease, epoch));
    }
}

/// Takes `leases` in one statement; those another live node holds are then looked up in
/// another, for the owner their refusal names.
async fn take_group(pool: &Pool, node: &str, counts: &Counts, leases: &[String]) -> Answers<i64> {
    // In name order, as every transaction that locks several lease rows locks them (the
    // committer's fence too), so that two never wait on each other. A lease asked for twice
    // is taken once (a row cannot be changed twice by one statement).
    let mut names: Vec<&str> = leases.iter().map(String::as_str).collect();
    names.sort_unstable();
    names.dedup();
    let client = pool.get().await.map_err(Error::backend)?;
    let statement = client
        .prepare_cached(
            // Taken until given up; held while its owner's row is live.
            "INSERT INTO dormant_leases AS l (session, owner, epoch, expires_at) \
             SELECT name, $2, 1, 'infinity' FROM unnest($1::text[]) AS name \
             ON CONFLICT (session) DO UPDATE \
             SET owner = excluded.owner, epoch = l.epoch + 1, expires_at = excluded.expires_at \
             WHERE l.owner = excluded.owner OR l.expires_at < now() OR NOT EXISTS ( \
                 SELECT 1 FROM dormant_nodes n WHERE n.node = l.owner AND n.expires_at > now()) \
             RETURNING session, epoch",
        )
        .await
        .map_err(db)?;
    counts.transaction();
    let rows = client
        .query(&statement, &[&names, &node])
        .await
        .map_err(db)?;
    let mut taken = HashMap::with_capacity(rows.len());
    for row in rows {
        let lease: String = row.try_get(0).map_err(db)?;
        let epoch: i64 = row.try_get(1).map_err(db)?;
        tracing::debug!(lease, epoch, node, "store.lease_taken");
        taken.insert(lease, epoch);
    }
    let refused: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| !taken.contains_key(*name))
        .collect();
    let mut owners = HashMap::new();
    if !refused.is_empty() {
        counts.transaction();
        for row in client
            .query(
                "SELECT session, owner FROM dormant_leases WHERE session = ANY($1)",
                &[&refused],
            )
            .await
            .map_err(db)?
        {
            let lease: String = row.try_get(0).map_err(db)?;
            let owner: String = row.try_get(1).map_err(db)?;
            owners.insert(lease, owner);
        }
    }
    Ok(leases
        .iter()
        .map(|lease| match taken.get(lease) {
            Some(epoch) => Ok(*epoch),
            None => Err(Error::LeaseHeld {
                owner: owners.get(lease).cloned().unwrap_or_default(),
                session: lease.clone(),
            }),
        })
        .collect())
}

/// Gives `leases` up in one statement.
async fn release_group(
    pool: &Pool,
    node: &str,
    counts: &Counts,
    leases: Vec<(String, i64)>,
) -> Answers<()> {
    let released = async {
        let (names, epochs): (Vec<&str>, Vec<i64>) = leases
            .iter()
            .map(|(name, epoch)| (name.as_str(), *epoch))
            .unzip();
        let client = pool.get().await.map_err(Error::backend)?;
        counts.transaction();
        client
            .execute(
                "UPDATE dormant_leases AS l SET expires_at = now() - interval '1 millisecond' \
                 FROM unnest($1::text[], $2::int8[]) AS gone(session, epoch) \
                 WHERE l.session = gone.session AND l.epoch = gone.epoch AND l.owner = $3",
                &[&names, &epochs, &node],
            )
            .await
            .map_err(db)
    };
    match released.await {
        Ok(_) => Ok(leases.iter().map(|_| Ok(())).collect()),
        Err(error) => {
            // They expire by themselves.
            tracing::warn!(leases = leases.len(), %error, "store.lease_release_failed");
            Err(error)
        }
    }
}
