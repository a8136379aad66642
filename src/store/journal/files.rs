//! The journal's directory: its files (`NNNNNNNN.journal`, in the order they were begun), the
//! base the last compaction wrote (`NNNNNNNN.base`: every live entry of the journal files
//! before `NNNNNNNN`), its lock, and I/O errors in the store's words.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

pub(super) use crate::store::directory::{io_error, lock_directory, LOCK_FILE};
use crate::store::Error;

const JOURNAL: &str = "journal";
const BASE: &str = "base";
/// A base being written: not part of the store until it is renamed.
const UNFINISHED: &str = "tmp";
/// A journal file begun ahead of its turn: not part of the store until it is renamed.
const SPARE: &str = "spare";

/// The path of journal file `id` in `dir`.
pub(super) fn journal_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("{id:08}.{JOURNAL}"))
}

/// Where journal file `id` is begun ahead of its turn (`spare.rs`).
pub(super) fn spare_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("{id:08}.{JOURNAL}.{SPARE}"))
}

/// The path of the base of every journal file before `first_kept`.
pub(super) fn base_path(dir: &Path, first_kept: u32) -> PathBuf {
    dir.join(format!("{first_kept:08}.{BASE}"))
}

/// Where that base is written before it is renamed into place.
pub(super) fn unfinished_base_path(dir: &Path, first_kept: u32) -> PathBuf {
    dir.join(format!("{first_kept:08}.{BASE}.{UNFINISHED}"))
}

/// The journal files in `dir`, in the order they were begun.
pub(super) fn journal_files(dir: &Path) -> io::Result<Vec<u32>> {
    numbered(dir, &format!(".{JOURNAL}"))
}

/// The bases in `dir`, oldest first.
pub(super) fn base_files(dir: &Path) -> io::Result<Vec<u32>> {
    numbered(dir, &format!(".{BASE}"))
}

/// The numbers of the files `NNNNNNNN{suffix}` in `dir`, in order.
fn numbered(dir: &Path, suffix: &str) -> io::Result<Vec<u32>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(stem) = name.to_str().and_then(|name| name.strip_suffix(suffix)) else {
            continue;
        };
        if let Ok(id) = stem.parse::<u32>() {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// Removes what the base of every journal file before `first_kept` replaced (older journal
/// files and bases, left by a crash between a compaction's rename and its removals) and any
/// unfinished base.
pub(super) fn remove_replaced(dir: &Path, first_kept: u32) -> io::Result<()> {
    for id in journal_files(dir)?
        .into_iter()
        .filter(|id| *id < first_kept)
    {
        std::fs::remove_file(journal_path(dir, id))?;
    }
    for id in base_files(dir)?.into_iter().filter(|id| *id < first_kept) {
        std::fs::remove_file(base_path(dir, id))?;
    }
    for id in numbered(dir, &format!(".{BASE}.{UNFINISHED}"))? {
        std::fs::remove_file(unfinished_base_path(dir, id))?;
    }
    sync_dir(dir)
}

/// Removes the journal files a crash left begun ahead of their turn: at open only, as a
/// running store's writer may be making or using one.
pub(super) fn remove_spares(dir: &Path) -> io::Result<()> {
    for id in numbered(dir, &format!(".{JOURNAL}.{SPARE}"))? {
        std::fs::remove_file(spare_path(dir, id))?;
    }
    Ok(())
}

/// Opens the file at `path` for reading and writing, creating it for its owner alone.
pub(super) fn open_owned(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// How large a journal file is made by default when it is begun: filled with zeros to its size
/// at once,
/// so that a commit writes over bytes the file already has. Then its `fdatasync` writes the
/// data alone; a write past the end would also have to commit the file's new size and blocks
/// to the filesystem's journal, at every sync.
pub(super) const FILE_BYTES: u64 = 64 * 1024 * 1024;

/// Begins journal file `id`: made for its owner alone, `bytes` of zeros, durable. On a disk
/// without room for the zeros, the file begins empty and grows as it is written (each sync
/// then commits its new size too); it fails only when not even that can be made.
pub(super) fn begin_journal(dir: &Path, id: u32, bytes: u64) -> io::Result<File> {
    match begin_zeroed(dir, id, bytes) {
        Err(error) if bytes > 0 => {
            tracing::warn!(%error, dir = %dir.display(), "store: no room to make a journal file whole; it grows as it is written");
            begin_zeroed(dir, id, 0)
        }
        begun => begun,
    }
}

/// Begins journal file `id` as `bytes` zeros; a file that could not be made whole is removed
/// again.
fn begin_zeroed(dir: &Path, id: u32, bytes: u64) -> io::Result<File> {
    let path = journal_path(dir, id);
    let file = zeroed(&path, bytes)?;
    sync_dir(dir).inspect_err(|_| {
        let _ = std::fs::remove_file(&path);
    })?;
    Ok(file)
}

/// How many bytes of zeros a file being begun writes between syncs. Synced only at the end, a
/// spare's 64 MiB of zeros went to the disk at once, and the commits' `fdatasync`s beside it
/// waited behind them: the main job's slowest commit took 40–49 ms, against 11–16 ms synced
/// every 4 MiB (BENCHMARKS.md).
const ZEROS_SYNCED_EVERY: u64 = 4 * 1024 * 1024;

/// Makes the file at `path`, for its owner alone, `bytes` zeros, durable (its directory entry
/// aside); a file that could not be made whole is removed again.
pub(super) fn zeroed(path: &Path, bytes: u64) -> io::Result<File> {
    let make = || {
        let file = open_owned(path)?;
        file.set_len(0)?;
        let zeros = vec![0; 1024 * 1024];
        let mut at = 0;
        while at < bytes {
            let chunk = (bytes - at).min(zeros.len() as u64) as usize;
            std::os::unix::fs::FileExt::write_all_at(&file, &zeros[..chunk], at)?;
            at += chunk as u64;
            if at % ZEROS_SYNCED_EVERY == 0 {
                file.sync_data()?;
            }
        }
        file.sync_all()?;
        Ok(file)
    };
    make().inspect_err(|_| {
        let _ = std::fs::remove_file(path);
    })
}

/// Makes the directory's entries durable (a file just begun, one just removed).
pub(super) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Refuses a directory that holds another engine's store.
pub(super) fn refuse_foreign(path: &Path) -> Result<(), Error> {
    let foreign = if path.join("conf").is_file() && path.join("db").is_file() {
        Some("a sled store (SledStore)")
    } else if path.join("version").is_file() {
        Some("a fjall store (FjallStore)")
    } else {
        None
    };
    match foreign {
        Some(what) => Err(Error::backend(format!(
            "{} holds {what}, not a journal store",
            path.display()
        ))),
        None => Ok(()),
    }
}
