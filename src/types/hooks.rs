//! Hooks: callbacks that observe a session's run. For each tool they fire in this order:
//! `before_tool` → (the tool runs) → `on_state_change` → `on_message` → `after_tool`.
//! Those after the tool fire once its result is durable.

use serde_json::{Map, Value};

use crate::types::ids::{RunId, SessionId};
use crate::types::message::{Message, ToolCall, ToolOutcome};

/// Something a hook observes.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum HookEvent {
    /// A tool call is about to run.
    BeforeTool {
        /// The session.
        session: SessionId,
        /// The run.
        run_id: RunId,
        /// The call.
        call: ToolCall,
    },
    /// A tool call's changes to the custom state were committed.
    OnStateChange {
        /// The session.
        session: SessionId,
        /// The run.
        run_id: RunId,
        /// The call that made them.
        tool_call_id: String,
        /// The keys it set.
        updates: Map<String, Value>,
    },
    /// A message was committed.
    OnMessage {
        /// The session.
        session: SessionId,
        /// The run.
        run_id: RunId,
        /// The message.
        message: Message,
    },
    /// A tool call's outcome was committed.
    AfterTool {
        /// The session.
        session: SessionId,
        /// The run.
        run_id: RunId,
        /// The call.
        tool_call_id: String,
        /// The tool.
        tool_name: String,
        /// What it produced.
        outcome: ToolOutcome,
    },
    /// The run suspended.
    AgentSuspended {
        /// The session.
        session: SessionId,
        /// The run.
        run_id: RunId,
        /// The calls it waits on.
        tool_call_ids: Vec<String>,
    },
    /// A suspended run was resumed by a new run.
    AgentResumed {
        /// The session.
        session: SessionId,
        /// The new run.
        run_id: RunId,
        /// The suspended run.
        previous_run_id: RunId,
        /// How long since the run it resumes ended, by the runtime's clock (ms): since it
        /// suspended, or, for a run a crash cut, since it was closed as interrupted (at the
        /// first activation after the crash). `None` when its record does not say when it
        /// ended.
        suspended_ms: Option<u64>,
        /// For the first resume of a fork made inside a run: the source session and the
        /// checkpoint the fork went on from (seed 001's `resumedFromCheckpointId`).
        resumed_from_checkpoint: Option<crate::types::ForkOrigin>,
    },
    /// A session was made as a fork of another's checkpoint
    /// ([`Runtime::fork`](crate::Runtime::fork)); fired once its history is durable, before it
    /// runs.
    SessionForked {
        /// The new session.
        session: SessionId,
        /// The session and checkpoint it was forked from.
        forked_from: crate::types::ForkOrigin,
    },
}

impl HookEvent {
    /// The session the event belongs to.
    pub fn session(&self) -> &SessionId {
        match self {
            HookEvent::BeforeTool { session, .. }
            | HookEvent::OnStateChange { session, .. }
            | HookEvent::OnMessage { session, .. }
            | HookEvent::AfterTool { session, .. }
            | HookEvent::AgentSuspended { session, .. }
            | HookEvent::AgentResumed { session, .. }
            | HookEvent::SessionForked { session, .. } => session,
        }
    }

    /// The hook's stable name.
    pub fn name(&self) -> &'static str {
        match self {
            HookEvent::BeforeTool { .. } => "before_tool",
            HookEvent::OnStateChange { .. } => "on_state_change",
            HookEvent::OnMessage { .. } => "on_message",
            HookEvent::AfterTool { .. } => "after_tool",
            HookEvent::AgentSuspended { .. } => "on_agent_suspended",
            HookEvent::AgentResumed { .. } => "on_agent_resumed",
            HookEvent::SessionForked { .. } => "on_session_forked",
        }
    }
}

/// Receives hook events. Called on the session's actor: keep it quick, and hand slow work to a
/// task of your own. A hook observes and cannot change the run: if it panics, the panic is
/// logged (`hook.panicked`, at error level) and the run goes on.
pub trait Hooks: Send + Sync + 'static {
    /// Observes one event.
    fn on_event(&self, event: &HookEvent);
}

/// Hands `event` to `hooks`, keeping a panicking hook from taking the session's actor (and the
/// run it is driving) down with it.
pub(crate) fn notify(hooks: &dyn Hooks, event: &HookEvent) {
    let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hooks.on_event(event)));
    if let Err(panic) = called {
        tracing::error!(
            session = %event.session(),
            hook = event.name(),
            reason = %crate::types::Untrusted(crate::types::panic::panic_text(panic.as_ref())),
            "hook.panicked"
        );
    }
}

/// Hooks that do nothing (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHooks;

impl Hooks for NoHooks {
    fn on_event(&self, _event: &HookEvent) {}
}
