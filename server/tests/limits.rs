//! What comes in is bounded before it is read: a body needs its length (411) within the cap
//! (413), JSON content (415), JSON that parses and nests no deeper than the limit (400); a
//! slow request is answered 408; CORS is off unless configured. A refused request stores
//! nothing.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::gated::gated_store;
use common::{answer, demo_runtime, demo_server, pending, serve, text};
use dormant::Runtime;
use dormant_server::{Auth, ServerConfig};
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_refused_before_they_are_read_and_nothing_is_stored() -> anyhow::Result<()> {
    let server = demo_server(ServerConfig::default().max_body_bytes(1024)).await?;
    let start = server.url("/start");

    // A chunked body has no Content-Length: 411 on a route that reads a body. The others
    // answer as they would, in JSON, without reading it.
    for (method, path, status, code) in [
        (
            "POST",
            "/start",
            StatusCode::LENGTH_REQUIRED,
            "length_required",
        ),
        ("POST", "/nope", StatusCode::NOT_FOUND, "not_found"),
        (
            "POST",
            "/healthz",
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            "PUT",
            "/start",
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            "GET",
            "/start",
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
    ] {
        let chunks = futures::stream::iter([Ok::<_, std::io::Error>(
            r#"{"agent":"demo","message":"hi"}"#,
        )]);
        let response = server
            .http
            .request(method.parse()?, server.url(path))
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(chunks))
            .send()
            .await?;
        let (got, body) = answer(response).await?;
        assert_eq!(
            (got, body["code"].as_str()),
            (status, Some(code)),
            "{method} {path}"
        );
    }

    // Past the cap: 413, with the sizes.
    let long = json!({ "agent": "demo", "message": "x".repeat(2000) });
    let (code, body) = answer(server.post("/start", None, &long).await?).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("payload_too_large"))
    );
    assert_eq!(body["limit"], 1024);

    // Not JSON: 415. Malformed, unknown fields, too deep: 400.
    let response = server.http.post(&start).body("agent=demo").send().await?;
    let (code, body) = answer(response).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Some("unsupported_media_type")
        )
    );
    let bad_bodies = [
        r#"{"agent": "demo", "message": "#.to_string(),
        r#"{"agent": "demo", "message": "hi", "extra": 1}"#.to_string(),
        r#"{"agent": "demo"}"#.to_string(),
        r#"["demo", "hi"]"#.to_string(),
        format!(
            r#"{{"agent": "demo", "message": "hi", "x": {}{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        ),
    ];
    for bad in bad_bodies {
        let response = server
            .http
            .post(&start)
            .header("content-type", "application/json")
            .body(bad.clone())
            .send()
            .await?;
        let (code, body) = answer(response).await?;
        assert_eq!(
            (code, body["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_request")),
            "{bad:.60}"
        );
    }
    let deep = format!(
        r#"{{"agent": "demo", "message": "hi", "x": {}{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let response = server
        .http
        .post(&start)
        .header("content-type", "application/json")
        .body(deep)
        .send()
        .await?;
    let (_, body) = answer(response).await?;
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|text| text.contains("deeper than 129")),
        "{body}"
    );

    // Malformed queries are typed errors too.
    let (code, body) = answer(server.get("/status", None).await?).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
    let too_long = "x".repeat(5000);
    let session = server.start("weather in Porto").await?;
    let (code, body) = answer(
        server
            .get(
                &format!("/status?session_id={too_long}"),
                Some(&session.token),
            )
            .await?,
    )
    .await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
    let sse = format!("/sse?session_id={}&token={}", session.id, session.token);
    let response = server
        .http
        .get(server.url(&sse))
        .header("last-event-id", "seven")
        .send()
        .await?;
    let (code, _) = answer(response).await?;
    assert_eq!(code, StatusCode::BAD_REQUEST);

    // Only the one well-formed start made a session.
    assert_eq!(server.runtime.session_ids().await?.len(), 1);
    server.stop().await?.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_or_large_result_is_refused_by_the_submit_contract() -> anyhow::Result<()> {
    let store = Arc::new(dormant::SledStore::temporary()?);
    let builder = Runtime::builder()
        .store(store)
        .background_deadlines(false)
        .max_result_bytes(400);
    let runtime = dormant_server::demo::configure(builder)?.build()?;
    let server = serve(
        runtime,
        Auth::allow_unauthenticated(),
        ServerConfig::default(),
    )
    .await?;
    let session = server.start("weather in Porto").await?;
    server.events(&session, "").await?;
    let call = text(
        pending(&server.status(&session).await?, "client")?,
        "tool_call_id",
    )?;
    let large = json!({ "session_id": session.id, "tool_call_id": call, "result": { "answer": "y".repeat(500) } });
    let (code, body) = server.submit(&session, &large).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("payload_too_large"))
    );
    assert_eq!(body["limit"], 400);
    // A result may nest as deep over HTTP as in process (128): the schema then refuses it.
    // One level more is refused before it reaches the runtime.
    let nested = |levels: usize| {
        let mut deep = json!("leaf");
        for _ in 0..levels {
            deep = json!([deep]);
        }
        json!({ "session_id": session.id, "tool_call_id": call, "result": deep })
    };
    let (code, body) = server.submit(&session, &nested(128)).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_result")),
        "{body}"
    );
    let (code, body) = server.submit(&session, &nested(129)).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request")),
        "{body}"
    );
    let status = server.status(&session).await?;
    assert_eq!(
        pending(&status, "client")?["waiting"],
        true,
        "nothing was stored"
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_store_holds_up_is_answered_408_and_a_retry_finds_it_durable(
) -> anyhow::Result<()> {
    let store = gated_store();
    let runtime = demo_runtime(store.clone())?;
    let config = ServerConfig::default().request_timeout(Duration::from_millis(300));
    let server = serve(runtime, Auth::allow_unauthenticated(), config).await?;
    let session = server.start("weather in Porto").await?;
    server.events(&session, "").await?;
    let call = text(
        pending(&server.status(&session).await?, "client")?,
        "tool_call_id",
    )?;
    let envelope =
        json!({ "session_id": session.id, "tool_call_id": call, "result": { "answer": "slow" } });
    store.delegate().hold();
    let (code, body) = server.submit(&session, &envelope).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::REQUEST_TIMEOUT, Some("request_timeout"))
    );
    store.delegate().open();
    // The timed-out submit went on and was made durable: the retry says so.
    let (code, body) = server.submit(&session, &envelope).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_completed"))
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_off_by_default_and_allows_only_the_configured_origins() -> anyhow::Result<()> {
    let preflight = |server: &common::TestServer| {
        server
            .http
            .request(reqwest::Method::OPTIONS, server.url("/start"))
            .header("origin", "https://app.example")
            .header("access-control-request-method", "POST")
            .send()
    };
    let closed = demo_server(ServerConfig::default()).await?;
    let response = preflight(&closed).await?;
    assert!(response
        .headers()
        .get("access-control-allow-origin")
        .is_none());
    closed.stop().await?.shutdown().await?;

    let open = demo_server(ServerConfig::default().cors_origins(["https://app.example"])).await?;
    let response = preflight(&open).await?;
    assert_eq!(
        response
            .headers()
            .get("access-control-allow-origin")
            .and_then(|v| v.to_str().ok()),
        Some("https://app.example")
    );
    let other = open
        .http
        .get(open.url("/healthz"))
        .header("origin", "https://evil.example")
        .send()
        .await?;
    assert!(other.headers().get("access-control-allow-origin").is_none());
    // A front end sends the built-in API key's header across origins.
    let with_key = open
        .http
        .request(reqwest::Method::OPTIONS, open.url("/start"))
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type,x-api-key")
        .send()
        .await?;
    let allowed = with_key
        .headers()
        .get("access-control-allow-headers")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    assert!(allowed.contains("x-api-key"), "{allowed}");
    let runtime = open.stop().await?;
    // A wildcard is refused as a setting, not taken for "any origin" (nor a panic).
    let wildcard = dormant_server::Server::new(runtime.clone(), Auth::allow_unauthenticated())
        .config(ServerConfig::default().cors_origins(["*"]))
        .router();
    match wildcard {
        Err(dormant_server::ServerError::InvalidConfig { setting, .. }) => {
            assert_eq!(setting, "cors_origins")
        }
        other => panic!(
            "a wildcard origin should be refused, got {:?}",
            other.map(|_| ())
        ),
    }
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn every_route_that_reads_a_body_refuses_one_of_no_declared_length() -> anyhow::Result<()> {
    let server = demo_server(ServerConfig::default()).await?;
    // The peers' routes read a body too: a node's follow is bounded like any call.
    for path in [
        "/start",
        "/resume",
        "/submit-tool-result",
        "/interrupt",
        "/abort",
        "/peer",
        "/peer/follow",
    ] {
        let chunks = futures::stream::iter([Ok::<_, std::io::Error>(r#"{"session_id":"x"}"#)]);
        let response = server
            .http
            .post(server.url(path))
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(chunks))
            .send()
            .await?;
        let (got, body) = answer(response).await?;
        assert_eq!(
            (got, body["code"].as_str()),
            (StatusCode::LENGTH_REQUIRED, Some("length_required")),
            "POST {path}"
        );
    }
    Ok(())
}
