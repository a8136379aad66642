//! Leases: one owner per session among the nodes that share a database. A node takes a
//! session's lease when the session's actor activates (or takes over one that expired, by
//! the database's clock), renews every lease it holds well before it expires, and gives it
//! up when the actor stops. Every take or takeover raises the session's epoch, so the epochs
//! of one session only grow. Every commit of a session checks, in its own transaction and
//! with the lease row locked, that this node still holds the lease with the epoch it took:
//! a node that lost it (paused past its expiry, cut off, slow) cannot write (fencing).

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use deadpool_postgres::Pool;

use super::db;
use crate::store::Error;

/// What a node knows of its leases.
#[derive(Debug)]
pub(super) struct Leases {
    /// This node's name in the `owner` column.
    pub(super) node: String,
    /// How long a lease lasts after it is taken or renewed.
    pub(super) ttl: Duration,
    /// The sessions this node holds, with the epoch it took each at.
    pub(super) held: DashMap<String, i64>,
}

impl Leases {
    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)
    }

    /// Takes the lease of `session`, or takes over an expired one; refuses one another node
    /// holds.
    pub(super) async fn acquire(&self, pool: &Pool, session: &str) -> Result<(), Error> {
        if self.held.contains_key(session) {
            return Ok(());
        }
        let client = pool.get().await.map_err(Error::backend)?;
        let statement = client
            .prepare_cached(
                "INSERT INTO dormant_leases AS l (session, owner, epoch, expires_at) \
                 VALUES ($1, $2, 1, now() + $3::int8 * interval '1 millisecond') \
                 ON CONFLICT (session) DO UPDATE \
                 SET owner = excluded.owner, epoch = l.epoch + 1, expires_at = excluded.expires_at \
                 WHERE l.owner = excluded.owner OR l.expires_at < now() \
                 RETURNING epoch",
            )
            .await
            .map_err(db)?;
        let taken = client
            .query_opt(&statement, &[&session, &self.node, &self.ttl_ms()])
            .await
            .map_err(db)?;
        match taken {
            Some(row) => {
                let epoch: i64 = row.try_get(0).map_err(db)?;
                tracing::debug!(session, epoch, node = %self.node, "store.lease_taken");
                self.held.insert(session.to_string(), epoch);
                Ok(())
            }
            None => {
                let owner = client
                    .query_opt(
                        "SELECT owner FROM dormant_leases WHERE session = $1",
                        &[&session],
                    )
                    .await
                    .map_err(db)?
                    .and_then(|row| row.try_get::<_, String>(0).ok())
                    .unwrap_or_default();
                Err(Error::LeaseHeld {
                    session: session.to_string(),
                    owner,
                })
            }
        }
    }

    /// Gives the lease of `session` up (it expires now; the epoch stays, so the next owner's
    /// is higher).
    pub(super) async fn release(&self, pool: &Pool, session: &str) {
        let Some((_, epoch)) = self.held.remove(session) else {
            return;
        };
        let released = async {
            let client = pool.get().await.map_err(Error::backend)?;
            client
                .execute(
                    "UPDATE dormant_leases SET expires_at = now() - interval '1 millisecond' \
                     WHERE session = $1 AND owner = $2 AND epoch = $3",
                    &[&session, &self.node, &epoch],
                )
                .await
                .map_err(db)
        };
        if let Err(error) = released.await {
            // It expires by itself.
            tracing::warn!(session, %error, "store.lease_release_failed");
        }
    }

    /// Gives every lease up (the store closes).
    pub(super) async fn release_all(&self, pool: &Pool) {
        let sessions: Vec<String> = self.held.iter().map(|entry| entry.key().clone()).collect();
        for session in sessions {
            self.release(pool, &session).await;
        }
    }

    /// Renews every lease this node holds; forgets the ones it no longer holds (expired, or
    /// taken over), whose commits then fail.
    pub(super) async fn renew(&self, pool: &Pool) -> Result<(), Error> {
        let (sessions, epochs): (Vec<String>, Vec<i64>) = self
            .held
            .iter()
            .map(|entry| (entry.key().clone(), *entry.value()))
            .unzip();
        if sessions.is_empty() {
            return Ok(());
        }
        let client = pool.get().await.map_err(Error::backend)?;
        let statement = client
            .prepare_cached(
                // The rows are locked in session order, as a commit's fence locks them, so the
                // two never wait on each other in a cycle.
                "WITH mine AS ( \
                     SELECT l.session FROM dormant_leases l \
                     JOIN unnest($1::text[], $2::int8[]) AS h(session, epoch) \
                     ON l.session = h.session AND l.epoch = h.epoch \
                     WHERE l.owner = $3 AND l.expires_at > now() \
                     ORDER BY l.session FOR UPDATE OF l) \
                 UPDATE dormant_leases SET expires_at = now() + $4::int8 * interval '1 millisecond' \
                 WHERE session IN (SELECT session FROM mine) \
                 RETURNING session",
            )
            .await
            .map_err(db)?;
        let rows = client
            .query(
                &statement,
                &[&sessions, &epochs, &self.node, &self.ttl_ms()],
            )
            .await
            .map_err(db)?;
        let renewed: std::collections::HashSet<String> = rows
            .into_iter()
            .filter_map(|row| row.try_get::<_, String>(0).ok())
            .collect();
        for (session, epoch) in sessions.into_iter().zip(epochs) {
            if !renewed.contains(&session) {
                tracing::warn!(%session, epoch, node = %self.node, "store.lease_lost");
                self.held.remove_if(&session, |_, held| *held == epoch);
            }
        }
        Ok(())
    }
}

/// Renews the node's leases every third of their time to live, until the store closes.
pub(super) async fn renew_forever(pool: Pool, leases: Arc<Leases>) {
    let period = leases.ttl / 3;
    loop {
        tokio::time::sleep(period).await;
        if let Err(error) = leases.renew(&pool).await {
            tracing::warn!(%error, node = %leases.node, "store.lease_renewal_failed");
        }
    }
}
