//! The journal behind a [`JournalStore`](super::JournalStore): opened under a lock of its
//! directory by replaying its files into the index, checked against the mark of acknowledged
//! commits, closed once.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::files::{
    begin_journal, io_error, journal_files, journal_path, lock_directory, open_journal,
    refuse_foreign, LOCK_FILE,
};
use super::index::Index;
use super::record::{self, Unreadable};
use super::writer::Writer;
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
}

/// What replaying the journal found.
struct Replayed {
    index: Index,
    /// The last commit recovered.
    seq: u64,
    /// The last file, where its whole records end, and where the bytes of a torn record that
    /// may follow them end.
    last: Option<(u32, u64, u64)>,
    /// A file, not the last, with a record that cannot be read.
    damage: Option<Damage>,
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
        let replayed = replay(path, salvage)?;
        let recovered = replayed.seq;
        let damage = replayed.damage.or(match acknowledged {
            Err(damage) => Some(damage),
            Ok(Some(acknowledged)) if acknowledged > recovered => Some(Damage::LostTail {
                acknowledged,
                recovered,
            }),
            Ok(Some(_)) => None,
            // The mark is written when the store is first opened, before any commit.
            Ok(None) if recovered > 0 => Some(Damage::Unreadable {
                reason: format!(
                    "it holds commits but its mark of them, {}, is gone",
                    mark::FILE
                ),
            }),
            Ok(None) => None,
        });
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
                let (id, len, file) = match replayed.last {
                    Some((id, len, torn_end)) => {
                        let file = open_journal(path, id).map_err(|e| io_error(e, path))?;
                        // What follows the last whole record was never acknowledged (the
                        // mark says so): a write a crash cut short. Zeros again, so that the
                        // records written next end where they end.
                        let zeros = vec![0; (torn_end - len) as usize];
                        file.write_all_at(&zeros, len)
                            .and_then(|()| file.sync_data())
                            .map_err(|e| io_error(e, path))?;
                        (id, len, file)
                    }
                    None => (
                        1,
                        0,
                        begin_journal(path, 1, file_bytes).map_err(|e| io_error(e, path))?,
                    ),
                };
                let file = Arc::new(file);
                index.add_file(id, Arc::clone(&file));
                let writer = Writer::new(file, id, len, recovered, mark, file_bytes);
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
        let mut writer = self.writer.lock();
        let mut index = self.index.write();
        self.closed.store(true, Ordering::Release);
        *writer = None;
        index.clear();
        drop((index, writer));
        self.lock.lock().take();
    }
}

/// Replays every journal file of `path` into an index. A record that cannot be read ends its
/// file's replay: at the end of the last file it is a write a crash cut short (the mark tells
/// whether it was acknowledged); in any other file it is damage (told, and to `salvage` the
/// next files are replayed still).
fn replay(path: &Path, salvage: bool) -> Result<Replayed, Error> {
    let ids = journal_files(path).map_err(|e| io_error(e, path))?;
    let mut replayed = Replayed {
        index: Index::default(),
        seq: 0,
        last: None,
        damage: None,
    };
    for (n, &id) in ids.iter().enumerate() {
        let file_path = journal_path(path, id);
        let bytes = std::fs::read(&file_path).map_err(|e| io_error(e, path))?;
        let mut at = 0;
        let unreadable = loop {
            match record::decode(&bytes[at..]) {
                Ok(None) => break None,
                Ok(Some(record)) if replayed.seq > 0 && record.seq != replayed.seq + 1 => {
                    // Commits are numbered one after another, across files: a gap is commits
                    // lost with the end of an earlier file.
                    replayed.damage.get_or_insert(Damage::Unreadable {
                        reason: format!(
                            "{} goes on at commit {} after commit {}: the commits between are lost",
                            file_path.display(),
                            record.seq,
                            replayed.seq
                        ),
                    });
                    replayed.seq = replayed.seq.max(record.seq);
                    replayed.index.apply(id, at as u64, record.writes);
                    at += record.len;
                }
                Ok(Some(record)) => {
                    replayed.seq = record.seq;
                    replayed.index.apply(id, at as u64, record.writes);
                    at += record.len;
                }
                Err(why) => break Some(why),
            }
        };
        let is_last = n + 1 == ids.len();
        if let (Some(why), false) = (&unreadable, is_last) {
            let why = match why {
                Unreadable::Cut => "it ends in the middle of a record",
                Unreadable::Bad(why) => why,
            };
            replayed.damage.get_or_insert(Damage::Unreadable {
                reason: format!(
                    "{} has a record it cannot read at byte {at} ({why})",
                    file_path.display()
                ),
            });
        }
        if replayed.damage.is_some() && !salvage {
            break;
        }
        // Past the last whole record: zeros, or the remains of a write a crash cut short.
        let torn_end = bytes[at..]
            .iter()
            .rposition(|&byte| byte != 0)
            .map_or(at, |last| at + last + 1);
        let file = File::open(&file_path).map_err(|e| io_error(e, path))?;
        replayed.index.add_file(id, Arc::new(file));
        replayed.last = Some((id, at as u64, torn_end as u64));
    }
    Ok(replayed)
}
