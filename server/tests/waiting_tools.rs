//! What a person's side learns of each waiting call from `GET /status` and `GET /inbox`: its
//! tool's description and schemas, whether its approval allows edits, and the approval's
//! binding; a sub-agent's call is described by its own agent's tool.

mod common;

use std::sync::Arc;

use dormant::{
    AgentDefinition, Approval, ModelReply, Runtime, ScriptedLlm, SledStore, ToolCall,
    ToolDefinition, ToolError,
};
use dormant_server::{Auth, ServerConfig};
use reqwest::StatusCode;
use serde_json::{json, Value};

use common::{answer, text, Session, TestServer};

fn pick_schema() -> Value {
    json!({ "type": "object", "required": ["colour"],
            "properties": { "colour": { "enum": ["red", "blue"] } } })
}

fn send_schema() -> Value {
    json!({ "type": "object", "required": ["to"], "properties": { "to": { "type": "string" } } })
}

/// `desk` asks `pick` (a client tool with an output schema) and `send` (an editable approval)
/// at once, and hands a task to `helper`, whose `confirm` has neither schema nor description.
async fn server() -> anyhow::Result<TestServer> {
    let llm = ScriptedLlm::new()
        .script(
            "desk",
            vec![ModelReply::tool_calls(vec![
                ToolCall::new("p-1", "pick", json!({ "prompt": "a colour" })),
                ToolCall::new("s-1", "send", json!({ "to": "ana" })),
                ToolCall::new("h-1", "helper", json!({ "message": "go" })),
            ])],
        )
        .script(
            "helper",
            vec![ModelReply::tool_calls(vec![ToolCall::new(
                "c-1",
                "confirm",
                json!({}),
            )])],
        );
    let desk = AgentDefinition::builder("desk")
        .tool(
            ToolDefinition::client("pick")
                .description("Picks a colour.")
                .output_schema(pick_schema()),
        )
        .tool(
            ToolDefinition::server("send", |input, _ctx| async move {
                Ok::<_, ToolError>(json!({ "sent": input }))
            })
            .description("Sends a note.")
            .input_schema(send_schema())
            .require_approval(Approval::Editable),
        )
        .tool(ToolDefinition::sub_agent("helper", "helper"))
        .build()?;
    let helper = AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("confirm"))
        .build()?;
    let runtime = Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(llm))
        .background_deadlines(false)
        .agent(desk)
        .agent(helper)
        .build()?;
    common::serve(
        runtime,
        Auth::api_key("an-operator-key-of-some-length"),
        ServerConfig::default(),
    )
    .await
}

async fn started(server: &TestServer) -> anyhow::Result<Session> {
    let response = server
        .http
        .post(server.url("/start"))
        .header("x-api-key", "an-operator-key-of-some-length")
        .json(&json!({ "agent": "desk", "message": "go" }))
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

fn by_tool<'a>(calls: &'a Value, tool: &str) -> anyhow::Result<&'a Value> {
    calls
        .as_array()
        .and_then(|calls| calls.iter().find(|call| call["tool_name"] == tool))
        .ok_or_else(|| anyhow::anyhow!("no {tool} in {calls}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_describes_each_waiting_call_by_its_tool() -> anyhow::Result<()> {
    let server = server().await?;
    let session = started(&server).await?;
    let status = server.status(&session).await?;
    let pending = &status["pending"];

    let pick = by_tool(pending, "pick")?;
    assert_eq!(pick["description"], "Picks a colour.");
    assert_eq!(pick["output_schema"], pick_schema());
    // A client tool has no binding, and no edits.
    assert!(
        pick.get("binding").is_none() && pick.get("editable").is_none(),
        "{pick}"
    );

    let send = by_tool(pending, "send")?;
    assert_eq!(send["description"], "Sends a note.");
    assert_eq!(send["input_schema"], send_schema());
    assert_eq!(send["editable"], true);
    let binding = text(send, "binding")?;
    assert_eq!(binding.len(), 64, "a hex SHA-256: {binding}");

    // The sub-agent's call, of a tool with neither description nor schema: nothing made up.
    let confirm = by_tool(pending, "confirm")?;
    assert_ne!(confirm["session_id"], session.id.as_str());
    for absent in [
        "description",
        "input_schema",
        "output_schema",
        "editable",
        "binding",
    ] {
        assert!(confirm.get(absent).is_none(), "{absent} in {confirm}");
    }

    // The binding is the one the decision must name: another is refused, this one taken.
    let approval_id = text(send, "approval_id")?;
    let decide = |binding: &str| {
        json!({ "kind": "approval-response", "session_id": session.id, "tool_call_id": "s-1",
                "approval_id": approval_id, "approved": true, "binding": binding })
    };
    let (code, refused) = server.submit(&session, &decide(&"0".repeat(64))).await?;
    assert_eq!(
        (code, refused["code"].as_str()),
        (StatusCode::CONFLICT, Some("stale_approval"))
    );
    let (code, accepted) = server.submit(&session, &decide(&binding)).await?;
    assert_eq!(code, StatusCode::OK, "{accepted}");
    server.stop().await?.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_says_what_a_result_must_match_and_which_approvals_allow_edits(
) -> anyhow::Result<()> {
    let server = server().await?;
    started(&server).await?;
    let response = server
        .http
        .get(server.url("/inbox"))
        .header("x-api-key", "an-operator-key-of-some-length")
        .send()
        .await?;
    let (code, inbox) = answer(response).await?;
    assert_eq!(code, StatusCode::OK, "{inbox}");
    let items = &inbox["items"];
    let pick = by_tool(items, "pick")?;
    assert_eq!(pick["output_schema"], pick_schema());
    assert_eq!(pick["editable"], false);
    let send = by_tool(items, "send")?;
    assert_eq!(send["editable"], true);
    assert_eq!(send["input_schema"], send_schema());
    assert_eq!(send["description"], "Sends a note.");
    let confirm = by_tool(items, "confirm")?;
    assert_eq!(confirm["agent"], "helper");
    assert!(confirm["output_schema"].is_null() && confirm["description"].is_null());
    server.stop().await?.shutdown().await?;
    Ok(())
}
