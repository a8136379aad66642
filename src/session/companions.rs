//! Persistent sub-agents ("companions"): the `companion__*` tool calls of a parent, and the
//! new turns they give a companion.
//!
//! A companion is a child session with the stable id `{parent}-agent-{name}` that outlives the
//! call that spawned it. Each turn it is given (`spawnAgent`, `sendMessage`) is started by one
//! of the parent's tool calls, the *turn call*: the child reports to it, so a report naming an
//! older call is stale. A call that waits for a companion (a blocking spawn or send, or
//! `waitForResult`) is an ordinary sub-agent call entry whose child is the companion, so
//! waiting, nested suspension, the resume cascade and recovery are those of ephemeral
//! sub-agents.

use std::sync::Arc;

use serde_json::{json, Value};

use super::apply_cx::ApplyCx;
use super::child_calls::{ChildKind, ChildOrigin, ChildStart};
use super::core::{CallSlot, Session};
use super::ChildReport;
use super::{ChildAt, ChildCall, ChildState, Companion, CompanionStatus, Effect, Status};
use crate::definition::{CompanionMode, CompanionTool};
use crate::error::Error;
use crate::store::schema::IndexWrite;
use crate::types::ids::{RunId, SessionId};
use crate::types::message::{ToolCall, ToolOutcome};
use crate::types::tool_error::{ToolErrorCode, ToolFailure};

/// The longest companion name accepted (it becomes part of a session id).
const MAX_NAME_LEN: usize = 64;

/// What a companion tool call asks for, read from its input.
struct Turn {
    name: String,
    agent: String,
    mode: CompanionMode,
    message: String,
}

impl Session {
    /// Whether `call` is one of the companion tools this agent has.
    pub(super) fn is_companion_call(&self, call: &ToolCall) -> bool {
        CompanionTool::parse(&call.name, self.agent.persistent_agents()).is_some()
    }

    /// Carries out a companion tool call during dispatch: answered at once, or (for a call
    /// that waits on the companion) an entry of the sub-agent calls.
    pub(super) fn companion_call(
        &mut self,
        cx: &mut ApplyCx,
        run_id: RunId,
        call: &ToolCall,
        position: usize,
    ) -> CallSlot {
        let Some(tool) = CompanionTool::parse(&call.name, self.agent.persistent_agents()) else {
            return CallSlot::failed(
                ToolErrorCode::UnknownTool.with(format_args!("no companion tool {}", call.name)),
            );
        };
        let answer = match tool {
            CompanionTool::List => Ok(self.list_companions()),
            CompanionTool::Status => self
                .named_companion(&call.input)
                .map(|companion| companion_json(companion, true)),
            CompanionTool::Terminate => self.terminate_companion(cx, &call.input),
            CompanionTool::Wait => return self.wait_for_companion(cx, run_id, call, position),
            CompanionTool::Spawn | CompanionTool::Send => {
                return self.companion_turn(cx, tool, run_id, call, position)
            }
        };
        match answer {
            Ok(value) => CallSlot::Ready {
                outcome: ToolOutcome::Result(value),
                reported: false,
            },
            Err(error) => CallSlot::failed(error),
        }
    }

    fn list_companions(&self) -> Value {
        let children: Vec<Value> = self
            .companions
            .in_order()
            .into_iter()
            .map(|companion| companion_json(companion, false))
            .collect();
        json!({ "children": children })
    }

    fn named_companion(&self, input: &Value) -> Result<&Companion, ToolFailure> {
        let name = input_str(input, "name").ok_or_else(|| {
            ToolErrorCode::InvalidInput.with("this tool takes {\"name\": string}")
        })?;
        self.companions.by_name.get(name).ok_or_else(|| {
            let known: Vec<&str> = self
                .companions
                .in_order()
                .into_iter()
                .map(|companion| companion.name.as_str())
                .collect();
            ToolErrorCode::UnknownCompanion.with(format_args!(
                "no persistent sub-agent is named {name}; known: {known:?}"
            ))
        })
    }

    fn terminate_companion(
        &mut self,
        cx: &mut ApplyCx,
        input: &Value,
    ) -> Result<Value, ToolFailure> {
        let companion = self.named_companion(input)?.clone();
        if companion.status != CompanionStatus::Terminated {
            let mut terminated = companion.clone();
            terminated.status = CompanionStatus::Terminated;
            self.put_companion(cx, terminated);
        }
        // Sent again when the call is re-run after a crash: aborting twice changes nothing.
        cx.push(Effect::StopChildren {
            children: vec![self.child_at(companion.child.clone())],
            abort: true,
        });
        Ok(json!({ "name": companion.name, "status": "terminated" }))
    }

    /// `waitForResult`: a companion whose turn ended answers at once; one still working is
    /// waited for like a sub-agent (and suspends the parent while it waits on a person).
    fn wait_for_companion(
        &mut self,
        cx: &mut ApplyCx,
        run_id: RunId,
        call: &ToolCall,
        position: usize,
    ) -> CallSlot {
        if let Some(entry) = self.children.get(&call.id) {
            // Recorded before a crash: ask the companion where it stands again.
            let child = entry.child.clone();
            self.wake_children(cx, vec![(call.id.clone(), child)]);
            self.wait_again(cx, &call.id);
            return CallSlot::Child;
        }
        let companion = match self.named_companion(&call.input) {
            Ok(companion) => companion.clone(),
            Err(error) => return CallSlot::failed(error),
        };
        let state = match &companion.status {
            CompanionStatus::Running => ChildState::Running,
            CompanionStatus::Suspended { waiting } => ChildState::Suspended {
                waiting: waiting.clone(),
            },
            CompanionStatus::Completed | CompanionStatus::Failed => {
                let outcome = companion.result.clone().unwrap_or_else(|| {
                    ToolErrorCode::CompanionLost
                        .with(format_args!("{} has no reply", companion.name))
                        .into()
                });
                return CallSlot::Ready {
                    outcome,
                    reported: false,
                };
            }
            CompanionStatus::Interrupted => {
                return CallSlot::failed(ToolErrorCode::CompanionInterrupted.with(format_args!(
                    "{} was cut before it replied; send it a message to continue",
                    companion.name
                )))
            }
            CompanionStatus::Terminated => {
                return CallSlot::failed(ToolErrorCode::CompanionTerminated.with(format_args!(
                    "{} was terminated; spawn it again to start it fresh",
                    companion.name
                )))
            }
        };
        self.wait_on_companion(cx, run_id, call, position, &companion, state);
        // A companion whose report was lost (or that a crash cut) reports again when woken.
        self.wake_children(cx, vec![(call.id.clone(), companion.child.clone())]);
        CallSlot::Child
    }

    /// `spawnAgent` and `sendMessage`: give the companion a new turn (spawning it, fresh if
    /// it failed or was terminated), answered at once or waited for, by its mode.
    fn companion_turn(
        &mut self,
        cx: &mut ApplyCx,
        tool: CompanionTool,
        run_id: RunId,
        call: &ToolCall,
        position: usize,
    ) -> CallSlot {
        let turn = match self.read_turn(tool, call) {
            Ok(turn) => turn,
            Err(error) => return CallSlot::failed(error),
        };
        let existing = self.companions.by_name.get(&turn.name).cloned();
        let replayed = existing
            .as_ref()
            .is_some_and(|companion| companion.turn_call == call.id);
        if !replayed {
            if let Some(error) = self.refuse_turn(tool, &turn, existing.as_ref()) {
                return CallSlot::failed(error);
            }
        }
        let child = self.record.id.persistent_child(&turn.name);
        let fresh = existing.as_ref().is_none_or(|companion| {
            matches!(
                companion.status,
                CompanionStatus::Failed | CompanionStatus::Terminated
            )
        });
        // Re-run after a crash: a turn still working is re-attached to (it reports again), one
        // recovery wrote off as interrupted is woken, one whose end is known is left be.
        let mut restart = true;
        if replayed {
            if let Some(mut companion) = existing.clone() {
                match companion.status {
                    CompanionStatus::Running | CompanionStatus::Suspended { .. } => {}
                    CompanionStatus::Interrupted => {
                        companion.status = CompanionStatus::Running;
                        self.put_companion(cx, companion);
                    }
                    CompanionStatus::Completed
                    | CompanionStatus::Failed
                    | CompanionStatus::Terminated => restart = false,
                }
            }
        } else {
            let previous = existing.as_ref().filter(|_| !fresh);
            self.put_companion(
                cx,
                Companion {
                    name: turn.name.clone(),
                    agent: turn.agent.clone(),
                    mode: turn.mode,
                    child: child.clone(),
                    status: CompanionStatus::Running,
                    result: None,
                    turn_call: call.id.clone(),
                    turns: previous.map_or(1, |companion| companion.turns + 1),
                    spawned_at_ms: previous.map_or(cx.now, |companion| companion.spawned_at_ms),
                },
            );
        }
        // Sent again when the call is re-run after a crash: the child re-attaches to the
        // turn this call started instead of starting another.
        if restart {
            cx.push(Effect::StartChild(ChildStart {
                origin: ChildOrigin {
                    parent: self.record.id.clone(),
                    root: self.record.root.clone(),
                    tool_call_id: call.id.clone(),
                    depth: self.record.depth.saturating_add(1),
                },
                child: child.clone(),
                agent: turn.agent.clone(),
                message: turn.message,
                kind: ChildKind::Companion {
                    fresh: fresh && !replayed,
                },
            }));
        }
        match turn.mode {
            CompanionMode::NonBlocking => CallSlot::Ready {
                outcome: ToolOutcome::Result(json!({
                    "name": turn.name,
                    "sessionId": child.to_string(),
                    "status": "running",
                })),
                reported: false,
            },
            CompanionMode::Blocking if !restart && self.children.get(&call.id).is_none() => {
                // The turn's end is known and nothing waits on it any more: that is the answer.
                let outcome = existing
                    .and_then(|companion| companion.result)
                    .unwrap_or_else(|| {
                        ToolErrorCode::CompanionLost
                            .with(format_args!("{} has no reply", turn.name))
                            .into()
                    });
                CallSlot::Ready {
                    outcome,
                    reported: false,
                }
            }
            CompanionMode::Blocking => {
                if self.children.get(&call.id).is_some() {
                    self.wait_again(cx, &call.id);
                } else {
                    let companion = self.companions.by_name.get(&turn.name).cloned();
                    if let Some(companion) = companion {
                        self.wait_on_companion(
                            cx,
                            run_id,
                            call,
                            position,
                            &companion,
                            ChildState::Running,
                        );
                    }
                }
                CallSlot::Child
            }
        }
    }

    fn read_turn(&self, tool: CompanionTool, call: &ToolCall) -> Result<Turn, ToolFailure> {
        let input = &call.input;
        let message = input_str(input, "message").ok_or_else(|| {
            ToolErrorCode::InvalidInput
                .with("this tool needs {\"message\": string}, the companion's next message")
        })?;
        let (name, agent) = if tool == CompanionTool::Spawn {
            let agent = input_str(input, "agentType").ok_or_else(|| {
                ToolErrorCode::InvalidInput.with("spawnAgent needs {\"agentType\": string}")
            })?;
            let name = match input.get("name") {
                None | Some(Value::Null) => match self.companions.by_turn_call(&call.id) {
                    // Re-run after a crash: the name it was given then, not the next free one.
                    Some(companion) => companion.name.clone(),
                    None => self.auto_name(agent),
                },
                Some(Value::String(name)) => name.clone(),
                Some(_) => {
                    return Err(ToolErrorCode::InvalidInput.with("a companion's `name` is a string"))
                }
            };
            (name, agent.to_string())
        } else {
            let companion = self.named_companion(input)?;
            (companion.name.clone(), companion.agent.clone())
        };
        let mode = self
            .agent
            .persistent_agents()
            .iter()
            .find(|persistent| persistent.agent == agent)
            .map(|persistent| persistent.mode)
            .ok_or_else(|| {
                let known: Vec<&str> = self
                    .agent
                    .persistent_agents()
                    .iter()
                    .map(|persistent| persistent.agent.as_str())
                    .collect();
                ToolErrorCode::UnknownAgentType.with(format_args!(
                    "{agent} is not a persistent agent of {}; known: {known:?}",
                    self.agent.name()
                ))
            })?;
        check_name(&name)?;
        Ok(Turn {
            name,
            agent,
            mode,
            message: message.to_string(),
        })
    }

    /// `{agentType}-{n}`, the first n not taken.
    fn auto_name(&self, agent: &str) -> String {
        (1..)
            .map(|n| format!("{agent}-{n}"))
            .find(|name| !self.companions.by_name.contains_key(name))
            .unwrap_or_else(|| agent.to_string())
    }

    /// Why a new turn cannot start, if it cannot.
    fn refuse_turn(
        &self,
        tool: CompanionTool,
        turn: &Turn,
        existing: Option<&Companion>,
    ) -> Option<ToolFailure> {
        let max_depth = self.policy.max_depth;
        if self.record.depth >= max_depth {
            return Some(ToolErrorCode::MaxDepthExceeded.with(format_args!(
                "companion {} would be {} levels below the root; the limit is {max_depth}",
                turn.name,
                self.record.depth + 1
            )));
        }
        let companion = existing?;
        if companion.agent != turn.agent {
            return Some(ToolErrorCode::CompanionNameTaken.with(format_args!(
                "{} already runs agent {}",
                companion.name, companion.agent
            )));
        }
        match (&companion.status, tool) {
            (CompanionStatus::Running, _) => Some(ToolErrorCode::CompanionBusy.with(format_args!(
                "{} is still working on its turn; wait for it (companion__waitForResult, companion__getChildStatus) or terminate it",
                companion.name
            ))),
            // A new message gives a waiting companion a new task (its waiting calls are
            // abandoned); spawning it again is refused.
            (CompanionStatus::Suspended { .. }, CompanionTool::Spawn) => {
                Some(ToolErrorCode::CompanionBusy.with(format_args!(
                    "{} waits on a person; send it a message (companion__sendMessage) to give it a new task",
                    companion.name
                )))
            }
            _ => None,
        }
    }

    /// Records a call that waits for `companion` as a sub-agent call entry.
    fn wait_on_companion(
        &mut self,
        cx: &mut ApplyCx,
        run_id: RunId,
        call: &ToolCall,
        position: usize,
        companion: &Companion,
        state: ChildState,
    ) {
        let entry = ChildCall {
            tool_call_id: call.id.clone(),
            tool_name: call.name.clone(),
            child: companion.child.clone(),
            run_id,
            position: u32::try_from(position).unwrap_or(u32::MAX),
            started_at_ms: cx.now,
            state,
            forwarded: 0,
            companion: Some(companion.name.clone()),
            remote: None,
            remote_look: None,
            routed_calls: Vec::new(),
        };
        self.record_child_call(cx, entry);
    }

    fn put_companion(&mut self, cx: &mut ApplyCx, companion: Companion) {
        cx.staged
            .index
            .push(IndexWrite::PutCompanion(companion.clone()));
        self.companions
            .by_name
            .insert(companion.name.clone(), companion);
    }

    /// A report from the companion whose turn `call` started: its record learns where the turn
    /// stands. Returns the companion's session, or `None` if `call` started no current turn.
    pub(super) fn companion_reported(
        &mut self,
        cx: &mut ApplyCx,
        call: &str,
        report: &ChildReport,
    ) -> Option<SessionId> {
        let mut companion = self.companions.by_turn_call(call)?.clone();
        let child = companion.child.clone();
        if companion.status == CompanionStatus::Terminated {
            return Some(child);
        }
        match report {
            ChildReport::Finished(outcome) => {
                companion.status = match outcome {
                    ToolOutcome::Result(_) => CompanionStatus::Completed,
                    ToolOutcome::Error(_) => CompanionStatus::Failed,
                };
                companion.result = Some(outcome.clone());
            }
            ChildReport::Suspended(waiting) => {
                companion.status = CompanionStatus::Suspended {
                    waiting: waiting.clone(),
                };
            }
            ChildReport::Interrupted(text) => {
                companion.status = CompanionStatus::Interrupted;
                companion.result = Some(ToolOutcome::Error(text.clone()));
            }
            ChildReport::Crashed => {
                // Its actor was restarted with the turn cut: waking it goes on with the turn.
                companion.status = CompanionStatus::Running;
                self.wake_children(cx, vec![(call.to_string(), child.clone())]);
            }
        }
        self.put_companion(cx, companion);
        Some(child)
    }

    /// Records what recovery learned of a companion still recorded as running, if `call`
    /// started its current turn. Returns whether its record changed.
    pub(super) fn companion_reconciled(
        &mut self,
        cx: &mut ApplyCx,
        call: &str,
        state: &ChildState,
    ) -> bool {
        let Some(companion) = self.companions.by_turn_call(call) else {
            return false;
        };
        if companion.status != CompanionStatus::Running {
            return false;
        }
        let mut companion = companion.clone();
        match state {
            ChildState::Running => return false,
            ChildState::Suspended { waiting } => {
                companion.status = CompanionStatus::Suspended {
                    waiting: waiting.clone(),
                };
            }
            ChildState::Finished(outcome) => {
                companion.status = match outcome {
                    ToolOutcome::Result(_) => CompanionStatus::Completed,
                    ToolOutcome::Error(_) => CompanionStatus::Failed,
                };
                companion.result = Some(outcome.clone());
            }
            ChildState::Interrupted { reason } => {
                companion.status = CompanionStatus::Interrupted;
                companion.result = Some(ToolErrorCode::CompanionInterrupted.with(reason).into());
            }
        }
        self.put_companion(cx, companion);
        true
    }

    /// An interrupted parent interrupts its companions that are still working (running, or
    /// waiting on a person), whether or not it waits on them: an interrupt stops the whole
    /// tree. They keep their conversations; a new message continues them.
    pub(super) fn stop_working_companions(&self, cx: &mut ApplyCx) {
        let working: Vec<ChildAt> = self
            .companions
            .in_order()
            .into_iter()
            .filter(|companion| companion.status.is_working())
            .map(|companion| self.child_at(companion.child.clone()))
            .collect();
        if !working.is_empty() {
            cx.push(Effect::StopChildren {
                children: working,
                abort: false,
            });
        }
    }

    /// An aborted parent terminates its companions too.
    pub(super) fn terminate_companions(&mut self, cx: &mut ApplyCx) {
        let live: Vec<Companion> = self
            .companions
            .in_order()
            .into_iter()
            .filter(|companion| companion.status != CompanionStatus::Terminated)
            .cloned()
            .collect();
        if live.is_empty() {
            return;
        }
        cx.push(Effect::StopChildren {
            children: live
                .iter()
                .map(|companion| self.child_at(companion.child.clone()))
                .collect(),
            abort: true,
        });
        for mut companion in live {
            companion.status = CompanionStatus::Terminated;
            self.put_companion(cx, companion);
        }
    }

    /// A companion's new turn (the child side): started by the parent's call `call`, on the
    /// preserved conversation with a fresh step budget, or on a fresh one when `fresh`, when
    /// this session was aborted (terminated) or its last turn failed.
    pub(super) fn consult(
        &mut self,
        cx: &mut ApplyCx,
        run_id: RunId,
        message: String,
        call: String,
        fresh: bool,
    ) -> Result<(), Error> {
        if self.record.status == Status::Running {
            return Err(Error::AlreadyRunning(self.record.id.clone()));
        }
        if fresh || self.record.aborted || self.record.status == Status::Failed {
            self.start_fresh(cx);
        }
        self.record.parent_call = Some(call);
        self.execute(cx, run_id, message)
    }

    /// Starts over: the conversation the model sees, the custom state, waiting calls and
    /// children are dropped (the stored messages stay, behind `history_start`).
    fn start_fresh(&mut self, cx: &mut ApplyCx) {
        self.record.aborted = false;
        self.record.interrupt_requested = false;
        self.record.custom_state.clear();
        self.record.history_start = self.record.message_count;
        self.messages = Some(Arc::default());
        self.drop_pending(cx, |_| true);
        for entry in self.release_children(cx, true) {
            self.drop_child(cx, &entry.tool_call_id);
        }
        self.terminate_companions(cx);
        self.record.status = Status::Completed;
    }
}

/// How a companion looks to the model.
fn companion_json(companion: &Companion, with_result: bool) -> Value {
    let mut value = json!({
        "name": companion.name,
        "agentType": companion.agent,
        "sessionId": companion.child.to_string(),
        "mode": companion.mode.as_str(),
        "status": companion.status.as_str(),
        "turns": companion.turns,
    });
    if let CompanionStatus::Suspended { waiting } = &companion.status {
        value["waiting"] = json!(waiting);
    }
    if with_result {
        match &companion.result {
            Some(ToolOutcome::Result(result)) => value["result"] = result.clone(),
            Some(ToolOutcome::Error(error)) => value["error"] = json!(error),
            None => {}
        }
    }
    value
}

fn input_str<'v>(input: &'v Value, key: &str) -> Option<&'v str> {
    input.get(key).and_then(Value::as_str)
}

/// A name becomes part of a session id: letters, digits, `-` and `_`, at most 64, and never
/// `-sub-` or `-agent-`, which would make the id of another session of the tree (ids are
/// concatenations: `{parent}-agent-{name}`, `{parent}-sub-{call}`).
fn check_name(name: &str) -> Result<(), ToolFailure> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !name.contains("-sub-")
        && !name.contains("-agent-");
    if valid {
        Ok(())
    } else {
        Err(ToolErrorCode::InvalidInput.with(format_args!(
            "a companion name is 1 to {MAX_NAME_LEN} letters, digits, '-' or '_', without '-sub-' or '-agent-'; got {name:?}"
        )))
    }
}
