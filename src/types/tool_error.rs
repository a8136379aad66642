//! The stable codes of the tool errors the runtime itself records.
//!
//! A tool call the runtime closes with an error (a timeout, a refusal, a crash it cut) gets the
//! result `ToolOutcome::Error("<code>: <what happened>")`: the model reads the sentence, and a
//! program reads the code ([`ToolOutcome::code`](crate::types::ToolOutcome::code)). The text is the
//! wire format, so the names here never change. A denied approval is the one exception: its
//! text is the seeds' `"Tool call was not approved by the user"`, with no code.

use std::fmt;

use crate::types::message::ToolOutcome;

/// The code a tool error recorded by the runtime begins with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ToolErrorCode {
    /// The agent has no tool of that name.
    UnknownTool,
    /// The call's input does not fit the tool (its input schema, a companion's name, …).
    InvalidInput,
    /// The tool's result nests deeper than the runtime's `max_json_depth`.
    InvalidOutput,
    /// One reply used a call id twice. No longer given: the runtime gives such a call an id
    /// of its own (see ARCHITECTURE.md, "Call ids"); kept for results recorded before.
    DuplicateToolCallId,
    /// The runtime lost the call's outcome (a bug: never expected).
    ToolNotRun,
    /// Another call of the step already finished the run.
    Skipped,
    /// A server tool's handler panicked.
    ToolPanicked,
    /// A crash cut the call after it was dispatched; it is not `safe_to_retry`, so it was not
    /// run again and may or may not have taken effect.
    ToolDurabilityError,
    /// The run stopped (an interrupt, or a crash closed by a new message) before the call
    /// returned.
    Interrupted,
    /// The session was aborted before the approved tool ran.
    Aborted,
    /// A client tool (or approval) got no answer before its deadline.
    ClientToolTimeout,
    /// A new message arrived before the call was answered (or the approved tool ran).
    ClientToolAbandoned,
    /// An approved call whose tool was redefined since the person approved it: it did not
    /// run (the approval was for the tool as it was).
    StaleApproval,
    /// A sub-agent call would go deeper than the runtime's `max_depth`.
    MaxDepthExceeded,
    /// The child of a sub-agent call failed, or could not start.
    SubAgentFailed,
    /// The child of a sub-agent call could not be read.
    SubAgentUnavailable,
    /// The child was still working when the call was closed.
    SubAgentAbandoned,
    /// The child did not finish: recovery could not learn how it ended.
    SubAgentInterrupted,
    /// The child of a sub-agent call is not recorded.
    SubAgentLost,
    /// A remote sub-agent could not be started (its server did not answer, or refused), or
    /// ended failed.
    RemoteSubAgentFailed,
    /// A remote sub-agent's server stopped answering, or no longer knows the child, after it
    /// was started.
    RemoteSubAgentLost,
    /// The child's session id belongs to a session of another tree.
    SessionIdTaken,
    /// No agent of that name is defined.
    UnknownAgent,
    /// `agentType` names no persistent agent of the parent.
    UnknownAgentType,
    /// No persistent sub-agent has that name.
    UnknownCompanion,
    /// The name is taken by a persistent sub-agent of another agent.
    CompanionNameTaken,
    /// The persistent sub-agent is still working on its turn.
    CompanionBusy,
    /// The persistent sub-agent was terminated.
    CompanionTerminated,
    /// The persistent sub-agent's turn was cut before it replied.
    CompanionInterrupted,
    /// The persistent sub-agent has no reply recorded.
    CompanionLost,
    /// The MCP server of the tool could not be reached (it is down, or restarting): the call
    /// was not sent.
    McpServerUnavailable,
    /// The MCP server answered the call with a JSON-RPC error rather than a result (an unknown
    /// tool, invalid arguments, an error of its own).
    McpRequestFailed,
}

impl ToolErrorCode {
    /// Every code.
    pub const ALL: [ToolErrorCode; 32] = [
        ToolErrorCode::UnknownTool,
        ToolErrorCode::InvalidInput,
        ToolErrorCode::InvalidOutput,
        ToolErrorCode::DuplicateToolCallId,
        ToolErrorCode::ToolNotRun,
        ToolErrorCode::Skipped,
        ToolErrorCode::ToolPanicked,
        ToolErrorCode::ToolDurabilityError,
        ToolErrorCode::Interrupted,
        ToolErrorCode::Aborted,
        ToolErrorCode::ClientToolTimeout,
        ToolErrorCode::ClientToolAbandoned,
        ToolErrorCode::StaleApproval,
        ToolErrorCode::MaxDepthExceeded,
        ToolErrorCode::SubAgentFailed,
        ToolErrorCode::SubAgentUnavailable,
        ToolErrorCode::SubAgentAbandoned,
        ToolErrorCode::SubAgentInterrupted,
        ToolErrorCode::SubAgentLost,
        ToolErrorCode::RemoteSubAgentFailed,
        ToolErrorCode::RemoteSubAgentLost,
        ToolErrorCode::SessionIdTaken,
        ToolErrorCode::UnknownAgent,
        ToolErrorCode::UnknownAgentType,
        ToolErrorCode::UnknownCompanion,
        ToolErrorCode::CompanionNameTaken,
        ToolErrorCode::CompanionBusy,
        ToolErrorCode::CompanionTerminated,
        ToolErrorCode::CompanionInterrupted,
        ToolErrorCode::CompanionLost,
        ToolErrorCode::McpServerUnavailable,
        ToolErrorCode::McpRequestFailed,
    ];

    /// The stable snake_case name the error text begins with.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolErrorCode::UnknownTool => "unknown_tool",
            ToolErrorCode::InvalidInput => "invalid_input",
            ToolErrorCode::InvalidOutput => "invalid_output",
            ToolErrorCode::DuplicateToolCallId => "duplicate_tool_call_id",
            ToolErrorCode::ToolNotRun => "tool_not_run",
            ToolErrorCode::Skipped => "skipped",
            ToolErrorCode::ToolPanicked => "tool_panicked",
            ToolErrorCode::ToolDurabilityError => "tool_durability_error",
            ToolErrorCode::Interrupted => "interrupted",
            ToolErrorCode::Aborted => "aborted",
            ToolErrorCode::ClientToolTimeout => "client_tool_timeout",
            ToolErrorCode::ClientToolAbandoned => "client_tool_abandoned",
            ToolErrorCode::StaleApproval => "stale_approval",
            ToolErrorCode::MaxDepthExceeded => "max_depth_exceeded",
            ToolErrorCode::SubAgentFailed => "sub_agent_failed",
            ToolErrorCode::SubAgentUnavailable => "sub_agent_unavailable",
            ToolErrorCode::SubAgentAbandoned => "sub_agent_abandoned",
            ToolErrorCode::SubAgentInterrupted => "sub_agent_interrupted",
            ToolErrorCode::SubAgentLost => "sub_agent_lost",
            ToolErrorCode::RemoteSubAgentFailed => "remote_subagent_failed",
            ToolErrorCode::RemoteSubAgentLost => "remote_subagent_lost",
            ToolErrorCode::SessionIdTaken => "session_id_taken",
            ToolErrorCode::UnknownAgent => "unknown_agent",
            ToolErrorCode::UnknownAgentType => "unknown_agent_type",
            ToolErrorCode::UnknownCompanion => "unknown_companion",
            ToolErrorCode::CompanionNameTaken => "companion_name_taken",
            ToolErrorCode::CompanionBusy => "companion_busy",
            ToolErrorCode::CompanionTerminated => "companion_terminated",
            ToolErrorCode::CompanionInterrupted => "companion_interrupted",
            ToolErrorCode::CompanionLost => "companion_lost",
            ToolErrorCode::McpServerUnavailable => "mcp_server_unavailable",
            ToolErrorCode::McpRequestFailed => "mcp_request_failed",
        }
    }

    /// The code an error text written by the runtime begins with.
    pub fn of(text: &str) -> Option<Self> {
        let (code, _) = text.split_once(": ")?;
        Self::ALL.into_iter().find(|known| known.as_str() == code)
    }

    /// The error `"<code>: <detail>"`.
    pub(crate) fn with(self, detail: impl fmt::Display) -> ToolFailure {
        ToolFailure {
            code: self,
            detail: detail.to_string(),
        }
    }
}

impl fmt::Display for ToolErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tool error the runtime records: a code and what happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ToolFailure {
    pub(crate) code: ToolErrorCode,
    pub(crate) detail: String,
}

impl fmt::Display for ToolFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.detail)
    }
}

impl From<ToolFailure> for ToolOutcome {
    fn from(error: ToolFailure) -> Self {
        ToolOutcome::Error(error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_reads_back_from_the_text_it_writes() {
        for code in ToolErrorCode::ALL {
            let text = ToolOutcome::from(code.with("what happened"));
            let ToolOutcome::Error(text) = text else {
                panic!("{code} wrote a result");
            };
            assert_eq!(ToolErrorCode::of(&text), Some(code), "{text}");
            assert!(text.starts_with(code.as_str()));
        }
        assert_eq!(
            ToolErrorCode::of("Tool call was not approved by the user"),
            None
        );
        assert_eq!(ToolErrorCode::of("made_up: x"), None);
    }
}
