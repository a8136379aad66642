//! The embedded sled backend ([`SledStore`]); see its documentation for how a commit becomes
//! durable.
//!
//! One job a file: [`open`] configures and opens the store, [`database`] holds the sled
//! database (and opens it again after a failed write), [`flusher`] is the group-commit thread,
//! [`syncer`] the `fdatasync`s of [`Durability::PowerLoss`], [`writes`] (with `store::keyspace`) map
//! logical trees and batches to sled's keys, [`values`] keeps every value small enough that
//! sled never writes a node as a separate file (values past 4 KiB in pieces), [`migrate`]
//! brings a store written before that to it, [`check`] and `store::mark` tell a store that lost
//! part of its log from a whole one; this file is the store and its reads.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use ::sled::IVec;

use super::{Batch, Damage, Entry, Error, Store, Tree};

mod check;
mod database;
mod durability;
mod error;
mod files;
mod flusher;

mod migrate;
mod open;
mod syncer;
mod values;
mod writes;

use super::keyspace::{logical_key, stored_key};
use database::{Shared, State};
pub use durability::Durability;
use error::io_error;
pub use error::SledError;
use flusher::GroupFlusher;
pub use open::SledStoreBuilder;
use writes::SledWrites;

/// The sled-backed [`Store`]: atomic multi-tree commits, durable at a configurable
/// [`Durability`] level, with group commit.
///
/// Every [`Tree`] lives in one sled tree, `records`, as a key range of its own: each key is
/// stored behind its tree's tag byte. Dropping the store stops its flusher thread and releases
/// the directory lock; the drop blocks until the thread has served every queued commit (at
/// most one group's batch and flush).
///
/// # How a commit becomes durable
///
/// A batch is applied as **one** `sled::Batch` on that tree. sled seals the writes of a batch
/// as one unit in its log, so after a crash either all of them are recovered or none. The
/// commit returns only after a flush that *started after* the batch was applied has succeeded
/// (plus an `fdatasync` at [`Durability::PowerLoss`]).
///
/// * **Group commit on** (the default): `commit` queues its batch for a dedicated flusher
///   thread and awaits a oneshot. The thread takes everything queued so far, applies those
///   batches together as one sled batch (several, if the group is very large), does one
///   flush, and wakes every committer of the group. Many concurrent committers thus share one
///   sled batch and one physical flush.
/// * **Group commit off**: every commit applies its own sled batch and does its own flush on
///   tokio's blocking pool.
///
/// Why one sled tree and not one per [`Tree`]: writing several sled trees atomically needs a
/// sled transaction, which reads every key's old value back and stages each write in a hash
/// map before applying it; a single-tree `sled::Batch` only applies. With 10,000 concurrent
/// sessions that cut the flusher thread's share of the CPU by about a seventh (perf over
/// `cargo bench --bench hitl`; BENCHMARKS.md, session 5).
///
/// Why batches are grouped into one sled batch and not only into one flush: sled 0.34 seals
/// its current log buffer and hands it to its I/O threads at the start of every batch or
/// transaction (`pin_log` rolls the buffer before and after reserving the batch marker, and
/// every buffer write is followed by a waiting `sync_file_range`). So applying a batch is not
/// an in-memory operation but one or two small disk writes, and a flush has to wait for all of
/// them. Measured on the development VM (2 vCPUs, ext4), with 1 KiB two-tree batches: 64
/// transactions then one flush reach ~8k writes/s; one transaction holding the same 64 batches
/// then one flush reach ~33k writes/s.
///
/// Grouping keeps every batch all-or-nothing. A commit is never acknowledged before it is
/// durable; a failed apply or flush fails every commit of its group, unless the database opened
/// again after it holds the whole group (sled writes what it applied as it lets a failed
/// database go), which is then made durable and acknowledged. A group of more than 4,096
/// writes is applied as several sled batches: one whose later part failed is told failed while
/// its earlier part may be kept, as a commit a crash cut may be.
///
/// # After a failed write, and when the disk is full
///
/// A commit that cannot be written because the disk is full or the disk quota is exhausted
/// fails with [`Error::StorageFull`], which is [retryable](Error::is_retryable): once space
/// is freed, the same store commits again, without being reopened. Commits acknowledged
/// before stay acknowledged, and once a commit has failed, nothing of it is shown unless it
/// reached the disk.
///
/// How: sled 0.34 fails every later operation of a database once one of its log writes has
/// failed, even after space is freed, and it keeps showing the batches it applied in memory
/// but could not write (they would vanish at the next restart). So after *any* failed apply or
/// flush the store drops the `sled::Db` and opens it again from the directory before the
/// failed commits hear of it: from then on, readers see what is on disk. Reads and commits
/// wait a moment (250 ms at most) while that happens, then fail. A read can fail the same way (sled writes while it reads: it finishes the
/// splits and merges of the tree nodes it walks through): it is handled like a failed write,
/// and fails with [`Error::StorageFull`] on a full disk too. While the disk stays full,
/// opening the database can fail as well (sled needs a little space to open); the store then
/// has no database, and every read and commit tries to open it again, failing with
/// [`Error::StorageFull`] until there is room. An open that
/// failed so can leave behind a snapshot file sled never finished, which sled itself would
/// take for corruption at every later open; the store removes it and opens again. A temporary
/// store is opened again the same way: its directory stays until the store is dropped.
///
/// # Damage is told, not served
///
/// sled stops replaying its log at the first bad checksum, as it would at the torn tail of a
/// crash, and skips the rest of a damaged segment: a flipped byte can lose acknowledged
/// commits without a word. So every sled batch also writes a record of the store's contents
/// (a batch number, and how many entries there are with the sum of their checksums), and
/// after each flush the number of the last durable batch goes to a file outside the log,
/// `acknowledged` (with an `fdatasync` at [`Durability::PowerLoss`], one per group; at
/// [`Durability::ProcessCrash`], whose last commits a power cut may lose, the mark lags up to
/// a second behind, after an `fdatasync` of the data, and catches up on `close`). Opening
/// checks both: a store that recovered an earlier batch than it acknowledged, or whose entries
/// are not those recorded, refuses to open with [`Error::Damaged`], which says which; so does
/// one whose files sled cannot read. [`SledStoreBuilder::salvage`] opens what is left,
/// read-only. The check scans the whole store once per opening (not again when it is opened
/// after a failed write). The directory is the owner's alone (`0700`, files `0600`).
///
/// # Examples
///
/// ```
/// use dormant::SledStore;
/// use dormant::store::{Batch, CommitKind, Store, Tree};
///
/// fn main() -> Result<(), dormant::store::Error> {
///     let store = SledStore::temporary()?;
///     // The store's methods are async; any executor works, group commit on or off.
///     futures::executor::block_on(async {
///         let mut batch = Batch::new(CommitKind::RunStart);
///         batch.put(Tree::Sessions, b"s1".to_vec(), b"snapshot".to_vec());
///         batch.put(Tree::Log, b"s1/0001".to_vec(), b"hello".to_vec());
///         store.commit(batch).await?;
///
///         assert_eq!(store.get(Tree::Sessions, b"s1").await?, Some(b"snapshot".to_vec()));
///         assert_eq!(store.scan_prefix(Tree::Log, b"s1/").await?.len(), 1);
///         assert!(store.flush_count() >= 1);
///         Ok(())
///     })
/// }
/// ```
pub struct SledStore {
    shared: Arc<Shared>,
    /// `Some` when group commit is on.
    group: Option<GroupFlusher>,
    /// `None` for a temporary store.
    path: Option<PathBuf>,
    durability: Durability,
}

impl SledStore {
    /// Opens (or creates) a store in the directory `path` with the defaults of
    /// [`SledStoreBuilder`].
    ///
    /// # Errors
    /// See [`SledStoreBuilder::open`].
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, Error> {
        SledStoreBuilder::new(path).open()
    }

    /// A builder for a store in the directory `path`.
    pub fn builder(path: impl Into<PathBuf>) -> SledStoreBuilder {
        SledStoreBuilder::new(path)
    }

    /// A temporary store, removed when dropped (for tests); group commit on, no `fdatasync`.
    ///
    /// # Errors
    /// sled cannot create its temporary directory.
    pub fn temporary() -> Result<Self, Error> {
        SledStoreBuilder::temporary().open()
    }

    /// The store directory (`None` for a temporary store).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The configured durability level.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// What the store lost, when it was opened to [salvage](SledStoreBuilder::salvage) and is
    /// damaged; `None` otherwise.
    pub fn damage(&self) -> Option<Damage> {
        self.shared.damage.lock().clone()
    }

    /// Whether the store was opened read-only, to [salvage](SledStoreBuilder::salvage) it.
    pub fn is_read_only(&self) -> bool {
        self.shared.is_salvage()
    }

    /// Whether group commit is on.
    pub fn is_group_commit(&self) -> bool {
        self.group.is_some()
    }

    /// How many physical flushes (each with its `fdatasync` at [`Durability::PowerLoss`]) have
    /// completed successfully. With group commit this is usually far below the number of
    /// commits.
    pub fn flush_count(&self) -> u64 {
        self.shared.flushes.load(Ordering::Relaxed)
    }

    /// Bytes the store occupies on disk (the same as [`Store::size_on_disk`], without needing
    /// the trait in scope nor an executor).
    ///
    /// # Errors
    /// sled cannot stat its files.
    pub fn size_on_disk_bytes(&self) -> Result<u64, Error> {
        match (self.shared.open(), &self.path) {
            (Ok(open), _) => Ok(open.db.size_on_disk()?),
            // Closed: what the directory holds is still a fair answer.
            (Err(_), Some(path)) => directory_size(path).map_err(io_error),
            (Err(error), None) => Err(error),
        }
    }

    /// Applies `batch` (if any) and returns once a flush that started after it was applied
    /// has completed.
    async fn commit_and_flush(&self, batch: Option<Batch>) -> Result<(), Error> {
        let batch = batch.filter(|b| !b.is_empty()).map(SledWrites::new);
        match &self.group {
            Some(group) => {
                let done = group.enqueue(batch)?;
                // A dropped sender means the flusher thread died before serving us.
                done.await.map_err(|_| Error::Closed)?
            }
            None => {
                let shared = Arc::clone(&self.shared);
                let work = move || shared.commit(batch.as_slice());
                match tokio::runtime::Handle::try_current() {
                    Ok(handle) => handle
                        .spawn_blocking(work)
                        .await
                        .map_err(|e| io_error(io::Error::other(format!("commit task: {e}"))))?,
                    // Not inside a tokio runtime: work on this thread.
                    Err(_) => work(),
                }
            }
        }
    }
}

impl fmt::Debug for SledStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.path)
            .field("durability", &self.durability)
            .field("group_commit", &self.group.is_some())
            .field("flush_count", &self.flush_count())
            .finish()
    }
}

#[async_trait::async_trait]
impl Store for SledStore {
    /// Applies the batch as one sled batch (shared with the other batches of its group
    /// under group commit), then waits for a flush that started after it. An empty batch
    /// writes nothing but still waits (it acts as a barrier).
    async fn commit(&self, batch: Batch) -> Result<(), Error> {
        self.commit_and_flush(Some(batch)).await
    }

    // Every read holds the read side of the database lock while it reads (and does not read
    // from a clone of the sled tree after letting go of it): a failed write then waits for
    // the reads in progress before it replaces the database, and no read can go on in the
    // one it replaced. A read can fail like a write: see [`Shared::read`]. The reads are
    // `async` for the trait's sake only: each one is done by its future's first poll.

    async fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.shared.read(|open| {
            let key = stored_key(tree, key);
            match open.records.get(&key)? {
                Some(head) => Ok(Some(values::decode(&open.records, &key, &head)?)),
                None => Ok(None),
            }
        })
    }

    async fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Entry>, Error> {
        self.shared.read(|open| {
            open.records
                .scan_prefix(stored_key(tree, prefix))
                .map(|kv| logical_entry(&open.records, kv))
                .collect()
        })
    }

    async fn scan_prefix_rev(
        &self,
        tree: Tree,
        prefix: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, Error> {
        self.shared.read(|open| {
            open.records
                .scan_prefix(stored_key(tree, prefix))
                .rev()
                .take(limit)
                .map(|kv| logical_entry(&open.records, kv))
                .collect()
        })
    }

    async fn scan_range(
        &self,
        tree: Tree,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, Error> {
        if limit == 0 || from >= to {
            return Ok(Vec::new());
        }
        self.shared.read(|open| {
            open.records
                .range(stored_key(tree, from)..stored_key(tree, to))
                .take(limit)
                .map(|kv| logical_entry(&open.records, kv))
                .collect()
        })
    }

    async fn flush(&self) -> Result<(), Error> {
        self.commit_and_flush(None).await
    }

    /// Flushes, then releases the database (and its lock on the directory) even if other
    /// handles on this store remain: they answer [`Error::Closed`] from then on.
    async fn close(&self) -> Result<(), Error> {
        let flushed = self.commit_and_flush(None).await;
        if flushed.is_ok() {
            self.shared.mark_everything_flushed();
        }
        // Waits for an apply or flush in progress, which holds the read side.
        let open = std::mem::replace(&mut *self.shared.state.write(), State::Closed);
        let_go(open);
        self.shared.wait_reopen_ended(LET_GO_BOUND);
        flushed
    }

    /// Brings a lagging mark up to what was flushed, waits for an apply or flush in progress
    /// (it holds the read side), then drops the database outside the lock (sled flushes as it
    /// drops); queued commits that were never acknowledged fail with [`Error::Closed`].
    fn release(&self) {
        // A lagging mark (at `ProcessCrash`) catches up here too: a runtime dropped without a
        // close releases its store, and a mark left behind would leave its last commits'
        // damage untold for as long as the store stays stopped.
        self.shared.mark_everything_flushed();
        let open = std::mem::replace(&mut *self.shared.state.write(), State::Closed);
        let_go(open);
        self.shared.wait_reopen_ended(LET_GO_BOUND);
    }

    fn is_closed(&self) -> bool {
        matches!(*self.shared.state.read(), State::Closed)
    }

    async fn size_on_disk(&self) -> Result<u64, Error> {
        self.size_on_disk_bytes()
    }

    fn degraded(&self) -> Option<String> {
        if self.shared.full.load(Ordering::Relaxed) {
            return Some(
                "storage_full: the disk is full; commits fail until space is freed".into(),
            );
        }
        let failure = self.shared.failure.lock();
        failure
            .as_ref()
            .map(|why| format!("the last write failed: {why}"))
    }
}

/// How long closing a store waits for sled to let its database go (it flushes as it drops).
const LET_GO_BOUND: std::time::Duration = std::time::Duration::from_secs(10);

/// Drops a closed store's database on a thread of its own, waiting for it [`LET_GO_BOUND`]
/// at most: sled flushes as it drops, and a database a full disk wedged could wait on that
/// flush forever; a shutdown must not (the directory then stays locked until the process
/// ends, which it may now do).
fn let_go(state: State) {
    if !matches!(state, State::Open(_)) {
        return;
    }
    let (done, dropped) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("dormant-store-close".into())
        .spawn(move || {
            drop(state);
            let _ = done.send(());
        });
    if spawned.is_ok() && dropped.recv_timeout(LET_GO_BOUND).is_err() {
        tracing::error!(
            "store: sled did not let the database go within {LET_GO_BOUND:?} (a full disk?); closing without it"
        );
    }
}

/// Bytes of every file under `dir`.
fn directory_size(dir: &Path) -> io::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            directory_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// A stored entry as the [`Store`] API shows it: its key without the tree tag, its value
/// whole (read from its pieces if it has any).
fn logical_entry(records: &::sled::Tree, kv: ::sled::Result<(IVec, IVec)>) -> Result<Entry, Error> {
    let (key, head) = kv?;
    let value = values::decode(records, &key, &head)?;
    Ok((logical_key(&key), value))
}

#[cfg(test)]
mod tests;
