//! What a model call answers: text, tool calls and the tokens used. In a file of its own so
//! that its one public path is the crate root's (`dormant::ModelReply`).

use crate::types::message::ToolCall;
use crate::types::usage::Usage;

/// What the model answered.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelReply {
    /// Text, if any.
    pub text: Option<String>,
    /// Tool calls, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Tokens used, if the provider said.
    pub usage: Option<Usage>,
}

impl ModelReply {
    /// A reply with only text: the run completes.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: Some(text.into()),
            ..Self::default()
        }
    }

    /// A reply with only tool calls.
    pub fn tool_calls(calls: Vec<ToolCall>) -> Self {
        Self {
            tool_calls: calls,
            ..Self::default()
        }
    }

    /// The same reply, with the tokens it used.
    #[must_use]
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = Some(usage);
        self
    }
}
