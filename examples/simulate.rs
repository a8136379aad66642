//! Run with: cargo run --release --example simulate
//!
//! The main job: runs many sessions of a scripted agent with server-tool steps on a durable sled
//! store, with a bounded number in flight and, by default, a resident limit that forces sessions
//! to be evicted between their turns and rehydrated from the store. Every session is checked at
//! the end (the process exits non-zero if one is wrong), then a report is printed: throughput,
//! commit latency, actor lifecycle counters, memory and store size. `--json` prints the same
//! report as one JSON object.
//!
//! Scheduling: turn 1 of every session is queued first, in order; when a turn ends, the next
//! turn of that session goes to the back of the queue. So a session's turn 2 starts only after
//! every other session's turn 1 has been dispatched, and with `--max-resident` well below
//! `--sessions` its actor has been evicted in between and must rehydrate.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use dormant::store::Durability;
use dormant::{
    AgentDefinition, Message, ModelReply, Runtime, ScriptedLlm, SessionId, SledStore, Status,
    ToolCall, ToolDefinition, ToolError,
};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

const AGENT: &str = "simulated";
const TOOL: &str = "lookup";

/// Simulates many durable agent sessions and reports throughput, latency and memory.
#[derive(Debug, Parser)]
#[command(about)]
struct Args {
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
    /// Turns in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Most resident session actors (least recently used idle ones are evicted past it);
    /// 0 means no limit, so nothing is evicted or rehydrated.
    #[arg(long, default_value_t = 1_000)]
    max_resident: usize,
    /// Store directory (default: a fresh temporary directory, removed at exit). Sessions get
    /// new ids, so an existing store can be reused.
    #[arg(long)]
    store: Option<PathBuf>,
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

/// One queued `execute_on`: session index and turn (1-based).
#[derive(Clone, Copy, Debug)]
enum Job {
    Run {
        session: usize,
        turn: usize,
    },
    /// A turn failed: its session's remaining turns will never be queued.
    Skip(usize),
}

/// What the run measured, before verification.
#[derive(Debug)]
struct Measured {
    elapsed: Duration,
    turn_latency: Histogram<u64>,
    errors: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.sessions > 0, "--sessions must be at least 1");
    anyhow::ensure!(args.turns > 0, "--turns must be at least 1");
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be at least 1");
    let problems = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(simulate(args))?;
    if problems > 0 {
        eprintln!("simulate: verification failed: {problems} sessions or counters were wrong");
        std::process::exit(1);
    }
    Ok(())
}

/// Runs the simulation and prints the report; returns how many problems verification found.
async fn simulate(args: Args) -> anyhow::Result<usize> {
    let temp = match &args.store {
        Some(_) => None,
        None => Some(tempfile::tempdir().context("creating a temporary directory")?),
    };
    let path = match (&args.store, &temp) {
        (Some(path), _) => path.clone(),
        (None, Some(dir)) => dir.path().join("store"),
        (None, None) => anyhow::bail!("no store directory"),
    };
    let store = Arc::new(
        SledStore::builder(&path)
            .durability(args.durability.into())
            .group_commit(!args.no_group_commit)
            .open()
            .with_context(|| format!("opening the sled store at {}", path.display()))?,
    );

    let tool_calls = Arc::new(AtomicU64::new(0));
    let max_steps = u32::try_from(args.steps + 1).context("--steps is too large")?;
    let agent = AgentDefinition::builder(AGENT)
        .system_prompt("Look things up, then answer.")
        .tool(lookup_tool(Arc::clone(&tool_calls)))
        .max_steps(max_steps)
        .build()?;
    let llm = ScriptedLlm::new().script(AGENT, script(args.steps, args.turns));
    let mut builder = Runtime::builder()
        .store(Arc::clone(&store) as Arc<dyn dormant::Store>)
        .llm(Arc::new(llm))
        .agent(agent);
    if args.max_resident > 0 {
        builder = builder.max_resident(args.max_resident);
    }
    let runtime = builder.build()?;

    let ids: Arc<Vec<SessionId>> =
        Arc::new((0..args.sessions).map(|_| SessionId::generate()).collect());
    let rss_before = memory()?;
    let measured = run(&runtime, &ids, &args).await?;
    let rss_after = memory()?;
    let stats = runtime.stats();

    let verify_start = Instant::now();
    let mut problems = measured.errors.clone();
    problems.extend(verify(&runtime, &ids, &args)?);
    let expected_calls = u64::try_from(args.sessions * args.steps * args.turns)?;
    let calls = tool_calls.load(Ordering::Relaxed);
    if calls != expected_calls {
        problems.push(format!(
            "tool invocations: {calls}, expected {expected_calls} (sessions × steps × turns)"
        ));
    }
    let verify_elapsed = verify_start.elapsed();

    runtime.shutdown().await?;
    let store_bytes = runtime.store_size_on_disk()?;
    let flushes = store.flush_count();

    let report = Report {
        args: &args,
        store_path: if temp.is_some() {
            None
        } else {
            Some(path.clone())
        },
        measured: &measured,
        stats,
        tool_calls: calls,
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
    }
    drop(runtime);
    drop(store);
    drop(temp);
    Ok(problems.len())
}

/// A server tool that does trivial work and counts its invocations.
fn lookup_tool(calls: Arc<AtomicU64>) -> ToolDefinition {
    ToolDefinition::server(TOOL, move |input: Value, _ctx| {
        let calls = Arc::clone(&calls);
        async move {
            calls.fetch_add(1, Ordering::Relaxed);
            Ok::<_, ToolError>(json!({ "found": true, "step": input["step"], "stock": 3 }))
        }
    })
    .description("Looks an item up")
    .safe_to_retry(true)
}

/// The agent's script: per turn, `steps` replies with one tool call each, then a text. The
/// scripted model answers with entry k where k counts the session's assistant messages, so
/// turn t starts at entry (t - 1) × (steps + 1).
fn script(steps: usize, turns: usize) -> Vec<ModelReply> {
    let mut replies = Vec::with_capacity(turns * (steps + 1));
    for turn in 1..=turns {
        for step in 0..steps {
            replies.push(ModelReply::tool_calls(vec![ToolCall::new(
                format!("t{turn}-c{step}"),
                TOOL,
                json!({ "item": "tea", "step": step }),
            )]));
        }
        replies.push(ModelReply::text(format!("turn {turn}: we have 3 teas.")));
    }
    replies
}

/// Runs every turn of every session with `args.concurrency` turns in flight.
async fn run(
    runtime: &Runtime,
    ids: &Arc<Vec<SessionId>>,
    args: &Args,
) -> anyhow::Result<Measured> {
    let total = args.sessions * args.turns;
    let progress = if args.json || !std::io::stderr().is_terminal() {
        ProgressBar::with_draw_target(Some(u64::try_from(total)?), ProgressDrawTarget::hidden())
    } else {
        let bar = ProgressBar::new(u64::try_from(total)?);
        bar.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40}] {pos}/{len} turns ({rate} turns/s, eta {eta})",
            )?
            .with_key(
                "rate",
                |state: &indicatif::ProgressState, out: &mut dyn std::fmt::Write| {
                    let _ = write!(out, "{:.0}", state.per_sec());
                },
            )
            .progress_chars("=> "),
        );
        bar
    };

    let (queue, mut jobs) = mpsc::unbounded_channel::<Job>();
    for session in 0..args.sessions {
        queue.send(Job::Run { session, turn: 1 })?;
    }
    let latency = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1,
        3_600_000_000,
        3,
    )?));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let slots = Arc::new(Semaphore::new(args.concurrency));
    let mut tasks = JoinSet::new();
    let mut remaining = total;
    let start = Instant::now();

    while remaining > 0 {
        let Some(job) = jobs.recv().await else { break };
        let (session, turn) = match job {
            Job::Skip(turns) => {
                remaining = remaining.saturating_sub(turns);
                progress.inc(u64::try_from(turns)?);
                continue;
            }
            Job::Run { session, turn } => (session, turn),
        };
        remaining -= 1;
        let permit = Arc::clone(&slots).acquire_owned().await?;
        let runtime = runtime.clone();
        let ids = Arc::clone(ids);
        let queue = queue.clone();
        let latency = Arc::clone(&latency);
        let errors = Arc::clone(&errors);
        let progress = progress.clone();
        let turns = args.turns;
        tasks.spawn(async move {
            let id = &ids[session];
            let began = Instant::now();
            let outcome = runtime
                .execute_on(id, AGENT, format!("turn {turn}: any tea?"))
                .await;
            let micros = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
            latency.lock().saturating_record(micros.max(1));
            drop(permit);
            let failed = match outcome {
                Ok(outcome) if outcome.status == Status::Completed => None,
                Ok(outcome) => Some(format!(
                    "session {id} turn {turn}: status {:?}, error {:?}",
                    outcome.status, outcome.error
                )),
                Err(error) => Some(format!("session {id} turn {turn}: {error}")),
            };
            let next = match failed {
                Some(problem) => {
                    errors.lock().push(problem);
                    Job::Skip(turns - turn)
                }
                None => Job::Run {
                    session,
                    turn: turn + 1,
                },
            };
            if turn < turns {
                // The receiver lives until every job is accounted for.
                let _ = queue.send(next);
            }
            progress.inc(1);
        });
        while let Some(joined) = tasks.try_join_next() {
            joined?;
        }
    }
    while let Some(joined) = tasks.join_next().await {
        joined?;
    }
    let elapsed = start.elapsed();
    progress.finish_and_clear();
    let turn_latency = latency.lock().clone();
    let errors = std::mem::take(&mut *errors.lock());
    Ok(Measured {
        elapsed,
        turn_latency,
        errors,
    })
}

/// Checks every session in the store: completed, the expected conversation, one run per turn.
fn verify(runtime: &Runtime, ids: &[SessionId], args: &Args) -> anyhow::Result<Vec<String>> {
    // Per turn: the user message, steps × (assistant with a call + tool result), the final text.
    let expected_messages = args.turns * (2 * args.steps + 2);
    let expected_tools = args.turns * args.steps;
    let mut problems = Vec::new();
    for id in ids {
        let record = match runtime.session(id) {
            Ok(record) => record,
            Err(error) => {
                problems.push(format!("session {id}: {error}"));
                continue;
            }
        };
        if record.status != Status::Completed {
            problems.push(format!("session {id}: status {:?}", record.status));
        }
        let messages = runtime.messages(id)?;
        if messages.len() != expected_messages {
            problems.push(format!(
                "session {id}: {} messages, expected {expected_messages}",
                messages.len()
            ));
        }
        let tools = messages
            .iter()
            .filter(|message| matches!(message, Message::Tool { .. }))
            .count();
        if tools != expected_tools {
            problems.push(format!(
                "session {id}: {tools} tool results, expected {expected_tools}"
            ));
        }
        let runs = runtime.runs(id)?;
        let completed = runs
            .iter()
            .filter(|run| run.status == Status::Completed)
            .count();
        if runs.len() != args.turns || completed != args.turns {
            problems.push(format!(
                "session {id}: {} runs ({completed} completed), expected {}",
                runs.len(),
                args.turns
            ));
        }
    }
    Ok(problems)
}

/// Resident and peak resident memory of this process, in bytes.
#[derive(Clone, Copy, Debug, Default)]
struct Memory {
    rss: u64,
    hwm: u64,
}

/// Reads VmRSS and VmHWM from /proc/self/status (zeros where there is no procfs).
fn memory() -> anyhow::Result<Memory> {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return Ok(Memory::default());
    };
    let field = |name: &str| -> anyhow::Result<u64> {
        let Some(line) = status.lines().find(|line| line.starts_with(name)) else {
            return Ok(0);
        };
        let kib: u64 = line
            .trim_start_matches(name)
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .with_context(|| format!("parsing {line:?}"))?;
        Ok(kib * 1024)
    };
    Ok(Memory {
        rss: field("VmRSS:")?,
        hwm: field("VmHWM:")?,
    })
}

/// Everything the closing report shows.
#[derive(Debug)]
struct Report<'a> {
    args: &'a Args,
    store_path: Option<PathBuf>,
    measured: &'a Measured,
    stats: dormant::RuntimeStats,
    tool_calls: u64,
    rss_before: Memory,
    rss_after: Memory,
    store_bytes: u64,
    flushes: u64,
    verify_elapsed: Duration,
    problems: &'a [String],
}

impl Report<'_> {
    fn secs(&self) -> f64 {
        self.measured.elapsed.as_secs_f64().max(1e-9)
    }

    fn turns(&self) -> usize {
        self.args.sessions * self.args.turns
    }

    fn model_steps(&self) -> usize {
        self.turns() * (self.args.steps + 1)
    }

    fn rehydrations(&self) -> u64 {
        // Every session's first activation creates it; a busy session is never evicted, so
        // each further activation loaded an existing session from the store.
        self.stats
            .host
            .activations
            .saturating_sub(u64::try_from(self.args.sessions).unwrap_or(u64::MAX))
    }

    fn commits_per_flush(&self) -> f64 {
        if self.flushes == 0 {
            0.0
        } else {
            as_f64(self.stats.commit_latency.count) / as_f64(self.flushes)
        }
    }

    fn rate(&self, count: u64) -> f64 {
        as_f64(count) / self.secs()
    }

    fn json(&self) -> Value {
        let host = &self.stats.host;
        let commits = &self.stats.commit_latency;
        let turns = &self.measured.turn_latency;
        json!({
            "sessions": self.args.sessions,
            "steps_per_turn": self.args.steps,
            "turns_per_session": self.args.turns,
            "concurrency": self.args.concurrency,
            "max_resident": (self.args.max_resident > 0).then_some(self.args.max_resident),
            "durability": format!("{:?}", Durability::from(self.args.durability)),
            "group_commit": !self.args.no_group_commit,
            "store_path": self.store_path.as_ref().map(|p| p.display().to_string()),
            "elapsed_s": self.secs(),
            "sessions_per_s": self.rate(count(self.args.sessions)),
            "turns_per_s": self.rate(count(self.turns())),
            "model_steps": self.model_steps(),
            "steps_per_s": self.rate(count(self.model_steps())),
            "tool_calls": self.tool_calls,
            "turn_latency_us": {
                "p50": turns.value_at_quantile(0.5),
                "p99": turns.value_at_quantile(0.99),
                "p999": turns.value_at_quantile(0.999),
                "max": turns.max(),
            },
            "commits": commits.count,
            "commits_per_s": self.rate(commits.count),
            "commit_latency_us": {
                "p50": commits.p50_us,
                "p99": commits.p99_us,
                "p999": commits.p999_us,
                "max": commits.max_us,
            },
            "commit_bytes": self.stats.commit_bytes,
            "flushes": self.flushes,
            "commits_per_flush": self.commits_per_flush(),
            "activations": host.activations,
            "passivations": host.passivations,
            "rehydrations": self.rehydrations(),
            "activation_failures": host.activation_failures,
            "crashes": host.crashes,
            "peak_resident": host.peak_resident,
            "resident_at_end": host.resident,
            "rss_before_bytes": self.rss_before.rss,
            "rss_after_bytes": self.rss_after.rss,
            "rss_peak_bytes": self.rss_after.hwm,
            "store_bytes": self.store_bytes,
            "verify_s": self.verify_elapsed.as_secs_f64(),
            "verified": self.problems.is_empty(),
            "problems": self.problems.iter().take(20).collect::<Vec<_>>(),
            "problem_count": self.problems.len(),
        })
    }

    fn print(&self) {
        let args = self.args;
        let host = &self.stats.host;
        let commits = &self.stats.commit_latency;
        let turns = &self.measured.turn_latency;
        let mib = |bytes: u64| as_f64(bytes) / (1024.0 * 1024.0);
        println!("dormant simulate");
        println!(
            "config:              {} sessions × {} turns × ({} tool steps + 1 text), concurrency {}, max resident {}, {:?}, group commit {}",
            args.sessions,
            args.turns,
            args.steps,
            args.concurrency,
            if args.max_resident > 0 { args.max_resident.to_string() } else { "unlimited".into() },
            Durability::from(args.durability),
            if args.no_group_commit { "off" } else { "on" },
        );
        if let Some(path) = &self.store_path {
            println!("store:               {}", path.display());
        }
        println!("elapsed:             {:.2} s", self.secs());
        println!("sessions:            {}", args.sessions);
        println!(
            "sessions/s:          {:.0}",
            self.rate(count(args.sessions))
        );
        println!("turns/s:             {:.0}", self.rate(count(self.turns())));
        println!(
            "steps/s:             {:.0} ({} model steps)",
            self.rate(count(self.model_steps())),
            self.model_steps()
        );
        println!("tool calls:          {}", self.tool_calls);
        println!(
            "turn latency:        p50 {} µs, p99 {} µs, p999 {} µs, max {} µs",
            turns.value_at_quantile(0.5),
            turns.value_at_quantile(0.99),
            turns.value_at_quantile(0.999),
            turns.max()
        );
        println!(
            "commits:             {} ({:.0}/s, {:.1} MiB)",
            commits.count,
            self.rate(commits.count),
            mib(self.stats.commit_bytes)
        );
        println!(
            "commit latency:      p50 {} µs, p99 {} µs, p999 {} µs, max {} µs",
            commits.p50_us, commits.p99_us, commits.p999_us, commits.max_us
        );
        println!("flushes:             {}", self.flushes);
        println!("commits per flush:   {:.1}", self.commits_per_flush());
        println!("peak resident:       {}", host.peak_resident);
        println!("activations:         {}", host.activations);
        println!("passivations:        {}", host.passivations);
        println!("rehydrations:        {}", self.rehydrations());
        println!(
            "crashes:             {} (activation failures {})",
            host.crashes, host.activation_failures
        );
        println!(
            "rss:                 {:.1} MiB before, {:.1} MiB after, {:.1} MiB peak",
            mib(self.rss_before.rss),
            mib(self.rss_after.rss),
            mib(self.rss_after.hwm)
        );
        println!("store on disk:       {:.1} MiB", mib(self.store_bytes));
        println!(
            "verified:            {} ({} problems, checked in {:.2} s)",
            if self.problems.is_empty() {
                "ok"
            } else {
                "FAILED"
            },
            self.problems.len(),
            self.verify_elapsed.as_secs_f64()
        );
        for problem in self.problems.iter().take(20) {
            println!("  {problem}");
        }
    }
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[allow(clippy::cast_precision_loss)]
fn as_f64(n: u64) -> f64 {
    n as f64
}
