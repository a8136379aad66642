//! An in-memory [`Store`] for unit tests.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Bound;

use parking_lot::RwLock;

use super::{Batch, Entry, Error, Op, Store, Tree};

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

/// A [`Store`] that keeps everything in memory: **for unit tests only**.
///
/// Commits are atomic (a batch is applied under one write lock, so readers see all of it or
/// none of it) but nothing is durable: the data is gone when the store is dropped, and
/// [`Store::flush`] does nothing. Use [`SledStore`](super::SledStore) for anything that must
/// survive a restart.
///
/// # Examples
///
/// ```
/// use dormant::MemoryStore;
/// use dormant::store::{Batch, CommitKind, Store, Tree};
///
/// fn main() -> Result<(), dormant::store::Error> {
///     // The store's methods are async; any executor runs them.
///     futures::executor::block_on(async {
///         let store = MemoryStore::new();
///         let mut batch = Batch::new(CommitKind::Other);
///         batch.put(Tree::Log, b"s1/1".to_vec(), b"entry".to_vec());
///         store.commit(batch).await?;
///         assert_eq!(store.get(Tree::Log, b"s1/1").await?, Some(b"entry".to_vec()));
///         assert_eq!(store.len(Tree::Log), 1);
///         Ok(())
///     })
/// }
/// ```
#[derive(Default)]
pub struct MemoryStore {
    /// One map per tree, indexed by the tree's position in [`Tree::ALL`].
    trees: RwLock<[Map; Tree::ALL.len()]>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of entries in `tree`.
    pub fn len(&self, tree: Tree) -> usize {
        self.trees.read()[tree_index(tree)].len()
    }

    /// Whether every tree is empty.
    pub fn is_empty(&self) -> bool {
        self.trees.read().iter().all(BTreeMap::is_empty)
    }
}

fn tree_index(tree: Tree) -> usize {
    tree as usize
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let trees = self.trees.read();
        let mut map = f.debug_map();
        for tree in Tree::ALL {
            map.entry(&tree.name(), &trees[tree_index(tree)].len());
        }
        map.finish()
    }
}

#[async_trait::async_trait]
impl Store for MemoryStore {
    async fn commit(&self, batch: Batch) -> Result<(), Error> {
        let mut trees = self.trees.write();
        for op in batch.ops() {
            match op {
                Op::Put { tree, key, value } => {
                    trees[tree_index(*tree)].insert(key.clone(), value.clone());
                }
                Op::Delete { tree, key } => {
                    trees[tree_index(*tree)].remove(key);
                }
            }
        }
        Ok(())
    }

    async fn get(&self, tree: Tree, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.trees.read()[tree_index(tree)].get(key).cloned())
    }

    async fn scan_prefix(&self, tree: Tree, prefix: &[u8]) -> Result<Vec<Entry>, Error> {
        let trees = self.trees.read();
        Ok(trees[tree_index(tree)]
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    async fn scan_prefix_rev(
        &self,
        tree: Tree,
        prefix: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, Error> {
        let end = super::prefix_end(prefix);
        let upper = match &end {
            Some(end) => Bound::Excluded(end.as_slice()),
            None => Bound::Unbounded,
        };
        let trees = self.trees.read();
        Ok(trees[tree_index(tree)]
            .range::<[u8], _>((Bound::Included(prefix), upper))
            .rev()
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    async fn scan_range(
        &self,
        tree: Tree,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<Vec<Entry>, Error> {
        if limit == 0 || from >= to {
            // `BTreeMap::range` panics on a reversed range.
            return Ok(Vec::new());
        }
        let trees = self.trees.read();
        Ok(trees[tree_index(tree)]
            .range::<[u8], _>((Bound::Included(from), Bound::Excluded(to)))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    async fn flush(&self) -> Result<(), Error> {
        Ok(())
    }

    async fn size_on_disk(&self) -> Result<u64, Error> {
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::store::wait::Wait;
    use crate::store::CommitKind;

    fn batch(ops: &[(Tree, &[u8], &[u8])]) -> Batch {
        let mut batch = Batch::new(CommitKind::Other);
        for (tree, key, value) in ops {
            batch.put(*tree, key.to_vec(), value.to_vec());
        }
        batch
    }

    #[tokio::test]
    async fn a_committed_put_can_be_read_back() -> Result<(), anyhow::Error> {
        let store = MemoryStore::new();
        assert!(store.is_empty());
        store
            .commit(batch(&[(Tree::Sessions, b"s1", b"v1")]))
            .await?;
        assert_eq!(
            store.get(Tree::Sessions, b"s1").await?,
            Some(b"v1".to_vec())
        );
        assert_eq!(
            store.get(Tree::Log, b"s1").await?,
            None,
            "trees are separate"
        );
        assert_eq!(store.len(Tree::Sessions), 1);
        assert_eq!(store.size_on_disk().await?, 0);
        store.flush().await?;
        Ok(())
    }

    #[tokio::test]
    async fn a_delete_removes_a_key_and_later_ops_win() -> Result<(), anyhow::Error> {
        let store = MemoryStore::new();
        let mut b = Batch::new(CommitKind::Other);
        b.put(Tree::Pending, b"a".to_vec(), b"1".to_vec());
        b.put(Tree::Pending, b"a".to_vec(), b"2".to_vec());
        b.put(Tree::Pending, b"b".to_vec(), b"1".to_vec());
        b.delete(Tree::Pending, b"b".to_vec());
        b.delete(Tree::Pending, b"never-there".to_vec());
        store.commit(b).await?;
        assert_eq!(store.get(Tree::Pending, b"a").await?, Some(b"2".to_vec()));
        assert_eq!(store.get(Tree::Pending, b"b").await?, None);
        Ok(())
    }

    #[tokio::test]
    async fn scan_prefix_returns_only_matching_keys_in_order() -> Result<(), anyhow::Error> {
        let store = MemoryStore::new();
        store
            .commit(batch(&[
                (Tree::Log, b"s1/2", b"b"),
                (Tree::Log, b"s1/1", b"a"),
                (Tree::Log, b"s2/1", b"x"),
                (Tree::Log, b"s1", b"bare"),
                (Tree::Ownership, b"s1/9", b"other tree"),
            ]))
            .await?;
        assert_eq!(
            store.scan_prefix(Tree::Log, b"s1/").await?,
            vec![
                (b"s1/1".to_vec(), b"a".to_vec()),
                (b"s1/2".to_vec(), b"b".to_vec())
            ]
        );
        assert_eq!(store.scan_prefix(Tree::Log, b"").await?.len(), 4);
        Ok(())
    }

    #[tokio::test]
    async fn scan_prefix_rev_returns_the_last_keys_of_the_prefix_first() -> Result<(), anyhow::Error>
    {
        let store = MemoryStore::new();
        store
            .commit(batch(&[
                (Tree::Log, b"s1/1", b"a"),
                (Tree::Log, b"s1/2", b"b"),
                (Tree::Log, b"s1/3", b"c"),
                (Tree::Log, b"s2/1", b"x"),
                (Tree::Log, &[1, 0xff, 3], b"y"),
                (Tree::Log, &[1, 0xff, 0xff], b"z"),
                (Tree::Log, &[2], b"after"),
            ]))
            .await?;
        let keys = |entries: Vec<Entry>| -> Vec<Vec<u8>> {
            entries.into_iter().map(|(key, _)| key).collect()
        };
        assert_eq!(
            keys(store.scan_prefix_rev(Tree::Log, b"s1/", 2).await?),
            vec![b"s1/3".to_vec(), b"s1/2".to_vec()]
        );
        // The end of a prefix ending in 0xff is found past the 0xff bytes.
        assert_eq!(
            keys(store.scan_prefix_rev(Tree::Log, &[1, 0xff], 10).await?),
            vec![vec![1, 0xff, 0xff], vec![1, 0xff, 3]]
        );
        assert_eq!(store.scan_prefix_rev(Tree::Log, b"", 10).await?.len(), 7);
        assert!(store
            .scan_prefix_rev(Tree::Log, b"s1/", 0)
            .await?
            .is_empty());
        Ok(())
    }

    #[tokio::test]
    async fn scan_range_is_half_open_and_respects_the_limit() -> Result<(), anyhow::Error> {
        let store = MemoryStore::new();
        let mut b = Batch::new(CommitKind::Other);
        for i in 0u8..10 {
            b.put(Tree::Deadlines, vec![i], vec![i]);
        }
        store.commit(b).await?;
        let keys = |entries: Vec<Entry>| entries.into_iter().map(|(k, _)| k[0]).collect::<Vec<_>>();
        assert_eq!(
            keys(store.scan_range(Tree::Deadlines, &[2], &[6], 100).await?),
            [2, 3, 4, 5]
        );
        assert_eq!(
            keys(store.scan_range(Tree::Deadlines, &[2], &[6], 2).await?),
            [2, 3]
        );
        assert!(store
            .scan_range(Tree::Deadlines, &[2], &[6], 0)
            .await?
            .is_empty());
        assert!(store
            .scan_range(Tree::Deadlines, &[6], &[2], 10)
            .await?
            .is_empty());
        assert!(store
            .scan_range(Tree::Deadlines, &[4], &[4], 10)
            .await?
            .is_empty());
        Ok(())
    }

    /// A reader that sees session version `v` must also see message `v`, written in the same
    /// batch into another tree.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_over_two_trees_becomes_visible_all_at_once() -> Result<(), anyhow::Error> {
        let store = Arc::new(MemoryStore::new());
        let stop = Arc::new(AtomicBool::new(false));
        let checks = Arc::new(AtomicU64::new(0));
        let reader = {
            let (store, stop, checks) =
                (Arc::clone(&store), Arc::clone(&stop), Arc::clone(&checks));
            std::thread::spawn(move || -> Result<(), Error> {
                while !stop.load(Ordering::SeqCst) {
                    if let Some(v) = store.get(Tree::Sessions, b"s").wait()? {
                        assert_eq!(store.get(Tree::Log, &v).wait()?, Some(v.clone()));
                        checks.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Ok(())
            })
        };
        let mut i = 0u32;
        while i < 2000 || checks.load(Ordering::SeqCst) < 100 {
            let v = i.to_be_bytes();
            store
                .commit(batch(&[(Tree::Sessions, b"s", &v), (Tree::Log, &v, &v)]))
                .await?;
            i += 1;
            tokio::task::yield_now().await;
        }
        stop.store(true, Ordering::SeqCst);
        reader
            .join()
            .map_err(|_| anyhow::anyhow!("reader panicked"))??;
        Ok(())
    }

    #[test]
    fn debug_lists_entry_counts_per_tree() -> Result<(), anyhow::Error> {
        let store = MemoryStore::new();
        futures::executor::block_on(store.commit(batch(&[(Tree::Ownership, b"k", b"v")])))?;
        let shown = format!("{store:?}");
        assert!(shown.contains("\"ownership\": 1"), "{shown}");
        Ok(())
    }
}
