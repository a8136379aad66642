//! The demo agent the binary serves with `--demo`: a keyword-driven model, so that it runs
//! on a fresh machine with no API key. Each message runs the same little plan:
//!
//! 1. `lookup_weather` (a server tool) for the city named after "in" (default Lisbon);
//! 2. `ask_user` (a client tool the browser runs): "What title should the post have?";
//! 3. `publish` (a server tool behind an approval gate, not safe to retry) with that title;
//! 4. a closing text that says what happened.
//!
//! A message that starts with `echo ` is answered with its text and nothing else. A message
//! that starts with `research ` hands the rest to a local sub-agent (the `research` tool: a
//! child session of the demo agent itself, which runs the plan above, so it asks the person
//! and waits for an approval; both are answered at the root) and says what it answered. With a
//! remote server configured ([`configure_delegating`]), a message that starts with
//! `delegate ` hands the rest to the demo agent of that server (a remote sub-agent, whose
//! client tool and approval are answered here, at this side's root), and says what it
//! answered.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use dormant::{Runtime, Status};
//!
//! let runtime = dormant_server::demo::configure(Runtime::builder())?.build()?;
//! let run = runtime.execute(dormant_server::demo::AGENT, "weather in Porto").await?;
//! assert_eq!(run.status, Status::SuspendedClientTool);
//! assert_eq!(runtime.pending(&run.session_id).await?[0].tool_name, "ask_user");
//!
//! // The same plan in a sub-agent: the root waits on it.
//! let run = runtime.execute(dormant_server::demo::AGENT, "research weather in Porto").await?;
//! assert_eq!(run.status, Status::SuspendedAwaitingChildren);
//! # Ok(()) }
//! ```

use std::sync::Arc;

use dormant::definition::DefinitionError;
use dormant::llm::{BoxFuture, LlmAdapter, LlmError, ModelRequest};
use dormant::types::ToolOutcome;
use dormant::{
    AgentDefinition, Approval, Message, ModelReply, RuntimeBuilder, ToolCall, ToolDefinition,
    ToolError,
};
use serde_json::{json, Value};

/// The demo agent's name.
pub const AGENT: &str = "demo";

/// Adds the demo agent and its model to a runtime builder.
///
/// # Errors
/// Never in practice: the definition is fixed and valid.
pub fn configure(builder: RuntimeBuilder) -> Result<RuntimeBuilder, DefinitionError> {
    Ok(builder.llm(Arc::new(DemoModel)).agent(agent()?))
}

/// Adds the demo agent with a `delegate` tool: a remote sub-agent running the demo agent of
/// the dormant server at `endpoint` (the runtime needs a remote transport:
/// [`HttpRemoteAgents`](crate::HttpRemoteAgents)).
///
/// # Errors
/// Never in practice: the definition is fixed and valid.
pub fn configure_delegating(
    builder: RuntimeBuilder,
    endpoint: &str,
) -> Result<RuntimeBuilder, DefinitionError> {
    let agent = tools(AgentDefinition::builder(AGENT))
        .tool(
            ToolDefinition::remote_sub_agent(DELEGATE, endpoint, AGENT)
                .description("Hands a task to the demo agent of another server."),
        )
        .build()?;
    Ok(builder.llm(Arc::new(DemoModel)).agent(agent))
}

/// The remote sub-agent tool of [`configure_delegating`].
pub const DELEGATE: &str = "delegate";

/// The local sub-agent tool: a child session of the demo agent.
pub const RESEARCH: &str = "research";

/// The demo agent: its three tools and the `research` sub-agent.
///
/// # Errors
/// Never in practice: the definition is fixed and valid.
pub fn agent() -> Result<AgentDefinition, DefinitionError> {
    tools(AgentDefinition::builder(AGENT)).build()
}

fn tools(builder: dormant::definition::AgentBuilder) -> dormant::definition::AgentBuilder {
    builder
        .system_prompt("You look up the weather, ask the user for a title, and publish a post.")
        .tool(
            ToolDefinition::server("lookup_weather", |input, _ctx| async move {
                let city = input["city"].as_str().unwrap_or("Lisbon").to_string();
                Ok::<_, ToolError>(
                    json!({ "city": city, "forecast": "sunny", "temperature_c": 21 }),
                )
            })
            .description("Looks up today's weather in a city.")
            .input_schema(json!({
                "type": "object",
                "required": ["city"],
                "properties": { "city": { "type": "string" } }
            }))
            .safe_to_retry(true),
        )
        .tool(
            ToolDefinition::client("ask_user")
                .description("Asks the person at the browser a question.")
                .input_schema(json!({
                    "type": "object",
                    "required": ["question"],
                    "properties": { "question": { "type": "string" } }
                }))
                .output_schema(json!({
                    "type": "object",
                    "required": ["answer"],
                    "properties": { "answer": { "type": "string", "minLength": 1 } }
                })),
        )
        .tool(
            ToolDefinition::server("publish", |input, _ctx| async move {
                let title = input["title"].as_str().unwrap_or("Untitled").to_string();
                Ok::<_, ToolError>(json!({ "published": true, "title": title }))
            })
            .description("Publishes a post. A person must approve it first.")
            .input_schema(json!({
                "type": "object",
                "required": ["title", "body"],
                "properties": { "title": { "type": "string" }, "body": { "type": "string" } }
            }))
            .require_approval(Approval::Always),
        )
        .tool(
            ToolDefinition::sub_agent(RESEARCH, AGENT)
                .description("Hands a task to a sub-agent (the demo agent) on this server."),
        )
}

/// The demo's model: reads the conversation since the last user message and takes the next
/// step of the plan.
#[derive(Debug, Clone, Copy, Default)]
pub struct DemoModel;

impl LlmAdapter for DemoModel {
    fn complete(&self, request: ModelRequest) -> BoxFuture<'static, Result<ModelReply, LlmError>> {
        let reply = next_step(&request.messages);
        // Streamed word by word, as a real model's reply: the page shows it growing.
        if let Some(text) = &reply.text {
            for (index, word) in text.split(' ').enumerate() {
                request.deltas.text(if index == 0 {
                    word.to_string()
                } else {
                    format!(" {word}")
                });
            }
        }
        Box::pin(async move { Ok(reply) })
    }
}

fn next_step(messages: &[Message]) -> ModelReply {
    let turn = messages
        .iter()
        .filter(|message| matches!(message, Message::User { .. }))
        .count();
    let start = messages
        .iter()
        .rposition(|message| matches!(message, Message::User { .. }))
        .unwrap_or(0);
    let text = match messages.get(start) {
        Some(Message::User { text }) => text.as_str(),
        _ => "",
    };
    if let Some(echo) = text.strip_prefix("echo ") {
        return ModelReply::text(echo);
    }
    let result_of = |tool: &str| {
        messages[start..].iter().find_map(|message| match message {
            Message::Tool {
                tool_name, outcome, ..
            } if tool_name == tool => Some(outcome.clone()),
            _ => None,
        })
    };
    let call = |tool: &str, input: Value| {
        ModelReply::tool_calls(vec![ToolCall::new(format!("{tool}-{turn}"), tool, input)])
    };
    for (prefix, tool, who) in [
        ("delegate ", DELEGATE, "The remote agent"),
        ("research ", RESEARCH, "The sub-agent"),
    ] {
        let Some(task) = text.strip_prefix(prefix) else {
            continue;
        };
        return match result_of(tool) {
            None => call(tool, json!({ "message": task })),
            Some(ToolOutcome::Result(answer)) => ModelReply::text(format!(
                "{who} answered: {}",
                answer.as_str().unwrap_or_default()
            )),
            Some(ToolOutcome::Error(error)) => ModelReply::text(format!("{who} failed: {error}")),
        };
    }
    let Some(weather) = result_of("lookup_weather") else {
        return call("lookup_weather", json!({ "city": city(text) }));
    };
    let forecast = match &weather {
        ToolOutcome::Result(value) => format!(
            "{} in {}, {} °C",
            value["forecast"].as_str().unwrap_or("unknown"),
            value["city"].as_str().unwrap_or("?"),
            value["temperature_c"]
        ),
        ToolOutcome::Error(error) => format!("no forecast ({error})"),
    };
    let title = match result_of("ask_user") {
        None => {
            return call(
                "ask_user",
                json!({ "question": format!("Today: {forecast}. What title should the post have?") }),
            )
        }
        Some(ToolOutcome::Error(error)) => {
            return ModelReply::text(format!("No title ({error}), so nothing was published."))
        }
        Some(ToolOutcome::Result(answer)) => {
            answer["answer"].as_str().unwrap_or("Untitled").to_string()
        }
    };
    match result_of("publish") {
        None => call(
            "publish",
            json!({ "title": title, "body": format!("Today: {forecast}.") }),
        ),
        Some(ToolOutcome::Result(_)) => {
            ModelReply::text(format!("Published \"{title}\" ({forecast})."))
        }
        Some(ToolOutcome::Error(error)) => ModelReply::text(format!("Not published: {error}")),
    }
}

/// The city after " in " in the message, else Lisbon.
fn city(text: &str) -> String {
    text.rsplit_once(" in ")
        .map(|(_, rest)| rest.trim().trim_end_matches(['.', '?', '!']).to_string())
        .filter(|city| !city.is_empty())
        .unwrap_or_else(|| "Lisbon".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_city_is_read_after_in() {
        assert_eq!(city("what is the weather in Porto?"), "Porto");
        assert_eq!(city("hello"), "Lisbon");
    }
}
