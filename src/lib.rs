//! dormant: an in-process, actor-based runtime for durable agent sessions.
//!
//! Each session is an actor that owns its state and mailbox. Its agent loop (ask the model,
//! run tools, repeat) commits every step to an embedded [sled] store before acting on it, so a
//! session can be evicted from memory at any idle moment and rehydrated by its next message,
//! and a killed process loses nothing it acknowledged.
//!
//! # Layout
//!
//! One module a concept, each importing only those above it in this list (ARCHITECTURE.md
//! has the map and the few exceptions):
//!
//! - [`types`]: the vocabulary: ids, messages, the session and run records, the
//!   [`stream`](types::stream), [`usage`](types::usage), [`hooks`](types::hooks), the
//!   [`clock`](types::clock).
//! - [`llm`]: the [`LlmAdapter`] trait, [`ModelSettings`], the [`DeltaSink`] a streaming
//!   adapter writes to, [`ScriptedLlm`] (a deterministic model) and, with the `openai`
//!   feature, `OpenAiAdapter`.
//! - [`skills`]: skills with progressive disclosure (a catalog in the prompt, `load_skill`,
//!   `read_skill_file`), from code or from `SKILL.md` folders.
//! - [`definition`]: [`AgentDefinition`] and [`ToolDefinition`], validated when built.
//! - [`store`]: the [`Store`] trait, the stored layout (`store::schema`), [`SledStore`] (group
//!   commit, power-loss safe by default) and [`MemoryStore`] for unit tests.
//! - [`session`]: the session core, a pure state machine (inputs in, a commit and effects out),
//!   and the submit contract (`session::submit`).
//! - [`remote`]: sub-agents on other servers.
//! - [`cluster`]: several nodes on one store: leases and the calls between nodes.
//! - `engine`: the session actor that executes the core's transitions on the
//!   [`dormant_actors`] host, the deadline scheduler, the tool runner.
//! - [`Runtime`] (`runtime.rs`): the handle a daemon embeds: define agents, execute, inspect,
//!   follow streams, evict, shut down.
//!
//! # Features
//!
//! - `test-util` (off by default): test tooling, so that a user's build does not compile it:
//!   `dormant::testkit`: the conformance scenario runner `dormant::testkit::scenario` (the
//!   format is `docs/scenario-format.md`), the store contract suite, the
//!   delegating store (`store::DelegatingStore`; `store::FaultyStore` injects faults), a
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
pub mod remote;
mod runtime;
pub mod session;
pub mod skills;
pub mod store;
// Test tooling: built only with the `test-util` feature (see Cargo.toml), so that a user's
// build does not compile the runner or pull in its dependencies.
#[cfg(feature = "test-util")]
pub mod testkit;
pub mod types;

// The README's Rust blocks are compiled (and run, unless `no_run`) as doctests, so they stay
// true. They use the `openai` adapter and the PostgreSQL store, which `cargo test --workspace`
// turns on (the server crate's default features).
#[cfg(all(doctest, feature = "openai", feature = "postgres"))]
#[doc = include_str!("../README.md")]
mod readme {}

pub use definition::{
    AgentBuilder, AgentDefinition, Approval, CompanionMode, DefinitionError, PersistentAgent,
    ToolContext, ToolDefinition, ToolError, ToolHandler, ToolKind,
};
/// The actor host's counters in [`RuntimeStats::host`], re-exported so that reading them needs
/// no dependency on `dormant-actors`.
pub use dormant_actors::HostStats;
pub use engine::deadlines::SweepReport;
pub use engine::metrics::{ClientToolStats, Latency};
pub use error::Error;
/// The boxed future an [`LlmAdapter`] or a [`ToolHandler`] returns, re-exported so that
/// implementing them needs no dependency on `futures`.
pub use futures::future::BoxFuture;
pub use llm::{
    DeltaSink, LlmAdapter, LlmError, ModelReply, ModelRequest, ModelSettings, ScriptedLlm,
};
#[cfg(feature = "openai")]
pub use llm::{OpenAiAdapter, OpenAiBuilder, OpenAiConfigError};
pub use runtime::{Runtime, RuntimeBuilder, RuntimeStats, WeakRuntime};
pub use session::submit::{Submit, SubmitAnswer, SubmitOutcome};
pub use session::{
    Answer, ChildCall, ChildState, Companion, CompanionStatus, ErrorCode, PendingCall, PendingKind,
    RunError, RunOutcome, RunRecord, RunStarted, SessionRecord, Status,
};
pub use store::schema::ExpiredCall;
pub use store::{MemoryStore, SledStore, Store};
#[cfg(feature = "postgres")]
pub use store::{PgSetting, PgStore};
pub use types::clock::{Clock, ManualClock, SystemClock};
pub use types::hooks::{HookEvent, Hooks};
pub use types::ids::{RunId, SessionId};
pub use types::message::{Message, ToolCall, ToolOutcome};
pub use types::stream::{Chunk, ChunkKind, Delta, DeltaKind, StreamEvent};
pub use types::tool_error::ToolErrorCode;
pub use types::untrusted::{Untrusted, UNTRUSTED_LOG_BYTES};
pub use types::usage::{RunUsage, Usage, UsageEntry};
