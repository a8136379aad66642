//! The fjall keyspace behind a [`FjallStore`](super::FjallStore): opened under a lock of the
//! directory, opened again after a failed write, closed once; and fjall's errors in the
//! store's words.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::store::keyspace::RECORDS;
use crate::store::mark::{self, Mark};
use crate::store::{Damage, Error};

/// The lock file in the store directory: held while a store has the directory open (fjall
/// takes no lock of its own, and two keyspaces on one directory would break it).
const LOCK_FILE: &str = "dormant.lock";

/// How long an open waits for another store to let the directory go.
const LOCK_WAIT: Duration = Duration::from_millis(500);

/// An open keyspace and its one partition.
pub(in crate::store) struct Open {
    pub(super) keyspace: fjall::Keyspace,
    pub(super) records: fjall::PartitionHandle,
    path: PathBuf,
}

impl Open {
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// What a read sees: every batch applied whole, none in part. fjall inserts a batch's
    /// writes one by one and only then makes its sequence number visible; a plain read of the
    /// partition would see a batch half inserted.
    pub(super) fn view(&self) -> fjall::Snapshot {
        self.records.snapshot_at(self.keyspace.instant())
    }
}

enum State {
    Open(Open),
    /// A write failed, so fjall refuses every later one (it poisons its keyspace after a
    /// failed sync) and what it holds in memory may be more than it made durable: the keyspace
    /// was dropped, to be opened again from what is on disk before the next write.
    Failed(String),
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
        owner_only_directory(path).map_err(|e| io_error(e, path))?;
        let lock = lock_directory(path)?;
        let acknowledged = mark::read(path).map_err(|e| io_error(e, path))?;
        let open = open_keyspace(path)?;
        let recovered = open.keyspace.instant();
        let damage = match acknowledged {
            Err(damage) => Some(damage),
            Ok(Some(acknowledged)) if recovered < acknowledged => Some(Damage::LostTail {
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
        };
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
    /// any committer of them hears of it).
    pub(super) fn advance_mark(&self, open: &Open) -> Result<(), Error> {
        match &self.mark {
            Some(mark) => mark
                .advance(open.keyspace.instant())
                .map_err(|e| io_error(e, &self.path)),
            None => Err(Error::ReadOnly {
                path: Some(self.path.clone()),
            }),
        }
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
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
            State::Closed => Err(Error::Closed),
        }
    }

    /// Writes a group with the open keyspace (opened again first if the last write failed).
    /// A write that fails drops the keyspace and opens it again at once (see
    /// [`State::Failed`]), so that no read sees what the failed group applied in memory; the
    /// store is degraded until a write succeeds.
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
            Err(Error::Closed) => {}
            Err(error) => {
                *self.degraded.lock() = Some(error.to_string());
                let mut state = self.state.write();
                if matches!(&*state, State::Open(_)) {
                    tracing::error!(dir = %self.path.display(), %error, "store: a write failed; its keyspace is opened again");
                    // The old keyspace goes (and fjall's threads with it) before the new one.
                    *state = State::Failed(error.to_string());
                    if let Ok(open) = open_keyspace(&self.path) {
                        *state = State::Open(open);
                    }
                }
            }
        }
        written
    }

    /// Opens the keyspace again if the last write failed and it could not be opened then.
    fn reopen_if_failed(&self) -> Result<(), Error> {
        if !matches!(&*self.state.read(), State::Failed(_)) {
            return Ok(());
        }
        let mut state = self.state.write();
        if matches!(&*state, State::Failed(_)) {
            let open = open_keyspace(&self.path).inspect_err(|error| {
                *state = State::Failed(error.to_string());
            })?;
            *state = State::Open(open);
            tracing::info!(dir = %self.path.display(), "store: opened again after a failed write");
        }
        Ok(())
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
        self.degraded
            .lock()
            .as_ref()
            .map(|reason| format!("the last write failed: {reason}"))
    }

    fn failed(&self, reason: &str) -> Error {
        Error::backend(format!(
            "store {}: the last write failed ({reason}) and it could not be opened again after a failed write yet",
            self.path.display()
        ))
    }
}

/// Opens fjall's keyspace in `path`. What fjall cannot read back (a bad checksum inside its
/// journal, a file it cannot decode, or a panic on one) is [`Damage::Unreadable`].
fn open_keyspace(path: &Path) -> Result<Open, Error> {
    let opened = std::panic::catch_unwind(|| -> Result<Open, fjall::Error> {
        let keyspace = fjall::Config::new(path).open()?;
        let records = keyspace.open_partition(RECORDS, fjall::PartitionCreateOptions::default())?;
        Ok(Open {
            keyspace,
            records,
            path: path.to_path_buf(),
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

/// Takes the directory's lock file, waiting [`LOCK_WAIT`] for another holder at most.
fn lock_directory(path: &Path) -> Result<File, Error> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path.join(LOCK_FILE))
        .map_err(|e| io_error(e, path))?;
    let started = Instant::now();
    loop {
        match fs2::FileExt::try_lock_exclusive(&file) {
            Ok(()) => return Ok(file),
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(io_error(e, path)),
            Err(_) if started.elapsed() < LOCK_WAIT => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(_) => {
                return Err(Error::Locked {
                    path: path.to_path_buf(),
                })
            }
        }
    }
}

/// Creates the store directory for its owner alone (`0700`), or narrows an existing one that
/// is empty or a store already; one that holds other things is left as it is, with a warning.
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
        let ours = dir.join(LOCK_FILE).is_file() || std::fs::read_dir(dir)?.next().is_none();
        if ours {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o700))?;
        } else {
            tracing::warn!(dir = %dir.display(), "store: the directory holds other files and others may read it; a directory of its own would be the owner's alone");
        }
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(dir)?;
    Ok(())
}

/// A full disk is [`Error::StorageFull`]; any other failure is fjall's own error.
///
/// fjall answers a failed sync with `Poisoned`, not the I/O error (which it logs): a store
/// whose disk has less than [`FULL_BELOW`] free then is taken to be full.
pub(super) fn error(error: fjall::Error, path: &Path) -> Error {
    match error {
        fjall::Error::Io(io) => io_error(io, path),
        fjall::Error::Poisoned
            if fs2::available_space(path).is_ok_and(|free| free < FULL_BELOW) =>
        {
            Error::StorageFull {
                path: Some(path.to_path_buf()),
                kind: io::ErrorKind::StorageFull,
            }
        }
        other => Error::backend(FjallError(other)),
    }
}

/// Free space under which a failed sync is put down to a full disk.
const FULL_BELOW: u64 = 1024 * 1024;

fn io_error(error: io::Error, path: &Path) -> Error {
    match error.kind() {
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => Error::StorageFull {
            path: Some(path.to_path_buf()),
            kind: error.kind(),
        },
        _ => Error::backend(error),
    }
}

/// fjall's error, shown in words (its own `Display` prints its `Debug`).
#[derive(Debug, thiserror::Error)]
#[error("fjall: {0:?}")]
pub(crate) struct FjallError(fjall::Error);
