//! Building an [`OpenAiAdapter`]: where it sends requests, with which key, model and limits.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};

use super::retry::Backoff;
use super::OpenAiAdapter;

/// The endpoint OpenAI itself serves.
pub(crate) const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
const DEFAULT_MAX_RETRIES: u32 = 3;
const DEFAULT_BACKOFF: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(20));

/// Why an [`OpenAiAdapter`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenAiConfigError {
    /// The base URL is not an `http://` or `https://` URL.
    #[error("invalid base url {url:?}: expected http:// or https://")]
    BaseUrl {
        /// The URL given.
        url: String,
    },
    /// The API key cannot be sent in an HTTP header (a control character, say).
    #[error("invalid api key: it cannot be sent in an http header")]
    ApiKey,
    /// An extra header has an invalid name or value.
    #[error("invalid header {name:?}: {reason}")]
    Header {
        /// The header's name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The HTTP client could not be set up (its TLS backend, say).
    #[error("http client: {0}")]
    Client(String),
}

/// Configures an [`OpenAiAdapter`]; start with [`OpenAiAdapter::builder`].
///
/// ```
/// use std::time::Duration;
/// use dormant::OpenAiAdapter;
///
/// let adapter = OpenAiAdapter::builder()
///     .base_url("http://127.0.0.1:11434/v1") // Ollama: no key needed
///     .model("llama3.1:8b")
///     .timeout(Duration::from_secs(300))
///     .max_retries(2)
///     .build()?;
/// # let _ = adapter;
/// # Ok::<(), dormant::llm::OpenAiConfigError>(())
/// ```
#[must_use]
pub struct OpenAiBuilder {
    base_url: String,
    api_key: Option<String>,
    model: Option<String>,
    timeout: Duration,
    max_retries: u32,
    backoff: Backoff,
    stream: bool,
    headers: Vec<(String, String)>,
}

impl Default for OpenAiBuilder {
    fn default() -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.to_string(),
            api_key: None,
            model: None,
            timeout: DEFAULT_TIMEOUT,
            max_retries: DEFAULT_MAX_RETRIES,
            backoff: Backoff::new(DEFAULT_BACKOFF.0, DEFAULT_BACKOFF.1),
            stream: true,
            headers: Vec::new(),
        }
    }
}

impl OpenAiBuilder {
    /// The API's base URL (default `https://api.openai.com/v1`); requests go to
    /// `{base_url}/chat/completions`.
    pub fn base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = url.into();
        self
    }

    /// The API key, sent as `Authorization: Bearer …`. Optional: local servers (llama.cpp,
    /// Ollama, vLLM) usually need none.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// The model of agents whose [`ModelSettings`](crate::ModelSettings) name none; an
    /// agent's own model wins.
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// The longest the provider may stay silent (default 120 s): to connect and answer, and
    /// between two pieces of a streamed reply. A long generation that keeps streaming is never
    /// cut; one that stalls is (and retried, if none of it had arrived).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many times a failed attempt is retried (default 3): on a connection failure, a
    /// timeout, a 429 or a 500/502/503/504/529, and only while no delta was sent.
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }

    /// The retry backoff (default 500 ms, 20 s): retry `n` (from 0) waits a random time up to
    /// `min(max, base × 2ⁿ)`, or the provider's `Retry-After` capped at `max`.
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff = Backoff::new(base, max);
        self
    }

    /// Whether to ask for a streamed reply (default true), whose pieces reach the session's
    /// live followers as they arrive.
    pub fn stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// Sends an extra header with every request (OpenRouter's `HTTP-Referer` and `X-Title`,
    /// say). Its value is never logged nor printed.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Reads `OPENAI_BASE_URL`, `OPENAI_API_KEY` and `OPENAI_MODEL` through `var`, each only
    /// when set and not empty.
    pub(crate) fn with_env(mut self, var: impl Fn(&str) -> Option<String>) -> Self {
        let var = |name: &str| var(name).filter(|value| !value.trim().is_empty());
        if let Some(url) = var("OPENAI_BASE_URL") {
            self.base_url = url;
        }
        if let Some(key) = var("OPENAI_API_KEY") {
            self.api_key = Some(key);
        }
        if let Some(model) = var("OPENAI_MODEL") {
            self.model = Some(model);
        }
        self
    }

    /// Builds the adapter. No model is required here: an agent may name its own, and a
    /// request that has none anywhere fails with a `model_error`.
    ///
    /// # Errors
    /// [`OpenAiConfigError`] for a base URL that is not http(s), an API key or header that
    /// cannot be sent, or an HTTP client that cannot be set up.
    pub fn build(self) -> Result<OpenAiAdapter, OpenAiConfigError> {
        let base = self.base_url.trim().trim_end_matches('/');
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(OpenAiConfigError::BaseUrl { url: self.base_url });
        }
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        for (name, value) in &self.headers {
            let invalid = |reason: String| OpenAiConfigError::Header {
                name: name.clone(),
                reason,
            };
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|error| invalid(error.to_string()))?;
            let mut value =
                HeaderValue::from_str(value).map_err(|error| invalid(error.to_string()))?;
            value.set_sensitive(true);
            headers.insert(header, value);
        }
        if let Some(key) = &self.api_key {
            let mut value = HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| OpenAiConfigError::ApiKey)?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        // A silence limit, not a total one: a reasoning model or a local server writing a long
        // reply streams for minutes, and must not be cut while it makes progress.
        let client = reqwest::Client::builder()
            .connect_timeout(self.timeout)
            .read_timeout(self.timeout)
            .build()
            .map_err(|error| OpenAiConfigError::Client(error.to_string()))?;
        Ok(OpenAiAdapter {
            config: Arc::new(Config {
                client,
                endpoint: format!("{base}/chat/completions"),
                headers,
                has_key: self.api_key.is_some(),
                model: self.model,
                timeout: self.timeout,
                max_retries: self.max_retries,
                backoff: self.backoff,
                stream: self.stream,
            }),
        })
    }
}

impl fmt::Debug for OpenAiBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiBuilder")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("backoff", &self.backoff)
            .field("stream", &self.stream)
            .field(
                "headers",
                &self
                    .headers
                    .iter()
                    .map(|(name, _)| name)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A built adapter's settings, shared by its calls.
pub(crate) struct Config {
    pub(crate) client: reqwest::Client,
    /// `{base_url}/chat/completions`.
    pub(crate) endpoint: String,
    /// Content type, extra headers and the key, every value but the content type marked
    /// sensitive so that the HTTP stack never prints it.
    pub(crate) headers: HeaderMap,
    has_key: bool,
    pub(crate) model: Option<String>,
    pub(crate) timeout: Duration,
    pub(crate) max_retries: u32,
    pub(crate) backoff: Backoff,
    pub(crate) stream: bool,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiAdapter")
            .field("endpoint", &self.endpoint)
            .field("api_key", &self.has_key.then_some("<redacted>"))
            .field("model", &self.model)
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("backoff", &self.backoff)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_sent_as_a_bearer_token_and_never_printed() -> Result<(), OpenAiConfigError> {
        let builder = OpenAiBuilder::default()
            .api_key("sk-secret")
            .header("X-Title", "t");
        assert!(!format!("{builder:?}").contains("sk-secret"));
        let adapter = builder.build()?;
        let printed = format!("{adapter:?}");
        assert!(!printed.contains("sk-secret"), "{printed}");
        assert!(printed.contains("<redacted>"));
        let auth = adapter.config.headers.get(AUTHORIZATION);
        assert_eq!(
            auth.map(HeaderValue::as_bytes),
            Some(&b"Bearer sk-secret"[..])
        );
        assert!(auth.is_some_and(HeaderValue::is_sensitive));
        Ok(())
    }

    #[test]
    fn requests_go_to_chat_completions_under_the_base_url() -> Result<(), OpenAiConfigError> {
        let adapter = OpenAiBuilder::default().build()?;
        assert_eq!(
            adapter.config.endpoint,
            "https://api.openai.com/v1/chat/completions"
        );
        let local = OpenAiBuilder::default()
            .base_url("http://localhost:8080/v1/")
            .build()?;
        assert_eq!(
            local.config.endpoint,
            "http://localhost:8080/v1/chat/completions"
        );
        assert!(!local.config.headers.contains_key(AUTHORIZATION));
        Ok(())
    }

    #[test]
    fn bad_urls_keys_and_headers_are_refused() {
        let url = OpenAiBuilder::default().base_url("api.openai.com").build();
        assert!(matches!(url, Err(OpenAiConfigError::BaseUrl { .. })));
        let key = OpenAiBuilder::default().api_key("sk\nx").build();
        assert!(matches!(key, Err(OpenAiConfigError::ApiKey)));
        let header = OpenAiBuilder::default().header("bad name", "v").build();
        assert!(matches!(header, Err(OpenAiConfigError::Header { .. })));
    }

    #[test]
    fn the_environment_fills_what_is_set_and_not_empty() -> Result<(), OpenAiConfigError> {
        let env = |name: &str| match name {
            "OPENAI_BASE_URL" => Some("http://127.0.0.1:1234/v1".to_string()),
            "OPENAI_API_KEY" => Some(String::new()),
            "OPENAI_MODEL" => Some("qwen".to_string()),
            _ => None,
        };
        let adapter = OpenAiBuilder::default().with_env(env).build()?;
        assert_eq!(
            adapter.config.endpoint,
            "http://127.0.0.1:1234/v1/chat/completions"
        );
        assert_eq!(adapter.config.model.as_deref(), Some("qwen"));
        assert!(!adapter.config.headers.contains_key(AUTHORIZATION));
        Ok(())
    }
}
