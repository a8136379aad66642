//! Sub-agent calls: each starts (or re-attaches to) a child session, the child reports back by
//! one-way messages keyed by the tool call id, and its outcome becomes the parent's tool
//! result. A child that waits on a person suspends its parent (`suspended_awaiting_children`),
//! and a resume of the parent wakes it first: the cascade.

use serde_json::Value;

use super::apply_cx::ApplyCx;
use super::child_calls::{ChildOrigin, ChildReport, ChildStart, ReportedChild, ToReconcile};
use super::core::{CallSlot, Phase, Session};
use super::{ChildAt, ChildCall, ChildState, Effect};
use crate::definition::ToolKind;
use crate::remote::{Drive, RemoteChild, RemoteParent};
use crate::store::schema::IndexWrite;
use crate::store::CommitKind;
use crate::types::ids::{RunId, SessionId};
use crate::types::message::{ToolCall, ToolOutcome};
use crate::types::stream::{Chunk, ChunkKind};
use crate::types::tool_error::ToolErrorCode;

impl Session {
    /// A sub-agent call runs in a child unless the tree is already as deep as allowed (a cycle
    /// of agents delegating to each other ends here) or the call has no message for it.
    pub(super) fn classify_child(&self, call: &ToolCall) -> CallSlot {
        if self.children.get(&call.id).is_some() {
            // Committed before a crash: re-attach to the child (and its result).
            return CallSlot::Child;
        }
        let max_depth = self.policy.max_depth;
        if self.record.depth >= max_depth {
            return CallSlot::failed(ToolErrorCode::MaxDepthExceeded.with(format_args!(
                "sub-agent {} would be {} levels below the root; the limit is {max_depth}",
                call.name,
                self.record.depth + 1
            )));
        }
        if child_message(&call.input).is_none() {
            return CallSlot::failed(ToolErrorCode::InvalidInput.with(format_args!(
                "sub-agent tool {} takes {{\"message\": string}}, the child's first message",
                call.name
            )));
        }
        // The child's id is made of the call's id, which the model chose: one that is no
        // valid session id (a control character, too long) would be stored and never read
        // back.
        let child = self.record.id.ephemeral_child(&call.id);
        if let Err(error) = child.as_str().parse::<SessionId>() {
            return CallSlot::failed(ToolErrorCode::InvalidInput.with(format_args!(
                "sub-agent call {:?} cannot name a child session: {error}",
                call.id
            )));
        }
        CallSlot::Child
    }

    /// Records the child of a sub-agent call (once) and asks the actor to start it or, if it
    /// exists, to re-attach to it.
    pub(super) fn launch_child(
        &mut self,
        cx: &mut ApplyCx,
        run_id: RunId,
        call: &ToolCall,
        position: usize,
    ) {
        let child = self.record.id.ephemeral_child(&call.id);
        match self.children.by_id.get(&call.id) {
            Some(entry) if entry.state.is_finished() => return,
            Some(_) => self.wait_again(cx, &call.id),
            None => {
                let entry = ChildCall {
                    tool_call_id: call.id.clone(),
                    tool_name: call.name.clone(),
                    child: child.clone(),
                    run_id,
                    position: u32::try_from(position).unwrap_or(u32::MAX),
                    started_at_ms: cx.now,
                    state: ChildState::Running,
                    forwarded: 0,
                    companion: None,
                    remote: remote_of(&self.agent, &call.name),
                    remote_look: None,
                    routed_calls: Vec::new(),
                };
                self.record_child_call(cx, entry);
            }
        }
        let agent = match self.agent.tool(&call.name).map(|tool| &tool.def.kind) {
            Some(ToolKind::SubAgent { agent } | ToolKind::RemoteSubAgent { agent, .. }) => {
                agent.clone()
            }
            _ => self.agent.name().to_string(),
        };
        let message = child_message(&call.input).unwrap_or_default();
        let start = Drive::Start {
            message: message.clone(),
            parent: RemoteParent {
                parent: self.record.id.clone(),
                root: self.record.root.clone(),
                traceparent: crate::telemetry::call_traceparent(self.current_run_id()),
            },
        };
        if let Some(drive) = self.remote_drive(&call.id, start) {
            return cx.push(Effect::DriveRemote(drive));
        }
        cx.push(Effect::StartChild(ChildStart {
            origin: ChildOrigin {
                parent: self.record.id.clone(),
                root: self.record.root.clone(),
                tool_call_id: call.id.clone(),
                depth: self.record.depth.saturating_add(1),
            },
            child,
            agent,
            message,
            kind: super::child_calls::ChildKind::Ephemeral,
        }));
    }

    /// Records a new call that waits on a child: its entry, and `subagent_start` on the stream.
    pub(super) fn record_child_call(&mut self, cx: &mut ApplyCx, entry: ChildCall) {
        self.stage_chunk(
            cx,
            entry.run_id,
            ChunkKind::SubagentStart {
                session_id: entry.child.to_string(),
                tool_call_id: entry.tool_call_id.clone(),
            },
        );
        cx.staged.index.push(IndexWrite::PutChild(entry.clone()));
        self.children.insert(entry);
    }

    /// A call recorded before a crash waits on its child again (the child is re-attached to,
    /// and reports where it stands); a known result stays.
    pub(super) fn wait_again(&mut self, cx: &mut ApplyCx, call_id: &str) {
        if let Some(entry) = self.children.by_id.get_mut(call_id) {
            if !entry.state.is_finished() {
                entry.state = ChildState::Running;
                let entry = entry.clone();
                cx.staged.index.push(IndexWrite::PutChild(entry));
            }
        }
    }

    /// Removes a finished child's entry and returns its outcome, with `subagent_end` on the
    /// stream; the caller records the outcome as the tool result.
    pub(super) fn adopt_child(
        &mut self,
        cx: &mut ApplyCx,
        run_id: RunId,
        call_id: &str,
    ) -> ToolOutcome {
        self.unroute_remote_calls(cx, call_id);
        let Some(entry) = self.children.by_id.remove(call_id) else {
            return ToolErrorCode::SubAgentLost
                .with(format_args!("the child of call {call_id} is not recorded"))
                .into();
        };
        cx.staged
            .index
            .push(IndexWrite::DeleteChild(entry.tool_call_id.clone()));
        self.stage_chunk(
            cx,
            run_id,
            ChunkKind::SubagentEnd {
                session_id: entry.child.to_string(),
                tool_call_id: entry.tool_call_id.clone(),
            },
        );
        match entry.state {
            ChildState::Finished(outcome) => outcome,
            ChildState::Interrupted { reason } => ToolErrorCode::SubAgentInterrupted
                .with(format_args!(
                    "child {} did not finish ({reason})",
                    entry.child
                ))
                .into(),
            ChildState::Running | ChildState::Suspended { .. } => ToolErrorCode::SubAgentAbandoned
                .with(format_args!("child {} was still working", entry.child))
                .into(),
        }
    }

    /// Stops every child that has not finished and hands back every entry, in call order, for
    /// the caller to record or drop (each still in `children` until adopted or dropped).
    pub(super) fn release_children(&self, cx: &mut ApplyCx, abort: bool) -> Vec<ChildCall> {
        let entries = self.children.entries();
        // A companion outlives the calls that wait on it: abandoning the wait leaves it be (an
        // aborted parent terminates its companions separately); an interrupt reaches it.
        let stopped: Vec<ChildAt> = entries
            .iter()
            .filter(|entry| !entry.state.is_finished())
            .filter(|entry| !abort || entry.companion.is_none())
            .map(|entry| self.child_at(entry.child.clone()))
            .collect();
        if !stopped.is_empty() {
            cx.push(Effect::StopChildren {
                children: stopped,
                abort,
            });
        }
        entries
    }

    /// Forgets a child's entry without recording a result (the run was interrupted: the call
    /// is closed as interrupted when the run continues).
    pub(super) fn drop_child(&mut self, cx: &mut ApplyCx, call_id: &str) {
        self.unroute_remote_calls(cx, call_id);
        if self.children.by_id.remove(call_id).is_some() {
            cx.staged
                .index
                .push(IndexWrite::DeleteChild(call_id.to_string()));
        }
    }

    /// A child reported (see [`children_reported`](Self::children_reported)).
    pub(super) fn child_reported(
        &mut self,
        cx: &mut ApplyCx,
        call_id: &str,
        report: ChildReport,
        chunks: Vec<Chunk>,
    ) {
        let reported = ReportedChild {
            tool_call_id: call_id.to_string(),
            report,
            chunks,
        };
        self.children_reported(cx, vec![reported]);
    }

    /// Children reported, in this order: each one's new chunks are copied into this stream
    /// and the entries of the calls that wait on it updated; then a step or a resume that
    /// waited for them goes on, and it is all one commit (a parent with many children hears
    /// from them in groups: `actor/reports.rs`). A report from a companion reaches its record
    /// and every call that waits on it.
    pub(super) fn children_reported(&mut self, cx: &mut ApplyCx, reports: Vec<ReportedChild>) {
        let mut woken = Vec::new();
        let mut recorded = false;
        for reported in reports {
            recorded |= self.record_report(cx, reported, &mut woken);
        }
        if recorded {
            self.after_reports(cx, &woken);
        }
    }

    /// Records one child's report; adds the calls it settles to `woken`. False when it was
    /// for no call this session knows (a duplicate, or a child woken twice): nothing changed.
    fn record_report(
        &mut self,
        cx: &mut ApplyCx,
        reported: ReportedChild,
        woken: &mut Vec<String>,
    ) -> bool {
        let ReportedChild {
            tool_call_id: call_id,
            report,
            chunks,
        } = reported;
        let call_id = call_id.as_str();
        let targets = match self.companion_reported(cx, call_id, &report) {
            Some(companion) => self.children.calls_on(&companion),
            None if self.children.get(call_id).is_none() => return false,
            None => {
                self.forward_chunks(cx, call_id, chunks);
                vec![call_id.to_string()]
            }
        };
        let mut crashed = Vec::new();
        for target in targets {
            let live = self.waits_on(&target);
            let Some(entry) = self.children.by_id.get_mut(&target) else {
                continue;
            };
            // A result already recorded stays (a re-attached child reports it again).
            let mut rewoken = false;
            if !entry.state.is_finished() {
                match &report {
                    ChildReport::Crashed if live && entry.companion.is_none() => {
                        crashed.push((target.clone(), entry.child.clone()));
                        rewoken = true;
                    }
                    ChildReport::Crashed => {}
                    ChildReport::Suspended(waiting) => {
                        entry.state = ChildState::Suspended {
                            waiting: waiting.clone(),
                        };
                    }
                    ChildReport::Finished(outcome) => {
                        entry.state = ChildState::Finished(outcome.clone());
                    }
                    ChildReport::Interrupted(text) => {
                        entry.state = ChildState::Finished(ToolOutcome::Error(text.clone()));
                    }
                }
            }
            // A child woken again after a crash answers no wake yet: it reports again.
            if entry.state != ChildState::Running && !rewoken {
                woken.push(target);
            }
            let entry = entry.clone();
            cx.staged.index.push(IndexWrite::PutChild(entry));
        }
        // A child its actor's crash cut goes on when woken.
        for cut in crashed {
            self.wake_children(cx, vec![cut]);
        }
        true
    }

    /// After the reports of [`children_reported`](Self::children_reported): a step or a
    /// resume that waited for the `woken` calls goes on; then the commit.
    fn after_reports(&mut self, cx: &mut ApplyCx, woken: &[String]) {
        let mut kind = CommitKind::Other;
        match &mut self.phase {
            Phase::AwaitingTools { .. } => {
                if self.settle_if_ready(cx) {
                    // The step's results: commit #2, whoever finished last.
                    kind = CommitKind::ToolResults;
                }
            }
            Phase::AwaitingChildren { waking, run_id } => {
                // A set: a fan-in brings hundreds of reports at once.
                let woken: std::collections::HashSet<&str> =
                    woken.iter().map(String::as_str).collect();
                waking.retain(|id| !woken.contains(id.as_str()));
                if waking.is_empty() {
                    let run_id = *run_id;
                    self.phase = Phase::Idle;
                    return self.after_waking(cx, run_id);
                }
            }
            Phase::Idle | Phase::AwaitingModel { .. } => {
                if self.owes_itself_a_resume(cx.now) {
                    cx.push(Effect::AutoResume);
                }
            }
        }
        self.finish(cx, kind);
    }

    /// Copies a child's chunks not yet forwarded into this stream, between the call's
    /// `subagent_start` and `subagent_end`.
    fn forward_chunks(&mut self, cx: &mut ApplyCx, call_id: &str, chunks: Vec<Chunk>) {
        let Some(entry) = self.children.by_id.get(call_id) else {
            return;
        };
        let child = entry.child.clone();
        let mut forwarded = entry.forwarded;
        let run_id = self.current_run_id();
        for chunk in chunks {
            if chunk.seq < forwarded {
                continue;
            }
            // Saturating: a remote child's numbers come from its server.
            forwarded = chunk.seq.saturating_add(1);
            self.stage_chunk(
                cx,
                run_id,
                ChunkKind::Forwarded {
                    session_id: child.to_string(),
                    tool_call_id: call_id.to_string(),
                    chunk: Box::new(chunk),
                },
            );
        }
        if let Some(entry) = self.children.by_id.get_mut(call_id) {
            entry.forwarded = forwarded;
        }
    }

    /// Whether the step or resume in progress waits for this call's child.
    pub(super) fn waits_on(&self, call_id: &str) -> bool {
        match &self.phase {
            Phase::AwaitingTools { calls, .. } => calls.iter().any(|step_call| {
                step_call.call.id == call_id && matches!(step_call.slot, CallSlot::Child)
            }),
            Phase::AwaitingChildren { waking, .. } => waking.iter().any(|id| id == call_id),
            _ => false,
        }
    }

    /// Every woken child reported: go on if nothing waits any more, else answer the barrier.
    pub(super) fn after_waking(&mut self, cx: &mut ApplyCx, run_id: RunId) {
        if self.any_waiting(cx.now) {
            cx.extend(self.report(cx.now));
            cx.push(Effect::Settle(self.outcome(cx.now)));
            return self.finish(cx, CommitKind::Other);
        }
        self.drain(cx, run_id);
    }

    /// Whether the session is suspended (a wake resumes it, unless it was aborted).
    pub(crate) fn is_suspended(&self) -> bool {
        matches!(
            self.record.status,
            super::Status::SuspendedClientTool | super::Status::SuspendedAwaitingChildren
        )
    }

    /// Whether the runtime resumes this session by itself now (`auto_resume`): it is
    /// suspended, none of its own calls waits, and no child waits on anything but this
    /// resume (see `ChildCalls::any_waiting_on_others`).
    pub(super) fn owes_itself_a_resume(&self, now: u64) -> bool {
        self.policy.auto_resume
            && self.is_suspended()
            && !self.pending.any_waiting(now)
            && !self.children.any_waiting_on_others()
    }

    /// Whether some call of the suspension still waits: an own call unanswered and unexpired,
    /// or a child not finished.
    pub(super) fn any_waiting(&self, now: u64) -> bool {
        self.pending.any_waiting(now) || self.children.any_unfinished()
    }

    /// Children a resume must wake before it can go on.
    pub(super) fn children_to_wake(&self) -> Vec<(String, SessionId)> {
        self.children
            .in_order()
            .into_iter()
            .filter(|call| !call.state.is_finished())
            .map(|call| (call.tool_call_id.clone(), call.child.clone()))
            .collect()
    }

    /// Children recorded as running when this session was loaded: the set recovery reconciles
    /// (children started after activation are never part of it). Those of this process are
    /// inspected; a remote one is watched by its driver, which reports like a child.
    pub(crate) fn children_to_reconcile(&self) -> ToReconcile {
        let mut reconcile = ToReconcile::default();
        if self.is_busy() {
            return reconcile;
        }
        let mut running = self.children.running();
        for (call, child) in self.companions.running() {
            if !running.iter().any(|(known, _)| *known == call) {
                running.push((call, child));
            }
        }
        for (call, child) in running {
            match self.remote_drive(&call, Drive::Watch) {
                Some(drive) => reconcile.watch.push(drive),
                None => reconcile.inspect.push((call, child)),
            }
        }
        reconcile
    }

    /// Where a report naming `call_id` comes from: the child, and from which of its chunks on
    /// the report must carry its stream (`None`: a companion, whose stream stays its own).
    /// `None` for a call nothing waits on any more.
    pub(crate) fn report_source(&self, call_id: &str) -> Option<(SessionId, Option<u64>)> {
        if let Some(companion) = self.companions.by_turn_call(call_id) {
            return Some((companion.child.clone(), None));
        }
        self.children.get(call_id).map(|entry| {
            let forwarded = entry.companion.is_none().then_some(entry.forwarded);
            (entry.child.clone(), forwarded)
        })
    }

    /// Writes the terminal outcomes background recovery found, for entries still marked running
    /// that no step or resume waits on.
    pub(super) fn reconciled(&mut self, cx: &mut ApplyCx, results: Vec<(String, ChildState)>) {
        let mut changed = false;
        for (call_id, state) in results {
            // A step or resume that waits on the child learns its outcome from its report.
            if self.waits_on(&call_id) {
                continue;
            }
            if self.companion_reconciled(cx, &call_id, &state) {
                changed = true;
            }
            if let Some(entry) = self.children.by_id.get_mut(&call_id) {
                if entry.state == ChildState::Running {
                    entry.state = state;
                    let entry = entry.clone();
                    cx.staged.index.push(IndexWrite::PutChild(entry));
                    changed = true;
                }
            }
        }
        if changed {
            self.finish_entries(cx, CommitKind::Other);
        }
    }
}

/// Where the child of a call of `tool` lives, if on another server.
fn remote_of(agent: &crate::definition::AgentDefinition, tool: &str) -> Option<RemoteChild> {
    match agent.tool(tool).map(|tool| &tool.def.kind) {
        Some(ToolKind::RemoteSubAgent { endpoint, agent }) => Some(RemoteChild {
            endpoint: endpoint.clone(),
            agent: agent.clone(),
        }),
        _ => None,
    }
}

/// The child's first message: the call's `input.message`.
fn child_message(input: &Value) -> Option<String> {
    input
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
}
