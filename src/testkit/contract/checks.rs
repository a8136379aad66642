//! The checks of a working store: reads, writes, scans, large values, atomicity, concurrency,
//! health.

use std::sync::Arc;

use super::{batch, keys, shown, shown_value, Check, ContractError};
use crate::store::{Batch, CommitKind, Store, Tree};

/// Checks 0 to 5: reads, puts, deletes and batches in every tree.
pub(super) async fn reads_and_writes(store: &Arc<dyn Store>) -> Result<(), ContractError> {
    let check = Check::new(0, store);
    for tree in Tree::ALL {
        check.expect(tree, b"contract/missing", None).await?;
        let found = check.scan_prefix(tree, b"contract/").await?;
        check.ensure(found.is_empty(), || {
            format!(
                "{} has {:?} under contract/ before any commit",
                tree.name(),
                keys(&found)
            )
        })?;
    }

    // Every tree, one batch; the empty value and bytes 0x00 and 0xff in a key are values too.
    let check = Check::new(1, store);
    let mut written = Batch::new(CommitKind::Other);
    for tree in Tree::ALL {
        written.put(
            tree,
            b"contract/rw/k".to_vec(),
            tree.name().as_bytes().to_vec(),
        );
        written.put(tree, b"contract/rw/\x00\xff".to_vec(), Vec::new());
    }
    check.commit(written).await?;
    for tree in Tree::ALL {
        check
            .expect(tree, b"contract/rw/k", Some(tree.name().as_bytes()))
            .await?;
        check
            .expect(tree, b"contract/rw/\x00\xff", Some(b""))
            .await?;
    }

    let check = Check::new(2, store);
    for tree in Tree::ALL {
        let found = check.scan_prefix(tree, b"contract/rw/").await?;
        let expected = [
            (b"contract/rw/\x00\xff".to_vec(), Vec::new()),
            (b"contract/rw/k".to_vec(), tree.name().as_bytes().to_vec()),
        ];
        check.ensure(found == expected, || {
            format!(
                "{} scans {:?} under contract/rw/, only its own two keys expected",
                tree.name(),
                keys(&found)
            )
        })?;
    }

    let check = Check::new(3, store);
    check
        .commit(batch(
            Tree::Pending,
            &[(b"contract/rw/k", None), (b"contract/rw/never", None)],
        ))
        .await?;
    check.expect(Tree::Pending, b"contract/rw/k", None).await?;
    check
        .expect(Tree::Pending, b"contract/rw/never", None)
        .await?;
    check
        .expect(Tree::Log, b"contract/rw/k", Some(b"log"))
        .await?;

    let check = Check::new(4, store);
    check
        .commit(batch(
            Tree::Pending,
            &[
                (b"contract/later/put-delete", Some(b"x")),
                (b"contract/later/put-delete", None),
                (b"contract/later/delete-put", None),
                (b"contract/later/delete-put", Some(b"kept")),
                (b"contract/later/put-put", Some(b"first")),
                (b"contract/later/put-put", Some(b"last")),
            ],
        ))
        .await?;
    check
        .expect(Tree::Pending, b"contract/later/put-delete", None)
        .await?;
    check
        .expect(Tree::Pending, b"contract/later/delete-put", Some(b"kept"))
        .await?;
    check
        .expect(Tree::Pending, b"contract/later/put-put", Some(b"last"))
        .await?;
    // A key that held a value, written then deleted in one batch, is gone too.
    check
        .commit(batch(
            Tree::Pending,
            &[
                (b"contract/later/put-put", Some(b"again")),
                (b"contract/later/put-put", None),
            ],
        ))
        .await?;
    check
        .expect(Tree::Pending, b"contract/later/put-put", None)
        .await?;

    let check = Check::new(5, store);
    check.commit(Batch::new(CommitKind::Other)).await?;
    check
        .expect(Tree::Log, b"contract/rw/k", Some(b"log"))
        .await
}

/// Checks 6 to 8: the three scans, their order, bounds and limits.
pub(super) async fn scans(store: &Arc<dyn Store>) -> Result<(), ContractError> {
    let check = Check::new(6, store);
    let tree = Tree::Deadlines;
    check
        .commit(batch(
            tree,
            &[
                (b"contract/scan/b/2", Some(b"b2")),
                (b"contract/scan/a", Some(b"a")),
                (b"contract/scan/a/1", Some(b"a1")),
                (b"contract/scan/a/\xff", Some(b"aff")),
                (b"contract/scan/a/\xff\xff", Some(b"affff")),
                (b"contract/scan/a/10", Some(b"a10")),
                (b"contract/scan/a/2", Some(b"a2")),
                (b"contract/scan/b/1", Some(b"b1")),
                (b"contract/scan/ab", Some(b"ab")),
                (b"contract/scan/b", Some(b"b")),
            ],
        ))
        .await?;
    // Elsewhere in the tree, and the same keys in another tree: never in these scans.
    check
        .commit(batch(
            tree,
            &[
                (b"contract/scam", Some(b"x")),
                (b"contract/scan", Some(b"x")),
            ],
        ))
        .await?;
    check
        .commit(batch(Tree::Children, &[(b"contract/scan/a/3", Some(b"x"))]))
        .await?;
    let expect_keys = |found: &[crate::store::Entry], expected: &[&[u8]], what: &str| {
        let wanted: Vec<String> = expected.iter().map(|key| shown(key)).collect();
        check.ensure(keys(found) == wanted, || {
            format!("{what} gives {:?}, expected {wanted:?}", keys(found))
        })
    };
    let a: [&[u8]; 6] = [
        b"contract/scan/a",
        b"contract/scan/a/1",
        b"contract/scan/a/10",
        b"contract/scan/a/2",
        b"contract/scan/a/\xff",
        b"contract/scan/a/\xff\xff",
    ];
    let found = check.scan_prefix(tree, b"contract/scan/a").await?;
    expect_keys(
        &found,
        &[&a[..], &[b"contract/scan/ab"]].concat(),
        "scan_prefix(contract/scan/a)",
    )?;
    let value = found.first().map(|(_, value)| value.as_slice());
    check.ensure(value == Some(b"a"), || {
        format!("the scan's first value is {}", shown_value(value))
    })?;
    let found = check.scan_prefix(tree, b"contract/scan/a/").await?;
    expect_keys(&found, &a[1..], "scan_prefix(contract/scan/a/)")?;
    // A prefix ending in 0xff bytes has no key after it to stop at.
    let found = check.scan_prefix(tree, b"contract/scan/a/\xff").await?;
    expect_keys(&found, &a[4..], "scan_prefix(contract/scan/a/\\xff)")?;
    let found = check.scan_prefix(tree, b"contract/scan/c").await?;
    expect_keys(&found, &[], "scan_prefix(contract/scan/c)")?;

    let check = Check::new(7, store);
    let rev = |prefix: &'static [u8], limit: usize| async move {
        store
            .scan_prefix_rev(tree, prefix, limit)
            .await
            .map_err(|error| Check::new(7, store).failed(error))
    };
    let expect_rev = |found: &[crate::store::Entry], expected: &[&[u8]], what: &str| {
        let wanted: Vec<String> = expected.iter().map(|key| shown(key)).collect();
        check.ensure(keys(found) == wanted, || {
            format!("{what} gives {:?}, expected {wanted:?}", keys(found))
        })
    };
    expect_rev(
        &rev(b"contract/scan/a/", 2).await?,
        &[a[5], a[4]],
        "scan_prefix_rev(contract/scan/a/, 2)",
    )?;
    let mut all_a: Vec<&[u8]> = a[1..].to_vec();
    all_a.reverse();
    expect_rev(
        &rev(b"contract/scan/a/", 100).await?,
        &all_a,
        "scan_prefix_rev(contract/scan/a/, 100)",
    )?;
    expect_rev(
        &rev(b"contract/scan/a/\xff", 100).await?,
        &[a[5], a[4]],
        "scan_prefix_rev(contract/scan/a/\\xff, 100)",
    )?;
    expect_rev(
        &rev(b"contract/scan/a/", 0).await?,
        &[],
        "scan_prefix_rev with limit 0",
    )?;
    expect_rev(
        &rev(b"contract/scan/c", 10).await?,
        &[],
        "scan_prefix_rev(contract/scan/c, 10)",
    )?;

    let check = Check::new(8, store);
    let range = |from: &'static [u8], to: &'static [u8], limit: usize| async move {
        store
            .scan_range(tree, from, to, limit)
            .await
            .map_err(|error| Check::new(8, store).failed(error))
    };
    let expect_range = |found: &[crate::store::Entry], expected: &[&[u8]], what: &str| {
        let wanted: Vec<String> = expected.iter().map(|key| shown(key)).collect();
        check.ensure(keys(found) == wanted, || {
            format!("{what} gives {:?}, expected {wanted:?}", keys(found))
        })
    };
    expect_range(
        &range(b"contract/scan/a/10", b"contract/scan/b/1", 100).await?,
        &[
            a[2],
            a[3],
            a[4],
            a[5],
            b"contract/scan/ab",
            b"contract/scan/b",
        ],
        "scan_range(contract/scan/a/10, contract/scan/b/1, 100)",
    )?;
    expect_range(
        &range(b"contract/scan/a/10", b"contract/scan/b/1", 2).await?,
        &[a[2], a[3]],
        "scan_range(contract/scan/a/10, contract/scan/b/1, 2)",
    )?;
    expect_range(
        &range(b"contract/scan/a/0", b"contract/scan/a/1\x00", 100).await?,
        &[a[1]],
        "scan_range(contract/scan/a/0, contract/scan/a/1\\x00, 100)",
    )?;
    expect_range(
        &range(b"contract/scan/a", b"contract/scan/b/3", 0).await?,
        &[],
        "scan_range with limit 0",
    )?;
    expect_range(
        &range(b"contract/scan/b", b"contract/scan/a", 100).await?,
        &[],
        "scan_range with from after to",
    )?;
    expect_range(
        &range(b"contract/scan/b", b"contract/scan/b", 100).await?,
        &[],
        "scan_range with from equal to to",
    )
}

/// Check 9: values larger than a page (sled keeps values over 4 KiB in pieces), up to the
/// runtime's largest (1 MiB), overwritten, scanned and deleted.
pub(super) async fn large_values(store: &Arc<dyn Store>) -> Result<(), ContractError> {
    let check = Check::new(9, store);
    let sizes = [4095usize, 4096, 4097, 5000, 65_536, 300_000, 1 << 20];
    let value = |size: usize, seed: u8| -> Vec<u8> {
        (0..size).map(|index| (index % 251) as u8 ^ seed).collect()
    };
    let mut written = Batch::new(CommitKind::Other);
    for size in sizes {
        written.put(
            Tree::Log,
            format!("contract/large/{size:08}").into_bytes(),
            value(size, 0),
        );
    }
    check.commit(written).await?;
    for size in sizes {
        let key = format!("contract/large/{size:08}");
        check
            .expect(Tree::Log, key.as_bytes(), Some(&value(size, 0)))
            .await?;
    }
    let found = check.scan_prefix(Tree::Log, b"contract/large/").await?;
    let whole = found.len() == sizes.len()
        && found
            .iter()
            .zip(sizes)
            .all(|((_, got), size)| *got == value(size, 0));
    check.ensure(whole, || {
        format!(
            "scan_prefix(contract/large/) gives {:?} of other lengths or keys",
            keys(&found)
        )
    })?;

    // Large over large, small over large, large over small; then deleted, leaving no piece.
    let mut rewritten = Batch::new(CommitKind::Other);
    rewritten.put(
        Tree::Log,
        b"contract/large/00065536".to_vec(),
        value(70_000, 7),
    );
    rewritten.put(
        Tree::Log,
        b"contract/large/00300000".to_vec(),
        b"small".to_vec(),
    );
    rewritten.put(
        Tree::Log,
        b"contract/large/small".to_vec(),
        b"small".to_vec(),
    );
    check.commit(rewritten).await?;
    let mut grown = Batch::new(CommitKind::Other);
    grown.put(Tree::Log, b"contract/large/small".to_vec(), value(9_000, 3));
    check.commit(grown).await?;
    check
        .expect(
            Tree::Log,
            b"contract/large/00065536",
            Some(&value(70_000, 7)),
        )
        .await?;
    check
        .expect(Tree::Log, b"contract/large/00300000", Some(b"small"))
        .await?;
    check
        .expect(Tree::Log, b"contract/large/small", Some(&value(9_000, 3)))
        .await?;

    let mut deleted = Batch::new(CommitKind::Other);
    for (key, _) in &found {
        deleted.delete(Tree::Log, key.clone());
    }
    deleted.delete(Tree::Log, b"contract/large/small".to_vec());
    check.commit(deleted).await?;
    let left = check.scan_prefix(Tree::Log, b"contract/large/").await?;
    check.ensure(left.is_empty(), || {
        format!(
            "after deleting every large value, {:?} are left",
            keys(&left)
        )
    })?;
    check
        .expect(Tree::Log, b"contract/large/00065536", None)
        .await
}

/// Check 10: a reader that sees one tree's half of a commit sees the other's too, while
/// another task commits.
pub(super) async fn atomic_batches(store: &Arc<dyn Store>) -> Result<(), ContractError> {
    const COMMITS: u32 = 200;
    let check = Check::new(10, store);
    let writer = {
        let store = Arc::clone(store);
        tokio::spawn(async move {
            for version in 0..COMMITS {
                let version = version.to_be_bytes().to_vec();
                let mut batch = Batch::new(CommitKind::Other);
                // The session first: a reader that sees it must find the log entry too.
                batch.put(Tree::Sessions, b"contract/atomic".to_vec(), version.clone());
                let mut key = b"contract/atomic/".to_vec();
                key.extend_from_slice(&version);
                batch.put(Tree::Log, key, version);
                store.commit(batch).await?;
                tokio::task::yield_now().await;
            }
            Ok::<_, crate::store::Error>(())
        })
    };
    let mut seen = 0u32;
    loop {
        let done = writer.is_finished();
        if let Some(version) = check.get(Tree::Sessions, b"contract/atomic").await? {
            let mut key = b"contract/atomic/".to_vec();
            key.extend_from_slice(&version);
            check.expect(Tree::Log, &key, Some(&version)).await?;
            seen += 1;
        }
        if done {
            break;
        }
        tokio::task::yield_now().await;
    }
    match writer.await {
        Ok(written) => written.map_err(|error| check.failed(error))?,
        Err(joined) => {
            return Err(super::ContractError::Broken {
                check: check.name,
                detail: format!("the committing task failed: {joined}"),
            })
        }
    }
    check.ensure(seen > 0, || "the reader never saw a commit".to_owned())?;
    let last = (COMMITS - 1).to_be_bytes();
    check
        .expect(Tree::Sessions, b"contract/atomic", Some(&last))
        .await
}

/// Check 11: many commits at once (a backend may group them), each acknowledged and visible.
pub(super) async fn concurrent_commits(store: &Arc<dyn Store>) -> Result<(), ContractError> {
    const WRITERS: usize = 100;
    let check = Check::new(11, store);
    let writers = (0..WRITERS).map(|index| {
        let store = Arc::clone(store);
        async move {
            let key = format!("contract/concurrent/{index:04}");
            store
                .commit(batch(
                    Tree::Tombstones,
                    &[(key.as_bytes(), Some(key.as_bytes()))],
                ))
                .await
        }
    });
    for written in futures::future::join_all(writers).await {
        written.map_err(|error| check.failed(error))?;
    }
    let found = check
        .scan_prefix(Tree::Tombstones, b"contract/concurrent/")
        .await?;
    let whole = found.len() == WRITERS && found.iter().all(|(key, value)| key == value);
    check.ensure(whole, || {
        format!(
            "{} of {WRITERS} concurrent commits are visible",
            found.len()
        )
    })
}

/// Check 12: flush, size and health of a store nothing is wrong with.
pub(super) async fn healthy(store: &Arc<dyn Store>) -> Result<(), ContractError> {
    let check = Check::new(12, store);
    store.flush().await.map_err(|error| check.failed(error))?;
    store
        .size_on_disk()
        .await
        .map_err(|error| check.failed(error))?;
    let degraded = store.degraded();
    check.ensure(degraded.is_none(), || {
        format!("degraded() says {degraded:?}")
    })?;
    check.ensure(!store.is_closed(), || {
        "is_closed() is true before any close".to_owned()
    })
}
