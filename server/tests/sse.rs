//! The stream: resumable from any event id with no gap and no repeat, from `?from=` or
//! `Last-Event-ID` (which wins); ended by the run settling (at once when it had settled
//! before the stream opened), by shutdown, or by idleness; unknown sessions refused. Plus `/healthz` and `/metrics`.

mod common;

use std::time::Duration;

use anyhow::Context;
use common::{answer, demo_server, pending, read_events, text};
use dormant_server::ServerConfig;
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_from_any_event_id_has_no_gap_and_no_repeat() -> anyhow::Result<()> {
    let server = demo_server(ServerConfig::default()).await?;
    let session = server.start("weather in Porto").await?;
    server.events(&session, "").await?;
    // Take the session through to its end so the stream is long.
    let status = server.status(&session).await?;
    let call = text(pending(&status, "client")?, "tool_call_id")?;
    let envelope =
        json!({ "session_id": session.id, "tool_call_id": call, "result": { "answer": "t" } });
    server.submit(&session, &envelope).await?;
    server.resume(&session).await?;
    server.runtime.wait_settled(&session.id.parse()?).await;
    let stored = server.runtime.chunks(&session.id.parse()?, 0).await?;
    let total = stored.len() as u64;
    assert!(total >= 9, "{total} chunks");

    let path = format!(
        "/sse?session_id={}&token={}&until=closed",
        session.id, session.token
    );
    for last in 0..total - 1 {
        // Last-Event-ID wins over from=.
        let response = server
            .http
            .get(server.url(&format!("{path}&from=0")))
            .header("last-event-id", last.to_string())
            .send()
            .await?;
        let events = read_events(response, (total - last - 1) as usize).await?;
        let ids: Vec<u64> = events.iter().filter_map(|event| event.id).collect();
        let expected: Vec<u64> = (last + 1..total).collect();
        assert_eq!(ids, expected, "after {last}");
        for event in &events {
            let seq = event.id.unwrap_or_default();
            let chunk = &stored[seq as usize];
            assert_eq!(event.data, serde_json::to_value(chunk)?, "event {seq}");
            assert_eq!(event.name, chunk.kind.type_name());
        }
    }
    // from= alone.
    let response = server
        .http
        .get(server.url(&format!("{path}&from=3")))
        .send()
        .await?;
    let first = read_events(response, 1).await?;
    assert_eq!(first.first().and_then(|event| event.id), Some(3));
    server.stop().await?.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ends_with_the_reason_and_unknown_sessions_are_refused() -> anyhow::Result<()> {
    let config = ServerConfig::default().sse_idle_timeout(Duration::from_millis(200));
    let server = demo_server(config).await?;
    let session = server.start("weather in Porto").await?;
    server.events(&session, "").await?;
    // Nothing happens on a suspended session: the stream ends as idle.
    let events = server.events(&session, "&from=5&until=closed").await?;
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0].name.as_str(), &events[0].data),
        ("end", &json!({ "reason": "idle" }))
    );

    // Without a token, a session nobody started is refused like any other: the server does
    // not tell which ids exist (an operator gets 404, see tests/auth.rs).
    let (code, body) = answer(server.get("/sse?session_id=ghost", None).await?).await?;
    assert_eq!(code, StatusCode::UNAUTHORIZED, "{body}");

    // Shutdown ends an open stream with its reason, and health says so.
    let (code, health) = answer(server.get("/healthz", None).await?).await?;
    assert_eq!(
        (code, health["status"].as_str()),
        (StatusCode::OK, Some("ok"))
    );
    let path = format!(
        "/sse?session_id={}&token={}&until=closed&from=5",
        session.id, session.token
    );
    let open = server.get(&path, None).await?;
    server.closing.close();
    let events = read_events(open, usize::MAX).await?;
    assert_eq!(
        events.last().map(|event| event.data.clone()),
        Some(json!({ "reason": "shutdown" }))
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}

/// A stream opened after the run settled shows what the client has not seen and ends: it
/// does not wait for a run nobody may start (before, it stayed open until its idle end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_a_settled_run_ends_once_caught_up() -> anyhow::Result<()> {
    // Should the stream wait after all, it ends as idle and the reasons below differ.
    let config = ServerConfig::default().sse_idle_timeout(Duration::from_secs(3));
    let server = demo_server(config).await?;
    let session = server.start("weather in Porto").await?;
    let first_run = server.events(&session, "").await?;
    let total = server.runtime.chunks(&session.id.parse()?, 0).await?.len() as u64;
    let settle = first_run
        .iter()
        .rev()
        .find_map(|event| event.id)
        .ok_or_else(|| anyhow::anyhow!("no chunk in {first_run:?}"))?;
    assert_eq!(
        first_run.last().map(|event| event.name.as_str()),
        Some("end")
    );
    let settled = json!({ "reason": "settled" });

    // Caught up already, by `from` or by Last-Event-ID: the end alone, at once.
    let events = server.events(&session, &format!("&from={total}")).await?;
    let ends: Vec<_> = events.iter().map(|event| (event.id, &event.data)).collect();
    assert_eq!(ends, [(None, &settled)]);
    let path = format!("/sse?session_id={}&token={}", session.id, session.token);
    let response = server
        .http
        .get(server.url(&path))
        .header("last-event-id", settle.to_string())
        .send()
        .await?;
    let events = read_events(response, usize::MAX).await?;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].data, settled);

    // Behind: the chunks it missed, then the end.
    let events = server.events(&session, &format!("&from={settle}")).await?;
    let ids: Vec<_> = events.iter().map(|event| event.id).collect();
    assert_eq!(ids, [Some(settle), None]);
    assert_eq!(events[1].data, settled);

    // The stream a resume points to, when the run still waits and the resume ran nothing.
    let (code, resumed) = server.resume(&session).await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{resumed}");
    assert_eq!(resumed["status"], "suspended_client_tool");
    // Relative to the request's URL (as a browser resolves it), so it holds under a prefix.
    let link = text(&resumed, "stream")?;
    let url = reqwest::Url::parse(&server.url("/resume"))?.join(&link)?;
    let response = server
        .http
        .get(format!("{url}&token={}", session.token))
        .send()
        .await?;
    let events = read_events(response, usize::MAX).await?;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].data, settled);
    server.stop().await?.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_is_kept_alive_until_its_idle_end() -> anyhow::Result<()> {
    // A keep-alive is due every 20 ms of silence; the stream ends after 1.5 s without a
    // chunk, keep-alives or not (long enough that a busy machine still sends one first).
    let config = ServerConfig::default()
        .sse_keep_alive(Duration::from_millis(20))
        .sse_idle_timeout(Duration::from_millis(1_500));
    let server = demo_server(config).await?;
    let session = server.start("weather in Porto").await?;
    server.events(&session, "").await?;
    let path = format!(
        "/sse?session_id={}&token={}&until=closed&from=5",
        session.id, session.token
    );
    let body = server.get(&path, None).await?.text().await?;
    let (before_end, end) = body
        .rsplit_once("event: end\n")
        .ok_or_else(|| anyhow::anyhow!("no end event in {body:?}"))?;
    assert_eq!(end, "data: {\"reason\":\"idle\"}\n\n", "{body:?}");
    assert!(before_end.starts_with("retry: 1000\n\n"), "{body:?}");
    // Only keep-alive comments came between the opening and the end.
    let between = &before_end["retry: 1000\n\n".len()..];
    assert!(!between.is_empty(), "no keep-alive in {body:?}");
    assert!(
        between
            .split_terminator("\n\n")
            .all(|comment| comment == ":"),
        "{body:?}"
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_in_the_prometheus_text_format() -> anyhow::Result<()> {
    let server = demo_server(ServerConfig::default()).await?;
    let session = server.start("weather in Porto").await?;
    server.events(&session, "").await?;
    let response = server.get("/metrics", None).await?;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("text/plain; version=0.0.4")));
    let text = response.text().await?;
    for line in [
        "# TYPE dormant_http_requests_total counter",
        "dormant_http_requests_total{route=\"/start\",status=\"202\"} 1",
        "# TYPE dormant_commit_latency_seconds summary",
        "dormant_http_sse_lag_seconds_count 5",
        "dormant_activations_total 1",
    ] {
        assert!(
            text.lines().any(|got| got == line),
            "no line {line:?} in\n{text}"
        );
    }
    // Every summary has its sum beside its count.
    for summary in text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.strip_suffix(" summary"))
    {
        assert!(
            text.lines()
                .any(|line| line.starts_with(&format!("{summary}_sum"))),
            "no {summary}_sum in
{text}"
        );
    }
    // Every sample line is `name{labels} value` with a number for the value.
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        let value = line.rsplit(' ').next().unwrap_or_default();
        assert!(value.parse::<f64>().is_ok(), "{line}");
    }
    server.stop().await?.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_at_rest_replayed_from_the_start_shows_every_run() -> anyhow::Result<()> {
    let server = demo_server(ServerConfig::default()).await?;
    let session = server.start("weather in Porto").await?;
    server.events(&session, "").await?;
    // The client tool, answered and resumed; then the approval, and the run completes.
    let ask = json!({ "session_id": session.id, "tool_call_id": "ask_user-1",
                      "result": { "answer": "Porto" } });
    let (code, body) = server.submit(&session, &ask).await?;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (_, resumed) = server.resume(&session).await?;
    let from = resumed["from_seq"].as_u64().unwrap_or_default();
    server.events(&session, &format!("&from={from}")).await?;
    let status = server.status(&session).await?;
    let approval = pending(&status, "approval")?;
    let yes = json!({ "kind": "approval-response", "session_id": session.id,
                      "tool_call_id": approval["tool_call_id"],
                      "approval_id": approval["approval_id"], "approved": true });
    let (code, body) = server.submit(&session, &yes).await?;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (_, resumed) = server.resume(&session).await?;
    let from = resumed["from_seq"].as_u64().unwrap_or_default();
    server.events(&session, &format!("&from={from}")).await?;
    let done = server.status(&session).await?;
    assert_eq!(done["status"], "completed", "{done}");

    // Every chunk of the three runs, then the end: not only the first run's.
    let count = done["chunk_count"].as_u64().unwrap_or_default();
    let replayed = server.events(&session, "").await?;
    let ids: Vec<Option<u64>> = replayed.iter().map(|event| event.id).collect();
    let mut expected: Vec<Option<u64>> = (0..count).map(Some).collect();
    expected.push(None);
    assert_eq!(ids, expected);
    let suspensions = replayed
        .iter()
        .filter(|event| event.name == "run_suspended")
        .count();
    assert_eq!(suspensions, 2);
    server.stop().await?.shutdown().await?;
    Ok(())
}

/// A stream that follows a session to its next settle, replayed from before the run it
/// follows began, shows that run to its end: an earlier run's settle on the way is history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_replayed_from_an_earlier_run_ends_at_the_settle_it_follows() -> anyhow::Result<()>
{
    let builder = dormant::Runtime::builder()
        .store(std::sync::Arc::new(dormant::SledStore::temporary()?))
        .background_deadlines(false)
        .auto_resume(true);
    let runtime = dormant_server::demo::configure(builder)?.build()?;
    let server = common::serve(
        runtime,
        dormant_server::Auth::allow_unauthenticated(),
        ServerConfig::default(),
    )
    .await?;
    let session = server.start("weather in Porto").await?;
    let id: dormant::SessionId = session.id.parse()?;
    server.runtime.wait_settled(&id).await;
    let first_run = server.runtime.chunks(&id, 0).await?.len() as u64;
    // Suspended on its client tool, resumed by the runtime once answered: the stream waits
    // for that resume's settle, from the start of the session's first run.
    let path = format!("/sse?session_id={}&token={}", session.id, session.token);
    let mut reader = common::EventReader::new(server.get(&path, None).await?);
    let mut events = Vec::new();
    while let Some(event) = reader.next().await? {
        let caught_up = event.id == Some(first_run - 1);
        events.push(event);
        if caught_up {
            break;
        }
    }
    let ask = json!({ "session_id": session.id, "tool_call_id": "ask_user-1",
                      "result": { "answer": "Porto" } });
    let (code, body) = server.submit(&session, &ask).await?;
    assert_eq!(code, StatusCode::OK, "{body}");
    while let Some(event) = reader.next().await? {
        if event.name != "delta" {
            events.push(event);
        }
    }
    let names: Vec<&str> = events.iter().map(|event| event.name.as_str()).collect();
    assert_eq!(
        names
            .iter()
            .filter(|name| **name == "run_suspended")
            .count(),
        2,
        "the first run's suspension, then the resumed run's (on its approval): {names:?}"
    );
    assert_eq!(names.last(), Some(&"end"), "{names:?}");
    server.stop().await?.shutdown().await?;
    Ok(())
}

/// A router made with `dormant_server::router` (which lets its `Server`, and so the switch
/// that closes its streams, go) keeps its streams open: a stream waiting for more gets the
/// chunks of a run that starts later, not an `end` as at a shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_made_without_its_server_keeps_its_streams_open() -> anyhow::Result<()> {
    let store = std::sync::Arc::new(dormant::SledStore::temporary()?);
    let runtime = common::demo_runtime(store)?;
    let app = dormant_server::router(
        runtime.clone(),
        dormant_server::Auth::allow_unauthenticated(),
    )?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let served = tokio::spawn(async move { axum::serve(listener, app).await });
    let http = reqwest::Client::new();
    let started = http
        .post(format!("{base}/start"))
        .json(&json!({ "agent": "demo", "message": "weather in Porto" }))
        .send()
        .await?;
    let (status, started) = answer(started).await?;
    assert_eq!(status, StatusCode::ACCEPTED, "{started}");
    let (id, token) = (text(&started, "session_id")?, text(&started, "token")?);
    let session: dormant::SessionId = id.parse()?;
    runtime.wait_settled(&session).await;
    let stored = runtime.chunks(&session, 0).await?.len();

    let response = http
        .get(format!("{base}/sse?session_id={id}&until=closed"))
        .bearer_auth(&token)
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::OK);
    let mut events = common::EventReader::new(response);
    let mut seen = 0;
    while seen < stored {
        match events.next().await? {
            Some(event) if event.id.is_some() => seen += 1,
            Some(event) if event.name == "delta" => {}
            other => anyhow::bail!("after {seen} of {stored} stored chunks: {other:?}"),
        }
    }
    let status = http
        .get(format!("{base}/status?session_id={id}"))
        .bearer_auth(&token)
        .send()
        .await?;
    let (_, status) = answer(status).await?;
    let call = text(pending(&status, "client")?, "tool_call_id")?;
    let envelope = json!({ "session_id": id, "tool_call_id": call, "result": { "answer": "t" } });
    let submitted = http
        .post(format!("{base}/submit-tool-result?resume=true"))
        .bearer_auth(&token)
        .json(&envelope)
        .send()
        .await?;
    assert_eq!(submitted.status(), StatusCode::OK);
    let next = loop {
        match events.next().await? {
            Some(event) if event.name == "delta" => {}
            other => break other,
        }
    };
    let next = next.context("the stream ended")?;
    assert_eq!(
        next.id,
        Some(stored as u64),
        "the resumed run's first chunk: {next:?}"
    );
    served.abort();
    runtime.shutdown().await?;
    Ok(())
}
