//! What a run consumed: tokens per model call, and every tool call's success, summed per run.

use serde::{Deserialize, Serialize};

/// Tokens one model call used, as its provider reported them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Reply tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache, when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_tokens: Option<u64>,
}

impl Usage {
    /// Usage of `input_tokens` in and `output_tokens` out.
    pub fn new(input_tokens: u64, output_tokens: u64) -> Self {
        Self {
            input_tokens,
            output_tokens,
            cached_input_tokens: None,
        }
    }

    /// Sets the cached prompt tokens.
    #[must_use]
    pub fn cached(mut self, cached_input_tokens: u64) -> Self {
        self.cached_input_tokens = Some(cached_input_tokens);
        self
    }

    /// Adds `other` to this (cached tokens stay unknown only while both are).
    pub fn add(&mut self, other: &Usage) {
        // Saturating: the counts come from a provider, and a wild one must not panic a step.
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cached_input_tokens = match (self.cached_input_tokens, other.cached_input_tokens) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
    }
}

/// One usage record of a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
#[non_exhaustive]
pub enum UsageEntry {
    /// A model call (one step).
    Model {
        /// The step (1-based within the session's run).
        step: u32,
        /// Tokens, if the provider reported them.
        usage: Option<Usage>,
        /// Whether the call produced a reply.
        success: bool,
    },
    /// A tool call's recorded outcome: a result (`success: true`) or an error, the timeout
    /// of a client tool included (`success: false`).
    Tool {
        /// The call.
        tool_call_id: String,
        /// The tool.
        tool_name: String,
        /// Whether it produced a result.
        success: bool,
    },
}

/// A run's usage: every record, and the token totals.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunUsage {
    /// Tokens of every model call of the run, summed.
    pub tokens: Usage,
    /// Model calls made (with or without reported tokens, failed ones included).
    pub model_calls: u32,
    /// Tool outcomes recorded.
    pub tool_calls: u32,
    /// Tool outcomes that were errors.
    pub tool_errors: u32,
    /// Each record, in order.
    pub entries: Vec<UsageEntry>,
}

impl RunUsage {
    /// Records a model call.
    pub(crate) fn record_model(&mut self, step: u32, usage: Option<Usage>, success: bool) {
        self.model_calls += 1;
        if let Some(usage) = &usage {
            self.tokens.add(usage);
        }
        self.entries.push(UsageEntry::Model {
            step,
            usage,
            success,
        });
    }

    /// Records a tool call's outcome.
    pub(crate) fn record_tool(&mut self, tool_call_id: &str, tool_name: &str, success: bool) {
        self.tool_calls += 1;
        if !success {
            self.tool_errors += 1;
        }
        self.entries.push(UsageEntry::Tool {
            tool_call_id: tool_call_id.to_string(),
            tool_name: tool_name.to_string(),
            success,
        });
    }

    /// The totals alone, without the list of entries.
    pub(crate) fn totals(&self) -> RunUsage {
        RunUsage {
            tokens: self.tokens,
            model_calls: self.model_calls,
            tool_calls: self.tool_calls,
            tool_errors: self.tool_errors,
            entries: Vec::new(),
        }
    }

    /// Whether nothing was recorded (by the totals: a run in progress is stored without
    /// its entries until it suspends or ends).
    pub fn is_empty(&self) -> bool {
        self.model_calls == 0 && self.tool_calls == 0 && self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_sum_tokens_and_count_failures() {
        let mut usage = RunUsage::default();
        usage.record_model(1, Some(Usage::new(10, 2).cached(4)), true);
        usage.record_model(2, Some(Usage::new(5, 1)), true);
        usage.record_model(3, None, false);
        usage.record_tool("c1", "lookup", true);
        usage.record_tool("c2", "ask", false);
        assert_eq!(usage.tokens, Usage::new(15, 3).cached(4));
        assert_eq!(
            (usage.model_calls, usage.tool_calls, usage.tool_errors),
            (3, 2, 1)
        );
        assert_eq!(usage.entries.len(), 5);
    }
}
