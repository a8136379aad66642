//! The per-session stream: typed chunks with sequence numbers, stored with the commit that
//! produced them, so a reader can follow from any sequence number, across restarts.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::types::ids::RunId;
use crate::types::message::ToolOutcome;
use crate::types::record::{RunError, Status};

/// One event of a session's stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    /// Position in the session's stream, from 0, without gaps.
    pub seq: u64,
    /// The run that produced it.
    pub run_id: RunId,
    /// Clock time (ms).
    pub at_ms: u64,
    /// What happened.
    pub kind: ChunkKind,
}

/// What a [`Chunk`] reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ChunkKind {
    /// A run started.
    RunStart {
        /// Its turn number.
        turn: u32,
        /// The suspended (or interrupted) run this one resumes; `None` for a run a message
        /// started.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resumes: Option<RunId>,
    },
    /// The model said something.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call was dispatched (or became pending).
    ToolStart {
        /// The call.
        tool_call_id: String,
        /// The tool.
        tool_name: String,
        /// Its input.
        input: Value,
    },
    /// A tool call produced its outcome.
    ToolEnd {
        /// The call.
        tool_call_id: String,
        /// The tool.
        tool_name: String,
        /// What it produced.
        outcome: ToolOutcome,
    },
    /// A call waits for a person's approval.
    ToolApprovalRequest {
        /// The call.
        tool_call_id: String,
        /// The tool.
        tool_name: String,
        /// Its input.
        input: Value,
        /// `{runId}::{toolCallId}`.
        approval_id: String,
        /// What the approval is bound to: a digest of the input and the tool's definition. A
        /// decision that names it ([`Submit::bound_to`](crate::Submit::bound_to)) is accepted
        /// only for this very call.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        binding: Option<String>,
    },
    /// A person's decision on an approval call, recorded by the resume that acts on it, in
    /// the same commit that dispatches the approved tool (before it runs).
    ToolApprovalResponse {
        /// The call.
        tool_call_id: String,
        /// The tool.
        tool_name: String,
        /// `{runId}::{toolCallId}`, as the request announced it.
        approval_id: String,
        /// Approved (the tool runs) or denied (it never runs).
        approved: bool,
        /// Why, if the person said.
        reason: Option<String>,
        /// The input the person approved the call with, when they edited it (the tool runs
        /// with it; the model's own is in its reply).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        edited_input: Option<serde_json::Value>,
    },
    /// A `load_skill` call returned a skill's instructions (informational: a client may show
    /// it, and need not).
    SkillLoaded {
        /// The `load_skill` call.
        tool_call_id: String,
        /// The skill.
        name: String,
    },
    /// A sub-agent started.
    SubagentStart {
        /// The child session.
        session_id: String,
        /// The tool call that started it.
        tool_call_id: String,
    },
    /// A sub-agent ended.
    SubagentEnd {
        /// The child session.
        session_id: String,
        /// The tool call that started it.
        tool_call_id: String,
    },
    /// A chunk of a sub-agent's stream, copied into its parent's (and so on up to the root).
    Forwarded {
        /// The child session that produced it.
        session_id: String,
        /// The parent's tool call the child runs.
        tool_call_id: String,
        /// The child's chunk, with the child's own sequence number.
        chunk: Box<Chunk>,
    },
    /// The run suspended.
    RunSuspended {
        /// The suspended status.
        status: Status,
        /// The calls it waits on.
        tool_call_ids: Vec<String>,
    },
    /// The run was interrupted.
    RunInterrupted {
        /// Why.
        error: Option<RunError>,
    },
    /// The run ended.
    RunEnd {
        /// How.
        status: Status,
        /// Why it failed, if it did.
        error: Option<RunError>,
    },
}

impl ChunkKind {
    /// The stable snake_case name of the chunk type. A child's chunk forwarded into its
    /// parent's stream reads as what it reports, so a follower that stops at `run_end` must
    /// also check [`ChunkKind::is_forwarded`], or it stops at the child's end.
    pub fn type_name(&self) -> &'static str {
        match self {
            ChunkKind::RunStart { .. } => "run_start",
            ChunkKind::Text { .. } => "text",
            ChunkKind::ToolStart { .. } => "tool_start",
            ChunkKind::ToolEnd { .. } => "tool_end",
            ChunkKind::ToolApprovalRequest { .. } => "tool_approval_request",
            ChunkKind::ToolApprovalResponse { .. } => "tool_approval_response",
            ChunkKind::SkillLoaded { .. } => "skill_loaded",
            ChunkKind::SubagentStart { .. } => "subagent_start",
            ChunkKind::SubagentEnd { .. } => "subagent_end",
            // A forwarded chunk reads as what it reports: the parent's stream shows the child's
            // events in place.
            ChunkKind::Forwarded { chunk, .. } => chunk.kind.type_name(),
            ChunkKind::RunSuspended { .. } => "run_suspended",
            ChunkKind::RunInterrupted { .. } => "run_interrupted",
            ChunkKind::RunEnd { .. } => "run_end",
        }
    }

    /// Whether this is a child's chunk forwarded into its parent's stream.
    pub fn is_forwarded(&self) -> bool {
        matches!(self, ChunkKind::Forwarded { .. })
    }

    /// Whether the stream's own run stops here: it ended, suspended or was interrupted. A
    /// forwarded child's chunk never does. Where a follower that waits for the run to settle
    /// stops reading.
    pub fn settles_run(&self) -> bool {
        matches!(
            self,
            ChunkKind::RunEnd { .. }
                | ChunkKind::RunSuspended { .. }
                | ChunkKind::RunInterrupted { .. }
        )
    }
}

/// A piece of a model reply as the provider streams it. Deltas are live only: they reach
/// whoever follows the session at that moment ([`Runtime::follow_live`](crate::Runtime::follow_live))
/// and are never stored; the step's assembled reply is committed as its `text` and
/// `tool_start` chunks when the step ends, as with a model that does not stream. A follower
/// that falls behind may miss deltas, never chunks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    /// The run whose model call produced it.
    pub run_id: RunId,
    /// The step (model call) within the run.
    pub step: u32,
    /// Its position among the step's deltas, from 0: a gap means a delta was missed.
    pub index: u32,
    /// The sequence number of the first chunk after the model call: a follower shows the
    /// delta only when it has delivered every chunk before it and none of the step's own.
    pub after_seq: u64,
    /// What arrived.
    #[serde(flatten)]
    pub kind: DeltaKind,
}

/// What a [`Delta`] carries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum DeltaKind {
    /// More of the reply's text.
    TextDelta {
        /// The new text.
        text: String,
    },
    /// More of one tool call: its id and name come first (once), its arguments in fragments.
    ToolCallDelta {
        /// Which call of the reply (0-based, in the provider's order).
        position: u32,
        /// The call's id, when this fragment carries it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// The tool's name, when this fragment carries it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// A fragment of the arguments' JSON text.
        arguments: String,
    },
}

/// What [`Runtime::follow_live`](crate::Runtime::follow_live) yields: the stored chunks, in
/// order, with the live deltas of model calls in between.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamEvent {
    /// A stored chunk.
    Chunk(Chunk),
    /// A live delta of a model call in progress.
    Delta(Delta),
}
