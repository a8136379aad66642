//! Run with: cargo bench --bench forks            (add `-- --quick` for a short run)
//!
//! What checkpoints cost (issue 31), on a sled store: the bytes a session's log holds per
//! checkpoint and the part of them that makes an entry a checkpoint (its copy of the session's
//! record, written by every commit since the store layout of issue 3, before checkpoints
//! existed); `state_at` at the first step and at the last of a long session, beside a read of
//! its whole conversation (`messages`, the same scan of its log); and a fork of that session
//! and of a root waiting on 100 sub-agents, beside starting a session of the same agent.

#[path = "support/timed.rs"]
mod timed;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dormant::store::{Store, Tree};
use dormant::types::{CheckpointId, ForkOptions};
use dormant::{
    AgentDefinition, ModelReply, Runtime, ScriptedLlm, SessionId, SledStore, Status, ToolCall,
    ToolDefinition, ToolError,
};
use serde_json::json;

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|arg| arg == "--quick");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        long_session(if quick { 200 } else { 1_000 }, if quick { 5 } else { 21 }).await?;
        wide_tree(100, if quick { 3 } else { 9 }).await
    })
}

/// A runtime on `store` with agent `worker` (server tool `step`, `steps` steps, then text),
/// `lead` (one reply calling `children` sub-agents) and `helper` (waits on client tool `ask`).
fn runtime_on(store: Arc<dyn Store>, steps: usize, children: usize) -> anyhow::Result<Runtime> {
    let ran = Arc::new(AtomicUsize::new(0));
    let step = ToolDefinition::server("step", move |input: serde_json::Value, _ctx| {
        let ran = Arc::clone(&ran);
        async move {
            ran.fetch_add(1, Ordering::Relaxed);
            Ok::<_, ToolError>(json!({ "done": input }))
        }
    });
    let worker = AgentDefinition::builder("worker")
        .tool(step)
        .max_steps(u32::try_from(steps + 1)?)
        .build()?;
    let lead = AgentDefinition::builder("lead")
        .tool(ToolDefinition::sub_agent("help", "helper"))
        .build()?;
    let helper = AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("ask"))
        .build()?;
    let mut script: Vec<ModelReply> = (0..steps)
        .map(|i| {
            ModelReply::tool_calls(vec![ToolCall::new(
                format!("s{i}"),
                "step",
                json!({ "i": i }),
            )])
        })
        .collect();
    script.push(ModelReply::text("done"));
    let calls = (0..children)
        .map(|i| ToolCall::new(format!("h{i}"), "help", json!({ "message": "help" })))
        .collect();
    let llm = ScriptedLlm::new()
        .script("worker", script)
        .script(
            "lead",
            vec![ModelReply::tool_calls(calls), ModelReply::text("ok")],
        )
        .script(
            "helper",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new("a1", "ask", json!({}))]),
                ModelReply::text("helped"),
            ],
        );
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .background_deadlines(false)
        .agent(worker)
        .agent(lead)
        .agent(helper)
        .build()?)
}

/// The key prefix of a session's entries (`len (u16 BE) · id`, ARCHITECTURE.md, "The store
/// layout").
fn prefix(id: &SessionId) -> Vec<u8> {
    let bytes = id.as_str().as_bytes();
    let mut key = u16::try_from(bytes.len())
        .unwrap_or(u16::MAX)
        .to_be_bytes()
        .to_vec();
    key.extend_from_slice(bytes);
    key
}

/// The median of `runs` timings of `op`.
async fn median<F, Fut>(runs: usize, op: F) -> anyhow::Result<Duration>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    Ok(timed::percentile(&timed::timed(runs, op).await?, 50))
}

fn ms(duration: Duration) -> String {
    format!("{:.3}", duration.as_secs_f64() * 1e3)
}

async fn long_session(steps: usize, runs: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn Store> = Arc::new(SledStore::open(dir.path())?);
    let runtime = runtime_on(store.clone(), steps, 0)?;
    let id: SessionId = "long".parse()?;
    let run = runtime.execute_on(&id, "worker", "go").await?;
    anyhow::ensure!(run.status == Status::Completed, "{run:?}");

    let checkpoints = runtime.checkpoints(&id).await?;
    let log = store.scan_prefix(Tree::Log, &prefix(&id)).await?;
    let log_bytes: usize = log.iter().map(|(key, value)| key.len() + value.len()).sum();
    let record = rmp_serde::to_vec_named(&runtime.session(&id).await?)?.len();
    println!("\n## Checkpoints of a {steps}-step session (sled)\n");
    println!("| checkpoints | log bytes | bytes a checkpoint | of which the record copy | share |");
    println!("|---:|---:|---:|---:|---:|");
    let per = log_bytes / checkpoints.len().max(1);
    println!(
        "| {} | {log_bytes} | {per} | {record} | {:.0}% |",
        checkpoints.len(),
        100.0 * record as f64 / per as f64
    );

    let first = checkpoints
        .iter()
        .find(|checkpoint| checkpoint.step == 1)
        .map_or(CheckpointId(0), |checkpoint| checkpoint.id);
    let last = checkpoints.last().map_or(CheckpointId(0), |c| c.id);
    let read_all = median(runs, |_| async {
        runtime.messages(&id).await?;
        Ok(())
    })
    .await?;
    let at_first = median(runs, |_| async {
        anyhow::ensure!(runtime.state_at(&id, first).await?.found().is_some());
        Ok(())
    })
    .await?;
    let at_last = median(runs, |_| async {
        anyhow::ensure!(runtime.state_at(&id, last).await?.found().is_some());
        Ok(())
    })
    .await?;
    let fork = median(runs, |i| {
        let runtime = runtime.clone();
        let id = id.clone();
        async move {
            let options = ForkOptions::new().id(format!("fork-{i}").parse()?);
            runtime.fork(&id, last, options).await?;
            Ok(())
        }
    })
    .await?;
    let fresh = median(runs, |i| {
        let runtime = runtime.clone();
        async move { start_and_stop(&runtime, &format!("fresh-{i}").parse()?).await }
    })
    .await?;
    println!("\n| read (median of {runs}) | ms | of `messages` (the whole log) |");
    println!("|---|---:|---:|");
    println!("| `messages` of the session | {} | 1.00 |", ms(read_all));
    for (name, time) in [
        ("`state_at` step 1", at_first),
        (&*format!("`state_at` step {steps}"), at_last),
        ("`fork` at the last checkpoint", fork),
    ] {
        println!(
            "| {name} | {} | {:.2} |",
            ms(time),
            time.as_secs_f64() / read_all.as_secs_f64()
        );
    }
    println!(
        "| a new session's first message (`start_on`), for scale | {} | {:.2} |",
        ms(fresh),
        fresh.as_secs_f64() / read_all.as_secs_f64()
    );
    runtime.shutdown().await?;
    Ok(())
}

/// Starts a session of `worker` and interrupts it (the cost of writing a session's first
/// commits, beside a fork's).
async fn start_and_stop(runtime: &Runtime, id: &SessionId) -> anyhow::Result<()> {
    runtime.start_on(id, "worker", "go").await?;
    runtime.interrupt(id).await?;
    Ok(())
}

async fn wide_tree(children: usize, runs: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn Store> = Arc::new(SledStore::open(dir.path())?);
    let runtime = runtime_on(store, 0, children)?;
    let id: SessionId = "wide".parse()?;
    let run = runtime.execute_on(&id, "lead", "go").await?;
    anyhow::ensure!(run.status == Status::SuspendedAwaitingChildren, "{run:?}");
    let last = runtime
        .checkpoints(&id)
        .await?
        .last()
        .map_or(CheckpointId(0), |c| c.id);
    let fork = median(runs, |i| {
        let runtime = runtime.clone();
        let id = id.clone();
        async move {
            let fork: SessionId = format!("fork-{i}").parse()?;
            runtime
                .fork(&id, last, ForkOptions::new().id(fork.clone()))
                .await?;
            anyhow::ensure!(runtime.status(&fork).await? == Status::SuspendedAwaitingChildren);
            Ok(())
        }
    })
    .await?;
    let source = median(runs, |i| {
        let runtime = runtime.clone();
        async move {
            let again: SessionId = format!("again-{i}").parse()?;
            runtime.execute_on(&again, "lead", "go").await?;
            Ok(())
        }
    })
    .await?;
    println!("\n## A root waiting on {children} sub-agents (sled, median of {runs})\n");
    println!("| | ms | of running the tree to its suspension |");
    println!("|---|---:|---:|");
    println!(
        "| running the tree to its suspension (`execute`) | {} | 1.00 |",
        ms(source)
    );
    println!(
        "| `fork` of the tree at its suspension (every child forked, every call waiting again) | {} | {:.2} |",
        ms(fork),
        fork.as_secs_f64() / source.as_secs_f64()
    );
    runtime.shutdown().await?;
    Ok(())
}
