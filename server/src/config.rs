//! What a server allows: body sizes, nesting, timeouts, CORS, the page.

use std::time::Duration;

/// A server's limits and options. The defaults suit a server on loopback or behind a proxy.
///
/// ```
/// use std::time::Duration;
/// use dormant_server::ServerConfig;
///
/// let config = ServerConfig::default()
///     .max_body_bytes(64 * 1024)
///     .request_timeout(Duration::from_secs(10))
///     .cors_origins(["https://app.example"]);
/// assert_eq!(config.body_limit(), 64 * 1024);
/// ```
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub(crate) max_body_bytes: usize,
    pub(crate) max_json_depth: usize,
    pub(crate) request_timeout: Duration,
    pub(crate) sse_idle_timeout: Duration,
    pub(crate) sse_keep_alive: Duration,
    pub(crate) cors_origins: Vec<String>,
    pub(crate) page: bool,
    pub(crate) page_agent: String,
    pub(crate) page_title: String,
    pub(crate) page_placeholder: String,
}

/// The default body cap: the runtime's default result limit (1 MiB) with room for the
/// envelope around it.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024 + 16 * 1024;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_json_depth: 128,
            request_timeout: Duration::from_secs(30),
            sse_idle_timeout: Duration::from_secs(600),
            sse_keep_alive: Duration::from_secs(15),
            cors_origins: Vec::new(),
            page: true,
            page_agent: "demo".to_string(),
            page_title: "dormant".to_string(),
            page_placeholder: "Write a message".to_string(),
        }
    }
}

impl ServerConfig {
    /// The largest request body, in bytes: a longer `Content-Length` is refused with 413
    /// before the body is read (default [`DEFAULT_MAX_BODY_BYTES`]).
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    /// How deeply a request body's JSON may nest, counting arrays and objects (default 128,
    /// the runtime's own default; at most 128). The body itself may nest one level more: a
    /// submitted result sits inside its envelope's object, and may nest as deep as it would in
    /// process.
    pub fn max_json_depth(mut self, depth: usize) -> Self {
        self.max_json_depth = depth;
        self
    }

    /// How long a request may take before it is answered 408 (default 30 s). A stream is a
    /// request that has been answered: this bounds only how long it takes to open.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long a stream may go without a chunk before the server ends it (default 10 min);
    /// the client reconnects with `Last-Event-ID`.
    pub fn sse_idle_timeout(mut self, timeout: Duration) -> Self {
        self.sse_idle_timeout = timeout;
        self
    }

    /// How often an idle stream gets a keep-alive comment (default 15 s), so proxies keep it.
    pub fn sse_keep_alive(mut self, interval: Duration) -> Self {
        self.sse_keep_alive = interval;
        self
    }

    /// Origins allowed to call the server from another site's pages (CORS). None by default:
    /// only same-origin pages and non-browser clients.
    pub fn cors_origins<I, S>(mut self, origins: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.cors_origins = origins.into_iter().map(Into::into).collect();
        self
    }

    /// Whether `GET /` serves the page (default on).
    pub fn page(mut self, on: bool) -> Self {
        self.page = on;
        self
    }

    /// The agent the page starts sessions of (default `demo`).
    pub fn page_agent(mut self, agent: impl Into<String>) -> Self {
        self.page_agent = agent.into();
        self
    }

    /// The page's title, shown in its heading and the browser's tab (default `dormant`).
    pub fn page_title(mut self, title: impl Into<String>) -> Self {
        self.page_title = title.into();
        self
    }

    /// The hint in the page's empty message field (default `Write a message`).
    pub fn page_placeholder(mut self, placeholder: impl Into<String>) -> Self {
        self.page_placeholder = placeholder.into();
        self
    }

    /// The body cap in bytes.
    pub fn body_limit(&self) -> usize {
        self.max_body_bytes
    }

    pub(crate) fn check(&self) -> Result<(), crate::ServerError> {
        let invalid = |setting: &'static str, reason: &str| {
            Err(crate::ServerError::InvalidConfig {
                setting,
                reason: reason.to_string(),
            })
        };
        if self.max_body_bytes == 0 {
            return invalid("max_body_bytes", "must be at least 1");
        }
        if !(1..=128).contains(&self.max_json_depth) {
            return invalid("max_json_depth", "must be between 1 and 128");
        }
        if self.request_timeout.is_zero() {
            return invalid("request_timeout", "must be longer than zero");
        }
        if self.sse_idle_timeout.is_zero() || self.sse_keep_alive.is_zero() {
            return invalid(
                "sse_idle_timeout",
                "stream timeouts must be longer than zero",
            );
        }
        if self.page_agent.is_empty() {
            return invalid("page_agent", "may not be empty");
        }
        Ok(())
    }
}
