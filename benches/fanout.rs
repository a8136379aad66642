//! Run with: cargo bench --bench fanout            (add `-- --quick` for a short run; under
//! `cargo test --benches`, which does not pass `--bench`, it always runs quick, in seconds)
//!
//! Sub-agent fan-out (issue 4), each case beside its baseline in the same run:
//!
//! a) one root whose single model reply delegates to N children (sub-agent tools), each child
//!    suspending on a client tool: time and RSS until the root reports
//!    `suspended_awaiting_children`, then the latency of answering every child's call against
//!    the root (64 submits in flight), against N roots with ONE child each measured the same
//!    way; memory with the N children suspended and after `evict_all`; the cascading resume.
//! b) cold activation of a parent whose step a crash cut while 1,000 children were recorded
//!    as running: the time from the first message to the parent (`interrupt`) to its answer,
//!    and how long the background reconciliation of the children took.
//!
//! `FANOUT_ONLY=submits|recovery` runs one part.

#[path = "support/rss.rs"]
mod rss;
#[path = "support/submits.rs"]
mod submits;

use std::sync::Arc;
use std::time::{Duration, Instant};

use dormant::llm::{LlmAdapter, LlmError, ModelRequest};
use dormant::store::Store;
use dormant::types::ChildState;
use dormant::Submit;
use dormant::{
    AgentDefinition, ModelReply, Runtime, ScriptedLlm, SessionId, SledStore, Status, ToolCall,
    ToolDefinition,
};
use futures::future::BoxFuture;
use futures::stream::{self, StreamExt};
use serde_json::json;

const ROOT_AGENT: &str = "lead";
const CHILD_AGENT: &str = "editor";

fn main() -> anyhow::Result<()> {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this without it: quick then.
    let quick = std::env::args().any(|arg| arg == "--quick")
        || !std::env::args().any(|arg| arg == "--bench");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "# dormant sub-agent fan-out bench ({} cores; shared machine: compare ratios within a run)",
        num_cpus()
    );
    let only = std::env::var("FANOUT_ONLY").ok();
    let wants = |name: &str| only.as_deref().is_none_or(|only| only == name);
    runtime.block_on(async {
        if wants("submits") {
            fan_out(quick).await?;
        }
        if wants("recovery") {
            recovery(quick).await?;
        }
        anyhow::Ok(())
    })
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The root delegates with `delegate`; the child suspends on the client tool `edit`.
fn agents() -> anyhow::Result<Vec<AgentDefinition>> {
    Ok(vec![
        AgentDefinition::builder(CHILD_AGENT)
            .tool(ToolDefinition::client("edit"))
            .build()?,
        AgentDefinition::builder(ROOT_AGENT)
            .tool(ToolDefinition::sub_agent("delegate", CHILD_AGENT))
            .build()?,
    ])
}

fn runtime_on(
    store: Arc<dyn Store>,
    llm: Arc<dyn LlmAdapter>,
    inspection_ms: Option<u64>,
) -> anyhow::Result<Runtime> {
    let mut builder = Runtime::builder()
        .store(store)
        .llm(llm)
        .background_deadlines(false);
    if let Some(ms) = inspection_ms {
        builder = builder.child_inspection_timeout_ms(ms);
    }
    for agent in agents()? {
        builder = builder.agent(agent);
    }
    Ok(builder.build()?)
}

/// The id of the delegation call `i` of a root.
fn delegate_id(i: usize) -> String {
    format!("d{i}")
}

/// The client call of the child of delegation `i` under `root`: unique across every tree,
/// because submits are routed by (root, call id).
fn edit_id(root: &str, i: usize) -> String {
    format!("e-{root}-{i}")
}

/// The root's script: one reply with `children` delegations, then the final text.
fn root_script(children: usize) -> Vec<ModelReply> {
    vec![
        ModelReply::tool_calls(
            (0..children)
                .map(|i| {
                    ToolCall::new(
                        delegate_id(i),
                        "delegate",
                        json!({ "message": format!("edit part {i}") }),
                    )
                })
                .collect(),
        ),
        ModelReply::text("every part is edited"),
    ]
}

/// Scripts a tree: the root's script and, per child session (ScriptedLlm scripts per agent or
/// per session; a child's call id must differ from its siblings'), one client call and a text.
fn script_tree(llm: &ScriptedLlm, root: &SessionId, children: usize) {
    llm.set_session_script(root.clone(), root_script(children));
    for i in 0..children {
        let child = root.ephemeral_child(&delegate_id(i));
        llm.set_session_script(
            child,
            vec![
                ModelReply::tool_calls(vec![ToolCall::new(
                    edit_id(root.as_str(), i),
                    "edit",
                    json!({ "part": i }),
                )]),
                ModelReply::text(format!("part {i} edited")),
            ],
        );
    }
}

fn kib(bytes: u64) -> f64 {
    bytes as f64 / 1024.0
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

struct SubmitRow {
    p50: u64,
    p99: u64,
    per_s: f64,
}

async fn fan_out(quick: bool) -> anyhow::Result<()> {
    let children = if quick { 200 } else { 10_000 };
    println!(
        "\n## a) Fan-out: {children} suspended children under one root vs {children} roots with one child each\n"
    );

    // One root, `children` children.
    let dir = tempfile::tempdir()?;
    let llm = Arc::new(ScriptedLlm::new());
    let root: SessionId = "root".parse()?;
    script_tree(&llm, &root, children);
    let runtime = runtime_on(Arc::new(SledStore::open(dir.path())?), llm, None)?;
    let rss_start = rss::rss_bytes()?;
    let started = Instant::now();
    let run = runtime
        .execute_on(&root, ROOT_AGENT, "edit everything")
        .await?;
    let suspend_time = started.elapsed();
    anyhow::ensure!(
        run.status == Status::SuspendedAwaitingChildren,
        "root ended {:?}: {:?}",
        run.status,
        run.error
    );
    anyhow::ensure!(
        run.pending.len() == children,
        "{} pending",
        run.pending.len()
    );
    let rss_suspended = rss::rss_bytes()?;
    let resident_suspended = runtime.stats().host.resident;
    let suspended = runtime
        .children(&root)
        .await?
        .iter()
        .filter(|call| matches!(call.state, ChildState::Suspended { .. }))
        .count();
    anyhow::ensure!(suspended == children, "{suspended} children suspended");
    runtime.evict_all().await;
    let rss_evicted = rss::rss_bytes()?;
    let resident_evicted = runtime.stats().host.resident;
    // Answer every child's call against the root; the children are evicted, as they would be
    // while a person takes their time.
    let submits = (0..children)
        .map(|i| Submit::result("root", edit_id("root", i), json!({ "applied": i })))
        .collect();
    let fan = submit_all(&runtime, submits).await?;
    let started = Instant::now();
    let done = runtime.resume(&root).await?;
    let resume_time = started.elapsed();
    anyhow::ensure!(
        done.status == Status::Completed,
        "resume ended {:?}: {:?}",
        done.status,
        done.error
    );
    runtime.shutdown().await?;

    // `children` roots with one child each, measured the same way.
    let dir = tempfile::tempdir()?;
    let llm = Arc::new(ScriptedLlm::new());
    let roots: Vec<SessionId> = (0..children)
        .map(|i| format!("r{i}").parse())
        .collect::<Result<_, _>>()?;
    for root in &roots {
        script_tree(&llm, root, 1);
    }
    let runtime = runtime_on(Arc::new(SledStore::open(dir.path())?), llm, None)?;
    let started = Instant::now();
    let outcomes: Vec<anyhow::Result<()>> = stream::iter(roots.clone())
        .map(|root| {
            let runtime = runtime.clone();
            async move {
                let run = runtime.execute_on(&root, ROOT_AGENT, "edit it").await?;
                anyhow::ensure!(run.status == Status::SuspendedAwaitingChildren);
                Ok(())
            }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    let single_suspend_time = started.elapsed();
    outcomes.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    runtime.evict_all().await;
    let submits = roots
        .iter()
        .map(|root| {
            Submit::result(
                root.as_str(),
                edit_id(root.as_str(), 0),
                json!({ "applied": 0 }),
            )
        })
        .collect();
    let single = submit_all(&runtime, submits).await?;
    runtime.shutdown().await?;

    println!("| tree | suspend (execute → suspended_awaiting_children) | submits | p50 µs | p99 µs | submits/s |");
    println!("|---|---:|---:|---:|---:|---:|");
    println!(
        "| 1 root × {children} children | {:.2} s | {children} | {} | {} | {:.0} |",
        suspend_time.as_secs_f64(),
        fan.p50,
        fan.p99,
        fan.per_s
    );
    println!(
        "| {children} roots × 1 child (256 executes in flight) | {:.2} s | {children} | {} | {} | {:.0} |",
        single_suspend_time.as_secs_f64(),
        single.p50,
        single.p99,
        single.per_s
    );
    println!(
        "\nratio (fan-out / one child): p50 {:.2}×, p99 {:.2}× (goal: within 2×)",
        fan.p50 as f64 / single.p50.max(1) as f64,
        fan.p99 as f64 / single.p99.max(1) as f64
    );
    println!("\n| memory | RSS | resident actors |");
    println!("|---|---:|---:|");
    println!(
        "| before the root's execute | {:.1} MiB | 0 |",
        mib(rss_start)
    );
    println!(
        "| {children} children suspended | {:.1} MiB (+{:.2} KiB per child) | {resident_suspended} |",
        mib(rss_suspended),
        kib(rss_suspended.saturating_sub(rss_start)) / children as f64
    );
    println!(
        "| after evict_all | {:.1} MiB | {resident_evicted} |",
        mib(rss_evicted)
    );
    println!(
        "\nresume(root) after every answer: {:.2} s to wake {children} children, drain their answers and complete the tree",
        resume_time.as_secs_f64()
    );
    Ok(())
}

async fn submit_all(runtime: &Runtime, submits: Vec<Submit>) -> anyhow::Result<SubmitRow> {
    let count = submits.len();
    let (histogram, elapsed) = submits::submit_latencies(runtime, submits, 64).await?;
    Ok(SubmitRow {
        p50: histogram.value_at_quantile(0.5),
        p99: histogram.value_at_quantile(0.99),
        per_s: count as f64 / elapsed.as_secs_f64(),
    })
}

/// Reopens a store the previous runtime shut down. `Runtime::shutdown` closes the store so
/// that its directory "can be reopened at once", but after a shutdown with many children
/// hanging in model calls sled's directory lock is sometimes still held for a moment: retry
/// (and say so) rather than fail.
async fn reopen(path: &std::path::Path) -> anyhow::Result<SledStore> {
    let started = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        match SledStore::open(path) {
            Ok(store) => {
                if attempts > 1 {
                    println!(
                        "(note: the reopen found sled's lock still held; it succeeded on attempt {attempts}, after {:.0} ms)",
                        started.elapsed().as_secs_f64() * 1e3
                    );
                }
                return Ok(store);
            }
            Err(error)
                if error.to_string().contains("could not acquire lock")
                    && started.elapsed() < Duration::from_secs(10) =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// A scripted model whose answers to the child agent never come: the children stay running.
#[derive(Debug)]
struct HangingChildren(ScriptedLlm);

impl LlmAdapter for HangingChildren {
    fn complete(&self, request: ModelRequest) -> BoxFuture<'static, Result<ModelReply, LlmError>> {
        if request.agent == CHILD_AGENT {
            return Box::pin(futures::future::pending());
        }
        self.0.complete(request)
    }
}

fn hanging(children: usize) -> Arc<HangingChildren> {
    Arc::new(HangingChildren(
        ScriptedLlm::new().script(ROOT_AGENT, root_script(children)),
    ))
}

async fn recovery(quick: bool) -> anyhow::Result<()> {
    let children = if quick { 100 } else { 1_000 };
    println!(
        "\n## b) Cold activation of a parent whose step a crash cut with {children} children running\n"
    );
    println!("| children during recovery | child inspection timeout | stale children | first message (`interrupt`) → answer | background reconciliation (`wait_settled`) | reconciled_children | children interrupted / of which timed out |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    // Idle children are activated (which closes their cut run) and read; busy ones were
    // resumed in the new process with a model that never answers, so inspecting them can only
    // time out.
    for (inspection_ms, busy) in [(None, false), (Some(1), false), (None, true)] {
        let dir = tempfile::tempdir()?;
        let parent: SessionId = "parent".parse()?;
        // The crash: the children's model never answers, and the process "stops" (shutdown
        // while every child is running, so the parent's step is never finished).
        {
            let runtime = runtime_on(
                Arc::new(SledStore::open(dir.path())?),
                hanging(children),
                None,
            )?;
            let execute = tokio::spawn({
                let runtime = runtime.clone();
                let parent = parent.clone();
                async move {
                    runtime
                        .execute_on(&parent, ROOT_AGENT, "edit everything")
                        .await
                }
            });
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let running = runtime.children(&parent).await.map_or(0, |calls| {
                    calls
                        .iter()
                        .filter(|call| call.state == ChildState::Running)
                        .count()
                });
                let started = runtime.session_ids().await?.len().saturating_sub(1);
                if running == children && started == children {
                    break;
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "{running} children recorded running, {started} started"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            runtime.shutdown().await?;
            execute.abort();
        }
        // A new process: the same store, children whose model still never answers.
        let runtime = runtime_on(
            Arc::new(reopen(dir.path()).await?),
            hanging(children),
            inspection_ms,
        )?;
        anyhow::ensure!(runtime.status(&parent).await? == Status::Running);
        let mut resumed = Vec::new();
        if busy {
            for i in 0..children {
                let runtime = runtime.clone();
                let child = parent.ephemeral_child(&delegate_id(i));
                resumed.push(tokio::spawn(async move { runtime.resume(&child).await }));
            }
            // Busy once each child's second run (the resume) is recorded as started.
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let mut started = 0;
                for i in 0..children {
                    let child = parent.ephemeral_child(&delegate_id(i));
                    if runtime.session(&child).await?.run_count >= 2 {
                        started += 1;
                    }
                }
                if started == children {
                    break;
                }
                anyhow::ensure!(Instant::now() < deadline, "{started} children resumed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        anyhow::ensure!(!runtime.is_resident(&parent));
        let started = Instant::now();
        runtime.interrupt(&parent).await?;
        let first_answer = started.elapsed();
        runtime.wait_settled(&parent).await;
        let settled = started.elapsed();
        let reconciled = runtime.stats().reconciled_children;
        let calls = runtime.children(&parent).await?;
        let still_running = calls
            .iter()
            .filter(|call| call.state == ChildState::Running)
            .count();
        let timed_out = calls
            .iter()
            .filter(|call| {
                matches!(&call.state, ChildState::Interrupted { reason } if reason.starts_with("inspection_timed_out"))
            })
            .count();
        let interrupted = calls
            .iter()
            .filter(|call| matches!(call.state, ChildState::Interrupted { .. }))
            .count();
        anyhow::ensure!(still_running == 0 && calls.len() == children);
        println!(
            "| {} | {} | {children} | {:.2} ms | {:.0} ms | {reconciled} | {interrupted} / {timed_out} |",
            if busy {
                "busy: resumed, model never answers"
            } else {
                "idle (cut runs)"
            },
            inspection_ms.map_or("2000 ms (default)".to_string(), |ms| format!("{ms} ms")),
            first_answer.as_secs_f64() * 1e3,
            settled.as_secs_f64() * 1e3,
        );
        runtime.shutdown().await?;
        for task in resumed {
            task.abort();
        }
    }
    println!("\nGoal: the first answer under 50 ms whatever the children do; reconciliation runs in the background.");
    Ok(())
}
