//! The session state machine: its state, how runs start and end, and how the writes an apply
//! staged (in its context, `apply_cx.rs`) become its commit. The transitions live beside it:
//! `step.rs` (the agent loop), `suspend.rs` (pending calls, submits, timeouts), `resume.rs`
//! (resume, interrupt, abort, abandoning calls).

use std::sync::Arc;

use serde_json::{Map, Value};

use super::apply_cx::ApplyCx;
use super::child_calls::{ChildCalls, ChildOrigin, ChildStart};
use super::companion_list::Companions;
use super::pending::PendingCalls;
use super::{
    ChildCall, Companion, Effect, PendingCall, PendingKind, RunError, RunOutcome, RunRecord,
    SessionRecord, Status,
};
use crate::definition::AgentDefinition;
use crate::store::schema::Commit;
use crate::store::CommitKind;
use crate::types::ids::{RunId, SessionId};
use crate::types::message::{Message, ToolCall, ToolOutcome};
use crate::types::stream::{Chunk, ChunkKind};
use crate::types::tool_error::ToolFailure;

/// Runtime settings the rules depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Policy {
    /// A client tool's timeout when neither the tool nor the agent sets one.
    pub(crate) client_tool_timeout_ms: u64,
    /// Resume as soon as every call of a suspension is answered or timed out.
    pub(crate) auto_resume: bool,
    /// How deep a tree of sub-agents may grow (a root is depth 0): a cycle of agents that
    /// delegate to each other ends here with a typed tool error instead of recursing forever.
    pub(crate) max_depth: u32,
    /// How deeply a JSON value from outside (a model's tool-call input, a tool's result) may
    /// nest; see `crate::types::nesting`.
    pub(crate) max_json_depth: usize,
    /// How long a remote child's server may stay unreachable before the child is written off
    /// (`RemotePolicy::patience`).
    pub(crate) remote_patience_ms: u64,
    /// The longest wait between two tries of an unreachable remote child
    /// (`RemotePolicy::max_retry_wait`).
    pub(crate) remote_retry_max_ms: u64,
}

/// A duration in whole milliseconds (saturating).
pub(crate) fn duration_ms(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The default [`Policy::max_depth`].
pub(crate) const DEFAULT_MAX_DEPTH: u32 = 8;

impl Default for Policy {
    fn default() -> Self {
        Self {
            client_tool_timeout_ms: crate::definition::DEFAULT_CLIENT_TOOL_TIMEOUT_MS,
            auto_resume: false,
            max_depth: DEFAULT_MAX_DEPTH,
            max_json_depth: crate::session::submit::DEFAULT_MAX_JSON_DEPTH,
            remote_patience_ms: duration_ms(crate::remote::RemotePolicy::default().patience),
            remote_retry_max_ms: duration_ms(crate::remote::RemotePolicy::default().max_retry_wait),
        }
    }
}

/// What happens to one call of a step.
#[derive(Debug, Clone)]
pub(super) enum CallSlot {
    /// Sent to the tool task; its outcome comes back in `ToolsFinished`.
    Dispatched,
    /// Known already; `reported` when its `tool_end` chunk was already emitted.
    Ready {
        outcome: ToolOutcome,
        reported: bool,
    },
    /// A call a crash cut, sent to the tool task for its tool's check to settle (and, if its
    /// effect did not happen, to run once more); its outcome comes back in `ToolsFinished`,
    /// or it becomes a `reconcile` call for a person.
    Checking,
    /// Waits outside the runtime (client tool, approval or reconciliation).
    Pending(PendingKind),
    /// Run by a child session; its entry in `Session::children` says how far it got.
    Child,
    /// A companion tool call, carried out when the step dispatches (it becomes `Ready` or
    /// `Child` there).
    Companion,
}

/// One call of a step: the call, what happens to it, and the custom-state keys its handler
/// set.
#[derive(Debug)]
pub(super) struct StepCall {
    pub(super) call: ToolCall,
    pub(super) slot: CallSlot,
    /// Empty until its tool returns.
    pub(super) changes: Map<String, Value>,
    /// What its tool asked a person, when it returned asking for input.
    pub(super) asked: Option<crate::definition::InputRequest>,
}

impl StepCall {
    /// A call whose tool has not changed any state (yet).
    pub(super) fn new(call: ToolCall, slot: CallSlot) -> Self {
        Self {
            call,
            slot,
            changes: Map::new(),
            asked: None,
        }
    }
}

/// A call's outcome on its way into the conversation.
#[derive(Debug)]
pub(super) struct Outcome {
    pub(super) value: ToolOutcome,
    /// Its `tool_end` chunk and hooks were emitted already (a timeout that an earlier version
    /// reported when it expired).
    pub(super) reported: bool,
    /// The custom-state keys its handler set.
    pub(super) changes: Map<String, Value>,
}

impl Outcome {
    /// An outcome not reported yet, with no state changes.
    pub(super) fn of(value: ToolOutcome) -> Self {
        Self::reported(value, false)
    }

    /// An outcome with no state changes, `reported` or not.
    pub(super) fn reported(value: ToolOutcome, reported: bool) -> Self {
        Self {
            value,
            reported,
            changes: Map::new(),
        }
    }
}

impl CallSlot {
    /// A call answered at once with an error the runtime records.
    pub(super) fn failed(error: ToolFailure) -> Self {
        CallSlot::Ready {
            outcome: error.into(),
            reported: false,
        }
    }
}

/// Where the run is between inputs (in memory only: a crash here is recovered from the
/// durable record, see [`Session::recover_after_crash`]).
#[derive(Debug)]
pub(super) enum Phase {
    Idle,
    AwaitingModel {
        run_id: RunId,
        step: u32,
    },
    AwaitingTools {
        run_id: RunId,
        step: u32,
        /// Every call of the step, in call order.
        calls: Vec<StepCall>,
        /// The server tools of the step have not returned yet.
        tools_running: bool,
    },
    /// A resume woke the suspended children in `waking`; it goes on (or reports the barrier)
    /// once each has reported.
    AwaitingChildren {
        waking: Vec<String>,
        /// The run the resume starts once they have.
        run_id: RunId,
    },
}

/// What a session keeps beside its snapshot, read back with it.
#[derive(Debug, Default)]
pub(crate) struct Stored {
    /// The current (or last) run.
    pub(crate) run: Option<RunRecord>,
    pub(crate) pending: Vec<PendingCall>,
    pub(crate) children: Vec<ChildCall>,
    pub(crate) companions: Vec<Companion>,
}

/// A session in memory: its durable record, its current run, its pending calls, and its
/// conversation while a run is in progress.
#[derive(Debug)]
pub(crate) struct Session {
    pub(super) record: SessionRecord,
    pub(super) agent: Arc<AgentDefinition>,
    pub(super) policy: Arc<Policy>,
    pub(super) run: Option<RunRecord>,
    /// Calls waiting outside the runtime (or answered and waiting for a resume), in call order.
    pub(super) pending: PendingCalls,
    /// Sub-agent calls whose child has not been recorded as a result yet.
    pub(super) children: ChildCalls,
    /// Persistent sub-agents, by name.
    pub(super) companions: Companions,
    /// Loaded for a run and released when it settles, so idle sessions stay small. Shared with
    /// the model call in flight; `Arc::make_mut` copies only if that call still holds it.
    pub(super) messages: Option<Arc<Vec<Message>>>,
    pub(super) phase: Phase,
    /// New turns of this companion that arrived while a run was still stopping (a terminate
    /// and a new spawn in one reply): started again once that run settles.
    pub(super) deferred_starts: Vec<ChildStart>,
    /// The value a `finish_with` call of the suspended step returned, while the resume that
    /// drains its children settles: the run then completes with it, without asking the model.
    pub(super) finishing: Option<Value>,
}

impl Session {
    /// A session that does not exist yet; its first `Execute` creates it.
    pub(crate) fn create(
        id: SessionId,
        agent: Arc<AgentDefinition>,
        policy: Arc<Policy>,
        now: u64,
    ) -> Self {
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
            aborted: false,
            suspension: None,
            parent_call: None,
            depth: 0,
            history_start: 0,
            log_count: 0,
            remote_parent: None,
            forked_from: None,
        };
        Self {
            record,
            agent,
            policy,
            run: None,
            pending: PendingCalls::default(),
            children: ChildCalls::default(),
            companions: Companions::default(),
            messages: Some(Arc::new(Vec::new())),
            phase: Phase::Idle,
            deferred_starts: Vec::new(),
            finishing: None,
        }
    }

    /// A sub-agent that does not exist yet.
    pub(crate) fn create_child(
        id: SessionId,
        agent: Arc<AgentDefinition>,
        policy: Arc<Policy>,
        now: u64,
        origin: ChildOrigin,
    ) -> Self {
        let mut session = Self::create(id, agent, policy, now);
        session.record.root = origin.root;
        session.record.parent = Some(origin.parent);
        session.record.parent_call = Some(origin.tool_call_id);
        session.record.depth = origin.depth;
        session
    }

    /// A session read back from the store.
    pub(crate) fn restore(
        record: SessionRecord,
        agent: Arc<AgentDefinition>,
        policy: Arc<Policy>,
        stored: Stored,
    ) -> Self {
        Self {
            record,
            agent,
            policy,
            run: stored.run,
            pending: PendingCalls::from_entries(stored.pending),
            children: ChildCalls::from_entries(stored.children),
            companions: Companions::from_entries(stored.companions),
            messages: None,
            phase: Phase::Idle,
            deferred_starts: Vec::new(),
            finishing: None,
        }
    }

    pub(crate) fn record(&self) -> &SessionRecord {
        &self.record
    }

    /// The agent the session runs.
    pub(crate) fn agent(&self) -> &AgentDefinition {
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

    /// Drops the conversation from memory once no run needs it; it is durable and reloaded for
    /// the next run. A suspended session keeps it while resident: its resume, which needs the
    /// whole conversation, is the next thing expected, and reading it back from the store
    /// would cost a scan of the session's log per cycle. Eviction still drops it.
    pub(crate) fn release_messages(&mut self) {
        if !self.is_busy() && !self.is_suspended() {
            self.messages = None;
        }
    }

    /// Ids of the calls that still wait for an answer at `now`, in call order: this session's
    /// own, then those its suspended children wait on.
    pub(crate) fn waiting_calls(&self, now: u64) -> Vec<String> {
        let mut waiting = self.pending.waiting_ids(now);
        waiting.extend(self.children.waiting_below());
        waiting
    }

    /// Starts a run record (an execute, or a resume of `previous`).
    pub(super) fn start_run(&mut self, cx: &mut ApplyCx, run_id: RunId, previous: Option<RunId>) {
        let now = cx.now;
        let turn = self.record.run_count + 1;
        self.record.run_count = turn;
        self.record.current_run = Some(run_id);
        self.record.status = Status::Running;
        self.record.suspension = None;
        self.run = Some(RunRecord {
            run_id,
            turn,
            previous_run_id: previous,
            status: Status::Running,
            started_at_ms: now,
            ended_at_ms: None,
            steps: 0,
            text: None,
            output: None,
            error: None,
            usage: Default::default(),
        });
        cx.staged.run_changed = true;
        let resumes = previous;
        self.stage_chunk(cx, run_id, ChunkKind::RunStart { turn, resumes });
    }

    /// Ends (or suspends) the current run with `status`.
    pub(super) fn end_run(&mut self, cx: &mut ApplyCx, status: Status, error: Option<RunError>) {
        let now = cx.now;
        self.phase = Phase::Idle;
        self.record.status = status;
        self.finishing = None;
        if status == Status::Failed {
            // A failed run drops its own unanswered calls and keeps the answered ones.
            self.drop_pending(cx, |call| call.answer.is_none());
        }
        let Some(run) = &mut self.run else {
            return;
        };
        run.status = status;
        run.ended_at_ms = Some(now);
        run.error = error.clone();
        cx.staged.run_changed = true;
        let run_id = run.run_id;
        let kind = match status {
            Status::Interrupted => ChunkKind::RunInterrupted { error },
            Status::SuspendedClientTool | Status::SuspendedAwaitingChildren => {
                ChunkKind::RunSuspended {
                    status,
                    tool_call_ids: self.waiting_calls(now),
                }
            }
            _ => ChunkKind::RunEnd { status, error },
        };
        self.stage_chunk(cx, run_id, kind);
        // The parent hears first, so whoever learns that this run settled finds the parent's
        // reaction already queued; then the companion turns that waited for this run to stop.
        cx.extend(self.report(now));
        cx.extend(self.deferred_starts.drain(..).map(Effect::StartAgain));
        cx.push(Effect::Settle(self.outcome(now)));
    }

    /// The current run's outcome at `now`.
    pub(crate) fn outcome(&self, now: u64) -> RunOutcome {
        let run = self.run.as_ref();
        RunOutcome {
            session_id: self.record.id.clone(),
            run_id: run.map_or(RunId::NONE, |run| run.run_id),
            turn: run.map_or(0, |run| run.turn),
            status: self.record.status,
            text: run.and_then(|run| run.text.clone()),
            output: run.and_then(|run| run.output.clone()),
            error: run.and_then(|run| run.error.clone()),
            pending: self.waiting_calls(now),
        }
    }

    pub(super) fn on_message(&self, run_id: RunId, message: Message) -> Effect {
        Effect::Hook(crate::types::hooks::HookEvent::OnMessage {
            session: self.record.id.clone(),
            run_id,
            message,
        })
    }

    pub(super) fn current_run_id(&self) -> RunId {
        self.run.as_ref().map_or(RunId::NONE, |run| run.run_id)
    }

    pub(super) fn stage_message(&mut self, cx: &mut ApplyCx, message: Message) {
        let seq = self.record.message_count;
        self.record.message_count += 1;
        if let Some(messages) = &mut self.messages {
            Arc::make_mut(messages).push(message.clone());
        }
        cx.staged.messages.push((seq, message));
    }

    pub(super) fn stage_chunk(&mut self, cx: &mut ApplyCx, run_id: RunId, kind: ChunkKind) {
        let seq = self.record.chunk_count;
        self.record.chunk_count += 1;
        cx.staged.chunks.push(Chunk {
            seq,
            run_id,
            at_ms: cx.now,
            kind,
        });
    }

    /// Makes the commit of per-call entries only (no snapshot, messages or chunks): it shares
    /// no key with any other write of the session, so it may land in any order relative to
    /// them.
    pub(super) fn finish_entries(&mut self, cx: &mut ApplyCx, kind: CommitKind) {
        let staged = std::mem::take(&mut cx.staged);
        debug_assert!(
            staged.messages.is_empty() && staged.chunks.is_empty() && !staged.run_changed
        );
        cx.commit(Commit {
            kind,
            session: self.record.id.clone(),
            tree: self.record.root.clone(),
            record: None,
            log_seq: self.record.log_count,
            messages: Vec::new(),
            runs: Vec::new(),
            chunks: Vec::new(),
            index: staged.index,
        });
    }

    /// Makes what was staged the apply's commit, with the record as it is now.
    pub(super) fn finish(&mut self, cx: &mut ApplyCx, kind: CommitKind) {
        self.record.updated_at_ms = cx.now;
        let staged = std::mem::take(&mut cx.staged);
        let runs = match (&self.run, staged.run_changed) {
            (Some(run), true) => vec![run.as_stored()],
            _ => Vec::new(),
        };
        // Every commit with a snapshot appends a log entry: the entry carries the record.
        let log_seq = self.record.log_count;
        self.record.log_count += 1;
        cx.commit(Commit {
            kind,
            session: self.record.id.clone(),
            tree: self.record.root.clone(),
            record: Some(self.record.clone()),
            log_seq,
            messages: staged.messages,
            runs,
            chunks: staged.chunks,
            index: staged.index,
        });
    }
}
