//! The store's sled database: opened (and opened again after a failed write), written a group
//! of batches at a time, and flushed to the [`Durability`] level; the [`SledStore`] reads it and
//! its flusher thread writes it.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use ::sled::IVec;
use parking_lot::{MappedRwLockReadGuard, Mutex, RwLock, RwLockReadGuard};

use super::check::{verify, Check, Depth};
use super::durability::Durability;
use super::error::{io_error, SledError};
use super::files::{open_db, refuse_old_layout};
use super::syncer::Syncer;
use super::values::{owner_of_piece, PIECES_TAG};
use super::writes::SledWrites;
#[cfg(doc)]
use super::SledStore;
use crate::store::keyspace::RECORDS;
use crate::store::mark::{self, Mark};
#[cfg(doc)]
use crate::store::Store;
use crate::store::{Damage, Error};

/// An open database.
pub(super) struct Open {
    pub(super) db: ::sled::Db,
    /// The one sled tree every logical tree lives in (see [`keyspace`](super::keyspace)).
    pub(super) records: ::sled::Tree,
    /// `Some` for a non-temporary store: it syncs every flush at [`Durability::PowerLoss`],
    /// and before the mark moves at [`Durability::ProcessCrash`].
    syncer: Option<Syncer>,
    /// Which opening of the database this is (0 first, then one more after each failed
    /// write), so that several commits that failed on the same database replace it once.
    pub(super) generation: u64,
    /// The values kept in pieces, by stored key, with how many pieces each has (see
    /// [`values`](super::values)): what a write of one of them must remove.
    pub(super) pieced: Mutex<HashMap<IVec, u32>>,
    /// The record of what the database holds after the last batch applied (see
    /// [`check`](super::check)); its lock is held while a batch is applied, so that the old
    /// values it reads are those the batch replaces.
    check: Mutex<Check>,
    /// `None` for a temporary store and one opened to salvage (which writes nothing).
    mark: Option<Mark>,
    /// The last batch a flush covered.
    flushed: AtomicU64,
    /// The last batch the database held when it was opened: what a commit whose write failed
    /// on the database before compares its group with (not the record now, which later
    /// commits on this one move on, with numbers the failed group's took).
    recovered: u64,
}

/// What the store holds of its database.
pub(super) enum State {
    Open(Box<Open>),
    /// A write failed, the database was dropped, and opening it again failed as well (the
    /// disk is still full, say): the next operation tries again.
    Failed,
    /// A write failed, and the failed database is being let go and opened again (by a thread
    /// of its own, or by the operation that found it [`State::Failed`]), outside the state's
    /// lock: other operations fail within [`REOPEN_PATIENCE`] meanwhile.
    Reopening,
    /// Taken out by [`Store::close`] or [`Store::release`].
    Closed,
}

impl State {
    fn open(&self) -> Option<&Open> {
        match self {
            State::Open(open) => Some(&**open),
            State::Failed | State::Reopening | State::Closed => None,
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
    /// Opened to salvage what a damage left: read-only, whatever it found.
    salvage: bool,
    /// What the opening found lost, when opened to salvage.
    pub(super) damage: Mutex<Option<Damage>>,
    pub(super) state: RwLock<State>,
    /// How many times the database was opened: the generation of the next one.
    pub(super) opened: AtomicU64,
    pub(super) flushes: AtomicU64,
    /// The last failed write found the disk full (and no write succeeded since).
    pub(super) full: AtomicBool,
    /// Why the last write failed, or the database could not be opened again after it (a full
    /// disk, an I/O error, damage found), until a write succeeds: what `degraded` tells.
    pub(super) failure: Mutex<Option<String>>,
    /// A reopen is running: the failed database being let go, or the new one being opened
    /// (either holds the directory's lock).
    reopen_running: AtomicBool,
    /// Told when a failed database has been let go (and opened again, or left for the next
    /// operation to open): what tests wait on.
    let_go: (Mutex<()>, parking_lot::Condvar),
    /// Makes every flush fail while set (tests of error propagation).
    #[cfg(test)]
    pub(super) fail_flushes: std::sync::atomic::AtomicBool,
    /// Makes every application of a batch fail while set, before sled sees it.
    #[cfg(test)]
    pub(super) fail_applies: std::sync::atomic::AtomicBool,
    /// Number of sled batches applied.
    #[cfg(test)]
    pub(super) applied_batches: AtomicU64,
}

/// How long an operation waits for a failed database to be let go and opened again before it
/// fails: long enough for a database to be dropped and opened, short enough that a wedged one
/// holds nobody up.
const REOPEN_PATIENCE: std::time::Duration = std::time::Duration::from_millis(250);

/// How long a commit whose write failed waits for the database to be opened again, to learn
/// whether its group is there after all: an opening takes milliseconds (sled replays the tail
/// of its log), unless a full disk wedged the failed database's drop.
const LANDED_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// A group's batches are applied as sled batches of about this many writes, so that one
/// application (which holds sled's global write lock) stays bounded.
pub(super) const MAX_WRITES_PER_SLED_BATCH: usize = 4096;

impl Shared {
    /// Opens the database.
    pub(super) fn start(
        config: ::sled::Config,
        path: Option<PathBuf>,
        durability: Durability,
        salvage: bool,
    ) -> Result<Self, Error> {
        let mut shared = Self {
            config,
            path,
            durability,
            salvage,
            damage: Mutex::new(None),
            state: RwLock::new(State::Failed),
            opened: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            full: AtomicBool::new(false),
            failure: Mutex::new(None),
            reopen_running: AtomicBool::new(false),
            let_go: (Mutex::new(()), parking_lot::Condvar::new()),
            #[cfg(test)]
            fail_flushes: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            fail_applies: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            applied_batches: AtomicU64::new(0),
        };
        *shared.state.get_mut() = State::Open(Box::new(shared.open_database()?));
        Ok(shared)
    }

    /// Opens the database from its files (at start, and again after a failed write).
    fn open_database(&self) -> Result<Open, Error> {
        let open = || -> Result<Open, Error> {
            let db = open_db(&self.config, self.path.as_deref())?;
            refuse_old_layout(&db)?;
            let records = db.open_tree(RECORDS)?;
            let generation = self.opened.fetch_add(1, Ordering::Relaxed);
            let (check, mark) = self.verify(&records, generation)?;
            let pieced = Mutex::new(pieced_values(&records)?);
            // ProcessCrash keeps one too: its mark may name only batches an fdatasync made
            // durable (see `advance_mark`).
            let syncer = match &self.path {
                Some(path) => Some(Syncer::open(path).map_err(io_error)?),
                None => None,
            };
            Ok(Open {
                db,
                records,
                syncer,
                generation,
                pieced,
                flushed: AtomicU64::new(check.seq),
                recovered: check.seq,
                check: Mutex::new(check),
                mark,
            })
        };
        open().map_err(|error| {
            self.unreadable(error)
                .unwrap_or_else(|error| self.classify(error))
        })
    }

    /// [`Error::Damaged`] for sled's own report of a bad checksum (a page it cannot read);
    /// any other error back.
    fn unreadable(&self, error: Error) -> Result<Error, Error> {
        match error.downcast_ref::<SledError>() {
            Some(SledError::Sled(corruption @ ::sled::Error::Corruption { .. })) => {
                Ok(Error::Damaged {
                    path: self.path.clone(),
                    damage: Damage::Unreadable {
                        reason: format!("sled: {corruption}"),
                    },
                })
            }
            _ => Err(error),
        }
    }

    /// Checks what the database recovered against its record and its mark (see
    /// [`check`](super::check)): every entry when the store is opened, the number only when
    /// it is opened again after a failed write. Refuses a damaged store with
    /// [`Error::Damaged`], unless opened to salvage it; returns the record to go on from and
    /// the open mark. A store written before records were kept is first brought to the
    /// current layout of values (see [`migrate`](super::migrate)).
    fn verify(
        &self,
        records: &::sled::Tree,
        generation: u64,
    ) -> Result<(Check, Option<Mark>), Error> {
        let acknowledged = match &self.path {
            Some(path) => mark::read(path).map_err(io_error)?,
            None => Ok(None),
        };
        // Only a store written before records were kept (which came after the values' last
        // change of layout) can need a migration, and only one that acknowledged nothing since
        // has no record: in any other, a missing layout entry is damage, and rewriting every
        // value would make it worse (and a salvage writes nothing).
        let unrecorded = records.get(Check::key())?.is_none();
        if unrecorded && !self.salvage && matches!(acknowledged, Ok(None | Some(0))) {
            super::migrate::migrate(records)?;
        }
        let depth = if generation == 0 {
            Depth::Full
        } else {
            Depth::Tail
        };
        let verified = match verify(
            records,
            acknowledged.clone().ok().flatten().unwrap_or(0),
            depth,
            self.salvage,
        ) {
            Ok(verified) => verified,
            // To salvage, a page sled cannot read is one more thing lost: reading it fails.
            Err(error) if self.salvage => match self.unreadable(error) {
                Ok(Error::Damaged { damage, .. }) => super::check::Verified {
                    check: Check::default(),
                    damage: Some(damage),
                },
                Ok(error) | Err(error) => return Err(error),
            },
            Err(error) => return Err(error),
        };
        let damage = match &self.path {
            // A mark gone from a store that holds commits is damage as well (the mark is
            // written when a store is first opened, before any commit).
            Some(_) => verified
                .damage
                .or_else(|| mark::check(acknowledged, verified.check.seq)),
            None => verified.damage,
        };
        if let Some(damage) = damage {
            if !self.salvage {
                tracing::error!(path = ?self.path, %damage, "store.damaged");
                return Err(Error::Damaged {
                    path: self.path.clone(),
                    damage,
                });
            }
            tracing::warn!(path = ?self.path, %damage, "store.salvaging: opened read-only");
            *self.damage.lock() = Some(damage);
        }
        let mark = match &self.path {
            Some(path) if !self.salvage => Some(
                Mark::open(
                    path,
                    verified.check.seq,
                    self.durability == Durability::PowerLoss,
                )
                .map_err(io_error)?,
            ),
            _ => None,
        };
        Ok((verified.check, mark))
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
    /// is still full). While the failed one is being let go ([`State::Reopening`]), waits a
    /// moment for that ([`REOPEN_PATIENCE`]: a database lets go in milliseconds, unless a full
    /// disk wedged it), then fails with the failure's kind: nobody waits long on that.
    pub(super) fn open(&self) -> Result<MappedRwLockReadGuard<'_, Open>, Error> {
        if matches!(*self.state.read(), State::Reopening) {
            self.wait_let_go_for(REOPEN_PATIENCE);
        }
        let mut state = self.state.read();
        if matches!(*state, State::Reopening) {
            return Err(self.unavailable());
        }
        if matches!(*state, State::Failed) {
            drop(state);
            let reopening = {
                let mut write = self.state.write();
                let failed = matches!(*write, State::Failed);
                if failed {
                    *write = State::Reopening;
                    // Under the lock: a close that takes the state next waits for the reopen.
                    self.reopen_running.store(true, Ordering::Release);
                }
                failed
            };
            if reopening {
                self.reopen()?;
            } else {
                // Another operation is opening it: as at the top, a moment's patience.
                self.wait_let_go_for(REOPEN_PATIENCE);
            }
            state = self.state.read();
            if matches!(*state, State::Reopening) {
                return Err(self.unavailable());
            }
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
    pub(super) fn read<T>(
        self: &Arc<Self>,
        read: impl FnOnce(&Open) -> Result<T, Error>,
    ) -> Result<T, Error> {
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
    /// (see [`Shared::replace_failed`]); the error is the failure's. Unless that database
    /// holds the whole group: sled writes what it applied as it lets a database go, so a
    /// group whose flush failed is often on disk after all, and told failed it would still be
    /// served (an answer taken twice, a run started twice). Such a group is made durable in the
    /// database opened again and acknowledged ([`Shared::landed_after_reopen`]).
    pub(super) fn commit(self: &Arc<Self>, batches: &[SledWrites]) -> Result<(), Error> {
        if self.salvage && !batches.is_empty() {
            return Err(Error::ReadOnly {
                path: self.path.clone(),
            });
        }
        // The number of the group's last sled batch, once all of them are applied.
        let mut applied = None;
        let failed = {
            let open = self.open()?;
            match self.apply_group_and_flush(&open, batches, &mut applied) {
                Ok(()) => {
                    self.full.store(false, Ordering::Relaxed);
                    // Only a write that reached the disk says it is healthy again.
                    if !batches.is_empty() {
                        self.failure.lock().take();
                    }
                    return Ok(());
                }
                Err(error) => (error, open.generation),
            }
        };
        let (error, generation) = failed;
        let error = self.classify(error);
        self.full.store(
            matches!(error, Error::StorageFull { .. }),
            Ordering::Relaxed,
        );
        *self.failure.lock() = Some(error.to_string());
        self.replace_failed(generation);
        if let Some(last) = applied {
            if self.landed_after_reopen(generation, last) {
                tracing::warn!(%error, "store: a group whose write failed was found whole in the database opened again; made durable there, it is acknowledged");
                return Ok(());
            }
        }
        Err(error)
    }

    /// Whether the database opened again after a failed write of `generation` holds every
    /// sled batch up to `last` (the failed group's), made durable there now: waits for that
    /// opening [`LANDED_PATIENCE`] at most. `false` if it is not open by then, holds less, or
    /// cannot be made durable: the group is then told failed. (A group the opening finishes
    /// holding after that is served although told failed, as a commit a crash cut may be.)
    fn landed_after_reopen(&self, generation: u64, last: u64) -> bool {
        self.wait_reopen_ended(LANDED_PATIENCE);
        let state = self.state.read();
        let Some(open) = state.open() else {
            return false;
        };
        // The database opened right after the failed one: one opened since (another failure)
        // may number its own batches as the failed group's were.
        if open.generation != generation + 1 {
            return false;
        }
        let recovered = open.recovered;
        if recovered < last {
            return false;
        }
        if let Err(error) = self.flush_files(open) {
            tracing::warn!(%error, "store: the group found after a failed write cannot be made durable; it is told failed");
            return false;
        }
        open.flushed.fetch_max(recovered, Ordering::Relaxed);
        if let Some(mark) = &open.mark {
            if let Err(error) = self.advance_mark(open, mark, recovered) {
                tracing::error!(%error, "store: the mark of acknowledged commits could not be advanced");
            }
        }
        self.full.store(false, Ordering::Relaxed);
        self.failure.lock().take();
        true
    }

    /// Whether the store was opened to salvage what is left of it (read-only).
    pub(super) fn is_salvage(&self) -> bool {
        self.salvage
    }

    /// The error of an operation while the database is being opened again.
    fn unavailable(&self) -> Error {
        if self.full.load(Ordering::Relaxed) {
            Error::StorageFull {
                path: self.path.clone(),
                kind: io::ErrorKind::StorageFull,
            }
        } else {
            io_error(io::Error::other(
                "the database is being opened again after a failed write; try again",
            ))
        }
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
    /// The failed database is taken out under the write side of the lock (which waits for the
    /// reads in progress) and let go by a thread of its own, which then opens it again (if
    /// that fails, the disk still full say, the next operation tries): sled flushes a
    /// database as it drops it, and a database whose log writer failed can wait on that flush
    /// for a long time, or forever (issue 30). Meanwhile every operation fails at once
    /// ([`State::Reopening`]) instead of waiting on the lock: no request, and no tokio worker,
    /// is held up by a full disk. Several commits that failed on the same database (without
    /// group commit) replace it once.
    pub(super) fn replace_failed(self: &Arc<Self>, generation: u64) {
        let failed = {
            let mut state = self.state.write();
            if !matches!(&*state, State::Open(open) if open.generation == generation) {
                // Already replaced, closed, or waiting for the next operation to open it.
                return;
            }
            // Under the lock: a close that takes the state next waits for the reopen (which
            // holds the directory until it sees the store closed).
            self.reopen_running.store(true, Ordering::Release);
            std::mem::replace(&mut *state, State::Reopening)
        };
        let shared = Arc::clone(self);
        let reopen = std::thread::Builder::new()
            .name("dormant-store-reopen".into())
            .spawn(move || {
                // The failed database must be gone before it is opened again: it holds the
                // directory's lock.
                drop(failed);
                let _ = shared.reopen();
            });
        if let Err(error) = reopen {
            // No thread (the process is out of them): the next operation opens it.
            tracing::error!(%error, "store: no thread to open the database again");
            let mut state = self.state.write();
            if matches!(*state, State::Reopening) {
                *state = State::Failed;
            }
            drop(state);
            self.reopen_ended();
        }
    }

    /// Opens the database again once the failed one is gone; if that fails (the disk is
    /// still full, say), the next operation tries again.
    ///
    /// The open (sled replays its log, the store checks what it holds) runs outside the lock:
    /// meanwhile the state says [`State::Reopening`], and every operation fails within
    /// [`REOPEN_PATIENCE`] rather than blocking its tokio worker on the lock for as long as
    /// the open takes. A store closed meanwhile lets the database go again.
    fn reopen(&self) -> Result<(), Error> {
        let opened = self.open_database();
        let mut state = self.state.write();
        let reopened = if matches!(*state, State::Reopening) {
            let (next, reopened) = match opened {
                Ok(open) => {
                    tracing::info!("store.reopened");
                    // sled wrote a new snapshot as it opened, with the process's umask.
                    let narrowed = self.path.as_deref().map(super::files::owner_only_files);
                    if let Some(Err(error)) = narrowed {
                        tracing::warn!(%error, "store: the files of the database opened again could not be made the owner's alone");
                    }
                    (State::Open(Box::new(open)), Ok(()))
                }
                Err(error) => {
                    self.full.store(
                        matches!(error, Error::StorageFull { .. }),
                        Ordering::Relaxed,
                    );
                    *self.failure.lock() = Some(error.to_string());
                    tracing::warn!(%error, "store: opening the database again after a failed write failed; the next operation tries again");
                    (State::Failed, Err(error))
                }
            };
            *state = next;
            drop(state);
            reopened
        } else {
            // Closed meanwhile.
            drop(state);
            if let Ok(open) = opened {
                super::let_go(State::Open(Box::new(open)));
            }
            Err(Error::Closed)
        };
        self.reopen_ended();
        reopened
    }

    /// No reopen is running any more: tells whoever waits for it (an operation, a close).
    fn reopen_ended(&self) {
        self.reopen_running.store(false, Ordering::Release);
        // Not under the state's lock: a waiter holds this one while it reads the state.
        let _told = self.let_go.0.lock();
        self.let_go.1.notify_all();
    }

    /// Waits until no reopen is running, `patience` at most: a closing store's caller may open
    /// the directory again at once, and the database being let go or opened by a reopen holds
    /// its lock until then.
    pub(super) fn wait_reopen_ended(&self, patience: std::time::Duration) {
        let until = std::time::Instant::now() + patience;
        let mut told = self.let_go.0.lock();
        while self.reopen_running.load(Ordering::Acquire) {
            if self.let_go.1.wait_until(&mut told, until).timed_out() {
                return;
            }
        }
    }

    /// Waits until no failed database is being let go, `patience` at most.
    fn wait_let_go_for(&self, patience: std::time::Duration) {
        let until = std::time::Instant::now() + patience;
        let mut told = self.let_go.0.lock();
        while matches!(*self.state.read(), State::Reopening) {
            if self.let_go.1.wait_until(&mut told, until).timed_out() {
                return;
            }
        }
    }

    /// Waits until no failed database is being let go (tests: what follows a failure then
    /// finds the database open again, or opens it).
    #[cfg(test)]
    pub(super) fn wait_let_go(&self) {
        self.wait_let_go_for(std::time::Duration::from_secs(60));
    }

    /// Applies `batches` as one sled batch, with the record of what the database holds after
    /// it: all or nothing, after a crash too. A key written by several of them ends with the
    /// last write, as if they were applied in order.
    fn apply(&self, open: &Open, batches: &[SledWrites]) -> Result<u64, Error> {
        #[cfg(test)]
        if self.fail_applies.load(Ordering::SeqCst) {
            return Err(io_error(io::Error::other("injected write failure")));
        }
        let mut sled_batch = ::sled::Batch::default();
        let mut touched = Vec::new();
        // Held until the batch is applied: without group commit, committers apply batches
        // from several threads, and each must read the values its batch replaces.
        let mut check = open.check.lock();
        let mut pieced = open.pieced.lock();
        for writes in batches {
            writes.add_to(&mut sled_batch, &mut pieced, &mut touched);
        }
        drop(pieced);
        let next = check.after(&touched, &open.records)?;
        sled_batch.insert(Check::key(), &next.encode()[..]);
        open.records.apply_batch(sled_batch)?;
        *check = next;
        #[cfg(test)]
        self.applied_batches.fetch_add(1, Ordering::SeqCst);
        Ok(next.seq)
    }

    /// Applies a group's batches in as few sled batches as [`MAX_WRITES_PER_SLED_BATCH`]
    /// allows (a batch is never split), then does one flush. `applied` gets the number of
    /// the last sled batch once all of them are applied.
    fn apply_group_and_flush(
        &self,
        open: &Open,
        batches: &[SledWrites],
        applied: &mut Option<u64>,
    ) -> Result<(), Error> {
        self.mark_caught_up(open)?;
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
            *applied = Some(self.apply(open, &batches[start..])?);
        }
        // Every batch applied so far, by this thread or another, is made durable by the flush.
        let covered = open.check.lock().seq;
        self.flush_durable(open)?;
        open.flushed.fetch_max(covered, Ordering::Relaxed);
        if let Some(mark) = &open.mark {
            // The batches are durable either way: told failed, they would still be served.
            // So they are acknowledged, and the next group is not written until the mark
            // names them (`mark_caught_up`): at most one group is ever acknowledged past it.
            if let Err(error) = self.advance_mark(open, mark, covered) {
                tracing::error!(%error, "store: the mark of acknowledged commits could not be advanced");
            }
        }
        Ok(())
    }

    /// At [`Durability::PowerLoss`], before a group is written: the mark must name every
    /// batch already acknowledged (an advance after the last flush failed). It is advanced
    /// now, or the group fails unwritten, so that commits are never acknowledged past a mark
    /// that cannot move (a lost tail of them would go untold).
    fn mark_caught_up(&self, open: &Open) -> Result<(), Error> {
        let Some(mark) = &open.mark else {
            return Ok(());
        };
        if self.durability != Durability::PowerLoss {
            return Ok(());
        }
        let flushed = open.flushed.load(Ordering::Relaxed);
        if mark.written() >= flushed {
            return Ok(());
        }
        mark.advance(flushed).map_err(|error| {
            io_error(io::Error::new(
                error.kind(),
                format!("the mark of acknowledged commits cannot be advanced: {error}"),
            ))
        })
    }

    /// Makes the next advance of the mark fail (a test's fault).
    #[cfg(test)]
    pub(super) fn fail_next_mark_sync(&self) {
        if let Some(mark) = self.state.read().open().and_then(|open| open.mark.as_ref()) {
            mark.fail_next_sync();
        }
    }

    /// On a graceful close: a lagging mark (at [`Durability::ProcessCrash`]) catches up with
    /// everything flushed, after an `fdatasync`, so a stopped store tells any batch it lost.
    pub(super) fn mark_everything_flushed(&self) {
        if self.durability == Durability::PowerLoss {
            return;
        }
        let state = self.state.read();
        let State::Open(open) = &*state else {
            return;
        };
        if let Some(mark) = &open.mark {
            // Not the last batch applied: one applied since the last flush is not flushed.
            let covered = open.flushed.load(Ordering::Relaxed);
            let synced = match &open.syncer {
                Some(syncer) => syncer.sync(),
                None => Ok(()),
            };
            if let Err(error) = synced.and_then(|()| mark.advance(covered)) {
                tracing::warn!(%error, "store: the mark of acknowledged commits could not be advanced");
            }
        }
    }

    /// Advances the mark to `covered`, the last batch the flush just made durable as the
    /// durability level has it. At [`Durability::PowerLoss`] that is on disk: the mark
    /// follows at once (and is synced itself). At [`Durability::ProcessCrash`] the batches
    /// are only in the kernel's cache, and a power cut may lose them as documented; a mark
    /// that reached the disk before them would then read as damage. So there the mark moves
    /// at most once per [`mark::LAG`], after an `fdatasync` of sled's data file: a power cut
    /// loses nothing it names, and a byte flipped in the last second of the log goes untold.
    fn advance_mark(&self, open: &Open, mark: &Mark, covered: u64) -> io::Result<()> {
        if self.durability == Durability::PowerLoss {
            return mark.advance(covered);
        }
        if !mark.due() {
            return Ok(());
        }
        if let Some(syncer) = &open.syncer {
            syncer.sync()?;
        }
        mark.advance(covered)
    }

    /// One physical flush: sled's `flush()`, then the `fdatasync`s of the durability level.
    fn flush_durable(&self, open: &Open) -> Result<(), Error> {
        #[cfg(test)]
        if self.fail_flushes.load(Ordering::SeqCst) {
            return Err(io_error(io::Error::other("injected flush failure")));
        }
        self.flush_files(open)
    }

    /// sled's `flush()`, then the `fdatasync`s of the durability level.
    fn flush_files(&self, open: &Open) -> Result<(), Error> {
        open.db.flush()?;
        if let (Durability::PowerLoss, Some(syncer)) = (self.durability, &open.syncer) {
            syncer.sync().map_err(io_error)?;
        }
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The values of `records` kept in pieces, by stored key, with how many pieces each has.
fn pieced_values(records: &::sled::Tree) -> Result<HashMap<IVec, u32>, Error> {
    let mut pieced: HashMap<IVec, u32> = HashMap::new();
    for entry in records.range(vec![PIECES_TAG]..vec![PIECES_TAG + 1]) {
        let (key, _) = entry?;
        if let Some(owner) = owner_of_piece(&key) {
            *pieced.entry(IVec::from(owner)).or_default() += 1;
        }
    }
    Ok(pieced)
}
