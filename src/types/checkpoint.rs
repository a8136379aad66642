//! Checkpoints: positions in a session's durable history, and the forks made from them.
//!
//! Every commit that appends to a session's log (a run's start, each step's two commits, a
//! suspension, a run's end) is a checkpoint. Nothing is written for it: the log entry is
//! already there, and reading a checkpoint rebuilds the session from the entries up to it.

use serde::{Deserialize, Serialize};

pub use super::fork_origin::{CheckpointId, ForkOrigin};

use crate::types::ids::{RunId, SessionId};
use crate::types::message::{Message, ToolCall};
use crate::types::record::{RunRecord, SessionRecord, Status};

/// One checkpoint of a session, as [`Runtime::checkpoints`](crate::Runtime::checkpoints)
/// lists it: where it sits (run, step, stream position, time) and what the commit recorded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Its id within the session.
    pub id: CheckpointId,
    /// The session.
    pub session: SessionId,
    /// The run in progress (or last run) at this point, `None` before any run.
    pub run_id: Option<RunId>,
    /// That run's turn number (0 before any run).
    pub turn: u32,
    /// Model calls the run had made.
    pub step: u32,
    /// Stream chunks recorded up to here: a follower that had read them all was here.
    pub stream_seq: u64,
    /// When it was committed (clock ms).
    pub at_ms: u64,
    /// Where the session stood after the commit.
    pub status: Status,
    /// The messages the commit recorded: a user's message, the model's reply with its tool
    /// calls, the tools' results.
    pub messages: Vec<Message>,
    /// The calls of the model's last reply that had no result yet here: pending client tools
    /// and approvals in a suspension, calls in flight inside a step.
    pub open_calls: Vec<ToolCall>,
}

/// A session as it was at a checkpoint ([`Runtime::state_at`](crate::Runtime::state_at)).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PastState {
    /// The checkpoint.
    pub checkpoint: Checkpoint,
    /// The session's record as of the checkpoint.
    pub record: SessionRecord,
    /// The conversation up to the checkpoint, in order.
    pub messages: Vec<Message>,
    /// The runs up to the checkpoint, each as it stood then.
    pub runs: Vec<RunRecord>,
    /// The sub-agent sessions at work at the checkpoint (a sub-agent call without a result),
    /// for reading the tree: each has checkpoints of its own.
    pub children: Vec<SessionId>,
}

/// What [`Runtime::state_at`](crate::Runtime::state_at) found.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum StateAt {
    /// The session as it was at the checkpoint.
    Found(Box<PastState>),
    /// The checkpoint was compacted away (the agent keeps fewer): the session's oldest
    /// checkpoint now is `oldest_kept`.
    Compacted {
        /// The oldest checkpoint the session still has.
        oldest_kept: CheckpointId,
    },
    /// The session has no such checkpoint (not yet).
    Unknown,
}

impl StateAt {
    /// The state, if the checkpoint was found.
    pub fn found(self) -> Option<PastState> {
        match self {
            StateAt::Found(past) => Some(*past),
            StateAt::Compacted { .. } | StateAt::Unknown => None,
        }
    }
}

/// Which checkpoints of a session are kept: the newest `keep_last`, and those younger than
/// `max_age_ms` (by the session's clock); the newest is always kept, and a checkpoint either
/// rule lets go is merged into the oldest kept ([`Runtime::compact_checkpoints`](crate::Runtime::compact_checkpoints),
/// [`AgentBuilder::retention`](crate::definition::AgentBuilder::retention)). The default keeps
/// every checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retention {
    /// Keep at most this many of the newest checkpoints (at least 1).
    pub keep_last: Option<usize>,
    /// Keep only checkpoints younger than this (ms).
    pub max_age_ms: Option<u64>,
}

impl Retention {
    /// Every checkpoint kept.
    pub fn all() -> Self {
        Self::default()
    }

    /// The newest `n` checkpoints kept (at least 1).
    pub fn keep_last(n: usize) -> Self {
        Self::default().and_keep_last(n)
    }

    /// Checkpoints younger than `ms` kept (and the newest).
    pub fn max_age_ms(ms: u64) -> Self {
        Self::default().and_max_age_ms(ms)
    }

    /// Also keep no more than the newest `n`.
    #[must_use]
    pub fn and_keep_last(mut self, n: usize) -> Self {
        self.keep_last = Some(n.max(1));
        self
    }

    /// Also keep none older than `ms`.
    #[must_use]
    pub fn and_max_age_ms(mut self, ms: u64) -> Self {
        self.max_age_ms = Some(ms);
        self
    }

    /// Whether any checkpoint is ever let go.
    pub fn is_all(&self) -> bool {
        self.keep_last.is_none() && self.max_age_ms.is_none()
    }
}

/// What a compaction of a session's checkpoints did
/// ([`Runtime::compact_checkpoints`](crate::Runtime::compact_checkpoints)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compaction {
    /// Checkpoints merged into the oldest kept (0: there were no more than the number kept).
    pub removed: usize,
    /// The session's oldest checkpoint now.
    pub oldest_kept: CheckpointId,
}

/// An answer a fork starts with, for a call of the source's that had no result at the
/// checkpoint ([`ForkOptions::answer`]): another client result or approval decision than the
/// source got, or a result in place of a server call that was in flight there.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ForkAnswer {
    /// A client tool's result (checked against its output schema), or the result a server
    /// call in flight at the checkpoint gets instead of `tool_durability_error`.
    Result(serde_json::Value),
    /// An error as the call's result.
    Error(String),
    /// Approves an approval call: the tool runs in the fork, with its input.
    Approve,
    /// Denies an approval call, with a reason or not.
    Deny(Option<String>),
}

impl ForkAnswer {
    /// The answer its wire form gives (`POST /fork`'s `answers`, a scenario's): exactly one
    /// of `result`, `error` and `approved` (with `reason` for a denial); `None` otherwise.
    pub fn from_fields(
        result: Option<serde_json::Value>,
        error: Option<String>,
        approved: Option<bool>,
        reason: Option<String>,
    ) -> Option<Self> {
        match (result, error, approved) {
            (Some(value), None, None) => Some(ForkAnswer::Result(value)),
            (None, Some(error), None) => Some(ForkAnswer::Error(error)),
            (None, None, Some(true)) => Some(ForkAnswer::Approve),
            (None, None, Some(false)) => Some(ForkAnswer::Deny(reason)),
            _ => None,
        }
    }
}

/// How [`Runtime::fork`](crate::Runtime::fork) continues the fork.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct ForkOptions {
    /// The new session's id; a fresh one if `None`. Must not exist.
    pub id: Option<SessionId>,
    /// A new user message the fork continues with (a new run), over anything that waited at
    /// the checkpoint.
    pub message: Option<String>,
    /// Replaces the last user message at the checkpoint: the fork's history ends just before
    /// that message, and the fork runs with this text instead.
    pub edit_last_message: Option<String>,
    /// Answers for calls without a result at the checkpoint, by call id: the fork records
    /// them (through the submit contract for calls that wait) and goes on.
    pub answers: Vec<(String, ForkAnswer)>,
}

impl ForkOptions {
    /// A fork that stays at the checkpoint: calls that waited there wait again.
    pub fn new() -> Self {
        Self::default()
    }

    /// The fork gets this id.
    #[must_use]
    pub fn id(mut self, id: SessionId) -> Self {
        self.id = Some(id);
        self
    }

    /// The fork continues with a new user message.
    #[must_use]
    pub fn message(mut self, text: impl Into<String>) -> Self {
        self.message = Some(text.into());
        self
    }

    /// The fork runs with `text` in place of the last user message.
    #[must_use]
    pub fn edit_last_message(mut self, text: impl Into<String>) -> Self {
        self.edit_last_message = Some(text.into());
        self
    }

    /// The fork starts with this answer for call `tool_call_id` (LangGraph's `update_state`,
    /// as a fork: the source keeps its own answer). Once every call that waited is answered,
    /// the fork goes on.
    #[must_use]
    pub fn answer(mut self, tool_call_id: impl Into<String>, answer: ForkAnswer) -> Self {
        self.answers.push((tool_call_id.into(), answer));
        self
    }
}

/// Why a fork was refused: nothing was written, except for [`ForkError::ContinuationFailed`]
/// (the fork exists; going on from it failed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ForkError {
    /// The session has no such checkpoint.
    #[error("session {session} has no checkpoint {checkpoint}")]
    UnknownCheckpoint {
        /// The session.
        session: SessionId,
        /// The checkpoint asked for.
        checkpoint: CheckpointId,
    },
    /// The checkpoint was compacted away (its agent keeps fewer checkpoints).
    #[error("checkpoint {checkpoint} of session {session} was compacted away; its oldest checkpoint is {oldest_kept}")]
    Compacted {
        /// The session.
        session: SessionId,
        /// The checkpoint asked for.
        checkpoint: CheckpointId,
        /// The oldest checkpoint the session still has.
        oldest_kept: CheckpointId,
    },
    /// Only a tree's root is forked (a sub-agent is forked with its root).
    #[error("session {session} is a sub-agent of {root}: fork the root")]
    NotARoot {
        /// The session asked for.
        session: SessionId,
        /// Its tree's root.
        root: SessionId,
    },
    /// A sub-agent was at work at the checkpoint and had reported nothing its parent recorded
    /// by then, and the tree has moved on since: where it stood at the checkpoint is not
    /// known (a tree is forked with such a child only at its latest checkpoint).
    #[error("session {session} had sub-agents at work at checkpoint {checkpoint} (calls {calls:?}) that had reported nothing by then, and has moved on since: fork its latest checkpoint, or one where they had reported")]
    SubAgentsMovedOn {
        /// The session.
        session: SessionId,
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The sub-agent calls without a result there.
        calls: Vec<String>,
    },
    /// Remote sub-agents were at work at the checkpoint: a remote server offers no fork yet.
    #[error("session {session} waits on remote sub-agents at checkpoint {checkpoint} (calls {calls:?}), which cannot be forked")]
    RemoteSubAgents {
        /// The session.
        session: SessionId,
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The remote sub-agent calls without a result there.
        calls: Vec<String>,
    },
    /// The session has persistent sub-agents, which are not forked yet.
    #[error("session {session} has persistent sub-agents ({names:?}), which are not forked yet")]
    HasCompanions {
        /// The session.
        session: SessionId,
        /// Their names.
        names: Vec<String>,
    },
    /// `edit_last_message` at a checkpoint with no user message before it.
    #[error("session {session} has no user message at or before checkpoint {checkpoint} to edit")]
    NoMessageToEdit {
        /// The session.
        session: SessionId,
        /// The checkpoint.
        checkpoint: CheckpointId,
    },
    /// Both `message` and `edit_last_message` were given, or a message and answers.
    #[error("a fork takes a new message, an edited last message, or answers, one of them")]
    MessageAndEdit,
    /// An answer of [`ForkOptions::answer`] does not fit its call.
    #[error("session {session} at checkpoint {checkpoint}: call {call} cannot take that answer: {reason}")]
    CannotAnswer {
        /// The session.
        session: SessionId,
        /// The checkpoint.
        checkpoint: CheckpointId,
        /// The call.
        call: String,
        /// Why (no such call waits there, the wrong kind of answer, the output schema).
        reason: String,
    },
    /// The id asked for the fork is taken.
    #[error("session {0} already exists")]
    IdTaken(SessionId),
    /// The fork was made and is durable, but going on from it failed (its resume, its new
    /// message's run, or one of its answers): it stands as any session does after such a
    /// failure, and is resumed, answered or given a message as any other.
    #[error("the fork {fork} was made, but going on from it failed ({code}): {reason}")]
    ContinuationFailed {
        /// The fork.
        fork: SessionId,
        /// The failure's stable code (`Error::code`).
        code: String,
        /// What failed.
        reason: String,
    },
}
