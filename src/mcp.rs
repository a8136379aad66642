//! Tools from MCP servers (the Model Context Protocol), with the feature `mcp`.
//!
//! An [`McpServer`] says where a server is: a command the runtime spawns and speaks to over
//! its stdin and stdout, or a streamable-HTTP URL (with headers). [`McpTools::connect`] starts
//! it, lists its tools and keeps it running: a server that exits or drops the connection is
//! started again, with backoff, and its list is read again when it says the list changed.
//! [`McpTools::definitions`] are its tools as [`ToolDefinition`](crate::ToolDefinition)s,
//! with their descriptions and input schemas, for an agent's builder.
//!
//! An MCP call is a server tool with a server tool's durable semantics: it is recorded as
//! dispatched before it is sent and its result committed before the step goes on. A call a
//! crash of dormant cut is a `tool_durability_error` for the model, never sent again, unless
//! the tool is `safe_to_retry`: by default a tool whose annotations say `readOnlyHint` or
//! `idempotentHint` is ([`McpRetry`] changes that, for a server or for one tool). The same holds
//! when the MCP server dies with the call in flight: the call is not sent again (the server may
//! have acted on it) unless the tool is safe to retry, in which case it is sent to the
//! restarted server. A call the server could not be sent (it is down, or restarting) is the
//! tool error `mcp_server_unavailable`; a call the server refused is `mcp_request_failed`; a
//! result the server marks `isError` is the tool's own error, its text for the model.
//!
//! Each call carries its idempotency key in `_meta` (`dormant/idempotency_key`), so a server
//! that keeps them can drop a call it has seen.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use dormant::mcp::{McpServer, McpTools};
//! use dormant::AgentDefinition;
//!
//! let files = McpTools::connect(McpServer::stdio("files", "python3").arg("files_server.py")).await?;
//! let search = McpTools::connect(
//!     McpServer::http("search", "https://mcp.example.com/mcp")
//!         .header("authorization", "Bearer secret")?,
//! )
//! .await?;
//! let agent = AgentDefinition::builder("assistant")
//!     .system_prompt("You help with files and the web.")
//!     .tools(files.definitions())
//!     .tools(search.definitions())
//!     .build()?;
//! # let _ = agent;
//! # Ok(())
//! # }
//! ```
//!
//! A server that asks for input during a call (an elicitation, in form mode) makes the call
//! wait for a person: the question is an `input` call of the session
//! ([`crate::definition::input`]), answered through the submit contract from the root of the
//! tree, and the answer goes back to the server, whose call goes on (its request kept open
//! meanwhile, for at most [`McpServer::input_timeout`]). After a restart of dormant the open
//! request is gone: the call is sent again with the answers given if it is safe to retry, and
//! is otherwise a `tool_durability_error`. See `docs/protocols.md` ("MCP client").

mod call;
mod connection;
mod questions;
mod result;
mod server;
mod shared;

pub use connection::McpTools;
pub use server::{McpRetry, McpServer};

/// Why an MCP server could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The server could not be started or connected to, or did not complete MCP's handshake.
    #[error("MCP server {server}: could not connect: {reason}")]
    Connect {
        /// The server's name ([`McpServer`]).
        server: String,
        /// What failed.
        reason: String,
    },
    /// The server did not answer a request, or refused it.
    #[error("MCP server {server}: {request} failed: {reason}")]
    Request {
        /// The server's name.
        server: String,
        /// The request (`tools/list`, …).
        request: &'static str,
        /// What failed.
        reason: String,
    },
    /// A header given for a streamable-HTTP server is not a valid HTTP header.
    #[error("MCP server {server}: header {name:?} is not a valid HTTP header")]
    InvalidHeader {
        /// The server's name.
        server: String,
        /// The header's name.
        name: String,
    },
}
