//! A [`ModelRequest`] as a chat-completions request body.

use serde_json::{json, Map, Value};

use crate::llm::{LlmError, ModelRequest};
use crate::types::message::{Message, ToolCall, ToolOutcome};

/// The body for `request`: its model (the agent's, else `default_model`), the system prompt
/// and conversation, the tools, the settings, then each `extra` field the body does not
/// already have.
///
/// # Errors
/// [`LlmError::Provider`] when neither the agent nor the adapter names a model.
pub(crate) fn body(
    request: &ModelRequest,
    default_model: Option<&str>,
    stream: bool,
) -> Result<Value, LlmError> {
    let settings = &request.settings;
    let Some(model) = settings.model.as_deref().or(default_model) else {
        return Err(LlmError::Provider(format!(
            "no model: agent {} names none in its model settings and the adapter has no default",
            request.agent
        )));
    };
    let mut body = Map::new();
    body.insert("model".into(), model.into());
    body.insert("messages".into(), messages(request).into());
    if !request.tools.is_empty() {
        let tools = request.tools.iter().map(|tool| {
            json!({ "type": "function", "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.input_schema,
            }})
        });
        body.insert("tools".into(), tools.collect::<Vec<_>>().into());
    }
    if let Some(temperature) = settings.temperature {
        body.insert("temperature".into(), number(temperature));
    }
    if let Some(tokens) = settings.max_output_tokens {
        body.insert("max_tokens".into(), tokens.into());
    }
    if stream {
        body.insert("stream".into(), true.into());
        body.insert("stream_options".into(), json!({ "include_usage": true }));
    }
    for (key, value) in &settings.extra {
        body.entry(key.clone()).or_insert_with(|| value.clone());
    }
    Ok(Value::Object(body))
}

fn messages(request: &ModelRequest) -> Vec<Value> {
    let system = (!request.system_prompt.is_empty())
        .then(|| json!({ "role": "system", "content": request.system_prompt }));
    system
        .into_iter()
        .chain(request.messages.iter().map(message))
        .collect()
}

fn message(message: &Message) -> Value {
    match message {
        Message::User { text } => json!({ "role": "user", "content": text }),
        Message::Assistant { text, tool_calls } => {
            let mut wire = Map::new();
            wire.insert("role".into(), "assistant".into());
            // A provider refuses an assistant message with neither content nor tool calls.
            let content = match text {
                Some(text) => Value::String(text.clone()),
                None if tool_calls.is_empty() => Value::String(String::new()),
                None => Value::Null,
            };
            wire.insert("content".into(), content);
            if !tool_calls.is_empty() {
                let calls: Vec<Value> = tool_calls.iter().map(tool_call).collect();
                wire.insert("tool_calls".into(), calls.into());
            }
            Value::Object(wire)
        }
        Message::Tool {
            tool_call_id,
            outcome,
            ..
        } => {
            let content = match outcome {
                ToolOutcome::Result(Value::String(text)) => text.clone(),
                ToolOutcome::Result(value) => value.to_string(),
                ToolOutcome::Error(text) => format!("error: {text}"),
            };
            json!({ "role": "tool", "tool_call_id": tool_call_id, "content": content })
        }
    }
}

/// A recorded call as the model made it. Arguments are always the input's JSON text: an
/// input kept as a string because the model's arguments were not JSON goes back as a JSON
/// string, which every provider accepts, rather than as the broken text.
fn tool_call(call: &ToolCall) -> Value {
    json!({
        "id": call.id,
        "type": "function",
        "function": { "name": call.name, "arguments": call.input.to_string() },
    })
}

/// An `f32` setting as the decimal it was written as: `0.2`, not `0.20000000298023224`.
fn number(value: f32) -> Value {
    value
        .to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::llm::ToolSpec;
    use crate::llm::{DeltaSink, ModelSettings};

    fn request(settings: ModelSettings, messages: Vec<Message>) -> Result<ModelRequest, String> {
        Ok(ModelRequest {
            session_id: "s1".parse().map_err(|e| format!("{e:?}"))?,
            agent: "clerk".into(),
            system_prompt: "Be brief.".into(),
            messages: Arc::new(messages),
            tools: Arc::from(vec![ToolSpec {
                name: "lookup".into(),
                description: "Finds an item.".into(),
                input_schema: json!({ "type": "object" }),
            }]),
            settings: Arc::new(settings),
            deltas: DeltaSink::discard(),
        })
    }

    #[test]
    fn the_conversation_maps_to_chat_messages() -> Result<(), String> {
        let conversation = vec![
            Message::User {
                text: "tea?".into(),
            },
            Message::Assistant {
                text: None,
                tool_calls: vec![
                    ToolCall::new("c1", "lookup", json!({ "item": "tea" })),
                    ToolCall::new("c2", "lookup", json!("{broken")),
                ],
            },
            Message::Tool {
                tool_call_id: "c1".into(),
                tool_name: "lookup".into(),
                outcome: ToolOutcome::Result(json!({ "stock": 3 })),
            },
            Message::Tool {
                tool_call_id: "c2".into(),
                tool_name: "lookup".into(),
                outcome: ToolOutcome::Error("invalid_input: not an object".into()),
            },
            Message::Assistant {
                text: Some("3 teas.".into()),
                tool_calls: vec![],
            },
        ];
        let body = body(
            &request(ModelSettings::default(), conversation)?,
            Some("m"),
            false,
        )
        .map_err(|e| e.to_string())?;
        assert_eq!(
            body["messages"],
            json!([
                { "role": "system", "content": "Be brief." },
                { "role": "user", "content": "tea?" },
                { "role": "assistant", "content": null, "tool_calls": [
                    { "id": "c1", "type": "function",
                      "function": { "name": "lookup", "arguments": "{\"item\":\"tea\"}" } },
                    { "id": "c2", "type": "function",
                      "function": { "name": "lookup", "arguments": "\"{broken\"" } },
                ]},
                { "role": "tool", "tool_call_id": "c1", "content": "{\"stock\":3}" },
                { "role": "tool", "tool_call_id": "c2",
                  "content": "error: invalid_input: not an object" },
                { "role": "assistant", "content": "3 teas." },
            ])
        );
        assert_eq!(
            body["tools"],
            json!([{ "type": "function", "function": {
                "name": "lookup", "description": "Finds an item.",
                "parameters": { "type": "object" } } }])
        );
        assert_eq!(body.get("stream"), None);
        Ok(())
    }

    #[test]
    fn settings_win_over_defaults_and_extra_fills_only_gaps() -> Result<(), String> {
        let settings = ModelSettings::model("gpt-4o-mini")
            .temperature(0.2)
            .max_output_tokens(64)
            .extra("top_p", json!(0.9))
            .extra("model", json!("sneaky"))
            .extra("stream", json!(false));
        let body =
            body(&request(settings, vec![])?, Some("fallback"), true).map_err(|e| e.to_string())?;
        assert_eq!(body["model"], "gpt-4o-mini");
        assert_eq!(body["temperature"], json!(0.2));
        assert_eq!(body["max_tokens"], 64);
        assert_eq!(body["top_p"], json!(0.9));
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"], json!({ "include_usage": true }));
        Ok(())
    }

    #[test]
    fn a_request_without_any_model_is_refused() -> Result<(), String> {
        let refused = body(&request(ModelSettings::default(), vec![])?, None, true);
        assert!(matches!(refused, Err(LlmError::Provider(m)) if m.starts_with("no model")));
        let fallback = body(
            &request(ModelSettings::default(), vec![])?,
            Some("local"),
            true,
        )
        .map_err(|e| e.to_string())?;
        assert_eq!(fallback["model"], "local");
        Ok(())
    }
}
