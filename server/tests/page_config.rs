//! The page says what the server's configuration says, not the demo's: its title and the hint
//! in its message field, escaped as HTML.

mod common;

use common::demo_server;
use dormant_server::ServerConfig;
use reqwest::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_takes_its_title_and_placeholder_from_the_configuration() -> anyhow::Result<()> {
    let server = demo_server(ServerConfig::default()).await?;
    let page = server.get("/", None).await?;
    assert_eq!(page.status(), StatusCode::OK);
    let html = page.text().await?;
    assert!(html.contains("<title>dormant</title>"), "{html}");
    assert!(html.contains(r#"placeholder="Write a message""#), "{html}");
    assert!(
        !html.contains("weather in Porto"),
        "a daemon's page is not the demo's"
    );
    server.stop().await?.shutdown().await?;

    let config = ServerConfig::default()
        .page_title("Support <desk>")
        .page_placeholder(r#"Describe the "issue""#);
    let server = demo_server(config).await?;
    let html = server.get("/", None).await?.text().await?;
    assert!(
        html.contains("<title>Support &lt;desk&gt;</title>"),
        "{html}"
    );
    assert!(html.contains("<h1>Support &lt;desk&gt;</h1>"), "{html}");
    assert!(
        html.contains(r#"placeholder="Describe the &quot;issue&quot;""#),
        "{html}"
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}
