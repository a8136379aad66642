//! `JournalStore` killed while it compacts: a child writes 30 keys once, then overwrites 20
//! others (and puts and deletes one more each time) one commit at a time on a journal of 4 KiB
//! files, so that compactions run all the time and carry the 30 from base to base; it is killed
//! with SIGKILL after a few hundred acknowledged commits, six times on one directory. After
//! each kill the store must open, hold the 30, every overwritten key at its last acknowledged
//! value or the one commit after it, and no key that was deleted and acknowledged.
//!
//! The child is this test binary, re-run with `--ignored --exact journal_kill_child`.
#![cfg(all(unix, feature = "journal"))]

mod common;

use std::collections::HashMap;
use std::path::Path;

use dormant::store::{Batch, CommitKind, Store, Tree};
use dormant::JournalStore;

const DIR_ENV: &str = "DORMANT_JOURNAL_KILL_DIR";
const KEYS: u64 = 20;
/// Keys written once, by the first child's first commit.
const FIXED: usize = 30;
const ROUNDS: u64 = 6;

fn open(dir: &Path) -> anyhow::Result<JournalStore> {
    Ok(JournalStore::builder(dir).file_bytes(4096).open()?)
}

fn key(i: u64) -> Vec<u8> {
    format!("k{:02}", i % KEYS).into_bytes()
}

/// The commit `i` writes: key `i % 20` to `i`, and `d{i}` (deleted again by commit `i + 1`).
fn commit_of(i: u64) -> Batch {
    let mut batch = Batch::new(CommitKind::Other);
    batch.put(Tree::Log, key(i), i.to_string().into_bytes());
    batch.put(Tree::Pending, format!("d{i}").into_bytes(), vec![7; 64]);
    if i > 0 {
        batch.delete(Tree::Pending, format!("d{}", i - 1).into_bytes());
    }
    batch
}

/// The last commit the store in `dir` holds (0 for none).
async fn last_commit(store: &JournalStore) -> anyhow::Result<u64> {
    let mut last = 0;
    for (_, value) in store.scan_prefix(Tree::Log, b"k").await? {
        last = last.max(std::str::from_utf8(&value)?.parse()?);
    }
    Ok(last)
}

/// The child: goes on from the store's last commit, one commit at a time, printing each it
/// was told is durable. Only runs when the parent starts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of a_journal_killed_while_it_compacts_loses_nothing"]
async fn journal_kill_child() -> anyhow::Result<()> {
    let Ok(dir) = std::env::var(DIR_ENV) else {
        return Ok(());
    };
    let store = open(Path::new(&dir))?;
    if store.scan_prefix(Tree::Sessions, b"f").await?.is_empty() {
        let mut batch = Batch::new(CommitKind::Other);
        for j in 0..FIXED {
            batch.put(
                Tree::Sessions,
                format!("f{j:02}").into_bytes(),
                vec![j as u8; 100],
            );
        }
        store.commit(batch).await?;
        println!("fixed");
    }
    let mut i = last_commit(&store).await?;
    loop {
        i += 1;
        store.commit(commit_of(i)).await?;
        println!("acked {i}");
    }
}

#[test]
fn a_journal_killed_while_it_compacts_loses_nothing() -> anyhow::Result<()> {
    let root = tempfile::tempdir()?;
    let dir = root.path().join("journal");
    std::fs::create_dir_all(&dir)?;
    let runtime = tokio::runtime::Runtime::new()?;
    // The last acknowledged commit of each key, across every child.
    let mut acked: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut last_acked = 0;
    let mut fixed = false;
    for round in 0..ROUNDS {
        let (mut child, lines) = common::spawn_child("journal_kill_child", DIR_ENV, &dir)?;
        let wanted = 150 + round * 37;
        let mut seen = 0;
        for line in lines {
            let line = line?;
            fixed |= line.ends_with("fixed");
            let Some(i) = line.strip_prefix("acked ").map(str::parse::<u64>) else {
                continue;
            };
            let i = i?;
            acked.insert(key(i), i);
            last_acked = last_acked.max(i);
            seen += 1;
            if seen >= wanted {
                break;
            }
        }
        // Child::kill sends SIGKILL on Unix: no destructor, no flush.
        child.kill()?;
        child.wait()?;
        anyhow::ensure!(seen >= wanted, "round {round}: the child died on its own");

        runtime.block_on(async {
            let store = open(&dir)?;
            for (key, at_least) in &acked {
                let value = store.get(Tree::Log, key).await?;
                let value: u64 = std::str::from_utf8(&value.unwrap_or_default())?.parse()?;
                // The commit after the last acknowledged one may be durable too.
                anyhow::ensure!(
                    value == *at_least || value == last_acked + 1,
                    "round {round}: {} holds {value}, acknowledged {at_least}",
                    String::from_utf8_lossy(key)
                );
            }
            let kept = store.scan_prefix(Tree::Sessions, b"f").await?;
            anyhow::ensure!(
                !fixed || kept.len() == FIXED,
                "round {round}: {} of the {FIXED} keys written once are left",
                kept.len()
            );
            // Every `d{i}` but the newest one was deleted by an acknowledged commit.
            let left = store.scan_prefix(Tree::Pending, b"d").await?;
            anyhow::ensure!(left.len() == 1, "round {round}: {} entries d…", left.len());
            store.close().await?;
            anyhow::Ok(())
        })?;
    }
    let bases = std::fs::read_dir(&dir)?
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".base"))
        .count();
    anyhow::ensure!(bases == 1, "no compaction finished ({bases} bases)");
    Ok(())
}
