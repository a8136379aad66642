//! Once the server is closing, health says so (503) and new streams are refused (503), so a
//! load balancer stops sending and clients reconnect later with `Last-Event-ID`.

mod common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use common::demo_runtime;
use dormant::SledStore;
use dormant_server::{Auth, Server};
use serde_json::Value;
use tower::ServiceExt;

async fn json(response: axum::response::Response) -> anyhow::Result<Value> {
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await?;
    Ok(serde_json::from_slice(&bytes)?)
}

#[tokio::test]
async fn a_closing_server_answers_503_to_health_and_new_streams() -> anyhow::Result<()> {
    let runtime = demo_runtime(Arc::new(SledStore::temporary()?))?;
    let server = Server::new(runtime.clone(), Auth::allow_unauthenticated());
    let closing = server.closing();
    let app = server.router()?;
    let body = r#"{"agent": "demo", "message": "echo hi"}"#;
    let start = Request::post("/start")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, body.len())
        .body(Body::from(body))?;
    let started = json(app.clone().oneshot(start).await?).await?;
    let (id, token) = (started["session_id"].as_str(), started["token"].as_str());
    let stream_path = format!(
        "/sse?session_id={}&token={}",
        id.unwrap_or_default(),
        token.unwrap_or_default()
    );
    let health = app
        .clone()
        .oneshot(Request::get("/healthz").body(Body::empty())?)
        .await?;
    assert_eq!(health.status(), StatusCode::OK);

    closing.close();
    assert!(closing.is_closed());
    let health = app
        .clone()
        .oneshot(Request::get("/healthz").body(Body::empty())?)
        .await?;
    assert_eq!(health.status(), StatusCode::SERVICE_UNAVAILABLE);
    let stream = app
        .oneshot(Request::get(stream_path).body(Body::empty())?)
        .await?;
    assert_eq!(stream.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(json(stream).await?["code"], "shutting_down");
    runtime.shutdown().await?;
    Ok(())
}
