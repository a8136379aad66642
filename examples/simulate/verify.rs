//! The end check: every session of this run is completed with exactly the conversation its
//! plan implies, and every accepted answer was applied exactly once with its exact value.
//!
//! It checks this run's sessions only. The store (`--store DIR`) may hold sessions an earlier
//! process left behind, and this runtime fires their expired deadlines at boot (and with
//! `--auto-resume` runs the rest of their turns), so the runtime's global timeout, abort and
//! abandon counters are not this run's: the timeouts and tool errors are counted from this
//! run's stored tool results instead.

use std::collections::HashMap;

use dormant::runtime::ClientToolStats;
use dormant::types::ToolOutcome;
use dormant::{Message, Runtime, SessionId, Status};
use serde_json::json;

use crate::driver::{Counters, Expected, Measured};
use crate::halt::fatal;
use crate::plan::{lookup_result, server_call_id, suspension_call_id, Plan, TIMEOUT_CODE};

/// What the counting tools saw.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ToolCounts {
    /// `lookup` invocations.
    pub(crate) lookups: u64,
    /// `deploy` invocations (only approved calls run).
    pub(crate) deploys: u64,
}

/// What the end check found.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) problems: Vec<String>,
    /// `client_tool_timeout` results in this run's sessions.
    pub(crate) timeouts: u64,
}

/// Error results in one session's conversation.
#[derive(Clone, Copy, Debug, Default)]
struct ToolErrors {
    /// `client_tool_timeout` errors.
    timeouts: u64,
    /// Any other error (abandoned, aborted, interrupted, a failed tool): none is expected.
    other: u64,
}

/// Checks every session of this run and the counters; returns the problems found.
///
/// # Errors
/// A store error reading a session is a [`crate::halt::StoreFailure`].
pub(crate) async fn verify(
    runtime: &Runtime,
    ids: &[SessionId],
    plan: &Plan,
    measured: &Measured,
    tools: ToolCounts,
    client: &ClientToolStats,
) -> anyhow::Result<Verdict> {
    let mut problems = Vec::new();
    let mut errors = ToolErrors::default();
    for (session, id) in ids.iter().enumerate() {
        let expected = measured
            .expected
            .get(session)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let found = check_session(runtime, id, plan, expected, &mut problems).await?;
        errors.timeouts += found.timeouts;
        errors.other += found.other;
    }
    let counters = &measured.counters;
    let get = Counters::get;
    let sessions = u64::try_from(ids.len())?;
    let mut expect = |what: &str, got: u64, want: u64| {
        if got != want {
            problems.push(format!("{what}: {got}, expected {want}"));
        }
    };
    expect(
        "lookup invocations (sessions × steps × turns)",
        tools.lookups,
        sessions * u64::try_from(plan.steps * plan.turns)?,
    );
    expect(
        "deploy invocations (approvals accepted)",
        tools.deploys,
        get(&counters.approved),
    );
    expect(
        "suspension cycles (sessions × suspensions)",
        get(&counters.cycles),
        sessions * u64::try_from(plan.suspensions)?,
    );
    // Global, yet this run's: only a submit is counted here, and this process submits only
    // to its own sessions.
    expect(
        "answers the runtime counted (accepted submits)",
        client.answered,
        get(&counters.accepted),
    );
    expect(
        "timeouts in this run's sessions (never answered + late answers)",
        errors.timeouts,
        get(&counters.never_answered) + get(&counters.late),
    );
    expect(
        "timeouts seen on the stream (never answered)",
        get(&counters.timeouts_seen),
        get(&counters.never_answered),
    );
    expect(
        "duplicates answered already_completed (duplicates sent)",
        get(&counters.duplicates_already_completed),
        get(&counters.duplicates),
    );
    expect(
        "wrong kinds answered invalid_result (wrong kinds sent, less late ones)",
        get(&counters.wrong_kind_invalid),
        get(&counters.wrong_kind).saturating_sub(get(&counters.wrong_kind_late)),
    );
    expect(
        "other tool errors in this run's sessions (abandoned, aborted, failed calls)",
        errors.other,
        0,
    );
    Ok(Verdict {
        problems,
        timeouts: errors.timeouts,
    })
}

async fn check_session(
    runtime: &Runtime,
    id: &SessionId,
    plan: &Plan,
    expected: &[(String, Expected)],
    problems: &mut Vec<String>,
) -> anyhow::Result<ToolErrors> {
    let record = match runtime.session(id).await {
        Ok(record) => record,
        Err(error @ dormant::ReadError::Store(_)) => {
            return Err(fatal(format!("reading session {id}"), error))
        }
        Err(error) => {
            problems.push(format!("session {id}: {error}"));
            return Ok(ToolErrors::default());
        }
    };
    if record.status != Status::Completed {
        problems.push(format!("session {id}: status {:?}", record.status));
    }
    // Per turn: the user message, steps × (assistant with a call + tool result), the same
    // for each suspension, the final text.
    let expected_messages = plan.turns * (2 * plan.steps + 2) + 2 * plan.suspensions;
    let messages = runtime
        .messages(id)
        .await
        .map_err(|error| fatal(format!("reading the messages of session {id}"), error))?;
    if messages.len() != expected_messages {
        problems.push(format!(
            "session {id}: {} messages, expected {expected_messages}",
            messages.len()
        ));
    }
    let mut results: HashMap<&str, Vec<&ToolOutcome>> = HashMap::new();
    let mut errors = ToolErrors::default();
    for message in &messages {
        if let Message::Tool {
            tool_call_id,
            outcome,
            ..
        } = message
        {
            results.entry(tool_call_id).or_default().push(outcome);
            match outcome {
                ToolOutcome::Error(error) if error.starts_with(TIMEOUT_CODE) => {
                    errors.timeouts += 1;
                }
                ToolOutcome::Error(_) => errors.other += 1,
                ToolOutcome::Result(_) => {}
            }
        }
    }
    let tools: usize = results.values().map(Vec::len).sum();
    let expected_tools = plan.turns * plan.steps + plan.suspensions;
    if tools != expected_tools {
        problems.push(format!(
            "session {id}: {tools} tool results, expected {expected_tools}"
        ));
    }
    let mut once = |call: &str| -> Option<&ToolOutcome> {
        match results.get(call).map(Vec::as_slice) {
            Some([outcome]) => Some(outcome),
            Some(many) => {
                problems.push(format!(
                    "session {id}: {} results for {call}, expected exactly one",
                    many.len()
                ));
                None
            }
            None => {
                problems.push(format!("session {id}: no result for {call}"));
                None
            }
        }
    };
    let mut wrong = Vec::new();
    for turn in 1..=plan.turns {
        for step in 0..plan.steps {
            let call = server_call_id(turn, step);
            let want = ToolOutcome::Result(lookup_result(&json!(step)));
            if let Some(got) = once(&call) {
                if *got != want {
                    wrong.push(format!("session {id}: {call} returned {got:?}"));
                }
            }
        }
    }
    if expected.len() != plan.suspensions {
        wrong.push(format!(
            "session {id}: {} suspensions answered or timed out, expected {}",
            expected.len(),
            plan.suspensions
        ));
    }
    for (call, want) in expected {
        let Some(got) = once(call) else { continue };
        let fine = match (want, got) {
            (Expected::Exact(want), got) => want == got,
            (Expected::Timeout, ToolOutcome::Error(error)) => error.starts_with(TIMEOUT_CODE),
            (Expected::Timeout, ToolOutcome::Result(_)) => false,
        };
        if !fine {
            wrong.push(format!(
                "session {id}: {call} has result {got:?}, expected {want:?}"
            ));
        }
    }
    // Every suspension of the plan, even one the driver never reached, must be recorded.
    for index in 0..plan.suspensions {
        let call = suspension_call_id(index % plan.turns + 1, index);
        if !expected.iter().any(|(known, _)| *known == call) {
            wrong.push(format!(
                "session {id}: {call} was never answered or timed out"
            ));
        }
    }
    problems.extend(wrong);
    let runs = runtime
        .runs(id)
        .await
        .map_err(|error| fatal(format!("reading the runs of session {id}"), error))?;
    let completed = runs
        .iter()
        .filter(|run| run.status == Status::Completed)
        .count();
    let suspended = runs
        .iter()
        .filter(|run| run.status == Status::SuspendedClientTool)
        .count();
    let expected_runs = plan.turns + plan.suspensions;
    if runs.len() != expected_runs || completed != plan.turns || suspended != plan.suspensions {
        problems.push(format!(
            "session {id}: {} runs ({completed} completed, {suspended} suspended), expected {expected_runs} ({} completed, {} suspended)",
            runs.len(),
            plan.turns,
            plan.suspensions
        ));
    }
    Ok(errors)
}
