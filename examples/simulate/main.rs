//! Run with: cargo run --release --example simulate
//!
//! The main job: runs many sessions of a scripted agent on a durable sled store, with a
//! bounded number of runs in flight and, by default, a resident limit that forces sessions to
//! be evicted and rehydrated from the store. Each turn is a few server-tool steps; each
//! session also suspends `--suspensions` times on a human-in-the-loop call (the client tool
//! `confirm`, or the approval-gated server tool `deploy`, alternately), which a simulated
//! client answers after a random delay: a share never answers (the call times out on the
//! background deadline scheduler), a share submits a duplicate or first the wrong kind of
//! answer, and a share of the waiting sessions is evicted at once. Every session of this run
//! is checked at the end (the process exits non-zero if one is wrong), then a report is
//! printed: throughput, suspension cycles/s, commit and submit latency, timeouts and their
//! lag, actor lifecycle counters, memory and store size. `--json` prints the same report as
//! one JSON object. A store error stops the run at once: the process exits non-zero with it
//! (see `halt.rs`).
//!
//! The simulated client's choices come from a seeded generator (`--seed`), per session and
//! suspension, so they do not depend on scheduling; the timing (real clock) does.
//!
//! `--fanout ROOTSxCHILDREN` (e.g. `--fanout 20x50`) runs trees of sub-agents instead: each
//! root delegates to CHILDREN children that each suspend on a client tool, the client answers
//! every child's call against the root, and `resume(root)` cascades into the children and
//! completes the tree (see `fanout.rs`).
//!
//! `--dormant N --sample M` measures size instead: N sessions each suspended on a client tool
//! and then evicted, so they are only in the store; then M of them, picked at random, answered
//! cold (see `size.rs`). It reports the time, the store's bytes per session and the RSS.

#[path = "../../benches/support/allocator.rs"]
mod allocator;
mod backend;
mod driver;
#[cfg(feature = "postgres")]
mod failover;
mod fanout;
mod halt;
mod http;
mod http_client;
#[cfg(feature = "openai")]
mod model;
#[cfg(feature = "postgres")]
mod nodes;
mod plan;
mod report;
mod size;
mod tools;
mod verify;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use dormant::store::Durability;
use dormant::{AgentDefinition, Runtime, ScriptedLlm, SessionId, SledStore, ToolDefinition};

use crate::plan::{confirm_schema, Plan, AGENTS, CONFIRM};
use crate::report::{Memory, Report};
use crate::tools::{deploy_tool, lookup_tool, Invocations};
use crate::verify::ToolCounts;

/// Simulates many durable agent sessions and reports throughput, latency and memory.
///
/// With --fanout ROOTSxCHILDREN it simulates trees of sub-agents instead (nested suspension:
/// every child waits on a client tool, the client answers against the root, resume(root)
/// completes the tree).
#[derive(Debug, Parser)]
#[command(about)]
struct Args {
    /// Fan-out mode: ROOTS trees (e.g. 20x50), each a root that delegates to CHILDREN
    /// sub-agents which each suspend on a client tool; the simulated client answers every
    /// child's call against the root (after up to --answer-delay-ms, a --duplicates share
    /// twice), a --evict-waiting share of the trees is evicted while waiting, then
    /// resume(root) cascades into the children. Reports trees/s and submit latency, and
    /// checks every child's result is in its root's messages exactly once. Uses
    /// --concurrency (runs in flight), --max-resident, --seed, --store, --durability, --json;
    /// ignores --sessions, --steps, --turns, --suspensions, --never-answer, --wrong-kind,
    /// --auto-resume and --client-timeout-ms (no call times out in this mode).
    #[arg(long, value_name = "ROOTSxCHILDREN")]
    fanout: Option<fanout::Fanout>,
    /// Size mode: N sessions each started and suspended on the client tool `confirm`
    /// (--concurrency in flight; --max-resident evicting idle ones as they go), then every one
    /// still resident evicted, then --sample of them, picked with --seed, answered cold one
    /// after another (a submit that rehydrates the session, then the resume that completes
    /// it). Reports sessions/s of the creation, store bytes per session, RSS before, after the
    /// creation, after the eviction and at the end (and the peak), the resident count after
    /// the eviction, and the cold answers' latency p50/p99; checks every sampled session
    /// completed with its answer exactly once. With --max-resident 0 (or ≥ N) nothing is
    /// evicted during the creation, so the RSS growth per resident session is what a
    /// suspended session costs in memory. Uses --concurrency, --max-resident, --seed,
    /// --store, --durability, --no-group-commit, --json; no call times out in this mode.
    #[arg(long, value_name = "N", conflicts_with_all = ["fanout", "http", "openai"])]
    dormant: Option<usize>,
    /// With --dormant: how many of the dormant sessions to answer cold.
    #[arg(long, value_name = "M", default_value_t = 1_000)]
    sample: usize,
    /// HTTP mode: suspension cycles over HTTP and SSE (start, the stream to the client call,
    /// submit, resume, the stream to the end) through a dormant-server this process serves on
    /// 127.0.0.1, or through the server at URL (loopback only, serving the demo agent), side
    /// by side with the same cycles through the in-process API in the same run. Uses
    /// --sessions, --concurrency, --max-resident, --store, --durability, --json,
    /// --http-rounds and --sse-streams.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    http: Option<String>,
    /// Real-model mode: the sessions run on an OpenAI-compatible server named by
    /// OPENAI_BASE_URL, OPENAI_API_KEY and OPENAI_MODEL (build with `--features openai`).
    /// Each session's run is driven wherever the model takes it (every waiting call answered,
    /// then resumed); the end check is what holds for any model: every accepted answer is
    /// recorded exactly once. Uses --sessions, --concurrency, --store, --durability.
    #[arg(long)]
    openai: bool,
    /// HTTP mode: rounds of both passes, alternating which goes first.
    #[arg(long, default_value_t = 1)]
    http_rounds: usize,
    /// HTTP mode: afterwards, open this many SSE streams on suspended sessions and report the
    /// RSS per open stream.
    #[arg(long, default_value_t = 0)]
    sse_streams: usize,
    /// Sessions to run.
    #[arg(long, default_value_t = 10_000)]
    sessions: usize,
    /// Server-tool steps per turn (each followed by one more model step with the final text).
    #[arg(long, default_value_t = 4)]
    steps: usize,
    /// Turns per session; each turn is a separate `execute_on`, queued behind every other
    /// session's previous turn.
    #[arg(long, default_value_t = 2)]
    turns: usize,
    /// Human-in-the-loop suspensions per session, spread round robin over its turns and
    /// evenly among each turn's server steps. Each is one model reply that calls the client
    /// tool `confirm` or the approval-gated `deploy` (alternately); the run suspends until the
    /// simulated client answers or the call times out, then `resume` continues it. 0 runs
    /// server tools only.
    #[arg(long, default_value_t = 1)]
    suspensions: usize,
    /// Deadline of client-tool calls and approvals, in milliseconds (real time; fired by the
    /// runtime's background deadline scheduler).
    #[arg(long, default_value_t = 500)]
    client_timeout_ms: u64,
    /// Longest a simulated client takes to answer, in milliseconds (uniform from 0).
    #[arg(long, default_value_t = 20)]
    answer_delay_ms: u64,
    /// Share of calls the client never answers: they time out, and the resume sees
    /// `client_tool_timeout`.
    #[arg(long, default_value_t = 0.05)]
    never_answer: f64,
    /// Share of answered calls whose answer is submitted twice (the second must answer
    /// `already_completed`; half are sent before the resume, half after it).
    #[arg(long, default_value_t = 0.1)]
    duplicates: f64,
    /// Share of answered calls that first get the wrong kind of answer (an approval-response
    /// to a client call, a result to an approval), which must answer `invalid_result`.
    #[arg(long, default_value_t = 0.05)]
    wrong_kind: f64,
    /// Share of suspended sessions evicted right after they suspend (besides the LRU
    /// evictions past `--max-resident`).
    #[arg(long, default_value_t = 0.25)]
    evict_waiting: f64,
    /// Let the runtime resume a session as soon as its call is answered or timed out (the
    /// driver follows the stream) instead of calling `resume`.
    #[arg(long)]
    auto_resume: bool,
    /// Seed of the simulated clients' choices.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Runs (execute or resume) in flight at once. A session waiting for its client holds no
    /// slot.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Most resident session actors (least recently used idle ones are evicted past it);
    /// 0 means no limit, so nothing is evicted or rehydrated by the limit.
    #[arg(long, default_value_t = 1_000)]
    max_resident: usize,
    /// Store directory (default: a fresh temporary directory, removed at exit). Sessions get
    /// new ids, so an existing store can be reused: the end check looks at this run's
    /// sessions only (an earlier process's expired deadlines fire at boot but are not counted).
    /// A store error stops the run at once and exits non-zero with it. A `postgres://` URL
    /// here is `--postgres URL`.
    #[arg(long)]
    store: Option<PathBuf>,
    /// Run on a PostgreSQL store at URL instead of sled (default mode only; build with
    /// `--features postgres`). The report adds its transactions and the server's WAL flushes.
    #[arg(long, value_name = "URL")]
    postgres: Option<String>,
    /// With --postgres: N node processes (each this program with a runtime, its own PgStore
    /// and a dormant-server router on a loopback port) share the database; the HTTP mode's
    /// cycles are spread over them, beside the same cycles on one sled node in the same run.
    /// Uses --sessions, --concurrency, --max-resident, --http-rounds, --cross-node, --json.
    #[arg(long, value_name = "N")]
    nodes: Option<usize>,
    /// Internal to --nodes: serve as node INDEX until standard input closes.
    #[arg(long, value_name = "INDEX", hide = true)]
    serve_node: Option<usize>,
    /// Internal to --nodes: the token key file the nodes share.
    #[arg(long, value_name = "PATH", hide = true)]
    token_key_file: Option<PathBuf>,
    /// With --nodes: send each session's answers to a node that does not own it, which
    /// forwards them to the owner.
    #[arg(long, requires = "nodes")]
    cross_node: bool,
    /// With --nodes (2 or more): instead of the passes, ROUNDS times start a session on a
    /// node, SIGKILL that node once the session waits, and answer it at the next node until
    /// one is accepted; reports how long each session was out (the owner's failover).
    #[arg(long, value_name = "ROUNDS", requires = "nodes")]
    failover: Option<usize>,
    /// With --nodes: during the PostgreSQL passes, pause a random node (SIGSTOP) for MS
    /// milliseconds at a time, then continue it (SIGCONT); reports the leases lost meanwhile
    /// (taken again, by the node or another, after a pause).
    #[arg(long, value_name = "MS", requires = "nodes")]
    pause_ms: Option<u64>,
    /// With --nodes: each node's lease time to live, in milliseconds (default: the store's,
    /// `dormant::store::DEFAULT_LEASE_TTL`), to compare failover at another setting.
    #[arg(long, value_name = "MS", requires = "nodes")]
    lease_ttl_ms: Option<u64>,
    /// The embedded store of the default mode (and --fanout, --dormant, --openai): sled (the
    /// default), fjall (`FjallStore`, an LSM tree) or journal (`JournalStore`, a log of
    /// dormant's own); the last two are power-loss safe with group commit, so they take
    /// neither --durability process-crash nor --no-group-commit.
    #[arg(long, value_enum, default_value_t = EngineArg::Sled)]
    engine: EngineArg,
    /// What an acknowledged commit survives.
    #[arg(long, value_enum, default_value_t = DurabilityArg::PowerLoss)]
    durability: DurabilityArg,
    /// Give every commit its own flush instead of sharing flushes between sessions.
    #[arg(long)]
    no_group_commit: bool,
    /// Print the report as one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum EngineArg {
    /// `SledStore`.
    Sled,
    /// `FjallStore`.
    Fjall,
    /// `JournalStore`.
    Journal,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum DurabilityArg {
    /// flush (survives a killed process).
    ProcessCrash,
    /// flush + fdatasync (survives a power cut).
    PowerLoss,
}

impl From<DurabilityArg> for Durability {
    fn from(arg: DurabilityArg) -> Self {
        match arg {
            DurabilityArg::ProcessCrash => Durability::ProcessCrash,
            DurabilityArg::PowerLoss => Durability::PowerLoss,
        }
    }
}

/// The `--nodes` mode (PostgreSQL nodes against one sled node, over HTTP).
#[cfg(feature = "postgres")]
fn nodes(
    args: Args,
    url: String,
    count: usize,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    if let Some(index) = args.serve_node {
        return runtime.block_on(nodes::serve_node(args, url, index));
    }
    let problems = match args.failover {
        Some(rounds) => runtime.block_on(failover::simulate(count, rounds))?,
        None => runtime.block_on(nodes::simulate(args, url, count))?,
    };
    anyhow::ensure!(problems == 0, "{problems} problems");
    Ok(())
}

#[cfg(not(feature = "postgres"))]
fn nodes(
    _args: Args,
    _url: String,
    _count: usize,
    _runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    anyhow::bail!(
        "--nodes needs the PostgreSQL store: cargo run --release --features postgres --example simulate -- --postgres URL --nodes N"
    )
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    // `--store postgres://…` names the PostgreSQL store, as the server's `--store` does.
    if let Some(url) = args.store.as_ref().and_then(|store| store.to_str()) {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            anyhow::ensure!(
                args.postgres.is_none(),
                "give the PostgreSQL URL once: --store or --postgres"
            );
            args.postgres = Some(url.to_string());
            args.store = None;
        }
    }
    anyhow::ensure!(
        args.nodes.is_none() || args.postgres.is_some(),
        "--nodes needs a PostgreSQL store: --postgres URL (or --store postgres://…)"
    );
    if let Some(sessions) = args.dormant {
        anyhow::ensure!(sessions > 0, "--dormant must be at least 1");
    } else if args.fanout.is_none() {
        anyhow::ensure!(args.sessions > 0, "--sessions must be at least 1");
        anyhow::ensure!(args.turns > 0, "--turns must be at least 1");
    }
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    anyhow::ensure!(
        args.client_timeout_ms > 0,
        "--client-timeout-ms must be at least 1: with 0 every call expires as it is made, so no \
         simulated client could answer one"
    );
    for (flag, share) in [
        ("--never-answer", args.never_answer),
        ("--duplicates", args.duplicates),
        ("--wrong-kind", args.wrong_kind),
        ("--evict-waiting", args.evict_waiting),
    ] {
        anyhow::ensure!(
            (0.0..=1.0).contains(&share),
            "{flag} is a share: between 0 and 1"
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    anyhow::ensure!(
        args.postgres.is_none()
            || (args.fanout.is_none()
                && args.http.is_none()
                && args.dormant.is_none()
                && !args.openai),
        "--postgres runs the default mode or --nodes (not --fanout, --dormant, --http or --openai)"
    );
    anyhow::ensure!(
        args.engine == EngineArg::Sled || args.http.is_none(),
        "--engine fjall and journal run the default mode, --fanout, --dormant and --openai (not --http)"
    );
    if args.openai {
        return real_model(args, &runtime);
    }
    if let (Some(count), Some(url)) = (args.nodes, args.postgres.clone()) {
        return nodes(args, url, count, &runtime);
    }
    let simulated = match (args.dormant, args.fanout, args.http.clone()) {
        (Some(sessions), _, _) => runtime.block_on(size::simulate(args, sessions)),
        (None, Some(fanout), _) => runtime.block_on(fanout::simulate(args, fanout)),
        (None, None, Some(url)) => {
            let target = Some(url).filter(|url| !url.is_empty());
            runtime.block_on(http::simulate(args, target))
        }
        (None, None, None) => runtime.block_on(simulate(args)),
    };
    let problems = match simulated {
        Ok(problems) => problems,
        Err(error) => {
            match error.downcast_ref::<halt::StoreFailure>() {
                // Its message has the whole cause; the chain below it says it again.
                Some(failure) => eprintln!("simulate: {failure}"),
                None => eprintln!("simulate: {error:?}"),
            }
            // Exit without dropping the tokio runtime: its drop waits for every blocking
            // task, and after a store error one may be stuck on the failing store.
            std::process::exit(1);
        }
    };
    if problems > 0 {
        eprintln!(
            "simulate: verification failed: {problems} problems (the first 20 are listed above)"
        );
        std::process::exit(1);
    }
    Ok(())
}

#[cfg(feature = "openai")]
fn real_model(args: Args, runtime: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let problems = runtime.block_on(model::simulate(args))?;
    anyhow::ensure!(problems == 0, "verification failed: {problems} problems");
    Ok(())
}

#[cfg(not(feature = "openai"))]
fn real_model(_args: Args, _runtime: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    anyhow::bail!(
        "--openai needs the adapter: cargo run --release --features openai --example simulate -- --openai"
    )
}

/// Runs the simulation and prints the report; returns how many problems verification found.
async fn simulate(args: Args) -> anyhow::Result<usize> {
    let backend = backend::Backend::open(&args).await?;

    let plan = Plan::new(&args);
    // The ids come first: the tools count only the calls of this run's sessions (the store
    // may hold an earlier process's, see tools.rs).
    let ids: Arc<Vec<SessionId>> =
        Arc::new((0..args.sessions).map(|_| SessionId::generate()).collect());
    let own: Arc<HashSet<SessionId>> = Arc::new(ids.iter().cloned().collect());
    let lookups = Invocations::new(Arc::clone(&own));
    let deploys = Invocations::new(own);
    let max_steps = u32::try_from(plan.max_steps()).context("--steps is too large")?;
    let mut llm = ScriptedLlm::new();
    let mut builder = Runtime::builder()
        .store(backend.store())
        .client_tool_timeout_ms(args.client_timeout_ms)
        .auto_resume(args.auto_resume);
    if let Some(leases) = backend.leases() {
        builder = builder.leases(leases);
    }
    for (variant, name) in AGENTS.iter().enumerate() {
        llm = llm.script(*name, plan.script(variant));
        builder = builder.agent(
            AgentDefinition::builder(*name)
                .system_prompt("Look things up, confirm with the user, then answer.")
                .tool(lookup_tool(Arc::clone(&lookups)))
                .tool(
                    ToolDefinition::client(CONFIRM)
                        .description("Asks the user to confirm")
                        .output_schema(confirm_schema()),
                )
                .tool(deploy_tool(Arc::clone(&deploys)))
                .max_steps(max_steps)
                .build()?,
        );
    }
    builder = builder.llm(Arc::new(llm));
    if args.max_resident > 0 {
        builder = builder.max_resident(args.max_resident);
    }
    let runtime = builder.build()?;

    let rss_before = Memory::read()?;
    let transactions_before = backend.database_transactions();
    let measured = driver::run(&runtime, &ids, &args).await?;
    // The run's own, before the verification reads the store.
    let run_transactions = backend
        .database_transactions()
        .zip(transactions_before)
        .map(|(after, before)| after.saturating_sub(before));
    let rss_after = Memory::read()?;
    let stats = runtime.stats();
    let client = runtime.client_tool_stats();

    let verify_start = Instant::now();
    let tools = ToolCounts {
        lookups: lookups.get(),
        deploys: deploys.get(),
    };
    let verdict = verify::verify(&runtime, &ids, &plan, &measured, tools, &client).await?;
    let mut problems = measured.errors.clone();
    problems.extend(verdict.problems);
    let verify_elapsed = verify_start.elapsed();
    // A database's totals are read while the store is open; sled's files once it is closed.
    let postgres = backend.postgres_totals().await?;

    runtime
        .shutdown()
        .await
        .map_err(|error| halt::fatal("shutting the runtime down", error))?;
    let (store_bytes, flushes) = match (&postgres, backend.sled_totals()?) {
        (Some(totals), _) => (totals.bytes, totals.transactions),
        (None, Some(totals)) => totals,
        (None, None) => (0, 0),
    };

    let report = Report {
        args: &args,
        store_path: backend.kept_path(&args),
        measured: &measured,
        stats,
        client,
        timeouts: verdict.timeouts,
        tools,
        rss_before,
        rss_after,
        store_bytes,
        flushes,
        verify_elapsed,
        problems: &problems,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report.json())?);
    } else {
        report.print();
        if let Some(totals) = &postgres {
            // With synchronous_commit each transaction is one WAL flush ("flushes" above).
            println!(
                "postgres:            {} committer transactions, {} WAL flushes by the server in the run",
                totals.transactions, totals.wal_syncs
            );
            if let Some(all) = run_transactions {
                println!(
                    "database:            {all} transactions in the run (reads, commits, leases): {:.1} a session",
                    all as f64 / args.sessions.max(1) as f64
                );
            }
        }
    }
    drop(runtime);
    drop(backend);
    Ok(problems.len())
}

/// The store directory of the run: `--store`, or a temporary directory (returned so it lives
/// as long as the run).
pub(crate) fn store_dir(args: &Args) -> anyhow::Result<(Option<tempfile::TempDir>, PathBuf)> {
    let temp = match &args.store {
        Some(_) => None,
        None => Some(tempfile::tempdir().context("creating a temporary directory")?),
    };
    let path = match (&args.store, &temp) {
        (Some(path), _) => path.clone(),
        (None, Some(dir)) => dir.path().join("store"),
        (None, None) => anyhow::bail!("no store directory"),
    };
    Ok((temp, path))
}

/// The sled store the run writes to (see [`store_dir`]), with the durability and group-commit
/// settings asked for.
pub(crate) fn open_store(
    args: &Args,
) -> anyhow::Result<(Option<tempfile::TempDir>, PathBuf, Arc<SledStore>)> {
    let (temp, path) = store_dir(args)?;
    let store = Arc::new(
        SledStore::builder(&path)
            .durability(args.durability.into())
            .group_commit(!args.no_group_commit)
            .open()
            .with_context(|| format!("opening the sled store at {}", path.display()))?,
    );
    Ok((temp, path, store))
}

/// Bytes of the files under `path`.
fn dir_size(path: &Path) -> anyhow::Result<u64> {
    dir_bytes(path, std::fs::Metadata::len)
}

/// Bytes the files under `path` take on disk (a file made long at once and filled as it goes
/// takes only what was written).
fn dir_allocated(path: &Path) -> anyhow::Result<u64> {
    #[cfg(unix)]
    let on_disk = |meta: &std::fs::Metadata| std::os::unix::fs::MetadataExt::blocks(meta) * 512;
    #[cfg(not(unix))]
    let on_disk = std::fs::Metadata::len;
    dir_bytes(path, on_disk)
}

/// The sum of `size` over the files under `path`.
fn dir_bytes(path: &Path, size: impl Fn(&std::fs::Metadata) -> u64) -> anyhow::Result<u64> {
    let mut total = 0;
    let mut dirs = vec![path.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                dirs.push(entry.path());
            } else {
                total += size(&meta);
            }
        }
    }
    Ok(total)
}
