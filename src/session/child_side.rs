//! The child's side of sub-agents: how a session is started (or re-attached to) by its parent,
//! woken by a resume cascading down, and what it reports back. `children.rs` is the parent's
//! side. Parent and child only ever send each other one-way messages (`Effect::Report`,
//! `Effect::StartChild`, `Effect::WakeChildren`), so neither waits on the other.

use super::apply_cx::ApplyCx;
use super::child_calls::{ChildKind, ChildStart};
use super::child_failures::{cannot_start, LostChild};
use super::core::Session;
use super::{
    ChildReport, ChildState, Effect, ErrorCode, PendingCall, RunOutcome, RunRecord, SessionRecord,
    Status,
};
use crate::types::ids::{RunId, SessionId};
use crate::types::message::ToolOutcome;
use crate::types::tool_error::ToolErrorCode;

impl Session {
    /// This session's parent starts it as the child of a sub-agent call, or gives a companion
    /// a new turn, or re-attaches to either after a crash (the call was replayed): a child
    /// that exists is never started twice for one call.
    pub(super) fn start_child(&mut self, cx: &mut ApplyCx, run_id: RunId, start: ChildStart) {
        let origin = start.origin.clone();
        if self.record.log_count == 0 {
            // Created for this start: its first run.
            if let Err(error) = self.execute(cx, run_id, start.message) {
                let why = ToolErrorCode::SubAgentFailed.with(error);
                cx.push(cannot_start(&origin.parent, origin.tool_call_id, why));
            }
            return;
        }
        if self.record.parent.as_ref() != Some(&origin.parent) {
            // Ids are concatenations: refuse to take over a session of another tree.
            let why = ToolErrorCode::SessionIdTaken.with(format_args!(
                "{} exists and belongs to another parent",
                self.record.id
            ));
            return cx.push(cannot_start(&origin.parent, origin.tool_call_id, why));
        }
        let ChildKind::Companion { fresh } = start.kind else {
            return self.wake(cx, run_id);
        };
        if self.record.parent_call.as_ref() == Some(&origin.tool_call_id) {
            // This call started the companion's current turn already (a replay).
            return self.wake(cx, run_id);
        }
        if self.is_busy() {
            // Its run is still stopping (terminated and spawned again in one reply): the new
            // turn starts once that run settles.
            self.deferred_starts.push(start);
            return;
        }
        let call = origin.tool_call_id.clone();
        if let Err(error) = self.consult(cx, run_id, start.message, call, fresh) {
            let why = ToolErrorCode::CompanionBusy.with(format_args!(
                "{} cannot take a new turn: {error}",
                self.record.id
            ));
            cx.push(cannot_start(&origin.parent, origin.tool_call_id, why));
        }
    }

    /// The parent goes on (a resume cascading down, or a re-attach): a suspended or
    /// interrupted session resumes as the run `run_id` (or reports what it still waits on);
    /// any other reports where it stands. A run in progress reports when it settles.
    pub(super) fn wake(&mut self, cx: &mut ApplyCx, run_id: RunId) {
        if self.is_busy() {
            return;
        }
        let resumable = matches!(
            self.record.status,
            Status::SuspendedClientTool
                | Status::SuspendedAwaitingChildren
                | Status::Interrupted
                | Status::Running
        ) && !self.record.aborted;
        if resumable {
            // A resume that only answers the barrier (calls still wait) is not taken: this
            // session reports where it stands instead.
            let mark = cx.mark();
            let resumed = self.resume(cx, run_id).is_ok();
            if resumed && (cx.has_commit() || self.is_busy()) {
                return;
            }
            cx.rewind(mark);
        }
        self.release_messages();
        cx.extend(self.report(cx.now));
    }

    /// What this session tells its parent about where its last run stands (`None` for a root,
    /// or while a run is in progress).
    pub(crate) fn report(&self, now: u64) -> Option<Effect> {
        let (parent, call) = (
            self.record.parent.as_ref()?,
            self.record.parent_call.as_ref()?,
        );
        let report = report_of(&self.outcome(now), self.record.aborted)?;
        Some(Effect::Report {
            parent: parent.clone(),
            tool_call_id: call.clone(),
            report,
        })
    }

    /// What this session tells its parent while it is suspended (`None` for a root, or in
    /// any other state).
    pub(crate) fn suspended_report(&self, now: u64) -> Option<Effect> {
        self.report(now).filter(|report| {
            matches!(
                report,
                Effect::Report {
                    report: ChildReport::Suspended(_),
                    ..
                }
            )
        })
    }

    /// Read back after its actor panicked: a parent whose step waits on this child learns
    /// that the run was cut, and wakes it to go on (the at-most-once rules decide what runs
    /// again; if it keeps crashing, the host fails it).
    pub(super) fn restarted(&self, cx: &mut ApplyCx) {
        cx.extend(self.report(cx.now).filter(|report| {
            matches!(
                report,
                Effect::Report {
                    report: ChildReport::Crashed,
                    ..
                }
            )
        }));
    }

    /// A commit of this session failed: a parent that waits on it records that as the tool's
    /// error (the session itself is read back and its run closed as cut).
    pub(super) fn commit_failed(&self, cx: &mut ApplyCx, reason: &str) {
        let (Some(parent), Some(call)) = (&self.record.parent, &self.record.parent_call) else {
            return;
        };
        let why = ToolErrorCode::SubAgentFailed.with(reason);
        cx.push(cannot_start(parent, call.clone(), why));
    }
}

/// What a child's run outcome means to its parent; `None` while it is still running.
pub(crate) fn report_of(outcome: &RunOutcome, aborted: bool) -> Option<ChildReport> {
    let error = outcome.error.as_ref();
    Some(match outcome.status {
        Status::Running => return None,
        Status::SuspendedClientTool | Status::SuspendedAwaitingChildren if !aborted => {
            ChildReport::Suspended(outcome.pending.clone())
        }
        Status::Completed => {
            ChildReport::Finished(ToolOutcome::Result(outcome.output.clone().unwrap_or_else(
                || serde_json::Value::String(outcome.text.clone().unwrap_or_default()),
            )))
        }
        // Cut by a crash, or a fork made inside its run: its parent wakes it to go on.
        Status::Interrupted
            if error.is_some_and(|error| {
                matches!(error.code, ErrorCode::Crashed | ErrorCode::ForkPoint)
            }) =>
        {
            ChildReport::Crashed
        }
        status => {
            let (code, message) = error.map_or(("failed", String::new()), |error| {
                (error.code.as_str(), error.message.clone())
            });
            let failure = ToolErrorCode::SubAgentFailed.with(format_args!(
                "child {} ended {status} with {code}: {message}",
                outcome.session_id
            ));
            if status == Status::Interrupted && !aborted {
                ChildReport::Interrupted(failure.to_string())
            } else {
                ChildReport::Finished(failure.into())
            }
        }
    })
}

/// How a child stands by what the store holds of it: its record, its last run and its pending
/// calls (`None` for a child that is not stored). Recovery writes this for a child a crash
/// left recorded as running.
pub(crate) fn stored_state(
    child: &SessionId,
    stored: Option<(SessionRecord, Option<RunRecord>, Vec<PendingCall>)>,
) -> ChildState {
    let Some((record, run, pending)) = stored else {
        let child = child.clone();
        return LostChild::Missing { child }.state();
    };
    let outcome = RunOutcome {
        session_id: child.clone(),
        run_id: run.as_ref().map_or(RunId::NONE, |run| run.run_id),
        turn: record.run_count,
        status: record.status,
        text: run.as_ref().and_then(|run| run.text.clone()),
        output: run.as_ref().and_then(|run| run.output.clone()),
        error: run.and_then(|run| run.error),
        pending: pending
            .into_iter()
            .filter(|call| call.answer.is_none())
            .map(|call| call.tool_call_id)
            .collect(),
    };
    match report_of(&outcome, record.aborted) {
        Some(ChildReport::Finished(outcome)) => ChildState::Finished(outcome),
        // Interrupted, not failed: a companion keeps its conversation, and a resume of the
        // parent re-attaches to an ephemeral child.
        Some(ChildReport::Interrupted(reason)) => ChildState::Interrupted { reason },
        Some(ChildReport::Suspended(waiting)) => ChildState::Suspended { waiting },
        Some(ChildReport::Crashed) | None => LostChild::Interrupted {
            child: child.clone(),
        }
        .state(),
    }
}
