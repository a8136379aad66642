//! The scripted model as the runner wraps it: it remembers the last system prompt each
//! session's model call carried, so a step can expect what the model was shown (the skills
//! catalog, preloaded bodies).

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::Mutex;

use crate::llm::{LlmAdapter, LlmError, ModelReply, ModelRequest, ScriptedLlm};
use crate::types::ids::SessionId;

/// [`ScriptedLlm`], remembering prompts.
#[derive(Debug)]
pub(crate) struct PromptLog {
    scripted: Arc<ScriptedLlm>,
    last: Mutex<HashMap<SessionId, String>>,
}

impl PromptLog {
    pub(crate) fn new(scripted: Arc<ScriptedLlm>) -> Self {
        Self {
            scripted,
            last: Mutex::default(),
        }
    }

    /// The system prompt of `session`'s last model call, over the whole scenario.
    pub(crate) fn last_prompt(&self, session: &SessionId) -> Option<String> {
        self.last.lock().get(session).cloned()
    }
}

impl LlmAdapter for PromptLog {
    fn complete(&self, request: ModelRequest) -> BoxFuture<'static, Result<ModelReply, LlmError>> {
        self.last
            .lock()
            .insert(request.session_id.clone(), request.system_prompt.clone());
        self.scripted.complete(request)
    }

    fn provider(&self) -> &str {
        self.scripted.provider()
    }
}
