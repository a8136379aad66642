//! A non-streamed chat-completions body as a [`ModelReply`], and the pieces a streamed reply
//! shares with it: usage, and a tool call's arguments text as JSON.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::error::{self, ErrorBody};
use crate::llm::{LlmError, ModelReply};
use crate::types::message::ToolCall;
use crate::types::usage::Usage;

/// `null` read as the type's default, as a missing field is: compatible servers (LiteLLM and
/// other proxies) write every optional field, as `null` when it has no value.
pub(crate) fn null_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// `usage`, as OpenAI reports it.
#[derive(Debug, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default, deserialize_with = "null_default")]
    prompt_tokens: u64,
    #[serde(default, deserialize_with = "null_default")]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Debug, Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl From<WireUsage> for Usage {
    fn from(wire: WireUsage) -> Self {
        let usage = Usage::new(wire.prompt_tokens, wire.completion_tokens);
        match wire.prompt_tokens_details.and_then(|d| d.cached_tokens) {
            Some(cached) => usage.cached(cached),
            None => usage,
        }
    }
}

#[derive(Debug, Deserialize)]
struct Completion {
    #[serde(default, deserialize_with = "null_default")]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<ErrorBody>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    message: WireMessage,
}

#[derive(Debug, Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Option<Value>,
    #[serde(default, deserialize_with = "null_default")]
    tool_calls: Vec<WireToolCall>,
}

#[derive(Debug, Deserialize)]
struct WireToolCall {
    #[serde(default)]
    id: Option<String>,
    function: WireFunction,
}

#[derive(Debug, Deserialize)]
struct WireFunction {
    #[serde(default, deserialize_with = "null_default")]
    name: String,
    #[serde(default)]
    arguments: Option<Value>,
}

/// Reads a non-streamed reply: the first choice's content and tool calls, and the usage.
pub(crate) fn parse(body: &[u8]) -> Result<ModelReply, LlmError> {
    let completion: Completion = serde_json::from_slice(body).map_err(|parse| {
        let text = String::from_utf8_lossy(body);
        LlmError::Provider(format!(
            "malformed response: {parse}: {}",
            error::shorten(&text)
        ))
    })?;
    if let Some(error) = &completion.error {
        return Err(error::in_stream(error));
    }
    let Some(choice) = completion.choices.into_iter().next() else {
        return Err(LlmError::Provider("malformed response: no choices".into()));
    };
    let tool_calls = choice
        .message
        .tool_calls
        .into_iter()
        .enumerate()
        .map(|(index, call)| {
            let arguments = match call.function.arguments {
                Some(Value::String(text)) => text,
                // A few servers send the arguments as an object rather than its text.
                Some(value @ Value::Object(_)) => value.to_string(),
                _ => String::new(),
            };
            tool_call(call.id, index, call.function.name, &arguments)
        })
        .collect();
    Ok(ModelReply {
        text: choice.message.content.as_ref().and_then(content_text),
        tool_calls,
        usage: completion.usage.map(Usage::from),
    })
}

/// Message content as text: a string, or the text parts of an array (some compatible
/// servers answer with parts); empty means none.
pub(crate) fn content_text(content: &Value) -> Option<String> {
    let text = match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    };
    Some(text).filter(|text| !text.is_empty())
}

/// A tool call from the model's wire form. A server that sends no id gets
/// `call_{unique}_{index}`. Empty arguments are `{}`; arguments that are not JSON are kept as their
/// raw text in a JSON string, so that the runtime's input schema check answers the model
/// with `invalid_input` (it may then correct itself) instead of the run failing.
pub(crate) fn tool_call(
    id: Option<String>,
    index: usize,
    name: String,
    arguments: &str,
) -> ToolCall {
    // A server that sends no id gets one unique to the call: a client's answer is routed by
    // the call's id, so `call_0` at every step would let a late answer to step 1's call be
    // taken for step 3's.
    let id = id
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| format!("call_{}_{index}", uuid::Uuid::now_v7().simple()));
    let input = if arguments.trim().is_empty() {
        Value::Object(serde_json::Map::new())
    } else {
        serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()))
    };
    ToolCall { id, name, input }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_tool_calls_and_usage_are_read() -> Result<(), LlmError> {
        let body = json!({
            "id": "chatcmpl-1", "object": "chat.completion",
            "choices": [{ "index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Checking.",
                "tool_calls": [
                    { "id": "call_a", "type": "function",
                      "function": { "name": "lookup", "arguments": "{\"item\":\"tea\"}" } },
                    { "type": "function", "function": { "name": "now", "arguments": "" } },
                    { "id": "call_c", "type": "function",
                      "function": { "name": "lookup", "arguments": "{\"item\":" } }
                ]
            }}],
            "usage": { "prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27,
                       "prompt_tokens_details": { "cached_tokens": 16 } }
        });
        let reply = parse(body.to_string().as_bytes())?;
        assert_eq!(reply.text.as_deref(), Some("Checking."));
        let [a, b, c] = &reply.tool_calls[..] else {
            panic!("three calls: {:?}", reply.tool_calls);
        };
        assert_eq!(
            a,
            &ToolCall::new("call_a", "lookup", json!({ "item": "tea" }))
        );
        assert!(
            b.id.starts_with("call_") && b.id.ends_with("_1"),
            "{}",
            b.id
        );
        assert_eq!((b.name.as_str(), &b.input), ("now", &json!({})));
        assert_eq!(c, &ToolCall::new("call_c", "lookup", json!("{\"item\":")));
        let again = parse(body.to_string().as_bytes())?;
        assert_ne!(again.tool_calls[1].id, b.id, "a made-up id is never reused");
        assert_eq!(reply.usage, Some(Usage::new(20, 7).cached(16)));
        Ok(())
    }

    #[test]
    fn empty_or_null_content_is_no_text() -> Result<(), LlmError> {
        for content in [json!(""), json!(null)] {
            let body = json!({ "choices": [{ "message": { "content": content } }] });
            let reply = parse(body.to_string().as_bytes())?;
            assert_eq!(reply, ModelReply::default());
        }
        let parts = json!({ "choices": [{ "message": { "content": [
            { "type": "text", "text": "a" }, { "type": "text", "text": "b" }] } }] });
        assert_eq!(
            parse(parts.to_string().as_bytes())?.text.as_deref(),
            Some("ab")
        );
        Ok(())
    }

    #[test]
    fn bodies_that_are_not_replies_are_provider_errors() {
        assert!(matches!(parse(b"<html>"), Err(LlmError::Provider(_))));
        assert!(matches!(
            parse(b"{\"choices\":[]}"),
            Err(LlmError::Provider(_))
        ));
        let error = br#"{"error":{"message":"boom"}}"#;
        assert!(matches!(parse(error), Err(LlmError::Provider(m)) if m.contains("boom")));
    }
}
