//! The model behind an agent: one call per step, messages and tool specs in, text and tool
//! calls out.
//!
//! Public as the implementer's room of a model adapter: the [`LlmAdapter`] trait and what it
//! speaks ([`ModelRequest`], [`ToolSpec`], [`DeltaSink`], [`LlmError`], [`BoxFuture`]), and with
//! `openai` the OpenAI adapter's builder and its error. What a daemon names to pick a model
//! (`ScriptedLlm`, `ModelReply`, `ModelSettings`, `OpenAiAdapter`) is at the crate root.

mod delta;
#[cfg(feature = "openai")]
pub(crate) mod openai;
pub(crate) mod reply;
pub(crate) mod scripted;
pub(crate) mod settings;

use std::sync::Arc;

use serde_json::Value;

use crate::types::ids::SessionId;
use crate::types::message::Message;

pub use delta::DeltaSink;
/// The boxed future an [`LlmAdapter`] or a [`ToolHandler`](crate::definition::ToolHandler)
/// returns, re-exported so that implementing them needs no dependency on `futures`.
pub use futures::future::BoxFuture;
#[cfg(feature = "openai")]
pub use openai::{OpenAiBuilder, OpenAiConfigError};
pub(crate) use reply::ModelReply;
pub(crate) use scripted::ScriptedLlm;
pub(crate) use settings::ModelSettings;

/// A tool as the model sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    /// The name.
    pub name: String,
    /// The description.
    pub description: String,
    /// The input schema (an empty object schema when the definition has none).
    pub input_schema: Value,
}

/// What a model call sees.
#[derive(Clone, Debug)]
pub struct ModelRequest {
    /// The session asking.
    pub session_id: SessionId,
    /// The agent's name.
    pub agent: String,
    /// The agent's system prompt.
    pub system_prompt: String,
    /// The whole conversation so far.
    pub messages: Arc<Vec<Message>>,
    /// The tools the model may call.
    pub tools: Arc<[ToolSpec]>,
    /// The agent's model settings.
    pub settings: Arc<ModelSettings>,
    /// Where a streaming adapter sends the reply's pieces as they arrive; an adapter that
    /// does not stream ignores it.
    pub deltas: DeltaSink,
}

impl ModelRequest {
    /// How many assistant messages the session has recorded: the index of this reply in a
    /// script.
    pub fn assistant_turns(&self) -> usize {
        self.messages
            .iter()
            .filter(|message| matches!(message, Message::Assistant { .. }))
            .count()
    }
}

/// Why a model call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// A scripted session asked for more replies than its script has.
    #[error("script_exhausted: session {session} asked for reply #{} of agent {agent}, whose script has {len}", index + 1)]
    ScriptExhausted {
        /// The session.
        session: SessionId,
        /// The agent.
        agent: String,
        /// The reply asked for (0-based).
        index: usize,
        /// The script's length.
        len: usize,
    },
    /// The provider refused the call for its rate limit, and kept refusing it through every
    /// retry the adapter made.
    #[error("rate_limited: {0}")]
    RateLimited(String),
    /// The conversation no longer fits the model's context window.
    #[error("context_length_exceeded: {0}")]
    ContextLengthExceeded(String),
    /// The provider refused the credentials.
    #[error("auth: {0}")]
    Auth(String),
    /// The provider failed (or the adapter did).
    #[error("model_error: {0}")]
    Provider(String),
}

/// A language model. The crate ships no provider: implement this trait for yours. Tests,
/// scenarios and the simulator use [`ScriptedLlm`]. An adapter that panics fails the run with
/// a `model_error`, as an error it returned would.
///
/// [`BoxFuture`] is re-exported here (`dormant::llm::BoxFuture`):
///
/// ```
/// use dormant::llm::{BoxFuture, LlmAdapter, LlmError, ModelRequest};
/// use dormant::ModelReply;
///
/// /// Answers every step with the number of messages it was shown.
/// struct Counter;
///
/// impl LlmAdapter for Counter {
///     fn complete(&self, request: ModelRequest) -> BoxFuture<'static, Result<ModelReply, LlmError>> {
///         Box::pin(async move { Ok(ModelReply::text(request.messages.len().to_string())) })
///     }
/// }
/// ```
pub trait LlmAdapter: Send + Sync + 'static {
    /// Answers one step.
    fn complete(&self, request: ModelRequest) -> BoxFuture<'static, Result<ModelReply, LlmError>>;

    /// Who serves the model, as OpenTelemetry's `gen_ai.provider.name` names it (`openai`,
    /// `anthropic`, `aws.bedrock`...): recorded on the model call's span with the `otel`
    /// feature. `unknown` unless the adapter says.
    fn provider(&self) -> &str {
        "unknown"
    }
}

/// Asks `llm`, turning a panic (in the call or in its future) into [`LlmError::Provider`]:
/// the reply is what ends the step, so a lost one would leave the run waiting forever.
pub(crate) async fn complete_caught(
    llm: &dyn LlmAdapter,
    request: ModelRequest,
) -> Result<ModelReply, LlmError> {
    use futures::FutureExt;
    let session = request.session_id.clone();
    let panicked = |panic: Box<dyn std::any::Any + Send>| {
        let reason = crate::types::panic::panic_text(panic.as_ref());
        tracing::error!(%session, reason = %crate::types::Untrusted(&reason), "llm.panicked");
        Err(LlmError::Provider(format!(
            "the model adapter panicked: {reason}"
        )))
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| llm.complete(request))) {
        Ok(reply) => std::panic::AssertUnwindSafe(reply)
            .catch_unwind()
            .await
            .unwrap_or_else(panicked),
        Err(panic) => panicked(panic),
    }
}
