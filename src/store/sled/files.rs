//! The files of a store directory: opening sled's database on them (waiting out sled's
//! directory lock, removing snapshots a full disk left unfinished, telling damage sled
//! reports), keeping them the owner's alone, and refusing a store written by an earlier
//! layout.

use std::io;
use std::path::Path;
use std::time::Duration;

use super::error::{io_error, SledError};
use crate::store::keyspace::RECORDS;
use crate::store::mark;
use crate::store::{Damage, Error};

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

/// Makes the files kept in the store directory `dir` (sled's `db`, `conf`, `snap.*` and
/// `blobs/`, and the mark, `acknowledged`) its owner's alone (`0600`, `0700` for `blobs/`): sled creates them as the process's umask
/// has it. It writes new snapshot files only while it opens a database, and no large-value
/// file (values are kept in pieces), so after an opening none is left behind.
pub(super) fn owner_only_files(dir: &Path) -> io::Result<()> {
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
