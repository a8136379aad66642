//! Going on after a suspension (resume, with its barrier), and ending one early (interrupt,
//! abort, a new message over pending calls).

use serde_json::Value;

use super::apply_cx::ApplyCx;
use super::core::{CallSlot, Outcome, Phase, Session, StepCall};
use super::suspend::{answer_outcome, timeout_outcome, unreconciled};
use super::{
    Answer, ChildState, Effect, ErrorCode, Observation, PendingCall, PendingKind, RunError, Status,
};
use crate::error::Error;
use crate::store::schema::{self, IndexWrite};
use crate::store::CommitKind;
use crate::types::hooks::HookEvent;
use crate::types::ids::RunId;
use crate::types::message::ToolCall;
use crate::types::stream::ChunkKind;
use crate::types::tool_error::{ToolErrorCode, ToolFailure};

impl Session {
    /// Continues a suspended or interrupted run as the new run `run_id`. A resume while a run
    /// is in progress joins it (nothing changes: its caller is answered when it settles);
    /// while some call of the suspension still waits (the barrier) nothing runs and the
    /// caller is answered with what is pending.
    ///
    /// # Errors
    /// [`Error::Aborted`] for an aborted session, [`Error::NotResumable`] for a session whose
    /// last run completed or failed.
    pub(super) fn resume(&mut self, cx: &mut ApplyCx, run_id: RunId) -> Result<(), Error> {
        if self.record.aborted {
            return Err(Error::Aborted(self.record.id.clone()));
        }
        if self.is_busy() {
            return Ok(());
        }
        match self.record.status {
            Status::Running => Err(Error::AlreadyRunning(self.record.id.clone())),
            Status::SuspendedClientTool | Status::SuspendedAwaitingChildren => {
                if self.pending.any_waiting(cx.now) {
                    cx.push(Effect::Settle(self.outcome(cx.now)));
                    return Ok(());
                }
                let asleep = self.children_to_wake();
                if !asleep.is_empty() {
                    // The cascade: each child resumes (or reports what it still waits on), and
                    // this session goes on once all have reported.
                    self.phase = Phase::AwaitingChildren {
                        waking: asleep.iter().map(|(call, _)| call.clone()).collect(),
                        run_id,
                    };
                    self.wake_children(cx, asleep);
                    if self.policy.auto_resume {
                        // The resume it may have owed itself is under way: what the woken
                        // children answer decides what comes next (a resume owed then is
                        // owed afresh). Left, the entry would wake them again every time
                        // the scheduler looks, for as long as one of them (a remote child)
                        // answers that it waits on nothing but a resume.
                        cx.staged.index.push(schema::resume_due_write(false));
                        self.finish_entries(cx, CommitKind::Other);
                    }
                    return Ok(());
                }
                self.drain(cx, run_id);
                Ok(())
            }
            Status::Interrupted => {
                let previous = self.current_run_id();
                let cut_by = self
                    .run
                    .as_ref()
                    .and_then(|run| run.error.as_ref())
                    .map(|error| error.code);
                // A fork made inside a run goes on as the source would after a crash there.
                let crashed = matches!(cut_by, Some(ErrorCode::Crashed | ErrorCode::ForkPoint));
                let forked_from = self
                    .record
                    .forked_from
                    .clone()
                    .filter(|_| cut_by == Some(ErrorCode::ForkPoint));
                let waited = self.waited_since(previous, cx.now);
                // A fork of a run that waited only to finish goes on to finish, as in `drain`.
                let decided = self.decided_output().filter(|_| crashed);
                self.start_run(cx, run_id, Some(previous));
                self.keep_output(decided);
                cx.push(self.resumed_hook(run_id, previous, waited, forked_from));
                if crashed {
                    let forked = cut_by == Some(ErrorCode::ForkPoint);
                    self.retry_cut_calls(cx, run_id, forked);
                    return Ok(());
                }
                self.close_dangling_calls(cx);
                self.begin_step(cx, run_id);
                self.finish(cx, CommitKind::RunStart);
                Ok(())
            }
            status @ (Status::Completed | Status::Failed) => Err(Error::NotResumable {
                session: self.record.id.clone(),
                status,
            }),
        }
    }

    /// The suspended step's finisher, if it succeeded: its value, and the text of the reply
    /// that called it. The run that goes on completes with them once the children it waited
    /// for are recorded.
    fn decided_output(&self) -> Option<(Value, Option<String>)> {
        let finish = self.record.suspension.as_ref()?.finish.clone()?;
        Some((finish, self.run.as_ref().and_then(|run| run.text.clone())))
    }

    /// Keeps the [`Session::decided_output`] read before the run went on (which forgets it).
    fn keep_output(&mut self, decided: Option<(Value, Option<String>)>) {
        if let Some((finish, text)) = decided {
            self.finishing = Some(finish);
            if let Some(run) = &mut self.run {
                run.text = text;
            }
        }
    }

    /// Drains every answer of the suspension into tool results, in call order, and runs the
    /// approved tools: one continuation that sees all results, once.
    ///
    /// Each pending entry (and each child entry) goes in the commit that records its call's
    /// result: for answers and children that is this commit, unless an approved tool runs, and
    /// then it is the commit of that tool's result. So a crash in between finds the approval
    /// still recorded (the tool was dispatched: the at-most-once rule decides, never a second
    /// approval) and the other answers still there (an accepted answer is never lost).
    pub(super) fn drain(&mut self, cx: &mut ApplyCx, run_id: RunId) {
        let previous = self
            .record
            .suspension
            .as_ref()
            .map_or_else(|| self.current_run_id(), |suspension| suspension.run_id);
        let decided = self.decided_output();
        let waited = self.waited_since(previous, cx.now);
        self.start_run(cx, run_id, Some(previous));
        self.keep_output(decided);
        cx.push(self.resumed_hook(run_id, previous, waited, None));
        let mut ordered: Vec<(u32, StepCall)> = self
            .children
            .entries()
            .into_iter()
            .map(|entry| {
                let call = ToolCall::new(entry.tool_call_id, entry.tool_name, Value::Null);
                (entry.position, StepCall::new(call, CallSlot::Child))
            })
            .collect();
        for entry in self.pending.in_order() {
            if self.recorded(&entry) {
                // A timeout, whose result was recorded when it expired.
                self.pending.remove(&entry.tool_call_id);
                self.complete(cx, &entry);
                continue;
            }
            self.report_decision(cx, run_id, &entry);
            let slot = self.answered_slot(cx, &entry);
            ordered.push((entry.position, StepCall::new(entry_call(&entry), slot)));
        }
        // Children and own calls interleave in the model's reply: restore call order.
        ordered.sort_by_key(|(position, _)| *position);
        let calls = ordered.into_iter().map(|(_, call)| call).collect();
        if self.policy.auto_resume {
            // The resume it may have owed itself is under way.
            cx.staged.index.push(schema::resume_due_write(false));
        }
        self.dispatch(cx, CommitKind::RunStart, run_id, calls);
    }

    /// What an answered (or expired) entry's call does on resume: an approved tool runs, any
    /// other answer is the call's result.
    pub(super) fn answered_slot(&self, cx: &mut ApplyCx, entry: &PendingCall) -> CallSlot {
        match (&entry.answer, answer_outcome(entry)) {
            (Some(Answer::Approved | Answer::DidNotHappen | Answer::Input(_)), _)
                if self.approval_is_stale(entry) =>
            {
                CallSlot::failed(ToolErrorCode::StaleApproval.with(format_args!(
                    "{} was redefined since this call was approved, so it did not run: the approval was for the tool as it was",
                    entry.tool_name
                )))
            }
            // Approved, reconciled as not having happened, or its question answered: the tool
            // runs (once more).
            (Some(Answer::Approved | Answer::DidNotHappen | Answer::Input(_)), _) => {
                CallSlot::Dispatched
            }
            // Written by an earlier version, which reported a timeout's outcome on the stream
            // when it expired but left its result for the resume.
            (Some(Answer::TimedOut), Some(outcome)) => CallSlot::Ready {
                outcome,
                reported: true,
            },
            (Some(_), Some(outcome)) => CallSlot::Ready {
                outcome,
                reported: false,
            },
            // Expired but not yet swept: the deadline is authoritative.
            _ => {
                cx.push(Effect::Observe(Observation::TimedOut {
                    tool_call_id: entry.tool_call_id.clone(),
                    lag_ms: cx.now.saturating_sub(entry.deadline_at_ms),
                }));
                CallSlot::Ready {
                    outcome: timeout_outcome(entry),
                    reported: false,
                }
            }
        }
    }

    /// Whether an approved call's tool changed since its approval was requested: the binding
    /// of the request no longer matches the call (its input as the model made it) and the
    /// tool as it is now.
    pub(super) fn approval_is_stale(&self, entry: &PendingCall) -> bool {
        let Some(bound) = &entry.binding else {
            return false; // requested before approvals were bound
        };
        let input = entry.original_input.as_ref().unwrap_or(&entry.input);
        self.agent.tool(&entry.tool_name).is_none_or(|tool| {
            crate::definition::binding::approval_binding(&tool.def, input) != *bound
        })
    }

    /// Whether the entry's result is in the conversation already: a timeout records its
    /// result when it expires (an earlier version left it to the resume).
    pub(super) fn recorded(&self, entry: &PendingCall) -> bool {
        entry.answer == Some(Answer::TimedOut) && self.has_result(&entry.tool_call_id)
    }

    /// Puts a person's decision on an approval call on the stream, in the commit that acts on
    /// it (before an approved tool runs), so it can be seen after any crash.
    fn report_decision(&mut self, cx: &mut ApplyCx, run_id: RunId, entry: &PendingCall) {
        let (approved, reason) = match &entry.answer {
            Some(Answer::Approved) => (true, None),
            Some(Answer::Denied { reason }) => (false, reason.clone()),
            _ => return,
        };
        if entry.kind != PendingKind::Approval {
            return;
        }
        self.stage_chunk(
            cx,
            run_id,
            ChunkKind::ToolApprovalResponse {
                tool_call_id: entry.tool_call_id.clone(),
                tool_name: entry.tool_name.clone(),
                approval_id: entry.approval_id(),
                approved,
                reason,
                edited_input: entry.original_input.as_ref().map(|_| entry.input.clone()),
            },
        );
    }

    /// Removes a finished call's entry and ownership and leaves a tombstone on the root, so a
    /// duplicate submit answers `already_completed` for the retention period.
    pub(super) fn complete(&self, cx: &mut ApplyCx, entry: &PendingCall) {
        self.unindex(cx, entry);
        cx.staged.index.push(IndexWrite::PutTombstone {
            root: self.record.root.clone(),
            call: entry.tool_call_id.clone(),
            at: cx.now,
        });
    }

    /// How long since the run `previous` suspended (or was cut), when its record says when.
    fn waited_since(&self, previous: RunId, now: u64) -> Option<u64> {
        self.run
            .as_ref()
            .filter(|run| run.run_id == previous)
            .and_then(|run| run.ended_at_ms)
            .map(|ended| now.saturating_sub(ended))
    }

    fn resumed_hook(
        &self,
        run_id: RunId,
        previous: RunId,
        suspended_ms: Option<u64>,
        resumed_from_checkpoint: Option<crate::types::ForkOrigin>,
    ) -> Effect {
        Effect::Hook(HookEvent::AgentResumed {
            session: self.record.id.clone(),
            run_id,
            previous_run_id: previous,
            suspended_ms,
            resumed_from_checkpoint,
        })
    }

    /// A new message over pending calls closes each one: answers are kept, unanswered calls get
    /// `client_tool_abandoned`, and all are tombstoned.
    pub(super) fn abandon_pending(&mut self, cx: &mut ApplyCx) {
        if self.pending.is_empty() && self.children.is_empty() {
            return;
        }
        let abandoned = self.close_pending(
            cx,
            ToolErrorCode::ClientToolAbandoned
                .with("approved, but a new message arrived before the tool ran"),
            Some(
                ToolErrorCode::ClientToolAbandoned
                    .with("a new message arrived before this call was answered"),
            ),
        );
        if abandoned > 0 {
            cx.push(Effect::Observe(Observation::Abandoned { count: abandoned }));
        }
        self.record.suspension = None;
    }

    /// Records every answered pending call as its result (tombstoned: duplicates answer
    /// `already_completed`), so an accepted answer is never lost. Unanswered calls are closed
    /// with `unanswered` (tombstoned too), or, without it, dropped: their entries go and a late
    /// submit answers `unknown_tool_call`. Returns how many were unanswered.
    ///
    /// An approved call whose tool was dispatched (the session is not suspended: a crash cut
    /// the run that ran it) is left to [`Session::close_dangling_calls`], under the
    /// at-most-once rule.
    fn close_pending(
        &mut self,
        cx: &mut ApplyCx,
        approved: ToolFailure,
        unanswered: Option<ToolFailure>,
    ) -> usize {
        let run_id = self.current_run_id();
        let mut count = 0;
        // Children the run will not wait for are stopped (aborted when abandoned or aborted);
        // those that finished are recorded like answered calls.
        let abort_children = unanswered.is_some() || self.record.aborted;
        for entry in self.release_children(cx, abort_children) {
            let outcome = match (&entry.state, &unanswered) {
                (ChildState::Finished(_), _) => self.adopt_child(cx, run_id, &entry.tool_call_id),
                (_, Some(_)) => {
                    count += 1;
                    self.adopt_child(cx, run_id, &entry.tool_call_id);
                    ToolErrorCode::SubAgentAbandoned
                        .with("a new message arrived before the child finished")
                        .into()
                }
                (_, None) => {
                    count += 1;
                    self.drop_child(cx, &entry.tool_call_id);
                    continue;
                }
            };
            let call = ToolCall::new(entry.tool_call_id, entry.tool_name, Value::Null);
            self.record_outcome(cx, run_id, call, Outcome::of(outcome));
        }
        let suspended = self.is_suspended();
        for entry in self.pending.in_order() {
            if self.recorded(&entry) {
                self.pending.remove(&entry.tool_call_id);
                self.complete(cx, &entry);
                continue;
            }
            let (outcome, reported) = match (&entry.answer, answer_outcome(&entry)) {
                (Some(Answer::Approved | Answer::DidNotHappen | Answer::Input(_)), _)
                    if !suspended =>
                {
                    continue
                }
                (Some(Answer::Approved), _) => {
                    self.report_decision(cx, run_id, &entry);
                    (approved.clone().into(), false)
                }
                (Some(Answer::DidNotHappen), _) => (
                    ToolErrorCode::ClientToolAbandoned
                        .with("its effect did not happen, and the run stopped before the tool ran again")
                        .into(),
                    false,
                ),
                (Some(Answer::Input(_)), _) => (
                    ToolErrorCode::ClientToolAbandoned
                        .with("its question was answered, and the run stopped before the tool went on with the answer")
                        .into(),
                    false,
                ),
                (Some(answer), Some(outcome)) => {
                    self.report_decision(cx, run_id, &entry);
                    (outcome, *answer == Answer::TimedOut)
                }
                // Expired but not yet swept: the deadline is authoritative, as on resume. The
                // call timed out (its result recorded, tombstoned), whether the sweep came
                // before this or not; it is neither abandoned nor dropped.
                (None, _) if cx.now >= entry.deadline_at_ms => {
                    cx.push(Effect::Observe(Observation::TimedOut {
                        tool_call_id: entry.tool_call_id.clone(),
                        lag_ms: cx.now.saturating_sub(entry.deadline_at_ms),
                    }));
                    (timeout_outcome(&entry), false)
                }
                _ => {
                    count += 1;
                    match &unanswered {
                        // Its effect is still unknown: never "not run".
                        Some(_) if entry.kind == PendingKind::Reconcile => (
                            unreconciled(&entry, "the run stopped before anyone said whether it took effect"),
                            false,
                        ),
                        Some(error) => (error.clone().into(), false),
                        None => {
                            self.pending.remove(&entry.tool_call_id);
                            self.unindex(cx, &entry);
                            continue;
                        }
                    }
                }
            };
            let call = entry_call(&entry);
            let outcome = Outcome::reported(outcome, reported);
            self.record_outcome(cx, run_id, call, outcome);
        }
        count
    }

    /// A durable interrupt. A suspended run ends `interrupted` at once: its answered calls
    /// keep their answers (recorded as results); its unanswered calls and their ownership are
    /// cleared, so late submits answer `unknown_tool_call`. A running run ends `interrupted`
    /// at once too: its model call and tools in flight are cancelled and each call of its step
    /// gets its outcome (see [`Session::cut_step`]). The children it stopped and its working
    /// companions are interrupted; they keep their conversations.
    pub(super) fn interrupt(&mut self, cx: &mut ApplyCx) {
        match self.record.status {
            Status::SuspendedClientTool | Status::SuspendedAwaitingChildren => {
                // A resume that was waking the children is called off.
                self.phase = Phase::Idle;
                let count = self.close_pending(
                    cx,
                    ToolErrorCode::Interrupted
                        .with("approved, but the run was interrupted before the tool ran"),
                    None,
                );
                cx.push(Effect::Observe(Observation::Aborted { count }));
                self.record.suspension = None;
                self.stop_working_companions(cx);
                let error = RunError {
                    code: ErrorCode::Interrupted,
                    message: "interrupted by request while waiting".into(),
                };
                self.end_run(cx, Status::Interrupted, Some(error));
                self.finish(cx, CommitKind::Other);
            }
            Status::Running => {
                self.cut_step(cx, "the run was interrupted", false);
                self.stop_working_companions(cx);
                let error = RunError {
                    code: ErrorCode::Interrupted,
                    message: "interrupted by request".into(),
                };
                self.end_run(cx, Status::Interrupted, Some(error));
                self.finish(cx, CommitKind::RunEnd);
            }
            Status::Interrupted => {
                // A crash interrupted this run, not its remote children: they went on there
                // (a resume re-attaches to them). An interrupt asked for now reaches them;
                // their entries stay, for that resume.
                let remote: Vec<_> = self
                    .children
                    .in_order()
                    .into_iter()
                    .filter(|entry| entry.remote.is_some() && !entry.state.is_finished())
                    .map(|entry| self.child_at(entry.child.clone()))
                    .collect();
                if !remote.is_empty() {
                    cx.push(Effect::StopChildren {
                        children: remote,
                        abort: false,
                    });
                }
            }
            _ => {}
        }
    }

    /// A terminal abort: a running, suspended or interrupted run fails (a running one at once,
    /// its work in flight cancelled), its unanswered calls are dropped (answered ones are
    /// recorded), its children are aborted, its companions terminated, and the session never
    /// runs again. A session whose last run already completed or failed keeps that run as it
    /// was.
    pub(super) fn abort(&mut self, cx: &mut ApplyCx) {
        if self.record.aborted {
            return;
        }
        self.record.aborted = true;
        if self.record.status == Status::Running {
            self.cut_step(cx, "the session was aborted", true);
        }
        self.phase = Phase::Idle;
        let count = self.close_pending(
            cx,
            ToolErrorCode::Aborted
                .with("approved, but the session was aborted before the tool ran"),
            None,
        );
        if count > 0 {
            cx.push(Effect::Observe(Observation::Aborted { count }));
        }
        if self.record.status == Status::Interrupted {
            // Calls a crash cut, an approved tool among them: nothing may stay dispatched.
            self.close_dangling_calls(cx);
        }
        self.terminate_companions(cx);
        self.record.suspension = None;
        match self.record.status {
            // A run that stopped or could go on ends here.
            Status::Running
            | Status::SuspendedClientTool
            | Status::SuspendedAwaitingChildren
            | Status::Interrupted => {
                let error = RunError {
                    code: ErrorCode::Aborted,
                    message: "aborted: the session was aborted".into(),
                };
                self.end_run(cx, Status::Failed, Some(error));
            }
            // A run that already ended keeps its record and its one `run_end`: the abort only
            // refuses what would come next.
            Status::Completed | Status::Failed => {}
        }
        self.finish(cx, CommitKind::Other);
    }
}

/// The tool call a pending entry stands for.
fn entry_call(entry: &PendingCall) -> ToolCall {
    ToolCall::new(
        entry.tool_call_id.clone(),
        entry.tool_name.clone(),
        entry.input.clone(),
    )
}
