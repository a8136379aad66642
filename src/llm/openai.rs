//! An [`LlmAdapter`] for the OpenAI chat-completions API and the servers that speak it: see
//! [`OpenAiAdapter`]. One file per job: `config` (builder, environment), `request` (request
//! → body), `response` (JSON body → reply), `sse` (event-stream lines), `stream` (streamed
//! chunks → reply and deltas), `retry` (backoff, `Retry-After`), `error` (status → error),
//! `call` (the attempts of one call).

mod call;
mod config;
mod error;
mod request;
mod response;
mod retry;
mod sse;
mod stream;

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;

pub use config::{OpenAiBuilder, OpenAiConfigError};

use super::{LlmAdapter, LlmError, ModelReply, ModelRequest};

/// A model behind the OpenAI chat-completions API and the servers that speak it
/// (OpenRouter, vLLM, llama.cpp's `llama-server`, Ollama, LM Studio, …). Built with the
/// `openai` feature.
///
/// Each step is one `POST {base_url}/chat/completions`. The system prompt, conversation and
/// tool specs become chat messages and `function` tools; the agent's
/// [`ModelSettings`](crate::ModelSettings) set `model`, `temperature` and `max_tokens`, and
/// their `extra` fields go into the body as they are (unless the adapter set that field).
///
/// The reply is streamed by default: its text and tool-call fragments reach the session's
/// live followers ([`Runtime::follow_live`](crate::Runtime::follow_live)) as they arrive,
/// and the assembled reply, with the usage the provider reports, ends the step.
///
/// Failures map to the run's error codes: a 429 that outlasts the retries is
/// `rate_limited`, 401/403 `auth`, a 400 about the context window `context_length_exceeded`,
/// anything else `model_error`. Connection failures, timeouts, 429 and 500/502/503/504/529
/// are retried with exponential backoff and full jitter (honouring `Retry-After`), but only
/// while no piece of the reply was streamed: a follower never sees an answer restart.
/// Arguments that are not JSON do not fail the run: the call's input is their raw text (a
/// JSON string), which the tool's input schema refuses, so the model is told `invalid_input`
/// and may try again.
///
/// Dropping the future of [`LlmAdapter::complete`], as an interrupt or abort does, drops the
/// HTTP request and closes its connection.
///
/// # Example
///
/// Wiring an adapter into a runtime (no request is made until a session runs):
///
/// ```
/// use std::sync::Arc;
/// use dormant::{AgentDefinition, ModelSettings, OpenAiAdapter, Runtime, SledStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let llm = OpenAiAdapter::builder()
///     .api_key("sk-…")
///     .model("gpt-4o-mini")
///     .build()?;
/// let agent = AgentDefinition::builder("clerk")
///     .system_prompt("Be brief.")
///     .model(ModelSettings::default().temperature(0.2))
///     .build()?;
/// let runtime = Runtime::builder()
///     .store(Arc::new(SledStore::temporary()?))
///     .llm(Arc::new(llm))
///     .agent(agent)
///     .build()?;
/// # runtime.shutdown().await?;
/// # Ok(()) }
/// ```
///
/// Configured from the environment, asking the model:
///
/// ```no_run
/// # use std::sync::Arc;
/// # use dormant::{AgentDefinition, OpenAiAdapter, Runtime};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL
/// let llm = OpenAiAdapter::from_env()?;
/// let runtime = Runtime::builder()
///     .llm(Arc::new(llm))
///     .agent(AgentDefinition::builder("clerk").build()?)
///     .build()?;
/// let outcome = runtime.execute("clerk", "What is 2 + 2?").await?;
/// println!("{:?}", outcome.text);
/// # Ok(()) }
/// ```
///
/// Cheap to clone: clones share one connection pool. A local server needs no key:
///
/// ```
/// use dormant::OpenAiAdapter;
///
/// let local = OpenAiAdapter::builder()
///     .base_url("http://127.0.0.1:8080/v1") // llama.cpp's llama-server
///     .model("qwen2.5-7b-instruct")
///     .build()?;
/// assert!(!format!("{local:?}").contains("Bearer"));
/// # Ok::<(), dormant::llm::OpenAiConfigError>(())
/// ```
#[derive(Clone)]
pub struct OpenAiAdapter {
    config: Arc<config::Config>,
}

impl OpenAiAdapter {
    /// Starts a configuration: OpenAI's endpoint, no key, no default model, streaming, a
    /// 120 s timeout and 3 retries.
    pub fn builder() -> OpenAiBuilder {
        OpenAiBuilder::default()
    }

    /// An adapter configured from the environment: `OPENAI_BASE_URL` (default OpenAI's),
    /// `OPENAI_API_KEY` and `OPENAI_MODEL` (both optional; an unset or empty variable counts
    /// as absent), with the builder's defaults for the rest.
    ///
    /// ```
    /// let adapter = dormant::OpenAiAdapter::from_env()?;
    /// # let _ = adapter;
    /// # Ok::<(), dormant::llm::OpenAiConfigError>(())
    /// ```
    ///
    /// # Errors
    /// As [`OpenAiBuilder::build`]: a base URL that is not http(s), or a key that cannot be
    /// sent in a header.
    pub fn from_env() -> Result<Self, OpenAiConfigError> {
        OpenAiBuilder::default()
            .with_env(|name| std::env::var(name).ok())
            .build()
    }
}

impl fmt::Debug for OpenAiAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}

impl LlmAdapter for OpenAiAdapter {
    fn complete(&self, request: ModelRequest) -> BoxFuture<'static, Result<ModelReply, LlmError>> {
        let config = Arc::clone(&self.config);
        Box::pin(async move { call::complete(&config, request).await })
    }

    /// `openai`: its wire format, whichever server speaks it.
    fn provider(&self) -> &str {
        "openai"
    }
}
