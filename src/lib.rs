//! dormant: an in-process, actor-based runtime for durable agent sessions.
//!
//! Each session is an actor that owns its state and mailbox. Its agent loop (ask the model,
//! run tools, repeat) commits every step to an embedded [sled] store before acting on it, so a
//! session can be evicted from memory at any idle moment and rehydrated by its next message,
//! and a killed process loses nothing it acknowledged.
//!
//! # The front door
//!
//! A daemon that embeds dormant names these, all at the crate root and nowhere else:
//!
//! - the runtime: [`Runtime`] (define, execute, inspect, follow, evict, shut down),
//!   [`RuntimeBuilder`], and what they fail with: [`BuildError`] (building), [`Error`] (the
//!   calls), [`ReadError`] (the reads; see [Errors](#errors));
//! - agents and tools: [`AgentDefinition`], [`ToolDefinition`], [`ToolError`], [`Approval`]
//!   (a tool that waits for a person's yes), [`ModelSettings`];
//! - sessions and runs: [`SessionId`], [`RunId`], [`Message`], [`ToolCall`], [`Status`],
//!   [`RunOutcome`], [`PendingKind`] (what a suspended run waits on);
//! - answering a waiting run: [`Submit`], [`SubmitOutcome`];
//! - streams and observing: [`Chunk`], [`StreamEvent`], [`Hooks`];
//! - a store: [`SledStore`] (embedded, the default), [`MemoryStore`] (tests), with the
//!   `fjall` feature `FjallStore` (embedded, on an LSM tree), with the `journal` feature
//!   `JournalStore` (embedded, a log of its own), and with the `postgres` feature `PgStore`
//!   (several nodes on one database);
//! - a model: [`ScriptedLlm`] with [`ModelReply`] (deterministic, for tests and demos), and
//!   with the `openai` feature `OpenAiAdapter`; a clock: [`SystemClock`], [`ManualClock`].
//!
//! Beyond the front door, in the room each belongs to (one path a name; no module re-exports
//! what the root has):
//!
//! - [`types`]: the records and stream details the runtime's reads return
//!   ([`SessionRecord`](types::SessionRecord), [`PendingCall`](types::PendingCall),
//!   [`RunRecord`](types::RunRecord), [`ChunkKind`](types::ChunkKind), usage, hook events,
//!   [`ToolOutcome`](types::ToolOutcome), [`Untrusted`](types::Untrusted), the [`Clock`](types::Clock)
//!   trait).
//! - [`definition`]: the builder ([`AgentBuilder`](definition::AgentBuilder)),
//!   [`DefinitionError`](definition::DefinitionError), companions, a tool handler of your own
//!   type ([`ToolHandler`](definition::ToolHandler), [`ToolContext`](definition::ToolContext)).
//! - [`session`]: [`RunStarted`](session::RunStarted), [`SubmitAnswer`](session::SubmitAnswer),
//!   the submit contract's defaults. [`runtime`]: the counters, a deadline sweep's report,
//!   [`WeakRuntime`](runtime::WeakRuntime).
//! - [`skills`]: skills with progressive disclosure, from code or from `SKILL.md` folders.
//!
//! # Errors
//!
//! Each error type holds only what its calls can return:
//!
//! - [`BuildError`], from [`RuntimeBuilder::build`] alone: a setting out of range, a store
//!   another runtime uses or a shutdown closed, no tokio runtime, a refused agent set, the
//!   default store not opened.
//! - [`ReadError`], from the reads of stored state ([`Runtime::session`], `status`,
//!   `messages`, `runs`, `run`, `chunks`, `session_ids`, `pending`, `children`,
//!   `companions`, ...): an unknown session, a store failure, an unreadable stored value, a
//!   shut-down runtime. A read goes to the store only, never to a session's actor, another
//!   node or a remote server, so that is all it can meet.
//! - [`Error`], from every other call (those that run, answer, stop, define or route):
//!   those four and the refusals, crashes and cluster failures of a call a session's actor
//!   or another node answers.
//!
//! A split finer than by these three groups (one type a call) would give `execute_on` and
//! `resume` nearly the same dozen variants twice over for little gain, so the changing calls
//! share `Error`. A `ReadError` converts into an `Error` (same variant, message and
//! [`code`](Error::code)), so one function may `?` both into `Error`; `anyhow` and
//! `Box<dyn Error>` users need nothing. Messages and codes are those the one `Error` had.
//!
//! # Implementing an interface
//!
//! An implementer looks in the room of what it implements, whose module docs list it:
//!
//! - a store: [`store`] ([`store::Store`], [`Batch`](store::Batch), [`Op`](store::Op),
//!   [`Tree`](store::Tree), [`CommitKind`](store::CommitKind), [`store::Error`]);
//! - a model: [`llm`] ([`LlmAdapter`](llm::LlmAdapter), [`ModelRequest`](llm::ModelRequest),
//!   [`ToolSpec`](llm::ToolSpec), [`DeltaSink`](llm::DeltaSink), [`LlmError`](llm::LlmError));
//! - a cluster's leases: [`cluster::leases`] ([`Leases`](cluster::leases::Leases));
//! - remote sub-agents' transport: [`remote`] ([`RemoteAgents`](remote::RemoteAgents) and
//!   what it speaks);
//! - skills: [`skills`] ([`SkillProvider`](skills::SkillProvider)); hooks: [`Hooks`].
//!
//! They stay in their rooms rather than under one `extend` module because each brings its own
//! vocabulary (a store's `Error` and `Tree`, a model's request, a remote's status), which would
//! clash or lose its context in one flat list, and because `store`, `llm` and `remote` are the
//! rooms a newcomer finds from the map (ARCHITECTURE.md) anyway. What dormant-server alone
//! needs (the calls between nodes, `cluster::peer`; the stored layout, `store::schema`; the
//! `Runtime` methods that serve other nodes and remote parents) is public for that crate but
//! hidden from these docs, each with a comment saying who uses it.
//!
//! # Layout
//!
//! One module a concept, each importing only those above it in this list (ARCHITECTURE.md
//! has the map and the few exceptions): `types` (the vocabulary), `llm`, `skills`,
//! `definition`, `store`, `session` (the core, a pure state machine: inputs in, a commit and
//! effects out), `remote`, `cluster`, `engine` (the session actor on the [`dormant_actors`]
//! host, the deadline scheduler, the tool runner), `runtime` (the handle a daemon embeds).
//!
//! # Features
//!
//! - `test-util` (off by default): test tooling, so that a user's build does not compile it:
//!   `dormant::testkit`: the conformance scenario runner `dormant::testkit::scenario` (the
//!   format is `docs/scenario-format.md`), the store contract suite, the
//!   delegating store (`testkit::DelegatingStore`; `testkit::FaultyStore` injects faults), a
//!   throwaway PostgreSQL cluster and a log capture.
//! - `openai` (off by default): `OpenAiAdapter`, a model on any OpenAI-compatible
//!   chat-completions server (reqwest with rustls). Off so that a build with its own adapter
//!   compiles no HTTP client.
//! - `system-allocator`: only for this crate's `hitl` bench and simulator, which run on
//!   mimalloc unless it is set. The library itself never sets an allocator.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use dormant::{
//!     AgentDefinition, ModelReply, Runtime, ScriptedLlm, SledStore, Status, ToolCall,
//!     ToolDefinition, ToolError,
//! };
//! use serde_json::json;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let agent = AgentDefinition::builder("clerk")
//!     .tool(ToolDefinition::server("lookup", |input, _ctx| async move {
//!         Ok::<_, ToolError>(json!({ "stock": 3, "item": input["item"] }))
//!     }))
//!     .build()?;
//! let llm = ScriptedLlm::new().script("clerk", vec![
//!     ModelReply::tool_calls(vec![ToolCall::new("c1", "lookup", json!({ "item": "tea" }))]),
//!     ModelReply::text("We have 3 teas."),
//! ]);
//! let runtime = Runtime::builder()
//!     .store(Arc::new(SledStore::temporary()?))
//!     .llm(Arc::new(llm))
//!     .agent(agent)
//!     .build()?;
//! let outcome = runtime.execute("clerk", "any tea?").await?;
//! assert_eq!(outcome.status, Status::Completed);
//! assert_eq!(runtime.messages(&outcome.session_id).await?.len(), 4);
//! runtime.shutdown().await?;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

pub mod cluster;
pub mod definition;
mod engine;
mod error;
pub mod llm;
#[cfg(feature = "mcp")]
pub mod mcp;
pub mod remote;
pub mod runtime;
pub mod session;
pub mod skills;
pub mod store;
#[cfg(feature = "otel")]
pub mod telemetry;
#[cfg(not(feature = "otel"))]
mod telemetry;
// Test tooling: built only with the `test-util` feature (see Cargo.toml), so that a user's
// build does not compile the runner or pull in its dependencies.
#[cfg(feature = "test-util")]
pub mod testkit;
pub mod types;

// The README's Rust blocks are compiled (and run, unless `no_run`) as doctests, so they stay
// true. They use the `openai` adapter, the PostgreSQL store, MCP tools and OpenTelemetry, which
// `cargo test --workspace` turns on (the server crate's default features), and `FjallStore` and
// `JournalStore` (the crate's dev-dependency on itself turns on `fjall` and `journal`).
#[cfg(all(
    doctest,
    feature = "openai",
    feature = "postgres",
    feature = "mcp",
    feature = "otel",
    feature = "fjall",
    feature = "journal"
))]
#[doc = include_str!("../README.md")]
mod readme {}

// The front door: what a daemon author names to embed the runtime, each at this one path
// (the rooms above re-export none of these; see the crate docs for the rest).
pub use definition::agent::AgentDefinition;
pub use definition::tool::{Approval, ToolDefinition, ToolError};
pub use error::Error;
#[cfg(feature = "openai")]
pub use llm::openai::OpenAiAdapter;
pub use llm::reply::ModelReply;
pub use llm::scripted::ScriptedLlm;
pub use llm::settings::ModelSettings;
pub use runtime::build_error::BuildError;
pub use runtime::builder::RuntimeBuilder;
pub use runtime::handle::Runtime;
pub use runtime::read_error::ReadError;
// dormant-server's plumbing (`POST /submit-tool-result?resume=true&stream=true`).
#[doc(hidden)]
pub use runtime::submit_follow::{FollowToSettle, SubmitFollowed};
pub use session::outcome::RunOutcome;
pub use session::submit::{Submit, SubmitOutcome};
#[cfg(feature = "fjall")]
pub use store::fjall::FjallStore;
#[cfg(all(unix, feature = "journal"))]
pub use store::journal::JournalStore;
pub use store::memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use store::postgres::PgStore;
pub use store::sled::SledStore;
pub use types::clock::{ManualClock, SystemClock};
pub use types::hooks::Hooks;
pub use types::ids::{RunId, SessionId};
pub use types::message::{Message, ToolCall};
pub use types::record::{PendingKind, Status};
pub use types::stream::{Chunk, StreamEvent};
