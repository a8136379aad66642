//! Steps and forks in the page: the conversation's steps listed, a fork from the step where
//! the run waits (the fork's own session, its history shown, its calls waiting again and
//! answered there), and a fork with the first message edited.

use crate::common::binary::Binary;
use crate::{plan, setup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_forks_a_conversation_from_its_steps() -> anyhow::Result<()> {
    let Some(opened) = setup::browser().await? else {
        return Ok(());
    };
    let browser = &opened.browser;
    let server = Binary::start(&opened.dir.path().join("store"), "127.0.0.1:0", &[])?;
    browser.goto(&format!("{}/", server.base)).await?;
    browser.type_into("#message", "weather in Porto").await?;
    browser.click("#send").await?;
    let ask = r#"form[data-tool-call-id="ask_user-1"]"#;
    browser.wait_for_text(ask, "What title").await?;
    let source = browser.text("#session").await?;

    // The steps, up to the one where the run waits for the person.
    browser.click("#history summary").await?;
    browser
        .wait_for_text("#steps li:last-child", "suspended client tool")
        .await?;
    browser
        .wait_for_text("#steps li:first-child", "you: weather in Porto")
        .await?;

    // A fork from there: another session, the same history, the call waiting again there.
    browser.click("#steps li:last-child button").await?;
    browser.wait_for_text("#status", "forked from step").await?;
    let fork = browser.text("#session").await?;
    anyhow::ensure!(fork != source, "still {source}");
    browser
        .wait_for_text("#log", "you: weather in Porto")
        .await?;
    plan::answer_and_approve(browser, "", 1, "Porto forked").await?;
    browser
        .wait_for_text("#log", "Published \"Porto forked\"")
        .await?;
    browser.wait_for_text("#log", "run completed").await?;

    // A fork of the first step with the message edited: the run starts over with it.
    browser
        .type_into("#fork-message", "weather in Faro")
        .await?;
    browser.click("#steps li:first-child button").await?;
    browser.wait_for_text("#status", "forked from step").await?;
    browser
        .wait_for_text("#log", "you: weather in Faro")
        .await?;
    let edited = browser.text("#session").await?;
    anyhow::ensure!(edited != fork && edited != source, "{edited}");
    browser.wait_for_text(ask, "What title").await?;
    opened.close().await?;
    drop(server);
    Ok(())
}
