//! A model that replays a fixed script, indexed so that replays are deterministic.

use std::collections::HashMap;

use futures::future::BoxFuture;
use parking_lot::RwLock;

use super::{LlmAdapter, LlmError, ModelReply, ModelRequest};
use crate::types::ids::SessionId;

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
    streaming: bool,
}

impl ScriptedLlm {
    /// A model with no scripts: every call fails with [`LlmError::ScriptExhausted`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Streams each reply before answering with it, as a provider would: its text word by
    /// word, then each tool call's arguments in one fragment (see [`DeltaSink`](super::DeltaSink)).
    #[must_use]
    pub fn streaming(mut self) -> Self {
        self.streaming = true;
        self
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
        if self.streaming {
            if let Ok(reply) = &reply {
                stream(reply, &request.deltas);
            }
        }
        Box::pin(async move { reply })
    }

    fn provider(&self) -> &str {
        "dormant.scripted"
    }
}

/// Sends `reply` to `deltas` in pieces: each word of its text with the space before it, then
/// each tool call whole.
fn stream(reply: &ModelReply, deltas: &super::DeltaSink) {
    if let Some(text) = &reply.text {
        let mut start = 0;
        for (index, _) in text.match_indices(' ') {
            if index > start {
                deltas.text(&text[start..index]);
                start = index;
            }
        }
        deltas.text(&text[start..]);
    }
    for (position, call) in (0u32..).zip(&reply.tool_calls) {
        deltas.tool_call(
            position,
            Some(call.id.clone()),
            Some(call.name.clone()),
            call.input.to_string(),
        );
    }
}
