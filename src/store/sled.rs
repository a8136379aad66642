//! The embedded sled backend ([`SledStore`]); see its documentation for how a commit becomes
//! durable.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ::sled::IVec;
use parking_lot::{
    Condvar, MappedRwLockReadGuard, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard,
};
use tokio::sync::oneshot;

use super::{Batch, Entry, Error, Store, Tree};

mod keyspace;
mod writes;

use keyspace::{logical_key, stored_key, RECORDS};
use writes::SledWrites;

/// How much of a crash an acknowledged commit survives.
///
/// sled 0.34's own `flush()` writes its log with `pwrite` followed by `sync_file_range`
/// (on Linux). That hands the bytes to the kernel and waits for the device to accept them, so
/// the data survives the process being killed at any point; but it does not flush the disk's
/// write-back cache nor the file's metadata, so a power cut or kernel crash can still lose it.
/// sled only calls a real `fsync` from its background thread, every 500 ms.
///
/// * [`Durability::ProcessCrash`]: a commit returns after sled's `flush()`.
/// * [`Durability::PowerLoss`] (the default): a commit returns after sled's `flush()` **and**
///   an `fdatasync` of sled's data file (the file named `db` in the store directory), and of
///   any new large-value files in its `blobs/` directory (sled writes values over about
///   128 KiB there and never syncs them itself). On open, the directory entries are synced too.
///
/// Under group commit the extra `fdatasync` is shared by every commit of a group, so
/// power-loss safety costs little throughput with many concurrent writers. Stores made with
/// [`SledStore::temporary`] are deleted when dropped, so they skip the `fdatasync` (and sled
/// itself skips `sync_file_range` for them) whatever the level.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Durability {
    /// Survives the process being killed (`flush()` only); not a power cut.
    ProcessCrash,
    /// Survives a power cut (`flush()`, then `fdatasync` of the data file). The default.
    #[default]
    PowerLoss,
}

/// Configures and opens a [`SledStore`].
///
/// Defaults: [`Durability::PowerLoss`], group commit on, sled's default cache capacity
/// (1 GiB).
///
/// # Examples
///
/// ```no_run
/// use dormant::store::{Durability, SledStore};
///
/// fn main() -> Result<(), dormant::store::Error> {
///     let store = SledStore::builder("/var/lib/my-agent/store")
///         .durability(Durability::ProcessCrash)
///         .group_commit(true)
///         .cache_capacity(256 * 1024 * 1024)
///         .open()?;
///     println!("{store:?} uses {} bytes on disk", store.size_on_disk_bytes()?);
///     Ok(())
/// }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `open` is called"]
pub struct SledStoreBuilder {
    /// `None` for a temporary store.
    path: Option<PathBuf>,
    durability: Durability,
    group_commit: bool,
    cache_capacity: Option<u64>,
}

impl SledStoreBuilder {
    /// A builder for a store in the directory `path` (created if missing).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: Some(path.into()),
            durability: Durability::default(),
            group_commit: true,
            cache_capacity: None,
        }
    }

    /// A builder for a temporary store in a fresh directory that is removed when the store is
    /// dropped (for tests). Temporary stores never `fdatasync`; see [`Durability`].
    pub fn temporary() -> Self {
        Self {
            path: None,
            durability: Durability::default(),
            group_commit: true,
            cache_capacity: None,
        }
    }

    /// Sets what an acknowledged commit survives (default [`Durability::PowerLoss`]).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Turns group commit on or off (default on).
    ///
    /// On: concurrent commits share flushes through a dedicated flusher thread. Off: every
    /// commit does its own flush (+ `fdatasync`) on tokio's blocking pool, which is simpler but
    /// caps throughput at one commit per flush.
    pub fn group_commit(mut self, on: bool) -> Self {
        self.group_commit = on;
        self
    }

    /// Sets sled's page cache capacity in bytes (sled's default is 1 GiB).
    pub fn cache_capacity(mut self, bytes: u64) -> Self {
        self.cache_capacity = Some(bytes);
        self
    }

    /// Opens (or creates) the store.
    ///
    /// # Errors
    /// [`Error::Locked`] when another process (or another open store of this process) still
    /// holds the directory after half a second; [`Error::StorageFull`] when the disk is full;
    /// otherwise sled cannot open the directory, or, at [`Durability::PowerLoss`], the data
    /// file or directories cannot be opened or synced.
    pub fn open(self) -> Result<SledStore, Error> {
        let mut config = ::sled::Config::new();
        match &self.path {
            Some(path) => config = config.path(path),
            None => config = config.temporary(true),
        }
        if let Some(bytes) = self.cache_capacity {
            config = config.cache_capacity(bytes);
        }
        let shared = Arc::new(Shared::start(config, self.path.clone(), self.durability)?);
        let group = if self.group_commit {
            Some(GroupFlusher::start(Arc::clone(&shared))?)
        } else {
            None
        };
        Ok(SledStore {
            shared,
            group,
            path: self.path,
            durability: self.durability,
        })
    }
}

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
/// Grouping keeps every batch all-or-nothing (a group is all-or-nothing as a whole). A commit is
/// never acknowledged before its flush has succeeded; a failed apply or flush fails every
/// commit of its group.
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
/// failed commits hear of it: from then on, readers see what is on disk. Reads wait while
/// that happens. A read can fail the same way (sled writes while it reads: it finishes the
/// splits and merges of the tree nodes it walks through): it is handled like a failed write,
/// and fails with [`Error::StorageFull`] on a full disk too. While the disk stays full,
/// opening the database can fail as well (sled needs a little space to open); the store then
/// has no database, and every read and commit tries to open it again, failing with
/// [`Error::StorageFull`] until there is room. An open that
/// failed so can leave behind a snapshot file sled never finished, which sled itself would
/// take for corruption at every later open; the store removes it and opens again. A temporary
/// store is opened again the same way: its directory stays until the store is dropped.
///
/// # Examples
///
/// ```
/// use dormant::store::{Batch, CommitKind, SledStore, Store, Tree};
///
/// fn main() -> Result<(), dormant::store::Error> {
///     let store = SledStore::temporary()?;
///
///     let mut batch = Batch::new(CommitKind::RunStart);
///     batch.put(Tree::Sessions, b"s1".to_vec(), b"snapshot".to_vec());
///     batch.put(Tree::Log, b"s1/0001".to_vec(), b"hello".to_vec());
///     // `commit` is async; any executor works with group commit on.
///     futures::executor::block_on(store.commit(batch))?;
///
///     assert_eq!(store.get(Tree::Sessions, b"s1")?, Some(b"snapshot".to_vec()));
///     assert_eq!(store.scan_prefix(Tree::Log, b"s1/")?.len(), 1);
///     assert!(store.flush_count() >= 1);
///     Ok(())
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
    /// the trait in scope).
    ///
    /// # Errors
    /// sled cannot stat its files.
    pub fn size_on_disk_bytes(&self) -> Result<u64, Error> {
        match (self.shared.open(), &self.path) {
            (Ok(open), _) => Ok(open.db.size_on_disk()?),
            // Closed: what the directory holds is still a fair answer.
            (Err(_), Some(path)) => Ok(directory_size(path)?),
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
                        .map_err(|e| Error::Io(io::Error::other(format!("commit task: {e}"))))?,
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
    // one it replaced. A read can fail like a write: see [`Shared::read`].

    fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.shared
            .read(|open| Ok(open.records.get(stored_key(tree, key))?.map(|v| v.to_vec())))
    }

    fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Entry>, Error> {
        self.shared.read(|open| {
            open.records
                .scan_prefix(stored_key(tree, prefix))
                .map(logical_entry)
                .collect()
        })
    }

    fn scan_prefix_rev(
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
                .map(logical_entry)
                .collect()
        })
    }

    fn scan_range(
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
                .map(logical_entry)
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
        // Waits for an apply or flush in progress, which holds the read side.
        let open = std::mem::replace(&mut *self.shared.state.write(), State::Closed);
        drop(open);
        flushed
    }

    /// Waits for an apply or flush in progress (it holds the read side), then drops the
    /// database outside the lock (sled flushes as it drops); queued commits that were never
    /// acknowledged fail with [`Error::Closed`].
    fn release(&self) {
        let open = std::mem::replace(&mut *self.shared.state.write(), State::Closed);
        drop(open);
    }

    fn size_on_disk(&self) -> Result<u64, Error> {
        self.size_on_disk_bytes()
    }
}

/// How long [`open_db`] waits for sled's directory lock to be released.
const LOCK_RETRY: Duration = Duration::from_millis(10);
const LOCK_RETRIES: u32 = 50;

/// Opens sled, waiting up to half a second for its directory lock; a lock still held then is
/// [`Error::Locked`] (naming `path`, the store directory, `None` for a temporary store).
///
/// Why wait: sled writes its log buffers from I/O threads, each holding a handle on the data
/// file, and it wakes a flush's waiters before that thread has let go of the handle. So right
/// after the last handle on a database is dropped, the file (and the lock on it) can stay
/// open for a moment, and reopening the directory in the same process fails now and then (a
/// store unit test that reopens at once failed in 1–2 of 40 runs). A lock that another process
/// holds still fails, half a second later.
///
/// An open that fails with `Corruption` is tried once more after removing the snapshots sled
/// never finished writing (see [`remove_unfinished_snapshots`]).
fn open_db(config: &::sled::Config, path: Option<&Path>) -> Result<::sled::Db, Error> {
    let mut retries = 0;
    let mut cleared_snapshots = false;
    loop {
        match config.open() {
            // Once only: if it fails again, the corruption is real. `get_path` is the directory
            // sled opens, a temporary store's too.
            Err(error @ ::sled::Error::Corruption { .. }) if !cleared_snapshots => {
                cleared_snapshots = true;
                if remove_unfinished_snapshots(&config.get_path())? == 0 {
                    return Err(error.into());
                }
            }
            // sled reports the lock as `ErrorKind::Other`: only its message tells it apart.
            Err(::sled::Error::Io(e)) if e.to_string().contains("could not acquire lock") => {
                if retries < LOCK_RETRIES {
                    retries += 1;
                    std::thread::sleep(LOCK_RETRY);
                    continue;
                }
                return Err(match path {
                    Some(path) => Error::Locked {
                        path: path.to_owned(),
                    },
                    // Nobody else knows a temporary store's directory: keep sled's words.
                    None => ::sled::Error::Io(e).into(),
                });
            }
            opened => return Ok(opened?),
        }
    }
}

/// Removes the snapshot files sled began and never finished from the database directory `dir`;
/// returns how many there were.
///
/// Why: sled 0.34 writes a snapshot only while it opens a database, holding its lock on the
/// database: to `snap.<lsn>.generating`, renamed to `snap.<lsn>` once written. When the disk
/// is full, the write fails and the unfinished file stays (often empty). sled's own reader does
/// not skip such files: it reads the newest `snap.*` file, which is that one, and fails the open
/// with `Corruption` — every open from then on, even once space is freed, and in every later
/// process. Nothing in such a file was ever used (the rename is what makes a snapshot count),
/// so it can go, and sled rebuilds the snapshot from the previous one and its log.
///
/// This runs only right after an open of this store failed with `Corruption`: that open held
/// sled's lock, so no other one was writing a snapshot then. Another process that takes the
/// lock in the moment between that failure and this removal, and writes its own snapshot of
/// the same name, would lose it and fail its open: a far narrower race than the wedged store
/// this replaces.
fn remove_unfinished_snapshots(dir: &Path) -> Result<usize, Error> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e.into()),
            }
            tracing::warn!(file = %entry.path().display(), "store: removed a snapshot sled never finished writing (a full disk, say)");
            removed += 1;
        }
    }
    Ok(removed)
}

/// Refuses a store written by an earlier layout (one sled tree per logical tree) rather than
/// showing its sessions as if they did not exist: any non-empty sled tree other than sled's
/// default tree and [`RECORDS`] is one.
fn refuse_old_layout(db: &::sled::Db) -> Result<(), Error> {
    for name in db.tree_names() {
        // `__sled__default` is the tree sled itself keeps in every database.
        if name == RECORDS.as_bytes() || name == b"__sled__default" {
            continue;
        }
        if !db.open_tree(&name)?.is_empty() {
            return Err(Error::OldLayout {
                tree: String::from_utf8_lossy(&name).into_owned(),
            });
        }
    }
    Ok(())
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

/// A stored entry as the [`Store`] API shows it: its key without the tree tag.
fn logical_entry(kv: ::sled::Result<(IVec, IVec)>) -> Result<Entry, Error> {
    let (key, value) = kv?;
    Ok((logical_key(&key), value.to_vec()))
}

/// An open database.
struct Open {
    db: ::sled::Db,
    /// The one sled tree every logical tree lives in (see [`keyspace`]).
    records: ::sled::Tree,
    /// `Some` at [`Durability::PowerLoss`] for a non-temporary store.
    syncer: Option<Syncer>,
    /// Which opening of the database this is (0 first, then one more after each failed
    /// write), so that several commits that failed on the same database replace it once.
    generation: u64,
}

/// What the store holds of its database.
enum State {
    Open(Open),
    /// A write failed, the database was dropped, and opening it again failed as well (the
    /// disk is still full, say): the next operation tries again.
    Failed,
    /// Taken out by [`Store::close`] or [`Store::release`].
    Closed,
}

impl State {
    fn open(&self) -> Option<&Open> {
        match self {
            State::Open(open) => Some(open),
            State::Failed | State::Closed => None,
        }
    }
}

/// What the store, its flusher thread and its blocking flush tasks share.
struct Shared {
    /// The configuration the database is opened with, the first time and after each failed
    /// write. For a temporary store it also keeps the directory alive across a reopen: sled
    /// deletes a temporary store's directory when the last handle on its configuration goes.
    config: ::sled::Config,
    /// `None` for a temporary store.
    path: Option<PathBuf>,
    durability: Durability,
    state: RwLock<State>,
    /// How many times the database was opened: the generation of the next one.
    opened: AtomicU64,
    flushes: AtomicU64,
    /// Makes every flush fail while set (tests of error propagation).
    #[cfg(test)]
    fail_flushes: std::sync::atomic::AtomicBool,
    /// Number of sled batches applied.
    #[cfg(test)]
    applied_batches: AtomicU64,
}

/// A group's batches are applied as sled batches of about this many writes, so that one
/// application (which holds sled's global write lock) stays bounded.
const MAX_WRITES_PER_SLED_BATCH: usize = 4096;

impl Shared {
    /// Opens the database.
    fn start(
        config: ::sled::Config,
        path: Option<PathBuf>,
        durability: Durability,
    ) -> Result<Self, Error> {
        let mut shared = Self {
            config,
            path,
            durability,
            state: RwLock::new(State::Failed),
            opened: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            #[cfg(test)]
            fail_flushes: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            applied_batches: AtomicU64::new(0),
        };
        *shared.state.get_mut() = State::Open(shared.open_database()?);
        Ok(shared)
    }

    /// Opens the database from its files (at start, and again after a failed write).
    fn open_database(&self) -> Result<Open, Error> {
        let open = || -> Result<Open, Error> {
            let db = open_db(&self.config, self.path.as_deref())?;
            refuse_old_layout(&db)?;
            let records = db.open_tree(RECORDS)?;
            let syncer = match (&self.path, self.durability) {
                (Some(path), Durability::PowerLoss) => Some(Syncer::open(path)?),
                _ => None,
            };
            Ok(Open {
                db,
                records,
                syncer,
                generation: self.opened.fetch_add(1, Ordering::Relaxed),
            })
        };
        open().map_err(|error| self.classify(error))
    }

    /// Turns a full disk or an exhausted quota, however sled or the file system reported it,
    /// into [`Error::StorageFull`]. sled hands out copies of its I/O errors that keep the
    /// error's kind but not its OS error number, so the kind is what tells.
    fn classify(&self, error: Error) -> Error {
        let kind = match &error {
            Error::Sled(::sled::Error::Io(e)) | Error::Io(e) => e.kind(),
            _ => return error,
        };
        match kind {
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => Error::StorageFull {
                path: self.path.clone(),
                kind,
            },
            _ => error,
        }
    }

    /// The open database, or [`Error::Closed`]. If a failed write left no database, opens it
    /// first (and fails as that does, for example with [`Error::StorageFull`] while the disk
    /// is still full).
    fn open(&self) -> Result<MappedRwLockReadGuard<'_, Open>, Error> {
        let mut state = self.state.read();
        if matches!(*state, State::Failed) {
            drop(state);
            let mut write = self.state.write();
            if matches!(*write, State::Failed) {
                *write = State::Open(self.open_database()?);
            }
            state = RwLockWriteGuard::downgrade(write);
        }
        RwLockReadGuard::try_map(state, State::open).map_err(|_| Error::Closed)
    }

    /// Runs `read` on the open database.
    ///
    /// A read can fail with a write's error: sled 0.34 finishes the splits and merges of tree
    /// nodes that a read walks through, which are log writes, and once one of its log writes
    /// has failed (a full disk) it fails them all, for good. So a read that fails with an I/O
    /// error is handled like a failed write: the database is opened again from its files
    /// before the error is returned (else reads would fail until some commit failed too), and
    /// a full disk is [`Error::StorageFull`], which the caller can retry.
    fn read<T>(&self, read: impl FnOnce(&Open) -> Result<T, Error>) -> Result<T, Error> {
        let failed = {
            let open = self.open()?;
            match read(&open) {
                Ok(value) => return Ok(value),
                Err(error) => (error, open.generation),
            }
        };
        let (error, generation) = failed;
        if matches!(error, Error::Sled(::sled::Error::Io(_))) {
            self.replace_failed(generation);
        }
        Err(self.classify(error))
    }

    /// Applies `batches` and does one flush (a bare flush when there are none), all on the
    /// same database.
    ///
    /// When any of it fails, the database is replaced with one opened again from its files
    /// before this returns (see [`Shared::replace_failed`]); the error is the failure's.
    fn commit(&self, batches: &[SledWrites]) -> Result<(), Error> {
        let failed = {
            let open = self.open()?;
            match self.apply_group_and_flush(&open, batches) {
                Ok(()) => return Ok(()),
                Err(error) => (error, open.generation),
            }
        };
        let (error, generation) = failed;
        self.replace_failed(generation);
        Err(self.classify(error))
    }

    /// Drops the database of `generation`, after a write on it failed, and opens it again from
    /// its files; if it cannot be opened (the disk is still full, say), the next operation
    /// tries again.
    ///
    /// Why: sled 0.34 records an I/O error of its log writer (a full disk) as a global error
    /// and fails every later operation of that database with it, even once space is freed;
    /// only a new `sled::Db` starts afresh. And a batch that sled applied in memory but could
    /// not write stays readable in the failed database, although it would vanish after a
    /// restart: the database opened again shows what is on disk, nothing more.
    ///
    /// This takes the write side of the lock, so it waits for reads in progress, and later
    /// ones wait until the database is open again. Several commits that failed on the same
    /// database (without group commit) replace it once.
    fn replace_failed(&self, generation: u64) {
        let mut state = self.state.write();
        if !matches!(&*state, State::Open(open) if open.generation == generation) {
            // Already replaced, closed, or waiting for the next operation to open it.
            return;
        }
        // The failed database must be gone before it is opened again: it holds the
        // directory's lock. sled does not flush a database that recorded a global error as it
        // drops.
        *state = State::Failed;
        match self.open_database() {
            Ok(open) => *state = State::Open(open),
            Err(error) => {
                tracing::warn!(%error, "store: reopening the database after a failed write failed; the next operation tries again");
            }
        }
    }

    /// Applies `batches` as one sled batch: all or nothing, after a crash too. A key written
    /// by several of them ends with the last write, as if they were applied in order.
    fn apply(&self, open: &Open, batches: &[SledWrites]) -> Result<(), Error> {
        let mut sled_batch = ::sled::Batch::default();
        for writes in batches {
            writes.add_to(&mut sled_batch);
        }
        open.records.apply_batch(sled_batch)?;
        #[cfg(test)]
        self.applied_batches.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Applies a group's batches in as few sled batches as [`MAX_WRITES_PER_SLED_BATCH`]
    /// allows (a batch is never split), then does one flush.
    fn apply_group_and_flush(&self, open: &Open, batches: &[SledWrites]) -> Result<(), Error> {
        let mut start = 0;
        let mut writes = 0;
        for (i, batch) in batches.iter().enumerate() {
            if writes > 0 && writes + batch.len() > MAX_WRITES_PER_SLED_BATCH {
                self.apply(open, &batches[start..i])?;
                start = i;
                writes = 0;
            }
            writes += batch.len();
        }
        if start < batches.len() {
            self.apply(open, &batches[start..])?;
        }
        self.flush_durable(open)
    }

    /// One physical flush: sled's `flush()`, then the `fdatasync`s of the durability level.
    fn flush_durable(&self, open: &Open) -> Result<(), Error> {
        #[cfg(test)]
        if self.fail_flushes.load(Ordering::SeqCst) {
            return Err(Error::Io(io::Error::other("injected flush failure")));
        }
        open.db.flush()?;
        if let Some(syncer) = &open.syncer {
            syncer.sync()?;
        }
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The `fdatasync` half of [`Durability::PowerLoss`].
struct Syncer {
    /// A second handle on sled's data file `<dir>/db` (sled's own handle is private).
    data: File,
    blobs_dir: PathBuf,
    /// Blob files already synced (sled never rewrites a blob file; it writes new ones).
    synced_blobs: Mutex<HashSet<OsString>>,
}

impl Syncer {
    /// Opens sled's data file and makes the directory entries sled just created durable.
    fn open(dir: &Path) -> Result<Self, Error> {
        // `write(true)` without create or truncate: some platforms need write access to sync.
        let data = OpenOptions::new().write(true).open(dir.join("db"))?;
        data.sync_data()?;
        let conf = dir.join("conf");
        if conf.exists() {
            File::open(&conf)?.sync_all()?;
        }
        let blobs_dir = dir.join("blobs");
        sync_dir(&blobs_dir)?;
        sync_dir(dir)?;
        if let Some(parent) = dir.parent() {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            sync_dir(parent)?;
        }
        Ok(Self {
            data,
            blobs_dir,
            synced_blobs: Mutex::new(HashSet::new()),
        })
    }

    fn sync(&self) -> Result<(), Error> {
        self.sync_blobs()?;
        self.data.sync_data()?;
        Ok(())
    }

    /// Syncs every blob file not synced yet, then the blob directory if any was new.
    fn sync_blobs(&self) -> Result<(), Error> {
        let mut synced = self.synced_blobs.lock();
        let mut present = HashSet::with_capacity(synced.len());
        let mut any_new = false;
        for entry in std::fs::read_dir(&self.blobs_dir)? {
            let name = entry?.file_name();
            if !synced.contains(&name) {
                match File::open(self.blobs_dir.join(&name)) {
                    Ok(file) => file.sync_data()?,
                    // Garbage-collected by sled in the meantime.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e.into()),
                }
                any_new = true;
            }
            present.insert(name);
        }
        if any_new {
            sync_dir(&self.blobs_dir)?;
        }
        // Forget blobs sled has removed.
        *synced = present;
        Ok(())
    }
}

/// Makes a directory's entries durable (a no-op where directories cannot be opened).
fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// Duplicates an error for every commit that waited on the same failed flush.
fn duplicate(error: &Error) -> Error {
    match error {
        Error::Sled(e) => Error::Sled(e.clone()),
        Error::Io(e) => Error::Io(io::Error::new(e.kind(), e.to_string())),
        Error::StorageFull { path, kind } => Error::StorageFull {
            path: path.clone(),
            kind: *kind,
        },
        Error::Locked { path } => Error::Locked { path: path.clone() },
        Error::Closed => Error::Closed,
        Error::OldLayout { tree } => Error::OldLayout { tree: tree.clone() },
        Error::Injected(kind) => Error::Injected(*kind),
    }
}

type Waiter = oneshot::Sender<Result<(), Error>>;

/// A committer waiting for the flusher: its batch (`None` for a bare flush) and its wake-up.
struct Pending {
    batch: Option<SledWrites>,
    done: Waiter,
}

/// The queue between committers and the flusher thread.
struct Queue {
    state: Mutex<QueueState>,
    wake: Condvar,
}

struct QueueState {
    pending: Vec<Pending>,
    /// Set by the store's drop: serve what is queued, then exit.
    shutdown: bool,
    /// Set when the flusher thread has exited (normally or by a panic): refuse new waiters.
    closed: bool,
}

/// The group-commit flusher thread and its queue; stops the thread when dropped.
struct GroupFlusher {
    queue: Arc<Queue>,
    thread: Option<JoinHandle<()>>,
}

impl GroupFlusher {
    fn start(shared: Arc<Shared>) -> Result<Self, Error> {
        let queue = Arc::new(Queue {
            state: Mutex::new(QueueState {
                pending: Vec::new(),
                shutdown: false,
                closed: false,
            }),
            wake: Condvar::new(),
        });
        let thread_queue = Arc::clone(&queue);
        let thread = std::thread::Builder::new()
            .name("dormant-store-flusher".into())
            .spawn(move || run_flusher(&shared, &thread_queue))?;
        Ok(Self {
            queue,
            thread: Some(thread),
        })
    }

    /// Queues a batch (or a bare flush) for the next group.
    fn enqueue(
        &self,
        batch: Option<SledWrites>,
    ) -> Result<oneshot::Receiver<Result<(), Error>>, Error> {
        let (done, rx) = oneshot::channel();
        let mut state = self.queue.state.lock();
        if state.closed || state.shutdown {
            return Err(Error::Closed);
        }
        state.pending.push(Pending { batch, done });
        drop(state);
        self.queue.wake.notify_one();
        Ok(rx)
    }
}

impl Drop for GroupFlusher {
    fn drop(&mut self) {
        self.queue.state.lock().shutdown = true;
        self.queue.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            // Joining makes sure the thread's handle on the database is gone (so the directory
            // can be reopened at once). A panic in the thread was already reported to waiters.
            let _ = thread.join();
        }
    }
}

/// Marks the queue closed and fails the queued waiters when the flusher thread exits, even by
/// a panic.
struct ExitGuard<'a>(&'a Queue);

impl Drop for ExitGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        state.closed = true;
        // Dropping the senders wakes their receivers with `Error::Closed`.
        state.pending.clear();
    }
}

fn run_flusher(shared: &Shared, queue: &Queue) {
    let _guard = ExitGuard(queue);
    loop {
        let pending = {
            let mut state = queue.state.lock();
            while state.pending.is_empty() && !state.shutdown {
                queue.wake.wait(&mut state);
            }
            if state.pending.is_empty() {
                // Shut down and nothing left to serve.
                return;
            }
            std::mem::take(&mut state.pending)
        };
        let mut batches = Vec::with_capacity(pending.len());
        let mut waiters = Vec::with_capacity(pending.len());
        for Pending { batch, done } in pending {
            batches.extend(batch);
            waiters.push(done);
        }
        // The flush starts after every batch of the group is applied, so it covers them all.
        // A failed group has had its database replaced before its committers hear of it.
        let result = shared.commit(&batches);
        drop(batches);
        for waiter in waiters {
            let outcome = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(duplicate(e)),
            };
            // The committer may have given up (its future was dropped); nothing to do then.
            let _ = waiter.send(outcome);
        }
        if let Err(e) = &result {
            tracing::error!(error = %e, "store group commit failed; every commit of the group failed");
        }
    }
}

#[cfg(test)]
mod tests;
