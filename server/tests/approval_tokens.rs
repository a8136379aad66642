//! Signed approval tokens (issue 32, item 4): a token for one waiting approval, issued to
//! whoever may act on its session, shows the holder what it approves and decides it with no
//! other credential — once, before the call's deadline, and for nothing else.

mod common;

use std::sync::Arc;

use dormant::{
    AgentDefinition, Approval, ManualClock, ModelReply, Runtime, ScriptedLlm, SledStore, ToolCall,
    ToolDefinition, ToolError,
};
use dormant_server::{Auth, ServerConfig};
use reqwest::StatusCode;
use serde_json::{json, Value};

use common::{answer, text, Session, TestServer};

const OPERATOR: &str = "an-operator-key-of-some-length";

/// `ops` asks to approve `send` (editable, input `{to: string}`) and, with `pick`, asks the
/// client `pick` in the same step.
async fn server(clock: &ManualClock, pick: bool) -> anyhow::Result<TestServer> {
    let send = ToolDefinition::server("send", |input: Value, _ctx| async move {
        Ok::<_, ToolError>(json!({ "sent_to": input["to"] }))
    })
    .description("Sends the note.")
    .input_schema(json!({ "type": "object", "required": ["to"],
                          "properties": { "to": { "type": "string" } } }))
    .require_approval(Approval::Editable);
    let ops = AgentDefinition::builder("ops")
        .tool(send)
        .tool(ToolDefinition::client("pick"))
        .client_tool_timeout_ms(60_000)
        .build()?;
    let mut calls = vec![ToolCall::new("s-1", "send", json!({ "to": "ana" }))];
    if pick {
        calls.push(ToolCall::new("p-1", "pick", json!({})));
    }
    let llm = ScriptedLlm::new().script(
        "ops",
        vec![ModelReply::tool_calls(calls), ModelReply::text("done")],
    );
    let runtime = Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(llm))
        .clock(Arc::new(clock.clone()))
        .background_deadlines(false)
        .agent(ops)
        .build()?;
    common::serve(runtime, Auth::api_key(OPERATOR), ServerConfig::default()).await
}

async fn started(server: &TestServer) -> anyhow::Result<Session> {
    let response = server
        .http
        .post(server.url("/start"))
        .header("x-api-key", OPERATOR)
        .json(&json!({ "agent": "ops", "message": "send it" }))
        .send()
        .await?;
    let (code, body) = answer(response).await?;
    anyhow::ensure!(code == StatusCode::ACCEPTED, "{body}");
    let session = Session {
        id: text(&body, "session_id")?,
        token: text(&body, "token")?,
        started: body,
    };
    server.runtime.wait_tree_settled(&session.id.parse()?).await;
    Ok(session)
}

/// `POST /approval-token` with the session's own token.
async fn token_for(
    server: &TestServer,
    session: &Session,
    call: &str,
) -> anyhow::Result<(StatusCode, Value)> {
    let response = server
        .http
        .post(server.url("/approval-token"))
        .bearer_auth(&session.token)
        .json(&json!({ "session_id": session.id, "tool_call_id": call }))
        .send()
        .await?;
    answer(response).await
}

/// `POST /approval` with nothing but the token.
async fn decide(server: &TestServer, decision: Value) -> anyhow::Result<(StatusCode, Value)> {
    let response = server
        .http
        .post(server.url("/approval"))
        .json(&decision)
        .send()
        .await?;
    answer(response).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_shows_and_decides_one_approval_once_with_no_other_credential() -> anyhow::Result<()>
{
    let clock = ManualClock::new(1_000);
    let server = server(&clock, true).await?;
    let session = started(&server).await?;

    let (code, issued) = token_for(&server, &session, "s-1").await?;
    assert_eq!(code, StatusCode::CREATED, "{issued}");
    let token = text(&issued, "token")?;
    assert_eq!(issued["expires_at_ms"], 61_000);

    // What it approves, for the device to show: no other credential.
    let response = server
        .http
        .get(server.url("/approval"))
        .query(&[("token", token.as_str())])
        .send()
        .await?;
    let (code, shown) = answer(response).await?;
    assert_eq!(code, StatusCode::OK, "{shown}");
    assert_eq!(shown["tool_name"], "send");
    assert_eq!(shown["description"], "Sends the note.");
    assert_eq!(shown["input"], json!({ "to": "ana" }));
    assert_eq!(shown["editable"], true);
    assert_eq!(shown["waiting"], true);

    // An altered token is refused; so is an edit that does not fit the input schema.
    let (code, refused) = decide(
        &server,
        json!({ "token": format!("{token}0"), "approved": true }),
    )
    .await?;
    assert_eq!(
        (code, refused["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("invalid_token"))
    );
    let (code, refused) = decide(
        &server,
        json!({ "token": token, "approved": true, "edited_input": { "to": 7 } }),
    )
    .await?;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");

    let (code, accepted) = decide(
        &server,
        json!({ "token": token, "approved": true, "edited_input": { "to": "bo" } }),
    )
    .await?;
    assert_eq!(code, StatusCode::OK, "{accepted}");
    // Once: the call has its decision.
    let (code, again) = decide(&server, json!({ "token": token, "approved": false })).await?;
    assert_eq!(
        (code, again["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_completed"))
    );

    // A client call has no token; another session's token gets none.
    let (code, refused) = token_for(&server, &session, "p-1").await?;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{refused}");
    let other = started(&server).await?;
    let response = server
        .http
        .post(server.url("/approval-token"))
        .bearer_auth(&other.token)
        .json(&json!({ "session_id": session.id, "tool_call_id": "s-1" }))
        .send()
        .await?;
    assert_eq!(answer(response).await?.0, StatusCode::FORBIDDEN);

    // The tool ran with the edit once the run goes on.
    let answered = json!({ "session_id": session.id, "tool_call_id": "p-1", "result": "x" });
    let (code, body) = server.submit(&session, &answered).await?;
    assert_eq!(code, StatusCode::OK, "{body}");
    let id: dormant::SessionId = session.id.parse()?;
    let done = server.runtime.resume(&id).await?;
    assert_eq!(done.status, dormant::Status::Completed);
    let ran = server.runtime.messages(&id).await?.into_iter().any(|message| {
        matches!(message, dormant::Message::Tool { outcome: dormant::types::ToolOutcome::Result(value), .. }
                 if value == json!({ "sent_to": "bo" }))
    });
    assert!(ran, "send ran with the edited input");
    server.stop().await?.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_expires_with_its_call() -> anyhow::Result<()> {
    let clock = ManualClock::new(1_000);
    let server = server(&clock, true).await?;
    let session = started(&server).await?;
    let (_, issued) = token_for(&server, &session, "s-1").await?;
    let token = text(&issued, "token")?;
    clock.advance(60_000);
    let (code, refused) = decide(&server, json!({ "token": token, "approved": true })).await?;
    assert_eq!(
        (code, refused["code"].as_str()),
        (StatusCode::GONE, Some("token_expired"))
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_on_the_device_moves_the_run_on_when_nothing_else_waits() -> anyhow::Result<()> {
    let clock = ManualClock::new(1_000);
    let server = server(&clock, false).await?;
    let session = started(&server).await?;
    let (_, issued) = token_for(&server, &session, "s-1").await?;
    let token = text(&issued, "token")?;
    let (code, accepted) = decide(&server, json!({ "token": token, "approved": true })).await?;
    assert_eq!(code, StatusCode::OK, "{accepted}");
    let id: dormant::SessionId = session.id.parse()?;
    server.runtime.wait_tree_settled(&id).await;
    assert_eq!(
        server.runtime.status(&id).await?,
        dormant::Status::Completed
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}
