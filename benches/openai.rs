//! What the OpenAI adapter adds to an HTTP round trip, against a loopback mock server that
//! answers every request with the same recorded body.
//!
//! Criterion, `openai/…`:
//! * `json/raw`: a reqwest POST of the request body and reading the JSON reply;
//! * `json/adapter`: `OpenAiAdapter::complete` on the same reply (body mapping, parsing,
//!   reply mapping);
//! * `stream/raw`: a reqwest POST reading a stream of 50 text chunks to its end;
//! * `stream/adapter`: the adapter streaming the same 50 chunks (SSE parsing, assembly, a
//!   delta per chunk to a discarding [`DeltaSink`]: a connected sink is built only by a
//!   runtime, whose cost is not the adapter's).
//!
//! The ratios adapter / raw are printed at the end. Run with
//! `cargo bench --features openai --bench openai`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::routing::post;
use axum::serve::ListenerExt;
use axum::Router;
use criterion::Criterion;
use dormant::llm::{BoxFuture, DeltaSink, LlmAdapter, ModelRequest};
use dormant::{Message, ModelSettings, OpenAiAdapter, SessionId};
use serde_json::json;

const TEXT_JSON: &str = include_str!("../tests/openai/text.json");
/// Text chunks in the streamed reply.
const CHUNKS: usize = 50;

/// A streamed reply of `CHUNKS` one-word chunks, a finish chunk, a usage chunk and `[DONE]`,
/// in OpenAI's wire format.
fn transcript() -> String {
    let chunk = |choices: serde_json::Value, usage: serde_json::Value| {
        let event = json!({
            "id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1741570283,
            "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_06737a9306",
            "choices": choices, "usage": usage,
        });
        format!("data: {event}\n\n")
    };
    let mut text = chunk(
        json!([{ "index": 0, "delta": { "role": "assistant", "content": "" },
                 "logprobs": null, "finish_reason": null }]),
        json!(null),
    );
    for n in 0..CHUNKS {
        text.push_str(&chunk(
            json!([{ "index": 0, "delta": { "content": format!(" word{n}") },
                     "logprobs": null, "finish_reason": null }]),
            json!(null),
        ));
    }
    text.push_str(&chunk(
        json!([{ "index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop" }]),
        json!(null),
    ));
    text.push_str(&chunk(
        json!([]),
        json!({ "prompt_tokens": 41, "completion_tokens": 50, "total_tokens": 91 }),
    ));
    text.push_str("data: [DONE]\n\n");
    text
}

/// Serves the JSON reply under `/json/v1` and the stream (one frame per event) under
/// `/sse/v1`; returns the server's address.
async fn serve() -> anyhow::Result<String> {
    let frames: Arc<Vec<Bytes>> = Arc::new(
        transcript()
            .split_inclusive("\n\n")
            .map(|frame| Bytes::from(frame.to_string()))
            .collect(),
    );
    let json = post(|_: Bytes| async {
        let mut response = Response::new(Body::from(TEXT_JSON));
        response.headers_mut().insert(
            "content-type",
            axum::http::HeaderValue::from_static("application/json"),
        );
        response
    });
    let sse = post(move |_: Bytes| {
        let frames = Arc::clone(&frames);
        async move {
            let stream = futures::stream::iter(
                (0..frames.len())
                    .map(move |n| Ok::<_, std::convert::Infallible>(frames[n].clone())),
            );
            let mut response = Response::new(Body::from_stream(stream));
            response.headers_mut().insert(
                "content-type",
                axum::http::HeaderValue::from_static("text/event-stream"),
            );
            response
        }
    });
    let app = Router::new()
        .route("/json/v1/chat/completions", json)
        .route("/sse/v1/chat/completions", sse);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = format!("http://{}", listener.local_addr()?);
    // Without it, Nagle's algorithm holds the small frames of a stream back for the client's
    // delayed ACK, and the bench measures TCP timers instead of the adapter.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(address)
}

fn request() -> anyhow::Result<ModelRequest> {
    Ok(ModelRequest {
        session_id: "bench".parse::<SessionId>()?,
        agent: "clerk".into(),
        system_prompt: "You are a shop clerk.".into(),
        messages: Arc::new(vec![Message::User {
            text: "Any tea?".into(),
        }]),
        tools: Arc::from(Vec::new()),
        settings: Arc::new(ModelSettings::model("gpt-4o-mini")),
        deltas: DeltaSink::discard(),
    })
}

/// Mean time per iteration of `routine`, measured outside criterion for the ratio line.
fn mean<F: std::future::Future<Output = ()>>(
    runtime: &tokio::runtime::Runtime,
    routine: impl Fn() -> F,
) -> Duration {
    const ROUNDS: u32 = 2_000;
    runtime.block_on(async {
        for _ in 0..ROUNDS / 10 {
            routine().await;
        }
        let start = Instant::now();
        for _ in 0..ROUNDS {
            routine().await;
        }
        start.elapsed() / ROUNDS
    })
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let address = runtime.block_on(serve())?;
    let client = reqwest::Client::new();
    let adapter = |path: &str, stream: bool| {
        OpenAiAdapter::builder()
            .base_url(format!("{address}/{path}/v1"))
            .stream(stream)
            .build()
    };
    let (json_adapter, sse_adapter) = (adapter("json", false)?, adapter("sse", true)?);
    let request = request()?;
    let body = serde_json::to_vec(&json!({
        "model": "gpt-4o-mini",
        "messages": [{ "role": "system", "content": "You are a shop clerk." },
                     { "role": "user", "content": "Any tea?" }],
    }))?;
    let raw = |path: &'static str| {
        let (client, body, url) = (
            client.clone(),
            body.clone(),
            format!("{address}/{path}/v1/chat/completions"),
        );
        move || {
            let post = client.post(&url).body(body.clone()).send();
            Box::pin(async move {
                let mut response = post.await.expect("the mock answers");
                while response.chunk().await.expect("the mock streams").is_some() {}
            }) as BoxFuture<'static, ()>
        }
    };
    let through = |adapter: &OpenAiAdapter| {
        let (adapter, request) = (adapter.clone(), request.clone());
        move || {
            let reply = adapter.complete(request.clone());
            Box::pin(async move {
                let reply = reply.await.expect("the mock answers");
                assert!(reply.text.is_some());
            }) as BoxFuture<'static, ()>
        }
    };
    type Routine = Box<dyn Fn() -> BoxFuture<'static, ()>>;
    let routines: [(&str, Routine); 4] = [
        ("json/raw", Box::new(raw("json"))),
        ("json/adapter", Box::new(through(&json_adapter))),
        ("stream/raw", Box::new(raw("sse"))),
        ("stream/adapter", Box::new(through(&sse_adapter))),
    ];
    let mut criterion = Criterion::default()
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let mut group = criterion.benchmark_group("openai");
    for (name, routine) in &routines {
        group.bench_function(*name, |b| b.to_async(&runtime).iter(routine));
    }
    group.finish();
    criterion.final_summary();

    let means: Vec<Duration> = routines
        .iter()
        .map(|(_, routine)| mean(&runtime, routine))
        .collect();
    for (name, mean) in routines.iter().map(|(name, _)| name).zip(&means) {
        eprintln!("{name:>15}: {:>8.1} µs", mean.as_secs_f64() * 1e6);
    }
    eprintln!(
        "adapter / raw: json {:.2}×, stream ({CHUNKS} chunks) {:.2}×",
        means[1].as_secs_f64() / means[0].as_secs_f64(),
        means[3].as_secs_f64() / means[2].as_secs_f64(),
    );
    Ok(())
}
