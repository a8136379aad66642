//! Where an MCP server is and how its calls are treated: the configuration [`McpTools`]
//! connects with.
//!
//! [`McpTools`]: super::McpTools

use std::collections::HashMap;
use std::ffi::OsString;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use super::McpError;

/// The first wait before a server that went away is started again; doubled up to
/// [`McpServer::max_backoff`].
pub(super) const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// How the server is reached. Its `Debug` names the environment's variables, not their values
/// (they may be credentials); header values are marked sensitive, which `Debug` hides too.
#[derive(Clone)]
pub(crate) enum Transport {
    /// A command spawned by the runtime, spoken to over its stdin and stdout.
    Stdio {
        program: OsString,
        args: Vec<OsString>,
        env: Vec<(OsString, OsString)>,
    },
    /// A streamable-HTTP endpoint.
    Http { url: String, headers: HeaderMap },
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Stdio { program, args, env } => f
                .debug_struct("Stdio")
                .field("program", program)
                .field("args", args)
                .field("env", &env.iter().map(|(key, _)| key).collect::<Vec<_>>())
                .finish(),
            Transport::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", url)
                .field("headers", headers)
                .finish(),
        }
    }
}

/// Which of a server's tools are `safe_to_retry`: sent again after a crash cut a call, rather
/// than closed with `tool_durability_error`.
///
/// MCP's tool annotations are the server's own description of its tools, so they are only as
/// trustworthy as the server: connect to servers you trust, or say [`McpRetry::Never`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum McpRetry {
    /// A tool whose annotations say `readOnlyHint: true` or `idempotentHint: true` (the
    /// default).
    #[default]
    Annotated,
    /// Only a tool whose annotations say `idempotentHint: true`.
    Idempotent,
    /// No tool of the server.
    Never,
}

/// An MCP server an agent takes tools from: a name (for logs and errors), how it is reached,
/// and how its calls are treated.
///
/// ```
/// use dormant::mcp::{McpRetry, McpServer};
///
/// let files = McpServer::stdio("files", "python3")
///     .arg("files_server.py")
///     .env("FILES_ROOT", "/srv/files")
///     .retry(McpRetry::Idempotent)
///     .safe_to_retry("delete_file", false);
/// assert_eq!(files.name(), "files");
/// ```
#[derive(Clone, Debug)]
pub struct McpServer {
    pub(crate) name: String,
    pub(crate) transport: Transport,
    pub(crate) retry: McpRetry,
    pub(crate) retry_overrides: HashMap<String, bool>,
    pub(crate) prefix: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) call_timeout: Duration,
    pub(crate) input_timeout: Duration,
    pub(crate) max_backoff: Duration,
}

impl McpServer {
    /// A server the runtime spawns as `program`, spoken to over its stdin and stdout. Its
    /// stderr goes to the runtime's. It is killed when the [`McpTools`](super::McpTools) is
    /// dropped.
    pub fn stdio(name: impl Into<String>, program: impl Into<OsString>) -> Self {
        Self::new(
            name.into(),
            Transport::Stdio {
                program: program.into(),
                args: Vec::new(),
                env: Vec::new(),
            },
        )
    }

    /// A server at a streamable-HTTP `url` (its MCP endpoint, such as `https://host/mcp`).
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self::new(
            name.into(),
            Transport::Http {
                url: url.into(),
                headers: HeaderMap::new(),
            },
        )
    }

    fn new(name: String, transport: Transport) -> Self {
        Self {
            name,
            transport,
            retry: McpRetry::default(),
            retry_overrides: HashMap::new(),
            prefix: String::new(),
            connect_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(5 * 60),
            input_timeout: Duration::from_secs(60 * 60),
            max_backoff: Duration::from_secs(30),
        }
    }

    /// An argument for a stdio server's command (no effect on an HTTP server).
    #[must_use]
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        if let Transport::Stdio { args, .. } = &mut self.transport {
            args.push(arg.into());
        }
        self
    }

    /// An environment variable for a stdio server's command (no effect on an HTTP server).
    #[must_use]
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        if let Transport::Stdio { env, .. } = &mut self.transport {
            env.push((key.into(), value.into()));
        }
        self
    }

    /// A header every request to an HTTP server carries (an `authorization`, say); no effect
    /// on a stdio server.
    ///
    /// # Errors
    /// [`McpError::InvalidHeader`] if the name or the value is not a valid HTTP header.
    pub fn header(mut self, name: &str, value: &str) -> Result<Self, McpError> {
        let invalid = || McpError::InvalidHeader {
            server: self.name.clone(),
            name: name.to_string(),
        };
        let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid())?;
        let mut value = HeaderValue::from_str(value).map_err(|_| invalid())?;
        value.set_sensitive(true);
        if let Transport::Http { headers, .. } = &mut self.transport {
            headers.insert(header, value);
        }
        Ok(self)
    }

    /// Which tools are safe to retry ([`McpRetry::Annotated`] by default).
    #[must_use]
    pub fn retry(mut self, retry: McpRetry) -> Self {
        self.retry = retry;
        self
    }

    /// Whether the tool named `tool` (the server's name for it) is safe to retry, whatever
    /// its annotations and [`McpServer::retry`] say.
    #[must_use]
    pub fn safe_to_retry(mut self, tool: impl Into<String>, safe: bool) -> Self {
        self.retry_overrides.insert(tool.into(), safe);
        self
    }

    /// A prefix for the names the agent's tools get (`"files_"` makes the server's `read`
    /// the agent's `files_read`), so two servers' tools of one name can serve one agent.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a call waits for a server that is down (restarting) before it is the tool
    /// error `mcp_server_unavailable`, and how long a connection may take (10 s by default).
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a call may wait for its answer (5 minutes by default). It does not run while a
    /// question the call asked waits for a person, and starts again from the answer. Past it
    /// the call is cancelled at the server
    /// (`notifications/cancelled`) and is a `tool_durability_error`: the server may have
    /// acted on it.
    #[must_use]
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// How long a call that asked for input (an elicitation) is kept open for the answer
    /// (1 hour by default). Past it the question is cancelled at the server, and an answer
    /// that comes later finds the call gone: the call is sent again with the answers if it is
    /// safe to retry, and is otherwise a `tool_durability_error`, as after a restart of
    /// dormant. Keep it at least the agent's client-tool timeout, the question's deadline in
    /// the session.
    #[must_use]
    pub fn input_timeout(mut self, timeout: Duration) -> Self {
        self.input_timeout = timeout;
        self
    }

    /// The longest wait between two tries to start a server that keeps failing (30 s by
    /// default; the first retry is after 100 ms, doubling, and the wait starts again from
    /// 100 ms only after a connection that lasted 10 s).
    #[must_use]
    pub fn max_backoff(mut self, max: Duration) -> Self {
        self.max_backoff = max.max(FIRST_BACKOFF);
        self
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the server's tool `tool`, with these annotations, is safe to retry.
    pub(crate) fn is_safe_to_retry(&self, tool: &str, read_only: bool, idempotent: bool) -> bool {
        if let Some(&safe) = self.retry_overrides.get(tool) {
            return safe;
        }
        match self.retry {
            McpRetry::Annotated => read_only || idempotent,
            McpRetry::Idempotent => idempotent,
            McpRetry::Never => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_decide_retry_unless_overridden() {
        let server = McpServer::stdio("s", "true");
        assert!(server.is_safe_to_retry("read", true, false));
        assert!(server.is_safe_to_retry("put", false, true));
        assert!(!server.is_safe_to_retry("send", false, false));
        let strict = server.retry(McpRetry::Idempotent);
        assert!(!strict.is_safe_to_retry("read", true, false));
        assert!(strict.is_safe_to_retry("put", false, true));
        let never = strict.retry(McpRetry::Never).safe_to_retry("read", true);
        assert!(never.is_safe_to_retry("read", false, false));
        assert!(!never.is_safe_to_retry("put", false, true));
    }

    #[test]
    fn debug_shows_no_secret() -> Result<(), McpError> {
        let server = McpServer::stdio("s", "server")
            .env("TOKEN", "hunter2")
            .arg("--x");
        let http = McpServer::http("h", "http://127.0.0.1:1/mcp")
            .header("authorization", "Bearer hunter2")?;
        let shown = format!("{server:?} {http:?}");
        assert!(
            shown.contains("TOKEN") && !shown.contains("hunter2"),
            "{shown}"
        );
        Ok(())
    }

    #[test]
    fn a_bad_header_is_a_typed_error() {
        let error = McpServer::http("s", "http://127.0.0.1:1/mcp")
            .header("bad header", "x")
            .err();
        assert!(matches!(error, Some(McpError::InvalidHeader { .. })));
    }
}
