//! dormant over HTTP and SSE.
//!
//! [`router`] gives an axum [`Router`](axum::Router) that a daemon mounts beside its own
//! routes; the `dormant-server` binary serves it with a demo agent and a page where a person
//! answers client tools and approvals in a browser. The routes follow the agent-server
//! contract of the seeds (`POST /start`, `POST /resume`, `GET /sse`, `GET /status`,
//! `POST /interrupt`, `POST /abort`, `POST /submit-tool-result`) plus `GET /runs`,
//! `GET /messages`, `GET /checkpoints`, `GET /state`, `POST /fork`, `GET /healthz` and
//! `GET /metrics`; `docs/server.md` documents each, with
//! every status code.
//!
//! # Fail-closed
//!
//! A server refuses to build unless an authenticate hook is configured
//! ([`Auth::hook`]) or unauthenticated access is chosen explicitly
//! ([`Auth::allow_unauthenticated`]). Starting a session answers a token bound to it: that
//! token, and only it (or a caller the hook calls an operator), may submit, resume, stream,
//! read, interrupt and abort that session.
//!
//! ```no_run
//! use std::sync::Arc;
//! use dormant::{AgentDefinition, ModelReply, Runtime, ScriptedLlm, SledStore};
//! use dormant_server::Auth;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = Runtime::builder()
//!     .store(Arc::new(SledStore::open("sessions")?))
//!     .llm(Arc::new(ScriptedLlm::new().script("greeter", vec![ModelReply::text("hi")])))
//!     .agent(AgentDefinition::builder("greeter").build()?)
//!     .build()?;
//! let app = dormant_server::Server::new(runtime, Auth::allow_unauthenticated())
//!     // Tokens stay valid across restarts while this file is kept (with the store).
//!     .token_key_file("sessions.token-key")
//!     .router()?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! // Not axum::serve, which (in axum 0.8) bounds neither how long a client may take to send
//! // its headers nor how many connections are open.
//! dormant_server::serve(listener, app).await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod a2a;
mod a2a_message;
mod a2a_rpc;
mod a2a_stream;
mod a2a_task;
mod access;
mod agui;
mod agui_events;
mod approval_routes;
mod approval_token;
mod auth;
mod body;
mod client;
mod config;
pub mod demo;
mod error;
mod fd_limit;
pub mod inspect;
mod metrics;
mod ops;
mod page;
mod peer_routes;
mod peers;
mod remote;
mod routes;
mod serve;
mod server;
mod session_token;
mod shutdown;
mod sse;
mod sse_body;
mod state;
mod token;
mod tree;
mod wire;

pub use a2a::DORMANT_EXTENSION;
pub use auth::{Auth, Caller, Denied};
pub use client::{HttpClient, DEFAULT_CONNECT_TIMEOUT};
pub use config::{ServerConfig, DEFAULT_MAX_BODY_BYTES};
pub use error::{ApiError, ServerError};
pub use fd_limit::{raise_fd_limit, FdLimit};
pub use peers::{HttpPeers, PEER_KEY};
pub use remote::{HttpRemoteAgents, DEFAULT_A2A_INPUT_TIMEOUT};
pub use serve::{serve, Connections, Serve, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_MAX_CONNECTIONS};
pub use server::{Closing, Server};
pub use token::TokenKey;

use dormant::Runtime;

/// The routes of a dormant server over `runtime`, with the default [`ServerConfig`] and a
/// token key that lives as long as the process: every token it issues is refused after a
/// restart. For a daemon that restarts, build with [`Server`] instead and give it
/// [`Server::token_key_file`] (tokens stay valid while the file is kept), and
/// [`Server::closing`] to end streams on shutdown.
///
/// # Errors
/// [`ServerError::AuthNotConfigured`] unless `auth` is a hook or an explicit
/// [`Auth::allow_unauthenticated`].
pub fn router(runtime: Runtime, auth: Auth) -> Result<axum::Router, ServerError> {
    Server::new(runtime, auth).router()
}
