//! A model that replays a fixed script, indexed so that replays are deterministic.

use std::collections::HashMap;

use futures::future::BoxFuture;
use parking_lot::RwLock;

use super::{LlmAdapter, LlmError, ModelReply, ModelRequest};
use crate::ids::SessionId;

/// Replays a script per agent (or per session, which wins): a session's model call gets entry
/// k, where k is the number of assistant messages the session has already recorded. A crash or
/// restart therefore replays the same answers.
///
/// ```
/// use dormant::{ModelReply, ScriptedLlm};
/// let llm = ScriptedLlm::new().script("helper", vec![ModelReply::text("hi")]);
/// # let _ = llm;
/// ```
#[derive(Debug, Default)]
pub struct ScriptedLlm {
    by_agent: RwLock<HashMap<String, Vec<ModelReply>>>,
    by_session: RwLock<HashMap<SessionId, Vec<ModelReply>>>,
}

impl ScriptedLlm {
    /// A model with no scripts: every call fails with [`LlmError::ScriptExhausted`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the script of every session of `agent`.
    #[must_use]
    pub fn script(self, agent: impl Into<String>, replies: Vec<ModelReply>) -> Self {
        self.set_agent_script(agent, replies);
        self
    }

    /// Sets the script of every session of `agent` (on a shared model).
    pub fn set_agent_script(&self, agent: impl Into<String>, replies: Vec<ModelReply>) {
        self.by_agent.write().insert(agent.into(), replies);
    }

    /// Sets the script of one session; it wins over the agent's.
    pub fn set_session_script(&self, session: SessionId, replies: Vec<ModelReply>) {
        self.by_session.write().insert(session, replies);
    }

    fn reply(&self, request: &ModelRequest) -> Result<ModelReply, LlmError> {
        let index = request.assistant_turns();
        let pick = |script: &Vec<ModelReply>| {
            script
                .get(index)
                .cloned()
                .ok_or_else(|| LlmError::ScriptExhausted {
                    session: request.session_id.clone(),
                    agent: request.agent.clone(),
                    index,
                    len: script.len(),
                })
        };
        if let Some(script) = self.by_session.read().get(&request.session_id) {
            return pick(script);
        }
        match self.by_agent.read().get(&request.agent) {
            Some(script) => pick(script),
            None => pick(&Vec::new()),
        }
    }
}

impl LlmAdapter for ScriptedLlm {
    fn complete(&self, request: ModelRequest) -> BoxFuture<'static, Result<ModelReply, LlmError>> {
        let reply = self.reply(&request);
        Box::pin(async move { reply })
    }
}
