//! An approval handed to another device: the inbox's approval card makes a link (a signed
//! approval token); the link opens a page that shows only that approval and decides it with
//! no other credential, once.

use dormant::types::Answer;
use dormant::Status;
use dormant_server::ServerConfig;
use serde_json::json;

use crate::browser::people::{self, OPERATOR_KEY};
use crate::setup;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_is_decided_on_another_device_through_its_link() -> anyhow::Result<()> {
    let Some(opened) = setup::browser().await? else {
        return Ok(());
    };
    let browser = &opened.browser;
    let people = people::runtime()?;
    let runtime = people.runtime.clone();
    let clerk = runtime.execute("clerk", "write to Ana").await?;
    anyhow::ensure!(clerk.status == Status::SuspendedClientTool);
    let server = crate::common::serve(
        runtime.clone(),
        people::auth(),
        ServerConfig::default().page_agent("clerk"),
    )
    .await?;

    // The operator's inbox: a link for the approval.
    browser.goto(&server.url("/#inbox")).await?;
    browser.type_into("#operator-key", OPERATOR_KEY).await?;
    browser.click("#use-key").await?;
    let email = r#"form[data-kind="approval"][data-tool="send_email"]"#;
    let device_link = format!(r#"{email} button[data-action="device-link"]"#);
    // The inbox renders once its first page has loaded: wait for the button before the click.
    browser.wait_for(&device_link).await?;
    browser.click(&device_link).await?;
    browser
        .wait_for_text(email, "Anyone with this link can approve or deny this call")
        .await?;
    let link = browser
        .script(
            &format!("return document.querySelector('{email} input.device-link').value;"),
            json!([]),
        )
        .await?;
    let link = link.as_str().unwrap_or_default().to_string();
    anyhow::ensure!(link.contains("#approval=dat1."), "{link}");

    // The other device: a fresh window with nothing but the link (no key in its storage).
    let device = browser.new_window().await?;
    browser.switch_to(&device).await?;
    browser.goto(&link).await?;
    browser
        .wait_for_text("#device-view", "An approval for you")
        .await?;
    let card = r#"#device-view form[data-kind="approval"]"#;
    browser.wait_for_text(card, "Approve send_email?").await?;
    browser.wait_for_text(card, "ana@example.com").await?;
    browser
        .click(&format!(r#"{card} button[data-action="approve"]"#))
        .await?;
    browser
        .wait_for_text(card, "Approved. You may close this page.")
        .await?;
    let pending = runtime.pending(&clerk.session_id).await?;
    let decided = pending
        .iter()
        .find(|call| call.tool_name == "send_email")
        .and_then(|call| call.answer.clone());
    anyhow::ensure!(decided == Some(Answer::Approved), "{pending:?}");

    // The link decides once.
    browser.goto("about:blank").await?;
    browser.goto(&link).await?;
    browser
        .wait_for_text("#device-status", "already decided")
        .await?;
    opened.close().await?;
    server.stop().await?.shutdown().await?;
    Ok(())
}
