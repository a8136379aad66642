//! The conversation of a session: what the user said, what the model answered, what tools
//! returned.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A call of a tool, as the model asked for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, unique within the session.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments.
    pub input: Value,
}

impl ToolCall {
    /// A call of `name` with id `id` and `input`.
    pub fn new(id: impl Into<String>, name: impl Into<String>, input: Value) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            input,
        }
    }
}

/// What a tool call produced: a value, or an error the model reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolOutcome {
    /// The tool's result.
    Result(Value),
    /// An error; the runtime's own errors begin with their stable code (`max_steps: …`).
    Error(String),
}

impl ToolOutcome {
    /// Whether this is an error.
    pub fn is_error(&self) -> bool {
        matches!(self, ToolOutcome::Error(_))
    }

    /// The stable code of an error the runtime recorded (a timeout, a refusal, a call a crash
    /// cut), read from the start of its text; `None` for a result, a denied approval, or an
    /// error text a tool wrote itself.
    pub fn code(&self) -> Option<crate::types::ToolErrorCode> {
        match self {
            ToolOutcome::Error(text) => crate::types::ToolErrorCode::of(text),
            ToolOutcome::Result(_) => None,
        }
    }
}

/// One entry of a session's conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// A message from the user (or the parent session, for a sub-agent).
    User {
        /// The text.
        text: String,
    },
    /// The model's reply: text, tool calls, or both.
    Assistant {
        /// The text, if any.
        text: Option<String>,
        /// The tool calls, in the order the model made them.
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call.
    Tool {
        /// The call this answers.
        tool_call_id: String,
        /// The tool's name.
        tool_name: String,
        /// What it produced.
        outcome: ToolOutcome,
    },
}
