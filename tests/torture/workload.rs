//! The workload every process of a run shares: the agents, their tools, a deterministic model,
//! and the runtime over the run's sled directory.
//!
//! Clients fork some waiting trees at their latest checkpoint (`client.rs`); the checker
//! proves no fork ran again what its source had run or started (`verify.rs`).
//!
//! `root` calls, over one to three steps of one to three calls each: `ask` (a client tool),
//! `deploy` (approval-gated, not retryable), `charge` (not retryable), `settle` (not
//! retryable; a cut call is settled by its check), `refund` (approval-gated, not retryable; a
//! cut call is reconciled by the client), `lookup` (safe to retry) and `delegate`, a sub-agent
//! `helper` that asks the client to `confirm` (answered against the root) and sometimes
//! charges and settles too.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dormant::definition::{OnCut, Reconciled, ToolContext};
use dormant::llm::{LlmAdapter, LlmError, ModelRequest};
use dormant::{
    AgentDefinition, Approval, ModelReply, Runtime, SledStore, ToolCall, ToolDefinition, ToolError,
};
use futures::future::BoxFuture;
use serde_json::{json, Value};

use super::journal::{executed, Execution, Journal, EXECUTIONS};
use super::rng::Rng;

/// No deadline fires during a run: a timeout is a legitimate end of a call, and this test is
/// about crashes, not about the scheduler.
const CLIENT_TIMEOUT_MS: u64 = 60 * 60 * 1000;

/// What one process of the run is and how it reports.
#[derive(Debug)]
pub(crate) struct Process {
    /// `g3` for generation 3, `check` for the checker.
    pub(crate) name: String,
    /// The workload's seed: every process derives the same scripts from it.
    pub(crate) seed: u64,
    /// The broken variant: `charge` is wrongly declared `safe_to_retry`.
    pub(crate) broken: bool,
    /// Whether events go to stdout (a child reports to its parent; the checker does not).
    pub(crate) report: bool,
    pub(crate) executions: Journal,
    /// The run's directory (the executions file a reconciliation reads).
    pub(crate) dir: PathBuf,
}

impl Process {
    pub(crate) fn new(
        dir: &Path,
        name: String,
        seed: u64,
        broken: bool,
        report: bool,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            name,
            seed,
            broken,
            report,
            executions: Journal::open(&dir.join(EXECUTIONS))?,
            dir: dir.to_path_buf(),
        })
    }

    /// One event line for the parent, which decides when to kill on what it reads.
    pub(crate) fn say(&self, line: &str) {
        if self.report {
            let mut out = std::io::stdout().lock();
            // A parent that stopped reading is about to kill us: nothing left to tell it.
            let _ = writeln!(out, "{line}").and_then(|()| out.flush());
        }
    }
}

/// The real outcome of a server tool, as the checker expects to find it.
pub(crate) fn tool_output(tool: &str, call: &str) -> Value {
    json!({ "tool": tool, "call": call })
}

/// A server tool that logs each execution (synced) before it returns. A non-retryable one also
/// tells the parent it started, then lingers `delay`, so a kill on that line lands before the
/// result can be committed: the window where a second run would be a double execution.
fn logged(
    name: &'static str,
    process: &Arc<Process>,
    retryable: bool,
    delay: Duration,
) -> ToolDefinition {
    let process = Arc::clone(process);
    ToolDefinition::server(name, move |_input: Value, tool: ToolContext| {
        let process = Arc::clone(&process);
        async move {
            let record = Execution {
                process: process.name.clone(),
                session: tool.session_id().to_string(),
                call: tool.tool_call_id().to_string(),
                tool: name.to_string(),
                retryable,
                key: tool.idempotency_key().to_string(),
            };
            process
                .executions
                .append(&record)
                .map_err(|error| ToolError::new(format!("journal: {error}")))?;
            if !retryable {
                process.say(&format!("exec {name} {} {}", record.session, record.call));
            }
            tokio::time::sleep(delay).await;
            Ok::<_, ToolError>(tool_output(name, &record.call))
        }
    })
}

/// `settle`: not retryable; a call a kill cut is settled by its check, which looks its
/// idempotency key up in the executions file (the system the effect lands in).
fn settle(process: &Arc<Process>) -> ToolDefinition {
    let dir = process.dir.clone();
    logged("settle", process, false, Duration::from_millis(30)).reconcile_with(
        move |_input: Value, key: String| {
            let dir = dir.clone();
            async move {
                match executed(&dir, &key) {
                    Ok(Some(run)) => Some(Reconciled::Happened(tool_output(&run.tool, &run.call))),
                    Ok(None) => Some(Reconciled::DidNotHappen),
                    // Cannot tell: a person is asked (the client answers from the same file).
                    Err(_) => None,
                }
            }
        },
    )
}

fn agents(process: &Arc<Process>) -> anyhow::Result<Vec<AgentDefinition>> {
    // In the broken variant the parent kills on charge's start line; a long linger makes sure
    // its result is never committed first, so the double execution is certain, not likely.
    let charge_delay = Duration::from_millis(if process.broken { 300 } else { 30 });
    let charge = || logged("charge", process, false, charge_delay).safe_to_retry(process.broken);
    let root = AgentDefinition::builder("root")
        .tool(ToolDefinition::client("ask"))
        .tool(
            logged("deploy", process, false, Duration::from_millis(30))
                .require_approval(Approval::Always),
        )
        .tool(charge())
        .tool(settle(process))
        // `refund`: approval-gated; a cut call raises a reconcile call the client answers.
        .tool(
            logged("refund", process, false, Duration::from_millis(30))
                .require_approval(Approval::Always)
                .on_cut(OnCut::Reconcile),
        )
        .tool(logged("lookup", process, true, Duration::from_millis(5)).safe_to_retry(true))
        .tool(ToolDefinition::sub_agent("delegate", "helper"))
        .client_tool_timeout_ms(CLIENT_TIMEOUT_MS)
        .build()?;
    let helper = AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("confirm"))
        .tool(charge())
        .tool(settle(process))
        .client_tool_timeout_ms(CLIENT_TIMEOUT_MS)
        .build()?;
    Ok(vec![root, helper])
}

/// The file in the run's directory that names its store engine (`fjall` or `journal`; sled
/// without it):
/// written by the parent before the first child, read by every child and the checker.
pub(crate) const ENGINE_FILE: &str = "engine";

/// The store in `dir/store`: a `FjallStore` if `dir/engine` says `fjall`, a `JournalStore` if
/// it says `journal`, else a `SledStore`.
fn store(dir: &Path) -> anyhow::Result<Arc<dyn dormant::store::Store>> {
    let path = dir.join("store");
    match std::fs::read_to_string(dir.join(ENGINE_FILE)) {
        Ok(engine) if engine == "fjall" => Ok(Arc::new(dormant::FjallStore::open(path)?)),
        // Small journal files, so that compactions run while the children are killed.
        Ok(engine) if engine == "journal" => Ok(Arc::new(
            dormant::JournalStore::builder(path)
                .file_bytes(64 * 1024)
                .open()?,
        )),
        Ok(other) => anyhow::bail!("unknown store engine {other:?}"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Arc::new(SledStore::open(path)?)),
        Err(e) => Err(e.into()),
    }
}

/// The runtime over `dir/store`, with the workload's agents and model.
pub(crate) fn runtime(
    dir: &Path,
    process: &Arc<Process>,
    max_resident: Option<usize>,
) -> anyhow::Result<Runtime> {
    let mut builder = Runtime::builder()
        .store(store(dir)?)
        .llm(Arc::new(Model { seed: process.seed }))
        .client_tool_timeout_ms(CLIENT_TIMEOUT_MS);
    if let Some(max) = max_resident {
        builder = builder.max_resident(max);
    }
    for agent in agents(process)? {
        builder = builder.agent(agent);
    }
    Ok(builder.build()?)
}

/// Answers a session's k-th model call with step k of a plan derived from the seed and the
/// session id alone, so a replay after a kill, in any process, asks for the same calls.
#[derive(Debug)]
struct Model {
    seed: u64,
}

impl LlmAdapter for Model {
    fn complete(&self, request: ModelRequest) -> BoxFuture<'static, Result<ModelReply, LlmError>> {
        // A fork (`{root}.f`, its sub-agents `{root}.f-sub-…`) goes on with its source's plan,
        // which its copied history follows.
        let session = request.session_id.as_str().replace(".f", "");
        let plan = match request.agent.as_str() {
            "helper" => helper_plan(self.seed, &session),
            _ => root_plan(self.seed, &session),
        };
        let turn = request.assistant_turns();
        let reply = plan.get(turn).cloned().ok_or_else(|| {
            LlmError::Provider(format!(
                "{session} asked for reply {turn} of a plan of {}",
                plan.len()
            ))
        });
        Box::pin(async move { reply })
    }
}

fn root_plan(seed: u64, session: &str) -> Vec<ModelReply> {
    let mut rng = Rng::derived(seed, session);
    let mut plan = Vec::new();
    for step in 0..rng.between(1, 4) {
        let calls = (0..rng.between(1, 4))
            .map(|index| {
                let (tool, input) = match rng.below(100) {
                    0..=24 => ("ask", json!({ "question": "which one?" })),
                    25..=39 => ("deploy", json!({ "target": "prod" })),
                    40..=52 => ("charge", json!({ "cents": 100 })),
                    53..=60 => ("settle", json!({ "cents": 30 })),
                    61..=68 => ("refund", json!({ "cents": 20 })),
                    69..=79 => ("lookup", json!({ "key": "k" })),
                    _ => ("delegate", json!({ "message": "confirm it" })),
                };
                ToolCall::new(format!("{tool}-{step}-{index}"), tool, input)
            })
            .collect();
        plan.push(ModelReply::tool_calls(calls));
    }
    plan.push(ModelReply::text("done"));
    plan
}

/// The helper's call ids start with its parent's call id, so they are unique in the whole
/// tree: the root's ownership map and tombstones are keyed by call id.
fn helper_plan(seed: u64, session: &str) -> Vec<ModelReply> {
    let parent_call = session.rsplit("-sub-").next().unwrap_or(session);
    let mut rng = Rng::derived(seed, session);
    let mut calls = vec![ToolCall::new(
        format!("{parent_call}.confirm"),
        "confirm",
        json!({}),
    )];
    if rng.percent(50) {
        calls.push(ToolCall::new(
            format!("{parent_call}.charge"),
            "charge",
            json!({ "cents": 5 }),
        ));
    }
    if rng.percent(40) {
        calls.push(ToolCall::new(
            format!("{parent_call}.settle"),
            "settle",
            json!({ "cents": 3 }),
        ));
    }
    vec![ModelReply::tool_calls(calls), ModelReply::text("helped")]
}
