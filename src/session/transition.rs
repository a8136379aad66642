//! What applying an input produces: one commit, then effects, in order.

use std::sync::Arc;

use serde_json::Value;

use super::child_calls::ChildStart;
use super::{ChildReport, RunOutcome, Verdict};
use crate::definition::AgentDefinition;
use crate::llm::ModelRequest;
use crate::remote::{Drive, RemoteChild};
use crate::store::schema::Commit;
use crate::types::hooks::HookEvent;
use crate::types::ids::{RunId, SessionId};
use crate::types::message::ToolCall;

/// Something the session actor must do after the commit is durable.
#[derive(Debug)]
pub(crate) enum Effect {
    /// Ask the model; feed the answer back as `Input::ModelReplied`.
    CallModel {
        run_id: RunId,
        step: u32,
        /// The chunks the session has recorded once this transition's commit is durable: the
        /// model's deltas come after them (see [`crate::types::stream::Delta::after_seq`]).
        after_seq: u64,
        request: ModelRequest,
        /// The agent's skills and the names to preload: the catalog is read (IO) where the
        /// model is called, not in the core.
        skills: Option<crate::skills::PromptSkills>,
    },
    /// Run server tools: `parallel` at once, then `sequential` in order, stopping at the first
    /// that finishes the run; feed the outcomes back as `Input::ToolsFinished`.
    RunTools {
        /// The agent whose tools they are.
        agent: Arc<AgentDefinition>,
        run_id: RunId,
        step: u32,
        parallel: Vec<ToolCall>,
        sequential: Vec<ToolCall>,
        state: Arc<Value>,
        /// The message seq of the reply whose calls these are (their idempotency keys).
        reply_seq: u64,
        /// Cut calls their tool's check settles before anything runs again.
        checks: Vec<String>,
        /// The answers given to calls that asked for input, by call id (each such call runs
        /// again with them).
        answers: std::collections::HashMap<String, Arc<[crate::definition::InputAnswer]>>,
    },
    /// Start a child session of this process for a sub-agent call, or re-attach to the one
    /// that exists. (A remote child is started by [`Effect::DriveRemote`].)
    StartChild(ChildStart),
    /// Wake suspended children of this process (a resume cascading down the tree): each
    /// reports back. Pairs of (the sub-agent call, its child). (A remote child is woken by
    /// [`Effect::DriveRemote`].)
    WakeChildren(Vec<(String, SessionId)>),
    /// Drive the remote child of a sub-agent call: start, wake, follow or watch it (its report
    /// comes back as `RemoteReported`, or `RemoteUnreachable`).
    DriveRemote(RemoteDrive),
    /// Interrupt (or abort) children the run will no longer wait for, each where it lives.
    StopChildren { children: Vec<ChildAt>, abort: bool },
    /// Cancel the model call and the tools in flight (their futures are dropped; whatever they
    /// would have answered is ignored): an interrupt or abort ended the run they belong to.
    CancelWork,
    /// Fire a hook.
    Hook(HookEvent),
    /// Report something to tracing and the runtime's metrics.
    Observe(Observation),
    /// Every call of the suspension is answered and the runtime resumes on its own: queue a
    /// resume behind this input.
    AutoResume,
    /// Tell `parent` where this session stands, for its call `tool_call_id`.
    Report {
        parent: SessionId,
        tool_call_id: String,
        report: ChildReport,
    },
    /// Start this companion's deferred turn again, now that the run it waited for stopped.
    StartAgain(ChildStart),
    /// A deadline was armed at `at` (the earliest of this commit's): the scheduler may need to
    /// wake earlier.
    ArmDeadline { at: u64 },
    /// The run ended or suspended: answer whoever waits for it.
    Settle(RunOutcome),
    /// A question of call `idempotency_key` of `agent`'s `tool` is closed without the tool
    /// running again (its deadline passed, the run stopped, another call finished the run):
    /// tell the tool's handler, which may hold something open for the answer.
    QuestionClosed {
        agent: Arc<AgentDefinition>,
        tool: String,
        idempotency_key: String,
    },
}

/// A remote child to drive, with all the actor needs to do it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RemoteDrive {
    /// The sub-agent call the child runs: its report names it.
    pub(crate) call: String,
    /// The child's id, here and on its server.
    pub(crate) child: SessionId,
    /// Where it lives.
    pub(crate) remote: RemoteChild,
    /// Its stream chunks this session has copied already: the driver reads the rest.
    pub(crate) forwarded: u64,
    /// What to do.
    pub(crate) how: Drive,
}

/// A child session, and where it lives if on another server.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ChildAt {
    pub(crate) child: SessionId,
    /// `None` for a child of this process.
    pub(crate) remote: Option<RemoteChild>,
}

/// The result of applying one input: the writes to make durable first, then the effects.
#[derive(Debug, Default)]
pub(crate) struct Transition {
    pub(crate) commit: Option<Commit>,
    pub(crate) effects: Vec<Effect>,
    /// For a submit: what the session decided. `Accepted` is acknowledged only once the commit
    /// is durable.
    pub(crate) verdict: Option<Verdict>,
}

/// Something worth a tracing event and a metric.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Observation {
    /// A call became pending.
    Suspended {
        tool_call_id: String,
        tool_name: String,
        deadline_at_ms: u64,
    },
    /// A submitted answer was accepted after waiting `wait_ms`.
    Answered {
        tool_call_id: String,
        wait_ms: u64,
        has_error: bool,
    },
    /// A call expired `lag_ms` after its deadline.
    TimedOut { tool_call_id: String, lag_ms: u64 },
    /// Unanswered calls dropped by an interrupt or abort.
    Aborted { count: usize },
    /// Unanswered calls closed by a new message.
    Abandoned { count: usize },
    /// A model's call id was empty or already used, so the call got an id of the runtime's
    /// own (`reason`: `empty` or `repeated`).
    CallIdAssigned {
        original: String,
        assigned: String,
        reason: &'static str,
    },
}
