//! Every route through a whole run of the demo agent: start, the stream to the client call,
//! status, submit (and each of its refusals), resume, the approval, the end; runs and
//! messages; interrupt and abort.

mod common;

use common::{answer, demo_server, pending, text};
use dormant_server::ServerConfig;
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_goes_through_a_client_tool_and_an_approval_over_http() -> anyhow::Result<()> {
    let server = demo_server(ServerConfig::default()).await?;
    let session = server.start("weather in Porto").await?;
    assert_eq!(session.started["from_seq"], 0);
    assert!(session.token.starts_with("dst1."));

    // The stream shows the client call and ends with the suspension.
    let events = server.events(&session, "").await?;
    let names: Vec<&str> = events.iter().map(|event| event.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "run_start",
            "tool_start",
            "tool_end",
            "tool_start",
            "run_suspended",
            "end"
        ]
    );
    let ids: Vec<Option<u64>> = events.iter().map(|event| event.id).collect();
    assert_eq!(ids, [Some(0), Some(1), Some(2), Some(3), Some(4), None]);
    assert_eq!(events[5].data, json!({ "reason": "settled" }));

    let status = server.status(&session).await?;
    assert_eq!(status["status"], "suspended_client_tool");
    let ask = pending(&status, "client")?;
    assert_eq!(ask["tool_name"], "ask_user");
    assert_eq!(ask["waiting"], true);
    assert!(ask["deadline_at_ms"].as_u64().is_some());
    let call = text(ask, "tool_call_id")?;
    // The run's usage: two model calls (the demo model reports no tokens), the weather
    // lookup's result; the client call has none yet.
    assert_eq!(status["usage"]["model_calls"], 2, "{status}");
    assert_eq!(status["usage"]["tool_calls"], 1, "{status}");
    assert_eq!(status["usage"]["tokens"]["input_tokens"], 0, "{status}");

    // Each refusal of a submit has its status and stable code, and changes nothing.
    let wrong =
        json!({ "session_id": session.id, "tool_call_id": call, "result": { "title": "x" } });
    let (code, body) = server.submit(&session, &wrong).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_result"))
    );
    assert!(
        body["errors"]
            .as_array()
            .is_some_and(|errors| !errors.is_empty()),
        "{body}"
    );
    let unknown =
        json!({ "session_id": session.id, "tool_call_id": "nope", "result": { "answer": "x" } });
    let (code, body) = server.submit(&session, &unknown).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_tool_call"))
    );
    let malformed = json!({ "session_id": session.id, "tool_call_id": call });
    let (code, body) = server.submit(&session, &malformed).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
    let as_approval = json!({ "kind": "approval-response", "session_id": session.id, "tool_call_id": call,
        "approval_id": "x::y", "approved": true });
    let (code, body) = server.submit(&session, &as_approval).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_result"))
    );

    let answer_it = json!({ "session_id": session.id, "tool_call_id": call, "result": { "answer": "Porto in the sun" } });
    let (code, body) = server.submit(&session, &answer_it).await?;
    assert_eq!(
        (code, body),
        (StatusCode::OK, json!({ "code": "accepted" }))
    );
    let (code, body) = server.submit(&session, &answer_it).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_completed"))
    );

    // The resume runs to the approval gate.
    let (code, resumed) = server.resume(&session).await?;
    assert_eq!(code, StatusCode::ACCEPTED);
    let from = resumed["from_seq"].as_u64().unwrap_or_default();
    assert_eq!(from, 5);
    let events = server.events(&session, &format!("&from={from}")).await?;
    assert_eq!(events.first().and_then(|event| event.id), Some(from));
    assert!(events
        .iter()
        .any(|event| event.name == "tool_approval_request"));
    let status = server.status(&session).await?;
    let gate = pending(&status, "approval")?;
    assert_eq!(gate["tool_name"], "publish");
    assert_eq!(gate["input"]["title"], "Porto in the sun");
    let approval = json!({ "kind": "approval-response", "session_id": session.id,
        "tool_call_id": text(gate, "tool_call_id")?, "approval_id": text(gate, "approval_id")?,
        "approved": true, "reason": "looks right" });
    let (code, _) = server.submit(&session, &approval).await?;
    assert_eq!(code, StatusCode::OK);
    let (code, resumed) = server.resume(&session).await?;
    assert_eq!(code, StatusCode::ACCEPTED);
    let events = server
        .events(&session, &format!("&from={}", resumed["from_seq"]))
        .await?;
    let end = events
        .iter()
        .rev()
        .find(|event| event.name == "run_end")
        .map(|event| event.data["kind"]["status"].clone());
    assert_eq!(end, Some(json!("completed")));

    // Nothing is left to resume.
    let (code, body) = server.resume(&session).await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("not_resumable"))
    );

    let (code, runs) = answer(
        server
            .get(
                &format!("/runs?session_id={}", session.id),
                Some(&session.token),
            )
            .await?,
    )
    .await?;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(runs["runs"].as_array().map(Vec::len), Some(3));
    let (code, messages) = answer(
        server
            .get(
                &format!("/messages?session_id={}", session.id),
                Some(&session.token),
            )
            .await?,
    )
    .await?;
    assert_eq!(code, StatusCode::OK);
    let last = messages["messages"]
        .as_array()
        .and_then(|all| all.last())
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        last["text"],
        "Published \"Porto in the sun\" (sunny in Porto, 21 °C)."
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_abort_and_the_runtime_refusals_have_their_codes() -> anyhow::Result<()> {
    let server = demo_server(ServerConfig::default()).await?;
    let session = server.start("weather in Faro").await?;
    server.events(&session, "").await?;
    let body = json!({ "session_id": session.id });

    let (code, interrupted) = answer(
        server
            .post("/interrupt", Some(&session.token), &body)
            .await?,
    )
    .await?;
    assert_eq!(
        (code, interrupted["status"].as_str()),
        (StatusCode::OK, Some("interrupted"))
    );
    // The interrupt dropped the call: a late answer finds nothing.
    let late = json!({ "session_id": session.id, "tool_call_id": "ask_user-1", "result": { "answer": "x" } });
    let (code, _) = server.submit(&session, &late).await?;
    assert_eq!(code, StatusCode::NOT_FOUND);

    let (code, aborted) = answer(server.post("/abort", Some(&session.token), &body).await?).await?;
    assert_eq!(
        (code, aborted["aborted"].as_bool()),
        (StatusCode::OK, Some(true))
    );
    let (code, refused) = server.resume(&session).await?;
    assert_eq!(
        (code, refused["code"].as_str()),
        (StatusCode::CONFLICT, Some("aborted"))
    );
    // A new turn of an aborted session is refused too (with its token).
    let again = json!({ "agent": "demo", "message": "again", "session_id": session.id });
    let (code, refused) =
        answer(server.post("/start", Some(&session.token), &again).await?).await?;
    assert_eq!(
        (code, refused["code"].as_str()),
        (StatusCode::CONFLICT, Some("aborted"))
    );

    let nobody = json!({ "agent": "nobody", "message": "hi" });
    let (code, refused) = answer(server.post("/start", None, &nobody).await?).await?;
    assert_eq!(
        (code, refused["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_agent"))
    );

    let (code, missing) = answer(server.get("/nowhere", None).await?).await?;
    assert_eq!(
        (code, missing["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_turn_of_a_session_takes_its_token_and_the_stream_can_stay_open() -> anyhow::Result<()>
{
    let server = demo_server(ServerConfig::default()).await?;
    let first = server
        .post(
            "/start",
            None,
            &json!({ "agent": "demo", "message": "echo one" }),
        )
        .await?;
    let (code, first) = answer(first).await?;
    assert_eq!(code, StatusCode::ACCEPTED);
    let session = common::Session {
        id: text(&first, "session_id")?,
        token: text(&first, "token")?,
        started: first,
    };
    // Open a stream that stays open across turns, then start the second turn.
    let path = format!(
        "/sse?session_id={}&token={}&until=closed",
        session.id, session.token
    );
    let stream = server.get(&path, None).await?;
    let again = json!({ "agent": "demo", "message": "echo two", "session_id": session.id });
    let (code, second) = answer(server.post("/start", Some(&session.token), &again).await?).await?;
    assert_eq!(code, StatusCode::ACCEPTED);
    assert_eq!(second["token"], session.token.as_str());
    // Two turns: run_start, text, run_end each, in one stream that did not end between them
    // (with the demo model's deltas before each text, when the stream was there to see them).
    let events = common::read_events(stream, 6).await?;
    let names: Vec<&str> = events.iter().map(|event| event.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "run_start",
            "text",
            "run_end",
            "run_start",
            "text",
            "run_end"
        ]
    );
    assert_eq!(events[4].data["kind"]["text"], "two");
    server.stop().await?.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_and_the_last_answer_can_answer_with_the_runs_stream() -> anyhow::Result<()> {
    let server = demo_server(ServerConfig::default()).await?;
    // POST /start?stream=true: the start's JSON first, then the run until it settles.
    let response = server
        .post(
            "/start?stream=true",
            None,
            &json!({ "agent": "demo", "message": "weather in Porto" }),
        )
        .await?;
    assert_eq!(response.status(), StatusCode::OK);
    let events = common::read_events(response, usize::MAX).await?;
    let names: Vec<&str> = events.iter().map(|event| event.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "started",
            "run_start",
            "tool_start",
            "tool_end",
            "tool_start",
            "run_suspended",
            "end"
        ]
    );
    assert_eq!(events[0].id, None);
    // The reconnect delay rides on the answer: no event of its own.
    assert_eq!(events[0].retry, Some(1000));
    let session = common::Session {
        id: text(&events[0].data, "session_id")?,
        token: text(&events[0].data, "token")?,
        started: events[0].data.clone(),
    };

    // stream=true alone is refused: it streams the resumed run.
    let answer_it = json!({ "session_id": session.id, "tool_call_id": "ask_user-1", "result": { "answer": "Porto" } });
    let refused = server
        .post(
            "/submit-tool-result?stream=true",
            Some(&session.token),
            &answer_it,
        )
        .await?;
    assert_eq!(answer(refused).await?.0, StatusCode::BAD_REQUEST);

    // The last answer resumes and streams the resumed run to the approval gate.
    let response = server
        .post(
            "/submit-tool-result?resume=true&stream=true",
            Some(&session.token),
            &answer_it,
        )
        .await?;
    let events = common::read_events(response, usize::MAX).await?;
    assert_eq!(events[0].name, "accepted");
    assert_eq!(events[0].data["code"], "accepted");
    assert_eq!(events[0].data["resumed"]["from_seq"], 5);
    assert_eq!(events[1].id, Some(5));
    assert!(events
        .iter()
        .any(|event| event.name == "tool_approval_request"));

    // ?resume=true without a stream: JSON with where the resumed run starts.
    let status = server.status(&session).await?;
    let gate = pending(&status, "approval")?;
    let approve = json!({ "kind": "approval-response", "session_id": session.id,
        "tool_call_id": text(gate, "tool_call_id")?, "approval_id": text(gate, "approval_id")?, "approved": true });
    let (code, body) = answer(
        server
            .post(
                "/submit-tool-result?resume=true",
                Some(&session.token),
                &approve,
            )
            .await?,
    )
    .await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::OK, Some("accepted"))
    );
    let from = body["resumed"]["from_seq"].as_u64().unwrap_or_default();
    let events = server.events(&session, &format!("&from={from}")).await?;
    assert_eq!(
        events.iter().rev().nth(1).map(|event| event.name.as_str()),
        Some("run_end")
    );
    // An answer that is refused resumes nothing: its refusal is the answer.
    let again = json!({ "session_id": session.id, "tool_call_id": "ask_user-1", "result": { "answer": "x" } });
    let (code, body) = answer(
        server
            .post(
                "/submit-tool-result?resume=true",
                Some(&session.token),
                &again,
            )
            .await?,
    )
    .await?;
    assert_eq!(
        (code, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_completed"))
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_resume_that_finds_calls_still_waiting_ends_at_once() -> anyhow::Result<()> {
    use dormant::{AgentDefinition, ModelReply, Runtime, ScriptedLlm, ToolCall, ToolDefinition};
    let llm = ScriptedLlm::new().script(
        "pair",
        vec![
            ModelReply::tool_calls(vec![
                ToolCall::new("a", "ask", json!({})),
                ToolCall::new("b", "ask", json!({})),
            ]),
            ModelReply::text("both answered"),
        ],
    );
    let runtime = Runtime::builder()
        .store(std::sync::Arc::new(dormant::SledStore::temporary()?))
        .llm(std::sync::Arc::new(llm))
        .agent(
            AgentDefinition::builder("pair")
                .tool(ToolDefinition::client("ask"))
                .build()?,
        )
        .build()?;
    let server = common::serve(
        runtime,
        dormant_server::Auth::allow_unauthenticated(),
        ServerConfig::default(),
    )
    .await?;
    let response = server
        .post(
            "/start?stream=true",
            None,
            &json!({ "agent": "pair", "message": "two questions" }),
        )
        .await?;
    let events = common::read_events(response, usize::MAX).await?;
    let (id, token) = (
        text(&events[0].data, "session_id")?,
        text(&events[0].data, "token")?,
    );
    let first = json!({ "session_id": id, "tool_call_id": "a", "result": "one" });
    let response = server
        .post(
            "/submit-tool-result?resume=true&stream=true",
            Some(&token),
            &first,
        )
        .await?;
    // "b" still waits: nothing ran, and the stream ends at once instead of waiting for a run.
    let events = common::read_events(response, usize::MAX).await?;
    let names: Vec<&str> = events.iter().map(|event| event.name.as_str()).collect();
    assert_eq!(names, ["accepted", "end"]);
    assert_eq!(events[0].data["resumed"]["status"], "suspended_client_tool");
    let second = json!({ "session_id": id, "tool_call_id": "b", "result": "two" });
    let response = server
        .post(
            "/submit-tool-result?resume=true&stream=true",
            Some(&token),
            &second,
        )
        .await?;
    let events = common::read_events(response, usize::MAX).await?;
    assert!(
        events.iter().any(|event| event.name == "run_end"),
        "{events:?}"
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn the_metrics_count_each_route_of_the_table_under_its_own_path() -> anyhow::Result<()> {
    let server = demo_server(ServerConfig::default()).await?;
    // Refused (no peer key), but a request of the route all the same.
    let response = server
        .http
        .post(server.url("/peer/follow"))
        .json(&json!({ "session": "x", "from": 0 }))
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let metrics = server
        .http
        .get(server.url("/metrics"))
        .send()
        .await?
        .text()
        .await?;
    assert!(
        metrics.contains("dormant_http_requests_total{route=\"/peer/follow\",status=\"403\"} 1"),
        "{metrics}"
    );
    Ok(())
}
