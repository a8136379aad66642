//! The fjall keyspace behind a [`FjallStore`](super::FjallStore): opened under a lock of the
//! directory and checked against the mark of acknowledged commits, opened again (and checked
//! again) after a failed write, closed once.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use super::files::{io_error, lock_directory, refuse_foreign, LOCK_FILE, MEMTABLE_BYTES};
use crate::store::directory::owner_only_directory;
use crate::store::keyspace::RECORDS;
use crate::store::mark::{self, Mark};
use crate::store::{Damage, Error};

/// An open keyspace and its one partition.
pub(in crate::store) struct Open {
    pub(super) keyspace: fjall::Keyspace,
    pub(super) records: fjall::PartitionHandle,
    path: PathBuf,
    /// fjall's sequence number up to which batches are acknowledged: what reads see.
    acknowledged: AtomicU64,
}

impl Open {
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// What a read sees: every acknowledged batch, whole. Not fjall's visible sequence
    /// number: that one also covers the batches of a group applied but not yet synced, which
    /// a failed sync takes back.
    pub(super) fn view(&self) -> fjall::Snapshot {
        self.records
            .snapshot_at(self.acknowledged.load(Ordering::Acquire))
    }

    /// Every batch fjall has made visible is durable now: reads may see them.
    pub(super) fn acknowledge(&self) {
        self.acknowledged
            .store(self.keyspace.instant(), Ordering::Release);
    }
}

enum State {
    Open(Open),
    /// A write failed, so fjall refuses every later one (it poisons its keyspace after a
    /// failed sync) and what it holds in memory may be more than it made durable: the keyspace
    /// was dropped, and opening it again failed too (a full disk, say); the next read or write
    /// tries again.
    Failed(Error),
    /// Opened again after a failed write, fjall recovered less than the store had
    /// acknowledged: it refuses everything, as an open would.
    Damaged(Damage),
    Closed,
}

pub(super) struct Engine {
    path: PathBuf,
    state: RwLock<State>,
    lock: Mutex<Option<File>>,
    syncs: AtomicU64,
    /// Why the last write failed, until one succeeds.
    degraded: Mutex<Option<String>>,
    /// The mark of acknowledged commits; `None` for a store opened to salvage it, which
    /// takes no commit.
    mark: Option<Mark>,
    /// What a store opened to salvage it lost.
    damage: Option<Damage>,
}

impl Engine {
    /// Opens the store in `path` and checks that fjall recovered every batch the store
    /// acknowledged; a store that did not is refused with [`Error::Damaged`] unless opened
    /// to `salvage` it (read-only).
    pub(super) fn open(path: &Path, salvage: bool) -> Result<Self, Error> {
        owner_only_directory(path, LOCK_FILE).map_err(|e| io_error(e, path))?;
        let lock = lock_directory(path)?;
        refuse_foreign(path)?;
        let acknowledged = mark::read(path).map_err(|e| io_error(e, path))?;
        let open = open_keyspace(path)?;
        let recovered = open.keyspace.instant();
        let damage = mark::check(acknowledged, recovered);
        let mark = match (&damage, salvage) {
            (Some(damage), false) => {
                return Err(Error::Damaged {
                    path: Some(path.to_path_buf()),
                    damage: damage.clone(),
                })
            }
            (_, true) => None,
            (None, false) => {
                Some(Mark::open(path, recovered, true).map_err(|e| io_error(e, path))?)
            }
        };
        if let Some(damage) = &damage {
            tracing::warn!(dir = %path.display(), %damage, "store: opened read-only to salvage what is left");
        }
        Ok(Self {
            path: path.to_path_buf(),
            state: RwLock::new(State::Open(open)),
            lock: Mutex::new(Some(lock)),
            syncs: AtomicU64::new(0),
            degraded: Mutex::new(None),
            mark,
            damage,
        })
    }

    /// What the store lost, when it was opened to salvage it and is damaged.
    pub(super) fn damage(&self) -> Option<&Damage> {
        self.damage.as_ref()
    }

    /// Whether the store was opened to salvage it: it takes no commit.
    pub(super) fn is_read_only(&self) -> bool {
        self.mark.is_none()
    }

    /// Records that every batch fjall has made visible is durable (after its sync, before
    /// any committer of them hears of it), then lets reads see them.
    ///
    /// An advance that fails does not fail the group: it is durable, and told failed it
    /// would still be served once the keyspace is opened again. It is acknowledged, and the
    /// next group is written only once the mark names it ([`Engine::mark_caught_up`]).
    pub(super) fn advance_mark(&self, open: &Open) -> Result<(), Error> {
        let Some(mark) = &self.mark else {
            return Err(Error::ReadOnly {
                path: Some(self.path.clone()),
            });
        };
        if let Err(error) = mark.advance(open.keyspace.instant()) {
            tracing::error!(dir = %self.path.display(), %error, "store: the mark of acknowledged commits could not be advanced");
        }
        open.acknowledge();
        Ok(())
    }

    /// Before a group is written: the mark must name every batch already acknowledged (an
    /// advance after the last sync failed). It is advanced now, or the group fails unwritten,
    /// so that commits are never acknowledged past a mark that cannot move.
    pub(super) fn mark_caught_up(&self, open: &Open) -> Result<(), Error> {
        let Some(mark) = &self.mark else {
            return Ok(());
        };
        let acknowledged = open.acknowledged.load(Ordering::Acquire);
        if mark.written() >= acknowledged {
            return Ok(());
        }
        mark.advance(acknowledged).map_err(|error| {
            io_error(
                io::Error::new(
                    error.kind(),
                    format!("the mark of acknowledged commits cannot be advanced: {error}"),
                ),
                &self.path,
            )
        })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the next advance of the mark fail (a test's fault).
    #[cfg(test)]
    pub(super) fn fail_next_mark_sync(&self) {
        if let Some(mark) = &self.mark {
            mark.fail_next_sync();
        }
    }

    pub(super) fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Reads with the open keyspace (opened again first if the last write failed). A read
    /// holds the read side of the state for as long as it reads, so a failed write waits for
    /// it before it drops the keyspace.
    pub(super) fn read<T>(&self, read: impl FnOnce(&Open) -> Result<T, Error>) -> Result<T, Error> {
        self.reopen_if_failed()?;
        match &*self.state.read() {
            State::Open(open) => read(open),
            State::Failed(reason) => Err(self.failed(reason)),
            State::Damaged(damage) => Err(self.damaged(damage)),
            State::Closed => Err(Error::Closed),
        }
    }

    /// Writes a group with the open keyspace (opened again first if the last write failed).
    /// A write that fails drops the keyspace and opens it again at once, checked against the
    /// mark: fjall's memory may hold more than the disk (the failed group), and the disk less
    /// than was acknowledged (a journal write that failed part-way, which fjall does not
    /// report). The store is degraded until a write succeeds.
    pub(super) fn write(
        &self,
        write: impl FnOnce(&Open) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let written = self.read(write);
        match &written {
            Ok(()) => {
                self.syncs.fetch_add(1, Ordering::Relaxed);
                *self.degraded.lock() = None;
            }
            Err(Error::Closed | Error::Damaged { .. }) => {}
            Err(error) => {
                *self.degraded.lock() = Some(error.to_string());
                let mut state = self.state.write();
                if matches!(&*state, State::Open(_)) {
                    tracing::error!(dir = %self.path.display(), %error, "store: a write failed; its keyspace is opened again");
                    // The old keyspace goes (and fjall's threads with it) before the new one.
                    *state = State::Failed(error.duplicate());
                    *state = self.reopen();
                }
            }
        }
        written
    }

    /// Whether the keyspace opened again after a failed write (by [`Engine::write`]) holds
    /// every batch up to fjall's sequence number `at` (the failed group's), made durable
    /// there now: then the group is acknowledged, and the store healthy again. `false` if the
    /// keyspace could not be opened, holds less, or cannot be synced.
    pub(super) fn landed_after_reopen(&self, at: u64) -> bool {
        let state = self.state.read();
        let State::Open(open) = &*state else {
            return false;
        };
        if open.keyspace.instant() < at {
            return false;
        }
        if let Err(error) = open.keyspace.persist(fjall::PersistMode::SyncAll) {
            tracing::warn!(dir = %self.path.display(), %error, "store: the group found after a failed write cannot be made durable; it is told failed");
            return false;
        }
        if self.advance_mark(open).is_err() {
            return false;
        }
        *self.degraded.lock() = None;
        true
    }

    /// A group refused before it was written (no room for it): the store is degraded, and
    /// its keyspace, which wrote nothing of the group, stays open.
    pub(super) fn refused(&self, error: &Error) {
        *self.degraded.lock() = Some(error.to_string());
    }

    /// Opens the keyspace again if the last write failed and it could not be opened then.
    fn reopen_if_failed(&self) -> Result<(), Error> {
        if !matches!(&*self.state.read(), State::Failed(_)) {
            return Ok(());
        }
        let mut state = self.state.write();
        if matches!(&*state, State::Failed(_)) {
            *state = self.reopen();
        }
        match &*state {
            State::Failed(reason) => Err(self.failed(reason)),
            _ => Ok(()),
        }
    }

    /// The state after opening the keyspace again: open, damaged if fjall recovered less than
    /// the mark says was acknowledged, or failed (with the reason logged).
    fn reopen(&self) -> State {
        let open = match open_keyspace(&self.path) {
            Ok(open) => open,
            Err(error) => {
                tracing::warn!(dir = %self.path.display(), %error, "store: cannot open the keyspace again yet");
                return State::Failed(error);
            }
        };
        let acknowledged = self.mark.as_ref().map_or(0, Mark::written);
        match mark::short(acknowledged, open.keyspace.instant()) {
            Some(damage) => {
                tracing::error!(dir = %self.path.display(), %damage, "store: opened again after a failed write, it holds less than it acknowledged; it refuses everything");
                State::Damaged(damage)
            }
            None => {
                tracing::info!(dir = %self.path.display(), "store: opened again after a failed write");
                State::Open(open)
            }
        }
    }

    pub(super) fn close(&self) {
        // Waits for a read or write in progress; dropping the keyspace stops fjall's threads.
        *self.state.write() = State::Closed;
        *self.lock.lock() = None;
    }

    pub(super) fn is_closed(&self) -> bool {
        matches!(&*self.state.read(), State::Closed)
    }

    pub(super) fn degraded(&self) -> Option<String> {
        if let State::Damaged(damage) = &*self.state.read() {
            return Some(format!("damaged: {damage}"));
        }
        self.degraded
            .lock()
            .as_ref()
            .map(|reason| format!("the last write failed: {reason}"))
    }

    /// The error of an operation while the keyspace cannot be opened again: a full disk stays
    /// [`Error::StorageFull`], which the caller may retry; anything else says what failed.
    fn failed(&self, reason: &Error) -> Error {
        if let Error::StorageFull { .. } = reason {
            return reason.duplicate();
        }
        Error::backend(format!(
            "store {}: the last write failed ({reason}) and it could not be opened again after a failed write yet",
            self.path.display()
        ))
    }

    fn damaged(&self, damage: &Damage) -> Error {
        Error::Damaged {
            path: Some(self.path.clone()),
            damage: damage.clone(),
        }
    }
}

/// Opens fjall's keyspace in `path`. What fjall cannot read back (a bad checksum inside its
/// journal, a file it cannot decode, or a panic on one) is [`Damage::Unreadable`].
fn open_keyspace(path: &Path) -> Result<Open, Error> {
    let opened = std::panic::catch_unwind(|| -> Result<Open, fjall::Error> {
        let keyspace = fjall::Config::new(path)
            .max_write_buffer_size(2 * u64::from(MEMTABLE_BYTES))
            .open()?;
        let records = keyspace.open_partition(
            RECORDS,
            fjall::PartitionCreateOptions::default().max_memtable_size(MEMTABLE_BYTES),
        )?;
        let acknowledged = AtomicU64::new(keyspace.instant());
        Ok(Open {
            keyspace,
            records,
            path: path.to_path_buf(),
            acknowledged,
        })
    });
    let unreadable = |reason: String| Error::Damaged {
        path: Some(path.to_path_buf()),
        damage: Damage::Unreadable { reason },
    };
    match opened {
        Ok(Ok(open)) => Ok(open),
        Ok(Err(fjall::Error::Io(e))) => Err(io_error(e, path)),
        Ok(Err(other)) => Err(unreadable(format!(
            "fjall cannot read its files: {other:?}"
        ))),
        Err(panic) => Err(unreadable(format!(
            "fjall panicked reading it: {}",
            panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default()
        ))),
    }
}

/// What tests read back: whether `key` of the log tree is there.
#[cfg(test)]
impl Engine {
    pub(super) fn has(&self, key: &[u8]) -> Result<bool, Error> {
        self.read(|open| {
            let found = open.view().get(crate::store::keyspace::stored_key(
                crate::store::Tree::Log,
                key,
            ));
            Ok(found
                .map_err(|e| Error::backend(format!("{e:?}")))?
                .is_some())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::keyspace::stored_key;
    use crate::store::Tree;

    /// Commits one write the way the persister does: apply, sync, advance the mark.
    fn commit(engine: &Engine, key: &[u8]) -> Result<(), Error> {
        engine.write(|open| {
            let mut batch = open.keyspace.batch();
            batch.insert(&open.records, stored_key(Tree::Log, key), b"v".as_slice());
            batch
                .commit()
                .map_err(|e| super::super::files::error(e, open.path()))?;
            open.keyspace
                .persist(fjall::PersistMode::SyncData)
                .map_err(|e| super::super::files::error(e, open.path()))?;
            engine.advance_mark(open)
        })
    }

    #[test]
    fn a_failed_group_the_keyspace_opened_again_holds_is_made_durable_and_acknowledged(
    ) -> Result<(), Error> {
        let dir = tempfile::tempdir().map_err(Error::backend)?;
        let engine = Engine::open(dir.path(), false)?;
        commit(&engine, b"kept")?;
        let mut at = 0;
        let failed = engine.write(|open| {
            let mut batch = open.keyspace.batch();
            batch.insert(
                &open.records,
                stored_key(Tree::Log, b"landed"),
                b"v".as_slice(),
            );
            batch
                .commit()
                .map_err(|e| Error::backend(format!("{e:?}")))?;
            at = open.keyspace.instant();
            Err(Error::backend("the sync failed"))
        });
        assert!(failed.is_err());
        // fjall wrote its journal as the keyspace went: the group is there.
        assert!(engine.landed_after_reopen(at), "the group was found");
        assert!(engine.has(b"landed")?, "and reads see it");
        assert!(engine.degraded().is_none());
        // Not a later group than the keyspace holds.
        assert!(!engine.landed_after_reopen(at + 10));
        drop(engine);
        let engine = Engine::open(dir.path(), false)?;
        assert!(engine.has(b"landed")?, "durable");
        Ok(())
    }

    #[test]
    fn reads_see_acknowledged_groups_only_and_the_store_goes_on_after_a_failed_one(
    ) -> Result<(), Error> {
        let dir = tempfile::tempdir().map_err(Error::backend)?;
        let engine = Engine::open(dir.path(), false)?;
        commit(&engine, b"kept")?;
        // A group applied, then its sync failed: while it is applied and not synced, reads do
        // not see it; the store is degraded until the next write succeeds. (What the failed
        // group wrote may be on disk once the keyspace is opened again: the persister then
        // acknowledges it, the test above.)
        let failed = engine.write(|open| {
            let mut batch = open.keyspace.batch();
            batch.insert(
                &open.records,
                stored_key(Tree::Log, b"unsynced"),
                b"v".as_slice(),
            );
            batch
                .commit()
                .map_err(|e| Error::backend(format!("{e:?}")))?;
            let seen = open.view().get(stored_key(Tree::Log, b"unsynced"));
            assert!(seen
                .map_err(|e| Error::backend(format!("{e:?}")))?
                .is_none());
            Err(Error::backend("the sync failed"))
        });
        assert!(failed.is_err());
        assert!(engine.degraded().is_some());
        assert!(engine.has(b"kept")?);
        commit(&engine, b"after")?;
        assert!(engine.degraded().is_none());
        assert!(engine.has(b"after")?);
        Ok(())
    }

    #[test]
    fn opened_again_with_less_than_it_acknowledged_the_store_refuses_everything(
    ) -> Result<(), Error> {
        let dir = tempfile::tempdir().map_err(Error::backend)?;
        let engine = Engine::open(dir.path(), false)?;
        commit(&engine, b"first")?;
        let journal = dir.path().join("journals").join("0");
        let length_after_first = written_length(&journal)?;
        commit(&engine, b"second")?;
        // The disk lost the second commit (as when fjall's journal write failed part-way):
        // the reopen after the next failed write finds less than the mark.
        let bytes = std::fs::read(&journal).map_err(Error::backend)?;
        std::fs::write(&journal, &bytes[..length_after_first]).map_err(Error::backend)?;
        let failed = engine.write(|_| Err(Error::backend("the sync failed")));
        assert!(failed.is_err());
        let read = engine.read(|_| Ok(()));
        assert!(
            matches!(
                read,
                Err(Error::Damaged {
                    damage: Damage::LostTail { .. },
                    ..
                })
            ),
            "{read:?}"
        );
        assert!(matches!(
            commit(&engine, b"third"),
            Err(Error::Damaged { .. })
        ));
        assert!(engine
            .degraded()
            .is_some_and(|why| why.starts_with("damaged")));
        Ok(())
    }

    /// The length of what fjall wrote to a journal it made long at once (zeros after it).
    fn written_length(journal: &Path) -> Result<usize, Error> {
        let bytes = std::fs::read(journal).map_err(Error::backend)?;
        Ok(bytes
            .iter()
            .rposition(|byte| *byte != 0)
            .map_or(0, |last| last + 1))
    }
}
