//! A streamed reply: each `data` event's chunk applied to the reply being assembled, its
//! pieces sent to the session's live followers as they come.

use serde::Deserialize;
use serde_json::Value;

use super::error::{self, ErrorBody};
use super::response::{content_text, null_default, tool_call, WireUsage};
use crate::llm::{DeltaSink, LlmError, ModelReply};
use crate::types::usage::Usage;

/// One `chat.completion.chunk`.
#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default, deserialize_with = "null_default")]
    choices: Vec<ChunkChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<ErrorBody>,
}

#[derive(Debug, Deserialize)]
struct ChunkChoice {
    #[serde(default, deserialize_with = "null_default")]
    index: u64,
    #[serde(default)]
    delta: Option<ChunkDelta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChunkDelta {
    #[serde(default)]
    content: Option<Value>,
    #[serde(default, deserialize_with = "null_default")]
    tool_calls: Vec<ToolCallFragment>,
}

#[derive(Debug, Deserialize)]
struct ToolCallFragment {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionFragment>,
}

#[derive(Debug, Default, Deserialize)]
struct FunctionFragment {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

/// A tool call being assembled.
#[derive(Debug)]
struct PartialCall {
    /// The provider's `index`, when it sent one.
    index: Option<u64>,
    id: Option<String>,
    name: String,
    arguments: String,
}

/// Where a stream stands after an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    /// More is to come.
    Reading,
    /// `[DONE]`: the reply is whole.
    Done,
}

/// The reply a stream has delivered so far.
#[derive(Debug, Default)]
pub(crate) struct Assembler {
    text: String,
    calls: Vec<PartialCall>,
    usage: Option<Usage>,
    finished: bool,
    /// Whether any piece of the reply arrived: from then on a failure cannot be retried,
    /// since followers have seen part of an answer that a new attempt would not repeat.
    started: bool,
}

impl Assembler {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Whether a piece of the reply has arrived (and gone to `deltas`).
    pub(crate) fn started(&self) -> bool {
        self.started
    }

    /// Applies one event's data.
    ///
    /// # Errors
    /// [`LlmError::Provider`] for a chunk that is not JSON (`malformed chunk: …`), or the
    /// error of an error event.
    pub(crate) fn apply(&mut self, data: &str, deltas: &DeltaSink) -> Result<Progress, LlmError> {
        if data.trim() == "[DONE]" {
            return Ok(Progress::Done);
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|parse| {
            LlmError::Provider(format!(
                "malformed chunk: {parse}: {}",
                error::shorten(data)
            ))
        })?;
        if let Some(error) = &chunk.error {
            return Err(error::in_stream(error));
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage.into());
        }
        // One reply is read: the first choice (an `n` given through `extra` asks for several;
        // the others are dropped rather than mixed into it).
        for choice in chunk.choices.into_iter().filter(|choice| choice.index == 0) {
            if let Some(delta) = choice.delta {
                if let Some(text) = delta.content.as_ref().and_then(content_text) {
                    self.started = true;
                    self.text.push_str(&text);
                    deltas.text(text);
                }
                for fragment in delta.tool_calls {
                    self.started = true;
                    self.apply_tool_call(fragment, deltas);
                }
            }
            if choice.finish_reason.is_some() {
                self.finished = true;
            }
        }
        Ok(Progress::Reading)
    }

    /// The assembled reply once the stream ended without `[DONE]`: whole if a finish reason
    /// came (some servers stop there), cut short otherwise.
    ///
    /// # Errors
    /// [`LlmError::Provider`] (`stream ended early`) if no finish reason came.
    pub(crate) fn end(self) -> Result<ModelReply, LlmError> {
        if !self.finished {
            return Err(LlmError::Provider(
                "stream ended early: no finish_reason and no [DONE]".into(),
            ));
        }
        Ok(self.reply())
    }

    /// The reply as assembled.
    pub(crate) fn reply(self) -> ModelReply {
        let tool_calls = self
            .calls
            .into_iter()
            .enumerate()
            .map(|(slot, call)| tool_call(call.id, slot, call.name, &call.arguments))
            .collect();
        ModelReply {
            text: Some(self.text).filter(|text| !text.is_empty()),
            tool_calls,
            usage: self.usage,
        }
    }

    /// Adds a fragment to its call: the one of the same `index`, unless it brings another id
    /// (a few servers send each whole call at index 0); without an index, the last call
    /// unless it brings a new id.
    fn apply_tool_call(&mut self, fragment: ToolCallFragment, deltas: &DeltaSink) {
        let id = fragment.id.filter(|id| !id.is_empty());
        let function = fragment.function.unwrap_or_default();
        let other_id = |call: &PartialCall| match (&id, &call.id) {
            (Some(new), Some(old)) => new != old,
            _ => false,
        };
        let found = match fragment.index {
            Some(index) => self
                .calls
                .iter()
                .rposition(|call| call.index == Some(index) && !other_id(call)),
            None => self.calls.len().checked_sub(1).filter(|&last| {
                self.calls
                    .get(last)
                    .is_some_and(|call| id.is_none() || !other_id(call))
            }),
        };
        let slot = found.unwrap_or_else(|| {
            self.calls.push(PartialCall {
                index: fragment.index,
                id: None,
                name: String::new(),
                arguments: String::new(),
            });
            self.calls.len() - 1
        });
        let Some(call) = self.calls.get_mut(slot) else {
            return;
        };
        let new_id = id.filter(|_| call.id.is_none());
        if let Some(id) = &new_id {
            call.id = Some(id.clone());
        }
        // The name comes whole in the first fragment; a server that repeats it adds nothing.
        let new_name = function
            .name
            .filter(|name| !name.is_empty() && call.name.is_empty());
        if let Some(name) = &new_name {
            call.name.clone_from(name);
        }
        let arguments = function.arguments.unwrap_or_default();
        call.arguments.push_str(&arguments);
        if new_id.is_some() || new_name.is_some() || !arguments.is_empty() {
            let position = u32::try_from(slot).unwrap_or(u32::MAX);
            deltas.tool_call(position, new_id, new_name, arguments);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::message::ToolCall;
    use serde_json::json;

    fn assemble(events: &[Value]) -> Result<ModelReply, LlmError> {
        let mut assembler = Assembler::new();
        for event in events {
            assembler.apply(&event.to_string(), &DeltaSink::discard())?;
        }
        assert_eq!(
            assembler.apply("[DONE]", &DeltaSink::discard())?,
            Progress::Done
        );
        Ok(assembler.reply())
    }

    fn delta(delta: Value) -> Value {
        json!({ "object": "chat.completion.chunk", "choices": [{ "index": 0, "delta": delta }] })
    }

    #[test]
    fn text_and_usage_are_assembled() -> Result<(), LlmError> {
        let reply = assemble(&[
            delta(json!({ "role": "assistant", "content": "" })),
            delta(json!({ "content": "Hel" })),
            delta(json!({ "content": "lo" })),
            json!({ "choices": [{ "index": 0, "delta": {}, "finish_reason": "stop" }] }),
            json!({ "choices": [], "usage": { "prompt_tokens": 5, "completion_tokens": 2 } }),
        ])?;
        assert_eq!(
            reply,
            ModelReply::text("Hello").with_usage(Usage::new(5, 2))
        );
        Ok(())
    }

    #[test]
    fn tool_calls_are_joined_by_index_in_order() -> Result<(), LlmError> {
        let fragment = |index: u64, id: Option<&str>, name: Option<&str>, args: &str| {
            let mut function = json!({ "arguments": args });
            if let Some(name) = name {
                function["name"] = json!(name);
            }
            let mut call = json!({ "index": index, "function": function });
            if let Some(id) = id {
                call["id"] = json!(id);
                call["type"] = json!("function");
            }
            delta(json!({ "tool_calls": [call] }))
        };
        let reply = assemble(&[
            fragment(0, Some("call_a"), Some("lookup"), ""),
            fragment(1, Some("call_b"), Some("now"), ""),
            fragment(0, None, None, "{\"item\":"),
            fragment(1, None, None, "{}"),
            fragment(0, None, None, "\"tea\"}"),
        ])?;
        assert_eq!(
            reply.tool_calls,
            vec![
                ToolCall::new("call_a", "lookup", json!({ "item": "tea" })),
                ToolCall::new("call_b", "now", json!({})),
            ]
        );
        Ok(())
    }

    #[test]
    fn whole_calls_at_one_index_or_without_one_stay_apart() -> Result<(), LlmError> {
        let whole = |index: Option<u64>, id: &str| {
            let mut call = json!({ "id": id, "type": "function",
                "function": { "name": "f", "arguments": "{\"x\":1}" } });
            if let Some(index) = index {
                call["index"] = json!(index);
            }
            delta(json!({ "tool_calls": [call] }))
        };
        for index in [Some(0), None] {
            let reply = assemble(&[whole(index, "a"), whole(index, "b")])?;
            let ids: Vec<&str> = reply.tool_calls.iter().map(|c| c.id.as_str()).collect();
            assert_eq!(ids, ["a", "b"], "index {index:?}");
        }
        Ok(())
    }

    #[test]
    fn malformed_and_error_chunks_fail_and_a_cut_stream_is_early() {
        let mut assembler = Assembler::new();
        let sink = DeltaSink::discard();
        let malformed = assembler.apply("{\"choices\": [", &sink);
        assert!(
            matches!(malformed, Err(LlmError::Provider(m)) if m.starts_with("malformed chunk"))
        );
        let error = assembler.apply(r#"{"error":{"message":"overloaded"}}"#, &sink);
        assert!(matches!(error, Err(LlmError::Provider(m)) if m.contains("overloaded")));
        let cut = Assembler::new().end();
        assert!(matches!(cut, Err(LlmError::Provider(m)) if m.starts_with("stream ended early")));
    }
}
