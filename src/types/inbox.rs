//! The inbox: every call that waits for a person, across sessions
//! ([`Runtime::inbox`](crate::Runtime::inbox)).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::types::ids::SessionId;
use crate::types::record::PendingKind;

/// Which waiting calls [`Runtime::inbox`](crate::Runtime::inbox) lists: those of one agent,
/// one kind, one tool, or all (the default).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct InboxFilter {
    /// Only calls made by sessions of this agent.
    pub agent: Option<String>,
    /// Only client-tool calls, only approvals, or only reconciliations.
    pub kind: Option<PendingKind>,
    /// Only calls of this tool.
    pub tool: Option<String>,
}

impl InboxFilter {
    /// Every waiting call.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only calls made by sessions of `agent`.
    #[must_use]
    pub fn agent(mut self, agent: impl Into<String>) -> Self {
        self.agent = Some(agent.into());
        self
    }

    /// Only calls of this kind.
    #[must_use]
    pub fn kind(mut self, kind: PendingKind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// Only calls of `tool`.
    #[must_use]
    pub fn tool(mut self, tool: impl Into<String>) -> Self {
        self.tool = Some(tool.into());
        self
    }
}

/// Where a page of the inbox starts: opaque, from [`Inbox::next`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct InboxCursor(pub String);

/// One call that waits for a person.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InboxItem {
    /// A client tool's call, an approval, a reconciliation (a call a crash cut), or a tool's
    /// question (`input`).
    pub kind: PendingKind,
    /// The session that made the call (answer it against `root`).
    pub session: SessionId,
    /// The root of its tree, where answers are submitted.
    pub root: SessionId,
    /// The session's agent.
    pub agent: String,
    /// The call.
    pub tool_call_id: String,
    /// Its tool.
    pub tool_name: String,
    /// The tool's description, if the agent is defined here.
    pub description: Option<String>,
    /// The tool's input schema, if it has one and the agent is defined here.
    pub input_schema: Option<Value>,
    /// For a client tool: the schema its result must match, if it has one and the agent is
    /// defined here.
    #[serde(default)]
    pub output_schema: Option<Value>,
    /// For an approval: whether the person may edit the call's input when approving
    /// ([`Approval::Editable`](crate::Approval::Editable)).
    #[serde(default)]
    pub editable: bool,
    /// The call's input.
    pub input: Value,
    /// For an approval: the id its answer must carry.
    pub approval_id: Option<String>,
    /// For an approval: what it is bound to ([`Submit::bound_to`](crate::Submit::bound_to)).
    pub binding: Option<String>,
    /// When it started waiting (clock ms).
    pub since_ms: u64,
    /// When it times out (clock ms).
    pub deadline_at_ms: u64,
    /// For a reconciliation: the call's idempotency key, to look its effect up by (a
    /// question carries its call's too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// For an `input` call (a tool asked a person while it ran): the question, and the schema
    /// its answer must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<crate::definition::InputRequest>,
    /// For an `input` call: the number of the question it waits on (1 for its first); an
    /// answer may name it, so that a retried answer to an earlier question is not taken for
    /// this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<u32>,
}

/// What a person's side needs to know of a tool to show and answer its calls
/// ([`Runtime::tool_info`](crate::Runtime::tool_info)): what it does, the input it takes, the
/// result it must give (a client tool's), and whether its approval allows edits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ToolInfo {
    /// The tool's description, if it has one.
    pub description: Option<String>,
    /// The schema of its input, if it has one.
    pub input_schema: Option<Value>,
    /// The schema a client tool's result must match, if it has one.
    pub output_schema: Option<Value>,
    /// Whether a person approving a call may edit its input.
    pub editable: bool,
}

/// A page of the inbox, soonest deadline first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Inbox {
    /// The calls, soonest deadline first.
    pub items: Vec<InboxItem>,
    /// Where the next page starts; `None` when the inbox was read to its end.
    pub next: Option<InboxCursor>,
}
