//! Fail-closed: no server without authentication; a session's token opens that session
//! only; a hook decides who starts sessions, who may name them, and who may act on all.

mod common;

use std::sync::Arc;

use common::{answer, demo_runtime, demo_server, serve};
use dormant::SledStore;
use dormant_server::{Auth, Caller, Denied, ServerConfig, ServerError};
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test]
async fn a_server_without_authentication_refuses_to_build() -> anyhow::Result<()> {
    let runtime = demo_runtime(Arc::new(SledStore::temporary()?))?;
    let refused = dormant_server::router(runtime.clone(), Auth::default());
    assert!(matches!(refused, Err(ServerError::AuthNotConfigured)));
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_opens_its_own_session_only() -> anyhow::Result<()> {
    let server = demo_server(ServerConfig::default()).await?;
    let a = server.start("weather in Porto").await?;
    let b = server.start("weather in Braga").await?;
    server.events(&a, "").await?;
    let on_a = json!({ "session_id": a.id });
    let submit_a =
        json!({ "session_id": a.id, "tool_call_id": "ask_user-1", "result": { "answer": "x" } });
    let reads = ["/status", "/runs", "/messages", "/sse"];

    // No token: 401 on every session route.
    for path in reads {
        let (code, body) = answer(
            server
                .get(&format!("{path}?session_id={}", a.id), None)
                .await?,
        )
        .await?;
        assert_eq!(
            (code, body["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("missing_token")),
            "{path}"
        );
    }
    for (path, body) in [
        ("/resume", &on_a),
        ("/interrupt", &on_a),
        ("/abort", &on_a),
        ("/submit-tool-result", &submit_a),
    ] {
        let (code, answer) = answer(server.post(path, None, body).await?).await?;
        assert_eq!(
            (code, answer["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("missing_token")),
            "{path}"
        );
    }
    // A credential that is no session token is not a missing one: 401 invalid_token.
    for credential in ["Bearer hello", "Basic dXNlcjpwYXNz"] {
        let response = server
            .http
            .get(server.url(&format!("/status?session_id={}", a.id)))
            .header("authorization", credential)
            .send()
            .await?;
        let (code, body) = answer(response).await?;
        assert_eq!(
            (code, body["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("invalid_token")),
            "{credential}: {body}"
        );
    }
    // B's token on A: 403, in the header or the query.
    for path in reads {
        let (code, body) = answer(
            server
                .get(&format!("{path}?session_id={}", a.id), Some(&b.token))
                .await?,
        )
        .await?;
        assert_eq!(
            (code, body["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("wrong_session")),
            "{path}"
        );
        let query = format!("{path}?session_id={}&token={}", a.id, b.token);
        let (code, _) = answer(server.get(&query, None).await?).await?;
        assert_eq!(code, StatusCode::FORBIDDEN, "{path}?token=");
    }
    for (path, body) in [
        ("/resume", &on_a),
        ("/interrupt", &on_a),
        ("/abort", &on_a),
        ("/submit-tool-result", &submit_a),
    ] {
        let (code, answer) = answer(server.post(path, Some(&b.token), body).await?).await?;
        assert_eq!(
            (code, answer["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("wrong_session")),
            "{path}"
        );
    }
    // A forged token (A's id under a made-up signature): 401.
    let forged = format!("{}0000", a.token.trim_end_matches(|c: char| c != '.'));
    let (code, body) = answer(
        server
            .get(&format!("/status?session_id={}", a.id), Some(&forged))
            .await?,
    )
    .await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("invalid_token"))
    );
    // Nothing was answered or stopped by the refused calls.
    let status = server.status(&a).await?;
    assert_eq!(status["status"], "suspended_client_tool");
    assert_eq!(status["pending"][0]["waiting"], true);

    // An anonymous caller may not name a session, nor start a turn of another's.
    let named = json!({ "agent": "demo", "message": "hi", "session_id": "mine" });
    let (code, body) = answer(server.post("/start", None, &named).await?).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("session_id_not_allowed"))
    );
    let hijack = json!({ "agent": "demo", "message": "hi", "session_id": a.id });
    let (code, _) = answer(server.post("/start", Some(&b.token), &hijack).await?).await?;
    assert_eq!(code, StatusCode::FORBIDDEN);
    assert!(matches!(
        server.runtime.status(&"mine".parse()?).await,
        Err(dormant::ReadError::UnknownSession(_))
    ));
    server.stop().await?.shutdown().await?;
    Ok(())
}

fn key_hook() -> Auth {
    Auth::hook(|headers| {
        let key = headers
            .get("x-api-key")
            .and_then(|value| value.to_str().ok())
            .map(str::to_string);
        Box::pin(async move {
            match key.as_deref() {
                Some("ops") => Ok(Caller::new("ops").operator().choosing_session_ids()),
                Some("app") => Ok(Caller::new("app")),
                Some("chooser") => Ok(Caller::new("chooser").choosing_session_ids()),
                _ => Err(Denied("x-api-key is required".into())),
            }
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hook_decides_who_starts_names_and_operates() -> anyhow::Result<()> {
    let runtime = demo_runtime(Arc::new(SledStore::temporary()?))?;
    let server = serve(runtime, key_hook(), ServerConfig::default()).await?;
    let start = json!({ "agent": "demo", "message": "echo hi" });
    let post = |key: Option<&'static str>, path: &'static str, body: serde_json::Value| {
        let mut request = server.http.post(server.url(path)).json(&body);
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        request.send()
    };
    let (code, body) = answer(post(None, "/start", start.clone()).await?).await?;
    assert_eq!(
        (code, body["message"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("x-api-key is required"))
    );
    let (code, started) = answer(post(Some("app"), "/start", start.clone()).await?).await?;
    assert_eq!(code, StatusCode::ACCEPTED);
    let id = started["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // The app may not name sessions nor act on one without its token; the operator may both.
    let named = json!({ "agent": "demo", "message": "echo hi", "session_id": "ops-1" });
    let (code, _) = answer(post(Some("app"), "/start", named.clone()).await?).await?;
    assert_eq!(code, StatusCode::FORBIDDEN);
    let (code, body) = answer(post(Some("ops"), "/start", named.clone()).await?).await?;
    assert_eq!(
        (code, body["session_id"].as_str()),
        (StatusCode::ACCEPTED, Some("ops-1"))
    );
    // A caller that may choose ids names a session it starts, not one that exists: that
    // would be a turn of someone else's session, and its token in the answer.
    let (code, body) = answer(post(Some("chooser"), "/start", named).await?).await?;
    assert_eq!(
        (code, body["code"].as_str(), body.get("token")),
        (StatusCode::FORBIDDEN, Some("session_token_required"), None),
        "{body}"
    );
    let mine = json!({ "agent": "demo", "message": "echo hi", "session_id": "chooser-1" });
    let (code, body) = answer(post(Some("chooser"), "/start", mine.clone()).await?).await?;
    assert_eq!(
        (code, body["session_id"].as_str()),
        (StatusCode::ACCEPTED, Some("chooser-1"))
    );
    let (code, body) = answer(post(Some("chooser"), "/start", mine).await?).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("session_token_required")),
        "{body}"
    );
    let status = |key: &'static str| {
        server
            .http
            .get(server.url(&format!("/status?session_id={id}")))
            .header("x-api-key", key)
            .send()
    };
    let (code, body) = answer(status("app").await?).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("session_token_required"))
    );
    let (code, _) = answer(status("ops").await?).await?;
    assert_eq!(code, StatusCode::OK);
    let ghost = server
        .http
        .get(server.url("/sse?session_id=ghost"))
        .header("x-api-key", "ops")
        .send()
        .await?;
    let (code, body) = answer(ghost).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_session"))
    );
    let (code, body) = answer(status("stranger").await?).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("missing_token"))
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}

/// An authentication scheme's name is case-insensitive (`bearer` is `Bearer`), while a token
/// has one spelling: its hex is lower-case, and an upper-case copy is no token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheme_is_read_in_any_case_and_a_token_in_its_one_spelling_only() -> anyhow::Result<()>
{
    let server = demo_server(ServerConfig::default()).await?;
    let session = server.start("weather in Porto").await?;
    let status = |authorization: String| {
        server
            .http
            .get(server.url(&format!("/status?session_id={}", session.id)))
            .header("authorization", authorization)
            .send()
    };
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let (code, body) = answer(status(format!("{scheme} {}", session.token)).await?).await?;
        assert_eq!(code, StatusCode::OK, "{scheme}: {body}");
    }
    // A start that names its session reads the scheme the same way: a new turn of it, once
    // the first has settled.
    server.events(&session, "").await?;
    let turn = json!({ "agent": "demo", "message": "weather in Braga", "session_id": session.id });
    let started = server
        .http
        .post(server.url("/start"))
        .header("authorization", format!("bearer {}", session.token))
        .json(&turn)
        .send()
        .await?;
    let (code, body) = answer(started).await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    let (head, mac) = session
        .token
        .rsplit_once('.')
        .ok_or_else(|| anyhow::anyhow!("a token has a MAC: {}", session.token))?;
    let shouted = [
        format!("{head}.{}", mac.to_ascii_uppercase()),
        format!(
            "dst1.{}",
            session.token["dst1.".len()..].to_ascii_uppercase()
        ),
    ];
    for token in shouted {
        assert_ne!(token, session.token, "the MAC has letters to change");
        let (code, body) = answer(status(format!("Bearer {token}")).await?).await?;
        assert_eq!(
            (code, body["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("invalid_token")),
            "{token}: {body}"
        );
    }
    server.stop().await?.shutdown().await?;
    Ok(())
}

/// `POST /peer` checks the node's key before it reads the body: a caller without it is
/// refused (403) whatever it sent, and learns nothing of how its body would have been read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_call_without_the_key_is_refused_before_its_body_is_read() -> anyhow::Result<()> {
    let server = demo_server(ServerConfig::default()).await?;
    for key in [None, Some("not-the-key")] {
        for body in ["garbage", "{}", r#"{"execute":{}}"#] {
            let mut request = server
                .http
                .post(server.url("/peer"))
                .header("content-type", "application/json")
                .body(body);
            if let Some(key) = key {
                request = request.header(dormant_server::PEER_KEY, key);
            }
            let (code, answered) = answer(request.send().await?).await?;
            assert_eq!(
                (code, answered["code"].as_str()),
                (StatusCode::FORBIDDEN, Some("peer_refused")),
                "{key:?} {body}: {answered}"
            );
        }
    }
    server.stop().await?.shutdown().await?;
    Ok(())
}

/// A caller without the key that sends a peer route's headers and then no body (a body that
/// never comes) is refused at once: its connection, and the server's drain at shutdown, are
/// not held until it sends one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_call_without_the_key_is_refused_before_a_body_that_never_comes(
) -> anyhow::Result<()> {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    let runtime = demo_runtime(Arc::new(SledStore::temporary()?))?;
    let router = dormant_server::router(runtime.clone(), Auth::allow_unauthenticated())?;
    for route in ["/peer", "/peer/follow", "/peer/submit-follow"] {
        let never = futures::stream::pending::<Result<axum::body::Bytes, std::io::Error>>();
        let request = Request::post(route)
            .header("content-type", "application/json")
            .header("content-length", 1000)
            .body(Body::from_stream(never))?;
        let answered = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            router.clone().oneshot(request),
        )
        .await
        .map_err(|_| anyhow::anyhow!("{route}: no answer while the body never came"))??;
        assert_eq!(answered.status(), StatusCode::FORBIDDEN, "{route}");
    }
    runtime.shutdown().await?;
    Ok(())
}

/// A server given a key file signs with the key kept there: a token issued before a restart
/// (a new router on the same file) opens its session after it. Without the file, each router
/// has a key of its own, and the token is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_key_file_keeps_tokens_valid_across_a_restart() -> anyhow::Result<()> {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    let dir = tempfile::tempdir()?;
    let key = dir.path().join("sessions.token-key");
    let runtime = demo_runtime(Arc::new(SledStore::temporary()?))?;
    let router = |file: bool| {
        let server = dormant_server::Server::new(runtime.clone(), Auth::allow_unauthenticated());
        if file {
            server.token_key_file(&key).router()
        } else {
            server.router()
        }
    };
    let body = serde_json::to_vec(&json!({ "agent": "demo", "message": "weather in Porto" }))?;
    let started = router(true)?
        .oneshot(
            Request::post("/start")
                .header("content-type", "application/json")
                .header("content-length", body.len())
                .body(Body::from(body))?,
        )
        .await?;
    assert_eq!(started.status(), StatusCode::ACCEPTED);
    let started: serde_json::Value =
        serde_json::from_slice(&axum::body::to_bytes(started.into_body(), usize::MAX).await?)?;
    let (id, token) = (
        started["session_id"].as_str().unwrap_or_default(),
        started["token"].as_str().unwrap_or_default(),
    );
    assert!(key.exists(), "the key file was not created");
    for (file, expected) in [(true, StatusCode::OK), (false, StatusCode::UNAUTHORIZED)] {
        let status = router(file)?
            .oneshot(
                Request::get(format!("/status?session_id={id}"))
                    .header("authorization", format!("Bearer {token}"))
                    .body(Body::empty())?,
            )
            .await?;
        assert_eq!(status.status(), expected, "key file: {file}");
    }
    runtime.shutdown().await?;
    Ok(())
}

/// `GET /inbox` lists every session's waiting calls: an operator only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_is_for_operators_only() -> anyhow::Result<()> {
    let runtime = demo_runtime(Arc::new(SledStore::temporary()?))?;
    let server = serve(runtime, key_hook(), ServerConfig::default()).await?;
    let start = json!({ "agent": "demo", "message": "weather in Porto" });
    let started = server
        .http
        .post(server.url("/start"))
        .header("x-api-key", "app")
        .json(&start)
        .send()
        .await?;
    let (code, started) = answer(started).await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{started}");
    let session = started["session_id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    server.runtime.wait_settled(&session.parse()?).await;
    let get = |key: Option<&'static str>, path: &'static str| {
        let mut request = server.http.get(server.url(path));
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        request.send()
    };
    let (code, _) = answer(get(None, "/inbox").await?).await?;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    let (code, refused) = answer(get(Some("app"), "/inbox").await?).await?;
    assert_eq!(
        (code, refused["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("operator_only"))
    );
    let (code, inbox) = answer(get(Some("ops"), "/inbox?kind=client&limit=10").await?).await?;
    assert_eq!(code, StatusCode::OK, "{inbox}");
    assert_eq!(inbox["items"][0]["session"], session.as_str(), "{inbox}");
    assert_eq!(inbox["items"][0]["tool_name"], "ask_user");
    assert!(inbox["next"].is_null());
    let (code, bad) = answer(get(Some("ops"), "/inbox?after=zz").await?).await?;
    assert_eq!(
        (code, bad["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_cursor"))
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}

/// `POST /token` hands a session's token to an operator only (the page's inbox opens a
/// conversation with it), and only for a session that exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_token_is_handed_to_an_operator_only() -> anyhow::Result<()> {
    let runtime = demo_runtime(Arc::new(SledStore::temporary()?))?;
    let server = serve(runtime, key_hook(), ServerConfig::default()).await?;
    let started = server
        .http
        .post(server.url("/start"))
        .header("x-api-key", "app")
        .json(&json!({ "agent": "demo", "message": "weather in Porto" }))
        .send()
        .await?;
    let (code, started) = answer(started).await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{started}");
    let session = started["session_id"].clone();
    let ask = |key: &'static str, session: serde_json::Value| {
        server
            .http
            .post(server.url("/token"))
            .header("x-api-key", key)
            .json(&json!({ "session_id": session }))
            .send()
    };
    let (code, refused) = answer(ask("app", session.clone()).await?).await?;
    assert_eq!(
        (code, refused["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("operator_only"))
    );
    let (code, handed) = answer(ask("ops", session.clone()).await?).await?;
    assert_eq!(code, StatusCode::OK, "{handed}");
    // The very token the session was started with: it opens the session's status.
    assert_eq!(handed["token"], started["token"]);
    let (code, unknown) = answer(ask("ops", json!("no-such-session")).await?).await?;
    assert_eq!(
        (code, unknown["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_session")),
        "{unknown}"
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}
