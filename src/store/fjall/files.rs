//! The store directory of a [`FjallStore`](super::FjallStore): made its owner's alone, locked
//! while open, told apart from a directory that is not a fjall store; and fjall's errors in
//! the store's words.

use std::io;
use std::path::Path;

// fjall takes no lock of its own, and two keyspaces on one directory would break it.
pub(super) use crate::store::directory::{io_error, lock_directory, LOCK_FILE};
use crate::store::mark;
use crate::store::{Damage, Error};

/// How large fjall's memtable grows before it is written out as a segment: 64 MiB, where
/// fjall's default is 16. A cycle rewrites its session's run record at every commit and
/// writes its pending call and deadline entries only to delete them at the resume; in a
/// larger memtable more of those versions die in memory instead of being written out and
/// compacted (BENCHMARKS.md: 5–43 % more cycles, ~30 MiB more peak RSS). The keyspace's
/// write buffer holds two, so one can be written out while the next fills.
pub(super) const MEMTABLE_BYTES: u32 = 64 * 1024 * 1024;

/// Free space a group needs beyond its own bytes before it is written: fjall writes its
/// memtables out as segments of up to [`MEMTABLE_BYTES`] in the background (and 16 MiB more
/// for its journal and manifests), and a write of its journal that runs out of space part-way
/// is not reported by fjall 2.11 (`Batch::commit` drops the error), so the store refuses a
/// group as [`Error::StorageFull`] before the disk gets that close to full.
pub(super) const HEADROOM: u64 = MEMTABLE_BYTES as u64 + 16 * 1024 * 1024;

/// Refuses a directory that holds a sled store, or a fjall store that lost fjall's own
/// `version` file (fjall would make a new, empty store over it).
pub(super) fn refuse_foreign(path: &Path) -> Result<(), Error> {
    if path.join("conf").is_file() && path.join("db").is_file() {
        return Err(Error::backend(format!(
            "{} holds a sled store (SledStore), not a fjall one",
            path.display()
        )));
    }
    if path.join(mark::FILE).is_file() && !path.join("version").is_file() {
        return Err(Error::Damaged {
            path: Some(path.to_path_buf()),
            damage: Damage::Unreadable {
                reason: "it has a mark of acknowledged commits but fjall's `version` file is gone"
                    .into(),
            },
        });
    }
    Ok(())
}

/// Fails with [`Error::StorageFull`] unless the disk has room for `bytes` and [`HEADROOM`].
pub(super) fn ensure_room(path: &Path, bytes: u64) -> Result<(), Error> {
    match fs2::available_space(path) {
        Ok(free) if free < bytes.saturating_add(HEADROOM) => Err(full(path)),
        _ => Ok(()),
    }
}

fn full(path: &Path) -> Error {
    Error::StorageFull {
        path: Some(path.to_path_buf()),
        kind: io::ErrorKind::StorageFull,
    }
}

/// A full disk is [`Error::StorageFull`]; any other failure is fjall's own error.
///
/// fjall answers a failed sync with `Poisoned`, not the I/O error (which it logs): a store
/// whose disk has less than [`HEADROOM`] free then is taken to be full.
pub(super) fn error(error: fjall::Error, path: &Path) -> Error {
    match error {
        fjall::Error::Io(io) => io_error(io, path),
        fjall::Error::Poisoned if fs2::available_space(path).is_ok_and(|free| free < HEADROOM) => {
            full(path)
        }
        other => Error::backend(FjallError(other)),
    }
}

/// fjall's error, shown in words (its own `Display` prints its `Debug`).
#[derive(Debug, thiserror::Error)]
#[error("fjall: {0:?}")]
pub(crate) struct FjallError(fjall::Error);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_the_disk_has_no_room_for_is_storage_full() -> Result<(), Error> {
        let dir = tempfile::tempdir().map_err(Error::backend)?;
        ensure_room(dir.path(), 1024)?;
        let full = ensure_room(dir.path(), u64::MAX / 2);
        assert!(matches!(full, Err(Error::StorageFull { .. })), "{full:?}");
        assert!(full.is_err_and(|error| error.is_retryable()));
        Ok(())
    }

    #[test]
    fn a_sled_store_or_a_fjall_store_without_its_version_file_is_refused() -> Result<(), Error> {
        let dir = tempfile::tempdir().map_err(Error::backend)?;
        refuse_foreign(dir.path())?;
        drop(crate::SledStore::open(dir.path().join("sled"))?);
        let sled = refuse_foreign(&dir.path().join("sled"));
        assert!(
            sled.as_ref()
                .is_err_and(|error| error.to_string().contains("holds a sled store")),
            "{sled:?}"
        );
        let bare = dir.path().join("bare");
        std::fs::create_dir(&bare).map_err(Error::backend)?;
        std::fs::write(bare.join(mark::FILE), b"").map_err(Error::backend)?;
        let lost = refuse_foreign(&bare);
        assert!(matches!(lost, Err(Error::Damaged { .. })), "{lost:?}");
        Ok(())
    }
}
