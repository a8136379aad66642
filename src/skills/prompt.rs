//! Level 1 at the model call: the catalog (and the preloaded bodies) appended to the agent's
//! system prompt, read from the provider where IO is allowed (the task that calls the model).

use std::sync::Arc;

use super::{catalog_fragment, SkillProvider};
use crate::llm::ModelRequest;

/// What a model call needs to build an agent's skills section.
#[derive(Clone, Debug)]
pub(crate) struct PromptSkills {
    pub(crate) provider: Arc<dyn SkillProvider>,
    pub(crate) preload: Vec<String>,
}

impl PromptSkills {
    /// Appends the skills section to `request`'s system prompt. A provider that fails is
    /// logged and leaves the prompt without the section (the step still runs: the tools
    /// report the same failure to the model if it asks); a preloaded name the provider does
    /// not know is skipped with a warning.
    pub(crate) async fn extend_prompt(&self, request: &mut ModelRequest) {
        let session = &request.session_id;
        let catalog = match self.provider.list().await {
            Ok(catalog) => catalog,
            Err(error) => {
                tracing::warn!(%session, %error, "skills.catalog_failed");
                return;
            }
        };
        let mut preloaded = Vec::with_capacity(self.preload.len());
        for name in &self.preload {
            match self.provider.get(name).await {
                Ok(Some(skill)) => preloaded.push(skill),
                Ok(None) => tracing::warn!(%session, skill = %name, "skills.preload_unknown"),
                Err(error) => {
                    tracing::warn!(%session, skill = %name, %error, "skills.preload_failed");
                }
            }
        }
        let fragment = catalog_fragment(&catalog, &preloaded);
        if fragment.is_empty() {
            return;
        }
        let prompt = &mut request.system_prompt;
        if !prompt.is_empty() && !prompt.ends_with("\n\n") {
            prompt.push_str(if prompt.ends_with('\n') { "\n" } else { "\n\n" });
        }
        prompt.push_str(&fragment);
    }
}
