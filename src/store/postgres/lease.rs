//! Leases: one owner per session tree among the nodes that share a database. A node takes a
//! tree's lease when one of its sessions activates (or takes over one whose owner is no longer
//! live, by the database's clock), and gives it up when the last of them stops. A lease is
//! held while it is not given up and its owner is live: a node renews one row of its own in
//! `dormant_nodes` well before it expires, not each lease (so renewal costs the same at ten
//! trees as at a million), and a node that stops renewing — dead, paused, cut off — loses all
//! its leases at once. Every take or takeover raises the lease's epoch, so the epochs of one
//! tree only grow. Every commit checks, in its own transaction and with the lease row locked,
//! that this node still holds the lease with the epoch it took and is live: a node that lost
//! it cannot write (fencing).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use deadpool_postgres::Pool;

use super::takes::{Releases, Takes};
use super::{db, Counts};
use crate::cluster::leases::{LeaseOwner, PeerKey};
use crate::store::Error;

/// What a node knows of its leases.
#[derive(Debug)]
pub(super) struct Leases {
    /// This node's name in the `owner` column.
    pub(super) node: String,
    /// How long this node stays live after it renews (and with it, its leases).
    pub(super) ttl: Duration,
    /// Where other nodes forward requests for this node's sessions.
    address: Option<String>,
    /// The key other nodes call this one with.
    pub(super) key: PeerKey,
    /// The leases this node holds, by name.
    pub(super) held: DashMap<String, Held>,
    /// The lease each session holds here, with the epoch it joined it at.
    by_session: DashMap<String, (String, i64)>,
    /// One take of a lease at a time: two sessions of one tree activating together share
    /// one take instead of raising the epoch under each other.
    taking: DashMap<String, Arc<tokio::sync::Mutex<()>>>,
    /// When this node stops being live by its own reckoning: a time to live after its last
    /// renewal started (the database's reckoning is later, so this errs early).
    live_until: parking_lot::Mutex<Option<Instant>>,
    /// One renewal at a time.
    renewing: tokio::sync::Mutex<()>,
    /// Where takes queue, to be made together.
    takes: Takes,
    /// Where releases queue, to be made together.
    releases: Releases,
    /// The store's count of what it asked of the database.
    counts: Arc<Counts>,
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
    /// A node's leases, taken and given up over `pool` (whose transactions `counts` counts).
    /// Must be called inside a tokio runtime: takes and releases have tasks of their own.
    pub(super) fn new(
        node: String,
        ttl: Duration,
        address: Option<String>,
        pool: &Pool,
        counts: &Arc<Counts>,
    ) -> Self {
        Self {
            takes: Takes::start(pool.clone(), node.clone(), Arc::clone(counts)),
            releases: Releases::start(pool.clone(), node.clone(), Arc::clone(counts)),
            counts: Arc::clone(counts),
            node,
            ttl,
            address,
            key: PeerKey::random(),
            held: DashMap::new(),
            by_session: DashMap::new(),
            taking: DashMap::new(),
            live_until: parking_lot::Mutex::new(None),
            renewing: tokio::sync::Mutex::new(()),
        }
    }

    /// Whether this node may have stopped being live (it was paused, or its renewals failed,
    /// for a time to live): other nodes may own any of its leases.
    fn lapsed(&self) -> bool {
        self.live_until
            .lock()
            .is_none_or(|until| Instant::now() >= until)
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

    /// Whether `session` holds its lease at the epoch this node holds it at now, and the
    /// node is live.
    pub(super) fn holds_current(&self, session: &str) -> bool {
        !self.lapsed()
            && self
                .by_session
                .get(session)
                .is_some_and(|joined| self.epoch(&joined.0) == Some(joined.1))
    }

    /// Whether this node holds `lease` and is live, by its own reckoning.
    pub(super) fn holds(&self, lease: &str) -> bool {
        !self.lapsed() && self.held.contains_key(lease)
    }

    /// Forgets `lease` if this node still believes it holds it at `epoch` (the database says
    /// it lost it): the sessions that held it find out at their next commit.
    pub(super) fn forget(&self, lease: &str, epoch: i64) {
        self.held.remove_if(lease, |_, held| held.epoch == epoch);
    }

    /// Makes `session` hold `lease`: joins it if this node holds it, else takes it (or takes
    /// over one whose owner is not live); refuses one another live node holds. A node that
    /// may have stopped being live renews first, and forgets its leases if it had.
    pub(super) async fn acquire(
        &self,
        pool: &Pool,
        session: &str,
        lease: &str,
    ) -> Result<(), Error> {
        if self.lapsed() {
            self.renew(pool).await?;
        }
        let joined = match self.join(session, lease) {
            Some(joined) => joined,
            None => self.take_and_join(session, lease).await?,
        };
        if let Some((left, epoch)) = joined {
            self.releases.give_up(left, epoch);
        }
        Ok(())
    }

    /// Takes `lease` (one take of a lease at a time) and joins it.
    async fn take_and_join(&self, session: &str, lease: &str) -> Result<Left, Error> {
        let gate = Arc::clone(self.taking.entry(lease.to_string()).or_default().value());
        let joined = {
            let _one_take = gate.lock().await;
            match self.join(session, lease) {
                Some(joined) => Ok(joined),
                None => self.takes.take(lease.to_string()).await.map(|epoch| {
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

    /// `session` no longer holds its lease here, from now on; the lease is given up with its
    /// last session.
    pub(super) fn release(&self, session: &str) {
        let Some((_, (lease, at))) = self.by_session.remove(session) else {
            return;
        };
        let Some((lease, epoch)) = self.leave(session, lease, at) else {
            return;
        };
        self.releases.give_up(lease, epoch);
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

    /// Gives every lease up at once (the store closes): this node's row goes, so each of its
    /// leases may be taken over now rather than after the row expires.
    pub(super) async fn leave_cluster(&self, pool: &Pool) {
        self.held.clear();
        self.by_session.clear();
        let left = async {
            let client = pool.get().await.map_err(Error::backend)?;
            self.counts.transaction();
            client
                .execute("DELETE FROM dormant_nodes WHERE node = $1", &[&self.node])
                .await
                .map_err(db)
        };
        if let Err(error) = left.await {
            // Its leases lapse when the row expires.
            tracing::warn!(%error, node = %self.node, "store.membership_leave_failed");
        }
    }

    /// Makes this node live for a time to live from now, with its address (the node joins,
    /// or joins again after its row expired).
    pub(super) async fn register(&self, pool: &Pool) -> Result<(), Error> {
        let started = Instant::now();
        let client = pool.get().await.map_err(Error::backend)?;
        let statement = client
            .prepare_cached(
                "INSERT INTO dormant_nodes (node, address, heartbeat_at, expires_at, peer_key) \
                 VALUES ($1, $2, now(), now() + $3::int8 * interval '1 millisecond', $4) \
                 ON CONFLICT (node) DO UPDATE SET address = excluded.address, \
                 heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at, \
                 peer_key = excluded.peer_key",
            )
            .await
            .map_err(db)?;
        self.counts.transaction();
        client
            .execute(
                &statement,
                &[
                    &self.node,
                    &self.address,
                    &self.ttl_ms(),
                    // tokio-postgres logs a statement's parameters at debug level.
                    &super::redacted::Redacted(self.key.as_str()),
                ],
            )
            .await
            .map_err(db)?;
        *self.live_until.lock() = Some(started + self.ttl);
        Ok(())
    }

    /// The live node other than this one that holds `lease`, with its address if it
    /// advertised one.
    pub(super) async fn owner(
        &self,
        pool: &Pool,
        lease: &str,
    ) -> Result<Option<LeaseOwner>, Error> {
        let client = pool.get().await.map_err(Error::backend)?;
        let statement = client
            .prepare_cached(
                "SELECT l.owner, n.address, n.peer_key FROM dormant_leases l \
                 JOIN dormant_nodes n ON n.node = l.owner AND n.expires_at > now() \
                 WHERE l.session = $1 AND l.owner <> $2 AND l.expires_at > now()",
            )
            .await
            .map_err(db)?;
        self.counts.transaction();
        let row = client
            .query_opt(&statement, &[&lease, &self.node])
            .await
            .map_err(db)?;
        row.map(|row| {
            Ok(LeaseOwner {
                node: row.try_get(0).map_err(db)?,
                address: row.try_get(1).map_err(db)?,
                key: row
                    .try_get::<_, Option<String>>(2)
                    .map_err(db)?
                    .map(PeerKey::new),
            })
        })
        .transpose()
    }

    /// Keeps this node live, and with it every lease it holds: one row, however many. If the
    /// row had expired (the node was paused or cut off for longer than a time to live), other
    /// nodes may have taken any of its leases: it forgets them all, so each of its actors
    /// reads its session again before acting, and joins again.
    pub(super) async fn renew(&self, pool: &Pool) -> Result<(), Error> {
        let _one_renewal = self.renewing.lock().await;
        let started = Instant::now();
        let client = pool.get().await.map_err(Error::backend)?;
        let statement = client
            .prepare_cached(
                "UPDATE dormant_nodes \
                 SET heartbeat_at = now(), expires_at = now() + $2::int8 * interval '1 millisecond' \
                 WHERE node = $1 AND expires_at > now()",
            )
            .await
            .map_err(db)?;
        self.counts.transaction();
        let renewed = client
            .execute(&statement, &[&self.node, &self.ttl_ms()])
            .await
            .map_err(db)?;
        drop(client);
        if renewed == 0 {
            tracing::warn!(node = %self.node, held = self.held.len(), "store.liveness_lapsed");
            // Forgotten, and given up: a lease nobody took meanwhile is still this node's row,
            // valid again once the node is live again, and no session here would ever give it
            // up (each leaves only a lease it believes it holds); another node would find it
            // held for as long as this node lives. One taken over since is not touched (its
            // epoch moved on); a session here that needs its lease again takes it again.
            let forgotten: Vec<(String, i64)> = self
                .held
                .iter()
                .map(|held| (held.key().clone(), held.value().epoch))
                .collect();
            // Each at the epoch read: a lease taken meanwhile (after the read) is not
            // forgotten without being given up.
            for (lease, epoch) in forgotten {
                if self
                    .held
                    .remove_if(&lease, |_, held| held.epoch == epoch)
                    .is_some()
                {
                    self.releases.give_up(lease, epoch);
                }
            }
            return self.register(pool).await;
        }
        *self.live_until.lock() = Some(started + self.ttl);
        Ok(())
    }
}

/// How many times a node renews in a time to live: a node whose renewal is late by less than
/// the rest of it (three quarters) stays live.
pub(super) const RENEWALS_PER_TTL: u32 = 4;

/// Keeps the node live every quarter of a time to live, until the store closes.
pub(super) async fn renew_forever(pool: Pool, leases: Arc<Leases>) {
    let period = leases.ttl / RENEWALS_PER_TTL;
    let mut took = Duration::ZERO;
    loop {
        // The next renewal starts a period after the last one started, so a slow database
        // does not stretch the time between two.
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
    }
}
