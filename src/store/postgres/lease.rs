//! Leases: one owner per session among the nodes that share a database. A node takes a
//! session's lease when the session's actor activates (or takes over one that expired, by
//! the database's clock), renews every lease it holds well before it expires, and gives it
//! up when the actor stops. Every take or takeover raises the session's epoch, so the epochs
//! of one session only grow. Every commit of a session checks, in its own transaction and
//! with the lease row locked, that this node still holds the lease with the epoch it took:
//! a node that lost it (paused past its expiry, cut off, slow) cannot write (fencing).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use deadpool_postgres::Pool;

use super::db;
use crate::store::{Error, LeaseOwner};

/// What a node knows of its leases.
#[derive(Debug)]
pub(super) struct Leases {
    /// This node's name in the `owner` column.
    pub(super) node: String,
    /// How long a lease lasts after it is taken or renewed (and a heartbeat counts).
    pub(super) ttl: Duration,
    /// Where other nodes forward requests for this node's sessions.
    address: Option<String>,
    /// The leases this node holds, by name.
    pub(super) held: DashMap<String, Held>,
    /// The lease each session holds here, with the epoch it joined it at.
    by_session: DashMap<String, (String, i64)>,
    /// One take of a lease at a time: two sessions of one tree activating together share
    /// one take instead of raising the epoch under each other.
    taking: DashMap<String, Arc<tokio::sync::Mutex<()>>>,
}

/// A lease the last of its sessions left, with the epoch to give it up at.
type Left = Option<(String, i64)>;

/// One lease this node holds.
#[derive(Debug)]
pub(super) struct Held {
    /// The epoch this node took it at (every commit's fence checks it).
    pub(super) epoch: i64,
    /// The sessions resident here that hold it: it is given up with the last.
    sessions: HashSet<String>,
}

impl Leases {
    pub(super) fn new(node: String, ttl: Duration, address: Option<String>) -> Self {
        Self {
            node,
            ttl,
            address,
            held: DashMap::new(),
            by_session: DashMap::new(),
            taking: DashMap::new(),
        }
    }

    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)
    }

    /// The epoch this node holds `lease` at, if it holds it.
    pub(super) fn epoch(&self, lease: &str) -> Option<i64> {
        self.held.get(lease).map(|held| held.epoch)
    }

    /// The epoch a commit `writer` makes under `lease` is fenced at: the epoch the writer
    /// joined the lease at, which is older than the node's if the node lost the lease and took
    /// it again since (the writer's memory is then stale, and its commit refused); the node's,
    /// for a writer that never joined. `None`: the node does not hold the lease.
    pub(super) fn fence_epoch(&self, writer: &str, lease: &str) -> Option<i64> {
        if let Some(joined) = self.by_session.get(writer) {
            if joined.0 == lease {
                return Some(joined.1);
            }
        }
        self.epoch(lease)
    }

    /// Whether `session` holds its lease at the epoch this node holds it at now.
    pub(super) fn holds_current(&self, session: &str) -> bool {
        self.by_session
            .get(session)
            .is_some_and(|joined| self.epoch(&joined.0) == Some(joined.1))
    }

    /// Forgets `lease` if this node still believes it holds it at `epoch` (the database says
    /// it lost it): the sessions that held it find out at their next commit.
    pub(super) fn forget(&self, lease: &str, epoch: i64) {
        self.held.remove_if(lease, |_, held| held.epoch == epoch);
    }

    /// Makes `session` hold `lease`: joins it if this node holds it, else takes it (or takes
    /// over an expired one); refuses one another node holds.
    pub(super) async fn acquire(
        &self,
        pool: &Pool,
        session: &str,
        lease: &str,
    ) -> Result<(), Error> {
        let joined = match self.join(session, lease) {
            Some(joined) => joined,
            None => self.take_and_join(pool, session, lease).await?,
        };
        if let Some((left, epoch)) = joined {
            give_up(pool, &self.node, &left, epoch).await;
        }
        Ok(())
    }

    /// Takes `lease` (one take of a lease at a time) and joins it.
    async fn take_and_join(&self, pool: &Pool, session: &str, lease: &str) -> Result<Left, Error> {
        let gate = Arc::clone(self.taking.entry(lease.to_string()).or_default().value());
        let joined = {
            let _one_take = gate.lock().await;
            match self.join(session, lease) {
                Some(joined) => Ok(joined),
                None => self.take(pool, lease).await.map(|epoch| {
                    self.held.insert(
                        lease.to_string(),
                        Held {
                            epoch,
                            sessions: HashSet::new(),
                        },
                    );
                    self.join(session, lease).flatten()
                }),
            }
        };
        drop(gate);
        self.taking
            .remove_if(lease, |_, gate| Arc::strong_count(gate) == 1);
        joined
    }

    /// Adds `session` to `lease` if this node holds it (`None` if not), leaving the lease it
    /// held before (a new child moves from a lease of its own name to its tree's).
    fn join(&self, session: &str, lease: &str) -> Option<Left> {
        let mut held = self.held.get_mut(lease)?;
        held.sessions.insert(session.to_string());
        let epoch = held.epoch;
        drop(held);
        let before = self
            .by_session
            .insert(session.to_string(), (lease.to_string(), epoch));
        Some(
            before
                .filter(|before| before.0 != lease || before.1 != epoch)
                .and_then(|(before, at)| self.leave(session, before, at)),
        )
    }

    /// Takes `lease` in the database: the new epoch.
    async fn take(&self, pool: &Pool, lease: &str) -> Result<i64, Error> {
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
            .query_opt(&statement, &[&lease, &self.node, &self.ttl_ms()])
            .await
            .map_err(db)?;
        if let Some(row) = taken {
            let epoch: i64 = row.try_get(0).map_err(db)?;
            tracing::debug!(lease, epoch, node = %self.node, "store.lease_taken");
            return Ok(epoch);
        }
        let owner = client
            .query_opt(
                "SELECT owner FROM dormant_leases WHERE session = $1",
                &[&lease],
            )
            .await
            .map_err(db)?
            .and_then(|row| row.try_get::<_, String>(0).ok())
            .unwrap_or_default();
        Err(Error::LeaseHeld {
            session: lease.to_string(),
            owner,
        })
    }

    /// `session` no longer holds its lease here, from now on; the lease is given up with its
    /// last session.
    pub(super) fn release(&self, pool: &Pool, session: &str) {
        let Some((_, (lease, at))) = self.by_session.remove(session) else {
            return;
        };
        let Some((lease, epoch)) = self.leave(session, lease, at) else {
            return;
        };
        // In the background (it expires by itself if that fails).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (pool, node) = (pool.clone(), self.node.clone());
            runtime.spawn(async move { give_up(&pool, &node, &lease, epoch).await });
        }
    }

    /// Takes `session` off `lease`, which it joined at epoch `at` (nothing if the node holds
    /// it at another epoch since): the lease to give up, with its epoch, if it was the last.
    fn leave(&self, session: &str, lease: String, at: i64) -> Left {
        self.held.remove_if_mut(&lease, |_, held| {
            held.epoch == at && {
                held.sessions.remove(session);
                held.sessions.is_empty()
            }
        })?;
        Some((lease, at))
    }

    /// Gives every lease up (the store closes).
    pub(super) async fn release_all(&self, pool: &Pool) {
        let leases: Vec<(String, i64)> = self
            .held
            .iter()
            .map(|held| (held.key().clone(), held.epoch))
            .collect();
        self.held.clear();
        self.by_session.clear();
        for (lease, epoch) in leases {
            give_up(pool, &self.node, &lease, epoch).await;
        }
    }

    /// Records this node's address and that it is alive now (a node that advertised none is
    /// not in the membership table: nobody forwards to it).
    pub(super) async fn heartbeat(&self, pool: &Pool) -> Result<(), Error> {
        let Some(address) = &self.address else {
            return Ok(());
        };
        let client = pool.get().await.map_err(Error::backend)?;
        client
            .execute(
                "INSERT INTO dormant_nodes (node, address, heartbeat_at) VALUES ($1, $2, now()) \
                 ON CONFLICT (node) DO UPDATE \
                 SET address = excluded.address, heartbeat_at = excluded.heartbeat_at",
                &[&self.node, address],
            )
            .await
            .map_err(db)?;
        Ok(())
    }

    /// Takes this node out of the membership table (it closes).
    pub(super) async fn leave_membership(&self, pool: &Pool) {
        let left = async {
            let client = pool.get().await.map_err(Error::backend)?;
            client
                .execute("DELETE FROM dormant_nodes WHERE node = $1", &[&self.node])
                .await
                .map_err(db)
        };
        if let Err(error) = left.await {
            tracing::warn!(%error, node = %self.node, "store.membership_leave_failed");
        }
    }

    /// The live node other than this one that holds `lease`, with its address if its
    /// heartbeat is more recent than a lease's time to live.
    pub(super) async fn owner(
        &self,
        pool: &Pool,
        lease: &str,
    ) -> Result<Option<LeaseOwner>, Error> {
        let client = pool.get().await.map_err(Error::backend)?;
        let statement = client
            .prepare_cached(
                "SELECT l.owner, n.address FROM dormant_leases l \
                 LEFT JOIN dormant_nodes n ON n.node = l.owner \
                     AND n.heartbeat_at > now() - $3::int8 * interval '1 millisecond' \
                 WHERE l.session = $1 AND l.owner <> $2 AND l.expires_at > now()",
            )
            .await
            .map_err(db)?;
        let row = client
            .query_opt(&statement, &[&lease, &self.node, &self.ttl_ms()])
            .await
            .map_err(db)?;
        row.map(|row| {
            Ok(LeaseOwner {
                node: row.try_get(0).map_err(db)?,
                address: row.try_get(1).map_err(db)?,
            })
        })
        .transpose()
    }

    /// Renews every lease this node holds; forgets the ones it no longer holds (expired, or
    /// taken over), whose commits then fail.
    pub(super) async fn renew(&self, pool: &Pool) -> Result<(), Error> {
        let (sessions, epochs): (Vec<String>, Vec<i64>) = self
            .held
            .iter()
            .map(|entry| (entry.key().clone(), entry.epoch))
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
                self.forget(&session, epoch);
            }
        }
        Ok(())
    }
}

/// Gives `lease` up in the database (it expires now; the epoch stays, so the next owner's is
/// higher). A lease taken again since is not touched.
async fn give_up(pool: &Pool, node: &str, lease: &str, epoch: i64) {
    let released = async {
        let client = pool.get().await.map_err(Error::backend)?;
        client
            .execute(
                "UPDATE dormant_leases SET expires_at = now() - interval '1 millisecond' \
                 WHERE session = $1 AND owner = $2 AND epoch = $3",
                &[&lease, &node, &epoch],
            )
            .await
            .map_err(db)
    };
    if let Err(error) = released.await {
        // It expires by itself.
        tracing::warn!(lease, %error, "store.lease_release_failed");
    }
}

/// Renews the node's leases every third of their time to live, until the store closes.
pub(super) async fn renew_forever(pool: Pool, leases: Arc<Leases>) {
    let period = leases.ttl / 3;
    let mut took = Duration::ZERO;
    loop {
        // A renewal of many leases takes a while (BENCHMARKS.md: about 70 µs a lease): the
        // next one starts a period after the last one started, so no lease waits longer
        // than a period plus one renewal.
        tokio::time::sleep(period.saturating_sub(took)).await;
        let started = std::time::Instant::now();
        let renewed = leases.renew(&pool).await;
        took = started.elapsed();
        if took > period {
            tracing::warn!(took_ms = took.as_millis(), held = leases.held.len(), node = %leases.node, "store.lease_renewal_slow");
        }
        if let Err(error) = renewed {
            tracing::warn!(%error, node = %leases.node, "store.lease_renewal_failed");
        }
        if let Err(error) = leases.heartbeat(&pool).await {
            tracing::warn!(%error, node = %leases.node, "store.heartbeat_failed");
        }
    }
}
