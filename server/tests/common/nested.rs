//! The routes nested under a prefix of an outer router, as a daemon may mount them
//! (`Router::nest`).

use dormant::Runtime;
use dormant_server::{Auth, Server, ServerConfig};

use super::TestServer;

/// As [`super::serve`], with the routes under `prefix` (e.g. `/agents`) of an outer router
/// that has nothing else; `base` is the origin, without the prefix.
pub async fn serve_nested(
    runtime: Runtime,
    auth: Auth,
    config: ServerConfig,
    prefix: &str,
) -> anyhow::Result<TestServer> {
    let server = Server::new(runtime.clone(), auth).config(config);
    let closing = server.closing();
    let app = axum::Router::new().nest(prefix, server.router()?);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let stop = closing.clone();
    let served = tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.closed().await })
            .await;
    });
    Ok(TestServer {
        base,
        http: reqwest::Client::new(),
        runtime,
        closing,
        served,
    })
}
