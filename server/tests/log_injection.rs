//! What comes from outside reaches the log escaped and cut short: a tool call id of a
//! megabyte of newlines and escape codes is one record on one line of bounded length, not a
//! forged record, a rewritten terminal or two megabytes of log.

mod common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::demo_runtime;
use dormant::SledStore;
use dormant_server::{Auth, Server};
use serde_json::{json, Value};
use tower::ServiceExt;

async fn post(app: &axum::Router, path: &str, body: &Value) -> anyhow::Result<(StatusCode, Value)> {
    let bytes = serde_json::to_vec(body)?;
    let response = app
        .clone()
        .oneshot(
            Request::post(path)
                .header("content-type", "application/json")
                .header("content-length", bytes.len())
                .body(Body::from(bytes))?,
        )
        .await?;
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX).await?;
    Ok((status, serde_json::from_slice(&body)?))
}

// One thread: the subscriber set for it sees the server's and the sessions' tasks alike.
#[tokio::test]
async fn a_megabyte_tool_call_id_full_of_newlines_and_escape_codes_is_logged_on_one_short_line(
) -> anyhow::Result<()> {
    let (logs, _guard) = dormant::testkit::CapturedLogs::start(tracing::Level::TRACE);
    let runtime = demo_runtime(Arc::new(SledStore::temporary()?))?;
    let app = Server::new(runtime.clone(), Auth::allow_unauthenticated()).router()?;
    let (status, started) = post(
        &app,
        "/start",
        &json!({ "agent": "demo", "message": "weather in Porto" }),
    )
    .await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{started}");
    let session = started["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let token = started["token"].as_str().unwrap_or_default().to_string();
    let mut hostile = String::from(
        "ask_user-9\n2026-01-01T00:00:00Z  INFO forged: the admin logged in\u{1b}[2J\u{1b}[31m",
    );
    while hostile.len() < 1_000_000 {
        hostile.push_str("\n\u{1b}[0m");
        hostile.push_str(&"A".repeat(120));
    }
    let bytes = serde_json::to_vec(&json!({
        "session_id": session,
        "tool_call_id": hostile,
        "result": { "answer": "x" },
    }))?;
    let response = app
        .clone()
        .oneshot(
            Request::post("/submit-tool-result")
                .header("content-type", "application/json")
                .header("content-length", bytes.len())
                .header("authorization", format!("Bearer {token}"))
                .body(Body::from(bytes))?,
        )
        .await?;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    runtime.shutdown().await?;

    let logs = logs.text()?;
    assert!(
        logs.contains("server.submit"),
        "the submit was logged:\n{logs}"
    );
    assert!(!logs.contains('\u{1b}'), "an escape code reached the log");
    for line in logs.lines() {
        assert!(
            !line.trim_start().starts_with("2026-01-01T00:00:00Z"),
            "a forged record: {line}"
        );
        assert!(line.len() < 4096, "a line of {} bytes", line.len());
    }
    let submit = logs
        .lines()
        .find(|line| line.contains("server.submit"))
        .unwrap_or_default();
    assert!(
        submit.contains(r"ask_user-9\n2026-01-01T00:00:00Z  INFO forged"),
        "{submit}"
    );
    assert!(
        submit.contains("bytes]"),
        "no marker of what was cut: {submit}"
    );
    assert!(
        logs.len() < 256 * 1024,
        "{} bytes of log for one request",
        logs.len()
    );
    Ok(())
}
