//! What an agent asks of its model besides the conversation: which model, how hot, how long.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Per-agent model settings, handed to the adapter with every request. Every field is
/// optional: an adapter falls back to its own defaults for what is not set.
///
/// ```
/// use dormant::ModelSettings;
/// use serde_json::json;
///
/// let settings = ModelSettings::model("gpt-4o-mini")
///     .temperature(0.2)
///     .max_output_tokens(512)
///     .extra("top_p", json!(0.9));
/// assert_eq!(settings.model.as_deref(), Some("gpt-4o-mini"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ModelSettings {
    /// The provider's model name (`gpt-4o-mini`, `llama3.1:8b`, …).
    pub model: Option<String>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// The most tokens one reply may have.
    pub max_output_tokens: Option<u32>,
    /// Provider-specific fields, merged into the request body as they are (`top_p`, `seed`,
    /// `reasoning_effort`, …). A key the adapter sets itself is not overridden.
    pub extra: Map<String, Value>,
}

impl ModelSettings {
    /// Settings naming `model`.
    pub fn model(model: impl Into<String>) -> Self {
        Self {
            model: Some(model.into()),
            ..Self::default()
        }
    }

    /// Sets the temperature.
    #[must_use]
    pub fn temperature(mut self, temperature: f32) -> Self {
        self.temperature = Some(temperature);
        self
    }

    /// Sets the most tokens one reply may have.
    #[must_use]
    pub fn max_output_tokens(mut self, tokens: u32) -> Self {
        self.max_output_tokens = Some(tokens);
        self
    }

    /// Adds a provider-specific field.
    #[must_use]
    pub fn extra(mut self, key: impl Into<String>, value: Value) -> Self {
        self.extra.insert(key.into(), value);
        self
    }
}
