//! `GET /status` of a root lists the calls its sub-agents wait on too, each with the session
//! that owns it; a submit against the root answers one, and the resume completes the tree.

mod common;

use std::sync::Arc;

use common::serve;
use dormant::{
    AgentDefinition, ModelReply, Runtime, ScriptedLlm, SledStore, ToolCall, ToolDefinition,
};
use dormant_server::{Auth, ServerConfig};
use reqwest::StatusCode;
use serde_json::json;

fn tree_runtime() -> anyhow::Result<Runtime> {
    let lead = AgentDefinition::builder("demo")
        .tool(ToolDefinition::sub_agent("delegate", "helper"))
        .build()?;
    let helper = AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("ask"))
        .build()?;
    let llm = ScriptedLlm::new()
        .script(
            "demo",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new(
                    "d1",
                    "delegate",
                    json!({ "message": "ask the user" }),
                )]),
                ModelReply::text("lead done"),
            ],
        )
        .script(
            "helper",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new("q1", "ask", json!({ "q": "ok?" }))]),
                ModelReply::text("helper done"),
            ],
        );
    Ok(Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(llm))
        .agent(lead)
        .agent(helper)
        .background_deadlines(false)
        .build()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_status_lists_its_sub_agents_calls_and_a_submit_at_the_root_answers_them(
) -> anyhow::Result<()> {
    let server = serve(
        tree_runtime()?,
        Auth::allow_unauthenticated(),
        ServerConfig::default(),
    )
    .await?;
    let session = server.start("go").await?;
    server.events(&session, "").await?;

    let status = server.status(&session).await?;
    assert_eq!(status["status"], "suspended_awaiting_children", "{status}");
    let pending = status["pending"].as_array().cloned().unwrap_or_default();
    assert_eq!(pending.len(), 1, "{status}");
    let child = format!("{}-sub-d1", session.id);
    assert_eq!(
        (
            &pending[0]["session_id"],
            &pending[0]["tool_call_id"],
            &pending[0]["kind"]
        ),
        (&json!(child), &json!("q1"), &json!("client"))
    );
    assert_eq!(pending[0]["waiting"], true);

    let envelope =
        json!({ "session_id": session.id, "tool_call_id": "q1", "result": { "yes": true } });
    let (code, body) = server.submit(&session, &envelope).await?;
    assert_eq!(
        (code, &body["code"]),
        (StatusCode::OK, &json!("accepted")),
        "{body}"
    );
    let status = server.status(&session).await?;
    assert_eq!(status["pending"][0]["answered"], true, "{status}");

    let (code, body) = server.resume(&session).await?;
    assert!(code.is_success(), "{code} {body}");
    let from = body["from_seq"].as_u64().unwrap_or(0);
    server.events(&session, &format!("&from={from}")).await?;
    let done = server.status(&session).await?;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["pending"], json!([]), "{done}");
    server.stop().await?.shutdown().await?;
    Ok(())
}
