//! The checker: after the last kill, reopens the store in this process and drives every tree
//! to its end (`verify.rs` then holds the side files against the store).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use dormant::{Runtime, SessionId, Status};
use tokio::task::JoinSet;

use super::client::{Behaviour, Client};
use super::journal::{Journal, ACCEPTED};
use super::rng::Rng;
use super::verify;
use super::workload::{self, Process};

/// Rounds (answer everything, resume) a tree gets to end before it counts as wedged: a tree
/// needs one per step at most, and has four steps at most.
const ROUNDS: usize = 40;

const CHECKER: Behaviour = Behaviour {
    duplicates: 0,
    evictions: 0,
    latency_ms: 0,
    answer_all: true,
    forks: 0,
};

/// A non-retryable tool that ran more than once for one call.
#[derive(Debug)]
pub(crate) struct Double {
    pub(crate) tool: String,
    pub(crate) session: String,
    pub(crate) call: String,
    /// The process of each run, in order (`g3`, `check`).
    pub(crate) processes: Vec<String>,
}

/// What the checker found.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub(crate) roots: usize,
    pub(crate) sub_agents: usize,
    /// Sessions made by forks (roots and their forked sub-agents).
    pub(crate) forks: usize,
    pub(crate) completed: usize,
    pub(crate) failed: usize,
    /// Acknowledged answers by what they carried, and how many the checker itself gave.
    pub(crate) acknowledged: BTreeMap<&'static str, usize>,
    pub(crate) acknowledged_by_checker: usize,
    /// Runs of non-retryable tools, by tool; runs of the retry-safe one, and its repeats.
    pub(crate) executions: BTreeMap<String, usize>,
    pub(crate) retry_safe_runs: usize,
    pub(crate) retry_safe_repeats: usize,
    pub(crate) doubles: Vec<Double>,
    /// Every other breach of a guarantee, naming the session and the call.
    pub(crate) violations: Vec<String>,
    /// Journal lines a kill cut short (ignored).
    pub(crate) torn_lines: usize,
    /// What the checker's own driving ran into.
    pub(crate) notes: Vec<String>,
}

pub(crate) async fn run(dir: &Path, seed: u64, broken: bool) -> anyhow::Result<Findings> {
    let process = Arc::new(Process::new(dir, "check".into(), seed, broken, false)?);
    let accepted = Arc::new(Journal::open(&dir.join(ACCEPTED))?);
    let runtime = workload::runtime(dir, &process, None)?;
    let mut findings = Findings::default();

    let mut roots = Vec::new();
    for id in runtime.session_ids().await? {
        match runtime.session(&id).await {
            Ok(record) if record.parent.is_none() => roots.push(id),
            Ok(_) => findings.sub_agents += 1,
            Err(error) => findings
                .violations
                .push(format!("unreadable session {id}: {error}")),
        }
    }
    findings.roots = roots.len();

    let mut trees = JoinSet::new();
    for root in roots.iter().cloned() {
        let rng = Rng::derived(seed, &format!("check/{root}"));
        let mut client = Client::new(
            runtime.clone(),
            Arc::clone(&process),
            Arc::clone(&accepted),
            rng,
            CHECKER,
        );
        trees.spawn(async move {
            let status = client.drive(&root, ROUNDS).await;
            (root, status, client.notes)
        });
    }
    while let Some(tree) = trees.join_next().await {
        let (root, status, notes) = tree?;
        findings.notes.extend(notes);
        match status {
            Some(Status::Completed) => findings.completed += 1,
            Some(Status::Failed) => findings.failed += 1,
            other => {
                let waits = describe_tree(&runtime, &root).await;
                findings.violations.push(format!(
                    "wedged: root {root} is {} after {ROUNDS} rounds of answering and resuming; {waits}",
                    other.map_or("unreadable", Status::as_str),
                ));
            }
        }
    }

    let results = verify::conversations(&runtime, &mut findings).await?;
    findings.forks = verify::forks(dir, &runtime, &mut findings).await?;
    runtime.shutdown().await?;
    verify::answers(dir, &results, &mut findings)?;
    verify::executions(dir, &results, &mut findings)?;
    Ok(findings)
}

/// What a tree that did not end still waits on, for the report.
async fn describe_tree(runtime: &Runtime, root: &SessionId) -> String {
    let mut parts = Vec::new();
    let mut sessions = vec![root.clone()];
    while let Some(session) = sessions.pop() {
        let status = runtime
            .status(&session)
            .await
            .map_or_else(|error| error.to_string(), |status| status.to_string());
        let pending = runtime.pending(&session).await.unwrap_or_default();
        let calls: Vec<String> = pending
            .iter()
            .map(|call| {
                let answer = if call.answer.is_some() {
                    "answered"
                } else {
                    "waiting"
                };
                format!("{} ({:?}, {answer})", call.tool_call_id, call.kind)
            })
            .collect();
        parts.push(format!("{session} {status} pending [{}]", calls.join(", ")));
        if let Ok(children) = runtime.children(&session).await {
            sessions.extend(children.into_iter().map(|child| child.child));
        }
    }
    parts.join("; ")
}
