//! A message sent while calls still wait abandons them: the page says how many wait and lets
//! the person cancel or send anyway, and then each card says what became of its call, in the
//! tab that sent the message and in another tab of the same conversation.

use serde_json::json;

use crate::common::binary::Binary;
use crate::setup;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_waiting_calls_is_confirmed_first_and_their_cards_say_they_were_abandoned(
) -> anyhow::Result<()> {
    let Some(opened) = setup::browser().await? else {
        return Ok(());
    };
    let browser = &opened.browser;
    let server = Binary::start(&opened.dir.path().join("store"), "127.0.0.1:0", &[])?;
    let page = format!("{}/", server.base);
    let a = browser.window().await?;
    browser.goto(&page).await?;
    browser
        .type_into("#message", "research weather in Porto")
        .await?;
    browser.click("#send").await?;
    let ask = r#"form[data-session-id$="-sub-research-1"][data-tool-call-id="ask_user-1"]"#;
    browser.wait_for_text(ask, "What title").await?;
    // B: a second tab of the same conversation.
    let b = browser.new_window().await?;
    browser.switch_to(&b).await?;
    browser.goto(&page).await?;
    browser.wait_for_text(ask, "What title").await?;
    browser.switch_to(&a).await?;

    // A new message while the sub-agent's call waits: the page asks first. Cancelled, nothing
    // is sent and the card still waits.
    let confirm = "#confirm:not([hidden])";
    browser.type_into("#message", "echo hello").await?;
    browser.click("#send").await?;
    browser
        .wait_for_text(confirm, "1 call still waits for you")
        .await?;
    browser.click("#keep").await?;
    browser.wait_for_text("#status", "not sent").await?;
    let typed = browser
        .script(
            "return [document.querySelector('#message').value, \
             document.querySelector('#confirm').hidden, \
             document.querySelectorAll('form.card:not(.done)').length];",
            json!([]),
        )
        .await?;
    anyhow::ensure!(typed == json!(["echo hello", true, 1]), "{typed}");

    // Sent anyway: the card says the message abandoned it, and the log shows the result the
    // runtime recorded for the sub-agent's call.
    browser.click("#send").await?;
    browser.wait_for(confirm).await?;
    browser.click("#send-anyway").await?;
    browser
        .wait_for_text(ask, "abandoned by your new message")
        .await?;
    browser
        .wait_for_text("#log", "← research: error: sub_agent_abandoned")
        .await?;
    browser.wait_for_text("#log", "you: echo hello").await?;
    browser.wait_for_text("#log", "run completed").await?;
    // B did not send it, but says what happened too.
    browser.switch_to(&b).await?;
    browser
        .wait_for_text(ask, "abandoned by a new message")
        .await?;
    browser.wait_for_text("#log", "you: echo hello").await?;

    // The same over the root's own call, from B this time.
    browser.type_into("#message", "weather in Faro").await?;
    browser.click("#send").await?;
    let ask = r#"form[data-tool-call-id="ask_user-3"]"#;
    browser.wait_for_text(ask, "What title").await?;
    browser.switch_to(&a).await?;
    browser.wait_for_text(ask, "What title").await?;
    browser.switch_to(&b).await?;
    browser.type_into("#message", "echo bye").await?;
    browser.click("#send").await?;
    browser
        .wait_for_text(confirm, "1 call still waits for you")
        .await?;
    browser.click("#send-anyway").await?;
    browser
        .wait_for_text(ask, "abandoned by your new message")
        .await?;
    browser
        .wait_for_text("#log", "← ask_user: error: client_tool_abandoned")
        .await?;
    browser.wait_for_text("#log", "you: echo bye").await?;
    browser.switch_to(&a).await?;
    browser
        .wait_for_text(ask, "abandoned by a new message")
        .await?;
    opened.close().await?;
    drop(server);
    Ok(())
}
