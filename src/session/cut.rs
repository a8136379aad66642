//! Calls a crash or an interrupt cut, and the at-most-once rule that decides what becomes of
//! them (the design's "at-most-once side effects"; ARCHITECTURE.md, "Waiting on a human").
//!
//! A server call is committed as dispatched by commit #1 of its step (the model's reply), or,
//! for an approved call, by the resume that drains the approval: its pending entry, answered
//! `approved`, stays until the tool's result is recorded. A dispatched call that has no result
//! when its run is cut may or may not have taken effect: it runs again only if its tool is
//! `safe_to_retry`, and otherwise gets a `tool_durability_error` result the model can act on.
//! Calls that were never dispatched (client calls and approvals whose pending entries were part
//! of a lost commit) become pending again, and accepted answers are recorded as they are.

use serde_json::Map;

use super::apply_cx::ApplyCx;
use super::core::{CallSlot, Outcome, Phase, Session, StepCall};
use super::{Answer, Effect, ErrorCode, PendingKind, RunError, Status};
use crate::definition::{OnCut, FINISH_TOOL};
use crate::store::CommitKind;
use crate::types::ids::RunId;
use crate::types::message::{Message, ToolCall};
use crate::types::tool_error::ToolErrorCode;

/// The result of a call that a stopped run will not wait for.
fn cut_before_result() -> CallSlot {
    CallSlot::failed(ToolErrorCode::Interrupted.with("the run stopped before this call returned"))
}

impl Session {
    /// The calls of the last model reply that have no result yet (a crash or an interrupt cut
    /// them), in call order.
    pub(super) fn dangling_calls(&self) -> Vec<ToolCall> {
        let Some(messages) = &self.messages else {
            return Vec::new();
        };
        let Some(last_assistant) = messages
            .iter()
            .rposition(|message| matches!(message, Message::Assistant { .. }))
        else {
            return Vec::new();
        };
        let Some(Message::Assistant { tool_calls, .. }) = messages.get(last_assistant) else {
            return Vec::new();
        };
        let answered: Vec<&str> = messages[last_assistant..]
            .iter()
            .filter_map(|message| match message {
                Message::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
                _ => None,
            })
            .collect();
        tool_calls
            .iter()
            .filter(|call| !answered.contains(&call.id.as_str()))
            .cloned()
            .collect()
    }

    /// The message seq of the last model reply, whose calls a step runs: part of each call's
    /// idempotency key ([`crate::definition::reconcile::idempotency_key`]). The conversation is
    /// loaded whenever calls run; without it, the seq the next message would take.
    pub(super) fn reply_seq(&self) -> u64 {
        let index = self.messages.as_ref().and_then(|messages| {
            messages
                .iter()
                .rposition(|message| matches!(message, Message::Assistant { .. }))
        });
        match index {
            Some(index) => self.record.history_start + index as u64,
            None => self.record.message_count,
        }
    }

    /// The idempotency key of call `id` of the last model reply.
    pub(super) fn idempotency_key(&self, id: &str) -> String {
        crate::definition::reconcile::idempotency_key(&self.record.id, self.reply_seq(), id)
    }

    /// Whether the conversation already holds a result for call `id` of the last reply. An
    /// unloaded conversation answers `true`: only a legacy timeout asks, see
    /// [`Session::recorded`].
    pub(super) fn has_result(&self, id: &str) -> bool {
        let Some(messages) = &self.messages else {
            return true;
        };
        messages
            .iter()
            .rev()
            .take_while(|message| !matches!(message, Message::Assistant { .. }))
            .any(|message| matches!(message, Message::Tool { tool_call_id, .. } if tool_call_id == id))
    }

    /// The model must never see a tool call without its result: calls of the last reply that
    /// have none (a crash cut them) are closed first, like any other outcome, with a
    /// `tool_end` chunk for the `tool_start` a follower saw, and the hooks. Nothing runs
    /// again here (a new message, an abort): a dispatched call that is not `safe_to_retry`
    /// gets `tool_durability_error`, an accepted answer is recorded, anything else is closed
    /// as interrupted.
    pub(super) fn close_dangling_calls(&mut self, cx: &mut ApplyCx) {
        let run_id = self.current_run_id();
        for call in self.dangling_calls() {
            // Without `retry`, every call's slot is `Ready`.
            if let CallSlot::Ready { outcome, reported } = self.cut_slot(cx, &call, false, false) {
                let outcome = Outcome::reported(outcome, reported);
                self.record_outcome(cx, run_id, call, outcome);
            }
        }
    }

    /// The resume of a run a crash cut: its cut calls go on under the at-most-once rule (a
    /// `safe_to_retry` call runs again, any other dispatched call gets
    /// `tool_durability_error`, a call never dispatched becomes pending, a child is
    /// re-attached to), then the loop goes on.
    ///
    /// A fork (`forked`) goes on the same way, but asks nobody to reconcile the calls it
    /// copied in flight: their effects belong to the source's timeline, and their idempotency
    /// keys name the source's calls, so they get `tool_durability_error` (ARCHITECTURE.md,
    /// "Forks").
    pub(super) fn retry_cut_calls(&mut self, cx: &mut ApplyCx, run_id: RunId, forked: bool) {
        let cut = self.dangling_calls();
        if cut.is_empty() {
            self.begin_step(cx, run_id);
            return self.finish(cx, CommitKind::RunStart);
        }
        let mut calls: Vec<StepCall> = cut
            .into_iter()
            .map(|call| {
                let slot = self.cut_slot(cx, &call, true, !forked);
                StepCall::new(self.as_approved(call), slot)
            })
            .collect();
        let settles_at_once = calls
            .iter()
            .all(|step_call| matches!(step_call.slot, CallSlot::Ready { .. }));
        if forked && !settles_at_once {
            // The results given to the copied calls that do not run again (a
            // `tool_durability_error`) are recorded in this very commit, not when the step
            // settles: a crash before that would close this run as cut by a crash, and the
            // resume after it would take them for the fork's own calls in flight, and
            // reconcile them under the fork's idempotency keys (which find nothing: the
            // effect, if any, was the source's), running them again.
            let (ready, rest): (Vec<StepCall>, Vec<StepCall>) = calls
                .into_iter()
                .partition(|step_call| matches!(step_call.slot, CallSlot::Ready { .. }));
            for step_call in ready {
                if let CallSlot::Ready { outcome, reported } = step_call.slot {
                    let outcome = Outcome::reported(outcome, reported);
                    self.record_outcome(cx, run_id, step_call.call, outcome);
                }
            }
            calls = rest;
        }
        self.dispatch(cx, CommitKind::RunStart, run_id, calls);
    }

    /// The call as it was approved: with the input the person edited it to, if they did (the
    /// model's own stays in its reply).
    fn as_approved(&self, call: ToolCall) -> ToolCall {
        match self.pending.get(&call.id) {
            Some(entry) if entry.original_input.is_some() => ToolCall {
                input: entry.input.clone(),
                ..call
            },
            _ => call,
        }
    }

    /// How a call of the last reply that has no result goes on: with `retry`, when its run is
    /// resumed after a crash; without, when the session moves on without it (everything is
    /// then `Ready`).
    /// `reconcile`: a call whose tool asks for reconciliation may raise one.
    fn cut_slot(
        &mut self,
        cx: &mut ApplyCx,
        call: &ToolCall,
        retry: bool,
        reconcile: bool,
    ) -> CallSlot {
        if let Some(entry) = self.pending.get(&call.id).cloned() {
            return match &entry.answer {
                // The resume that drained the approval (or the reconciliation that said the
                // effect did not happen) dispatched the tool.
                // A person is asked to reconcile it only while the approval still holds: not
                // for a tool redefined since (it would run again on a stale approval).
                // Or the resume that drained an answer to its question ran it again.
                Some(Answer::Approved | Answer::DidNotHappen | Answer::Input(_))
                    if self.approval_is_stale(&entry) =>
                {
                    // Its tool was redefined since: not run again on the approval of the tool
                    // as it was, however safe to retry the tool now says it is.
                    CallSlot::failed(ToolErrorCode::StaleApproval.with(format_args!(
                        "{} was redefined since this call was approved, and the process stopped while it ran: it may or may not have taken effect, and it was not run again on the approval of the tool as it was",
                        call.name
                    )))
                }
                Some(Answer::Approved | Answer::DidNotHappen | Answer::Input(_)) => {
                    self.dispatched_slot(call, retry && reconcile, retry)
                }
                None if entry.is_waiting(cx.now) && retry => CallSlot::Pending(entry.kind),
                None if entry.is_waiting(cx.now) => cut_before_result(),
                _ => self.answered_slot(cx, &entry),
            };
        }
        match self.classify(call) {
            CallSlot::Dispatched => self.dispatched_slot(call, retry && reconcile, retry),
            slot @ CallSlot::Ready { .. } => slot,
            slot if retry => slot,
            _ => cut_before_result(),
        }
    }

    /// A dispatched call without a result: it runs again only if its tool says that is
    /// harmless; a tool that asks for reconciliation has its check settle it, or a person
    /// (when the run goes on: a new message or an abort does not wait for one); otherwise the
    /// model learns that it may or may not have taken effect.
    fn dispatched_slot(&self, call: &ToolCall, reconcile: bool, retry: bool) -> CallSlot {
        let harmless = call.name == FINISH_TOOL || self.safe_to_retry(call);
        let reconciled = self
            .agent
            .tool(&call.name)
            .filter(|tool| reconcile && tool.def.on_cut == OnCut::Reconcile);
        match (harmless, retry, reconciled) {
            (true, true, _) => CallSlot::Dispatched,
            (true, false, _) => cut_before_result(),
            (false, true, Some(tool)) if tool.def.check.is_some() => CallSlot::Checking,
            (false, true, Some(_)) => CallSlot::Pending(PendingKind::Reconcile),
            (false, _, _) => CallSlot::failed(ToolErrorCode::ToolDurabilityError.with(format_args!(
                "the process stopped while {} (call {}) was running, so it may or may not have taken effect. It is not marked safe to retry, so it was not run again: check whether its effect happened before calling it again.",
                call.name, call.id
            ))),
        }
    }

    /// Ends the step in progress at once (an interrupt or an abort of a running run): the
    /// model call and the tools in flight are cancelled, and every call of the step gets its
    /// outcome now, so nothing the cancelled work would have produced is applied later. A tool
    /// that was running may or may not have taken effect, and its result says so; a child
    /// still working is stopped (aborted with `abort`).
    pub(super) fn cut_step(&mut self, cx: &mut ApplyCx, why: &str, abort: bool) {
        cx.push(Effect::CancelWork);
        let Phase::AwaitingTools { run_id, calls, .. } =
            std::mem::replace(&mut self.phase, Phase::Idle)
        else {
            return;
        };
        let mut stopped = Vec::new();
        for StepCall {
            call,
            slot,
            changes,
            ..
        } in calls
        {
            let (outcome, reported, changes) = match slot {
                CallSlot::Ready { outcome, reported } => (outcome, reported, changes),
                CallSlot::Dispatched | CallSlot::Checking => {
                    // It may have asked a question that is on its way back.
                    self.close_unwritten_question(cx, &call);
                    let cancelled = ToolErrorCode::Interrupted.with(format_args!(
                        "{why} while {} was running; it was cancelled and may or may not have taken effect",
                        call.name
                    ));
                    (cancelled.into(), false, Map::new())
                }
                CallSlot::Child => {
                    let finished = self
                        .children
                        .get(&call.id)
                        .is_none_or(|entry| entry.state.is_finished());
                    if let Some(entry) = self.children.get(&call.id).filter(|_| !finished) {
                        // An aborted parent terminates its companions on its own.
                        if !abort || entry.companion.is_none() {
                            stopped.push(self.child_at(entry.child.clone()));
                        }
                    }
                    let adopted = self.adopt_child(cx, run_id, &call.id);
                    let outcome = if finished {
                        adopted
                    } else {
                        ToolErrorCode::Interrupted
                            .with(format_args!("{why} before the sub-agent finished"))
                            .into()
                    };
                    (outcome, false, Map::new())
                }
                // It ran and asked a person; the step waited on a child to settle.
                CallSlot::Pending(PendingKind::Input) => {
                    self.close_unwritten_question(cx, &call);
                    (
                        ToolErrorCode::Interrupted
                            .with(format_args!(
                                "{why} while {} waited for an answer to its question; it may have acted before it asked",
                                call.name
                            ))
                            .into(),
                        false,
                        Map::new(),
                    )
                }
                CallSlot::Pending(_) | CallSlot::Companion => (
                    ToolErrorCode::Interrupted
                        .with(format_args!("{why} before this call was made"))
                        .into(),
                    false,
                    Map::new(),
                ),
            };
            let outcome = Outcome {
                value: outcome,
                reported,
                changes,
            };
            self.record_outcome(cx, run_id, call, outcome);
        }
        if !stopped.is_empty() {
            cx.push(Effect::StopChildren {
                children: stopped,
                abort,
            });
        }
    }

    /// A session found `Running` on activation was cut by a crash (no live actor ran it): its
    /// run is closed as interrupted, and a later `resume` or message goes on from there.
    pub(super) fn recover_after_crash(&mut self, cx: &mut ApplyCx) {
        if self.record.status != Status::Running {
            return;
        }
        self.end_run(
            cx,
            Status::Interrupted,
            Some(RunError {
                code: ErrorCode::Crashed,
                message: "the process stopped while this run was in progress".into(),
            }),
        );
        // Nobody waits for a run of a previous process, and a parent learns of it by its own
        // recovery (or when it wakes this child).
        cx.retain(|effect| !matches!(effect, Effect::Settle(_) | Effect::Report { .. }));
        self.finish(cx, CommitKind::RunEnd);
    }
}
