//! Holds the side files against the store, once every tree has ended: each acknowledged
//! answer applied exactly once, no non-retryable tool run twice, every conversation sound.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use dormant::session::NOT_APPROVED;
use dormant::types::ToolOutcome;
use dormant::{Message, Runtime, SessionId, Status};

use super::check::{Double, Findings};
use super::journal::{self, Acknowledged, Execution, Sent, ACCEPTED, EXECUTIONS};
use super::workload::tool_output;

const DURABILITY_ERROR: &str = "tool_durability_error";

/// The workload's approval-gated tools (`workload.rs`): a call of one that waited for its
/// approval at a fork's checkpoint had not started.
const APPROVAL_GATED: [&str; 2] = ["deploy", "refund"];

/// The workload's tools whose cut calls are reconciled (`workload.rs`).
const RECONCILED_TOOLS: [&str; 2] = ["settle", "refund"];

/// One tool-result message.
#[derive(Debug)]
pub(crate) struct Found {
    session: SessionId,
    tool: String,
    outcome: ToolOutcome,
}

/// Every tool result of the store.
#[derive(Debug, Default)]
pub(crate) struct Results {
    /// By (root, call id): call ids are unique within a tree, and answers name the root.
    by_call: HashMap<(String, String), Vec<Found>>,
    /// The root of every session.
    root_of: HashMap<String, String>,
}

/// Reads every session's conversation: at most one result per call, and a completed session
/// has a result for every call its model made.
pub(crate) async fn conversations(
    runtime: &Runtime,
    findings: &mut Findings,
) -> anyhow::Result<Results> {
    let mut results = Results::default();
    for id in runtime.session_ids().await? {
        let (Ok(record), Ok(messages)) = (runtime.session(&id).await, runtime.messages(&id).await)
        else {
            findings
                .violations
                .push(format!("unreadable session {id} after the drive"));
            continue;
        };
        results
            .root_of
            .insert(id.to_string(), record.root.to_string());
        let mut per_call: HashMap<&str, usize> = HashMap::new();
        for message in &messages {
            if let Message::Tool {
                tool_call_id,
                tool_name,
                outcome,
            } = message
            {
                *per_call.entry(tool_call_id).or_default() += 1;
                results
                    .by_call
                    .entry((record.root.to_string(), tool_call_id.clone()))
                    .or_default()
                    .push(Found {
                        session: id.clone(),
                        tool: tool_name.clone(),
                        outcome: outcome.clone(),
                    });
            }
        }
        for (call, count) in &per_call {
            if *count > 1 {
                findings.violations.push(format!(
                    "two results: session {id} holds {count} tool results for call {call}"
                ));
            }
        }
        if record.status == Status::Completed {
            let calls = messages.iter().flat_map(|message| match message {
                Message::Assistant { tool_calls, .. } => tool_calls.iter().collect(),
                _ => Vec::new(),
            });
            for call in calls {
                if !per_call.contains_key(call.id.as_str()) {
                    findings.violations.push(format!(
                        "missing result: completed session {id} has no result for call {} ({})",
                        call.id, call.name
                    ));
                }
            }
        }
    }
    Ok(results)
}

/// Every acknowledged answer is applied exactly once: one result for its call in its tree,
/// carrying what was submitted (for an approval: the tool's real outcome, a denial, or a
/// durability error). A call with two acknowledged answers is a violation even when the
/// result carries one of them: the other was acknowledged and then lost.
pub(crate) fn answers(
    dir: &Path,
    results: &Results,
    findings: &mut Findings,
) -> anyhow::Result<()> {
    let (answers, torn) = journal::read::<Acknowledged>(&dir.join(ACCEPTED))?;
    findings.torn_lines += torn;
    let mut by_call: BTreeMap<(String, String), Vec<Acknowledged>> = BTreeMap::new();
    for answer in answers {
        let kind = match &answer.sent {
            Sent::Result(_) => "client result",
            Sent::Error(_) => "error",
            Sent::Approval { approved: true } => "approval (yes)",
            Sent::Approval { approved: false } => "approval (no)",
            Sent::Reconcile { happened: true } => "reconcile (happened)",
            Sent::Reconcile { happened: false } => "reconcile (did not happen)",
        };
        *findings.acknowledged.entry(kind).or_default() += 1;
        findings.acknowledged_by_checker += usize::from(answer.process == "check");
        if let Sent::Reconcile { .. } = answer.sent {
            // A call may be reconciled more than once: its effect did not happen, it ran once
            // more, and a kill cut that run too. `executions` holds its result to its runs.
            reconciled(&answer, results, findings);
            continue;
        }
        by_call
            .entry((answer.root.clone(), answer.call.clone()))
            .or_default()
            .push(answer);
    }
    for ((root, call), answers) in &by_call {
        let sent: Vec<String> = answers
            .iter()
            .enumerate()
            .map(|(index, answer)| {
                format!("#{} {:?} by {}", index + 1, answer.sent, answer.process)
            })
            .collect();
        let sent = sent.join("; ");
        let found = results
            .by_call
            .get(&(root.clone(), call.clone()))
            .map_or(&[][..], Vec::as_slice);
        let carried = match found {
            [found] => answers
                .iter()
                .position(|answer| applied(&answer.sent, call, found)),
            _ => None,
        };
        if answers.len() > 1 {
            let which = carried.map_or_else(
                || "none of them".to_string(),
                |index| format!("#{}", index + 1),
            );
            findings.violations.push(format!(
                "accepted twice: root {root} call {call} got {} acknowledged answers ({sent}); its result carries {which}",
                answers.len()
            ));
        }
        match found {
            [] => findings.violations.push(format!(
                "lost: root {root} call {call} was acknowledged ({sent}) but has no tool result"
            )),
            [found] if carried.is_none() => findings.violations.push(format!(
                "misapplied: root {root} call {call} in {} ended {:?}, but the acknowledged answer was {sent}",
                found.session, found.outcome
            )),
            [_] => {}
            many => findings.violations.push(format!(
                "applied {} times: root {root} call {call} has results in {:?}",
                many.len(),
                many.iter().map(|found| found.session.to_string()).collect::<Vec<_>>()
            )),
        }
    }
    Ok(())
}

/// A reconciled call ends with the tool's own output: the effect happened (and its result was
/// given), or it ran once more.
fn reconciled(answer: &Acknowledged, results: &Results, findings: &mut Findings) {
    let found = results
        .by_call
        .get(&(answer.root.clone(), answer.call.clone()))
        .map_or(&[][..], Vec::as_slice);
    match found {
        [found] if found.outcome == ToolOutcome::Result(tool_output(&found.tool, &answer.call)) => {
        }
        _ => findings.violations.push(format!(
            "reconciled ({:?} by {}) but root {} call {} ended {:?}",
            answer.sent,
            answer.process,
            answer.root,
            answer.call,
            found.iter().map(|found| &found.outcome).collect::<Vec<_>>()
        )),
    }
}

fn applied(sent: &Sent, call: &str, found: &Found) -> bool {
    match (sent, &found.outcome) {
        (Sent::Result(value), ToolOutcome::Result(result)) => value == result,
        (Sent::Error(text), ToolOutcome::Error(error)) => text == error,
        (Sent::Approval { approved: false }, ToolOutcome::Error(error)) => {
            error.starts_with(NOT_APPROVED)
        }
        (Sent::Approval { approved: true }, ToolOutcome::Result(result)) => {
            *result == tool_output(&found.tool, call)
        }
        // Approved, then a kill cut the tool's run: it may or may not have taken effect.
        (Sent::Approval { approved: true }, ToolOutcome::Error(error)) => {
            error.starts_with(DURABILITY_ERROR)
        }
        _ => false,
    }
}

/// No non-retryable tool ran twice for one call, across every process of the run; and a call
/// that ran has a result that says so (its output, or a durability error), never one that
/// tells the model it did not run.
pub(crate) fn executions(
    dir: &Path,
    results: &Results,
    findings: &mut Findings,
) -> anyhow::Result<()> {
    let (executions, torn) = journal::read::<Execution>(&dir.join(EXECUTIONS))?;
    findings.torn_lines += torn;
    let mut runs: BTreeMap<(String, String), Vec<Execution>> = BTreeMap::new();
    for execution in executions {
        if execution.retryable {
            findings.retry_safe_runs += 1;
        } else {
            *findings
                .executions
                .entry(execution.tool.clone())
                .or_default() += 1;
        }
        runs.entry((execution.session.clone(), execution.call.clone()))
            .or_default()
            .push(execution);
    }
    // A reconciled tool's output in a conversation is an effect that happened: it ran, in
    // that session or (a result a fork copied) in its source.
    for ((_, call), found) in &results.by_call {
        for found in found {
            let output = ToolOutcome::Result(tool_output(&found.tool, call));
            let source = found.session.as_str().replace(".f", "");
            let ran = runs.contains_key(&(found.session.to_string(), call.clone()))
                || runs.contains_key(&(source, call.clone()));
            if RECONCILED_TOOLS.contains(&found.tool.as_str()) && found.outcome == output && !ran {
                findings.violations.push(format!(
                    "reconciled as happened but never ran: {} for session {} call {call}",
                    found.tool, found.session
                ));
            }
        }
    }
    for ((session, call), runs) in runs {
        let Some(first) = runs.first() else { continue };
        if first.retryable {
            findings.retry_safe_repeats += runs.len() - 1;
            continue;
        }
        let processes: Vec<String> = runs.iter().map(|run| run.process.clone()).collect();
        let root = results.root_of.get(&session).cloned().unwrap_or_default();
        let outcome = results
            .by_call
            .get(&(root, call.clone()))
            .and_then(|found| found.iter().find(|found| found.session.as_str() == session))
            .map(|found| &found.outcome);
        if let Some(ToolOutcome::Error(error)) = outcome {
            if !error.starts_with(DURABILITY_ERROR) {
                findings.violations.push(format!(
                    "ran but reported as not run: {} ran for session {session} call {call} (in {}), yet its result is the error {error:?}",
                    first.tool,
                    processes.join(", ")
                ));
            }
        }
        if runs.len() > 1 {
            findings.doubles.push(Double {
                tool: first.tool.clone(),
                session,
                call,
                processes,
            });
        }
    }
    Ok(())
}

/// No fork ran again what its source's history holds: a call with a result at the checkpoint,
/// a non-approval call in flight there, or an approved call dispatched there (its decision on
/// the stream, its result not). A call that waited for an approval there is asked again in the
/// fork and may run once there: that is the fork's own effect. Returns how many forks it saw.
pub(crate) async fn forks(
    dir: &Path,
    runtime: &Runtime,
    findings: &mut Findings,
) -> anyhow::Result<usize> {
    let (executions, _) = journal::read::<Execution>(&dir.join(EXECUTIONS))?;
    let mut ran: HashMap<(String, String), Vec<String>> = HashMap::new();
    for execution in executions
        .into_iter()
        .filter(|execution| !execution.retryable)
    {
        ran.entry((execution.session, execution.call))
            .or_default()
            .push(execution.process);
    }
    let mut seen = 0;
    for id in runtime.session_ids().await? {
        let Some(origin) = runtime.session(&id).await?.forked_from else {
            continue;
        };
        seen += 1;
        let Some(past) = runtime
            .state_at(&origin.session, origin.checkpoint)
            .await?
            .found()
        else {
            findings.violations.push(format!(
                "fork {id}: its source {} has no checkpoint {}",
                origin.session, origin.checkpoint
            ));
            continue;
        };
        let approved: Vec<String> = runtime
            .chunks(&origin.session, 0)
            .await?
            .into_iter()
            .filter(|chunk| chunk.seq < past.checkpoint.stream_seq)
            .filter_map(|chunk| match chunk.kind {
                dormant::types::ChunkKind::ToolApprovalResponse {
                    tool_call_id,
                    approved: true,
                    ..
                } => Some(tool_call_id),
                _ => None,
            })
            .collect();
        let recorded = past.messages.iter().filter_map(|message| match message {
            Message::Tool { tool_call_id, .. } => Some(tool_call_id.clone()),
            _ => None,
        });
        let in_flight = past
            .checkpoint
            .open_calls
            .iter()
            .filter(|call| {
                !APPROVAL_GATED.contains(&call.name.as_str()) || approved.contains(&call.id)
            })
            .map(|call| call.id.clone());
        for call in recorded.chain(in_flight) {
            if let Some(processes) = ran.get(&(id.to_string(), call.clone())) {
                findings.violations.push(format!(
                    "fork ran again: fork {id} of {} at checkpoint {} ran call {call} (in {}), which its source had run or started by then",
                    origin.session,
                    origin.checkpoint,
                    processes.join(", ")
                ));
            }
        }
    }
    Ok(seen)
}
