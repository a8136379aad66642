//! What applying an input produces: one commit, then effects, in order.

use std::sync::Arc;

use serde_json::Value;

use super::RunOutcome;
use crate::hooks::HookEvent;
use crate::ids::RunId;
use crate::llm::ModelRequest;
use crate::message::ToolCall;
use crate::schema::Commit;

/// Something the session actor must do after the commit is durable.
#[derive(Debug)]
pub(crate) enum Effect {
    /// Ask the model; feed the answer back as `Input::ModelReplied`.
    CallModel {
        run_id: RunId,
        step: u32,
        request: ModelRequest,
    },
    /// Run server tools: `parallel` at once, then `sequential` in order, stopping at the first
    /// that finishes the run; feed the outcomes back as `Input::ToolsFinished`.
    RunTools {
        run_id: RunId,
        step: u32,
        parallel: Vec<ToolCall>,
        sequential: Vec<ToolCall>,
        state: Arc<Value>,
    },
    /// Fire a hook.
    Hook(HookEvent),
    /// The run ended or suspended: answer whoever waits for it.
    Settle(RunOutcome),
}

/// The result of applying one input: the writes to make durable first, then the effects.
#[derive(Debug, Default)]
pub(crate) struct Transition {
    pub(crate) commit: Option<Commit>,
    pub(crate) effects: Vec<Effect>,
}
