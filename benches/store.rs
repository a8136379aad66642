//! Durable commits per second of a ~1 KiB batch (one put into `sessions`, one into
//! `log`), through `SledStore` and through bare sled.
//!
//! * `sled_store/group_commit/{1,64}`: `SledStore`, group commit on (the batches queued
//!   while a flush runs are applied in one sled transaction, then flushed once), power-loss
//!   durability.
//! * `sled_store/group_commit_process_crash/64`: the same at process-crash durability (no
//!   `fdatasync`), to show what the sync costs under group commit.
//! * `sled_store/no_group_commit/{1,64}`: `SledStore`, one flush + `fdatasync` per commit.
//! * `bare_sled/flush_per_write/1`: raw `Tree::insert` ×2, `Db::flush`, `fdatasync` of the `db`
//!   file, per write: the one-commit-one-flush ceiling of the disk.
//! * `bare_sled/flush_per_64_writes/64`: 64 writes (no transaction), then one flush +
//!   `fdatasync`, on one thread: what ideal group commit of 64 writers could reach.
//!
//! One element = one durable batch. Run with `cargo bench --bench store`; the stores live in
//! temporary directories under the system temp dir, so the numbers are those of that disk.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dormant::store::{Batch, CommitKind, Durability, Store, Tree};
use dormant::SledStore;

const VALUE_BYTES: usize = 500;
const CONCURRENCY: [usize; 2] = [1, 64];

/// Unique keys across all iterations, so that every commit inserts new entries.
static SEQ: AtomicU64 = AtomicU64::new(0);

fn keys(writer: usize) -> (Vec<u8>, Vec<u8>) {
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let session = format!("session-{writer:04}").into_bytes();
    let mut message = session.clone();
    message.extend_from_slice(&seq.to_be_bytes());
    (session, message)
}

fn one_kib_batch(writer: usize) -> Batch {
    let (session, message) = keys(writer);
    let mut batch = Batch::new(CommitKind::ToolResults);
    batch.put(Tree::Sessions, session, vec![0x5a; VALUE_BYTES]);
    batch.put(Tree::Log, message, vec![0xa5; VALUE_BYTES]);
    batch
}

/// Runs `iters` rounds in which each of `writers` concurrent tasks commits one batch; returns
/// the elapsed time. Each writer commits `iters` batches back to back.
async fn concurrent_commits(store: Arc<SledStore>, writers: usize, iters: u64) -> Duration {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for writer in 0..writers {
        let store = Arc::clone(&store);
        tasks.spawn(async move {
            for _ in 0..iters {
                if let Err(e) = store.commit(one_kib_batch(writer)).await {
                    panic!("commit failed: {e}");
                }
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        if let Err(e) = joined {
            panic!("writer task failed: {e}");
        }
    }
    start.elapsed()
}

fn bench_sled_store(c: &mut Criterion) {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => panic!("tokio runtime: {e}"),
    };
    let mut group = c.benchmark_group("sled_store");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));

    let variants: [(&str, bool, Durability, &[usize]); 3] = [
        ("group_commit", true, Durability::PowerLoss, &CONCURRENCY),
        (
            "group_commit_process_crash",
            true,
            Durability::ProcessCrash,
            &[64],
        ),
        (
            "no_group_commit",
            false,
            Durability::PowerLoss,
            &CONCURRENCY,
        ),
    ];
    for (name, group_commit, durability, concurrencies) in variants {
        for &writers in concurrencies {
            let dir = tempdir();
            let store = match SledStore::builder(dir.path())
                .group_commit(group_commit)
                .durability(durability)
                .open()
            {
                Ok(store) => Arc::new(store),
                Err(e) => panic!("open store: {e}"),
            };
            let commits = Arc::new(AtomicU64::new(0));
            group.throughput(Throughput::Elements(writers as u64));
            group.bench_with_input(BenchmarkId::new(name, writers), &writers, |b, &writers| {
                b.to_async(&runtime).iter_custom(|iters| {
                    commits.fetch_add(iters * writers as u64, Ordering::Relaxed);
                    concurrent_commits(Arc::clone(&store), writers, iters)
                });
            });
            let commits = commits.load(Ordering::Relaxed);
            let flushes = store.flush_count().max(1);
            eprintln!(
                "    {name}/{writers}: {commits} commits, {flushes} flushes, {:.1} commits per flush",
                commits as f64 / flushes as f64
            );
        }
    }
    group.finish();
}

/// Bare sled: the same two inserts, `Db::flush`, and `fdatasync` of the data file.
struct Bare {
    db: sled::Db,
    sessions: sled::Tree,
    messages: sled::Tree,
    data_file: File,
}

impl Bare {
    fn open(dir: &Path) -> Self {
        let opened = (|| -> Result<Self, Box<dyn std::error::Error>> {
            let db = sled::Config::new().path(dir).open()?;
            Ok(Self {
                sessions: db.open_tree("sessions")?,
                messages: db.open_tree("log")?,
                data_file: OpenOptions::new().write(true).open(dir.join("db"))?,
                db,
            })
        })();
        match opened {
            Ok(bare) => bare,
            Err(e) => panic!("open bare sled: {e}"),
        }
    }

    fn write(&self, writer: usize) {
        let (session, message) = keys(writer);
        let inserted = self
            .sessions
            .insert(session, vec![0x5a; VALUE_BYTES])
            .and_then(|_| self.messages.insert(message, vec![0xa5; VALUE_BYTES]));
        if let Err(e) = inserted {
            panic!("insert: {e}");
        }
    }

    fn flush_and_sync(&self) {
        if let Err(e) = self.db.flush() {
            panic!("flush: {e}");
        }
        if let Err(e) = self.data_file.sync_data() {
            panic!("fdatasync: {e}");
        }
    }
}

fn bench_bare_sled(c: &mut Criterion) {
    let mut group = c.benchmark_group("bare_sled");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));

    let dir = tempdir();
    let bare = Bare::open(dir.path());
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("flush_per_write", 1), |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                bare.write(0);
                bare.flush_and_sync();
            }
            start.elapsed()
        });
    });

    group.throughput(Throughput::Elements(64));
    group.bench_function(BenchmarkId::new("flush_per_64_writes", 64), |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                for writer in 0..64 {
                    bare.write(writer);
                }
                bare.flush_and_sync();
            }
            start.elapsed()
        });
    });
    group.finish();
}

fn tempdir() -> tempfile::TempDir {
    match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => panic!("temp dir: {e}"),
    }
}

criterion_group!(benches, bench_sled_store, bench_bare_sled);
criterion_main!(benches);
