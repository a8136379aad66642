//! [`PgStore`]: the [`Store`] on PostgreSQL, for several dormant nodes sharing one database
//! (feature `postgres`).
//!
//! One table holds every tree, `dormant_kv (tree, key, value)` with the primary key
//! `(tree, key)`, so a tree's range and prefix reads are index range scans in key order
//! (`bytea` compares byte by byte, as sled does). Versioned migrations run when a store opens
//! (`postgres/migrate.rs`). A commit is one transaction, and commits that arrive while one is
//! in flight share the next transaction and its WAL flush (`postgres/group.rs`), as the sled
//! store's commits share a flush. `synchronous_commit` stays on: a commit is acknowledged once
//! PostgreSQL has flushed it.
//!
//! Several nodes may share the database: each session has one owner at a time, by lease
//! (`postgres/lease.rs`), and a commit of a session whose lease this node lost is refused in
//! its own transaction ([`Error::LeaseLost`]), so a paused or cut-off node cannot write.
//!
//! ```no_run
//! # async fn open() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use dormant::{PgStore, Runtime};
//!
//! let store = PgStore::connect("postgres://dormant@127.0.0.1:5432/dormant").await?;
//! let runtime = Runtime::builder().shared_store(Arc::new(store)).build()?;
//! # let _ = runtime; Ok(()) }
//! ```

mod batch;
mod commit;
mod connection;
mod group;
mod lease;
mod migrate;
mod reads;
mod redacted;
mod settings;
mod takes;

pub use settings::PgSetting;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::NoTls;

use super::{prefix_end, Batch, Entry, Error, Store, Tree};
use crate::cluster::leases::{LeaseOwner, Leases, PeerKey};

/// How many connections a store keeps: one for the committer, the rest for reads.
const POOL_SIZE: usize = 8;

/// How many connections lease takes and releases share.
const LEASE_POOL_SIZE: usize = 4;

/// How long a lease lasts unless renewed, by default.
///
/// Short, so that a node that dies is taken over within it (issue 30: failover after a
/// SIGKILL at most 3 s); a node renews four times in it, so a pause (or a stall reaching the
/// database) of up to three quarters of it, 1.875 s, loses nothing. A longer pause may cost
/// the paused node its trees, never a write: every commit is fenced by the lease.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_millis(2_500);

/// The PostgreSQL store. Cloning is not needed: share it in an `Arc`.
pub struct PgStore {
    pool: Pool,
    /// Connections for lease changes, which commit without waiting for their WAL flush.
    lease_pool: Pool,
    commits: mpsc::UnboundedSender<group::Msg>,
    closed: AtomicBool,
    committer: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
    leases: Arc<lease::Leases>,
    /// Where gets and bounded scans queue to be read together.
    reads: reads::Reads,
    renewer: tokio::task::JoinHandle<()>,
    counts: Arc<Counts>,
}

/// What a store asked of the database.
#[derive(Debug, Default)]
pub(super) struct Counts {
    /// Transactions of every kind this store made: reads, commits, lease takes and releases,
    /// renewals.
    transactions: AtomicU64,
    /// Transactions the committer made (each one WAL flush, for a group of commits).
    commits: AtomicU64,
}

impl Counts {
    /// Counts one transaction (a statement on its own is one).
    pub(super) fn transaction(&self) {
        self.transactions.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one transaction of the committer.
    pub(super) fn commit(&self) {
        self.transaction();
        self.commits.fetch_add(1, Ordering::Relaxed);
    }
}

/// Opens a [`PgStore`] with a node name and lease time of your own.
#[derive(Clone, Debug)]
#[must_use]
pub struct PgStoreBuilder {
    url: String,
    node: Option<String>,
    lease_ttl: Duration,
    address: Option<String>,
}

impl PgStoreBuilder {
    /// This node's name among those sharing the database (default: a fresh UUID, so each
    /// process is a node of its own).
    pub fn node(mut self, name: impl Into<String>) -> Self {
        self.node = Some(name.into());
        self
    }

    /// How long this node stays live unless it renews ([`DEFAULT_LEASE_TTL`], 2.5 s; renewed
    /// every quarter of it), and with it every lease it holds. A node that dies is taken over
    /// within it; one paused for longer than three quarters of it may lose its sessions to the
    /// others (and then writes nothing more: its commits are fenced).
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl.max(Duration::from_millis(30));
        self
    }

    /// The address other nodes forward this node's sessions' requests to
    /// (`http://host:port`, the agent server's): recorded in the membership table, renewed
    /// with the node's liveness, and answered by [`Leases::owner`] on other nodes.
    /// Without one this node's sessions can only be reached here.
    pub fn advertise(mut self, address: impl Into<String>) -> Self {
        self.address = Some(address.into());
        self
    }

    /// Connects, migrates, and starts the committer and the lease renewal.
    ///
    /// # Errors
    /// As [`PgStore::connect`].
    pub async fn connect(self) -> Result<PgStore, Error> {
        let node = self
            .node
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        PgStore::open(&self.url, node, self.lease_ttl, self.address).await
    }
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("node", &self.leases.node)
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish()
    }
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/database`, or
    /// the key-value form `host=… user=…`), runs the migrations it lacks, and starts the
    /// committer. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// A malformed URL, a database that cannot be reached, or a migration that failed.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::builder(url).connect().await
    }

    /// A store on `url` with options: [`PgStoreBuilder::node`], [`PgStoreBuilder::lease_ttl`].
    pub fn builder(url: impl Into<String>) -> PgStoreBuilder {
        PgStoreBuilder {
            url: url.into(),
            node: None,
            lease_ttl: DEFAULT_LEASE_TTL,
            address: None,
        }
    }

    /// This node's name in the lease table.
    pub fn node(&self) -> &str {
        &self.leases.node
    }

    /// Keeps this node live now, and with it every lease it holds (the background renewal
    /// does it every quarter of the lease's time to live), and returns how many leases it holds
    /// after: for measuring what renewal costs, and for an operator who paused the renewal's
    /// task.
    ///
    /// # Errors
    /// A closed store, or a backend failure.
    pub async fn renew_leases(&self) -> Result<usize, Error> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        self.leases.renew(&self.lease_pool).await?;
        Ok(self.leases.held.len())
    }

    /// The transactions this store's committer made so far: each one WAL flush for a group of
    /// commits (commits divided by it is the group size).
    pub fn transaction_count(&self) -> u64 {
        self.counts.commits.load(Ordering::Relaxed)
    }

    /// Every transaction this store made in the database so far: its reads (grouped, many to
    /// a statement under load), its commits' groups, its lease takes and releases (grouped
    /// too) and its renewals. What a suspension cycle costs the database is this, divided by
    /// the cycles.
    pub fn database_transactions(&self) -> u64 {
        self.counts.transactions.load(Ordering::Relaxed)
    }

    /// The WAL flushes (`fsync`s) the whole database server made so far
    /// (`pg_stat_wal.wal_sync`, PostgreSQL 14 and later): compare two readings.
    ///
    /// # Errors
    /// A closed store, or a backend failure.
    pub async fn wal_syncs(&self) -> Result<u64, Error> {
        let client = self.client().await?;
        let row = client
            .query_one("SELECT wal_sync FROM pg_stat_wal", &[])
            .await
            .map_err(db)?;
        let syncs: i64 = row.try_get(0).map_err(db)?;
        Ok(u64::try_from(syncs).unwrap_or_default())
    }

    async fn open(
        url: &str,
        node: String,
        ttl: Duration,
        address: Option<String>,
    ) -> Result<Self, Error> {
        let config: tokio_postgres::Config = url.parse().map_err(db)?;
        let config = connection::bounded(config, ttl);
        let pool = connections(config.clone(), POOL_SIZE)?;
        let mut client = pool.get().await.map_err(Error::backend)?;
        migrate::run(&mut client).await?;
        drop(client);
        // Lease takes, renewals and releases do not wait for their WAL flush: a lease change
        // lost in a database crash is safe, since every commit's fence reads the lease row in
        // its own flushed transaction, whose flush makes every earlier change durable first
        // (one WAL). A take lost with the crash leaves the node without the lease, and its
        // commits fenced; a release or renewal lost lets the lease expire at its old time.
        let mut lease_config = config;
        connection::with_option(&mut lease_config, "-c synchronous_commit=off");
        let lease_pool = connections(lease_config, LEASE_POOL_SIZE)?;
        let counts = Arc::new(Counts::default());
        let leases = Arc::new(lease::Leases::new(node, ttl, address, &lease_pool, &counts));
        leases.register(&lease_pool).await?;
        let (commits, queue) = mpsc::unbounded_channel();
        let committer = tokio::spawn(group::run(
            pool.clone(),
            Arc::clone(&leases),
            Arc::clone(&counts),
            queue,
        ));
        let renewer = tokio::spawn(lease::renew_forever(
            lease_pool.clone(),
            Arc::clone(&leases),
        ));
        let reads = reads::Reads::start(pool.clone(), Arc::clone(&counts));
        Ok(Self {
            pool,
            reads,
            lease_pool,
            commits,
            closed: AtomicBool::new(false),
            committer: parking_lot::Mutex::new(Some(committer)),
            leases,
            renewer,
            counts,
        })
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, Error> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        self.pool.get().await.map_err(Error::backend)
    }

    /// What `read` finds, read with the reads queued beside it ([`reads`]).
    async fn grouped(&self, read: reads::Read) -> Result<Vec<Entry>, Error> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        self.reads.read(read).await
    }

    /// Rows of `sql` (tree, key bounds, limit as its parameters) as entries.
    async fn entries(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Entry>, Error> {
        let client = self.client().await?;
        let statement = client.prepare_cached(sql).await.map_err(db)?;
        self.counts.transaction();
        let rows = client.query(&statement, params).await.map_err(db)?;
        rows.into_iter()
            .map(|row| Ok((row.try_get(0).map_err(db)?, row.try_get(1).map_err(db)?)))
            .collect()
    }
}

/// A pool of connections to the database `config` names.
fn connections(config: tokio_postgres::Config, size: usize) -> Result<Pool, Error> {
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .build()
        .map_err(Error::backend)
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // The committer ends when its queue's sender (this store's) goes; the renewal would not.
        self.renewer.abort();
    }
}

/// A database error with what PostgreSQL said (its Display alone is "db error"): severity,
/// SQLSTATE code, message and detail.
pub(super) fn db(error: tokio_postgres::Error) -> Error {
    match error.as_db_error() {
        Some(db) => {
            let detail = db
                .detail()
                .map(|detail| format!(" ({detail})"))
                .unwrap_or_default();
            Error::backend(format!(
                "PostgreSQL {} {}: {}{detail}",
                db.severity(),
                db.code().code(),
                db.message()
            ))
        }
        None => Error::backend(error),
    }
}

/// Whether PostgreSQL aborted the transaction for a conflict another try may not meet:
/// a deadlock (40P01) or a serialization failure (40001).
pub(super) fn is_retryable(error: &Error) -> bool {
    let text = error.to_string();
    text.contains(" 40P01:") || text.contains(" 40001:")
}

/// The `tree` column's value.
fn tree_id(tree: Tree) -> i16 {
    tree as i16
}

/// A row limit as PostgreSQL's `bigint`.
fn limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

#[async_trait::async_trait]
impl Store for PgStore {
    async fn commit(&self, batch: Batch) -> Result<(), Error> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        if batch.is_empty() {
            return Ok(());
        }
        let (reply, answer) = oneshot::channel();
        self.commits
            .send(group::Msg::Commit(group::Pending { batch, reply }))
            .map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)?
    }

    async fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let found = self.grouped(reads::Read::key(tree_id(tree), key)).await?;
        Ok(found.into_iter().next().map(|(_, value)| value))
    }

    async fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Entry>, Error> {
        let tree = tree_id(tree);
        match prefix_end(prefix) {
            Some(end) => {
                self.grouped(reads::Read {
                    tree,
                    lo: prefix.to_vec(),
                    hi: end,
                    limit: i64::MAX,
                    reverse: false,
                })
                .await
            }
            // No upper bound (an empty prefix, or one of 0xff bytes only): rare, alone.
            None => {
                self.entries(
                    "SELECT key, value FROM dormant_kv WHERE tree = $1 AND key >= $2 ORDER BY key",
                    &[&tree, &prefix],
                )
                .await
            }
        }
    }

    async fn scan_prefix_rev(
        &self,
        tree: Tree,
        prefix: &[u8],
        limit_to: usize,
    ) -> Result<Vec<Entry>, Error> {
        let tree = tree_id(tree);
        let limit = limit(limit_to);
        match prefix_end(prefix) {
            Some(end) => {
                self.grouped(reads::Read {
                    tree,
                    lo: prefix.to_vec(),
                    hi: end,
                    limit,
                    reverse: true,
                })
                .await
            }
            None => {
                self.entries(
                    "SELECT key, value FROM dormant_kv WHERE tree = $1 AND key >= $2 ORDER BY key DESC LIMIT $3",
                    &[&tree, &prefix, &limit],
                )
                .await
            }
        }
    }

    async fn scan_range(
        &self,
        tree: Tree,
        from: &[u8],
        to: &[u8],
        limit_to: usize,
    ) -> Result<Vec<Entry>, Error> {
        self.grouped(reads::Read {
            tree: tree_id(tree),
            lo: from.to_vec(),
            hi: to.to_vec(),
            limit: limit(limit_to),
            reverse: false,
        })
        .await
    }

    async fn flush(&self) -> Result<(), Error> {
        // A closed store answers every call so (the trait's contract), though it has nothing
        // left to flush.
        if self.is_closed() {
            return Err(Error::Closed);
        }
        // Every acknowledged commit is flushed already (synchronous_commit).
        Ok(())
    }

    async fn close(&self) -> Result<(), Error> {
        self.closed.store(true, Ordering::SeqCst);
        let committer = self.committer.lock().take();
        if let Some(committer) = committer {
            // Commits queued before the close are made (or fail) before it returns.
            let (done, closed) = oneshot::channel();
            if self.commits.send(group::Msg::Close(done)).is_ok() {
                let _ = closed.await;
            }
            let _ = committer.await;
        }
        self.renewer.abort();
        // Other nodes may take the sessions over at once, rather than after the node's row expires.
        self.leases.leave_cluster(&self.lease_pool).await;
        self.pool.close();
        self.lease_pool.close();
        Ok(())
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn is_shared(&self) -> bool {
        true
    }

    async fn size_on_disk(&self) -> Result<u64, Error> {
        let client = self.client().await?;
        let row = client
            .query_one("SELECT pg_total_relation_size('dormant_kv')::bigint", &[])
            .await
            .map_err(db)?;
        let size: i64 = row.try_get(0).map_err(db)?;
        Ok(u64::try_from(size).unwrap_or_default())
    }
}

/// The lease table beside the data: a tree's lease taken, held and given back in the
/// database, every commit fenced by it (`postgres/lease.rs`).
#[async_trait::async_trait]
impl Leases for PgStore {
    fn is_shared(&self) -> bool {
        true
    }

    async fn acquire(&self, session: &str, lease: &str) -> Result<(), Error> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        self.leases.acquire(&self.lease_pool, session, lease).await
    }

    fn release_session(&self, session: &str) {
        if !self.is_closed() {
            self.leases.release(session);
        }
    }

    fn holds_current(&self, session: &str) -> bool {
        self.leases.holds_current(session)
    }

    fn holds(&self, lease: &str) -> bool {
        self.leases.holds(lease)
    }

    async fn owner(&self, lease: &str) -> Result<Option<LeaseOwner>, Error> {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        self.leases.owner(&self.lease_pool, lease).await
    }

    fn peer_key(&self) -> Option<PeerKey> {
        Some(self.leases.key.clone())
    }
}
