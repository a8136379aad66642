//! A server tool that asks a person for input while it runs ([`ToolContext::ask`]): the
//! question ([`InputRequest`]) becomes an `input` call of the session, pending like a client
//! tool's (listed in the inbox, answered through the submit contract from the root of the
//! tree, with a deadline), and the answer ([`InputAnswer`]) is handed to the handler, which runs
//! again from its start with every answer so far ([`ToolContext::answers`]).
//!
//! Running the handler again is what makes the wait durable: nothing of it lives in memory
//! while the session sleeps, is evicted or the process restarts. A handler that acted before
//! it asked must therefore act idempotently (by [`ToolContext::idempotency_key`], the same on
//! every run of the call). MCP tools that ask for input (an elicitation) are built on this
//! (see [`crate::mcp`]).
//!
//! [`ToolContext::ask`]: crate::definition::ToolContext::ask
//! [`ToolContext::answers`]: crate::definition::ToolContext::answers
//! [`ToolContext::idempotency_key`]: crate::definition::ToolContext::idempotency_key

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a tool asks a person while it runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InputRequest {
    /// The question, for the person.
    pub message: String,
    /// The JSON Schema the answer must match, if any (a submitted answer that does not is
    /// refused with the schema's errors, and the call keeps waiting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
}

impl InputRequest {
    /// A question whose answer may be any JSON value.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            schema: None,
        }
    }

    /// The answer must match `schema` (a JSON Schema).
    #[must_use]
    pub fn schema(mut self, schema: Value) -> Self {
        self.schema = Some(schema);
        self
    }
}

/// A person's answer to an [`InputRequest`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum InputAnswer {
    /// The person answered with this value (a client-tool result submitted for the call).
    Accepted {
        /// The answer.
        content: Value,
    },
    /// The person declined to answer (an error submitted for the call).
    Declined {
        /// Why, as the person gave it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}
