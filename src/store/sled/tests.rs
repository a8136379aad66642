//! The sled store's tests: commits, reads, grouping, crashes of a child process, locks and a
//! full disk.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64};

use super::database::MAX_WRITES_PER_SLED_BATCH;
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
    let store = SledStore::temporary()?;
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
    assert_eq!(store.flush_count(), 1);
    Ok(())
}

#[tokio::test]
async fn a_delete_removes_a_key_and_a_missing_key_is_no_error() -> Result<(), anyhow::Error> {
    let store = SledStore::temporary()?;
    store.commit(batch(&[(Tree::Pending, b"k", b"v")])).await?;
    let mut delete = Batch::new(CommitKind::Other);
    delete.delete(Tree::Pending, b"k".to_vec());
    delete.delete(Tree::Pending, b"never-there".to_vec());
    store.commit(delete).await?;
    assert_eq!(store.get(Tree::Pending, b"k").await?, None);
    Ok(())
}

#[tokio::test]
async fn later_ops_of_a_batch_win_over_earlier_ones() -> Result<(), anyhow::Error> {
    let store = SledStore::temporary()?;
    let mut b = Batch::new(CommitKind::Other);
    b.put(Tree::Children, b"a".to_vec(), b"1".to_vec());
    b.put(Tree::Children, b"a".to_vec(), b"2".to_vec());
    b.put(Tree::Children, b"b".to_vec(), b"1".to_vec());
    b.delete(Tree::Children, b"b".to_vec());
    store.commit(b).await?;
    assert_eq!(store.get(Tree::Children, b"a").await?, Some(b"2".to_vec()));
    assert_eq!(store.get(Tree::Children, b"b").await?, None);
    Ok(())
}

#[tokio::test]
async fn scan_prefix_returns_only_matching_keys_in_order() -> Result<(), anyhow::Error> {
    let store = SledStore::temporary()?;
    store
        .commit(batch(&[
            (Tree::Log, b"s1/2", b"b"),
            (Tree::Log, b"s1/1", b"a"),
            (Tree::Log, b"s2/1", b"x"),
            (Tree::Log, b"s1", b"bare"),
            (Tree::Ownership, b"s1/9", b"other tree"),
        ]))
        .await?;
    let got = store.scan_prefix(Tree::Log, b"s1/").await?;
    assert_eq!(
        got,
        vec![
            (b"s1/1".to_vec(), b"a".to_vec()),
            (b"s1/2".to_vec(), b"b".to_vec())
        ]
    );
    assert_eq!(store.scan_prefix(Tree::Log, b"").await?.len(), 4);
    // A prefix ending in 0xff still works.
    store
        .commit(batch(&[(Tree::Log, &[1, 0xff, 3], b"y")]))
        .await?;
    assert_eq!(store.scan_prefix(Tree::Log, &[1, 0xff]).await?.len(), 1);
    // Backwards: last key first, `limit` of them, still only the prefix.
    store
        .commit(batch(&[
            (Tree::Log, b"s1/3", b"c"),
            (Tree::Log, b"s1/4", b"d"),
        ]))
        .await?;
    let last: Vec<Vec<u8>> = store
        .scan_prefix_rev(Tree::Log, b"s1/", 2)
        .await?
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    assert_eq!(last, vec![b"s1/4".to_vec(), b"s1/3".to_vec()]);
    assert_eq!(store.scan_prefix_rev(Tree::Log, b"s1/", 10).await?.len(), 4);
    assert_eq!(
        store
            .scan_prefix_rev(Tree::Log, &[1, 0xff], 10)
            .await?
            .len(),
        1
    );
    Ok(())
}

#[tokio::test]
async fn scan_range_is_half_open_and_respects_the_limit() -> Result<(), anyhow::Error> {
    let store = SledStore::temporary()?;
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
    assert_eq!(
        keys(store.scan_range(Tree::Deadlines, &[], &[0xff], 3).await?),
        [0, 1, 2]
    );
    Ok(())
}

/// A reader that sees session version `v` must also see message `v`, written in the same
/// batch into another tree: a commit's writes become visible together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_two_trees_becomes_visible_all_at_once() -> Result<(), anyhow::Error> {
    // Without group commit, and with the session written first in the batch.
    let store = Arc::new(SledStoreBuilder::temporary().group_commit(false).open()?);
    let stop = Arc::new(AtomicBool::new(false));
    let checks = Arc::new(AtomicU64::new(0));
    let reader = {
        let (store, stop, checks) = (Arc::clone(&store), Arc::clone(&stop), Arc::clone(&checks));
        std::thread::spawn(move || -> Result<(), Error> {
            while !stop.load(Ordering::SeqCst) {
                if let Some(v) = store.get(Tree::Sessions, b"s").wait()? {
                    let message = store.get(Tree::Log, &v).wait()?;
                    assert_eq!(message, Some(v.clone()), "torn batch at version {v:?}");
                    checks.fetch_add(1, Ordering::SeqCst);
                }
            }
            Ok(())
        })
    };
    let mut i = 0u32;
    while i < 300 || checks.load(Ordering::SeqCst) < 100 {
        let v = i.to_be_bytes();
        store
            .commit(batch(&[(Tree::Sessions, b"s", &v), (Tree::Log, &v, &v)]))
            .await?;
        i += 1;
    }
    stop.store(true, Ordering::SeqCst);
    reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))??;
    Ok(())
}

#[tokio::test]
async fn every_logical_tree_keeps_its_keys_apart_in_the_one_sled_tree() -> Result<(), anyhow::Error>
{
    let store = SledStore::temporary()?;
    let mut batch = Batch::new(CommitKind::Other);
    for tree in Tree::ALL {
        batch.put(tree, b"k".to_vec(), tree.name().as_bytes().to_vec());
        batch.put(tree, b"k2".to_vec(), tree.name().as_bytes().to_vec());
    }
    store.commit(batch).await?;
    for tree in Tree::ALL {
        let name = tree.name().as_bytes().to_vec();
        assert_eq!(store.get(tree, b"k").await?, Some(name.clone()));
        assert_eq!(
            store.scan_prefix(tree, b"").await?,
            vec![
                (b"k".to_vec(), name.clone()),
                (b"k2".to_vec(), name.clone())
            ]
        );
        assert_eq!(
            store.scan_prefix_rev(tree, b"", 1).await?,
            vec![(b"k2".to_vec(), name.clone())]
        );
        assert_eq!(
            store.scan_range(tree, b"", b"k2", 10).await?,
            vec![(b"k".to_vec(), name)]
        );
    }
    // Everything lives in the one `records` tree (beside the keys that say how values are
    // kept and what the store holds).
    let open = store.shared.open()?;
    assert_eq!(open.records.len(), 2 * Tree::ALL.len() + 2);
    Ok(())
}

#[test]
fn a_large_group_is_split_into_sled_batches_between_our_batches_only() -> Result<(), anyhow::Error>
{
    let store = SledStore::temporary()?;
    let sized = |n: usize, tag: u8| {
        let mut b = Batch::new(CommitKind::Other);
        for i in 0..n {
            let mut key = vec![tag];
            key.extend_from_slice(&(i as u32).to_be_bytes());
            b.put(Tree::Ownership, key, vec![tag]);
        }
        b
    };
    let max = MAX_WRITES_PER_SLED_BATCH;
    // [max/2, max/2] fit together; [max + 10] is over the limit but never split; [1].
    let batches = [
        sized(max / 2, 1),
        sized(max / 2, 2),
        sized(max + 10, 3),
        sized(1, 4),
    ];
    let batches = batches.map(SledWrites::new);
    store.shared.commit(&batches)?;
    assert_eq!(store.shared.applied_batches.load(Ordering::SeqCst), 3);
    assert_eq!(store.flush_count(), 1);
    for (tag, n) in [(1u8, max / 2), (2, max / 2), (3, max + 10), (4, 1)] {
        assert_eq!(
            store.scan_prefix(Tree::Ownership, &[tag]).wait()?.len(),
            n,
            "batch {tag}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn committed_data_survives_a_reopen() -> Result<(), anyhow::Error> {
    let dir = tempfile::tempdir()?;
    for group_commit in [true, false] {
        let store = SledStore::builder(dir.path())
            .group_commit(group_commit)
            .open()?;
        let key = format!("group={group_commit}");
        store
            .commit(batch(&[
                (Tree::Sessions, key.as_bytes(), b"session"),
                (Tree::Tombstones, key.as_bytes(), b"tombstone"),
            ]))
            .await?;
        drop(store);
        let store = SledStore::open(dir.path())?;
        assert_eq!(
            store.get(Tree::Sessions, key.as_bytes()).await?,
            Some(b"session".to_vec())
        );
        assert_eq!(
            store.get(Tree::Tombstones, key.as_bytes()).await?,
            Some(b"tombstone".to_vec())
        );
        assert!(store.size_on_disk().await? > 0);
    }
    Ok(())
}

#[test]
fn a_store_of_an_earlier_layout_is_refused_with_the_tree_it_has() -> Result<(), anyhow::Error> {
    // The first layout's `messages` tree and the second layout's `sessions` tree.
    for old_tree in ["messages", "sessions"] {
        let dir = tempfile::tempdir()?;
        {
            let db = ::sled::open(dir.path())?;
            db.open_tree(old_tree)?.insert(b"s1", b"hello".as_slice())?;
            db.flush()?;
        }
        match SledStore::open(dir.path()) {
            Err(error) => match error.downcast_ref::<SledError>() {
                Some(SledError::OldLayout { tree }) => assert_eq!(tree, old_tree),
                _ => panic!("expected the old layout to be refused, got {error:?}"),
            },
            other => panic!("expected the old layout to be refused, got {other:?}"),
        }
    }
    // An empty tree of that name holds nothing to lose: the store opens.
    let empty = tempfile::tempdir()?;
    {
        let db = ::sled::open(empty.path())?;
        db.open_tree("stream")?;
        db.flush()?;
    }
    SledStore::open(empty.path())?;
    Ok(())
}

#[tokio::test]
async fn large_values_are_kept_in_pieces_sled_writes_no_blob_and_they_survive_a_reopen(
) -> Result<(), anyhow::Error> {
    let dir = tempfile::tempdir()?;
    let big: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    let mid: Vec<u8> = vec![3u8; 10_000];
    {
        let store = SledStore::open(dir.path())?;
        store
            .commit(batch(&[
                (Tree::Log, b"big", &big),
                (Tree::Log, b"big2", &big),
                (Tree::Pending, b"mid", &mid),
            ]))
            .await?;
        // Sled wrote no node as a separate file: nothing in `blobs/`.
        let blobs = std::fs::read_dir(dir.path().join("blobs")).map_or(0, |dir| dir.count());
        assert_eq!(blobs, 0, "sled wrote a blob file");
        assert_eq!(store.get(Tree::Log, b"big").await?, Some(big.clone()));
        // A value written again smaller, and one deleted, leave no piece behind.
        store
            .commit(batch(&[(Tree::Log, b"big2", b"small")]))
            .await?;
        let mut gone = Batch::new(CommitKind::Other);
        gone.delete(Tree::Pending, b"mid".to_vec());
        store.commit(gone).await?;
        let open = store.shared.open()?;
        let pieces = open
            .records
            .range(vec![super::values::PIECES_TAG]..vec![super::values::PIECES_TAG + 1])
            .count();
        assert_eq!(pieces, 256, "the pieces of `big` alone");
    }
    let store = SledStore::open(dir.path())?;
    assert_eq!(store.get(Tree::Log, b"big").await?, Some(big.clone()));
    assert_eq!(
        store.get(Tree::Log, b"big2").await?,
        Some(b"small".to_vec())
    );
    assert_eq!(store.get(Tree::Pending, b"mid").await?, None);
    assert_eq!(
        store.scan_prefix(Tree::Log, b"big").await?,
        vec![
            (b"big".to_vec(), big),
            (b"big2".to_vec(), b"small".to_vec())
        ]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_committers_share_flushes_and_all_commits_survive_a_reopen(
) -> Result<(), anyhow::Error> {
    const TASKS: usize = 64;
    const COMMITS: usize = 20;
    let dir = tempfile::tempdir()?;
    let store = Arc::new(SledStore::open(dir.path())?);
    let start = Arc::new(tokio::sync::Barrier::new(TASKS));
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let store = Arc::clone(&store);
        let start = Arc::clone(&start);
        tasks.spawn(async move {
            start.wait().await;
            for c in 0..COMMITS {
                let key = format!("{t:02}/{c:02}");
                let value = vec![t as u8; 512];
                store
                    .commit(batch(&[
                        (Tree::Sessions, key.as_bytes(), &value),
                        (Tree::Log, key.as_bytes(), &value),
                    ]))
                    .await?;
            }
            Ok::<_, Error>(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined??;
    }
    let flushes = store.flush_count();
    let applied = store.shared.applied_batches.load(Ordering::SeqCst);
    let commits = (TASKS * COMMITS) as u64;
    assert!(
        flushes < commits,
        "{flushes} flushes for {commits} commits: group commit did not share any"
    );
    assert!(
        applied < commits,
        "{applied} sled batches for {commits} commits: no batches were grouped"
    );
    let weak = Arc::downgrade(&store.shared);
    drop(store);
    assert!(
        weak.upgrade().is_none(),
        "the flusher thread still holds the database"
    );

    let store = SledStore::open(dir.path())?;
    assert_eq!(
        store.scan_prefix(Tree::Sessions, b"").await?.len(),
        TASKS * COMMITS
    );
    assert_eq!(
        store.scan_prefix(Tree::Log, b"").await?.len(),
        TASKS * COMMITS
    );
    Ok(())
}

/// A mark whose advance fails after a durable flush: that group is acknowledged (told
/// failed, it would still be served), but the next one is written only once the mark names
/// it; while the mark cannot move, groups fail unwritten. Commits are never acknowledged
/// past a mark left behind.
#[test]
fn a_group_is_not_written_while_the_mark_of_those_acknowledged_cannot_move(
) -> Result<(), anyhow::Error> {
    for group_commit in [true, false] {
        let dir = tempfile::tempdir()?;
        let store = SledStore::builder(dir.path())
            .group_commit(group_commit)
            .open()?;
        let mark = || crate::store::mark::read(dir.path()).map(|read| read.ok().flatten());
        store.commit(numbered(1)).wait()?;
        let first = mark()?;

        store.shared.fail_next_mark_sync();
        store.commit(numbered(2)).wait()?;
        assert_eq!(
            mark()?,
            first,
            "the mark stayed behind the acknowledged group"
        );

        store.shared.fail_next_mark_sync();
        let refused = store.commit(numbered(3)).wait();
        assert!(
            refused.is_err(),
            "a group written past a mark that cannot move"
        );
        assert!(store.degraded().is_some(), "the failure is told");

        store.commit(numbered(4)).wait()?;
        assert_eq!(shown_messages(&store)?, vec![1, 2, 4]);
        let last = mark()?;
        assert_eq!(
            last,
            first.map(|seq| seq + 2),
            "the mark names every group written"
        );
        Store::release(&store);
        let store = SledStore::open(dir.path())?;
        assert_eq!(
            shown_messages(&store)?,
            vec![1, 2, 4],
            "group commit: {group_commit}"
        );
    }
    Ok(())
}

/// At `ProcessCrash` the mark lags up to a second while the store runs; a release (a runtime
/// dropped without a close) brings it up to everything flushed, as a close does.
#[test]
fn a_released_store_s_lagging_mark_names_every_flushed_commit() -> Result<(), anyhow::Error> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::builder(dir.path())
        .durability(Durability::ProcessCrash)
        .open()?;
    let mark = || crate::store::mark::read(dir.path()).map(|read| read.ok().flatten());
    store.commit(numbered(1)).wait()?;
    let first = mark()?;
    store.commit(numbered(2)).wait()?;
    store.commit(numbered(3)).wait()?;
    // Within its second the mark lags (on a machine slow enough to take longer, it moved):
    // either way the release must leave it naming every commit.
    Store::release(&store);
    assert_eq!(
        mark()?,
        first.map(|seq| seq + 2),
        "caught up at the release"
    );
    Ok(())
}

/// A group whose flush fails after sled applied it is often on disk all the same: sled
/// writes what it applied as the failed database is let go. Told failed, it would be served
/// from the database opened again (a retried answer `already_completed`, a retried start run
/// twice); it is made durable there and acknowledged instead, and so is every commit of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_flush_failed_but_which_the_database_opened_again_holds_is_acknowledged(
) -> Result<(), anyhow::Error> {
    for group_commit in [true, false] {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(
            SledStore::builder(dir.path())
                .group_commit(group_commit)
                .open()?,
        );
        store.commit(numbered(1)).await?;
        store.shared.fail_flushes.store(true, Ordering::SeqCst);
        let told = store.commit(numbered(2)).await;
        store.shared.fail_flushes.store(false, Ordering::SeqCst);
        assert!(
            store.shared.opened.load(Ordering::SeqCst) > 1,
            "the database was opened again after the failed flush"
        );
        let shown = shown_messages(&store)?;
        assert_eq!(
            told.is_ok(),
            shown.contains(&2),
            "told {told:?}, shown {shown:?} (group commit: {group_commit})"
        );
        assert!(
            told.is_ok(),
            "sled wrote the group as it let the database go"
        );
        assert_eq!(store.degraded(), None);
        // Acknowledged means durable: the mark names it, and it is there after a reopen.
        let store = Arc::into_inner(store).ok_or_else(|| anyhow::anyhow!("one handle"))?;
        store.close().await?;
        let store = SledStore::open(dir.path())?;
        assert_eq!(shown_messages(&store)?, vec![1, 2]);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_fails_every_commit_waiting_on_it_and_none_is_served(
) -> Result<(), anyhow::Error> {
    for group_commit in [true, false] {
        let store = Arc::new(
            SledStoreBuilder::temporary()
                .group_commit(group_commit)
                .open()?,
        );
        store.shared.fail_applies.store(true, Ordering::SeqCst);
        store.shared.fail_flushes.store(true, Ordering::SeqCst);
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0u8..16 {
            let store = Arc::clone(&store);
            tasks.spawn(async move { store.commit(batch(&[(Tree::Children, &[i], &[i])])).await });
        }
        while let Some(joined) = tasks.join_next().await {
            let err = joined?.expect_err("a commit was acknowledged without a flush");
            assert!(
                matches!(err.downcast_ref::<SledError>(), Some(SledError::Io(_))),
                "{err}"
            );
        }
        store.shared.wait_let_go();
        assert!(store.flush().await.is_err());
        store.shared.wait_let_go();
        assert_eq!(store.flush_count(), 0);
        assert!(
            store.shared.opened.load(Ordering::SeqCst) > 1,
            "the database was not opened again after a failed write"
        );
        let degraded = store.degraded().unwrap_or_default();
        assert!(degraded.starts_with("the last write failed"), "{degraded}");
        store.shared.fail_applies.store(false, Ordering::SeqCst);
        store.shared.fail_flushes.store(false, Ordering::SeqCst);
        store
            .commit(batch(&[(Tree::Children, b"ok", b"ok")]))
            .await?;
        assert_eq!(store.flush_count(), 1);
        for i in 0u8..16 {
            assert_eq!(
                store.get(Tree::Children, &[i]).await?,
                None,
                "a commit told failed is served"
            );
        }
        assert_eq!(
            store.degraded(),
            None,
            "healthy again once a write succeeded"
        );
    }
    Ok(())
}

#[test]
fn a_failed_database_is_opened_again_once_however_many_commits_failed_on_it(
) -> Result<(), anyhow::Error> {
    let dir = tempfile::tempdir()?;
    for store in [SledStore::temporary()?, SledStore::open(dir.path())?] {
        futures::executor::block_on(store.commit(batch(&[(Tree::Pending, b"k", b"v")])))?;
        let failed = store.shared.open()?.generation;
        // As if two commits had failed on it.
        store.shared.replace_failed(failed);
        store.shared.replace_failed(failed);
        store.shared.wait_let_go();
        assert_eq!(store.shared.opened.load(Ordering::SeqCst), 2);
        assert_eq!(store.shared.open()?.generation, failed + 1);
        // Opened from the same directory, a temporary store's too.
        assert_eq!(store.get(Tree::Pending, b"k").wait()?, Some(b"v".to_vec()));
        futures::executor::block_on(store.commit(batch(&[(Tree::Pending, b"k2", b"v")])))?;
    }
    Ok(())
}

#[test]
fn commit_works_outside_a_tokio_runtime() -> Result<(), anyhow::Error> {
    for group_commit in [true, false] {
        let store = SledStoreBuilder::temporary()
            .group_commit(group_commit)
            .open()?;
        futures::executor::block_on(store.commit(batch(&[(Tree::Ownership, b"k", b"v")])))?;
        futures::executor::block_on(store.flush())?;
        assert_eq!(
            store.get(Tree::Ownership, b"k").wait()?,
            Some(b"v".to_vec())
        );
    }
    Ok(())
}

#[test]
fn debug_shows_path_durability_and_group_commit() -> Result<(), anyhow::Error> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::builder(dir.path())
        .durability(Durability::ProcessCrash)
        .group_commit(false)
        .cache_capacity(8 * 1024 * 1024)
        .open()?;
    let shown = format!("{store:?}");
    assert!(shown.contains("ProcessCrash"), "{shown}");
    assert!(shown.contains("group_commit: false"), "{shown}");
    assert!(shown.contains(&dir.path().display().to_string()), "{shown}");
    assert_eq!(store.path(), Some(dir.path()));
    assert!(!store.is_group_commit());
    Ok(())
}

const CRASH_CHILD_ENV: &str = "DORMANT_SLED_CRASH_CHILD_DIR";

/// Run by the parent test below in a child process, which the parent kills.
///
/// Commits, in a loop, batches that write message `n` and set the session's version to `n`
/// (in two trees), and prints `n` once the commit is acknowledged.
#[test]
fn crash_child_commits_until_killed() -> Result<(), anyhow::Error> {
    let Some(dir) = std::env::var_os(CRASH_CHILD_ENV) else {
        return Ok(()); // Only meaningful as the parent's child.
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let store = Arc::new(SledStore::open(PathBuf::from(dir))?);
        // Several concurrent sessions, so that group commit batches them.
        let mut tasks = tokio::task::JoinSet::new();
        for s in 0u8..8 {
            let store = Arc::clone(&store);
            tasks.spawn(async move {
                for n in 1u32.. {
                    let mut message_key = vec![s];
                    message_key.extend_from_slice(&n.to_be_bytes());
                    store
                        .commit(batch(&[
                            (Tree::Log, &message_key, &[0xab; 300]),
                            (Tree::Sessions, &[s], &n.to_be_bytes()),
                        ]))
                        .await?;
                    println!("acked {s} {n}");
                }
                Ok::<_, Error>(())
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined??;
        }
        Ok(())
    })
}

/// Kills a committing child process with SIGKILL, then reopens its store: every
/// acknowledged commit is there, and each session's version matches its last message
/// exactly (no batch was half-applied).
#[test]
fn after_a_killed_process_every_acked_batch_is_whole_and_none_is_torn() -> Result<(), anyhow::Error>
{
    if std::env::var_os(CRASH_CHILD_ENV).is_some() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    for round in 0..3 {
        let mut child = Command::new(std::env::current_exe()?)
            .args([
                "--exact",
                "store::sled::tests::crash_child_commits_until_killed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CRASH_CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let mut acked = [0u32; 8];
        let mut lines = BufReader::new(stdout).lines();
        let mut seen = 0;
        while seen < 400 + round * 100 {
            let Some(line) = lines.next() else {
                anyhow::bail!("child exited early after {seen} acks");
            };
            let line = line?;
            let Some(rest) = line.strip_prefix("acked ") else {
                continue;
            };
            let mut parts = rest.split(' ');
            let s: usize = parts.next().unwrap_or_default().parse()?;
            let n: u32 = parts.next().unwrap_or_default().parse()?;
            acked[s] = acked[s].max(n);
            seen += 1;
        }
        child.kill()?; // SIGKILL: no destructor, no final flush.
        child.wait()?;

        let store = SledStore::open(dir.path())?;
        for (s, &acked_n) in acked.iter().enumerate() {
            let version = match store.get(Tree::Sessions, &[s as u8]).wait()? {
                Some(v) => u32::from_be_bytes(v.as_slice().try_into()?),
                None => 0,
            };
            assert!(
                version >= acked_n,
                "session {s}: acked {acked_n}, recovered {version}"
            );
            let messages = store.scan_prefix(Tree::Log, &[s as u8]).wait()?;
            // Messages 1..=version, all of them, and nothing beyond: an orphan message or a
            // version without its message would be a torn batch.
            assert_eq!(messages.len(), version as usize, "session {s}");
            if let Some((last, _)) = messages.last() {
                assert_eq!(&last[1..], &version.to_be_bytes(), "session {s}");
            }
        }
        // Start the next round from a clean slate of counters.
        let mut reset = Batch::new(CommitKind::Other);
        for s in 0u8..8 {
            reset.delete(Tree::Sessions, vec![s]);
            for (key, _) in store.scan_prefix(Tree::Log, &[s]).wait()? {
                reset.delete(Tree::Log, key);
            }
        }
        futures::executor::block_on(store.commit(reset))?;
    }
    Ok(())
}

#[test]
fn a_second_open_of_a_directory_in_use_is_refused_naming_the_directory() -> Result<(), anyhow::Error>
{
    let dir = tempfile::tempdir()?;
    let first = SledStore::open(dir.path())?;
    match SledStore::open(dir.path()) {
        Err(Error::Locked { path }) => assert_eq!(path, dir.path()),
        other => panic!("expected the directory to be refused as locked, got {other:?}"),
    }
    drop(first);
    SledStore::open(dir.path())?;
    Ok(())
}

/// What an open on a full disk leaves behind (an empty snapshot, newer than any other) used
/// to fail every later open with sled's `Corruption`, even with space to spare.
#[test]
fn a_snapshot_sled_never_finished_writing_does_not_wedge_the_store() -> Result<(), anyhow::Error> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path())?;
    futures::executor::block_on(store.commit(numbered(1)))?;
    drop(store);
    let unfinished = dir.path().join("snap.FFFFFFFFFFFFFFFF.generating");
    File::create(&unfinished)?;
    let store = SledStore::open(dir.path())?;
    assert_eq!(shown_messages(&store)?, vec![1]);
    assert!(!unfinished.exists());
    Ok(())
}

#[test]
fn the_locked_error_names_the_directory_once_and_is_retryable() {
    let error = Error::Locked {
        path: PathBuf::from("/srv/agent-store"),
    };
    assert!(error.is_retryable());
    let shown = format!("{:#}", anyhow::Error::from(error));
    assert_eq!(
        shown,
        "store directory /srv/agent-store is in use by another process \
         (or by another open SledStore in this process)"
    );
}

const LOCK_CHILD_ENV: &str = "DORMANT_SLED_LOCK_CHILD_DIR";
const LOCK_CHILD_OPENED: &str = "lock child: store opened";

/// Run by the parent test below in a child process: opens the store, says so, and holds
/// it until its stdin is closed.
#[test]
fn lock_child_holds_the_store_until_stdin_closes() -> Result<(), anyhow::Error> {
    let Some(dir) = std::env::var_os(LOCK_CHILD_ENV) else {
        return Ok(()); // Only meaningful as the parent's child.
    };
    let store = SledStore::open(PathBuf::from(dir))?;
    println!("{LOCK_CHILD_OPENED}");
    std::io::copy(&mut std::io::stdin(), &mut std::io::sink())?;
    drop(store);
    Ok(())
}

#[test]
fn a_directory_another_process_holds_is_refused_naming_the_directory() -> Result<(), anyhow::Error>
{
    if std::env::var_os(LOCK_CHILD_ENV).is_some() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            "store::sled::tests::lock_child_holds_the_store_until_stdin_closes",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(LOCK_CHILD_ENV, dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    loop {
        let Some(line) = lines.next() else {
            anyhow::bail!("the child exited before opening the store");
        };
        // libtest prints the test's name on the same line, before it.
        if line?.ends_with(LOCK_CHILD_OPENED) {
            break;
        }
    }
    let refused = SledStore::open(dir.path());
    // Closing its stdin lets the child close the store and exit.
    drop(child.stdin.take());
    let status = child.wait()?;
    match refused {
        Err(Error::Locked { path }) => assert_eq!(path, dir.path()),
        other => panic!("expected the directory to be refused as locked, got {other:?}"),
    }
    assert!(status.success(), "the child failed: {status}");
    // The child is gone, and so is its lock.
    SledStore::open(dir.path())?;
    Ok(())
}

const FULL_DISK_CHILD_ENV: &str = "DORMANT_SLED_FULL_DISK_CHILD_DIR";
/// Printed by the child's shell once the tmpfs is mounted, and by the child once every
/// check has passed.
const FULL_DISK_MOUNTED: &str = "full-disk: tmpfs mounted";
const FULL_DISK_PASSED: &str = "full-disk: every check passed";

/// Run by the parent test below in a child process, in a mount namespace of its own, with
/// a small tmpfs mounted on the directory `DORMANT_SLED_FULL_DISK_CHILD_DIR`.
#[test]
fn full_disk_child_fills_the_disk_and_frees_it() -> Result<(), anyhow::Error> {
    let Some(mount) = std::env::var_os(FULL_DISK_CHILD_ENV) else {
        return Ok(()); // Only meaningful as the parent's child.
    };
    let mount = PathBuf::from(mount);
    for group_commit in [true, false] {
        fill_and_free_the_disk(&mount, group_commit)
            .map_err(|e| e.context(format!("group commit {group_commit}")))?;
    }
    println!("{FULL_DISK_PASSED}");
    Ok(())
}

/// One commit: message `n` in the log, and `n` as the session's last message (two keys of
/// one batch, so that a torn batch shows).
fn numbered(n: u32) -> Batch {
    batch(&[
        (Tree::Log, &n.to_be_bytes(), &[0x5a; 200]),
        (Tree::Sessions, b"last", &n.to_be_bytes()),
    ])
}

/// The messages a store shows, after checking that its last one is the session's `last`
/// (no batch torn).
fn shown_messages(store: &SledStore) -> Result<Vec<u32>, Error> {
    let messages: Vec<u32> = store
        .scan_prefix(Tree::Log, b"")
        .wait()?
        .into_iter()
        .map(|(key, _)| u32::from_be_bytes(key.try_into().unwrap_or_default()))
        .collect();
    let last = store
        .get(Tree::Sessions, b"last")
        .wait()?
        .map(|v| u32::from_be_bytes(v.try_into().unwrap_or_default()));
    assert_eq!(last, messages.last().copied(), "a torn batch is visible");
    Ok(messages)
}

fn assert_storage_full(error: &Error, dir: &Path) {
    match error {
        Error::StorageFull {
            path: Some(path),
            kind: io::ErrorKind::StorageFull,
        } if path == dir => assert!(error.is_retryable()),
        other => panic!(
            "expected StorageFull naming {}, got {other:?}",
            dir.display()
        ),
    }
}

fn fill_and_free_the_disk(mount: &Path, group_commit: bool) -> Result<(), anyhow::Error> {
    use std::io::Write;

    use anyhow::Context;

    let dir = mount.join(format!("store-group-commit-{group_commit}"));
    let store = SledStoreBuilder::new(&dir)
        .group_commit(group_commit)
        .open()?;
    let commit = |n: u32| futures::executor::block_on(store.commit(numbered(n)));
    let mut acked = Vec::new();
    let mut next = 0u32;
    for _ in 0..20 {
        commit(next)?;
        acked.push(next);
        next += 1;
    }

    // Fill the disk to its last page.
    let ballast_path = mount.join("ballast");
    let mut ballast = File::create(&ballast_path)?;
    let chunk = vec![0xb5; 64 * 1024];
    loop {
        match ballast.write_all(&chunk) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::StorageFull => break,
            Err(e) => return Err(e.into()),
        }
    }

    // Commit until one fails: sled can still fill the page it last wrote.
    let mut failed = None;
    for _ in 0..10_000 {
        let n = next;
        next += 1;
        match commit(n) {
            Ok(()) => acked.push(n),
            Err(error) => {
                failed = Some(error);
                break;
            }
        }
    }
    let failed = failed.ok_or_else(|| anyhow::anyhow!("no commit failed on a full disk"))?;
    assert_storage_full(&failed, &dir);
    println!("full-disk: commit {} failed: {failed}", next - 1);

    // While the disk stays full, a commit fails with the same error (or lands, if sled
    // found room), and a read shows only what is on disk, or fails with the same error.
    let n = next;
    next += 1;
    match commit(n) {
        Ok(()) => acked.push(n),
        Err(error) => assert_storage_full(&error, &dir),
    }
    let seen_while_full = match shown_messages(&store) {
        Ok(messages) => messages,
        Err(error) => {
            assert_storage_full(&error, &dir);
            Vec::new()
        }
    };
    println!(
        "full-disk: on the full disk, {} acknowledged, {} shown",
        acked.len(),
        seen_while_full.len()
    );

    // Free the space: the same store commits again (once the failed database has been let
    // go, off the committers' path).
    drop(ballast);
    std::fs::remove_file(&ballast_path)?;
    store.shared.wait_let_go();
    for _ in 0..20 {
        commit(next).with_context(|| format!("commit {next}, once space was freed"))?;
        acked.push(next);
        next += 1;
    }
    let shown = shown_messages(&store)?;
    for n in &acked {
        assert!(shown.contains(n), "acknowledged commit {n} is not visible");
    }
    for n in &seen_while_full {
        assert!(
            shown.contains(n),
            "commit {n}, visible on a full disk, vanished"
        );
    }

    // What the store showed is what is on disk.
    drop(store);
    let reopened = SledStore::open(&dir)?;
    assert_eq!(shown_messages(&reopened)?, shown);
    Ok(())
}

/// Whether this process runs as root (the `Uid:` line of `/proc/self/status` gives the
/// real, effective, saved and file-system user ids).
fn runs_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// A commit on a full disk fails with [`Error::StorageFull`]; once space is freed the
/// same store commits again, every acknowledged commit is visible, and what the store
/// showed is what a reopen finds. The disk is a real, 4 MiB tmpfs, mounted in a mount
/// namespace of a child process (which needs root or user namespaces, and util-linux
/// `unshare`: the test fails, saying so, without them).
#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_fails_commits_until_space_is_freed_then_the_same_store_commits_again(
) -> Result<(), anyhow::Error> {
    if std::env::var_os(FULL_DISK_CHILD_ENV).is_some() {
        return Ok(());
    }
    let mount = tempfile::tempdir()?;
    let mut unshare = Command::new("unshare");
    if !runs_as_root() {
        // An unprivileged user may mount a tmpfs in a user namespace of its own.
        unshare.arg("--map-root-user");
    }
    let script = format!(
        "mount -t tmpfs -o size=4m tmpfs \"$1\" && echo '{FULL_DISK_MOUNTED}' && \
         exec \"$2\" --exact \
         store::sled::tests::full_disk_child_fills_the_disk_and_frees_it \
         --nocapture --test-threads=1"
    );
    let output = unshare
        .args(["--mount", "sh", "-c", &script, "sh"])
        .arg(mount.path())
        .arg(std::env::current_exe()?)
        .env(FULL_DISK_CHILD_ENV, mount.path())
        .output()
        .map_err(|e| {
            anyhow::anyhow!(
                "this test runs util-linux `unshare` to mount a small tmpfs, and cannot \
                 run it: {e}"
            )
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    anyhow::ensure!(
        stdout.contains(FULL_DISK_MOUNTED),
        "this test mounts a small tmpfs in a mount namespace of its own, which needs root \
         (or unprivileged user namespaces) and util-linux `unshare`; that failed:\n{stderr}"
    );
    anyhow::ensure!(
        output.status.success() && stdout.contains(FULL_DISK_PASSED),
        "the full-disk child failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    Ok(())
}

/// A store written before values had a header (and pieces): opened, every value is brought to
/// the new form, large ones into pieces, and reads as it was; a migration cut halfway goes on
/// where it stopped.
#[test]
fn a_store_written_before_values_had_headers_is_brought_to_them_when_opened(
) -> Result<(), anyhow::Error> {
    let big: Vec<u8> = (0..300_000).map(|i| (i % 253) as u8).collect();
    for cut in [false, true] {
        let dir = tempfile::tempdir()?;
        {
            let db = ::sled::open(dir.path())?;
            let records = db.open_tree(crate::store::keyspace::RECORDS)?;
            for i in 0..3_000u32 {
                records.insert(
                    stored_key(Tree::Log, &i.to_be_bytes()),
                    &i.to_be_bytes()[..],
                )?;
            }
            records.insert(stored_key(Tree::Pending, b"big"), big.as_slice())?;
            if cut {
                // As if a migration had rewritten the first 1,024 log entries, then stopped.
                let mut progress = vec![0xF1];
                progress.extend_from_slice(b"migrating");
                let last = stored_key(Tree::Log, &1_023u32.to_be_bytes());
                records.insert(progress, last)?;
                for i in 0..1_024u32 {
                    let mut value = vec![0u8];
                    value.extend_from_slice(&i.to_be_bytes());
                    records.insert(stored_key(Tree::Log, &i.to_be_bytes()), value)?;
                }
            }
            db.flush()?;
        }
        let store = SledStore::open(dir.path())?;
        for i in [0u32, 1_023, 1_024, 2_999] {
            assert_eq!(
                store.get(Tree::Log, &i.to_be_bytes()).wait()?,
                Some(i.to_be_bytes().to_vec()),
                "log entry {i} (cut: {cut})"
            );
        }
        assert_eq!(store.scan_prefix(Tree::Log, b"").wait()?.len(), 3_000);
        assert_eq!(store.get(Tree::Pending, b"big").wait()?, Some(big.clone()));
        drop(store);
        // Opened again: nothing left to do, nothing changed.
        let store = SledStore::open(dir.path())?;
        assert_eq!(store.get(Tree::Pending, b"big").wait()?, Some(big.clone()));
    }
    Ok(())
}

/// A store that keeps a record of what it holds was written with the current layout of
/// values: one whose layout entry is gone (damage to a bookkeeping entry the digest leaves
/// out) is not "migrated", which would put a second header on every value.
#[test]
fn a_recorded_store_whose_layout_entry_is_gone_is_not_migrated_again() -> Result<(), anyhow::Error>
{
    let dir = tempfile::tempdir()?;
    let big: Vec<u8> = (0..20_000).map(|i| (i % 251) as u8).collect();
    {
        let store = SledStore::open(dir.path())?;
        store
            .commit(batch(&[
                (Tree::Sessions, b"s1", b"session"),
                (Tree::Pending, b"big", &big),
            ]))
            .wait()?;
        // Let go of the directory before sled opens it below (a drop lets go in the
        // background).
        Store::release(&store);
    }
    {
        let db = ::sled::open(dir.path())?;
        let records = db.open_tree(crate::store::keyspace::RECORDS)?;
        assert!(records
            .remove(crate::store::keyspace::meta_key(b"layout"))?
            .is_some());
        db.flush()?;
    }
    let store = SledStore::open(dir.path())?;
    assert_eq!(
        store.get(Tree::Sessions, b"s1").wait()?,
        Some(b"session".to_vec())
    );
    assert_eq!(store.get(Tree::Pending, b"big").wait()?, Some(big));
    Ok(())
}

/// The mark is written when a store is first opened, before any commit: a store that holds
/// commits without it has lost it, and is refused (it can no longer tell a lost tail), but
/// can be salvaged.
#[test]
fn a_store_holding_commits_whose_mark_is_gone_is_refused_and_can_be_salvaged(
) -> Result<(), anyhow::Error> {
    let dir = tempfile::tempdir()?;
    {
        let store = SledStore::open(dir.path())?;
        store
            .commit(batch(&[(Tree::Sessions, b"s1", b"session")]))
            .wait()?;
        Store::release(&store);
    }
    std::fs::remove_file(dir.path().join(crate::store::mark::FILE))?;
    match SledStore::open(dir.path()) {
        Err(Error::Damaged {
            damage: Damage::Unreadable { reason },
            ..
        }) => assert!(reason.contains("mark"), "{reason}"),
        other => panic!("expected the lost mark to be told, got {other:?}"),
    }
    let left = SledStore::builder(dir.path()).salvage().open()?;
    assert!(left.damage().is_some());
    assert_eq!(
        left.get(Tree::Sessions, b"s1").wait()?,
        Some(b"session".to_vec())
    );
    Store::release(&left);
    // Still refused: the salvage wrote no new mark.
    assert!(matches!(
        SledStore::open(dir.path()),
        Err(Error::Damaged { .. })
    ));
    Ok(())
}

/// Every path under `dir` (itself included) whose mode lets anyone but its owner in.
#[cfg(unix)]
fn open_to_others(dir: &std::path::Path) -> std::io::Result<Vec<(std::path::PathBuf, u32)>> {
    use std::os::unix::fs::PermissionsExt;
    let mut open = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::metadata(&path)?;
        if meta.permissions().mode() & 0o077 != 0 {
            open.push((path.clone(), meta.permissions().mode() & 0o777));
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                todo.push(entry?.path());
            }
        }
    }
    Ok(open)
}

/// Sessions hold what people typed: a new store is its owner's alone whatever the umask, and
/// one made before that rule (0755 and 0644) is narrowed when opened; a directory that holds
/// other things is not the store's to change.
#[cfg(unix)]
#[tokio::test]
async fn the_store_directory_and_its_files_are_the_owners_alone() -> Result<(), anyhow::Error> {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir()?;
    let dir = root.path().join("store");
    let store = SledStore::open(&dir)?;
    store
        .commit(batch(&[(Tree::Sessions, b"s1", &[7; 20_000])]))
        .await?;
    store.close().await?;
    assert_eq!(open_to_others(&dir)?, vec![]);

    // A store written under an older rule, or copied with a wide umask.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.is_file() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        }
    }
    assert!(!open_to_others(&dir)?.is_empty());
    let store = SledStore::open(&dir)?;
    store.close().await?;
    assert_eq!(open_to_others(&dir)?, vec![]);

    // A shared directory with other files in it keeps its mode; the store's files are narrowed.
    let shared = root.path().join("shared");
    std::fs::create_dir(&shared)?;
    std::fs::write(shared.join("notes.txt"), b"not the store's")?;
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755))?;
    let store = SledStore::open(&shared)?;
    store.close().await?;
    assert_eq!(
        std::fs::metadata(&shared)?.permissions().mode() & 0o777,
        0o755
    );
    assert_eq!(
        std::fs::metadata(shared.join("db"))?.permissions().mode() & 0o077,
        0
    );
    Ok(())
}

/// sled writes a snapshot each time it opens a database, with the process's umask: the
/// database opened again after a failed write has its files narrowed too (what counts in a
/// directory whose own mode is not the store's to narrow).
#[cfg(unix)]
#[tokio::test]
async fn files_of_a_database_opened_again_after_a_failed_write_are_the_owners_alone(
) -> Result<(), anyhow::Error> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path())?;
    store
        .commit(batch(&[(Tree::Sessions, b"s1", &[7; 100])]))
        .await?;
    // As a wide umask would leave them.
    for entry in std::fs::read_dir(dir.path())? {
        let path = entry?.path();
        if path.is_file() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        }
    }
    store.shared.fail_applies.store(true, Ordering::SeqCst);
    assert!(store
        .commit(batch(&[(Tree::Sessions, b"s2", b"v")]))
        .await
        .is_err());
    store.shared.wait_let_go();
    store.shared.fail_applies.store(false, Ordering::SeqCst);
    assert!(
        store.shared.opened.load(Ordering::SeqCst) > 1,
        "opened again"
    );
    let files: Vec<_> = open_to_others(dir.path())?
        .into_iter()
        .filter(|(path, _)| path != dir.path())
        .collect();
    assert_eq!(files, vec![]);
    store.close().await?;
    Ok(())
}
