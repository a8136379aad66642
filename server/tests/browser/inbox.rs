//! The inbox view across three sessions of two agents, with the router under a prefix: no
//! operator credentials said plainly, then the key; filters; "Load more"; a call answered in
//! place leaves this window and a second one showing the inbox; an approval decided there lets
//! its session finish; a call's conversation opened from its item.

use dormant::Status;
use dormant_server::ServerConfig;
use serde_json::json;

use crate::browser::people::{self, OPERATOR_KEY};
use crate::common::nested::serve_nested;
use crate::setup;
use crate::webdriver::Browser;

async fn use_key(browser: &Browser) -> anyhow::Result<()> {
    browser.type_into("#operator-key", OPERATOR_KEY).await?;
    browser.click("#use-key").await
}

async fn filter(browser: &Browser, agent: &str, kind: &str) -> anyhow::Result<()> {
    browser.clear("#filter-agent").await?;
    if !agent.is_empty() {
        browser.type_into("#filter-agent", agent).await?;
    }
    browser
        .click(&format!(r#"#filter-kind option[value="{kind}"]"#))
        .await?;
    browser.click("#inbox-filters button[type=submit]").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_answers_calls_of_every_session_from_the_inbox() -> anyhow::Result<()> {
    let Some(opened) = setup::browser().await? else {
        return Ok(());
    };
    let browser = &opened.browser;
    let people = people::runtime()?;
    let runtime = people.runtime.clone();
    let first = runtime.execute("desk", "boxes for the move").await?;
    let second = runtime.execute("desk", "boxes for the office").await?;
    let clerk = runtime.execute("clerk", "write to Ana").await?;
    anyhow::ensure!(
        clerk.status == Status::SuspendedClientTool,
        "{:?}",
        clerk.status
    );
    let server = serve_nested(
        runtime.clone(),
        people::auth(),
        ServerConfig::default().page_agent("clerk"),
        "/team",
    )
    .await?;
    let page = server.url("/team#inbox");

    // A: no operator credentials yet, and the page says so.
    let a = browser.window().await?;
    browser.goto(&page).await?;
    browser
        .wait_for_text("#inbox-auth", "this page has no operator credentials")
        .await?;
    use_key(browser).await?;
    browser
        .wait_for_text("#inbox-status", "4 calls wait")
        .await?;
    let clerk_items = format!(r#"li.inbox-item[data-session-id="{}"]"#, clerk.session_id);
    browser
        .wait_for_text(&clerk_items, "clerk · send_email (approval)")
        .await?;
    if let Some(path) = people::screenshot_path("inbox") {
        browser.screenshot(&path).await?;
    }

    // Filters: by agent, then by kind too, then none.
    filter(browser, "clerk", "").await?;
    browser
        .wait_for_text("#inbox-status", "2 calls wait")
        .await?;
    filter(browser, "clerk", "approval").await?;
    browser
        .wait_for_text("#inbox-status", "1 call waits")
        .await?;
    filter(browser, "", "").await?;
    browser
        .wait_for_text("#inbox-status", "4 calls wait")
        .await?;
    // Pages of three: the fourth comes with "Load more".
    browser
        .script(
            "document.querySelector('#inbox-list').dataset.pageSize = '3';",
            json!([]),
        )
        .await?;
    browser.click("#inbox-reload").await?;
    browser
        .wait_for_text("#inbox-status", "3 calls wait (more below)")
        .await?;
    browser.click("#inbox-more").await?;
    browser
        .wait_for_text("#inbox-status", "4 calls wait.")
        .await?;

    // B: a second window showing the inbox.
    let b = browser.new_window().await?;
    browser.switch_to(&b).await?;
    browser.goto(&page).await?;
    use_key(browser).await?;
    browser
        .wait_for_text("#inbox-status", "4 calls wait")
        .await?;

    // A answers the clerk's question in place: the item goes, here and in B.
    browser.switch_to(&a).await?;
    let pick = format!(r#"{clerk_items} form[data-tool-call-id="pick-1"]"#);
    browser
        .wait_for_text(&pick, "Asks which colour the card should be.")
        .await?;
    browser
        .click(&format!("{pick} select option:nth-child(3)"))
        .await?;
    browser
        .click(&format!(r#"{pick} button[data-action="submit"]"#))
        .await?;
    browser
        .wait_for_text("#inbox-status", "Answered: pick")
        .await?;
    let count = format!("return document.querySelectorAll('{pick}').length;");
    anyhow::ensure!(browser.script(&count, json!([])).await? == json!(0));
    // The page's next look finds the same calls: the answer is still said, with the count.
    let look = "const done = arguments[arguments.length - 1]; pollInbox().then(() => done(null));";
    browser.script_async(look, json!([])).await?;
    let said = browser.text("#inbox-status").await?;
    anyhow::ensure!(
        said.starts_with("Answered: pick") && said.ends_with("3 calls wait."),
        "{said}"
    );
    browser.switch_to(&b).await?;
    browser
        .wait_for_text("#inbox-status", "3 calls wait")
        .await?;
    anyhow::ensure!(browser.script(&count, json!([])).await? == json!(0));

    // B approves the clerk's email: nothing else waits there, so its session finishes.
    let email = format!(r#"{clerk_items} form[data-kind="approval"]"#);
    browser
        .click(&format!(r#"{email} button[data-action="approve"]"#))
        .await?;
    browser
        .wait_for_text("#inbox-status", "Answered: send_email")
        .await?;
    runtime.wait_tree_settled(&clerk.session_id).await;
    let answered = runtime.pending(&clerk.session_id).await?;
    anyhow::ensure!(
        runtime.status(&clerk.session_id).await? == Status::Completed,
        "{answered:?}"
    );
    let sent = people
        .sent
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    anyhow::ensure!(
        sent == [
            json!({ "to": "ana@example.com", "subject": "Hello", "cc": ["team@example.com"] })
        ],
        "{sent:?}"
    );
    browser.switch_to(&a).await?;
    browser
        .wait_for_text("#inbox-status", "2 calls wait")
        .await?;

    // A opens the first desk session's conversation from its item: its card is there.
    let item = format!(r#"li.inbox-item[data-session-id="{}"]"#, first.session_id);
    browser
        .click(&format!(r#"{item} button[data-action="open"]"#))
        .await?;
    browser
        .wait_for_text("#session", first.session_id.as_str())
        .await?;
    browser
        .wait_for(r#"#conversation-view form[data-tool-call-id="order-1"] .schema-form"#)
        .await?;
    drop(second);
    opened.close().await?;
    server.stop().await?.shutdown().await?;
    Ok(())
}
