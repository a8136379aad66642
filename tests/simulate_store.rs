//! The simulator (`examples/simulate`) on a store it did not start fresh: one that holds an
//! earlier process's sessions (it must check only its own), and one whose disk fills mid-run
//! (it must stop at once with the store error). And its `--http` mode, whose HTTP client is
//! its own, and its size mode (`--dormant N --sample M`) at a small N.
//!
//! These tests run the example binary, which `cargo test` builds next to the test binaries
//! (`target/debug/examples/simulate`). With `cargo test --test simulate_store` alone, build it
//! first: `cargo build --example simulate`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use dormant::types::ToolOutcome;
use dormant::{
    AgentDefinition, Message, ModelReply, Runtime, ScriptedLlm, SessionId, SledStore, Status,
    ToolCall, ToolDefinition,
};
use serde_json::{json, Value};

/// The simulator's first agent (`plan::AGENTS[0]`), which has the client tool `confirm`.
const SIMULATED: &str = "simulated";
/// The agent of the fan-out mode's children (`fanout.rs`), which has `confirm` too.
const FANOUT_WORKER: &str = "fanout-worker";
/// Longer than any run here needs; a run past it is killed and the test fails.
const RUN_BOUND: Duration = Duration::from_secs(60);
/// How soon a store error must end the run: far below the 60 s a waiting turn used to wait
/// for a timeout the failing store could never record.
const STORE_ERROR_BOUND: Duration = Duration::from_secs(30);

/// The example binary `cargo test` built.
fn simulator() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/simulate_store-<hash> → target/<profile>/examples/simulate
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .with_context(|| format!("no target directory above {}", exe.display()))?;
    let path = profile
        .join("examples")
        .join(format!("simulate{}", std::env::consts::EXE_SUFFIX));
    anyhow::ensure!(
        path.is_file(),
        "the simulator binary {} is missing: `cargo test` builds it; with `cargo test --test \
         simulate_store` alone, run `cargo build --example simulate` first",
        path.display()
    );
    Ok(path)
}

/// What a finished (or killed) process left.
#[derive(Debug)]
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    elapsed: Duration,
    /// It overran its bound and was killed.
    killed: bool,
}

/// Waits for `child` at most `bound` (killing it past that), collecting its output.
fn wait_bounded(mut child: Child, bound: Duration) -> anyhow::Result<Finished> {
    let started = Instant::now();
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let stdout = reader(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = reader(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let mut killed = false;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if started.elapsed() > bound {
            killed = true;
            child.kill()?;
            break child.wait()?;
        }
        // Polling a child process: there is nothing to wait on with a timeout in std.
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = started.elapsed();
    let join = |handle: std::thread::JoinHandle<String>| {
        handle
            .join()
            .map_err(|_| anyhow::anyhow!("an output reader panicked"))
    };
    Ok(Finished {
        status,
        stdout: join(stdout)?,
        stderr: join(stderr)?,
        elapsed,
        killed,
    })
}

/// Runs the simulator with `args` to the end and returns its JSON report.
fn run_simulator(args: &[&str]) -> anyhow::Result<Value> {
    let child = Command::new(simulator()?)
        .args(args)
        .arg("--json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let done = wait_bounded(child, RUN_BOUND)?;
    anyhow::ensure!(
        !done.killed && done.status.success(),
        "simulate {args:?} {} after {:?}\nstdout: {}\nstderr: {}",
        if done.killed {
            "was killed".to_string()
        } else {
            format!("exited {}", done.status)
        },
        done.elapsed,
        done.stdout,
        done.stderr
    );
    serde_json::from_str(done.stdout.trim())
        .with_context(|| format!("the report is not JSON: {}", done.stdout))
}

/// Leaves in the store at `dir` what an earlier process leaves: a session of `agent` suspended
/// on `confirm` whose deadline has passed (timeout 0, and no background scheduler to fire it).
/// The next runtime on the store fires it at boot.
async fn leave_expired_deadline(dir: &Path, agent: &str) -> anyhow::Result<SessionId> {
    let llm = ScriptedLlm::new().script(
        agent,
        vec![ModelReply::tool_calls(vec![ToolCall::new(
            "earlier-confirm",
            "confirm",
            json!({ "question": "left behind?" }),
        )])],
    );
    let runtime = Runtime::builder()
        .store(Arc::new(SledStore::open(dir)?))
        .llm(Arc::new(llm))
        .agent(
            AgentDefinition::builder(agent)
                .tool(ToolDefinition::client("confirm"))
                .build()?,
        )
        .client_tool_timeout_ms(0)
        .background_deadlines(false)
        .build()?;
    let id = SessionId::generate();
    let run = runtime.execute_on(&id, agent, "an earlier process").await?;
    assert_eq!(run.status, Status::SuspendedClientTool);
    assert_eq!(
        runtime.find_expired_pending(u64::MAX).await?.len(),
        1,
        "the store holds one expired deadline"
    );
    runtime.shutdown().await?;
    Ok(id)
}

/// Whether the earlier session `id` got its timeout (so the simulator's runtime did fire a
/// deadline that was not its own).
async fn timed_out(dir: &Path, id: &SessionId) -> anyhow::Result<bool> {
    let runtime = Runtime::builder()
        .store(Arc::new(SledStore::open(dir)?))
        .background_deadlines(false)
        .build()?;
    let timed_out = runtime.messages(id).await?.iter().any(|message| {
        matches!(message, Message::Tool { outcome: ToolOutcome::Error(error), .. }
                 if error.starts_with("client_tool_timeout"))
    });
    runtime.shutdown().await?;
    Ok(timed_out)
}

/// Runs the simulator with `args` on a store holding an earlier process's expired deadline
/// of `agent`; returns its report once it passed its end check.
async fn simulate_on_existing_store(agent: &str, args: &[&str]) -> anyhow::Result<Value> {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let earlier = leave_expired_deadline(&store, agent).await?;
    let store_arg = store.to_str().context("a non-UTF-8 temporary path")?;
    let mut all = vec!["--store", store_arg];
    all.extend_from_slice(args);
    let report = run_simulator(&all)?;
    assert_eq!(
        report["verified"],
        json!(true),
        "simulate {all:?}: {report:#}"
    );
    assert!(
        timed_out(&store, &earlier).await?,
        "the run fired the earlier process's deadline (else this test proves nothing)"
    );
    Ok(report)
}

/// `--http`: the simulator's own HTTP client (requests written by hand, chunked SSE answers
/// read back) drives a server the simulator serves. Every session goes round its cycle once
/// in each pass, the end check finds each answer applied once, and the idle streams open.
#[test]
fn the_http_mode_runs_every_cycle_once_over_http() -> anyhow::Result<()> {
    let report = run_simulator(&[
        "--http",
        "--sessions",
        "40",
        "--concurrency",
        "8",
        "--http-rounds",
        "1",
        "--sse-streams",
        "10",
    ])?;
    for pass in ["http", "in_process"] {
        let passes = report[pass].as_array().context("a pass is missing")?;
        assert_eq!(passes.len(), 1, "{report:#}");
        assert_eq!(passes[0]["cycles"], json!(40), "{pass}: {report:#}");
        assert_eq!(passes[0]["errors"], json!(0), "{pass}: {report:#}");
    }
    assert_eq!(report["sse_streams"]["open"], json!(10), "{report:#}");
    Ok(())
}

/// `--dormant`: every session suspends, all are evicted (the resident limit during the
/// creation, then `evict_all`), and the sample is answered cold, each with its answer once.
#[test]
fn the_dormant_mode_answers_a_sample_of_evicted_sessions_cold() -> anyhow::Result<()> {
    let report = run_simulator(&[
        "--dormant",
        "300",
        "--sample",
        "25",
        "--max-resident",
        "40",
        "--concurrency",
        "16",
    ])?;
    assert_eq!(report["mode"], json!("dormant"), "{report:#}");
    assert_eq!(report["verified"], json!(true), "{report:#}");
    assert_eq!(
        report["create_latency_us"]["count"],
        json!(300),
        "{report:#}"
    );
    assert_eq!(report["resident_after_evict"], json!(0), "{report:#}");
    assert_eq!(report["warm_sampled"], json!(0), "{report:#}");
    assert_eq!(
        report["cold_answer_latency_us"]["count"],
        json!(25),
        "{report:#}"
    );
    assert!(
        report["passivations"].as_u64() >= Some(300),
        "every session was evicted at least once: {report:#}"
    );
    assert!(
        report["store_bytes_per_session"]
            .as_f64()
            .is_some_and(|bytes| bytes > 0.0),
        "{report:#}"
    );
    Ok(())
}

/// The arguments of a small run whose clients leave some calls unanswered.
const SMALL_RUN: [&str; 8] = [
    "--sessions",
    "20",
    "--client-timeout-ms",
    "200",
    "--never-answer",
    "0.3",
    "--answer-delay-ms",
    "5",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_store_checks_only_this_runs_sessions() -> anyhow::Result<()> {
    let report = simulate_on_existing_store(SIMULATED, &SMALL_RUN).await?;
    let suspensions = &report["suspensions"];
    let never_answered = suspensions["never_answered"]
        .as_u64()
        .context("never_answered")?;
    assert!(never_answered > 0, "some calls of this run time out too");
    assert_eq!(
        suspensions["timeouts_fired"].as_u64(),
        Some(never_answered + suspensions["late_answers"].as_u64().unwrap_or(0)),
        "the report counts this run's timeouts: {report:#}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_store_with_auto_resume_counts_only_this_runs_tools() -> anyhow::Result<()> {
    // The earlier session times out at boot, then resumes on its own and runs `lookup`s (and
    // suspends and times out once more) under this run's agents.
    let mut args = SMALL_RUN.to_vec();
    args.push("--auto-resume");
    let report = simulate_on_existing_store(SIMULATED, &args).await?;
    assert_eq!(
        report["tool_calls"].as_u64(),
        Some(20 * 4 * 2 + report["suspensions"]["approvals_run"].as_u64().unwrap_or(0)),
        "lookups of this run's sessions (sessions × steps × turns) and its approved deploys: {report:#}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_store_in_fanout_mode_checks_only_this_runs_trees() -> anyhow::Result<()> {
    // Answers take up to 300 ms, so the run outlasts the boot sweep that fires the earlier
    // deadline.
    simulate_on_existing_store(
        FANOUT_WORKER,
        &["--fanout", "3x4", "--answer-delay-ms", "300"],
    )
    .await?;
    Ok(())
}

/// Bytes of sled's log file in the store at `dir` (0 before it exists).
fn store_log_bytes(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("db")).map_or(0, |meta| meta.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_a_killed_run_left_checks_only_the_next_runs_sessions() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    // An earlier run that would go on for minutes, every call left to time out after 100 ms;
    // it is killed once its store has grown, so some of its sessions are suspended with
    // deadlines that will have passed when the next run boots.
    let mut earlier = Command::new(simulator()?)
        .arg("--store")
        .arg(&store)
        .args(["--sessions", "100000", "--never-answer", "1"])
        .args(["--client-timeout-ms", "100", "--json"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let started = Instant::now();
    while store_log_bytes(&store) < 2 << 20 {
        if let Some(status) = earlier.try_wait()? {
            anyhow::bail!("the earlier run ended by itself ({status}) before it was killed");
        }
        anyhow::ensure!(
            started.elapsed() < RUN_BOUND,
            "the earlier run wrote no 2 MiB within {RUN_BOUND:?}"
        );
        // Polling a child process's progress: it reports none.
        std::thread::sleep(Duration::from_millis(10));
    }
    earlier.kill()?;
    earlier.wait()?;

    let store_arg = store.to_str().context("a non-UTF-8 temporary path")?;
    let mut args = vec!["--store", store_arg, "--auto-resume"];
    args.extend_from_slice(&SMALL_RUN);
    let report = run_simulator(&args)?;
    assert_eq!(report["verified"], json!(true), "{report:#}");
    assert!(
        report["suspensions"]["timeouts_of_earlier_sessions"]
            .as_u64()
            .is_some_and(|timeouts| timeouts > 0),
        "the run fired deadlines of the killed run's sessions (else this test proves nothing): {report:#}"
    );
    Ok(())
}

/// How to run a command in a private mount namespace here: `unshare -m` as root, `unshare -r
/// -m` (a user namespace) otherwise. Fails, saying what it needs, if neither can mount a
/// tmpfs.
fn mount_namespace(dir: &Path) -> anyhow::Result<Vec<&'static str>> {
    let mut failures = Vec::new();
    for prefix in [vec!["-m"], vec!["-r", "-m"]] {
        let probe = Command::new("unshare")
            .args(&prefix)
            .args(["sh", "-c", r#"mount -t tmpfs -o size=2m tmpfs "$1""#, "sh"])
            .arg(dir)
            .output();
        match probe {
            Ok(output) if output.status.success() => return Ok(prefix),
            Ok(output) => failures.push(format!(
                "unshare {}: {}",
                prefix.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            )),
            Err(error) => failures.push(format!("unshare: {error}")),
        }
    }
    anyhow::bail!(
        "this test mounts a 2 MiB tmpfs in a private mount namespace to fill the disk under the \
         simulator: it needs root (or unprivileged user namespaces) and util-linux's `unshare` \
         and `mount` on PATH; CI runs it as root. Tried: {}",
        failures.join("; ")
    )
}

/// Runs the simulator with `args` on a store in a tmpfs of `tmpfs_size` (which fills mid-run) and
/// checks it stops promptly with the store error.
fn simulate_on_a_full_disk(tmpfs_size: &str, args: &[&str]) -> anyhow::Result<()> {
    let simulator = simulator()?;
    let dir = tempfile::tempdir()?;
    let prefix = mount_namespace(dir.path())?;
    let child = Command::new("unshare")
        .args(&prefix)
        .args([
            "sh",
            "-c",
            // $0 is the simulator, $1 the directory, the rest its arguments.
            r#"mount -t tmpfs -o size="$1" tmpfs "$2" && shift 2 && exec "$0" "$@""#,
        ])
        .arg(&simulator)
        .arg(tmpfs_size)
        .arg(dir.path())
        .arg("--store")
        .arg(dir.path().join("store"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let done = wait_bounded(child, STORE_ERROR_BOUND)?;
    let context = || {
        format!(
            "simulate {args:?} on a full disk: {} after {:?}\nstdout: {}\nstderr: {}",
            if done.killed {
                "killed".to_string()
            } else {
                done.status.to_string()
            },
            done.elapsed,
            done.stdout,
            done.stderr
        )
    };
    assert!(
        !done.killed,
        "it did not stop within {STORE_ERROR_BOUND:?}: {}",
        context()
    );
    assert!(!done.status.success(), "it exited 0: {}", context());
    assert!(
        done.stderr.contains("store error"),
        "no store error on stderr: {}",
        context()
    );
    assert!(
        !done.stderr.contains("verification failed"),
        "a store error is not a failed verification: {}",
        context()
    );
    Ok(())
}

#[test]
fn a_store_error_stops_the_simulator_at_once() -> anyhow::Result<()> {
    simulate_on_a_full_disk("2m", &["--sessions", "5000", "--never-answer", "0.5"])
}

#[test]
fn a_store_error_stops_the_fanout_simulator_at_once() -> anyhow::Result<()> {
    // 512 KiB: the debug build takes 9 to 30 s to write 1 MiB of trees on a busy machine
    // (each commit of a parent rewrites its run record, usage included), too close to the
    // bound, and 1 to 4 s for 512 KiB; what the test checks is how soon it stops once the disk
    // is full.
    simulate_on_a_full_disk("512k", &["--fanout", "500x10"])
}
