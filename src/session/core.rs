//! The session state machine.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::{
    Effect, ErrorCode, RunError, RunOutcome, RunRecord, SessionRecord, Status, Transition,
};
use crate::definition::{AgentDefinition, ToolKind, FINISH_TOOL};
use crate::error::Error;
use crate::hooks::HookEvent;
use crate::ids::{RunId, SessionId};
use crate::llm::{LlmError, ModelReply, ModelRequest};
use crate::message::{Message, ToolCall, ToolOutcome};
use crate::schema::Commit;
use crate::store::CommitKind;
use crate::stream::{Chunk, ChunkKind};

/// An input to the state machine.
#[derive(Debug)]
pub(crate) enum Input {
    /// A user message: a new session's first run, or a new turn.
    Execute { run_id: RunId, message: String },
    /// The model answered a step.
    ModelReplied {
        run_id: RunId,
        step: u32,
        reply: Result<ModelReply, LlmError>,
    },
    /// The server tools of a step finished.
    ToolsFinished {
        run_id: RunId,
        step: u32,
        outcomes: Vec<FinishedCall>,
    },
}

/// One tool call's outcome, with the custom-state keys its handler set.
#[derive(Debug, Clone)]
pub(crate) struct FinishedCall {
    pub(crate) tool_call_id: String,
    pub(crate) outcome: ToolOutcome,
    pub(crate) updates: Map<String, Value>,
}

/// Where the run is between inputs (in memory only: a crash here is recovered from the
/// durable record, see [`Session::recover_after_crash`]).
#[derive(Debug)]
enum Phase {
    Idle,
    AwaitingModel {
        run_id: RunId,
        step: u32,
    },
    AwaitingTools {
        run_id: RunId,
        step: u32,
        calls: Vec<ToolCall>,
        /// Outcomes known without running anything (unknown tool, invalid input), by index.
        ready: Vec<Option<ToolOutcome>>,
    },
}

/// How a tool call of a step is carried out.
enum Dispatch {
    Parallel,
    Sequential,
    Immediate(ToolOutcome),
}

/// Writes gathered while applying one input; they become the transition's commit.
#[derive(Debug, Default)]
struct Staged {
    messages: Vec<(u64, Message)>,
    chunks: Vec<Chunk>,
    run_changed: bool,
}

/// A session in memory: its durable record, its current run, and its conversation while a run
/// is in progress.
#[derive(Debug)]
pub(crate) struct Session {
    pub(super) record: SessionRecord,
    agent: Arc<AgentDefinition>,
    pub(super) run: Option<RunRecord>,
    /// Loaded for a run and released when it settles, so idle sessions stay small. Shared with
    /// the model call in flight; `Arc::make_mut` copies only if that call still holds it.
    pub(super) messages: Option<Arc<Vec<Message>>>,
    phase: Phase,
    staged: Staged,
}

impl Session {
    /// A session that does not exist yet; its first `Execute` creates it.
    pub(crate) fn create(id: SessionId, agent: Arc<AgentDefinition>, now: u64) -> Self {
        let record = SessionRecord {
            root: id.clone(),
            id,
            agent: agent.name().to_string(),
            // Not stored until the first Execute sets it running.
            status: Status::Completed,
            parent: None,
            created_at_ms: now,
            updated_at_ms: now,
            message_count: 0,
            chunk_count: 0,
            run_count: 0,
            current_run: None,
            steps_in_run: 0,
            custom_state: Map::new(),
            interrupt_requested: false,
        };
        Self {
            record,
            agent,
            run: None,
            messages: Some(Arc::new(Vec::new())),
            phase: Phase::Idle,
            staged: Staged::default(),
        }
    }

    /// A session read back from the store.
    pub(crate) fn restore(
        record: SessionRecord,
        agent: Arc<AgentDefinition>,
        run: Option<RunRecord>,
    ) -> Self {
        Self {
            record,
            agent,
            run,
            messages: None,
            phase: Phase::Idle,
            staged: Staged::default(),
        }
    }

    pub(crate) fn agent(&self) -> &Arc<AgentDefinition> {
        &self.agent
    }

    /// Whether work is in flight (a model call or tools), so the actor must stay resident.
    pub(crate) fn is_busy(&self) -> bool {
        !matches!(self.phase, Phase::Idle)
    }

    /// Whether the conversation must be loaded before the next run.
    pub(crate) fn needs_messages(&self) -> bool {
        self.messages.is_none()
    }

    pub(crate) fn attach_messages(&mut self, messages: Vec<Message>) {
        self.messages = Some(Arc::new(messages));
    }

    /// Drops the conversation from memory; it is durable and reloaded for the next run.
    pub(crate) fn release_messages(&mut self) {
        if !self.is_busy() {
            self.messages = None;
        }
    }

    /// A session found `Running` on activation was cut by a crash (no live actor ran it): its
    /// run is closed as interrupted, and a later `resume` or message goes on from there.
    pub(crate) fn recover_after_crash(&mut self, now: u64) -> Option<Transition> {
        if self.record.status != Status::Running {
            return None;
        }
        let mut effects = Vec::new();
        self.end_run(
            Status::Interrupted,
            Some(RunError {
                code: ErrorCode::Crashed,
                message: "the process stopped while this run was in progress".into(),
            }),
            now,
            &mut effects,
        );
        // Nobody waits for a run of a previous process.
        effects.retain(|effect| !matches!(effect, Effect::Settle(_)));
        Some(self.finish(CommitKind::RunEnd, now, effects))
    }

    /// Applies one input at time `now`.
    ///
    /// # Errors
    /// A refusal that changes nothing (a second `Execute` while running).
    pub(crate) fn apply(&mut self, input: Input, now: u64) -> Result<Transition, Error> {
        match input {
            Input::Execute { run_id, message } => self.execute(run_id, message, now),
            Input::ModelReplied {
                run_id,
                step,
                reply,
            } => Ok(self.model_replied(run_id, step, reply, now)),
            Input::ToolsFinished {
                run_id,
                step,
                outcomes,
            } => Ok(self.tools_finished(run_id, step, outcomes, now)),
        }
    }

    fn execute(&mut self, run_id: RunId, text: String, now: u64) -> Result<Transition, Error> {
        if self.record.status == Status::Running {
            return Err(Error::AlreadyRunning(self.record.id.clone()));
        }
        let mut effects = Vec::new();
        self.close_dangling_calls();
        let turn = self.record.run_count + 1;
        self.record.run_count = turn;
        self.record.current_run = Some(run_id);
        self.record.status = Status::Running;
        self.record.steps_in_run = 0;
        self.record.interrupt_requested = false;
        self.run = Some(RunRecord {
            run_id,
            turn,
            previous_run_id: None,
            status: Status::Running,
            started_at_ms: now,
            ended_at_ms: None,
            steps: 0,
            text: None,
            output: None,
            error: None,
        });
        self.staged.run_changed = true;
        self.stage_chunk(run_id, now, ChunkKind::RunStart { turn });
        let message = Message::User { text };
        self.stage_message(message.clone());
        effects.push(self.on_message(run_id, message));
        self.begin_step(run_id, now, &mut effects);
        Ok(self.finish(CommitKind::RunStart, now, effects))
    }

    /// A new turn must not show the model a tool call without its result: calls a crash left
    /// unanswered are closed with an error first.
    fn close_dangling_calls(&mut self) {
        let Some(messages) = &self.messages else {
            return;
        };
        let Some(last_assistant) = messages
            .iter()
            .rposition(|message| matches!(message, Message::Assistant { .. }))
        else {
            return;
        };
        let Some(Message::Assistant { tool_calls, .. }) = messages.get(last_assistant) else {
            return;
        };
        let answered: Vec<&str> = messages[last_assistant..]
            .iter()
            .filter_map(|message| match message {
                Message::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
                _ => None,
            })
            .collect();
        let dangling: Vec<ToolCall> = tool_calls
            .iter()
            .filter(|call| !answered.contains(&call.id.as_str()))
            .cloned()
            .collect();
        for call in dangling {
            self.stage_message(Message::Tool {
                tool_call_id: call.id,
                tool_name: call.name,
                outcome: ToolOutcome::Error(
                    "interrupted: the run stopped before this call returned".into(),
                ),
            });
        }
    }

    /// The top of a step: honour an interrupt, enforce the step limit, ask the model.
    fn begin_step(&mut self, run_id: RunId, now: u64, effects: &mut Vec<Effect>) {
        if self.record.interrupt_requested {
            self.record.interrupt_requested = false;
            let error = RunError {
                code: ErrorCode::Interrupted,
                message: "interrupted by request".into(),
            };
            self.end_run(Status::Interrupted, Some(error), now, effects);
            return;
        }
        let max_steps = self.agent.max_steps();
        if self.record.steps_in_run >= max_steps {
            let error = RunError {
                code: ErrorCode::MaxSteps,
                message: format!("max_steps: the run used all {max_steps} of its steps"),
            };
            self.end_run(Status::Failed, Some(error), now, effects);
            return;
        }
        self.record.steps_in_run += 1;
        let step = self.record.steps_in_run;
        if let Some(run) = &mut self.run {
            run.steps = step;
        }
        self.phase = Phase::AwaitingModel { run_id, step };
        let messages = self.messages.get_or_insert_with(Arc::default);
        effects.push(Effect::CallModel {
            run_id,
            step,
            request: ModelRequest {
                session_id: self.record.id.clone(),
                agent: self.agent.name().to_string(),
                system_prompt: self.agent.system_prompt().to_string(),
                messages: Arc::clone(messages),
                tools: self.agent.tool_specs(),
            },
        });
    }

    fn model_replied(
        &mut self,
        run_id: RunId,
        step: u32,
        reply: Result<ModelReply, LlmError>,
        now: u64,
    ) -> Transition {
        if !matches!(self.phase, Phase::AwaitingModel { run_id: r, step: s } if r == run_id && s == step)
        {
            // A late answer for a run that has since ended (or a previous incarnation's).
            return Transition::default();
        }
        self.phase = Phase::Idle;
        let mut effects = Vec::new();
        let reply = match reply {
            Ok(reply) => reply,
            Err(error) => {
                let code = match error {
                    LlmError::ScriptExhausted { .. } => ErrorCode::ScriptExhausted,
                    LlmError::Provider(_) => ErrorCode::ModelError,
                };
                let error = RunError {
                    code,
                    message: error.to_string(),
                };
                self.end_run(Status::Failed, Some(error), now, &mut effects);
                return self.finish(CommitKind::RunEnd, now, effects);
            }
        };
        if let Some(text) = &reply.text {
            self.stage_chunk(run_id, now, ChunkKind::Text { text: text.clone() });
            if let Some(run) = &mut self.run {
                run.text = Some(text.clone());
            }
        }
        let message = Message::Assistant {
            text: reply.text,
            tool_calls: reply.tool_calls.clone(),
        };
        self.stage_message(message.clone());
        effects.push(self.on_message(run_id, message));
        let calls = reply.tool_calls;
        if calls.is_empty() {
            self.end_run(Status::Completed, None, now, &mut effects);
            return self.finish(CommitKind::RunEnd, now, effects);
        }
        let mut parallel = Vec::new();
        let mut sequential = Vec::new();
        let mut ready = Vec::with_capacity(calls.len());
        for call in &calls {
            self.stage_chunk(
                run_id,
                now,
                ChunkKind::ToolStart {
                    tool_call_id: call.id.clone(),
                    tool_name: call.name.clone(),
                    input: call.input.clone(),
                },
            );
            let dispatch = self.classify(call);
            if !matches!(dispatch, Dispatch::Immediate(_)) {
                effects.push(Effect::Hook(HookEvent::BeforeTool {
                    session: self.record.id.clone(),
                    run_id,
                    call: call.clone(),
                }));
            }
            match dispatch {
                Dispatch::Parallel => {
                    parallel.push(call.clone());
                    ready.push(None);
                }
                Dispatch::Sequential => {
                    sequential.push(call.clone());
                    ready.push(None);
                }
                Dispatch::Immediate(outcome) => ready.push(Some(outcome)),
            }
        }
        effects.push(Effect::RunTools {
            run_id,
            step,
            parallel,
            sequential,
            state: Arc::new(Value::Object(self.record.custom_state.clone())),
        });
        self.phase = Phase::AwaitingTools {
            run_id,
            step,
            calls,
            ready,
        };
        self.finish(CommitKind::ToolCalls, now, effects)
    }

    fn classify(&self, call: &ToolCall) -> Dispatch {
        if call.name == FINISH_TOOL && self.agent.output().is_some() {
            return Dispatch::Sequential;
        }
        let Some(tool) = self.agent.tool(&call.name) else {
            return Dispatch::Immediate(ToolOutcome::Error(format!(
                "unknown_tool: agent {} has no tool named {}",
                self.agent.name(),
                call.name
            )));
        };
        if let Some(schema) = &tool.input {
            let errors = schema.errors(&call.input);
            if !errors.is_empty() {
                return Dispatch::Immediate(ToolOutcome::Error(format!(
                    "invalid_input: {}",
                    errors.join("; ")
                )));
            }
        }
        match tool.def.kind {
            ToolKind::Server(_) if tool.def.finish_with => Dispatch::Sequential,
            ToolKind::Server(_) => Dispatch::Parallel,
            ToolKind::Client { .. } | ToolKind::SubAgent { .. } => {
                Dispatch::Immediate(ToolOutcome::Error(format!(
                    "unsupported_tool_kind: tool {} is not a server tool, and only server tools run in this version",
                    call.name
                )))
            }
        }
    }

    fn tools_finished(
        &mut self,
        run_id: RunId,
        step: u32,
        outcomes: Vec<FinishedCall>,
        now: u64,
    ) -> Transition {
        let phase = std::mem::replace(&mut self.phase, Phase::Idle);
        let (calls, mut ready) = match phase {
            Phase::AwaitingTools {
                run_id: r,
                step: s,
                calls,
                ready,
            } if r == run_id && s == step => (calls, ready),
            other => {
                self.phase = other;
                return Transition::default();
            }
        };
        let mut updates: Vec<Map<String, Value>> = vec![Map::new(); calls.len()];
        for finished in outcomes {
            if let Some(index) = calls
                .iter()
                .position(|call| call.id == finished.tool_call_id)
            {
                ready[index] = Some(finished.outcome);
                updates[index] = finished.updates;
            }
        }
        let mut effects = Vec::new();
        let mut output = None;
        for ((call, outcome), changes) in calls.into_iter().zip(ready).zip(updates) {
            let outcome = outcome.unwrap_or_else(|| {
                ToolOutcome::Error("tool_not_run: the runtime lost this call's outcome".into())
            });
            if output.is_none() && self.finishes_run(&call) {
                if let ToolOutcome::Result(value) = &outcome {
                    output = Some(value.clone());
                }
            }
            for (key, value) in &changes {
                self.record.custom_state.insert(key.clone(), value.clone());
            }
            self.stage_chunk(
                run_id,
                now,
                ChunkKind::ToolEnd {
                    tool_call_id: call.id.clone(),
                    tool_name: call.name.clone(),
                    outcome: outcome.clone(),
                },
            );
            let message = Message::Tool {
                tool_call_id: call.id.clone(),
                tool_name: call.name.clone(),
                outcome: outcome.clone(),
            };
            self.stage_message(message.clone());
            effects.push(Effect::Hook(HookEvent::OnStateChange {
                session: self.record.id.clone(),
                run_id,
                tool_call_id: call.id.clone(),
                updates: changes,
            }));
            effects.push(self.on_message(run_id, message));
            effects.push(Effect::Hook(HookEvent::AfterTool {
                session: self.record.id.clone(),
                run_id,
                tool_call_id: call.id,
                tool_name: call.name,
                outcome,
            }));
        }
        match output {
            Some(value) => {
                if let Some(run) = &mut self.run {
                    run.output = Some(value);
                }
                self.end_run(Status::Completed, None, now, &mut effects);
            }
            None => self.begin_step(run_id, now, &mut effects),
        }
        self.finish(CommitKind::ToolResults, now, effects)
    }

    fn finishes_run(&self, call: &ToolCall) -> bool {
        (call.name == FINISH_TOOL && self.agent.output().is_some())
            || self
                .agent
                .tool(&call.name)
                .is_some_and(|tool| tool.def.finish_with)
    }

    fn end_run(
        &mut self,
        status: Status,
        error: Option<RunError>,
        now: u64,
        effects: &mut Vec<Effect>,
    ) {
        self.phase = Phase::Idle;
        self.record.status = status;
        let Some(run) = &mut self.run else {
            return;
        };
        run.status = status;
        run.ended_at_ms = Some(now);
        run.steps = self.record.steps_in_run;
        run.error = error.clone();
        self.staged.run_changed = true;
        let run_id = run.run_id;
        let kind = match status {
            Status::Interrupted => ChunkKind::RunInterrupted { error },
            _ => ChunkKind::RunEnd { status, error },
        };
        self.stage_chunk(run_id, now, kind);
        effects.push(Effect::Settle(self.outcome()));
    }

    /// The current run's outcome.
    pub(crate) fn outcome(&self) -> RunOutcome {
        let run = self.run.as_ref();
        RunOutcome {
            session_id: self.record.id.clone(),
            run_id: run.map_or_else(RunId::generate, |run| run.run_id),
            turn: run.map_or(0, |run| run.turn),
            status: self.record.status,
            text: run.and_then(|run| run.text.clone()),
            output: run.and_then(|run| run.output.clone()),
            error: run.and_then(|run| run.error.clone()),
            pending: Vec::new(),
        }
    }

    fn on_message(&self, run_id: RunId, message: Message) -> Effect {
        Effect::Hook(HookEvent::OnMessage {
            session: self.record.id.clone(),
            run_id,
            message,
        })
    }

    fn stage_message(&mut self, message: Message) {
        let seq = self.record.message_count;
        self.record.message_count += 1;
        if let Some(messages) = &mut self.messages {
            Arc::make_mut(messages).push(message.clone());
        }
        self.staged.messages.push((seq, message));
    }

    fn stage_chunk(&mut self, run_id: RunId, now: u64, kind: ChunkKind) {
        let seq = self.record.chunk_count;
        self.record.chunk_count += 1;
        self.staged.chunks.push(Chunk {
            seq,
            run_id,
            at_ms: now,
            kind,
        });
    }

    /// Turns what was staged into the transition's commit.
    fn finish(&mut self, kind: CommitKind, now: u64, effects: Vec<Effect>) -> Transition {
        self.record.updated_at_ms = now;
        let staged = std::mem::take(&mut self.staged);
        let runs = match (&self.run, staged.run_changed) {
            (Some(run), true) => vec![run.clone()],
            _ => Vec::new(),
        };
        Transition {
            commit: Some(Commit {
                kind,
                record: self.record.clone(),
                messages: staged.messages,
                runs,
                chunks: staged.chunks,
            }),
            effects,
        }
    }
}
