//! Why a child cannot run, or how it ended cannot be learned, when its own core cannot say so:
//! the session actor finds these out (an agent not defined, a store or lease that fails, a
//! panic, a child that does not answer recovery in time), and the core decides what each
//! means to the parent. Each is a typed value with its stable code, so no code is spelled out
//! as text outside the core and `ToolErrorCode`.

use std::fmt;

use super::{ChildReport, ChildState, Effect};
use crate::types::ids::SessionId;
use crate::types::tool_error::{ToolErrorCode, ToolFailure};

/// Why a child cannot run: its parent records the call's tool error instead of waiting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ChildUnavailable {
    /// The parent named an agent that is not defined.
    UnknownAgent { agent: String },
    /// This process cannot own the child (its tree's lease): `error`.
    NotOwnedHere { child: SessionId, error: String },
    /// The stored child cannot be read: `error`.
    Unreadable { child: SessionId, error: String },
    /// The child panicked before the first commit of its run (its first, or a companion's
    /// next turn).
    CrashedBeforeFirstCommit { child: SessionId, panic: String },
    /// The host cannot deliver to the child (it keeps crashing, or cannot be loaded): `error`.
    CannotRun { child: SessionId, error: String },
    /// The host gave up on the child after it kept crashing: `error`.
    Failed { child: SessionId, error: String },
}

impl ChildUnavailable {
    /// The tool error the parent records for the call.
    pub(crate) fn failure(&self) -> ToolFailure {
        match self {
            ChildUnavailable::UnknownAgent { agent } => {
                ToolErrorCode::UnknownAgent.with(format_args!("no agent named {agent} is defined"))
            }
            ChildUnavailable::NotOwnedHere { child, error } => ToolErrorCode::SubAgentUnavailable
                .with(format_args!("child {child} cannot be owned here: {error}")),
            ChildUnavailable::Unreadable { child, error } => ToolErrorCode::SubAgentUnavailable
                .with(format_args!("child {child} cannot be read: {error}")),
            ChildUnavailable::CrashedBeforeFirstCommit { child, panic } => {
                ToolErrorCode::SubAgentFailed.with(format_args!(
                    "child {child} crashed before the first commit of its run: {panic}"
                ))
            }
            ChildUnavailable::CannotRun { child, error } => ToolErrorCode::SubAgentFailed
                .with(format_args!("child {child} cannot run: {error}")),
            ChildUnavailable::Failed { child, error } => {
                ToolErrorCode::SubAgentFailed.with(format_args!("child {child} failed: {error}"))
            }
        }
    }

    /// The effect that tells `parent` its call `tool_call_id` cannot run.
    pub(crate) fn report(&self, parent: &SessionId, tool_call_id: String) -> Effect {
        cannot_start(parent, tool_call_id, self.failure())
    }
}

/// The effect that tells `parent` its call `tool_call_id` cannot run: the child could not be
/// started, so the parent records `why` as the call's result instead of waiting forever.
pub(super) fn cannot_start(parent: &SessionId, tool_call_id: String, why: ToolFailure) -> Effect {
    Effect::Report {
        parent: parent.clone(),
        tool_call_id,
        report: ChildReport::Finished(why.into()),
    }
}

/// Why recovery could not learn how a child ended: the child stays recorded as interrupted,
/// and a resume of the parent re-attaches to it if it exists. Stored as the text of
/// [`ChildState::Interrupted`]'s reason, which begins with the stable code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LostChild {
    /// The child did not answer within the bound recovery waits (`after_ms`).
    InspectionTimedOut { child: SessionId, after_ms: u128 },
    /// No session of the child's id is stored.
    Missing { child: SessionId },
    /// The child was cut by a crash too.
    Interrupted { child: SessionId },
    /// The stored child cannot be read: `error`.
    Unreadable { error: String },
}

impl LostChild {
    /// The stable code its stored text begins with.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            LostChild::InspectionTimedOut { .. } => "inspection_timed_out",
            LostChild::Missing { .. } => "child_missing",
            LostChild::Interrupted { .. } => "child_interrupted",
            LostChild::Unreadable { .. } => "child_unreadable",
        }
    }

    /// What the parent records of the child.
    pub(crate) fn state(&self) -> ChildState {
        ChildState::Interrupted {
            reason: self.to_string(),
        }
    }
}

impl fmt::Display for LostChild {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = self.code();
        match self {
            LostChild::InspectionTimedOut { child, after_ms } => write!(
                f,
                "{code}: child {child} did not answer within {after_ms} ms"
            ),
            LostChild::Missing { child } => write!(f, "{code}: no session {child} is stored"),
            LostChild::Interrupted { child } => {
                write!(f, "{code}: child {child} was cut by a crash")
            }
            LostChild::Unreadable { error } => write!(f, "{code}: {error}"),
        }
    }
}
