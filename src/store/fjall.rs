//! The embedded fjall backend ([`FjallStore`], feature `fjall`): an LSM tree whose commits are
//! appended to one journal, offered beside [`SledStore`](crate::SledStore) because its share of
//! a suspension cycle's CPU is about half of sled's (BENCHMARKS.md, "Issue 30, goal 1
//! (2026-11-28): a second embedded engine").
//!
//! This file is the store and its reads; [`persister`] is the group-commit thread that
//! applies the batches and makes them durable, [`engine`] holds fjall's keyspace (opened,
//! checked against the mark, opened again after a failed write), [`files`] the directory
//! (its lock, its permissions, the room a group needs) and fjall's errors in the store's
//! words.

use std::fmt;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use super::keyspace::{logical_key, stored_key};
use super::{Batch, Damage, Entry, Error, Store, Tree};

mod engine;
mod files;
mod persister;

use engine::{Engine, Open};
use persister::{holds, Persister, MAX_KEY};

/// A [`Store`] on [fjall](https://docs.rs/fjall), an embedded LSM tree (feature `fjall`).
///
/// Every [`Tree`] lives in one fjall partition, `records`, as a key range of its own behind
/// its tree's tag byte, as in [`SledStore`](crate::SledStore). A group of commits is one fjall
/// write batch: one record of fjall's journal, recovered whole or not at all.
///
/// # How a commit becomes durable
///
/// `commit` queues its batch for a thread of the store's own, which applies every batch queued
/// since its last round (together, as one fjall batch), then makes the journal durable once for
/// all of them (`fdatasync`: power-loss safe, like sled's default), then answers their committers.
/// So, as with sled, many sessions share one sync.
///
/// # What is proven on it
///
/// The store contract holds on it (`tests/store_contract.rs`), as do the kill tests, the
/// full-disk test and the damage rule (below). A failed write or sync makes fjall refuse every
/// later write (it *poisons* its keyspace): this store then drops the keyspace and opens the
/// directory again, checked against its mark, and reports itself [degraded](Store::degraded)
/// until a write succeeds. fjall 2.11 does not report a journal write that ran out of space, so
/// a group is refused as [`Error::StorageFull`] unless the disk has room for it and 80 MiB
/// more (a memtable of up to 64 MiB written out as a segment, its journal); should another
/// process fill the disk between that check and the write, the loss is told
/// ([`Error::Damaged`]) rather than prevented (ARCHITECTURE.md, "fjall: a second embedded
/// engine"). sled, which has no such window, stays the default.
///
/// # Damage is told
///
/// The store keeps the sequence number of the last batch it acknowledged in a file of its own
/// (`acknowledged`, synced with each group), outside the journal it vouches for. fjall stops
/// replaying its journal at a batch it cannot read, or refuses to open it; either way a
/// store that recovers less than it acknowledged is refused with [`Error::Damaged`] saying
/// what is missing, and [`FjallStore::salvage`] opens what is left, read-only.
///
/// The directory is created for its owner alone (`0700`); fjall creates the files inside it
/// as the process's umask has it, and they are reachable only through it.
///
/// ```
/// # fn main() -> Result<(), dormant::store::Error> {
/// let dir = tempfile::tempdir().map_err(dormant::store::Error::backend)?;
/// let store = dormant::FjallStore::open(dir.path())?;
/// let runtime = dormant::Runtime::builder().store(std::sync::Arc::new(store));
/// # let _ = runtime;
/// # Ok(()) }
/// ```
pub struct FjallStore {
    engine: Arc<Engine>,
    persister: Persister,
}

impl FjallStore {
    /// Opens (or creates) the store in directory `path`.
    ///
    /// # Errors
    /// [`Error::Locked`] when another open store holds the directory (after half a second);
    /// [`Error::StorageFull`] when the disk is full; [`Error::Damaged`] when the store holds
    /// less than it acknowledged or fjall cannot read its files; otherwise the directory holds
    /// a sled store, or fjall cannot open it.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::start(Engine::open(path.as_ref(), false)?)
    }

    /// Opens the store in `path` read-only, to salvage what is left of a damaged one: what
    /// [`FjallStore::open`] refused with [`Error::Damaged`]. Every commit fails with
    /// [`Error::ReadOnly`]; [`FjallStore::damage`] tells what was lost.
    ///
    /// # Errors
    /// As [`FjallStore::open`], but for the damage itself: [`Error::Damaged`] only when fjall
    /// cannot read the files at all ([`Damage::Unreadable`](crate::store::Damage::Unreadable)).
    pub fn salvage(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::start(Engine::open(path.as_ref(), true)?)
    }

    fn start(engine: Engine) -> Result<Self, Error> {
        let engine = Arc::new(engine);
        let persister = persister::start(Arc::clone(&engine))?;
        Ok(Self { engine, persister })
    }

    /// What the store lost, when it was opened to [salvage](FjallStore::salvage) and is
    /// damaged; `None` otherwise.
    pub fn damage(&self) -> Option<Damage> {
        self.engine.damage().cloned()
    }

    /// Whether the store was opened read-only, to [salvage](FjallStore::salvage) it.
    pub fn is_read_only(&self) -> bool {
        self.engine.is_read_only()
    }

    /// The store directory.
    pub fn path(&self) -> &Path {
        self.engine.path()
    }

    /// How many durable syncs the store has made (each serves one group of commits).
    pub fn sync_count(&self) -> u64 {
        self.engine.syncs()
    }

    /// Reads with the open keyspace, or fails with [`Error::Closed`] once the store is closed.
    fn read<T>(&self, read: impl FnOnce(&Open) -> Result<T, Error>) -> Result<T, Error> {
        self.engine.read(read)
    }
}

impl fmt::Debug for FjallStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FjallStore")
            .field("path", &self.engine.path())
            .field("syncs", &self.engine.syncs())
            .finish()
    }
}

/// A stored entry as the trait gives it: its logical key and its value.
fn logical_entry<E>(item: Result<fjall::KvPair, E>, path: &Path) -> Result<Entry, Error>
where
    fjall::Error: From<E>,
{
    let (key, value) = item.map_err(|e| files::error(e.into(), path))?;
    Ok((logical_key(&key), value.to_vec()))
}

#[async_trait::async_trait]
impl Store for FjallStore {
    /// Queues the batch for the persister thread and returns once a sync that came after its
    /// write has succeeded. An empty batch writes nothing but still waits (a barrier).
    async fn commit(&self, batch: Batch) -> Result<(), Error> {
        if self.engine.is_read_only() {
            return Err(Error::ReadOnly {
                path: Some(self.engine.path().to_path_buf()),
            });
        }
        let batch = Some(batch).filter(|batch| !batch.is_empty());
        let done = self.persister.enqueue(batch)?;
        done.await.map_err(|_| Error::Closed)?
    }

    async fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        if !holds(key) {
            // Never written (fjall holds no longer key), and fjall panics on a read of one.
            return Ok(None);
        }
        self.read(|open| {
            let value = open.view().get(stored_key(tree, key));
            let value = value.map_err(|e| files::error(e.into(), open.path()))?;
            Ok(value.map(|value| value.to_vec()))
        })
    }

    async fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Entry>, Error> {
        if !holds(prefix) {
            return Ok(Vec::new());
        }
        self.read(|open| {
            open.view()
                .prefix(stored_key(tree, prefix))
                .map(|item| logical_entry(item, open.path()))
                .collect()
        })
    }

    async fn scan_prefix_rev(
        &self,
        tree: Tree,
        prefix: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, Error> {
        if !holds(prefix) {
            return Ok(Vec::new());
        }
        self.read(|open| {
            open.view()
                .prefix(stored_key(tree, prefix))
                .rev()
                .take(limit)
                .map(|item| logical_entry(item, open.path()))
                .collect()
        })
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
        let Some(range) = holdable_range(stored_key(tree, from), stored_key(tree, to)) else {
            return Ok(Vec::new());
        };
        self.read(|open| {
            open.view()
                .range(range)
                .take(limit)
                .map(|item| logical_entry(item, open.path()))
                .collect()
        })
    }

    async fn flush(&self) -> Result<(), Error> {
        if self.engine.is_read_only() {
            return Ok(());
        }
        self.persister
            .enqueue(None)?
            .await
            .map_err(|_| Error::Closed)?
    }

    /// Syncs, then releases the keyspace and the directory lock even if other handles on this
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
        self.read(|open| Ok(open.keyspace.disk_space()))
    }

    fn degraded(&self) -> Option<String> {
        self.engine.degraded()
    }
}

/// A range of stored keys, as fjall takes it.
type KeyRange = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// `from..to` in keys fjall can hold (and read without panicking): a bound longer than fjall's
/// longest key is cut to it. No key it holds lies between the cut bound and the bound itself
/// except the cut bound, so a cut `from` excludes it and a cut `to` includes it. `None`: no
/// key fjall holds is in the range.
fn holdable_range(from: Vec<u8>, to: Vec<u8>) -> Option<KeyRange> {
    let cut = |mut key: Vec<u8>| {
        key.truncate(MAX_KEY);
        key
    };
    let start = if from.len() > MAX_KEY {
        Bound::Excluded(cut(from))
    } else {
        Bound::Included(from)
    };
    let end = if to.len() > MAX_KEY {
        Bound::Included(cut(to))
    } else {
        Bound::Excluded(to)
    };
    match (&start, &end) {
        (Bound::Excluded(start), Bound::Included(end)) if start >= end => None,
        _ => Some((start, end)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::CommitKind;

    #[tokio::test]
    async fn a_commit_is_read_back_after_the_store_is_opened_again() -> Result<(), Error> {
        let dir = tempfile::tempdir().map_err(Error::backend)?;
        let store = FjallStore::open(dir.path())?;
        let mut batch = Batch::new(CommitKind::Other);
        batch.put(Tree::Log, b"s\0one".to_vec(), b"first".to_vec());
        batch.put(Tree::Pending, b"s\0one".to_vec(), b"other tree".to_vec());
        store.commit(batch).await?;
        assert!(store.sync_count() >= 1);
        store.close().await?;
        assert!(matches!(
            store.get(Tree::Log, b"s\0one").await,
            Err(Error::Closed)
        ));

        let again = FjallStore::open(dir.path())?;
        let log = again.scan_prefix(Tree::Log, b"s\0").await?;
        assert_eq!(log, vec![(b"s\0one".to_vec(), b"first".to_vec())]);
        Ok(())
    }

    #[tokio::test]
    async fn a_second_open_of_the_same_directory_is_refused_while_the_first_holds_it(
    ) -> Result<(), Error> {
        let dir = tempfile::tempdir().map_err(Error::backend)?;
        let first = FjallStore::open(dir.path())?;
        let second = FjallStore::open(dir.path());
        assert!(matches!(second, Err(Error::Locked { .. })), "{second:?}");
        first.release();
        FjallStore::open(dir.path())?;
        Ok(())
    }

    /// As sled's: a group durable but whose mark could not advance is acknowledged, and the
    /// next one is written only once the mark names it.
    #[tokio::test]
    async fn a_group_is_not_written_while_the_mark_of_those_acknowledged_cannot_move(
    ) -> Result<(), Error> {
        let dir = tempfile::tempdir().map_err(Error::backend)?;
        let store = FjallStore::open(dir.path())?;
        let commit = |n: u8| {
            let mut batch = Batch::new(CommitKind::Other);
            batch.put(Tree::Log, vec![n], vec![n]);
            store.commit(batch)
        };
        let mark = || {
            crate::store::mark::read(dir.path())
                .map_err(Error::backend)
                .map(|read| read.ok().flatten())
        };
        commit(1).await?;
        let first = mark()?;
        store.engine.fail_next_mark_sync();
        commit(2).await?;
        assert_eq!(
            mark()?,
            first,
            "the mark stayed behind the acknowledged group"
        );
        store.engine.fail_next_mark_sync();
        assert!(
            commit(3).await.is_err(),
            "a group written past a mark that cannot move"
        );
        assert!(store.degraded().is_some());
        commit(4).await?;
        async fn shown(store: &FjallStore) -> Result<Vec<u8>, Error> {
            let log = store.scan_prefix(Tree::Log, b"").await?;
            Ok(log.into_iter().flat_map(|(key, _)| key).collect())
        }
        assert_eq!(shown(&store).await?, vec![1, 2, 4]);
        assert!(mark()? > first);
        store.close().await?;
        let again = FjallStore::open(dir.path())?;
        assert_eq!(shown(&again).await?, vec![1, 2, 4]);
        Ok(())
    }

    #[cfg(unix)]
    #[test]
    fn the_directory_is_its_owners_alone() -> Result<(), Error> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().map_err(Error::backend)?;
        let path = dir.path().join("store");
        let _store = FjallStore::open(&path)?;
        let mode = std::fs::metadata(&path).map_err(Error::backend)?;
        assert_eq!(mode.permissions().mode() & 0o777, 0o700);
        Ok(())
    }
}
