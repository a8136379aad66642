//! The page under a prefix of a daemon's router (`Router::nest("/agents", …)`): every path it
//! uses is relative to its own URL, so it loads its script and reaches every route there,
//! where nothing answers at the origin's root.

use std::sync::Arc;

use dormant::SledStore;
use dormant_server::{Auth, ServerConfig};
use reqwest::StatusCode;
use serde_json::json;

use crate::common::{demo_runtime, nested::serve_nested};
use crate::{plan, setup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_works_under_a_prefix_of_a_daemons_router() -> anyhow::Result<()> {
    let Some(opened) = setup::browser().await? else {
        return Ok(());
    };
    let browser = &opened.browser;
    let runtime = demo_runtime(Arc::new(SledStore::temporary()?))?;
    let server = serve_nested(
        runtime,
        Auth::allow_unauthenticated(),
        ServerConfig::default(),
        "/agents",
    )
    .await?;
    // An absolute path would miss: the root has no routes.
    let missed = server.http.get(server.url("/page.js")).send().await?;
    anyhow::ensure!(missed.status() == StatusCode::NOT_FOUND, "{missed:?}");
    let html = server.http.get(server.url("/agents")).send().await?;
    let html = html.text().await?;
    anyhow::ensure!(html.contains(r#"src="./agents/page.js""#), "{html}");

    browser.goto(&server.url("/agents")).await?;
    browser.type_into("#message", "weather in Porto").await?;
    browser.click("#send").await?;
    plan::answer_and_approve(browser, "", 1, "Porto in the sun").await?;
    browser
        .wait_for_text("#log", "Published \"Porto in the sun\"")
        .await?;
    browser.wait_for_text("#log", "run completed").await?;
    browser
        .wait_for(r#"#connection[data-state="open"]"#)
        .await?;
    // What the page remembers is kept apart from a page mounted elsewhere on this origin.
    let saved = browser
        .script(
            "return [localStorage.getItem('dormant-page'), \
             JSON.parse(localStorage.getItem('dormant-page:/agents/')).session_id];",
            json!([]),
        )
        .await?;
    anyhow::ensure!(saved[0].is_null() && saved[1].is_string(), "{saved}");
    opened.close().await?;
    let runtime = server.stop().await?;
    runtime.shutdown().await?;
    Ok(())
}
