//! Configuring and opening a [`SledStore`]: the builder and its [`Durability`] level, sled's
//! directory lock, snapshots a full disk left unfinished, and the refusal of a store written by
//! an earlier layout.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::database::Shared;
use super::error::{io_error, SledError};
use super::flusher::GroupFlusher;
use super::keyspace::RECORDS;
use super::mark;
use super::SledStore;
use crate::store::{Damage, Error};

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
    salvage: bool,
}

impl SledStoreBuilder {
    /// A builder for a store in the directory `path` (created if missing).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: Some(path.into()),
            durability: Durability::default(),
            group_commit: true,
            cache_capacity: None,
            salvage: false,
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
            salvage: false,
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

    /// Opens the store to salvage what is left of it: read-only, and even if it is damaged
    /// (a store that holds less than it acknowledged otherwise refuses to open with
    /// [`Error::Damaged`]). [`SledStore::damage`] says what was lost; every commit fails
    /// with [`Error::ReadOnly`]. What sled itself cannot read stays refused.
    ///
    /// The store keeps its mark as it found it, so it stays refused when opened normally
    /// again. sled, though, rewrites parts of its own files whenever it opens them (it does
    /// so on the refused open too): to keep the damaged bytes as they were, for a tool that
    /// reads deeper, copy the directory before opening it at all.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use dormant::store::{Error, SledStore};
    ///
    /// match SledStore::open("/var/lib/my-agent/store") {
    ///     Err(Error::Damaged { damage, .. }) => {
    ///         eprintln!("damaged: {damage}; reading what is left");
    ///         let left = SledStore::builder("/var/lib/my-agent/store").salvage().open()?;
    ///         assert!(left.damage().is_some());
    ///     }
    ///     other => drop(other?),
    /// }
    /// # Ok::<(), Error>(())
    /// ```
    pub fn salvage(mut self) -> Self {
        self.salvage = true;
        self
    }

    /// Opens (or creates) the store, and checks that it holds all it acknowledged (a scan of
    /// the whole store: see [`SledStore`]). A new store's directory is made the owner's alone
    /// (`0700`, and its files `0600`), and an existing one's is narrowed to that.
    ///
    /// # Errors
    /// [`Error::Locked`] when another process (or another open store of this process) still
    /// holds the directory after half a second; [`Error::StorageFull`] when the disk is full;
    /// [`Error::Damaged`] when the store holds less than it acknowledged or sled cannot read
    /// its files; otherwise sled cannot open the directory, or, at [`Durability::PowerLoss`],
    /// the data file or directories cannot be opened or synced.
    pub fn open(self) -> Result<SledStore, Error> {
        let mut config = ::sled::Config::new();
        match &self.path {
            Some(path) => {
                owner_only_directory(path).map_err(io_error)?;
                config = config.path(path);
            }
            None => config = config.temporary(true),
        }
        if let Some(bytes) = self.cache_capacity {
            config = config.cache_capacity(bytes);
        }
        let shared = Arc::new(Shared::start(
            config,
            self.path.clone(),
            self.durability,
            self.salvage,
        )?);
        if let Some(path) = &self.path {
            owner_only_files(path).map_err(io_error)?;
        }
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
pub(super) fn open_db(config: &::sled::Config, path: Option<&Path>) -> Result<::sled::Db, Error> {
    let mut retries = 0;
    let mut cleared_snapshots = false;
    loop {
        match config.open() {
            // Once only: if it fails again, the corruption is real. `get_path` is the directory
            // sled opens, a temporary store's too.
            Err(error @ ::sled::Error::Corruption { .. }) => {
                if cleared_snapshots
                    || remove_unfinished_snapshots(&config.get_path()).map_err(io_error)? == 0
                {
                    return Err(Error::Damaged {
                        path: path.map(Path::to_owned),
                        damage: Damage::Unreadable {
                            reason: format!("sled: {error}"),
                        },
                    });
                }
                cleared_snapshots = true;
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

/// Creates the store directory `dir` for its owner alone (`0700`): sessions hold what people
/// typed. An existing directory is narrowed to that if it is a store already, or empty; one
/// that holds other things is left as it is (with a warning): it is not the store's to change.
fn owner_only_directory(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let mode = std::fs::metadata(dir)?.permissions().mode();
        if mode & 0o077 == 0 {
            return Ok(());
        }
        let ours = dir.join("db").is_file() || std::fs::read_dir(dir)?.next().is_none();
        if ours {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o700))?;
            tracing::info!(dir = %dir.display(), "store: directory narrowed to its owner (0700)");
        } else {
            tracing::warn!(dir = %dir.display(), "store: the directory holds other files and others may read it; a directory of its own would be the owner's alone");
        }
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(dir)?;
    Ok(())
}

/// Makes the files kept in the store directory `dir` (sled's `db`, `conf`, `snap.*` and
/// `blobs/`, and the mark, `acknowledged`) its owner's alone (`0600`, `0700` for `blobs/`): sled creates them as the process's umask
/// has it. It writes new snapshot files only while it opens a database, and no large-value
/// file (values are kept in pieces), so after an opening none is left behind.
fn owner_only_files(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let narrow = |path: &Path, wanted: u32| -> io::Result<()> {
            let mode = match std::fs::metadata(path) {
                Ok(meta) => meta.permissions().mode(),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e),
            };
            if mode & 0o777 & !wanted != 0 {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & wanted))?;
            }
            Ok(())
        };
        for entry in std::fs::read_dir(dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if name == "db" || name == "conf" || name == mark::FILE || name.starts_with("snap.") {
                narrow(&dir.join(&*name), 0o600)?;
            }
        }
        let blobs = dir.join("blobs");
        if blobs.is_dir() {
            narrow(&blobs, 0o700)?;
            for entry in std::fs::read_dir(&blobs)? {
                narrow(&entry?.path(), 0o600)?;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
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
fn remove_unfinished_snapshots(dir: &Path) -> io::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
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
pub(super) fn refuse_old_layout(db: &::sled::Db) -> Result<(), Error> {
    for name in db.tree_names() {
        // `__sled__default` is the tree sled itself keeps in every database.
        if name == RECORDS.as_bytes() || name == b"__sled__default" {
            continue;
        }
        if !db.open_tree(&name)?.is_empty() {
            return Err(SledError::OldLayout {
                tree: String::from_utf8_lossy(&name).into_owned(),
            }
            .into());
        }
    }
    Ok(())
}
