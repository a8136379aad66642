//! Each request is followed in a `request` span with its method and path, never its query
//! (which may carry a session token), and ends with a `server.answered` event that says its
//! status.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::demo_runtime;
use dormant::SledStore;
use dormant_server::{Auth, Server};
use tower::ServiceExt;

/// Where the subscriber writes: a buffer the test reads afterwards.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut buffer) = self.0.lock() {
            buffer.extend_from_slice(bytes);
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_request_is_logged_in_a_span_with_its_path_and_without_its_query() -> anyhow::Result<()> {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let runtime = demo_runtime(Arc::new(SledStore::temporary()?))?;
    let app = Server::new(runtime.clone(), Auth::allow_unauthenticated()).router()?;
    let response = app
        .oneshot(
            Request::get("/status?session_id=s-1&token=dst1.not-a-secret").body(Body::empty())?,
        )
        .await?;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    runtime.shutdown().await?;

    let logs = String::from_utf8(
        logs.0
            .lock()
            .map_err(|_| anyhow::anyhow!("the log buffer's lock is poisoned"))?
            .clone(),
    )?;
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
