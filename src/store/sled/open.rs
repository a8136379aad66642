//! Configuring and opening a [`SledStore`]: the builder. Opening sled's database on the
//! store's directory is `files.rs`; the durability levels, `durability.rs`.

use std::path::PathBuf;
use std::sync::Arc;

use super::database::Shared;
use super::durability::Durability;
use super::error::io_error;
use super::files::owner_only_files;
use super::flusher;
use super::SledStore;
use crate::store::directory::owner_only_directory;
use crate::store::Error;

/// Configures and opens a [`SledStore`].
///
/// Defaults: [`Durability::PowerLoss`], group commit on, sled's default cache capacity
/// (1 GiB).
///
/// # Examples
///
/// ```no_run
/// use dormant::SledStore;
/// use dormant::store::Durability;
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
    /// reads deeper, copy the directory before opening it at all. A salvage reads values as
    /// this version keeps them: a store written before they had a header byte (before
    /// 2026-11-27) is brought to it only by a normal open.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use dormant::SledStore;
    /// use dormant::store::Error;
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
                owner_only_directory(path, "db").map_err(io_error)?;
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
            Some(flusher::start(Arc::clone(&shared))?)
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
