//! A tool that asks a person while it runs (`ToolContext::ask`, what an MCP server's
//! elicitation becomes), answered in the page: the inbox shows its question as the card's
//! title with a form from the schema it asked for; the answer goes to the tool, which runs
//! again with it, and the run completes.

use std::sync::{Arc, Mutex};

use dormant::definition::{InputAnswer, InputRequest};
use dormant::{
    AgentDefinition, ModelReply, Runtime, ScriptedLlm, SessionId, SledStore, Status, ToolCall,
    ToolDefinition, ToolError,
};
use dormant_server::ServerConfig;
use serde_json::{json, Value};

use crate::browser::people::{self, OPERATOR_KEY};
use crate::setup;

/// Agent `airline`: `book` asks which seat, then books the one it is told.
fn runtime(answers: &Arc<Mutex<Vec<InputAnswer>>>) -> anyhow::Result<Runtime> {
    let seen = Arc::clone(answers);
    let book = ToolDefinition::server("book", move |_input: Value, ctx| {
        let seen = Arc::clone(&seen);
        async move {
            let Some(InputAnswer::Accepted { content }) = ctx.answers().first().cloned() else {
                let question = InputRequest::new("Which seat would you like?").schema(json!({
                    "type": "object",
                    "required": ["seat"],
                    "properties": { "seat": { "type": "string" } }
                }));
                return Err(ctx.ask(question));
            };
            if let Ok(mut seen) = seen.lock() {
                seen.push(InputAnswer::Accepted {
                    content: content.clone(),
                });
            }
            Ok::<_, ToolError>(json!({ "booked": content["seat"] }))
        }
    })
    .description("Books a seat.");
    let airline = AgentDefinition::builder("airline").tool(book).build()?;
    let llm = ScriptedLlm::new().script(
        "airline",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new(
                "b1",
                "book",
                json!({ "flight": "LH1" }),
            )]),
            ModelReply::text("booked"),
        ],
    );
    Ok(Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(llm))
        .background_deadlines(false)
        .agent(airline)
        .build()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_answers_a_tools_question_from_the_inbox() -> anyhow::Result<()> {
    let Some(opened) = setup::browser().await? else {
        return Ok(());
    };
    let browser = &opened.browser;
    let answers = Arc::new(Mutex::new(Vec::new()));
    let runtime = runtime(&answers)?;
    let id: SessionId = "flight".parse()?;
    let waiting = runtime.execute_on(&id, "airline", "book me a seat").await?;
    anyhow::ensure!(waiting.status == Status::SuspendedClientTool, "{waiting:?}");
    let server =
        crate::common::serve(runtime.clone(), people::auth(), ServerConfig::default()).await?;

    browser.goto(&server.url("/#inbox")).await?;
    browser.type_into("#operator-key", OPERATOR_KEY).await?;
    browser.click("#use-key").await?;
    browser
        .wait_for_text("#inbox-status", "1 call waits")
        .await?;
    let card = r#"li.inbox-item[data-session-id="flight"] form[data-kind="input"]"#;
    browser
        .wait_for_text(card, "Which seat would you like?")
        .await?;
    // Sent empty, the form says what is missing and nothing goes to the server.
    browser
        .click(&format!(r#"{card} button[data-action="submit"]"#))
        .await?;
    browser.wait_for_text(card, "marked field").await?;
    browser
        .type_into(&format!(r#"{card} input[name="seat"]"#), "12A")
        .await?;
    browser
        .click(&format!(r#"{card} button[data-action="submit"]"#))
        .await?;
    browser
        .wait_for_text("#inbox-status", "Answered: book of session flight")
        .await?;
    runtime.wait_tree_settled(&id).await;
    anyhow::ensure!(runtime.status(&id).await? == Status::Completed);
    let seen = answers
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    anyhow::ensure!(
        seen == vec![InputAnswer::Accepted {
            content: json!({ "seat": "12A" })
        }],
        "{seen:?}"
    );
    opened.close().await?;
    server.stop().await?.shutdown().await?;
    Ok(())
}
