//! What whole sessions cost: rehydration, resident memory, and step-commit throughput.
//!
//! Printed to stderr before the criterion benches (hdrhistogram percentiles, sequential calls):
//!
//! * **Rehydration** of sessions of 20 messages (1 user + 9 × (assistant + tool) + 1 final
//!   text), all timed one at a time:
//!   - `store load`: `Runtime::session` + `Runtime::messages`, the reads an activation and the
//!     next run do (snapshot record + 20 messages), straight from the store;
//!   - `turn after eviction`: `execute_on` of a one-step turn (text only) on a session whose
//!     actor was evicted: activation (loads the snapshot) + loading the messages + the turn's
//!     two commits;
//!   - `turn while resident`: the same turn on a session whose actor is resident: the
//!     difference to the line above is the cost of rehydration.
//!
//!   Measured twice: on a temporary sled store (no syncs, so commits are cheap and the
//!   rehydration cost stands out; sled's cache is warm), and on a store in a directory that
//!   is closed and reopened first (cold sled cache, default power-loss durability).
//! * **Memory per idle resident session**: 10,000 completed sessions (4 tool steps + text,
//!   10 messages) kept resident, against the same run with every actor evicted, each in a fresh
//!   child process; (VmRSS resident − VmRSS evicted) / 10,000, where the evicted run has a
//!   resident limit of 128 (64 in flight) so that evicted actors' memory is reused. A session actor does not keep
//!   its messages in memory between runs.
//!
//! Criterion, `session_commit/{group_commit,no_group_commit}/{1,64}`: complete sessions
//! (4 tool steps + final text = 10 durable commits each) with 1 or 64 in flight, on a sled
//! store in a temporary directory at the default power-loss durability, with group commit on
//! or off. One element = one session; commits/s are printed after each bench.
//! Run with `cargo bench --bench session`. One part alone:
//! `SESSION_ONLY=rehydration|memory|commits cargo bench --bench session`.

#[path = "support/rss.rs"]
mod rss;
use rss::rss_bytes;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use dormant::store::Store;
use dormant::{
    AgentDefinition, ModelReply, Runtime, ScriptedLlm, SessionId, SledStore, Status, ToolCall,
    ToolDefinition, ToolError,
};
use futures::StreamExt;
use hdrhistogram::Histogram;
use serde_json::{json, Value};

const AGENT: &str = "bench";
const TOOL: &str = "lookup";
/// Set in the child processes that measure memory; its value names what to measure.
const CHILD_ENV: &str = "DORMANT_SESSION_BENCH_MEMORY";
/// Tool steps of a session for the rehydration measurement: 1 + 9 × 2 + 1 = 20 messages.
const REHYDRATE_STEPS: usize = 9;
/// Tool steps of a session for the memory and commit benches (as in the simulator).
const STEPS: usize = 4;

fn lookup_tool() -> ToolDefinition {
    ToolDefinition::server(TOOL, |input: Value, _ctx| async move {
        Ok::<_, ToolError>(json!({ "found": true, "step": input["step"] }))
    })
}

/// `steps` replies with one tool call each, a text, then `extra_turns` one-step text turns.
fn script(steps: usize, extra_turns: usize) -> Vec<ModelReply> {
    let mut replies: Vec<ModelReply> = (0..steps)
        .map(|step| {
            ModelReply::tool_calls(vec![ToolCall::new(
                format!("c{step}"),
                TOOL,
                json!({ "step": step }),
            )])
        })
        .collect();
    replies.push(ModelReply::text("done"));
    replies.extend((0..extra_turns).map(|turn| ModelReply::text(format!("again {turn}"))));
    replies
}

fn build_runtime(
    store: Arc<dyn Store>,
    steps: usize,
    extra_turns: usize,
    max_resident: Option<usize>,
) -> anyhow::Result<Runtime> {
    let agent = AgentDefinition::builder(AGENT)
        .tool(lookup_tool())
        .max_steps(u32::try_from(steps + 1)?)
        .build()?;
    let llm = ScriptedLlm::new().script(AGENT, script(steps, extra_turns));
    let mut builder = Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .agent(agent);
    if let Some(max) = max_resident {
        builder = builder.max_resident(max);
    }
    Ok(builder.build()?)
}

fn tokio_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// Runs one turn on each of `ids` with `concurrency` in flight; every turn must complete.
async fn run_turns(
    runtime: &Runtime,
    ids: &[SessionId],
    message: &str,
    concurrency: usize,
) -> anyhow::Result<()> {
    let mut outcomes = futures::stream::iter(ids.iter().cloned())
        .map(|id| {
            let runtime = runtime.clone();
            let message = message.to_string();
            async move { runtime.execute_on(&id, AGENT, message).await }
        })
        .buffer_unordered(concurrency);
    while let Some(outcome) = outcomes.next().await {
        let outcome = outcome?;
        anyhow::ensure!(
            outcome.status == Status::Completed,
            "session {} ended {:?}: {:?}",
            outcome.session_id,
            outcome.status,
            outcome.error
        );
    }
    Ok(())
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 3_600_000_000, 3)?)
}

fn record(histogram: &mut Histogram<u64>, since: Instant) {
    let micros = u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX);
    histogram.saturating_record(micros.max(1));
}

fn print_latency(label: &str, histogram: &Histogram<u64>) {
    eprintln!(
        "  {label:<44} p50 {:>6} µs  p99 {:>6} µs  (n = {})",
        histogram.value_at_quantile(0.5),
        histogram.value_at_quantile(0.99),
        histogram.len()
    );
}

/// Times the store reads of a session: its record and its messages.
async fn time_loads(runtime: &Runtime, ids: &[SessionId]) -> anyhow::Result<Histogram<u64>> {
    let mut loads = histogram()?;
    for id in ids {
        let start = Instant::now();
        let snapshot = runtime.session(id).await?;
        let messages = runtime.messages(id).await?;
        record(&mut loads, start);
        anyhow::ensure!(
            messages.len() >= 20 && snapshot.status == Status::Completed,
            "session {id} has {} messages, status {:?}",
            messages.len(),
            snapshot.status
        );
    }
    Ok(loads)
}

/// Times one turn per session, one session at a time.
async fn time_turn(
    runtime: &Runtime,
    id: &SessionId,
    expect_resident: bool,
    histogram: &mut Histogram<u64>,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        runtime.is_resident(id) == expect_resident,
        "session {id}: resident is {}, expected {expect_resident}",
        runtime.is_resident(id)
    );
    let start = Instant::now();
    let outcome = runtime.execute_on(id, AGENT, "again").await?;
    record(histogram, start);
    anyhow::ensure!(
        outcome.status == Status::Completed,
        "session {id} ended {:?}",
        outcome.status
    );
    Ok(())
}

fn new_ids(count: usize) -> Vec<SessionId> {
    (0..count).map(|_| SessionId::generate()).collect()
}

/// Creates `ids` as sessions of 20 messages (64 in flight) and stops every actor; the store
/// stays open (shutting the runtime down would close it).
async fn create_sessions(store: &Arc<dyn Store>, ids: &[SessionId]) -> anyhow::Result<()> {
    let runtime = build_runtime(Arc::clone(store), REHYDRATE_STEPS, 2, None)?;
    run_turns(&runtime, ids, "go", 64).await?;
    runtime.evict_all().await;
    Ok(())
}

/// A runtime on `store` once the one `create_sessions` dropped has stopped its actors: until
/// then the store is still claimed (`BuildError::StoreInUse`), and dropping gives nothing to await.
async fn build_when_free(store: &Arc<dyn Store>) -> anyhow::Result<Runtime> {
    for _ in 0..1_000 {
        match build_runtime(Arc::clone(store), REHYDRATE_STEPS, 2, None) {
            Err(error) if matches!(error.downcast_ref(), Some(dormant::BuildError::StoreInUse)) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => return other,
        }
    }
    anyhow::bail!("the store was still in use after 10 s")
}

/// Measures, on a fresh runtime over `store` (no resident actors), the store loads of the
/// first half of `ids`, then for each session of the second half a turn after eviction
/// immediately followed by a turn while resident (interleaved, so drift cancels out).
async fn measure_rehydration(
    store: &Arc<dyn Store>,
    ids: &[SessionId],
    title: &str,
) -> anyhow::Result<()> {
    let runtime = build_when_free(store).await?;
    let (load_ids, turn_ids) = ids.split_at(ids.len() / 2);
    let cold_loads = time_loads(&runtime, load_ids).await?;
    let warm_loads = time_loads(&runtime, load_ids).await?;
    let mut evicted = histogram()?;
    let mut resident = histogram()?;
    for id in turn_ids {
        time_turn(&runtime, id, false, &mut evicted).await?;
        time_turn(&runtime, id, true, &mut resident).await?;
    }
    let commits = runtime.stats().commit_latency;
    eprintln!("rehydration of 20-message sessions, {title}:");
    print_latency("store load, first (record + 20 messages)", &cold_loads);
    print_latency("store load, same sessions again", &warm_loads);
    print_latency("turn after eviction (activation + turn)", &evicted);
    print_latency("turn while resident", &resident);
    let p50 = |h: &Histogram<u64>| h.value_at_quantile(0.5);
    eprintln!(
        "  {:<44} {} µs",
        "rehydration = p50 evicted - p50 resident",
        i128::from(p50(&evicted)) - i128::from(p50(&resident))
    );
    eprintln!(
        "  {:<44} p50 {:>6} µs  p99 {:>6} µs  (n = {})",
        "commit latency (2 commits per turn)", commits.p50_us, commits.p99_us, commits.count
    );
    runtime.shutdown().await?;
    Ok(())
}

/// Rehydration on a temporary sled store: no syncs, so commits are cheap and the
/// rehydration cost stands out; sled's cache holds everything.
async fn rehydration_warm(sessions: usize) -> anyhow::Result<()> {
    let store: Arc<dyn Store> = Arc::new(SledStore::temporary()?);
    let ids = new_ids(sessions);
    create_sessions(&store, &ids).await?;
    measure_rehydration(&store, &ids, "temporary sled store (no syncs, warm cache)").await
}

/// Rehydration from a store directory that was closed and reopened (cold sled cache, default
/// power-loss durability).
async fn rehydration_cold(sessions: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store");
    let ids = new_ids(sessions);
    {
        let store: Arc<dyn Store> = Arc::new(SledStore::open(&path)?);
        create_sessions(&store, &ids).await?;
        store.close().await?;
    }
    let store: Arc<dyn Store> = Arc::new(SledStore::open(&path)?);
    measure_rehydration(
        &store,
        &ids,
        "sled store closed and reopened (cold cache, power-loss durability)",
    )
    .await
}

/// In a child process: completes `count` sessions, keeps them resident or evicts them all,
/// prints `<rss before> <rss after> <resident actors>` on stdout.
fn memory_child(kind: &str, count: usize) -> anyhow::Result<()> {
    let rt = tokio_runtime()?;
    rt.block_on(async {
        let store: Arc<dyn Store> = Arc::new(SledStore::temporary()?);
        // "evicted": a resident limit well above the 64 sessions in flight, so actors are
        // evicted during the run and their memory is reused rather than freed at the end.
        let max_resident = (kind == "evicted").then_some(128);
        let runtime = build_runtime(store, STEPS, 0, max_resident)?;
        // Warm up the runtime, the store and the allocator before the baseline.
        let warm = new_ids(200);
        run_turns(&runtime, &warm, "go", 64).await?;
        runtime.evict_all().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before = rss_bytes()?;
        let ids = new_ids(count);
        run_turns(&runtime, &ids, "go", 64).await?;
        match kind {
            "resident" => {}
            "evicted" => runtime.evict_all().await,
            other => anyhow::bail!("unknown memory measurement {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let after = rss_bytes()?;
        println!("{before} {after} {}", runtime.stats().host.resident);
        runtime.shutdown().await?;
        Ok(())
    })
}

/// Runs one memory measurement in a fresh process, so neither inherits the other's heap.
fn measure_in_child(kind: &str, count: usize) -> anyhow::Result<(u64, u64, u64)> {
    let output = Command::new(std::env::current_exe()?)
        .env(CHILD_ENV, format!("{kind}:{count}"))
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "memory child {kind} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout)?;
    let numbers: Vec<u64> = text
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .with_context(|| format!("memory child {kind} printed {text:?}"))?;
    match numbers.as_slice() {
        [before, after, resident] => Ok((*before, *after, *resident)),
        _ => anyhow::bail!("memory child {kind} printed {text:?}"),
    }
}

#[allow(clippy::cast_precision_loss)]
fn per_session(bytes: u64, count: usize) -> f64 {
    bytes as f64 / count as f64
}

fn memory_report(count: usize) -> anyhow::Result<()> {
    let (r_before, r_after, r_resident) = measure_in_child("resident", count)?;
    let (e_before, e_after, e_resident) = measure_in_child("evicted", count)?;
    eprintln!(
        "memory per idle resident session ({count} completed sessions of {} messages, fresh process each):",
        2 * STEPS + 2
    );
    eprintln!(
        "  all resident ({r_resident} actors):   rss {} -> {} KiB, {:.0} bytes per session (includes sled's cache of what they wrote)",
        r_before / 1024,
        r_after / 1024,
        per_session(r_after.saturating_sub(r_before), count)
    );
    eprintln!(
        "  all evicted ({e_resident} actors):      rss {} -> {} KiB, {:.0} bytes per session",
        e_before / 1024,
        e_after / 1024,
        per_session(e_after.saturating_sub(e_before), count)
    );
    let resident_cost =
        i128::from(r_after.saturating_sub(r_before)) - i128::from(e_after.saturating_sub(e_before));
    #[allow(clippy::cast_precision_loss)]
    let per = resident_cost as f64 / count as f64;
    eprintln!(
        "  resident actor cost:             {per:.0} bytes ({:.1} KiB) per session",
        per / 1024.0
    );
    Ok(())
}

/// Accumulates what a commit bench ran, to print commits/s at the end.
#[derive(Debug, Default)]
struct Totals {
    sessions: u64,
    elapsed: Duration,
}

fn session_commit(c: &mut Criterion) -> anyhow::Result<()> {
    let rt = tokio_runtime()?;
    let mut group = c.benchmark_group("session_commit");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    for group_commit in [true, false] {
        for concurrency in [1_usize, 64] {
            let dir = tempfile::tempdir()?;
            let store = Arc::new(
                SledStore::builder(dir.path().join("store"))
                    .group_commit(group_commit)
                    .open()?,
            );
            let runtime = rt.block_on(async {
                build_runtime(Arc::clone(&store) as Arc<dyn Store>, STEPS, 0, Some(10_000))
            })?;
            let mode = if group_commit {
                "group_commit"
            } else {
                "no_group_commit"
            };
            let mut totals = Totals::default();
            let commits_before = runtime.stats().commit_latency.count;
            let flushes_before = store.flush_count();
            group.bench_with_input(
                BenchmarkId::new(mode, concurrency),
                &concurrency,
                |b, &n| {
                    b.iter_custom(|iters| {
                        let ids = new_ids(usize::try_from(iters).unwrap_or(usize::MAX));
                        let start = Instant::now();
                        if let Err(e) = rt.block_on(run_turns(&runtime, &ids, "go", n)) {
                            panic!("sessions failed: {e}");
                        }
                        let elapsed = start.elapsed();
                        totals.sessions += iters;
                        totals.elapsed += elapsed;
                        elapsed
                    });
                },
            );
            let stats = runtime.stats();
            let commits = stats.commit_latency.count - commits_before;
            let flushes = store.flush_count() - flushes_before;
            #[allow(clippy::cast_precision_loss)]
            let (secs, commits_f) = (totals.elapsed.as_secs_f64().max(1e-9), commits as f64);
            #[allow(clippy::cast_precision_loss)]
            let sessions_f = totals.sessions as f64;
            if totals.sessions < 10 {
                // Filtered out, only listed, or run once as a test: no meaningful rate.
                rt.block_on(runtime.shutdown())?;
                continue;
            }
            eprintln!(
                "session_commit/{mode}/{concurrency}: {:.0} sessions/s, {:.0} commits/s, {:.1} commits per flush, commit p50 {} µs p99 {} µs ({} sessions)",
                sessions_f / secs,
                commits_f / secs,
                if flushes == 0 { 0.0 } else { commits_f / flushes as f64 },
                stats.commit_latency.p50_us,
                stats.commit_latency.p99_us,
                totals.sessions
            );
            rt.block_on(runtime.shutdown())?;
        }
    }
    group.finish();
    Ok(())
}

fn main() -> anyhow::Result<()> {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (kind, count) = spec
            .split_once(':')
            .ok_or_else(|| anyhow::anyhow!("bad {CHILD_ENV}={spec:?}"))?;
        return memory_child(kind, count.parse()?);
    }
    let args: Vec<String> = std::env::args().collect();
    let listing = args.iter().any(|arg| arg == "--list");
    // `cargo bench` passes `--bench`; without it (`cargo test --benches`) criterion runs each
    // bench once as a test, so keep the measurements before it small too.
    let testing = !args.iter().any(|arg| arg == "--bench");
    let only = std::env::var("SESSION_ONLY").ok();
    let wants = |name: &str| only.as_deref().is_none_or(|only| only == name);
    if !listing && wants("rehydration") {
        let rt = tokio_runtime()?;
        let sessions = if testing { 20 } else { 400 };
        rt.block_on(rehydration_warm(sessions))?;
        rt.block_on(rehydration_cold(sessions))?;
    }
    if !listing && wants("memory") {
        memory_report(if testing { 500 } else { 10_000 })?;
    }
    if wants("commits") {
        let mut criterion = Criterion::default().configure_from_args();
        session_commit(&mut criterion)?;
        criterion.final_summary();
    }
    Ok(())
}
