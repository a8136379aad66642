//! Checkpoints, the state at one and forks over HTTP: `GET /checkpoints`, `GET /state`,
//! `POST /fork` (the fork gets a token of its own).

mod common;

use common::{answer, demo_server, text, Session};
use dormant_server::ServerConfig;
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_session_is_read_at_a_checkpoint_and_forked_over_http() -> anyhow::Result<()> {
    let server = demo_server(ServerConfig::default()).await?;
    let source = server.start("weather in Porto").await?;
    server.events(&source, "").await?;
    assert_eq!(
        server.status(&source).await?["status"],
        "suspended_client_tool"
    );

    let path = format!("/checkpoints?session_id={}", source.id);
    let (code, listed) = answer(server.get(&path, Some(&source.token)).await?).await?;
    assert_eq!(code, StatusCode::OK, "{listed}");
    let checkpoints = listed["checkpoints"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("no list: {listed}"))?;
    let last = checkpoints
        .last()
        .ok_or_else(|| anyhow::anyhow!("no checkpoint: {listed}"))?;
    assert_eq!(last["status"], "suspended_client_tool");
    let id = last["id"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("no id: {last}"))?;

    let path = format!("/state?session_id={}&checkpoint={id}", source.id);
    let (code, state) = answer(server.get(&path, Some(&source.token)).await?).await?;
    assert_eq!(code, StatusCode::OK, "{state}");
    assert_eq!(state["state"]["record"]["status"], "suspended_client_tool");
    let open = &state["state"]["checkpoint"]["open_calls"];
    assert_eq!(open.as_array().map(Vec::len), Some(1), "{state}");
    let path = format!("/state?session_id={}&checkpoint=9999", source.id);
    let (code, missing) = answer(server.get(&path, Some(&source.token)).await?).await?;
    assert_eq!(
        (code, missing["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_checkpoint"))
    );

    let body = json!({ "session_id": source.id, "checkpoint": id });
    let (code, forked) = answer(server.post("/fork", Some(&source.token), &body).await?).await?;
    assert_eq!(code, StatusCode::CREATED, "{forked}");
    assert_eq!(forked["status"], "suspended_client_tool");
    assert_eq!(
        forked["forked_from"],
        json!({ "session": source.id, "checkpoint": id })
    );
    let fork = Session {
        id: text(&forked, "session_id")?,
        token: text(&forked, "token")?,
        started: forked.clone(),
    };
    assert_ne!(fork.id, source.id);
    assert_ne!(fork.token, source.token);
    let status = server.status(&fork).await?;
    assert_eq!(status["status"], "suspended_client_tool");
    assert_eq!(
        status["forked_from"],
        json!({ "session": source.id, "checkpoint": id })
    );
    assert_eq!(
        status["pending"].as_array().map(Vec::len),
        Some(1),
        "{status}"
    );

    // A fork with another answer for the waiting call goes on with it.
    let call = text(&status["pending"][0], "tool_call_id")?;
    let body = json!({ "session_id": source.id, "checkpoint": id,
                       "answers": [{ "tool_call_id": call, "result": { "answer": "Forked" } }] });
    let (code, answered) = answer(server.post("/fork", Some(&source.token), &body).await?).await?;
    assert_eq!(code, StatusCode::CREATED, "{answered}");
    // The run went on to its next wait: the approval of the publication of that answer.
    let answered = Session {
        id: text(&answered, "session_id")?,
        token: text(&answered, "token")?,
        started: answered.clone(),
    };
    let status = server.status(&answered).await?;
    assert_eq!(status["pending"][0]["tool_name"], "publish", "{status}");
    let wrong = json!({ "session_id": source.id, "checkpoint": id,
                        "answers": [{ "tool_call_id": call, "result": { "title": "x" } }] });
    let (code, refused) = answer(server.post("/fork", Some(&source.token), &wrong).await?).await?;
    assert_eq!(
        (code, refused["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("fork_refused")),
        "{refused}"
    );
    let body = json!({ "session_id": source.id, "checkpoint": id,
                       "answers": [{ "tool_call_id": call, "result": 1, "error": "both" }] });
    let (code, refused) = answer(server.post("/fork", Some(&source.token), &body).await?).await?;
    assert_eq!(
        (code, refused["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request")),
        "{refused}"
    );

    // Refusals keep their codes.
    let body = json!({ "session_id": source.id, "checkpoint": 9999 });
    let (code, refused) = answer(server.post("/fork", Some(&source.token), &body).await?).await?;
    assert_eq!(
        (code, refused["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown_checkpoint"))
    );
    let body =
        json!({ "session_id": source.id, "checkpoint": id, "message": "a", "edit_message": "b" });
    let (code, refused) = answer(server.post("/fork", Some(&source.token), &body).await?).await?;
    assert_eq!(
        (code, refused["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("fork_refused"))
    );
    let body = json!({ "session_id": source.id, "checkpoint": id, "surprise": true });
    let (code, _) = answer(server.post("/fork", Some(&source.token), &body).await?).await?;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    server.stop().await?;
    Ok(())
}
