//! A custom client tool with a nested output schema (an object in an object, an array, an
//! enum, a boolean, a required integer) answered through the form the page generates from it:
//! every field labelled, help from the descriptions, messages beside the fields before anything
//! is sent, and the result the tool gets exactly what was filled in.

use dormant::types::ToolOutcome;
use dormant::Message;
use dormant_server::ServerConfig;
use serde_json::json;

use crate::browser::people;
use crate::common::serve;
use crate::setup;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_fills_a_nested_form_generated_from_the_tools_schema() -> anyhow::Result<()> {
    let Some(opened) = setup::browser().await? else {
        return Ok(());
    };
    let browser = &opened.browser;
    let people = people::runtime()?;
    let server = serve(
        people.runtime.clone(),
        people::auth(),
        ServerConfig::default().page_agent("desk"),
    )
    .await?;
    browser.goto(&server.url("/")).await?;
    browser.type_into("#message", "boxes for the move").await?;
    browser.click("#send").await?;
    let card = r#"form[data-tool-call-id="order-1"]"#;
    let field = |path: &str| format!(r#"{card} .field[data-path="{path}"]"#);
    browser
        .wait_for(&format!(r#"{card} .schema-form[data-generated="yes"]"#))
        .await?;
    // The call's input, nested values readable.
    browser.wait_for_text(card, "moving boxes").await?;
    browser.wait_for_text(card, "kitchen").await?;
    // Every control has a label; groups have legends; required fields are marked.
    let unlabelled = browser
        .script(
            "return [...arguments[0] ? document.querySelectorAll(arguments[0] + ' input, ' + \
             arguments[0] + ' select, ' + arguments[0] + ' textarea') : []] \
             .filter((e) => !e.labels.length && !e.getAttribute('aria-label')).length;",
            json!([card]),
        )
        .await?;
    anyhow::ensure!(
        unlabelled == json!(0),
        "{unlabelled} controls without a label"
    );
    browser
        .wait_for_text(&format!("{card} fieldset legend"), "Shipping *")
        .await?;
    browser
        .wait_for_text(&field("/quantity"), "quantity *")
        .await?;
    // The description is the field's help, read with it.
    let help = browser
        .script(
            "const input = document.querySelector(arguments[0] + ' input'); \
             return input.getAttribute('aria-describedby').split(' ') \
             .map((id) => document.getElementById(id).textContent).join('|');",
            json!([field("/quantity")]),
        )
        .await?;
    anyhow::ensure!(
        help.as_str()
            .is_some_and(|text| text.starts_with("How many boxes.")),
        "{help}"
    );

    // Sent empty: each missing field says so, the first is focused, nothing is sent.
    browser
        .click(&format!(r#"{card} button[data-action="submit"]"#))
        .await?;
    browser
        .wait_for_text(&field("/quantity"), "This field is required.")
        .await?;
    browser
        .wait_for_text(
            &field("/shipping/speed"),
            "Choose one of: standard, express.",
        )
        .await?;
    browser
        .wait_for_text(card, "nothing went to the server")
        .await?;
    let focused = browser
        .script("return document.activeElement.name;", json!([]))
        .await?;
    anyhow::ensure!(focused == json!("quantity"), "{focused}");
    // Not a number.
    browser
        .type_into(&format!("{} input", field("/quantity")), "two")
        .await?;
    browser
        .click(&format!(r#"{card} button[data-action="submit"]"#))
        .await?;
    browser
        .wait_for_text(&field("/quantity"), "Enter a whole number, like 12.")
        .await?;

    // Filled in: a number, a choice, a nested object, a box ticked, an item added.
    browser
        .clear(&format!("{} input", field("/quantity")))
        .await?;
    browser
        .type_into(&format!("{} input", field("/quantity")), "2")
        .await?;
    browser
        .click(&format!(
            "{} select option:nth-child(3)",
            field("/shipping/speed")
        ))
        .await?;
    browser
        .type_into(
            &format!("{} input", field("/shipping/address/city")),
            "Porto",
        )
        .await?;
    browser.click(&format!("{} input", field("/gift"))).await?;
    browser
        .click(&format!(
            r#"{card} [data-path="/notes"] button[data-action="add-item"]"#
        ))
        .await?;
    browser
        .type_into(&format!("{} input", field("/notes/0")), "fragile")
        .await?;
    browser
        .click(&format!(r#"{card} button[data-action="submit"]"#))
        .await?;
    browser.wait_for_text(card, "sent").await?;
    browser.wait_for_text("#log", "Ordered.").await?;
    browser.wait_for_text("#log", "run completed").await?;

    let session = browser
        .script(
            "return JSON.parse(localStorage.getItem('dormant-page')).session_id;",
            json!([]),
        )
        .await?;
    let session = session.as_str().unwrap_or_default().parse()?;
    let result = people
        .runtime
        .messages(&session)
        .await?
        .into_iter()
        .find_map(|message| match message {
            Message::Tool {
                outcome: ToolOutcome::Result(value),
                ..
            } => Some(value),
            _ => None,
        });
    let expected = json!({
        "quantity": 2,
        "shipping": { "speed": "express", "address": { "city": "Porto" } },
        "gift": true,
        "notes": ["fragile"]
    });
    anyhow::ensure!(result.as_ref() == Some(&expected), "{result:?}");
    opened.close().await?;
    server.stop().await?.shutdown().await?;
    Ok(())
}
