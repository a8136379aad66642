//! A streaming model's deltas reach an SSE client as `delta` events without an id, between
//! the chunks, in order; the `text` chunk after them carries the whole reply.

mod common;

use std::sync::Arc;

use common::{serve, EventReader};
use dormant::llm::{BoxFuture, LlmAdapter, LlmError, ModelRequest};
use dormant::{AgentDefinition, MemoryStore, ModelReply, Runtime};
use dormant_server::{Auth, ServerConfig};
use reqwest::StatusCode;
use serde_json::json;
use tokio::sync::Notify;

/// Streams its reply once let go, so the test knows its client is caught up first.
struct GatedWriter {
    go: Arc<Notify>,
}

impl LlmAdapter for GatedWriter {
    fn complete(&self, request: ModelRequest) -> BoxFuture<'static, Result<ModelReply, LlmError>> {
        let go = Arc::clone(&self.go);
        Box::pin(async move {
            go.notified().await;
            for piece in ["Hello", ", wide", " world."] {
                request.deltas.text(piece);
            }
            Ok(ModelReply::text("Hello, wide world."))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_client_sees_the_deltas_then_the_text() -> anyhow::Result<()> {
    let go = Arc::new(Notify::new());
    let runtime = Runtime::builder()
        .store(Arc::new(MemoryStore::new()))
        .llm(Arc::new(GatedWriter {
            go: Arc::clone(&go),
        }))
        .agent(AgentDefinition::builder("demo").build()?)
        .build()?;
    let server = serve(
        runtime,
        Auth::allow_unauthenticated(),
        ServerConfig::default(),
    )
    .await?;
    let session = server.start("hi").await?;
    let path = format!("/sse?session_id={}&token={}", session.id, session.token);
    let response = server.get(&path, None).await?;
    assert_eq!(response.status(), StatusCode::OK);
    let mut events = EventReader::new(response);
    let first = events.next().await?;
    assert_eq!(
        first.map(|event| (event.id, event.name)),
        Some((Some(0), "run_start".into()))
    );

    // Caught up: now the model writes.
    go.notify_one();
    let mut seen = Vec::new();
    while let Some(event) = events.next().await? {
        seen.push(event);
    }
    let names: Vec<&str> = seen.iter().map(|event| event.name.as_str()).collect();
    assert_eq!(names, ["delta", "delta", "delta", "text", "run_end", "end"]);
    let deltas: Vec<_> = seen
        .iter()
        .filter(|event| event.name == "delta")
        .map(|event| {
            (
                event.id,
                event.data["index"].clone(),
                event.data["text"].clone(),
            )
        })
        .collect();
    assert_eq!(
        deltas,
        [
            (None, json!(0), json!("Hello")),
            (None, json!(1), json!(", wide")),
            (None, json!(2), json!(" world.")),
        ]
    );
    assert_eq!(seen[0].data["type"], json!("text_delta"));
    assert_eq!(seen[0].data["after_seq"], json!(1));
    assert_eq!(
        (seen[3].id, &seen[3].data["kind"]["text"]),
        (Some(1), &json!("Hello, wide world."))
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}
