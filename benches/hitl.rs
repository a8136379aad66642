//! Run with: cargo bench --bench hitl            (add `-- --quick` for a short run)
//!
//! The human-in-the-loop paths, each beside the raw cost of its parts in the same run:
//! suspension cycles (execute → suspend → durable submit → resume → complete) against bare
//! sled group commit of the same number of writes of the same size; `find_expired_pending`
//! as the deadline index grows; submit latency with 10,000 calls pending under one root
//! against 10,000 roots with one each; and what a suspended, evicted session keeps resident.
//!
//! One section alone: `HITL_ONLY=cycles|memory_cycles|wait_cost|expired|submits|memory cargo
//! bench --bench hitl`, several with commas (`HITL_ONLY=cycles,memory_cycles`).
//! `fjall_cycles` runs the suspension cycles on `FjallStore`, `journal_cycles` on
//! `JournalStore` (the bench builds the crate with its `fjall` and `journal` features).
//! `memory_cycles` runs the same cycles on `MemoryStore`: the runtime's
//! own ceiling, with nothing durable. `wait_cost` runs them on `MemoryStore` with every commit
//! held up first, with no I/O: what waiting on a store costs the runtime itself, the ceiling
//! of any store whose commit cannot finish in the caller's own poll. The bench runs on mimalloc (`--features system-allocator`
//! for the system's; see `support/allocator.rs`).

#[path = "support/allocator.rs"]
mod allocator;
#[path = "support/cpu.rs"]
mod cpu;
#[path = "support/cycles.rs"]
mod cycles;
#[path = "support/rss.rs"]
mod rss;
#[path = "support/submits.rs"]
mod submits;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dormant::store::{Batch, CommitKind, Store, Tree};
use dormant::Submit;
use dormant::{MemoryStore, SledStore};
use dormant::{ModelReply, Runtime, SessionId, ToolCall};
use futures::stream::{self, StreamExt};
use serde_json::json;

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "# dormant human-in-the-loop bench ({} cores, {} allocator)",
        num_cpus(),
        allocator::NAME
    );
    let only = std::env::var("HITL_ONLY").ok();
    let wants = |name: &str| {
        only.as_deref()
            .is_none_or(|only| only.split(',').any(|one| one == name))
    };
    runtime.block_on(async {
        if wants("cycles") {
            suspension_cycles(quick).await?;
        }
        if wants("memory_cycles") {
            memory_cycles(quick).await?;
        }
        #[cfg(feature = "fjall")]
        if wants("fjall_cycles") {
            fjall_cycles(quick).await?;
        }
        #[cfg(all(unix, feature = "journal"))]
        if wants("journal_cycles") {
            journal_cycles(quick).await?;
        }
        if wants("wait_cost") {
            wait_cost(quick).await?;
        }
        if wants("expired") {
            expired_scan(quick).await?;
        }
        if wants("submits") {
            submit_latency(quick).await?;
        }
        if wants("memory") {
            evicted_memory(quick).await?;
        }
        anyhow::Ok(())
    })
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn runtime_on(store: Arc<dyn Store>, script: Vec<ModelReply>) -> anyhow::Result<Runtime> {
    Ok(cycles::editor_runtime(store, script)?.build()?)
}

async fn suspension_cycles(quick: bool) -> anyhow::Result<()> {
    println!("\n## Suspension cycles/s (durable at each step, power-loss safe, group commit)\n");
    println!("| concurrent sessions | cycles | cycles/s | CPU µs/cycle | commits/cycle | commits/flush | key writes/cycle | bytes/commit | bare sled cycles/s (same writes, same size, same grouping) | ratio |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &(concurrency, cycles) in cycle_cases(quick) {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(SledStore::open(dir.path())?);
        let runtime = runtime_on(store.clone(), cycles::one_call_script())?;
        let (ours, cpu) = run_cycles(&runtime, concurrency, cycles).await?;
        let flushes = store.flush_count();
        let stats = runtime.stats();
        runtime.shutdown().await?;
        let commits = stats.commit_latency.count;
        let per_cycle = commits as f64 / cycles as f64;
        let keys = stats.commit_writes as f64 / cycles as f64;
        let bytes = (stats.commit_bytes / commits.max(1)) as usize;
        let bare_writes_per_s = bare_sled_group_commit(commits as usize, bytes, concurrency)?;
        let bare_cycles = bare_writes_per_s / per_cycle;
        println!(
            "| {concurrency} | {cycles} | {ours:.0} | {} | {per_cycle:.1} | {:.0} | {keys:.1} | {bytes} | {bare_cycles:.0} | {:.0}% |",
            cpu_per_cycle(cpu, cycles),
            commits as f64 / flushes.max(1) as f64,
            100.0 * ours / bare_cycles
        );
    }
    Ok(())
}

/// (concurrent sessions, cycles). 10,000 cycles with 10,000 in flight start every session at
/// once and finish them in a few waves; 30,000 keep 10,000 in flight for most of the run
/// (the steady state, with a store and an actor table three times larger).
fn cycle_cases(quick: bool) -> &'static [(usize, usize)] {
    if quick {
        &[(1, 50), (100, 500), (10_000, 10_000)]
    } else {
        &[(1, 300), (100, 3_000), (10_000, 10_000), (10_000, 30_000)]
    }
}

/// Runs `cycles` suspension cycles, `concurrency` at a time, each on a fresh session;
/// returns cycles/s and the process CPU time they took (`None` without procfs).
async fn run_cycles(
    runtime: &Runtime,
    concurrency: usize,
    cycles: usize,
) -> anyhow::Result<(f64, Option<Duration>)> {
    let cpu_before = cpu::process_cpu();
    let started = Instant::now();
    cycles::drive(runtime, concurrency, cycles).await?;
    let elapsed = started.elapsed();
    let cpu = cpu::process_cpu()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    Ok((cycles as f64 / elapsed.as_secs_f64(), cpu))
}

/// CPU µs per cycle as a table cell ("—" without procfs).
fn cpu_per_cycle(cpu: Option<Duration>, cycles: usize) -> String {
    cpu.map_or_else(
        || "—".to_string(),
        |cpu| format!("{:.0}", cpu.as_secs_f64() * 1e6 / cycles as f64),
    )
}

/// The runtime's share of a cycle: the same cycles on `MemoryStore`, which is neither durable
/// nor shared with a flusher thread. What the runtime alone can do caps the end-to-end rate
/// whatever the store does.
async fn memory_cycles(quick: bool) -> anyhow::Result<()> {
    println!("\n## The runtime alone: the same cycles on MemoryStore (nothing durable)\n");
    println!("| concurrent sessions | cycles | cycles/s | CPU µs/cycle |");
    println!("|---:|---:|---:|---:|");
    for &(concurrency, cycles) in cycle_cases(quick) {
        let runtime = runtime_on(Arc::new(MemoryStore::new()), cycles::one_call_script())?;
        let (ours, cpu) = run_cycles(&runtime, concurrency, cycles).await?;
        runtime.shutdown().await?;
        println!(
            "| {concurrency} | {cycles} | {ours:.0} | {} |",
            cpu_per_cycle(cpu, cycles)
        );
    }
    Ok(())
}

/// The same cycles on `FjallStore` (feature `fjall`): durable at each step as on sled (one
/// `fdatasync` of fjall's journal a group), with an LSM tree's writes instead of sled's.
#[cfg(feature = "fjall")]
async fn fjall_cycles(quick: bool) -> anyhow::Result<()> {
    embedded_cycles(quick, "FjallStore", |dir| {
        let store = Arc::new(dormant::FjallStore::open(dir)?);
        let syncs = Arc::clone(&store);
        Ok((store, Box::new(move || syncs.sync_count())))
    })
    .await
}

/// The same cycles on `JournalStore` (feature `journal`): durable at each step as on sled (one
/// `fdatasync` of the journal a group), each commit one appended record.
#[cfg(all(unix, feature = "journal"))]
async fn journal_cycles(quick: bool) -> anyhow::Result<()> {
    embedded_cycles(quick, "JournalStore", |dir| {
        let store = Arc::new(dormant::JournalStore::open(dir)?);
        let syncs = Arc::clone(&store);
        Ok((store, Box::new(move || syncs.sync_count())))
    })
    .await
}

/// An embedded store `open` makes in a directory, and how many syncs it has made.
#[cfg(any(feature = "fjall", all(unix, feature = "journal")))]
type Opened = (Arc<dyn Store>, Box<dyn Fn() -> u64>);

/// The suspension cycles on the store `name` that `open` makes in a fresh directory.
#[cfg(any(feature = "fjall", all(unix, feature = "journal")))]
async fn embedded_cycles(
    quick: bool,
    name: &str,
    open: impl Fn(&std::path::Path) -> anyhow::Result<Opened>,
) -> anyhow::Result<()> {
    println!(
        "\n## The same cycles on {name} (durable at each step, power-loss safe, group commit)\n"
    );
    println!("| concurrent sessions | cycles | cycles/s | CPU µs/cycle | commits/cycle | commits/sync | key writes/cycle |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for &(concurrency, cycles) in cycle_cases(quick) {
        let dir = tempfile::tempdir()?;
        let (store, syncs) = open(dir.path())?;
        let runtime = runtime_on(store, cycles::one_call_script())?;
        let (ours, cpu) = run_cycles(&runtime, concurrency, cycles).await?;
        let stats = runtime.stats();
        runtime.shutdown().await?;
        let commits = stats.commit_latency.count;
        println!(
            "| {concurrency} | {cycles} | {ours:.0} | {} | {:.1} | {:.0} | {:.1} |",
            cpu_per_cycle(cpu, cycles),
            commits as f64 / cycles as f64,
            commits as f64 / syncs().max(1) as f64,
            stats.commit_writes as f64 / cycles as f64,
        );
    }
    Ok(())
}

/// How a commit of the `wait_cost` section waits before it reaches `MemoryStore`.
#[derive(Debug)]
enum Wait {
    /// Not at all.
    None,
    /// The task goes to the back of its worker's queue once.
    Yield,
    /// A 1 ms timer.
    Timer,
    /// A round trip through a thread of its own, which answers every commit queued since its
    /// last answer together: a group-commit flusher's hand-off, without the writing.
    /// With `true`, the thread blocks 1 ms a group first (a flusher's `fdatasync`).
    Thread(
        std::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>>,
        bool,
    ),
    /// The same, the thread handing each group's answers to a task of the runtime which
    /// gives them (one wake from the thread a group instead of one a commit: no faster here,
    /// so `SledStore`'s flusher answers its committers itself).
    Relayed(std::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>>),
    /// No thread of the store's own: the first committer to find nobody writing leads, blocks
    /// its worker 1 ms for the group it took (`block_in_place`, a leader's `fdatasync`), then
    /// answers the group and hands the lead to a committer that queued meanwhile (a sketch for
    /// this bench: a committer handed the lead and then dropped would strand the queue).
    Leader(Arc<Lead>),
}

/// The queue of [`Wait::Leader`]: who waits, and whether someone leads.
#[derive(Debug, Default)]
struct Lead {
    queue: parking_lot::Mutex<(Vec<tokio::sync::oneshot::Sender<bool>>, bool)>,
}

/// What a leader's `fdatasync` is taken to cost.
const SYNC: Duration = Duration::from_millis(1);

impl Wait {
    fn thread(syncing: bool) -> Self {
        let (queue, queued) = std::sync::mpsc::channel::<tokio::sync::oneshot::Sender<()>>();
        std::thread::spawn(move || {
            while let Ok(first) = queued.recv() {
                let group: Vec<_> = std::iter::once(first).chain(queued.try_iter()).collect();
                if syncing {
                    std::thread::sleep(SYNC);
                }
                for done in group {
                    let _ = done.send(());
                }
            }
        });
        Self::Thread(queue, syncing)
    }

    fn relayed() -> Self {
        let (queue, queued) = std::sync::mpsc::channel::<tokio::sync::oneshot::Sender<()>>();
        let (relay, mut groups) =
            tokio::sync::mpsc::unbounded_channel::<Vec<tokio::sync::oneshot::Sender<()>>>();
        tokio::spawn(async move {
            while let Some(group) = groups.recv().await {
                for done in group {
                    let _ = done.send(());
                }
            }
        });
        std::thread::spawn(move || {
            while let Ok(first) = queued.recv() {
                let group: Vec<_> = std::iter::once(first).chain(queued.try_iter()).collect();
                if relay.send(group).is_err() {
                    return;
                }
            }
        });
        Self::Relayed(queue)
    }

    fn name(&self) -> &'static str {
        match self {
            Wait::None => "no wait (MemoryStore)",
            Wait::Yield => "a yield",
            Wait::Timer => "a 1 ms timer",
            Wait::Thread(_, false) => "a round trip through a thread",
            Wait::Relayed(_) => "a round trip through a thread, answered by a task",
            Wait::Thread(_, true) => "a round trip through a thread that sleeps 1 ms a group",
            Wait::Leader(_) => "a leader that blocks its worker 1 ms a group",
        }
    }
}

#[async_trait::async_trait]
impl dormant::testkit::Delegate for Wait {
    async fn before(&self, call: dormant::testkit::Call<'_>) -> Result<(), dormant::store::Error> {
        if !matches!(call, dormant::testkit::Call::Commit(_)) {
            return Ok(());
        }
        match self {
            Wait::None => {}
            Wait::Yield => tokio::task::yield_now().await,
            Wait::Timer => tokio::time::sleep(Duration::from_millis(1)).await,
            Wait::Leader(lead) => {
                let (done, answered) = tokio::sync::oneshot::channel();
                let leads = {
                    let mut queue = lead.queue.lock();
                    queue.0.push(done);
                    !std::mem::replace(&mut queue.1, true)
                };
                let mut leading = if leads {
                    true
                } else {
                    answered.await.unwrap_or(false)
                };
                while leading {
                    let group = std::mem::take(&mut lead.queue.lock().0);
                    tokio::task::block_in_place(|| std::thread::sleep(SYNC));
                    for done in group {
                        let _ = done.send(false);
                    }
                    // Hand the lead to a committer that queued meanwhile, or let it go.
                    let mut queue = lead.queue.lock();
                    leading = false;
                    queue.1 = false;
                    while let Some(next) = queue.0.pop() {
                        if next.send(true).is_ok() {
                            queue.1 = true;
                            break;
                        }
                    }
                }
            }
            Wait::Thread(queue, _) | Wait::Relayed(queue) => {
                let (done, answered) = tokio::sync::oneshot::channel();
                if queue.send(done).is_ok() {
                    let _ = answered.await;
                }
            }
        }
        Ok(())
    }
}

/// The cycles on `MemoryStore` with each commit held up first ([`Wait`]), at 10,000 sessions:
/// what the runtime pays for waiting on its store, apart from anything a store does.
async fn wait_cost(quick: bool) -> anyhow::Result<()> {
    println!("\n## What waiting on a commit costs the runtime (MemoryStore, each commit held up first, no I/O)\n");
    println!("| a commit waits for | cycles | cycles/s | CPU µs/cycle | of no wait |");
    println!("|---|---:|---:|---:|---:|");
    let cases: &[(usize, usize)] = if quick {
        &[(10_000, 10_000)]
    } else {
        &[(10_000, 10_000), (10_000, 30_000)]
    };
    // A pass first, not reported: the first pass of a process runs slowest (its allocator
    // and tables grow), which would flatter every wait against it.
    let warm_up = runtime_on(Arc::new(MemoryStore::new()), cycles::one_call_script())?;
    run_cycles(&warm_up, 10_000, 10_000).await?;
    warm_up.shutdown().await?;
    for &(concurrency, cycles) in cases {
        let mut unheld = None;
        for wait in [
            Wait::None,
            Wait::Yield,
            Wait::Timer,
            Wait::thread(false),
            Wait::relayed(),
            Wait::thread(true),
            Wait::Leader(Arc::default()),
        ] {
            let name = wait.name();
            let store = dormant::testkit::DelegatingStore::wrap(Arc::new(MemoryStore::new()), wait);
            let runtime = runtime_on(Arc::new(store), cycles::one_call_script())?;
            let (rate, cpu) = run_cycles(&runtime, concurrency, cycles).await?;
            runtime.shutdown().await?;
            let base = *unheld.get_or_insert(rate);
            println!(
                "| {name} | {cycles} | {rate:.0} | {} | {:.2} |",
                cpu_per_cycle(cpu, cycles),
                rate / base
            );
        }
    }
    Ok(())
}

/// Durable writes/s of bare sled: `group` inserts of `size` bytes, then one flush and one
/// fdatasync of sled's data file, repeated until `writes` are durable. A group of 1 is the
/// one-write-one-flush rate.
fn bare_sled_group_commit(writes: usize, size: usize, group: usize) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let db = sled::Config::new().path(dir.path()).open()?;
    let tree = db.open_tree("bench")?;
    let data = std::fs::File::open(dir.path().join("db"))?;
    let value = vec![7u8; size.max(1)];
    let writes = writes.min(if group == 1 { 2_000 } else { writes });
    let started = Instant::now();
    let mut done = 0usize;
    while done < writes {
        let batch = group.min(writes - done);
        for i in 0..batch {
            tree.insert(((done + i) as u64).to_be_bytes(), value.as_slice())?;
        }
        db.flush()?;
        data.sync_data()?;
        done += batch;
    }
    Ok(writes as f64 / started.elapsed().as_secs_f64())
}

async fn expired_scan(quick: bool) -> anyhow::Result<()> {
    println!("\n## find_expired_pending: cost per expired entry as the deadline index grows\n");
    println!("| armed deadlines | expired per call | µs per call, first pass | µs per call, best pass | ns per expired entry (best pass) |");
    println!("|---:|---:|---:|---:|---:|");
    let sizes: &[usize] = if quick {
        &[1_000, 100_000]
    } else {
        &[1_000, 100_000, 1_000_000]
    };
    const EXPIRED: usize = 100;
    let session: SessionId = "root".parse()?;
    for &size in sizes {
        let store: Arc<dyn Store> = Arc::new(SledStore::temporary()?);
        let mut written = 0;
        while written < size {
            let mut batch = Batch::new(CommitKind::Other);
            for i in written..(written + 10_000).min(size) {
                // The first EXPIRED entries are due at 1 000 ms; the rest far in the future.
                let at = if i < EXPIRED {
                    1_000
                } else {
                    1_000_000 + i as u64
                };
                batch.put(
                    Tree::Deadlines,
                    dormant::store::schema::deadline_key(at, &session, &format!("call-{i}")),
                    Vec::new(),
                );
            }
            written = (written + 10_000).min(size);
            store.commit(batch).await?;
        }
        let runtime = runtime_on(Arc::clone(&store), Vec::new())?;
        let (first, best) =
            time_expired_passes(&runtime, EXPIRED, if quick { 3 } else { 10 }).await?;
        println!(
            "| {size} | {EXPIRED} | {:.1} | {:.1} | {:.0} |",
            first.as_secs_f64() * 1e6,
            best.as_secs_f64() * 1e6,
            best.as_nanos() as f64 / EXPIRED as f64
        );
        runtime.shutdown().await?;
    }
    Ok(())
}

/// Times passes of 2,000 `find_expired_pending` calls (at most `max_passes`, at most 30 s)
/// and returns the mean call of the first pass and of the fastest.
///
/// The first pass also pays for writing the index: sled frees the pages an insert replaced
/// through epoch-based reclamation, a process-wide queue that whichever thread pins an epoch
/// next works off a bounded amount at a time, and a sled batch pins once for all its writes.
/// Right after a million inserts that debt made thousands of calls up to 50x slower, growing
/// with the number of entries just written, not with the index. Later passes show the scan.
async fn time_expired_passes(
    runtime: &Runtime,
    expired: usize,
    max_passes: usize,
) -> anyhow::Result<(Duration, Duration)> {
    const CALLS: u32 = 2_000;
    let until = Instant::now() + Duration::from_secs(30);
    let mut passes = Vec::new();
    while passes.len() < max_passes && (passes.is_empty() || Instant::now() < until) {
        let started = Instant::now();
        for _ in 0..CALLS {
            anyhow::ensure!(runtime.find_expired_pending(5_000).await?.len() == expired);
        }
        passes.push(started.elapsed() / CALLS);
    }
    let first = passes.first().copied().unwrap_or_default();
    let best = passes.iter().copied().min().unwrap_or(first);
    Ok((first, best))
}

async fn submit_latency(quick: bool) -> anyhow::Result<()> {
    println!("\n## Submit latency under load (64 submits in flight, durable)\n");
    println!("| pending calls | roots | submits | p50 µs | p99 µs | submits/s |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let calls = if quick { 2_000 } else { 10_000 };
    // One root holding every call in one suspended step.
    {
        let dir = tempfile::tempdir()?;
        let ids: Vec<String> = (0..calls).map(|i| format!("tc-{i}")).collect();
        let script = vec![
            ModelReply::tool_calls(
                ids.iter()
                    .map(|id| ToolCall::new(id.as_str(), "edit", json!({})))
                    .collect(),
            ),
            ModelReply::text("all applied"),
        ];
        let runtime = runtime_on(Arc::new(SledStore::open(dir.path())?), script)?;
        let root: SessionId = "root".parse()?;
        let run = runtime
            .execute_on(&root, "editor", "edit everything")
            .await?;
        anyhow::ensure!(run.pending.len() == calls);
        let submits = ids
            .iter()
            .map(|id| Submit::result("root", id.as_str(), json!({ "applied": 1 })))
            .collect();
        report_submits(&runtime, calls, 1, submits).await?;
        runtime.shutdown().await?;
    }
    // As many roots, one pending call each.
    {
        let dir = tempfile::tempdir()?;
        let runtime = runtime_on(
            Arc::new(SledStore::open(dir.path())?),
            cycles::one_call_script(),
        )?;
        let roots: Vec<String> = (0..calls).map(|i| format!("r{i}")).collect();
        let started: Vec<anyhow::Result<()>> = stream::iter(roots.clone())
            .map(|root| {
                let runtime = runtime.clone();
                async move {
                    runtime
                        .execute_on(&root.parse()?, "editor", "edit it")
                        .await?;
                    Ok(())
                }
            })
            .buffer_unordered(256)
            .collect()
            .await;
        started.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
        let submits = roots
            .iter()
            .map(|root| Submit::result(root.as_str(), "tc-1", json!({ "applied": 1 })))
            .collect();
        report_submits(&runtime, 1, calls, submits).await?;
        runtime.shutdown().await?;
    }
    Ok(())
}

async fn report_submits(
    runtime: &Runtime,
    pending: usize,
    roots: usize,
    submits: Vec<Submit>,
) -> anyhow::Result<()> {
    let count = submits.len();
    let (histogram, elapsed) = submits::submit_latencies(runtime, submits, 64).await?;
    println!(
        "| {pending} | {roots} | {count} | {} | {} | {:.0} |",
        histogram.value_at_quantile(0.5),
        histogram.value_at_quantile(0.99),
        count as f64 / elapsed.as_secs_f64()
    );
    Ok(())
}

async fn evicted_memory(quick: bool) -> anyhow::Result<()> {
    println!("\n## Memory of suspended sessions, resident and evicted\n");
    let sessions = if quick { 2_000 } else { 10_000 };
    let dir = tempfile::tempdir()?;
    let runtime = runtime_on(
        Arc::new(SledStore::open(dir.path())?),
        cycles::one_call_script(),
    )?;
    let before = rss::rss_bytes()? / 1024;
    let results: Vec<anyhow::Result<()>> = stream::iter(0..sessions)
        .map(|i| {
            let runtime = runtime.clone();
            async move {
                runtime
                    .execute_on(&format!("m{i}").parse()?, "editor", "edit it")
                    .await?;
                Ok(())
            }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let resident = runtime.stats().host.resident;
    let suspended_rss = rss::rss_bytes()? / 1024;
    runtime.evict_all().await;
    let after = runtime.stats().host.resident;
    println!("| suspended sessions | resident actors | RSS growth while resident (KiB/session) | resident actors after evict_all |");
    println!("|---:|---:|---:|---:|");
    println!(
        "| {sessions} | {resident} | {:.2} | {after} |",
        (suspended_rss.saturating_sub(before)) as f64 / sessions as f64
    );
    println!("\nAn evicted session has no entry in the host's table, no actor and no stream sender: its only trace is in the store.");
    runtime.shutdown().await?;
    Ok(())
}
