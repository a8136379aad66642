//! Agents of the tests of the person's side, served in this process: `desk` asks a custom
//! client tool with a nested output schema (`order`); `clerk` asks which colour (`pick`, an
//! enum) and, in the same step, to send an email behind an approval that allows edits
//! (`send_email`, which records the input it ran with). An operator is whoever sends
//! [`OPERATOR_KEY`] in `x-api-key`; anyone else may start sessions.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use dormant::{
    AgentDefinition, Approval, ModelReply, Runtime, ScriptedLlm, SledStore, ToolCall,
    ToolDefinition, ToolError,
};
use dormant_server::{Auth, Caller};
use serde_json::{json, Value};

pub(crate) const OPERATOR_KEY: &str = "an-operator-key-for-the-browser";

/// The runtime, and the inputs `send_email` ran with.
pub(crate) struct People {
    pub(crate) runtime: Runtime,
    pub(crate) sent: Arc<Mutex<Vec<Value>>>,
}

pub(crate) fn order_schema() -> Value {
    json!({
        "type": "object",
        "required": ["quantity", "shipping"],
        "properties": {
            "quantity": { "type": "integer", "minimum": 1, "description": "How many boxes." },
            "shipping": {
                "type": "object",
                "title": "Shipping",
                "required": ["speed"],
                "properties": {
                    "speed": { "enum": ["standard", "express"] },
                    "address": {
                        "type": "object",
                        "required": ["city"],
                        "properties": {
                            "city": { "type": "string" },
                            "zip": { "type": "string" }
                        }
                    }
                }
            },
            "gift": { "type": "boolean", "description": "Wrap it as a gift." },
            "notes": { "type": "array", "items": { "type": "string", "title": "note" } }
        }
    })
}

fn email_schema() -> Value {
    json!({
        "type": "object",
        "required": ["to", "subject"],
        "properties": {
            "to": { "type": "string", "pattern": "^[^@ ]+@[^@ ]+$", "description": "One address." },
            "subject": { "type": "string" },
            "cc": { "type": "array", "items": { "type": "string" } }
        }
    })
}

pub(crate) fn runtime() -> anyhow::Result<People> {
    let llm = ScriptedLlm::new()
        .script(
            "desk",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new(
                    "order-1",
                    "order",
                    json!({ "item": "moving boxes", "why": { "moving": true, "rooms": ["kitchen", "hall"] } }),
                )]),
                ModelReply::text("Ordered."),
            ],
        )
        .script(
            "clerk",
            vec![
                ModelReply::tool_calls(vec![
                    ToolCall::new("pick-1", "pick", json!({ "question": "Which colour?" })),
                    ToolCall::new(
                        "email-1",
                        "send_email",
                        json!({ "to": "ana@example.com", "subject": "Hello", "cc": ["team@example.com"] }),
                    ),
                ]),
                ModelReply::text("Done."),
            ],
        );
    let sent = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&sent);
    let desk = AgentDefinition::builder("desk")
        .tool(
            ToolDefinition::client("order")
                .description("Asks the person how to order.")
                .output_schema(order_schema()),
        )
        .build()?;
    let clerk = AgentDefinition::builder("clerk")
        .tool(
            ToolDefinition::client("pick")
                .description("Asks which colour the card should be.")
                .output_schema(json!({
                    "type": "object",
                    "required": ["colour"],
                    "properties": { "colour": { "enum": ["red", "blue"] } }
                })),
        )
        .tool(
            ToolDefinition::server("send_email", move |input, _ctx| {
                let record = Arc::clone(&record);
                async move {
                    if let Ok(mut sent) = record.lock() {
                        sent.push(input.clone());
                    }
                    Ok::<_, ToolError>(json!({ "sent_to": input["to"] }))
                }
            })
            .description("Sends an email. A person approves it first, and may edit it.")
            .input_schema(email_schema())
            .require_approval(Approval::Editable),
        )
        .build()?;
    let runtime = Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(llm))
        .background_deadlines(false)
        .agent(desk)
        .agent(clerk)
        .build()?;
    Ok(People { runtime, sent })
}

/// An operator with [`OPERATOR_KEY`]; anyone else starts sessions and uses their tokens.
pub(crate) fn auth() -> Auth {
    Auth::hook(|headers| {
        let operator = headers
            .get("x-api-key")
            .is_some_and(|key| key.as_bytes() == OPERATOR_KEY.as_bytes());
        Box::pin(async move {
            Ok(if operator {
                Caller::new("operator").operator()
            } else {
                Caller::new("visitor")
            })
        })
    })
}

/// Where a screenshot named `name` goes, when `DORMANT_SCREENSHOTS` names a directory (the
/// docs' pictures are taken so: `DORMANT_SCREENSHOTS=docs/screenshots`); else none is taken.
pub(crate) fn screenshot_path(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("DORMANT_SCREENSHOTS").filter(|dir| !dir.is_empty())?;
    let dir = PathBuf::from(dir);
    // Relative to the workspace, not to the crate the test runs in.
    let dir = if dir.is_relative() {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(dir)
    } else {
        dir
    };
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir.join(format!("{name}.png")))
}
