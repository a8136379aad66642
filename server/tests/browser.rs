//! The page in a real browser (Debian's headless Chromium through chromedriver): a person
//! sends a message, answers the client tool in the page, sees the approval card; the server
//! restarts in the middle; after a reload the card is back; another tab answers first, and the
//! page says so; the run completes with both results in the log.
//!
//! Without chromium and chromedriver the test says it was skipped and how to install them,
//! and passes, unless `DORMANT_REQUIRE_BROWSER` is set (CI sets it).

mod common;
#[path = "browser/webdriver.rs"]
mod webdriver;

use std::path::Path;

use anyhow::Context;
use common::answer;
use common::binary::Binary;
use serde_json::json;
use webdriver::{Browser, Driver};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_answers_a_client_tool_and_an_approval_across_a_restart() -> anyhow::Result<()> {
    if !Path::new(CHROMIUM).exists() || !Path::new(CHROMEDRIVER).exists() {
        eprintln!(
            "SKIPPED: the browser test needs {CHROMIUM} and {CHROMEDRIVER}: apt-get install chromium chromium-driver"
        );
        anyhow::ensure!(
            std::env::var_os("DORMANT_REQUIRE_BROWSER").is_none(),
            "DORMANT_REQUIRE_BROWSER is set and Chromium is missing"
        );
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let server = Binary::start(&store, "127.0.0.1:0", &[])?;
    let listen = format!("127.0.0.1:{}", server.port()?);
    let page = format!("{}/", server.base);
    let driver = Driver::start(CHROMEDRIVER).await?;
    let browser = Browser::open(&driver, CHROMIUM, &dir.path().join("profile")).await?;

    browser.goto(&page).await?;
    browser.type_into("#message", "weather in Porto").await?;
    browser.click("#send").await?;
    // The client tool appears as a form; the person answers it in the page.
    let ask = r#"form[data-tool="ask_user"]"#;
    browser
        .wait_for(&format!("{ask} input[name=answer]"))
        .await?;
    browser.wait_for_text("#log", "→ lookup_weather").await?;
    browser
        .type_into(&format!("{ask} input[name=answer]"), "Porto in the sun")
        .await?;
    browser
        .click(&format!(r#"{ask} button[data-action="submit"]"#))
        .await?;
    // The page resumes by itself; the run stops at the approval gate.
    let approval = r#"form[data-kind="approval"][data-tool="publish"]"#;
    browser.wait_for(approval).await?;
    browser.wait_for_text(approval, "Porto in the sun").await?;

    // The server restarts in the middle; the page is reloaded and shows the card again.
    server.terminate()?;
    let server = Binary::start(&store, &listen, &[])?;
    browser.refresh().await?;
    browser.wait_for(approval).await?;
    browser
        .wait_for_text("#log", "← ask_user: {\"answer\":\"Porto in the sun\"}")
        .await?;

    // Another tab approves first (its answer is the page's own session and token).
    let saved = browser
        .script(
            "return JSON.parse(localStorage.getItem('dormant-page'));",
            json!([]),
        )
        .await?;
    let (id, token) = (
        saved["id"].as_str().context("no session saved")?,
        saved["token"].as_str().context("no token saved")?,
    );
    let status = reqwest::Client::new()
        .get(format!("{}/status?session_id={id}", server.base))
        .bearer_auth(token)
        .send()
        .await?;
    let (_, status) = answer(status).await?;
    let gate = common::pending(&status, "approval")?;
    let envelope = json!({ "kind": "approval-response", "session_id": id,
        "tool_call_id": gate["tool_call_id"], "approval_id": gate["approval_id"], "approved": true });
    let other_tab = reqwest::Client::new()
        .post(format!("{}/submit-tool-result", server.base))
        .bearer_auth(token)
        .json(&envelope)
        .send()
        .await?;
    assert_eq!(other_tab.status(), reqwest::StatusCode::OK);

    // This tab's approval is the second: the page says so, and the run goes on to its end.
    browser
        .click(&format!(r#"{approval} button[data-action="approve"]"#))
        .await?;
    browser.wait_for_text(approval, "already answered").await?;
    browser
        .wait_for_text("#log", "Published \"Porto in the sun\"")
        .await?;
    browser.wait_for_text("#log", "run completed").await?;
    let log = browser.text("#log").await?;
    assert!(log.contains("you: weather in Porto"), "{log}");
    assert!(log.contains("✓ approved publish"), "{log}");
    browser.close().await?;
    drop(server);
    Ok(())
}
