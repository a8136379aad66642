//! The agent loop: a new run, each step's model call, the dispatch of its tool calls, and the
//! commit of their results.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::apply_cx::ApplyCx;
use super::core::{CallSlot, Outcome, Phase, Session, StepCall};
use super::FinishedCall;
use super::{ChildState, Effect, ErrorCode, PendingKind, RunError, Status};
use crate::definition::{Approval, ToolKind, FINISH_TOOL};
use crate::error::Error;
use crate::llm::{LlmError, ModelReply, ModelRequest};
use crate::remote::RemoteParent;
use crate::store::CommitKind;
use crate::types::hooks::HookEvent;
use crate::types::ids::RunId;
use crate::types::message::{Message, ToolCall, ToolOutcome};
use crate::types::nesting;
use crate::types::stream::ChunkKind;
use crate::types::tool_error::ToolErrorCode;

/// Who starts a turn from outside, and on what terms (see [`super::Input::Execute`]).
pub(super) struct Outside {
    /// The agent the caller asked for.
    pub(super) agent: String,
    /// Only if the session does not exist yet.
    pub(super) new_only: bool,
    /// The parent on another server that starts it as its remote child.
    pub(super) remote_parent: Option<RemoteParent>,
}

impl Session {
    /// A user message from outside. A start only for a new session finds one that exists
    /// refused; a new remote child records its parent on the other server before its first
    /// turn. Only a session's parent starts a sub-agent's turns (its bookkeeping of the child
    /// would not see one started from outside), and a session runs the agent it was created
    /// with.
    pub(super) fn execute_from_outside(
        &mut self,
        cx: &mut ApplyCx,
        run_id: RunId,
        text: String,
        outside: Outside,
    ) -> Result<(), Error> {
        // A session that exists has run: its first commit is its first run's.
        let exists = self.record.run_count > 0;
        if outside.new_only && exists {
            return Err(Error::SessionExists(self.record.id.clone()));
        }
        if let (Some(parent), false) = (outside.remote_parent, exists) {
            self.record.remote_parent = Some(parent);
        }
        let agent = outside.agent.as_str();
        if let Some(parent) = &self.record.parent {
            return Err(Error::SubAgentSession {
                session: self.record.id.clone(),
                parent: parent.clone(),
            });
        }
        // A remote child's first turn is the start its parent sent, which created it; any
        // later one would come from outside, as for a local child.
        if let (Some(outside), true) = (&self.record.remote_parent, self.record.run_count > 0) {
            return Err(Error::SubAgentSession {
                session: self.record.id.clone(),
                parent: outside.parent.clone(),
            });
        }
        if self.agent.name() != agent {
            return Err(Error::AgentMismatch {
                session: self.record.id.clone(),
                actual: self.agent.name().to_string(),
                requested: agent.to_string(),
            });
        }
        self.execute(cx, run_id, text)
    }

    pub(super) fn execute(
        &mut self,
        cx: &mut ApplyCx,
        run_id: RunId,
        text: String,
    ) -> Result<(), Error> {
        if self.record.aborted {
            return Err(Error::Aborted(self.record.id.clone()));
        }
        if self.record.status == Status::Running {
            return Err(Error::AlreadyRunning(self.record.id.clone()));
        }
        self.abandon_pending(cx);
        self.close_dangling_calls(cx);
        self.record.steps_in_run = 0;
        self.record.interrupt_requested = false;
        self.start_run(cx, run_id, None);
        let message = Message::User { text };
        self.stage_message(cx, message.clone());
        cx.push(self.on_message(run_id, message));
        self.begin_step(cx, run_id);
        self.finish(cx, CommitKind::RunStart);
        Ok(())
    }

    /// The top of a step: honour an interrupt or abort, enforce the step limit, ask the model.
    pub(super) fn begin_step(&mut self, cx: &mut ApplyCx, run_id: RunId) {
        if self.record.aborted {
            let error = RunError {
                code: ErrorCode::Aborted,
                message: "aborted: the session was aborted".into(),
            };
            self.end_run(cx, Status::Failed, Some(error));
            return;
        }
        if self.record.interrupt_requested {
            self.record.interrupt_requested = false;
            let error = RunError {
                code: ErrorCode::Interrupted,
                message: "interrupted by request".into(),
            };
            self.end_run(cx, Status::Interrupted, Some(error));
            return;
        }
        let max_steps = self.agent.max_steps();
        if self.record.steps_in_run >= max_steps {
            let error = RunError {
                code: ErrorCode::MaxSteps,
                message: format!("max_steps: the run used all {max_steps} of its steps"),
            };
            self.end_run(cx, Status::Failed, Some(error));
            return;
        }
        self.record.steps_in_run += 1;
        let step = self.record.steps_in_run;
        if let Some(run) = &mut self.run {
            run.steps += 1;
        }
        self.phase = Phase::AwaitingModel { run_id, step };
        let messages = self.messages.get_or_insert_with(Arc::default);
        cx.push(Effect::CallModel {
            run_id,
            step,
            // Nothing is staged after the model is asked for: these are the chunks the commit
            // leaves recorded.
            after_seq: self.record.chunk_count,
            request: ModelRequest {
                session_id: self.record.id.clone(),
                agent: self.agent.name().to_string(),
                system_prompt: self.agent.system_prompt().to_string(),
                messages: Arc::clone(messages),
                tools: self.agent.tool_specs(),
                settings: self.agent.model_settings(),
                deltas: crate::llm::DeltaSink::discard(),
            },
            skills: self
                .agent
                .skills()
                .map(|provider| crate::skills::PromptSkills {
                    provider: Arc::clone(provider),
                    preload: self.agent.preload_skills_shared(),
                    last: Arc::clone(self.agent.skill_section()),
                }),
        });
    }

    pub(super) fn model_replied(
        &mut self,
        cx: &mut ApplyCx,
        run_id: RunId,
        step: u32,
        reply: Result<ModelReply, LlmError>,
    ) {
        if !matches!(self.phase, Phase::AwaitingModel { run_id: r, step: s } if r == run_id && s == step)
        {
            // A late answer for a run that has since ended (or a previous incarnation's).
            return;
        }
        self.phase = Phase::Idle;
        let reply = reply.and_then(|reply| self.bounded_reply(reply));
        if let Some(run) = &mut self.run {
            let (usage, success) = match &reply {
                Ok(reply) => (reply.usage, true),
                Err(_) => (None, false),
            };
            run.usage.record_model(step, usage, success);
            cx.staged.run_changed = true;
        }
        let mut reply = match reply {
            Ok(reply) => reply,
            Err(error) => {
                let code = match error {
                    LlmError::ScriptExhausted { .. } => ErrorCode::ScriptExhausted,
                    LlmError::RateLimited(_) => ErrorCode::RateLimited,
                    LlmError::ContextLengthExceeded(_) => ErrorCode::ContextLengthExceeded,
                    LlmError::Auth(_) => ErrorCode::Auth,
                    LlmError::Provider(_) => ErrorCode::ModelError,
                };
                let error = RunError {
                    code,
                    message: error.to_string(),
                };
                self.end_run(cx, Status::Failed, Some(error));
                return self.finish(cx, CommitKind::RunEnd);
            }
        };
        // Before anything records a call: from here on each call's id is unique.
        self.assign_call_ids(cx, &mut reply.tool_calls);
        if let Some(text) = &reply.text {
            self.stage_chunk(cx, run_id, ChunkKind::Text { text: text.clone() });
            if let Some(run) = &mut self.run {
                run.text = Some(text.clone());
            }
        }
        let message = Message::Assistant {
            text: reply.text,
            tool_calls: reply.tool_calls.clone(),
        };
        self.stage_message(cx, message.clone());
        cx.push(self.on_message(run_id, message));
        let calls = reply.tool_calls;
        if calls.is_empty() {
            self.end_run(cx, Status::Completed, None);
            return self.finish(cx, CommitKind::RunEnd);
        }
        let mut step_calls = Vec::with_capacity(calls.len());
        for call in calls {
            self.stage_chunk(
                cx,
                run_id,
                ChunkKind::ToolStart {
                    tool_call_id: call.id.clone(),
                    tool_name: call.name.clone(),
                    input: call.input.clone(),
                },
            );
            let slot = self.classify(&call);
            // Every call gets the whole hook sequence, even one answered on the spot.
            cx.push(Effect::Hook(HookEvent::BeforeTool {
                session: self.record.id.clone(),
                run_id,
                call: call.clone(),
            }));
            step_calls.push(StepCall::new(call, slot));
        }
        // With nothing to run between commit #1 and commit #2, one commit carries both.
        self.dispatch(cx, CommitKind::ToolCalls, run_id, step_calls);
    }

    /// Decides how a call is carried out: run by the runtime, made pending, or answered at once
    /// with an error the model can act on.
    pub(super) fn classify(&self, call: &ToolCall) -> CallSlot {
        if call.name == FINISH_TOOL && self.agent.output().is_some() {
            return CallSlot::Dispatched;
        }
        if self.is_companion_call(call) {
            return CallSlot::Companion;
        }
        let Some(tool) = self.agent.tool(&call.name) else {
            return CallSlot::failed(ToolErrorCode::UnknownTool.with(format_args!(
                "agent {} has no tool named {}",
                self.agent.name(),
                call.name
            )));
        };
        if let Some(schema) = &tool.input {
            let errors = schema.errors(&call.input);
            if !errors.is_empty() {
                return CallSlot::failed(ToolErrorCode::InvalidInput.with(errors.join("; ")));
            }
        }
        match &tool.def.kind {
            ToolKind::Client { .. } => CallSlot::Pending(PendingKind::Client),
            ToolKind::Server(_) if needs_approval(&tool.def.approval, &call.input) => {
                CallSlot::Pending(PendingKind::Approval)
            }
            ToolKind::Server(_) => CallSlot::Dispatched,
            ToolKind::SubAgent { .. } | ToolKind::RemoteSubAgent { .. } => {
                self.classify_child(call)
            }
        }
    }

    /// Whether running the call's tool twice is declared harmless.
    pub(super) fn safe_to_retry(&self, call: &ToolCall) -> bool {
        self.agent
            .tool(&call.name)
            .is_some_and(|tool| tool.def.safe_to_retry)
    }

    pub(super) fn finishes_run(&self, call: &ToolCall) -> bool {
        (call.name == FINISH_TOOL && self.agent.output().is_some())
            || self
                .agent
                .tool(&call.name)
                .is_some_and(|tool| tool.def.finish_with)
    }

    pub(super) fn tools_finished(
        &mut self,
        cx: &mut ApplyCx,
        run_id: RunId,
        step: u32,
        outcomes: Vec<FinishedCall>,
    ) {
        let current = match &self.phase {
            Phase::AwaitingTools {
                run_id: r,
                step: s,
                tools_running,
                ..
            } => *r == run_id && *s == step && *tools_running,
            _ => false,
        };
        if !current {
            // A late answer for a step that has since ended (an interrupt or abort cut it):
            // a question one of its calls asked has nobody to answer it.
            for finished in outcomes {
                if let Some(asked) = finished.asked {
                    self.question_closed(cx, &asked.tool, Some(asked.idempotency_key));
                }
            }
            return;
        }
        let Phase::AwaitingTools {
            calls,
            tools_running,
            ..
        } = &mut self.phase
        else {
            return;
        };
        *tools_running = false;
        for finished in outcomes {
            let dispatched = calls.iter_mut().find(|step_call| {
                step_call.call.id == finished.tool_call_id
                    && matches!(step_call.slot, CallSlot::Dispatched | CallSlot::Checking)
            });
            if let Some(step_call) = dispatched {
                if finished.unsettled {
                    step_call.slot = CallSlot::Pending(PendingKind::Reconcile);
                    continue;
                }
                if let Some(asked) = finished.asked {
                    step_call.slot = CallSlot::Pending(PendingKind::Input);
                    step_call.asked = Some(asked.request);
                    continue;
                }
                let limit = self.policy.max_json_depth;
                let (outcome, changes) =
                    bounded_result(&step_call.call, finished.outcome, finished.updates, limit);
                step_call.slot = CallSlot::Ready {
                    outcome,
                    reported: false,
                };
                step_call.changes = changes;
            }
        }
        self.settle_if_ready(cx);
        self.finish(cx, CommitKind::ToolResults);
    }

    /// Settles the step in progress once its server tools have returned and each of its
    /// children has finished or suspended. Returns whether it settled.
    pub(super) fn settle_if_ready(&mut self, cx: &mut ApplyCx) -> bool {
        let ready = match &self.phase {
            Phase::AwaitingTools {
                calls,
                tools_running,
                ..
            } => {
                !*tools_running
                    && calls.iter().all(|step_call| {
                        !matches!(step_call.slot, CallSlot::Child)
                            || self
                                .children
                                .get(&step_call.call.id)
                                .is_none_or(|entry| entry.state != ChildState::Running)
                    })
            }
            _ => false,
        };
        if !ready {
            return false;
        }
        let Phase::AwaitingTools {
            run_id, mut calls, ..
        } = std::mem::replace(&mut self.phase, Phase::Idle)
        else {
            return false;
        };
        for step_call in &mut calls {
            let finished = matches!(step_call.slot, CallSlot::Child)
                && self
                    .children
                    .get(&step_call.call.id)
                    .is_none_or(|entry| entry.state.is_finished());
            if finished {
                step_call.slot = CallSlot::Ready {
                    outcome: self.adopt_child(cx, run_id, &step_call.call.id),
                    reported: false,
                };
            }
        }
        self.settle_step(cx, run_id, calls);
        true
    }

    /// Sends the step's server calls (its `Dispatched` slots: `finish_with` ones in order after
    /// the others) to the tool task and starts its children; when nothing is to run (only
    /// client calls, approvals and refusals), the step settles in this same commit.
    pub(super) fn dispatch(
        &mut self,
        cx: &mut ApplyCx,
        kind: CommitKind,
        run_id: RunId,
        mut calls: Vec<StepCall>,
    ) {
        // The step in progress (a resume goes on with the step its run was suspended in).
        let step = self.record.steps_in_run;
        let (sequential, parallel): (Vec<ToolCall>, Vec<ToolCall>) = calls
            .iter()
            .filter(|step_call| matches!(step_call.slot, CallSlot::Dispatched | CallSlot::Checking))
            .map(|step_call| step_call.call.clone())
            .partition(|call| self.finishes_run(call));
        let checks = calls
            .iter()
            .filter(|step_call| matches!(step_call.slot, CallSlot::Checking))
            .map(|step_call| step_call.call.id.clone())
            .collect();
        let answers = calls
            .iter()
            .filter(|step_call| matches!(step_call.slot, CallSlot::Dispatched | CallSlot::Checking))
            .filter_map(|step_call| {
                let answers = self.pending.get(&step_call.call.id)?.all_answers();
                (!answers.is_empty()).then(|| (step_call.call.id.clone(), answers.into()))
            })
            .collect();
        // Companion calls have their own phase, in call order, before the children start.
        for (position, step_call) in calls.iter_mut().enumerate() {
            match step_call.slot {
                CallSlot::Companion => {
                    step_call.slot = self.companion_call(cx, run_id, &step_call.call, position);
                }
                CallSlot::Child => self.launch_child(cx, run_id, &step_call.call, position),
                _ => {}
            }
        }
        let tools_running = !(parallel.is_empty() && sequential.is_empty());
        if tools_running {
            cx.push(Effect::RunTools {
                agent: Arc::clone(&self.agent),
                run_id,
                step,
                parallel,
                sequential,
                state: Arc::new(Value::Object(self.record.custom_state.clone())),
                reply_seq: self.reply_seq(),
                checks,
                answers,
            });
        }
        self.phase = Phase::AwaitingTools {
            run_id,
            step,
            calls,
            tools_running,
        };
        self.settle_if_ready(cx);
        self.finish(cx, kind);
    }

    /// Records every call of a step whose outcomes are known (or that became pending), then
    /// ends the run, suspends it, or begins the next step.
    pub(super) fn settle_step(&mut self, cx: &mut ApplyCx, run_id: RunId, calls: Vec<StepCall>) {
        let finisher = calls.iter().position(|step_call| {
            self.finishes_run(&step_call.call)
                && matches!(
                    step_call.slot,
                    CallSlot::Ready {
                        outcome: ToolOutcome::Result(_),
                        ..
                    }
                )
        });
        // A resume that drained the children a finisher's step waited for: the run completes
        // with the finisher's value.
        let mut output = self.finishing.take();
        let mut pending = 0u32;
        for (
            index,
            StepCall {
                call,
                slot,
                changes,
                asked,
            },
        ) in calls.into_iter().enumerate()
        {
            let (outcome, reported) = match slot {
                CallSlot::Ready { outcome, reported } => (outcome, reported),
                // A cut call whose effect is unknown is never "skipped": that says it did not
                // run.
                CallSlot::Pending(PendingKind::Reconcile) if finisher.is_some() => (
                    ToolErrorCode::ToolDurabilityError
                        .with(format_args!(
                            "the process stopped while {} (call {}) was running, and another call of its step finished the run, so it was not run again: check whether its effect happened (idempotency key {}) before calling it again.",
                            call.name,
                            call.id,
                            self.idempotency_key(&call.id)
                        ))
                        .into(),
                    false,
                ),
                // It ran, and waits for a person: it is cut, not skipped.
                CallSlot::Pending(PendingKind::Input) if finisher.is_some() => {
                    self.close_unwritten_question(cx, &call);
                    (
                        ToolErrorCode::Interrupted
                            .with(format_args!(
                                "{} asked for input, and another call of its step finished the run, so the question was dropped: the call may have acted before it asked",
                                call.name
                            ))
                            .into(),
                        false,
                    )
                }
                CallSlot::Pending(_) if finisher.is_some() => (
                    ToolErrorCode::Skipped
                        .with("another call in this step already finished the run")
                        .into(),
                    false,
                ),
                CallSlot::Pending(kind) => {
                    let position = u32::try_from(index).unwrap_or(u32::MAX);
                    self.make_pending(cx, run_id, call, kind, position, asked);
                    pending += 1;
                    continue;
                }
                CallSlot::Dispatched | CallSlot::Checking | CallSlot::Companion => (
                    ToolErrorCode::ToolNotRun
                        .with("the runtime lost this call's outcome")
                        .into(),
                    false,
                ),
                // A child that waits on a person: the run suspends on it, even when another
                // call finished the run (seed 001: sub-agents always execute, completion waits
                // for them; the run completes with the finisher's value once they finish). A
                // companion's wait ends there instead: the companion outlives the call.
                CallSlot::Child
                    if finisher.is_some()
                        && self
                            .children
                            .get(&call.id)
                            .is_some_and(|entry| entry.companion.is_some()) =>
                {
                    (self.adopt_child(cx, run_id, &call.id), false)
                }
                CallSlot::Child => {
                    pending += 1;
                    continue;
                }
            };
            if Some(index) == finisher {
                if let ToolOutcome::Result(value) = &outcome {
                    output = Some(value.clone());
                }
            }
            let outcome = Outcome {
                value: outcome,
                reported,
                changes,
            };
            self.record_outcome(cx, run_id, call, outcome);
        }
        if let (Some(value), true) = (&output, pending > 0) {
            self.suspend(cx, run_id, Some(value.clone()));
        } else if let Some(value) = output {
            if let Some(run) = &mut self.run {
                run.output = Some(value);
            }
            self.end_run(cx, Status::Completed, None);
        } else if pending > 0 {
            self.suspend(cx, run_id, None);
        } else {
            self.begin_step(cx, run_id);
        }
    }

    /// Records one call's outcome (see [`Session::record_result`]), and with it clears the
    /// call's pending entry, if it has one: an approved tool's, or a drained answer's, which
    /// stays until its result is recorded so that a crash in between finds it.
    pub(super) fn record_outcome(
        &mut self,
        cx: &mut ApplyCx,
        run_id: RunId,
        call: ToolCall,
        outcome: Outcome,
    ) {
        let entry = self.pending.remove(&call.id);
        self.record_result(cx, run_id, call, outcome);
        if let Some(entry) = entry {
            self.complete(cx, &entry);
        }
    }

    /// Records one call's result: the tool message, the custom-state changes, and, unless it
    /// was reported already, its `tool_end` chunk and the hooks in their documented order.
    pub(super) fn record_result(
        &mut self,
        cx: &mut ApplyCx,
        run_id: RunId,
        call: ToolCall,
        outcome: Outcome,
    ) {
        let Outcome {
            value: outcome,
            reported,
            changes,
        } = outcome;
        for (key, value) in &changes {
            self.record.custom_state.insert(key.clone(), value.clone());
        }
        if let Some(run) = &mut self.run {
            // Written with this commit: a timeout recorded while the run is suspended is the
            // last write its run record gets (a resume starts a new run).
            run.usage
                .record_tool(&call.id, &call.name, !outcome.is_error());
            cx.staged.run_changed = true;
        }
        let message = Message::Tool {
            tool_call_id: call.id.clone(),
            tool_name: call.name.clone(),
            outcome: outcome.clone(),
        };
        self.stage_message(cx, message.clone());
        if reported {
            return;
        }
        self.stage_chunk(
            cx,
            run_id,
            ChunkKind::ToolEnd {
                tool_call_id: call.id.clone(),
                tool_name: call.name.clone(),
                outcome: outcome.clone(),
            },
        );
        if let Some(name) = loaded_skill(&call, &outcome) {
            let tool_call_id = call.id.clone();
            self.stage_chunk(cx, run_id, ChunkKind::SkillLoaded { tool_call_id, name });
        }
        cx.push(Effect::Hook(HookEvent::OnStateChange {
            session: self.record.id.clone(),
            run_id,
            tool_call_id: call.id.clone(),
            updates: changes,
        }));
        cx.push(self.on_message(run_id, message));
        cx.push(Effect::Hook(HookEvent::AfterTool {
            session: self.record.id.clone(),
            run_id,
            tool_call_id: call.id,
            tool_name: call.name,
            outcome,
        }));
    }
}

impl Session {
    /// A reply whose tool-call input nests deeper than the runtime allows is refused whole
    /// (nothing of it is stored): stored, it could not be read back.
    fn bounded_reply(&self, reply: ModelReply) -> Result<ModelReply, LlmError> {
        let limit = self.policy.max_json_depth;
        let Some(call) = reply
            .tool_calls
            .iter()
            .find(|call| nesting::exceeds(&call.input, limit))
        else {
            return Ok(reply);
        };
        let error = LlmError::Provider(format!(
            "the input of tool call {} ({}) nests deeper than {limit} arrays and objects (the runtime's max_json_depth); the reply was not recorded",
            call.id, call.name
        ));
        for call in reply.tool_calls {
            nesting::dismantle(call.input);
        }
        Err(error)
    }
}

/// A tool's result or state changes that nest deeper than `limit` are not stored: the call's
/// result is the error `invalid_output` instead.
fn bounded_result(
    call: &ToolCall,
    outcome: ToolOutcome,
    changes: Map<String, Value>,
    limit: usize,
) -> (ToolOutcome, Map<String, Value>) {
    let too_deep = matches!(&outcome, ToolOutcome::Result(value) if nesting::exceeds(value, limit))
        || changes.values().any(|value| nesting::exceeds(value, limit));
    if !too_deep {
        return (outcome, changes);
    }
    if let ToolOutcome::Result(value) = outcome {
        nesting::dismantle(value);
    }
    for (_, value) in changes {
        nesting::dismantle(value);
    }
    let error = ToolErrorCode::InvalidOutput.with(format_args!(
        "the result of {} nests deeper than {limit} arrays and objects (the runtime's max_json_depth), so it was not kept",
        call.name
    ));
    (error.into(), Map::new())
}

/// The skill a successful `load_skill` call loaded.
fn loaded_skill(call: &ToolCall, outcome: &ToolOutcome) -> Option<String> {
    if call.name != crate::skills::LOAD_SKILL || outcome.is_error() {
        return None;
    }
    call.input.get("name")?.as_str().map(str::to_string)
}

/// Evaluates an approval rule; a predicate that errs or panics requires approval (fail closed).
fn needs_approval(approval: &Approval, input: &Value) -> bool {
    match approval {
        Approval::Never => false,
        Approval::Always | Approval::Editable => true,
        Approval::When(predicate) => {
            match std::panic::catch_unwind(AssertUnwindSafe(|| predicate(input))) {
                Ok(Ok(required)) => required,
                Ok(Err(_)) | Err(_) => true,
            }
        }
    }
}
