//! Level 1 at the model call: the catalog (and the preloaded bodies) appended to the agent's
//! system prompt, read from the provider where IO is allowed (the task that calls the model).

use std::sync::Arc;

use super::{catalog_fragment, SkillProvider};
use crate::llm::ModelRequest;

/// The last skills section an agent's prompt got, shared by its sessions.
pub(crate) type LastSection = Arc<parking_lot::Mutex<Option<String>>>;

/// What a model call needs to build an agent's skills section.
#[derive(Clone, Debug)]
pub(crate) struct PromptSkills {
    pub(crate) provider: Arc<dyn SkillProvider>,
    pub(crate) preload: Arc<[String]>,
    /// Used when the provider cannot list: the prompt keeps the section it had, rather than
    /// losing it (and its preloaded bodies) for a step.
    pub(crate) last: LastSection,
}

impl PromptSkills {
    /// Appends the skills section to `request`'s system prompt. A provider that fails (or
    /// panics) is logged, and the prompt gets the last section built for the agent (none if
    /// there never was one): the step still runs, since its reply is what ends the step (a
    /// lost one would leave the run waiting forever), and the tools report the same failure
    /// to the model if it asks. A preloaded name the provider does not know is skipped with a
    /// warning.
    pub(crate) async fn extend_prompt(&self, request: &mut ModelRequest) {
        use futures::FutureExt;
        let session = request.session_id.clone();
        let section = std::panic::AssertUnwindSafe(self.section(&session))
            .catch_unwind()
            .await;
        let fragment = match section {
            Ok(Ok(fragment)) => {
                *self.last.lock() = Some(fragment.clone());
                fragment
            }
            Ok(Err(())) => self.last.lock().clone().unwrap_or_default(),
            Err(panic) => {
                let reason = crate::types::panic::panic_text(panic.as_ref());
                tracing::error!(%session, reason = %crate::types::Untrusted(&reason), "skills.provider_panicked");
                self.last.lock().clone().unwrap_or_default()
            }
        };
        if fragment.is_empty() {
            return;
        }
        let prompt = &mut request.system_prompt;
        if !prompt.is_empty() && !prompt.ends_with("\n\n") {
            prompt.push_str(if prompt.ends_with('\n') { "\n" } else { "\n\n" });
        }
        prompt.push_str(&fragment);
    }

    /// The catalog and preloaded bodies (empty when there are no skills); `Err` when the
    /// provider could not list them.
    async fn section(&self, session: &crate::types::ids::SessionId) -> Result<String, ()> {
        let catalog = match self.provider.list().await {
            Ok(catalog) => catalog,
            Err(error) => {
                tracing::warn!(%session, error = %crate::types::Untrusted(&error), "skills.catalog_failed");
                return Err(());
            }
        };
        let mut preloaded = Vec::with_capacity(self.preload.len());
        for name in self.preload.iter() {
            match self.provider.get(name).await {
                Ok(Some(skill)) => preloaded.push(skill),
                Ok(None) => {
                    tracing::warn!(%session, skill = %crate::types::Untrusted(&name), "skills.preload_unknown")
                }
                Err(error) => {
                    tracing::warn!(%session, skill = %crate::types::Untrusted(&name), error = %crate::types::Untrusted(&error), "skills.preload_failed");
                }
            }
        }
        Ok(catalog_fragment(&catalog, &preloaded))
    }
}
