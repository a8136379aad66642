//! The journal backend ([`JournalStore`], feature `journal`): a log of dormant's own. Every
//! commit is one record appended to a journal file; an index in memory says where each live
//! key's value lies; reads fetch values from the files.
//!
//! This file is the store and its reads; [`writer`] is the group-commit thread that appends
//! and syncs (to the end of the journal [`appending`] holds), [`compactor`] the thread that
//! writes a base of the live entries, [`engine`] opens the journal ([`replay`] reads it into
//! the index, checked against the mark), [`record`] is a record's bytes, [`index`] the keys in
//! memory, [`builder`] the settings, [`files`] the directory.

use std::fmt;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::keyspace::{logical_key, stored_key};
use super::{prefix_end, Batch, Damage, Entry, Error, Store, Tree};

mod appending;
mod builder;
mod compactor;
mod engine;
mod files;
mod index;
mod record;
mod replay;
mod spare;
#[cfg(test)]
mod tests;
mod window;
mod writer;

pub use builder::JournalStoreBuilder;
use engine::Engine;
use index::Found;
use writer::WriterThread;

/// A [`Store`] on a journal of dormant's own (feature `journal`, Unix only).
///
/// # How a commit becomes durable
///
/// `commit` encodes its batch as one record and queues it for a thread of the store's own,
/// which appends every record queued since its last round to the journal in one write, makes
/// them durable with one `fdatasync` (power-loss safe, like sled's default), advances the
/// store's mark of acknowledged commits, and only then shows them to reads and answers their
/// committers.
///
/// # What it holds in memory
///
/// Every live key, with where its value lies in the journal (about 150 bytes a key); values
/// are read from the files (the kernel's page cache keeps the recent ones). The journal is
/// replayed at open to build that index. Once the files hold more than twice the live entries,
/// a thread of its own compacts them into a base of the live entries alone.
///
/// # Damage is told
///
/// Each record carries its commit's sequence number and a checksum, and commits are numbered
/// one after another. A record that cannot be read at the end of the last file is a write a
/// crash cut short; anywhere else it is damage, and so is a gap in the numbers (a lost file,
/// a lost base). A store that recovers less than it acknowledged (its mark, in a file of its
/// own, says how much) is refused with [`Error::Damaged`]; [`JournalStore::salvage`] opens
/// what is left, read-only.
///
/// The directory is created for its owner alone (`0700`), its files likewise (`0600`).
///
/// ```
/// # fn main() -> Result<(), dormant::store::Error> {
/// let dir = tempfile::tempdir().map_err(dormant::store::Error::backend)?;
/// let store = dormant::JournalStore::open(dir.path())?;
/// let runtime = dormant::Runtime::builder().store(std::sync::Arc::new(store));
/// # let _ = runtime;
/// # Ok(()) }
/// ```
pub struct JournalStore {
    engine: Arc<Engine>,
    writer: WriterThread,
}

impl JournalStore {
    /// Opens (or creates) the store in directory `path`.
    ///
    /// # Errors
    /// [`Error::Locked`] when another open store holds the directory (after half a second);
    /// [`Error::StorageFull`] when the disk is full; [`Error::Damaged`] when the store holds
    /// less than it acknowledged, or a record it cannot read; otherwise the directory holds
    /// another engine's store, or cannot be read.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        JournalStoreBuilder::new(path.as_ref()).open()
    }

    /// Opens the store in `path` read-only, to salvage what is left of a damaged one: what
    /// [`JournalStore::open`] refused with [`Error::Damaged`]. Every commit fails with
    /// [`Error::ReadOnly`]; [`JournalStore::damage`] tells what was lost.
    ///
    /// # Errors
    /// As [`JournalStore::open`], but for the damage itself.
    pub fn salvage(path: impl AsRef<Path>) -> Result<Self, Error> {
        JournalStoreBuilder::new(path.as_ref()).salvage().open()
    }

    /// A builder for the store in directory `path`, for settings other than the defaults.
    pub fn builder(path: impl Into<PathBuf>) -> JournalStoreBuilder {
        JournalStoreBuilder::new(path)
    }

    fn start(engine: Engine) -> Result<Self, Error> {
        let engine = Arc::new(engine);
        let writer = writer::start(Arc::clone(&engine))?;
        Ok(Self { engine, writer })
    }

    /// What the store lost, when it was opened to [salvage](JournalStore::salvage) and is
    /// damaged; `None` otherwise.
    pub fn damage(&self) -> Option<Damage> {
        self.engine.damage().cloned()
    }

    /// Whether the store was opened read-only, to [salvage](JournalStore::salvage) it.
    pub fn is_read_only(&self) -> bool {
        self.engine.is_read_only()
    }

    /// The store directory.
    pub fn path(&self) -> &Path {
        self.engine.path()
    }

    /// How many durable syncs the store has made (each serves one group of commits).
    pub fn sync_count(&self) -> u64 {
        self.engine.syncs.load(Ordering::Relaxed)
    }

    /// The entries of `tree` between two stored-key bounds, forwards or backwards.
    fn entries(
        &self,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        rev: bool,
        limit: usize,
    ) -> Result<Vec<Entry>, Error> {
        let found = self
            .engine
            .read(|index| index.range(from, to, rev, limit))?;
        found
            .into_iter()
            .map(|(key, found)| Ok((logical_key(&key), self.value(found)?)))
            .collect()
    }

    fn value(&self, (file, loc): Found) -> Result<Vec<u8>, Error> {
        index::read(&file, loc).map_err(|e| files::io_error(e, self.engine.path()))
    }
}

impl Drop for JournalStore {
    /// Stops a compaction under way and lets the directory go (no commit can be waiting: each
    /// holds the store).
    fn drop(&mut self) {
        self.engine.close();
    }
}

impl fmt::Debug for JournalStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JournalStore")
            .field("path", &self.engine.path())
            .field("syncs", &self.sync_count())
            .finish()
    }
}

#[async_trait::async_trait]
impl Store for JournalStore {
    /// Queues the batch for the writer thread and returns once a sync that came after its
    /// write has succeeded. An empty batch writes nothing but still waits (a barrier).
    async fn commit(&self, batch: Batch) -> Result<(), Error> {
        if self.engine.is_closed() {
            return Err(Error::Closed);
        }
        if self.engine.is_read_only() {
            return Err(Error::ReadOnly {
                path: Some(self.engine.path().to_path_buf()),
            });
        }
        if let Some(refusal) = writer::refusal(&batch) {
            return Err(refusal);
        }
        // Encoded here, so that the batch is dropped on the thread that made it: a value
        // freed by another thread costs its owner more than it cost to free.
        let record = Some(batch)
            .filter(|batch| !batch.is_empty())
            .map(|batch| record::encode(&batch));
        let done = self.writer.enqueue(record)?;
        done.await.map_err(|_| Error::Closed)?
    }

    async fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let found = self
            .engine
            .read(|index| index.get(&stored_key(tree, key)))?;
        found.map(|found| self.value(found)).transpose()
    }

    async fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Entry>, Error> {
        let start = stored_key(tree, prefix);
        let end = prefix_end(&start);
        let to = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        self.entries(Bound::Included(&start), to, false, usize::MAX)
    }

    async fn scan_prefix_rev(
        &self,
        tree: Tree,
        prefix: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, Error> {
        let start = stored_key(tree, prefix);
        let end = prefix_end(&start);
        let to = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        self.entries(Bound::Included(&start), to, true, limit)
    }

    async fn scan_range(
        &self,
        tree: Tree,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, Error> {
        if from >= to {
            return Ok(Vec::new());
        }
        let (from, to) = (stored_key(tree, from), stored_key(tree, to));
        self.entries(Bound::Included(&from), Bound::Excluded(&to), false, limit)
    }

    async fn flush(&self) -> Result<(), Error> {
        if self.engine.is_closed() {
            return Err(Error::Closed);
        }
        if self.engine.is_read_only() {
            return Ok(());
        }
        self.writer
            .enqueue(None)?
            .await
            .map_err(|_| Error::Closed)?
    }

    /// Syncs, then releases the files and the directory lock even if other handles on this
    /// store remain: they answer [`Error::Closed`] from then on.
    async fn close(&self) -> Result<(), Error> {
        let flushed = self.flush().await;
        self.engine.close();
        flushed
    }

    fn release(&self) {
        self.engine.close();
    }

    fn is_closed(&self) -> bool {
        self.engine.is_closed()
    }

    async fn size_on_disk(&self) -> Result<u64, Error> {
        let path = self.engine.path();
        let entries = std::fs::read_dir(path).map_err(|e| files::io_error(e, path))?;
        // A file removed meanwhile (by a compaction) counts for nothing.
        Ok(entries
            .filter_map(|entry| entry.ok()?.metadata().ok())
            .map(|meta| meta.len())
            .sum())
    }

    fn degraded(&self) -> Option<String> {
        self.engine.degraded.lock().clone()
    }
}
