//! The page in a real browser (Debian's headless Chromium through chromedriver). Here, in two
//! windows of one profile, as a person with two tabs open:
//!
//! 1. window A sends a message, answers the client tool in the form generated from its output
//!    schema (an empty answer first, refused beside the field before anything is sent), sees
//!    the approval card;
//!    window B opens the same conversation (from localStorage) and shows the card too;
//! 2. the server restarts (SIGTERM, then the same port and store); A is reloaded and shows the
//!    card again; B is not, and its stream reconnects by itself;
//! 3. A approves: the run completes with both results; B's card says it was answered
//!    elsewhere and B's log shows the end, live;
//! 4. B sends a second message (a new turn of the same session, with its token); another
//!    client answers the client tool first, A's submit is told "already answered" and A
//!    resumes the run; B denies the approval with a reason; both logs show it.
//!
//! And in `browser/`: a sub-agent's calls answered in the page, local and on a second server
//! process (`sub_agents.rs`); a message sent over calls that still wait (`abandon.rs`); the
//! page under a prefix of a daemon's router (`prefix.rs`); a conversation forked from its
//! steps (`forks.rs`); the inbox across three sessions of two agents, under a prefix, answered
//! in place and gone from a second window (`inbox.rs`); a custom client tool's nested form
//! generated from its schema (`forms.rs`); an approval edited then approved, and a decision
//! for a changed request refused with a sentence (`approvals.rs`); the agents these use
//! (`people.rs`). With `DORMANT_SCREENSHOTS=dir`, `inbox.rs` and `approvals.rs` write the
//! docs' pictures there.
//!
//! Without chromium and chromedriver each test says it was skipped and how to install them,
//! and passes, unless `DORMANT_REQUIRE_BROWSER` is set to anything but `0` (CI sets it to 1).

mod common;
// An inline module of the crate root finds its files in `browser/`, as `#[path]` would say:
// the tests there share `common` with this crate's other tests.
mod browser {
    mod abandon;
    mod approvals;
    mod device;
    mod forks;
    mod forms;
    mod inbox;
    pub(crate) mod people;
    pub(crate) mod plan;
    mod prefix;
    mod questions;
    mod reconcile;
    pub(crate) mod setup;
    mod sub_agents;
    pub(crate) mod webdriver;
}

use browser::{plan, setup, webdriver};

use anyhow::Context;
use common::answer;
use common::binary::Binary;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_answers_a_client_tool_and_an_approval_across_a_restart() -> anyhow::Result<()> {
    let Some(opened) = setup::browser().await? else {
        return Ok(());
    };
    let browser = &opened.browser;
    let store = opened.dir.path().join("store");
    let server = Binary::start(&store, "127.0.0.1:0", &[])?;
    // The restart binds this same port: the page's origin (and its localStorage) stays.
    let listen = format!("127.0.0.1:{}", server.port()?);
    let page = format!("{}/", server.base);
    let a = browser.window().await?;

    // 1. A: a message, the client tool answered in its form, the approval card.
    browser.goto(&page).await?;
    browser.type_into("#message", "weather in Porto").await?;
    browser.click("#send").await?;
    let ask = r#"form[data-tool-call-id="ask_user-1"]"#;
    browser
        .wait_for(&format!("{ask} input[name=answer]"))
        .await?;
    browser.wait_for_text(ask, "What title").await?;
    browser.wait_for_text("#log", "→ lookup_weather").await?;
    // An empty answer does not match the tool's output schema: the form generated from it
    // says so beside the field, before anything is sent, and lets the person try again.
    browser
        .click(&format!(r#"{ask} button[data-action="submit"]"#))
        .await?;
    browser
        .wait_for_text(&format!("{ask} .field-error"), "This field is required.")
        .await?;
    browser
        .wait_for_text(ask, "nothing went to the server")
        .await?;
    browser
        .type_into(&format!("{ask} input[name=answer]"), "Porto in the sun")
        .await?;
    browser
        .click(&format!(r#"{ask} button[data-action="submit"]"#))
        .await?;
    // The page resumes by itself; the run stops at the approval gate.
    let approval = r#"form[data-kind="approval"][data-tool-call-id="publish-1"]"#;
    browser.wait_for(approval).await?;
    browser.wait_for_text(approval, "Porto in the sun").await?;

    // B: the same page in a second window picks the conversation up from localStorage.
    let b = browser.new_window().await?;
    browser.switch_to(&b).await?;
    browser.goto(&page).await?;
    browser.wait_for(approval).await?;
    browser
        .wait_for_text("#log", "you: weather in Porto")
        .await?;

    // 2. The server restarts gracefully on the same port and store.
    let stopped = server.terminate()?;
    anyhow::ensure!(stopped.success(), "the server exited with {stopped}");
    let server = Binary::start(&store, &listen, &[])?;
    anyhow::ensure!(server.base == page.trim_end_matches('/'), "{}", server.base);

    // A is reloaded: the log is rebuilt from the first chunk, the card is back.
    browser.switch_to(&a).await?;
    browser.refresh().await?;
    browser.wait_for(approval).await?;
    browser
        .wait_for_text("#log", "← ask_user: {\"answer\":\"Porto in the sun\"}")
        .await?;
    browser
        .wait_for(r#"#connection[data-state="open"]"#)
        .await?;

    // 3. A approves; the run completes with both results.
    browser
        .click(&format!(r#"{approval} button[data-action="approve"]"#))
        .await?;
    browser
        .wait_for_text("#log", "Published \"Porto in the sun\"")
        .await?;
    browser.wait_for_text("#log", "run completed").await?;
    let log = browser.text("#log").await?;
    for shown in [
        "you: weather in Porto",
        "← ask_user: {\"answer\":\"Porto in the sun\"}",
        "✓ approved publish",
    ] {
        anyhow::ensure!(log.contains(shown), "A's log lacks {shown:?}:\n{log}");
    }

    // B was not reloaded: its stream came back by itself, and its card says why it is gone.
    browser.switch_to(&b).await?;
    browser
        .wait_for_text("#log", "Published \"Porto in the sun\"")
        .await?;
    browser
        .wait_for_text(approval, "already answered (maybe in another tab)")
        .await?;

    // 4. B sends a second message: a new turn of the same session.
    browser.type_into("#message", "weather in Faro").await?;
    browser.click("#send").await?;
    let ask = r#"form[data-tool-call-id="ask_user-2"]"#;
    browser.wait_for(ask).await?;
    browser.wait_for_text(ask, "sunny in Faro").await?;
    browser.switch_to(&a).await?;
    browser.wait_for(ask).await?;
    browser
        .wait_for_text("#log", "you: weather in Faro")
        .await?;

    // Another client (a tab since closed, say) answers first, without resuming.
    let saved = browser
        .script(
            "return JSON.parse(localStorage.getItem('dormant-page'));",
            json!([]),
        )
        .await?;
    let (id, token) = (
        saved["session_id"].as_str().context("no session saved")?,
        saved["token"].as_str().context("no token saved")?,
    );
    anyhow::ensure!(saved["lastSeq"].as_u64().is_some(), "no lastSeq: {saved}");
    let other = reqwest::Client::new()
        .post(format!("{}/submit-tool-result", server.base))
        .bearer_auth(token)
        .json(&json!({ "session_id": id, "tool_call_id": "ask_user-2",
            "result": { "answer": "Faro first" } }))
        .send()
        .await?;
    let (code, body) = answer(other).await?;
    anyhow::ensure!(code == reqwest::StatusCode::OK, "{code}: {body}");

    // A's answer comes second: the page says so, and resumes the run (nothing else waits).
    browser
        .type_into(&format!("{ask} input[name=answer]"), "Faro second")
        .await?;
    browser
        .click(&format!(r#"{ask} button[data-action="submit"]"#))
        .await?;
    browser
        .wait_for_text(ask, "already answered (maybe in another tab)")
        .await?;
    let approval = r#"form[data-kind="approval"][data-tool-call-id="publish-2"]"#;
    browser.wait_for_text(approval, "Faro first").await?;

    // B denies it, with a reason; both windows show the run's end.
    browser.switch_to(&b).await?;
    browser.wait_for(approval).await?;
    browser
        .type_into(&format!("{approval} input[name=reason]"), "not today")
        .await?;
    browser
        .click(&format!(r#"{approval} button[data-action="deny"]"#))
        .await?;
    browser
        .wait_for_text("#log", "✗ denied publish (not today)")
        .await?;
    browser.wait_for_text("#log", "Not published").await?;
    browser.switch_to(&a).await?;
    browser.wait_for_text("#log", "Not published").await?;
    browser
        .wait_for_text(approval, "already answered (maybe in another tab)")
        .await?;

    opened.close().await?;
    drop(server);
    Ok(())
}
