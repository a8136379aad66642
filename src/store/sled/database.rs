//! The store's sled database: opened (and opened again after a failed write), written a group
//! of batches at a time, and flushed to the [`Durability`] level; the [`SledStore`] reads it and
//! its flusher thread writes it.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{MappedRwLockReadGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::error::{io_error, SledError};
use super::keyspace::RECORDS;
use super::open::{open_db, refuse_old_layout, Durability};
use super::syncer::Syncer;
use super::writes::SledWrites;
#[cfg(doc)]
use super::SledStore;
use crate::store::Error;
#[cfg(doc)]
use crate::store::Store;

/// An open database.
pub(super) struct Open {
    pub(super) db: ::sled::Db,
    /// The one sled tree every logical tree lives in (see [`keyspace`](super::keyspace)).
    pub(super) records: ::sled::Tree,
    /// `Some` at [`Durability::PowerLoss`] for a non-temporary store.
    syncer: Option<Syncer>,
    /// Which opening of the database this is (0 first, then one more after each failed
    /// write), so that several commits that failed on the same database replace it once.
    pub(super) generation: u64,
}

/// What the store holds of its database.
pub(super) enum State {
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
pub(super) struct Shared {
    /// The configuration the database is opened with, the first time and after each failed
    /// write. For a temporary store it also keeps the directory alive across a reopen: sled
    /// deletes a temporary store's directory when the last handle on its configuration goes.
    config: ::sled::Config,
    /// `None` for a temporary store.
    path: Option<PathBuf>,
    durability: Durability,
    pub(super) state: RwLock<State>,
    /// How many times the database was opened: the generation of the next one.
    pub(super) opened: AtomicU64,
    pub(super) flushes: AtomicU64,
    /// Makes every flush fail while set (tests of error propagation).
    #[cfg(test)]
    pub(super) fail_flushes: std::sync::atomic::AtomicBool,
    /// Number of sled batches applied.
    #[cfg(test)]
    pub(super) applied_batches: AtomicU64,
}

/// A group's batches are applied as sled batches of about this many writes, so that one
/// application (which holds sled's global write lock) stays bounded.
pub(super) const MAX_WRITES_PER_SLED_BATCH: usize = 4096;

impl Shared {
    /// Opens the database.
    pub(super) fn start(
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
                (Some(path), Durability::PowerLoss) => Some(Syncer::open(path).map_err(io_error)?),
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
        let Some(kind) = error
            .downcast_ref::<SledError>()
            .and_then(SledError::io_kind)
        else {
            return error;
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
    pub(super) fn open(&self) -> Result<MappedRwLockReadGuard<'_, Open>, Error> {
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
    pub(super) fn read<T>(&self, read: impl FnOnce(&Open) -> Result<T, Error>) -> Result<T, Error> {
        let failed = {
            let open = self.open()?;
            match read(&open) {
                Ok(value) => return Ok(value),
                Err(error) => (error, open.generation),
            }
        };
        let (error, generation) = failed;
        if matches!(
            error.downcast_ref::<SledError>(),
            Some(SledError::Sled(::sled::Error::Io(_)))
        ) {
            self.replace_failed(generation);
        }
        Err(self.classify(error))
    }

    /// Applies `batches` and does one flush (a bare flush when there are none), all on the
    /// same database.
    ///
    /// When any of it fails, the database is replaced with one opened again from its files
    /// before this returns (see [`Shared::replace_failed`]); the error is the failure's.
    pub(super) fn commit(&self, batches: &[SledWrites]) -> Result<(), Error> {
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
    pub(super) fn replace_failed(&self, generation: u64) {
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
            return Err(io_error(io::Error::other("injected flush failure")));
        }
        open.db.flush()?;
        if let Some(syncer) = &open.syncer {
            syncer.sync().map_err(io_error)?;
        }
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
