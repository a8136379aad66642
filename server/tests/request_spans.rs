//! Each request is followed in a `request` span with its method and path, never its query
//! (which may carry a session token), and ends with a `server.answered` event that says its
//! status.

mod common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::demo_runtime;
use dormant::SledStore;
use dormant_server::{Auth, Server};
use tower::ServiceExt;

#[tokio::test]
async fn a_request_is_logged_in_a_span_with_its_path_and_without_its_query() -> anyhow::Result<()> {
    let (logs, _guard) = dormant::testkit::CapturedLogs::start(tracing::Level::DEBUG);
    let runtime = demo_runtime(Arc::new(SledStore::temporary()?))?;
    let app = Server::new(runtime.clone(), Auth::allow_unauthenticated()).router()?;
    let response = app
        .oneshot(
            Request::get("/status?session_id=s-1&token=dst1.not-a-secret").body(Body::empty())?,
        )
        .await?;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    runtime.shutdown().await?;

    let logs = logs.text()?;
    let answered = logs
        .lines()
        .find(|line| line.contains("server.answered"))
        .ok_or_else(|| anyhow::anyhow!("no server.answered line in\n{logs}"))?;
    assert!(
        answered.contains("request{method=GET path=/status}"),
        "{answered}"
    );
    assert!(answered.contains("status=401"), "{answered}");
    assert!(
        !logs.contains("not-a-secret"),
        "a token was logged:\n{logs}"
    );
    Ok(())
}
