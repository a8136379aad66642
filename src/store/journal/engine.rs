//! The journal behind a [`JournalStore`](super::JournalStore): opened under a lock of its
//! directory by replaying its files into the index, checked against the mark of acknowledged
//! commits, closed once.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Mutex, RwLock};

use super::appending::{Appending, Writer};
use super::files::{
    begin_journal, io_error, journal_path, lock_directory, open_owned, refuse_foreign,
    remove_replaced, remove_spares, LOCK_FILE,
};
use super::index::{FileId, Index};
use super::replay::replay;
use crate::store::directory::owner_only_directory;
use crate::store::mark::{self, Mark};
use crate::store::{Damage, Error};

pub(super) struct Engine {
    path: PathBuf,
    pub(super) index: RwLock<Index>,
    /// The appending end; `None` for a store opened to salvage it, or once closed.
    pub(super) writer: Mutex<Option<Writer>>,
    closed: AtomicBool,
    lock: Mutex<Option<File>>,
    pub(super) syncs: AtomicU64,
    /// Why the last write failed, until one succeeds.
    pub(super) degraded: Mutex<Option<String>>,
    /// What a store opened to salvage it lost.
    damage: Option<Damage>,
    read_only: bool,
    /// The compaction under way, if one is.
    pub(super) compaction: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    /// Opens the journal in `path`, checks that it recovered every commit the store
    /// acknowledged, and refuses it with [`Error::Damaged`] if it did not, unless opened to
    /// `salvage` it (read-only).
    pub(super) fn open(path: &Path, salvage: bool, file_bytes: u64) -> Result<Self, Error> {
        owner_only_directory(path, LOCK_FILE).map_err(|e| io_error(e, path))?;
        let lock = lock_directory(path)?;
        refuse_foreign(path)?;
        let acknowledged = mark::read(path).map_err(|e| io_error(e, path))?;
        let acknowledged_end = mark::certain(path).map_err(|e| io_error(e, path))?;
        let replayed = replay(path, salvage, acknowledged_end)?;
        if let Some((file, at)) = replayed.past_the_mark {
            tracing::warn!(
                dir = %path.display(),
                file,
                at,
                "store: the journal holds commits past its mark; never acknowledged, they are let go"
            );
        }
        let recovered = replayed.seq;
        let damage = replayed
            .damage
            .or_else(|| mark::check(acknowledged, recovered));
        let mut index = replayed.index;
        let writer = match (&damage, salvage) {
            (Some(damage), false) => {
                return Err(Error::Damaged {
                    path: Some(path.to_path_buf()),
                    damage: damage.clone(),
                })
            }
            (_, true) => None,
            (None, false) => {
                let mark = Mark::open(path, recovered, true).map_err(|e| io_error(e, path))?;
                // What was replayed is served from now on: the mark says so, or a later
                // advance's take-back could leave it behind commits readers have seen (one
                // of its slots unreadable, it may be behind them now).
                mark.advance(recovered).map_err(|e| io_error(e, path))?;
                // A crash between a compaction's rename and its removals left what its base
                // replaced.
                remove_replaced(path, replayed.first_kept)
                    .and_then(|()| remove_spares(path))
                    .map_err(|e| io_error(e, path))?;
                let (id, len, file) = match replayed.last {
                    Some((id, len, torn_end)) => {
                        let file = open_owned(&journal_path(path, id));
                        let file = file.map_err(|e| io_error(e, path))?;
                        // What follows the last whole record was never acknowledged (the
                        // mark says so): a write a crash cut short, or commits past the mark.
                        // Zeros again, so that the records written next end where they end.
                        zero(&file, len, torn_end)
                            .and_then(|()| file.sync_data())
                            .map_err(|e| io_error(e, path))?;
                        (id, len, file)
                    }
                    None => {
                        let id = replayed.first_kept;
                        let file = begin_journal(path, id, file_bytes);
                        (id, 0, file.map_err(|e| io_error(e, path))?)
                    }
                };
                let file = Arc::new(file);
                index.add_file(FileId::Journal(id), Arc::clone(&file));
                let writer = Writer::new(
                    Appending { file, id, len },
                    recovered,
                    mark,
                    file_bytes,
                    replayed.record_bytes,
                );
                Some(writer.map_err(|e| io_error(e, path))?)
            }
        };
        if let Some(damage) = &damage {
            tracing::warn!(dir = %path.display(), %damage, "store: opened read-only to salvage what is left");
        }
        Ok(Self {
            path: path.to_path_buf(),
            index: RwLock::new(index),
            writer: Mutex::new(writer),
            closed: AtomicBool::new(false),
            lock: Mutex::new(Some(lock)),
            syncs: AtomicU64::new(0),
            degraded: Mutex::new(None),
            damage,
            read_only: salvage,
            compaction: Mutex::new(None),
        })
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    pub(super) fn is_read_only(&self) -> bool {
        self.read_only
    }

    pub(super) fn damage(&self) -> Option<&Damage> {
        self.damage.as_ref()
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Reads with the index, or fails with [`Error::Closed`] once the store is closed.
    pub(super) fn read<T>(&self, read: impl FnOnce(&Index) -> T) -> Result<T, Error> {
        let index = self.index.read();
        if self.is_closed() {
            return Err(Error::Closed);
        }
        Ok(read(&index))
    }

    /// Lets the files and the directory go: every later read or write fails with
    /// [`Error::Closed`].
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        // No compaction begins once the writer is gone (one begins under its lock); the one
        // under way sees the store closed at its next step and stops there. Its files are in
        // the directory, which is let go only after it stopped.
        self.writer.lock().take();
        let compaction = self.compaction.lock().take();
        if let Some(compaction) = compaction {
            let _ = compaction.join();
        }
        self.index.write().clear();
        self.lock.lock().take();
    }
}

/// Writes zeros over `file` from `from` to `to`, a MiB at a time (what a crash cut short may
/// be as long as a commit).
fn zero(file: &File, from: u64, to: u64) -> std::io::Result<()> {
    let zeros = vec![0; (to.saturating_sub(from)).min(1024 * 1024) as usize];
    let mut at = from;
    while at < to {
        let len = (to - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..len], at)?;
        at += len as u64;
    }
    Ok(())
}
