//! Messages as the GenAI semantic conventions record them when content is captured
//! (`gen_ai.input.messages`, `gen_ai.output.messages`): JSON arrays of `{role, parts}`, a
//! part being `text`, `tool_call` (`id`, `name`, `arguments`) or `tool_call_response` (`id`,
//! `response`).

use serde_json::{json, Value};

use crate::types::message::{Message, ToolCall, ToolOutcome};

/// The conversation sent to the model.
pub(super) fn input_messages(messages: &[Message]) -> String {
    let messages: Vec<Value> = messages.iter().map(message).collect();
    Value::Array(messages).to_string()
}

/// The model's reply, with its finish reason.
pub(super) fn output_messages(text: Option<&str>, calls: &[ToolCall], finish: &str) -> String {
    let mut reply = assistant(text, calls);
    reply["finish_reason"] = json!(finish);
    Value::Array(vec![reply]).to_string()
}

fn message(message: &Message) -> Value {
    match message {
        Message::User { text } => json!({
            "role": "user",
            "parts": [{ "type": "text", "content": text }],
        }),
        Message::Assistant { text, tool_calls } => assistant(text.as_deref(), tool_calls),
        Message::Tool {
            tool_call_id,
            outcome,
            ..
        } => {
            let response = match outcome {
                ToolOutcome::Result(value) => value.clone(),
                ToolOutcome::Error(error) => json!({ "error": error }),
            };
            json!({
                "role": "tool",
                "parts": [{ "type": "tool_call_response", "id": tool_call_id, "response": response }],
            })
        }
    }
}

fn assistant(text: Option<&str>, calls: &[ToolCall]) -> Value {
    let text = text.map(|text| json!({ "type": "text", "content": text }));
    let calls = calls.iter().map(|call| {
        json!({ "type": "tool_call", "id": call.id, "name": call.name, "arguments": call.input })
    });
    let parts: Vec<Value> = text.into_iter().chain(calls).collect();
    json!({ "role": "assistant", "parts": parts })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_reads_as_the_conventions_parts() -> Result<(), serde_json::Error> {
        let messages = [
            Message::User { text: "hi".into() },
            Message::Assistant {
                text: None,
                tool_calls: vec![ToolCall::new("c1", "look", json!({ "q": 1 }))],
            },
            Message::Tool {
                tool_call_id: "c1".into(),
                tool_name: "look".into(),
                outcome: ToolOutcome::Error("denied".into()),
            },
        ];
        let read: Value = serde_json::from_str(&input_messages(&messages))?;
        assert_eq!(
            read,
            json!([
                { "role": "user", "parts": [{ "type": "text", "content": "hi" }] },
                { "role": "assistant", "parts": [
                    { "type": "tool_call", "id": "c1", "name": "look", "arguments": { "q": 1 } }
                ] },
                { "role": "tool", "parts": [
                    { "type": "tool_call_response", "id": "c1", "response": { "error": "denied" } }
                ] },
            ])
        );
        let reply: Value = serde_json::from_str(&output_messages(Some("done"), &[], "stop"))?;
        assert_eq!(
            reply,
            json!([{ "role": "assistant", "finish_reason": "stop",
                     "parts": [{ "type": "text", "content": "done" }] }])
        );
        Ok(())
    }
}
