//! Approvals in the page: the tool's description and its arguments as a table; an edit from
//! the tool's input schema, refused by the server beside its field first (a pattern the form
//! does not check), then approved, and the tool ran with the edit; and a decision for a request
//! that is no longer the one waiting (its binding differs), refused with a sentence and shown
//! again as it is now.

use dormant::SessionId;
use dormant_server::ServerConfig;
use serde_json::json;

use crate::browser::people::{self, People};
use crate::common::{serve, TestServer};
use crate::setup;
use crate::webdriver::Browser;

const APPROVAL: &str = r#"form[data-kind="approval"][data-tool-call-id="email-1"]"#;
const PICK: &str = r#"form[data-tool-call-id="pick-1"]"#;

/// The clerk's page, a message sent, both cards shown.
async fn clerk(browser: &Browser) -> anyhow::Result<(People, TestServer, SessionId)> {
    let people = people::runtime()?;
    let server = serve(
        people.runtime.clone(),
        people::auth(),
        ServerConfig::default()
            .page_agent("clerk")
            .page_title("Clerk")
            .page_placeholder("Ask the clerk…"),
    )
    .await?;
    browser.goto(&server.url("/")).await?;
    browser.type_into("#message", "write to Ana").await?;
    browser.click("#send").await?;
    browser.wait_for(APPROVAL).await?;
    browser.wait_for(PICK).await?;
    let session = browser
        .script(
            "return JSON.parse(localStorage.getItem('dormant-page')).session_id;",
            json!([]),
        )
        .await?;
    let session = session.as_str().unwrap_or_default().parse()?;
    Ok((people, server, session))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_edits_an_approval_and_the_tool_runs_with_the_edit() -> anyhow::Result<()> {
    let Some(opened) = setup::browser().await? else {
        return Ok(());
    };
    let browser = &opened.browser;
    let (people, server, _) = clerk(browser).await?;
    browser
        .wait_for_text(APPROVAL, "Sends an email. A person approves it first")
        .await?;
    let table = format!("{APPROVAL} table.args");
    browser.wait_for_text(&table, "ana@example.com").await?;
    browser.wait_for_text(&table, "team@example.com").await?;
    if let Some(path) = people::screenshot_path("conversation") {
        browser.screenshot(&path).await?;
    }

    // The question first (a choice), then the edit.
    browser
        .click(&format!("{PICK} select option:nth-child(2)"))
        .await?;
    browser
        .click(&format!(r#"{PICK} button[data-action="submit"]"#))
        .await?;
    browser.wait_for_text(PICK, "sent").await?;
    browser
        .click(&format!(r#"{APPROVAL} button[data-action="edit"]"#))
        .await?;
    let to = format!(r#"{APPROVAL} .field[data-path="/to"]"#);
    browser.wait_for(&format!("{to} input")).await?;
    let prefilled = browser
        .script(
            "return document.querySelector(arguments[0]).value;",
            json!([format!("{to} input")]),
        )
        .await?;
    anyhow::ensure!(prefilled == json!("ana@example.com"), "{prefilled}");
    browser.clear(&format!("{to} input")).await?;
    browser.type_into(&format!("{to} input"), "bob").await?;
    browser
        .click(&format!(r#"{APPROVAL} button[data-action="approve"]"#))
        .await?;
    // The server's own check (the pattern): its message beside the field, the reason above.
    browser.wait_for_text(&to, "does not match").await?;
    browser
        .wait_for_text(APPROVAL, "Not accepted (invalid_result)")
        .await?;
    if let Some(path) = people::screenshot_path("approval-edit") {
        browser.screenshot(&path).await?;
    }
    browser.clear(&format!("{to} input")).await?;
    browser
        .type_into(&format!("{to} input"), "bob@example.com")
        .await?;
    browser
        .click(&format!(r#"{APPROVAL} button[data-action="approve"]"#))
        .await?;
    browser.wait_for_text(APPROVAL, "sent").await?;
    browser
        .wait_for_text("#log", r#"← send_email: {"sent_to":"bob@example.com"}"#)
        .await?;
    browser.wait_for_text("#log", "run completed").await?;
    let sent = people
        .sent
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    anyhow::ensure!(
        sent == [
            json!({ "to": "bob@example.com", "subject": "Hello", "cc": ["team@example.com"] })
        ],
        "{sent:?}"
    );
    opened.close().await?;
    server.stop().await?.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_for_a_changed_request_is_refused_with_a_sentence() -> anyhow::Result<()> {
    let Some(opened) = setup::browser().await? else {
        return Ok(());
    };
    let browser = &opened.browser;
    let (people, server, session) = clerk(browser).await?;
    // The card names another request than the one waiting (as a card shown before the call
    // changed would).
    let real = browser
        .script(
            "const card = document.querySelector(arguments[0]); const real = card.dataset.binding; \
             card.dataset.binding = '0'.repeat(64); return real;",
            json!([APPROVAL]),
        )
        .await?;
    anyhow::ensure!(real.as_str().is_some_and(|text| text.len() == 64), "{real}");
    browser
        .click(&format!(r#"{APPROVAL} button[data-action="approve"]"#))
        .await?;
    browser
        .wait_for_text(
            APPROVAL,
            "This request changed since you saw it (its input or its tool changed), so your decision was not applied.",
        )
        .await?;
    // Refused, so the call still waits; its card is shown again with the request's binding.
    let waiting = people.runtime.pending(&session).await?;
    anyhow::ensure!(
        waiting.iter().all(|call| call.answer.is_none()),
        "{waiting:?}"
    );
    let shown = browser
        .script(
            "return document.querySelector(arguments[0]).dataset.binding;",
            json!([APPROVAL]),
        )
        .await?;
    anyhow::ensure!(shown == real, "{shown} != {real}");
    browser
        .click(&format!(r#"{APPROVAL} button[data-action="approve"]"#))
        .await?;
    browser.wait_for_text(APPROVAL, "sent").await?;
    opened.close().await?;
    server.stop().await?.shutdown().await?;
    Ok(())
}
