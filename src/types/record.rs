//! What a session stores: its snapshot record and its run records.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::types::ids::{RunId, SessionId};

/// Where a session (or one of its runs) stands. Never a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// A run is in progress.
    Running,
    /// The last run finished normally.
    Completed,
    /// The last run failed (see its error); a new message starts a new turn.
    Failed,
    /// The last run was interrupted (by request, or cut by a crash); `resume` continues it.
    Interrupted,
    /// The run waits for client tools or approvals.
    SuspendedClientTool,
    /// The run waits for sub-agents that are themselves waiting.
    SuspendedAwaitingChildren,
}

impl Status {
    /// The stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Interrupted => "interrupted",
            Status::SuspendedClientTool => "suspended_client_tool",
            Status::SuspendedAwaitingChildren => "suspended_awaiting_children",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The stable code of an error a run ended with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// A scripted model ran out of replies.
    ScriptExhausted,
    /// The run used all its steps and the model still wanted tools.
    MaxSteps,
    /// The model provider failed.
    ModelError,
    /// The model provider kept refusing the call for its rate limit.
    RateLimited,
    /// The conversation no longer fits the model's context window.
    ContextLengthExceeded,
    /// The model provider refused the credentials.
    Auth,
    /// The process died while the run was in progress.
    Crashed,
    /// The session was aborted.
    Aborted,
    /// The run was interrupted by request.
    Interrupted,
    /// A resume or a new message was refused because the session was aborted.
    NotResumable,
    /// The session is a fork made from a checkpoint inside this run (suspended or within a
    /// step): `resume` goes on from there, as after a crash (calls that waited wait again,
    /// a call in flight gets `tool_durability_error` unless it is safe to retry).
    ForkPoint,
}

impl ErrorCode {
    /// The stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::ScriptExhausted => "script_exhausted",
            ErrorCode::MaxSteps => "max_steps",
            ErrorCode::ModelError => "model_error",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::ContextLengthExceeded => "context_length_exceeded",
            ErrorCode::Auth => "auth",
            ErrorCode::Crashed => "crashed",
            ErrorCode::Aborted => "aborted",
            ErrorCode::Interrupted => "interrupted",
            ErrorCode::NotResumable => "not_resumable",
            ErrorCode::ForkPoint => "fork_point",
        }
    }
}

/// An error a run ended with: a stable code and a sentence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunError {
    /// The stable code.
    pub code: ErrorCode,
    /// What happened.
    pub message: String,
}

/// The snapshot of a session: small, mutable, rewritten by each commit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The session.
    pub id: SessionId,
    /// The agent it runs.
    pub agent: String,
    /// Where it stands.
    pub status: Status,
    /// The root of its tree (itself for a root).
    pub root: SessionId,
    /// Its parent, for a sub-agent.
    pub parent: Option<SessionId>,
    /// When it was created (clock ms).
    pub created_at_ms: u64,
    /// When it was last written (clock ms).
    pub updated_at_ms: u64,
    /// Messages recorded (the next message's sequence number).
    pub message_count: u64,
    /// Stream chunks recorded (the next chunk's sequence number).
    pub chunk_count: u64,
    /// Runs recorded (the current run's turn number).
    pub run_count: u32,
    /// The current (or last) run.
    pub current_run: Option<RunId>,
    /// Model calls made by the current run.
    pub steps_in_run: u32,
    /// Custom state that tools change (a JSON object).
    pub custom_state: Map<String, Value>,
    /// An interrupt is requested; checked (and cleared) at the top of the next step.
    pub interrupt_requested: bool,
    /// The session was aborted: terminal, nothing runs again.
    #[serde(default)]
    pub aborted: bool,
    /// What the suspended run waits on.
    #[serde(default)]
    pub suspension: Option<Suspension>,
    /// For a sub-agent: the parent's tool call that started it.
    #[serde(default)]
    pub parent_call: Option<String>,
    /// How many ancestors it has (0 for a root).
    #[serde(default)]
    pub depth: u32,
    /// The first message of the conversation the model sees: a companion spawned fresh after
    /// it failed or was terminated starts over here (the earlier messages stay stored).
    #[serde(default)]
    pub history_start: u64,
    /// Commits that appended to the session's log (the next log entry's sequence number).
    #[serde(default)]
    pub log_count: u64,
    /// For a remote sub-agent: its parent and root on the server that started it. It is the
    /// root of its tree here (its calls are routed here), but a child by the rules: its turns
    /// are its parent's, and answers for its calls come through that root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_parent: Option<crate::types::remote::RemoteParent>,
    /// For a fork: the session and checkpoint its history was copied from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<crate::types::fork_origin::ForkOrigin>,
}

/// One run: an `execute` or a `resume`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run.
    pub run_id: RunId,
    /// Its number among the session's runs, from 1: every `execute` and every `resume` is
    /// a run, so an execute, a resume and a second execute are turns 1, 2 and 3.
    pub turn: u32,
    /// The suspended run this one resumed.
    pub previous_run_id: Option<RunId>,
    /// Where it stands.
    pub status: Status,
    /// When it started (clock ms).
    pub started_at_ms: u64,
    /// When it ended or suspended (clock ms).
    pub ended_at_ms: Option<u64>,
    /// Model calls it made.
    pub steps: u32,
    /// The final assistant text.
    pub text: Option<String>,
    /// The finish value.
    pub output: Option<Value>,
    /// Why it failed or was interrupted.
    pub error: Option<RunError>,
    /// Tokens and tool outcomes, per step and summed.
    #[serde(default)]
    pub usage: crate::types::usage::RunUsage,
}

impl RunRecord {
    /// The record as a log entry stores it. A run in progress is rewritten by each of its
    /// commits, and its usage entries (one per model call and tool outcome) grow with each:
    /// stored every time, a run of n steps would write on the order of n² entries (a
    /// 1,000-step run's log was 94 MB, 47 KB an entry; BENCHMARKS.md, issue 31). So a run in
    /// progress is stored with its totals and without its entries, which are written once, by
    /// the commit that suspends or ends it. A run a crash cuts keeps its totals and loses the
    /// list of its entries.
    pub(crate) fn as_stored(&self) -> RunRecord {
        if self.status != Status::Running || self.usage.entries.is_empty() {
            return self.clone();
        }
        let RunRecord {
            run_id,
            turn,
            previous_run_id,
            status,
            started_at_ms,
            ended_at_ms,
            steps,
            text,
            output,
            error,
            usage,
        } = self;
        RunRecord {
            run_id: *run_id,
            turn: *turn,
            previous_run_id: *previous_run_id,
            status: *status,
            started_at_ms: *started_at_ms,
            ended_at_ms: *ended_at_ms,
            steps: *steps,
            text: text.clone(),
            output: output.clone(),
            error: error.clone(),
            usage: usage.totals(),
        }
    }
}

/// Whether a pending call waits for a client's result or a person's approval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PendingKind {
    /// A client tool: the client runs it and submits the result.
    Client,
    /// An approval gate: a person approves or denies, and the tool runs on resume if approved.
    Approval,
    /// A server call a crash cut while it ran, of a tool that asks for reconciliation
    /// ([`OnCut::Reconcile`](crate::definition::OnCut::Reconcile)): its effect may or may not
    /// have happened, and a person (or the tool's check) says which.
    Reconcile,
    /// A server tool that asked a person for input while it ran
    /// ([`ToolContext::ask`](crate::definition::ToolContext::ask)): answered with a result (the
    /// input, checked against the request's schema) or an error (a refusal), and the tool runs
    /// again with the answer.
    Input,
}

/// The answer recorded in a pending call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Answer {
    /// A client tool's result.
    Result(Value),
    /// An error instead of a result (from the client): the model reads it. For an approval
    /// call it means the tool never runs.
    Error(String),
    /// An approval: the tool runs with its stored input on resume. The entry stays until the
    /// tool's result is recorded, so that after a crash the call is known to have been
    /// dispatched (and is re-run only if it is `safe_to_retry`).
    Approved,
    /// A denial: the tool never runs; its result is the error [`NOT_APPROVED`](crate::session::NOT_APPROVED).
    Denied {
        /// Why, as the person gave it.
        reason: Option<String>,
    },
    /// The deadline passed before an answer. The call's result (a `client_tool_timeout`
    /// error) is recorded in the conversation when it expires.
    TimedOut,
    // Last: the stored form may number variants (added after the rest).
    /// A reconciliation: the cut call's effect did not happen, so the tool runs once more on
    /// resume. Like [`Answer::Approved`], the entry stays until the tool's result is recorded,
    /// so a crash during that run finds the call dispatched (and asks again).
    DidNotHappen,
    /// An answer to a tool's question (an `input` call): the tool runs again with it on
    /// resume. Like [`Answer::Approved`], the entry stays until the tool's result is recorded.
    Input(crate::definition::InputAnswer),
}

/// A tool call waiting outside the runtime: stored one entry per call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PendingCall {
    /// The call.
    pub tool_call_id: String,
    /// The tool.
    pub tool_name: String,
    /// Its input (an approved call runs with it).
    pub input: Value,
    /// Client result or approval.
    pub kind: PendingKind,
    /// The run that made the call (part of the approval id).
    pub run_id: RunId,
    /// Position of the call in the model's reply, so answers are drained in call order.
    pub position: u32,
    /// When it became pending (clock ms).
    pub requested_at_ms: u64,
    /// When it expires (clock ms).
    pub deadline_at_ms: u64,
    /// The answer, once one is accepted (or the deadline passed).
    pub answer: Option<Answer>,
    /// When the answer was accepted (clock ms).
    pub answered_at_ms: Option<u64>,
    /// The call's input as the model made it, when an approval edited it (`input` is then
    /// the edited input, which the tool runs with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_input: Option<Value>,
    /// For an approval: what it is bound to, a digest of the call's input and its tool's
    /// definition when it was requested (the `tool_approval_request` chunk carries it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<String>,
    /// For a reconciliation or a question (`input`): the call's idempotency key, the one its
    /// tool saw ([`ToolContext::idempotency_key`](crate::definition::ToolContext::idempotency_key)),
    /// to look the effect up by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// For an `input` call: what the tool asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<crate::definition::InputRequest>,
    /// For an `input` call: the answers to the call's earlier questions, in order (the tool
    /// runs again with these and this call's answer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub answers: Vec<crate::definition::InputAnswer>,
}

impl PendingCall {
    /// `{runId}::{toolCallId}`, the id an approval must carry.
    pub fn approval_id(&self) -> String {
        format!("{}::{}", self.run_id, self.tool_call_id)
    }

    /// For an `input` call: the number of the question it waits on (1 for the call's first),
    /// which an answer may name ([`Submit::for_question`](crate::Submit::for_question)).
    pub fn question(&self) -> Option<u32> {
        (self.kind == PendingKind::Input)
            .then(|| u32::try_from(self.answers.len()).map_or(u32::MAX, |n| n.saturating_add(1)))
    }

    /// For an `input` call: the answers to its questions, this one's last once it has one.
    pub fn all_answers(&self) -> Vec<crate::definition::InputAnswer> {
        let mut answers = self.answers.clone();
        if let Some(Answer::Input(answer)) = &self.answer {
            answers.push(answer.clone());
        }
        answers
    }

    /// Whether the call still waits for an answer at `now`.
    pub fn is_waiting(&self, now: u64) -> bool {
        self.answer.is_none() && now < self.deadline_at_ms
    }
}

/// A parent's sub-agent call: which child runs it and what the parent last learned of it.
/// Stored one entry per call, so a parent with thousands of children rewrites one small entry
/// when one of them reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChildCall {
    /// The parent's tool call.
    pub tool_call_id: String,
    /// The sub-agent tool.
    pub tool_name: String,
    /// The child session (`{parent}-sub-{toolCallId}`).
    pub child: SessionId,
    /// The parent's run that made the call.
    pub run_id: RunId,
    /// Position of the call in the model's reply.
    pub position: u32,
    /// When the child was started (clock ms).
    pub started_at_ms: u64,
    /// What the parent knows of the child.
    pub state: ChildState,
    /// The child's stream chunks already copied into the parent's stream.
    pub forwarded: u64,
    /// For a call that waits on a persistent sub-agent: its name. A companion keeps its own
    /// stream (its chunks are not copied into the parent's).
    #[serde(default)]
    pub companion: Option<String>,
    /// For a remote sub-agent call: the server its child lives on (the child's id there is
    /// `child`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<crate::types::remote::RemoteChild>,
    /// For a remote child that waits on calls: when this session looks at it again by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_look: Option<crate::types::remote::RemoteLook>,
    /// For a remote sub-agent call: the calls under the child that the root lists as owned
    /// through this call, which a report of the child that no longer lists them clears. Kept
    /// apart from [`ChildState::Suspended`]'s list, which a re-attach after a crash resets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routed_calls: Vec<String>,
}

/// What a parent knows of one of its children.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ChildState {
    /// Started, and has not reported since.
    Running,
    /// Waiting on a person or a browser; `waiting` are the calls (its own and its
    /// descendants') that need an answer.
    Suspended {
        /// Tool call ids that wait, anywhere under the child.
        waiting: Vec<String>,
    },
    /// Done: its result (or error) is the parent's tool result.
    Finished(crate::types::message::ToolOutcome),
    /// Recovery could not learn how the child ended (it did not answer in time, or it is
    /// missing); a resume of the parent re-attaches to it if it exists.
    Interrupted {
        /// Why: `inspection_timed_out`, `child_missing`, `child_interrupted`.
        reason: String,
    },
}

impl ChildState {
    /// Whether the child's outcome is known.
    pub fn is_finished(&self) -> bool {
        matches!(self, ChildState::Finished(_))
    }
}

/// What a suspended run waits on. The calls themselves are the session's pending entries
/// (one store entry each), so the snapshot stays the same size however many there are.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Suspension {
    /// The suspended run.
    pub run_id: RunId,
    /// A `finish_with` call of the suspended step succeeded with this value while sub-agents
    /// of the step still waited: once they finish, the resume records their results and
    /// completes the run with it, without another model call.
    #[serde(default)]
    pub finish: Option<Value>,
}

/// A persistent sub-agent of a session, as its parent knows it: stored one entry per name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Companion {
    /// The name the parent gave it (its session is `{parent}-agent-{name}`).
    pub name: String,
    /// The agent it runs.
    pub agent: String,
    /// Whether the parent waits for its replies.
    pub mode: crate::definition::CompanionMode,
    /// Its session.
    pub child: SessionId,
    /// Where its current (or last) turn stands.
    pub status: CompanionStatus,
    /// The reply (or error) of its last finished turn.
    pub result: Option<crate::types::message::ToolOutcome>,
    /// The parent's tool call that started its current turn: the child reports to it, and a
    /// report naming an older call is stale.
    pub turn_call: String,
    /// Turns it was given since it was (last) spawned fresh.
    pub turns: u32,
    /// When it was (last) spawned fresh (clock ms).
    pub spawned_at_ms: u64,
}

/// Where a persistent sub-agent stands, as its parent knows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CompanionStatus {
    /// Its turn is in progress.
    Running,
    /// Its turn waits on a person or a browser (these calls, anywhere under it).
    Suspended {
        /// Tool call ids that wait.
        waiting: Vec<String>,
    },
    /// Its last turn ended with a reply; a new message continues its conversation.
    Completed,
    /// Its last turn failed; a new message spawns it fresh.
    Failed,
    /// Its turn was cut and recovery could not learn how it ended; a new message continues it.
    Interrupted,
    /// Terminated by the parent; spawning the name again starts it fresh.
    Terminated,
}

impl CompanionStatus {
    /// The stable snake_case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            CompanionStatus::Running => "running",
            CompanionStatus::Suspended { .. } => "suspended",
            CompanionStatus::Completed => "completed",
            CompanionStatus::Failed => "failed",
            CompanionStatus::Interrupted => "interrupted",
            CompanionStatus::Terminated => "terminated",
        }
    }

    /// Whether its turn is still going (running, or waiting on a person).
    pub fn is_working(&self) -> bool {
        matches!(
            self,
            CompanionStatus::Running | CompanionStatus::Suspended { .. }
        )
    }
}
