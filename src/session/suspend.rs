//! Calls that wait outside the runtime: making them pending, suspending the run, accepting
//! answers (first writer wins) and recording timeouts.

use serde_json::Value;

use super::apply_cx::ApplyCx;
use super::core::{CallSlot, Outcome, Phase, Session};
use super::{Answer, Effect, Observation, PendingCall, PendingKind, Status, Suspension};
use crate::definition::{InputAnswer, InputRequest, Reconciled, ToolKind};
use crate::store::schema::IndexWrite;
use crate::store::CommitKind;
use crate::types::hooks::HookEvent;
use crate::types::ids::RunId;
use crate::types::message::{ToolCall, ToolOutcome};
use crate::types::stream::ChunkKind;
use crate::types::tool_error::ToolErrorCode;

/// The error text a denied approval records.
pub const NOT_APPROVED: &str = "Tool call was not approved by the user";

/// An answer for a pending call, as submitted.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Submission {
    /// A client tool's result.
    Result(Value),
    /// An error instead of a result (accepted for either kind; an approval's tool then never
    /// runs).
    Error(String),
    /// A person's decision on an approval gate.
    Approval {
        approved: bool,
        approval_id: String,
        reason: Option<String>,
        /// Approved with this input instead of the call's.
        edited_input: Option<Value>,
        /// The request's binding the decision was made for, if the decision names it.
        binding: Option<String>,
    },
    /// Whether a cut call's effect happened (a `reconcile` call).
    Reconcile(Reconciled),
    /// `answer`, for question `number` of an `input` call (1 for its first).
    Question {
        number: u32,
        answer: Box<Submission>,
    },
}

impl Submission {
    /// The answer itself, and the question it names, if it names one.
    pub(crate) fn into_parts(self) -> (Submission, Option<u32>) {
        match self {
            Submission::Question { number, answer } => (answer.into_parts().0, Some(number)),
            other => (other, None),
        }
    }
}

/// What the session decided about a submission.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Verdict {
    /// Recorded; acknowledged once the transition's commit is durable.
    Accepted,
    /// An answer exists already, or the deadline passed.
    AlreadyCompleted,
    /// The session has no pending call with that id (the caller checks tombstones).
    NotPending,
    /// The answer does not fit the call; nothing was stored.
    InvalidResult { reason: String, errors: Vec<String> },
    /// An approval decision made for another request of the call (`binding` differs).
    StaleApproval { reason: String },
}

impl Session {
    /// Makes `call` pending: its entry, its deadline and its ownership entry on the root are
    /// staged for commit #2.
    pub(super) fn make_pending(
        &mut self,
        cx: &mut ApplyCx,
        run_id: RunId,
        call: ToolCall,
        kind: PendingKind,
        position: u32,
        asked: Option<InputRequest>,
    ) {
        let now = cx.now;
        let tool_timeout = match self.agent.tool(&call.name).map(|tool| &tool.def.kind) {
            Some(ToolKind::Client { timeout_ms }) => *timeout_ms,
            _ => None,
        };
        let timeout = tool_timeout
            .or(self.agent.client_tool_timeout_ms())
            .unwrap_or(self.policy.client_tool_timeout_ms);
        let binding = (kind == PendingKind::Approval)
            .then(|| self.agent.tool(&call.name))
            .flatten()
            .map(|tool| crate::definition::binding::approval_binding(&tool.def, &call.input));
        let idempotency_key = matches!(kind, PendingKind::Reconcile | PendingKind::Input)
            .then(|| self.idempotency_key(&call.id));
        // A reconciliation of an approved call keeps what the approval decided: the input the
        // person approved (the call's own beside it) and the request it was bound to, so the
        // call never runs again with input the person edited away, nor with a redefined tool.
        // So does a question the approved call asks.
        let (original_input, binding) = match self.pending.get(&call.id) {
            Some(approved) if matches!(kind, PendingKind::Reconcile | PendingKind::Input) => {
                (approved.original_input.clone(), approved.binding.clone())
            }
            _ => (None, binding),
        };
        // A tool that asks again keeps the answers to its earlier questions, and so does a
        // reconciliation of a run of it that a crash cut (the tool runs again with them); one
        // made pending again after a lost commit keeps its question.
        let earlier = self
            .pending
            .get(&call.id)
            .filter(|_| matches!(kind, PendingKind::Reconcile | PendingKind::Input));
        let answers = earlier.map(PendingCall::all_answers).unwrap_or_default();
        let request = asked.or_else(|| {
            earlier
                .filter(|_| kind == PendingKind::Input)
                .and_then(|entry| entry.request.clone())
        });
        let entry = PendingCall {
            request,
            answers,
            binding,
            original_input,
            idempotency_key,
            tool_call_id: call.id,
            tool_name: call.name,
            input: call.input,
            kind,
            run_id,
            position,
            requested_at_ms: now,
            deadline_at_ms: now.saturating_add(timeout),
            answer: None,
            answered_at_ms: None,
        };
        if kind == PendingKind::Approval {
            self.stage_chunk(
                cx,
                run_id,
                ChunkKind::ToolApprovalRequest {
                    tool_call_id: entry.tool_call_id.clone(),
                    tool_name: entry.tool_name.clone(),
                    input: entry.input.clone(),
                    approval_id: entry.approval_id(),
                    binding: entry.binding.clone(),
                },
            );
        }
        cx.staged.index.push(IndexWrite::PutDeadline {
            at: entry.deadline_at_ms,
            call: entry.tool_call_id.clone(),
        });
        // A root owns its own calls without an entry: the router finds them in its pending
        // entries, which saves a write on suspension and another on completion.
        if !self.owns_as_root() {
            cx.staged.index.push(IndexWrite::PutOwnership {
                root: self.record.root.clone(),
                call: entry.tool_call_id.clone(),
            });
        }
        cx.staged.index.push(IndexWrite::PutPending(entry.clone()));
        cx.push(Effect::Observe(Observation::Suspended {
            tool_call_id: entry.tool_call_id.clone(),
            tool_name: entry.tool_name.clone(),
            deadline_at_ms: entry.deadline_at_ms,
        }));
        self.pending.insert(entry);
    }

    /// Ends the step's run as suspended on its pending calls (and children), remembering the
    /// value of a `finish_with` call of the step that waits for them (`finish`).
    pub(super) fn suspend(
        &mut self,
        cx: &mut ApplyCx,
        run_id: RunId,
        finish: Option<serde_json::Value>,
    ) {
        cx.push(Effect::Hook(HookEvent::AgentSuspended {
            session: self.record.id.clone(),
            run_id,
            tool_call_ids: self.pending.ids(),
        }));
        self.record.suspension = Some(Suspension { run_id, finish });
        let status = if self.children.any_unfinished() {
            Status::SuspendedAwaitingChildren
        } else {
            Status::SuspendedClientTool
        };
        self.end_run(cx, status, None);
    }

    /// Applies a submitted answer to pending call `call_id`: the transition's verdict says
    /// what the session decided. The first accepted answer wins; an accepted answer's commit
    /// writes only the call's own entries.
    pub(super) fn submit(&mut self, cx: &mut ApplyCx, call_id: &str, submission: Submission) {
        let now = cx.now;
        let Some(entry) = self.pending.get(call_id) else {
            return cx.decide(Verdict::NotPending);
        };
        if entry.answer.is_some() || self.settled_in_step(call_id) {
            return cx.decide(Verdict::AlreadyCompleted);
        }
        if now >= entry.deadline_at_ms {
            // The deadline is authoritative: record the timeout now if the scheduler has not.
            self.timeout(cx, call_id);
            return cx.decide(Verdict::AlreadyCompleted);
        }
        let (answer, edited) = match self.check_submission(entry, submission) {
            Ok(checked) => checked,
            Err(verdict) => return cx.decide(verdict),
        };
        let wait_ms = now.saturating_sub(entry.requested_at_ms);
        let has_error = matches!(answer, Answer::Error(_) | Answer::Denied { .. });
        cx.push(Effect::Observe(Observation::Answered {
            tool_call_id: call_id.to_string(),
            wait_ms,
            has_error,
        }));
        // The outcome is reported on the stream when the resume records it: a submit writes
        // only its own entry, so concurrent submits to one session never wait on each other.
        self.record_answer(cx, call_id, answer, edited);
        if self.owes_itself_a_resume(now) {
            cx.push(Effect::AutoResume);
        }
        self.finish_entries(cx, CommitKind::Other);
        cx.decide(Verdict::Accepted);
    }

    /// Checks a submission against its call: kind binding, approval id, output schema, and
    /// for an approval with edited input, that the tool allows edits and the input fits its
    /// input schema. Answers the answer, and the edited input if any.
    fn check_submission(
        &self,
        entry: &PendingCall,
        submission: Submission,
    ) -> Result<(Answer, Option<Value>), Verdict> {
        let invalid = |reason: String| Verdict::InvalidResult {
            reason,
            errors: Vec::new(),
        };
        let (submission, question) = submission.into_parts();
        if let Some(number) = question {
            let asking = u32::try_from(entry.answers.len()).map_or(u32::MAX, |n| n + 1);
            if entry.kind != PendingKind::Input {
                return Err(invalid(format!(
                    "{} is not a tool's question: an answer for it names no question",
                    entry.tool_call_id
                )));
            }
            if number < asking {
                // That question has its answer; the tool has asked again since.
                return Err(Verdict::AlreadyCompleted);
            }
            if number > asking {
                return Err(invalid(format!(
                    "{} asks its question {asking}, not {number}",
                    entry.tool_call_id
                )));
            }
        }
        match (entry.kind, submission) {
            (PendingKind::Reconcile, Submission::Error(_)) => Err(invalid(format!(
                "{} waits for a reconciliation: an error alone does not say whether its effect happened (send kind \"reconcile\" with \"error\" if it failed)",
                entry.tool_call_id
            ))),
            (PendingKind::Input, Submission::Error(reason)) => Ok((
                Answer::Input(InputAnswer::Declined {
                    reason: Some(reason).filter(|reason| !reason.is_empty()),
                }),
                None,
            )),
            (PendingKind::Input, Submission::Result(content)) => {
                let schema = entry.request.as_ref().and_then(|request| request.schema.as_ref());
                let errors = match schema.map(crate::definition::Schema::compile) {
                    Some(Ok(schema)) => schema.errors(&content),
                    // Checked when the tool asked.
                    Some(Err(error)) => vec![error],
                    None => Vec::new(),
                };
                if errors.is_empty() {
                    Ok((Answer::Input(InputAnswer::Accepted { content }), None))
                } else {
                    Err(Verdict::InvalidResult {
                        reason: format!(
                            "the answer does not match the schema {} asked for",
                            entry.tool_name
                        ),
                        errors,
                    })
                }
            }
            (PendingKind::Input, _) => Err(invalid(format!(
                "{} waits for input a tool asked for: answer with a client-tool-result (the input) or an error (a refusal), not an approval-response or a reconciliation",
                entry.tool_call_id
            ))),
            (_, Submission::Error(error))
            | (PendingKind::Reconcile, Submission::Reconcile(Reconciled::Failed(error))) => {
                Ok((Answer::Error(error), None))
            }
            (PendingKind::Client, Submission::Result(value))
            | (PendingKind::Reconcile, Submission::Reconcile(Reconciled::Happened(value))) => {
                let schema = self
                    .agent
                    .tool(&entry.tool_name)
                    .and_then(|tool| tool.output.as_ref());
                let errors = schema
                    .map(|schema| schema.errors(&value))
                    .unwrap_or_default();
                if errors.is_empty() {
                    Ok((Answer::Result(value), None))
                } else {
                    Err(Verdict::InvalidResult {
                        reason: format!(
                            "the result does not match the output schema of {}",
                            entry.tool_name
                        ),
                        errors,
                    })
                }
            }
            (PendingKind::Reconcile, Submission::Reconcile(Reconciled::DidNotHappen)) => {
                Ok((Answer::DidNotHappen, None))
            }
            (PendingKind::Reconcile, _) => Err(invalid(format!(
                "{} waits for a reconciliation (kind \"reconcile\": did its effect happen?), not a client-tool-result or an approval-response",
                entry.tool_call_id
            ))),
            (_, Submission::Reconcile(_)) => Err(invalid(format!(
                "{} does not wait for a reconciliation: only a call a crash cut does",
                entry.tool_call_id
            ))),
            (PendingKind::Client, Submission::Approval { .. }) => Err(invalid(format!(
                "{} is a client tool call; it takes a client-tool-result, not an approval-response",
                entry.tool_call_id
            ))),
            (PendingKind::Approval, Submission::Result(_)) => Err(invalid(format!(
                "{} waits for an approval-response, not a client-tool-result",
                entry.tool_call_id
            ))),
            (
                PendingKind::Approval,
                Submission::Approval {
                    approved,
                    approval_id,
                    reason,
                    edited_input,
                    binding,
                },
            ) => {
                if let (Some(named), Some(bound)) = (&binding, &entry.binding) {
                    if named != bound {
                        return Err(Verdict::StaleApproval {
                            reason: format!(
                                "the decision was made for another request of {} (its input or its tool changed): ask the person again",
                                entry.tool_call_id
                            ),
                        });
                    }
                }
                if approval_id != entry.approval_id() {
                    return Err(invalid(format!(
                        "approval id {approval_id} does not match this call's {}",
                        entry.approval_id()
                    )));
                }
                if let Some(input) = &edited_input {
                    self.check_edit(entry, input)?;
                }
                if approved {
                    Ok((Answer::Approved, edited_input))
                } else {
                    Ok((
                        Answer::Denied {
                            reason: reason.filter(|reason| !reason.is_empty()),
                        },
                        None,
                    ))
                }
            }
            // Taken apart above.
            (_, Submission::Question { .. }) => Err(invalid(format!(
                "{} takes one answer, not an answer inside another",
                entry.tool_call_id
            ))),
        }
    }

    /// Whether an approval may carry `input` instead of the call's: its tool allows edits,
    /// and the input fits the tool's input schema.
    fn check_edit(&self, entry: &PendingCall, input: &Value) -> Result<(), Verdict> {
        let tool = self.agent.tool(&entry.tool_name);
        if !tool
            .is_some_and(|tool| matches!(tool.def.approval, crate::definition::Approval::Editable))
        {
            return Err(Verdict::InvalidResult {
                reason: format!(
                    "{} does not allow edits on approval (its approval is not Approval::Editable)",
                    entry.tool_name
                ),
                errors: Vec::new(),
            });
        }
        let errors = tool
            .and_then(|tool| tool.input.as_ref())
            .map(|schema| schema.errors(input))
            .unwrap_or_default();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Verdict::InvalidResult {
                reason: format!(
                    "the edited input does not match the input schema of {}",
                    entry.tool_name
                ),
                errors,
            })
        }
    }

    /// Stores the answer in the entry and removes its deadline; an approval with edited
    /// input keeps the call's own input beside it, and the tool runs with the edit.
    fn record_answer(
        &mut self,
        cx: &mut ApplyCx,
        call_id: &str,
        answer: Answer,
        edited: Option<Value>,
    ) {
        let Some(entry) = self.pending.get_mut(call_id) else {
            return;
        };
        if let Some(input) = edited {
            entry.original_input = Some(std::mem::replace(&mut entry.input, input));
        }
        entry.answer = Some(answer);
        entry.answered_at_ms = Some(cx.now);
        let entry = entry.clone();
        cx.staged.index.push(IndexWrite::DeleteDeadline {
            at: entry.deadline_at_ms,
            call: entry.tool_call_id.clone(),
        });
        cx.staged.index.push(IndexWrite::PutPending(entry));
    }

    /// Records that call `call_id` expired without an answer. Does nothing if it was answered
    /// (an accepted answer is never overwritten) or has not expired, so a sweep that runs twice
    /// writes one timeout.
    ///
    /// The call's result, a `client_tool_timeout` error, is recorded at once, like any outcome:
    /// its message, its `tool_end` chunk, and `on_state_change`, `on_message`, `after_tool` in
    /// that order (as the reference framework fires its hooks with the timeout payload).
    /// The entry stays, answered `TimedOut`, until the resume clears it (so a duplicate
    /// answers `already_completed` and the tombstone's retention counts from the resume); the
    /// resume records nothing more for it.
    pub(super) fn timeout(&mut self, cx: &mut ApplyCx, call_id: &str) {
        let now = cx.now;
        let Some(entry) = self.pending.get(call_id).cloned() else {
            // Not a call of this session: a look at a remote child that fell due, if any.
            return self.remote_look_due(cx, call_id);
        };
        if entry.answer.is_some() || now < entry.deadline_at_ms {
            return;
        }
        if self.settled_in_step(call_id) {
            // Its deadline goes now (the step removes it again with the entry, a delete of
            // nothing): left, the sweep would fire it again at once, for as long as the
            // step's tool runs.
            cx.staged.index.push(IndexWrite::DeleteDeadline {
                at: entry.deadline_at_ms,
                call: entry.tool_call_id.clone(),
            });
            return self.finish_entries(cx, CommitKind::Other);
        }
        self.record_answer(cx, call_id, Answer::TimedOut, None);
        cx.push(Effect::Observe(Observation::TimedOut {
            tool_call_id: entry.tool_call_id.clone(),
            lag_ms: now.saturating_sub(entry.deadline_at_ms),
        }));
        let call = ToolCall::new(
            entry.tool_call_id.clone(),
            entry.tool_name.clone(),
            entry.input.clone(),
        );
        let outcome = timeout_outcome(&entry);
        if entry.kind == PendingKind::Input {
            self.question_closed(cx, &entry.tool_name, entry.idempotency_key.clone());
        }
        self.record_result(cx, entry.run_id, call, Outcome::of(outcome));
        if self.owes_itself_a_resume(now) {
            cx.push(Effect::AutoResume);
        }
        self.finish(cx, CommitKind::Other);
    }

    /// Whether call `call_id` has its result in the step under way already: a resume drained
    /// it (an answer, or the timeout of a call that expired unswept) while an approved tool of
    /// the step still runs. Its entry stays, as it is stored, until the step records the
    /// result; neither the sweep nor a late answer meanwhile records another.
    fn settled_in_step(&self, call_id: &str) -> bool {
        let Phase::AwaitingTools { calls, .. } = &self.phase else {
            return false;
        };
        calls
            .iter()
            .any(|step| step.call.id == call_id && matches!(step.slot, CallSlot::Ready { .. }))
    }

    /// Forgets an answer whose commit failed: the call waits again (its deadline entry was
    /// never removed, since that removal was part of the failed commit), with its own input
    /// again if the answer was an approval that edited it.
    pub(super) fn revert_answer(&mut self, call_id: &str) {
        if let Some(entry) = self.pending.get_mut(call_id) {
            entry.answer = None;
            entry.answered_at_ms = None;
            // An approval's entry holds its call's own input until an answer edits it (a
            // reconciliation or a question after the approval keeps that approval's edit).
            if entry.kind == PendingKind::Approval {
                if let Some(original) = entry.original_input.take() {
                    entry.input = original;
                }
            }
        }
    }

    /// Removes the calls that match `which` (entries, deadlines, ownership), without tombstones:
    /// a late submit for them answers `unknown_tool_call`. Returns how many were unanswered.
    pub(super) fn drop_pending(
        &mut self,
        cx: &mut ApplyCx,
        which: impl Fn(&PendingCall) -> bool,
    ) -> usize {
        let dropped = self.pending.take_where(which);
        let unanswered = dropped
            .iter()
            .filter(|call| call.is_waiting(cx.now))
            .count();
        for call in dropped {
            self.unindex(cx, &call);
        }
        unanswered
    }

    /// Stages the removal of a call's entry, deadline (if still armed) and ownership.
    pub(super) fn unindex(&self, cx: &mut ApplyCx, call: &PendingCall) {
        // A timeout told the tool when it was recorded.
        if call.kind == PendingKind::Input && call.answer != Some(Answer::TimedOut) {
            self.question_closed(cx, &call.tool_name, call.idempotency_key.clone());
        }
        if call.answer.is_none() {
            cx.staged.index.push(IndexWrite::DeleteDeadline {
                at: call.deadline_at_ms,
                call: call.tool_call_id.clone(),
            });
        }
        cx.staged
            .index
            .push(IndexWrite::DeletePending(call.tool_call_id.clone()));
        if !self.owns_as_root() {
            cx.staged.index.push(IndexWrite::DeleteOwnership {
                root: self.record.root.clone(),
                call: call.tool_call_id.clone(),
                owner: self.record.id.clone(),
            });
        }
    }

    /// Tells the tool (after the commit) that a question of its call `key` is closed. An
    /// entry without a key was written before questions carried one, by an earlier process:
    /// nothing can be held for it.
    pub(super) fn question_closed(&self, cx: &mut ApplyCx, tool: &str, key: Option<String>) {
        if let Some(idempotency_key) = key {
            cx.push(Effect::QuestionClosed {
                agent: std::sync::Arc::clone(&self.agent),
                tool: tool.to_string(),
                idempotency_key,
            });
        }
    }

    /// A question `call` asked in the step that is being settled or cut, which never became
    /// an entry (an entry that goes tells the tool as it goes); a server call still running
    /// may have asked one too. Told to the tool: nobody will answer.
    pub(super) fn close_unwritten_question(&self, cx: &mut ApplyCx, call: &ToolCall) {
        let server_tool = matches!(
            self.agent.tool(&call.name).map(|tool| &tool.def.kind),
            Some(ToolKind::Server(_))
        );
        if server_tool && self.pending.get(&call.id).is_none() {
            let key = self.idempotency_key(&call.id);
            self.question_closed(cx, &call.name, Some(key));
        }
    }

    /// Whether this session is its own root, so its calls need no ownership entry.
    fn owns_as_root(&self) -> bool {
        self.record.root == self.record.id
    }
}

/// The tool outcome an answered entry stands for (none for an approval, whose tool has yet to
/// run).
pub(crate) fn answer_outcome(entry: &PendingCall) -> Option<ToolOutcome> {
    match entry.answer.as_ref()? {
        Answer::Result(value) => Some(ToolOutcome::Result(value.clone())),
        Answer::Error(error) => Some(ToolOutcome::Error(error.clone())),
        Answer::Approved | Answer::DidNotHappen | Answer::Input(_) => None,
        Answer::Denied {
            reason: Some(reason),
        } => Some(ToolOutcome::Error(format!(
            "{NOT_APPROVED} (reason: {reason})"
        ))),
        Answer::Denied { reason: None } => Some(ToolOutcome::Error(NOT_APPROVED.into())),
        Answer::TimedOut => Some(timeout_outcome(entry)),
    }
}

/// The result of a reconcile call that ends without an answer (`why`): its effect is as
/// unknown as when the crash cut it, so it is the durability error, with the key to look the
/// effect up by.
pub(crate) fn unreconciled(entry: &PendingCall, why: &str) -> ToolOutcome {
    ToolErrorCode::ToolDurabilityError
        .with(format_args!(
            "the process stopped while {} (call {}) was running, and {why}, so it was not run again: check whether its effect happened (idempotency key {}) before calling it again.",
            entry.tool_name,
            entry.tool_call_id,
            entry.idempotency_key.as_deref().unwrap_or("unknown"),
        ))
        .into()
}

/// The result of a call whose deadline passed without an answer. For a reconciliation nobody
/// said whether the effect happened, so the call ends as any cut call does by default.
pub(crate) fn timeout_outcome(entry: &PendingCall) -> ToolOutcome {
    if entry.kind == PendingKind::Reconcile {
        let waited = entry.deadline_at_ms.saturating_sub(entry.requested_at_ms);
        return unreconciled(
            entry,
            &format!("nobody said within {waited} ms whether it took effect"),
        );
    }
    if entry.kind == PendingKind::Input {
        return ToolErrorCode::ClientToolTimeout
            .with(format_args!(
                "nobody answered the question {} asked within {} ms",
                entry.tool_name,
                entry.deadline_at_ms.saturating_sub(entry.requested_at_ms)
            ))
            .into();
    }
    ToolErrorCode::ClientToolTimeout
        .with(format_args!(
            "no answer for {} arrived within {} ms",
            entry.tool_name,
            entry.deadline_at_ms.saturating_sub(entry.requested_at_ms)
        ))
        .into()
}
