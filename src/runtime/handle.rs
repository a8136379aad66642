//! The handle itself, in a file of its own so that its one public path is the crate root's
//! (`dormant::Runtime`); its methods are in `runtime.rs` and the files beside this one.

use std::sync::Arc;

use super::inner::Inner;

/// Hosts durable agent sessions. Cheap to clone; every clone drives the same sessions.
///
/// ```
/// use std::sync::Arc;
/// use dormant::{AgentDefinition, ModelReply, Runtime, ScriptedLlm, SledStore, Status};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let llm = ScriptedLlm::new().script("greeter", vec![ModelReply::text("Hello!")]);
/// let runtime = Runtime::builder()
///     .store(Arc::new(SledStore::temporary()?))
///     .llm(Arc::new(llm))
///     .agent(AgentDefinition::builder("greeter").build()?)
///     .build()?;
/// let outcome = runtime.execute("greeter", "hi").await?;
/// assert_eq!(outcome.status, Status::Completed);
/// assert_eq!(outcome.text.as_deref(), Some("Hello!"));
/// runtime.shutdown().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Runtime {
    pub(super) inner: Arc<Inner>,
}
