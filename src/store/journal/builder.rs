//! Opening a [`JournalStore`] with settings other than the defaults.

use std::path::PathBuf;

use super::engine::Engine;
use super::files::FILE_BYTES;
use super::JournalStore;
use crate::store::Error;

/// Opens a [`JournalStore`]: [`JournalStore::builder`].
///
/// ```
/// # fn main() -> Result<(), dormant::store::Error> {
/// let dir = tempfile::tempdir().map_err(dormant::store::Error::backend)?;
/// let store = dormant::JournalStore::builder(dir.path())
///     .file_bytes(4 * 1024 * 1024)
///     .open()?;
/// # drop(store);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `open` is called"]
pub struct JournalStoreBuilder {
    path: PathBuf,
    salvage: bool,
    file_bytes: u64,
}

impl JournalStoreBuilder {
    /// A builder for the store in directory `path` (created if missing).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            salvage: false,
            file_bytes: FILE_BYTES,
        }
    }

    /// How large each journal file is made when it is begun (64 MiB by default; at least
    /// 4 KiB). A file is filled with zeros to this size at once, so that commits write over
    /// bytes the file has and its syncs write data alone; a group of commits that does not fit
    /// in what is left of a file goes to the next one. The next file is begun ahead, on a
    /// thread of its own, once the one being written is half full (when the disk has room for
    /// two more files), so the directory may hold one file's worth of zeros besides.
    pub fn file_bytes(mut self, bytes: u64) -> Self {
        self.file_bytes = bytes.max(4096);
        self
    }

    /// Opens the store read-only, to salvage what is left of a damaged one
    /// ([`JournalStore::salvage`]).
    pub fn salvage(mut self) -> Self {
        self.salvage = true;
        self
    }

    /// Opens the store.
    ///
    /// # Errors
    /// As [`JournalStore::open`].
    pub fn open(self) -> Result<JournalStore, Error> {
        JournalStore::start(Engine::open(&self.path, self.salvage, self.file_bytes)?)
    }
}
