//! Tools from MCP servers (issue 34, item 1), against two real servers: one written with
//! `rmcp`'s server side in this test, over streamable HTTP, and one on the official Python SDK
//! (`mcp` from PyPI, `tests/mcp/server.py`, over stdio; `.ci/run` installs it into a virtual
//! environment and sets `DORMANT_MCP_PYTHON` to its interpreter). Listed, called, an error
//! result, a refused call, a changed list, the server dying mid-call (a durability error, not
//! sent again), an idempotent call sent again to the restarted server, and a crash of dormant
//! itself with a call in flight, the store reopened.

mod common;
#[path = "mcp/python.rs"]
mod python;
#[path = "mcp/rmcp_server.rs"]
mod rmcp_server;

use python::PythonServer;

use std::sync::Arc;
use std::time::Duration;

use dormant::mcp::{McpError, McpServer, McpTools};
use dormant::store::{CommitKind, Store};
use dormant::testkit::{Fault, FaultyStore};
use dormant::types::{ToolErrorCode, ToolOutcome};
use dormant::{
    AgentDefinition, ManualClock, MemoryStore, ModelReply, Runtime, ScriptedLlm, SessionId,
    SledStore, Status, ToolCall,
};
use serde_json::{json, Value};

/// A runtime over `store` with agent `helper`, whose tools are `tools`' and whose model calls
/// `calls` (id, tool, input) in one step, then says "done".
fn runtime(
    store: Arc<dyn Store>,
    tools: &McpTools,
    calls: &[(&str, &str, Value)],
) -> anyhow::Result<Runtime> {
    let agent = AgentDefinition::builder("helper")
        .tools(tools.definitions())
        .build()?;
    let step = calls
        .iter()
        .map(|(id, tool, input)| ToolCall::new(*id, *tool, input.clone()))
        .collect();
    let llm = ScriptedLlm::new().script(
        "helper",
        vec![ModelReply::tool_calls(step), ModelReply::text("done")],
    );
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(0)))
        .background_deadlines(false)
        .agent(agent)
        .build()?)
}

/// Runs `calls` in a new session and answers each call's outcome, by id.
async fn run(tools: &McpTools, calls: &[(&str, &str, Value)]) -> anyhow::Result<Vec<ToolOutcome>> {
    let runtime = runtime(Arc::new(MemoryStore::new()), tools, calls)?;
    let id: SessionId = "s1".parse()?;
    let outcome = runtime.execute_on(&id, "helper", "go").await?;
    anyhow::ensure!(outcome.status == Status::Completed, "{outcome:?}");
    let messages = runtime.messages(&id).await?;
    runtime.shutdown().await?;
    calls
        .iter()
        .map(|(call, ..)| {
            common::tool_result(&messages, call)
                .cloned()
                .ok_or_else(|| anyhow::anyhow!("no result for {call}"))
        })
        .collect()
}

fn code(outcome: &ToolOutcome) -> Option<ToolErrorCode> {
    outcome.code()
}

#[tokio::test]
async fn rmcp_server_tools_are_listed_with_schemas_and_retry_from_annotations() -> anyhow::Result<()>
{
    let served = rmcp_server::serve().await?;
    let tools = McpTools::connect(McpServer::http("rmcp", served.url).prefix("m_")).await?;
    assert_eq!(
        tools.tool_names(),
        ["add", "fail", "note", "retire", "book", "reserve"]
    );
    let definitions = tools.definitions();
    let add = &definitions[0];
    assert_eq!(add.name(), "m_add");
    assert!(add.is_safe_to_retry(), "read-only: safe to retry");
    assert!(!definitions[2].is_safe_to_retry(), "no annotation: not");
    let agent = AgentDefinition::builder("a").tools(definitions).build()?;
    let spec = agent.tool_specs();
    assert_eq!(spec[0].description, "Adds two integers.");
    assert_eq!(spec[0].input_schema["required"], json!(["a", "b"]));
    Ok(())
}

#[tokio::test]
async fn a_run_calls_rmcp_tools_and_records_results_and_errors() -> anyhow::Result<()> {
    let served = rmcp_server::serve().await?;
    let log = served.log.clone();
    let tools = McpTools::connect(McpServer::http("rmcp", served.url)).await?;
    let outcomes = run(
        &tools,
        &[
            ("c1", "add", json!({ "a": 2, "b": 3 })),
            ("c2", "fail", json!({ "reason": "no disk" })),
        ],
    )
    .await?;
    assert_eq!(outcomes[0], ToolOutcome::Result(json!({ "sum": 5 })));
    assert_eq!(outcomes[1], ToolOutcome::Error("failed: no disk".into()));
    let calls = log.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].tool, "add");
    assert_eq!(calls[0].arguments, json!({ "a": 2, "b": 3 }));
    let key = calls[0].idempotency_key.as_deref().unwrap_or_default();
    assert_eq!(
        key.len(),
        32,
        "the call's idempotency key, in _meta: {key:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_changed_list_is_read_again_and_a_retired_tool_is_refused() -> anyhow::Result<()> {
    let served = rmcp_server::serve().await?;
    let tools = McpTools::connect(McpServer::http("rmcp", served.url)).await?;
    let changed = tools.clone();
    let waiting = tokio::spawn(async move { changed.list_changed().await });
    tokio::task::yield_now().await;
    // `note` is called after `retire`, through the definition from before the change.
    let outcomes = run(
        &tools,
        &[
            ("c1", "retire", json!({ "tool": "note" })),
            ("c2", "note", json!({ "note": "hello" })),
        ],
    )
    .await?;
    assert_eq!(outcomes[0], ToolOutcome::Result(json!("retired")));
    assert_eq!(
        code(&outcomes[1]),
        Some(ToolErrorCode::McpRequestFailed),
        "{:?}",
        outcomes[1]
    );
    tokio::time::timeout(Duration::from_secs(10), waiting).await??;
    assert_eq!(
        tools.tool_names(),
        ["add", "fail", "retire", "book", "reserve"]
    );
    Ok(())
}

#[tokio::test]
async fn an_http_server_that_lost_its_session_is_connected_to_again() -> anyhow::Result<()> {
    let served = rmcp_server::serve().await?;
    let tools = McpTools::connect(McpServer::http("rmcp", served.url.clone())).await?;
    let outcomes = run(&tools, &[("c1", "add", json!({ "a": 1, "b": 2 }))]).await?;
    assert_eq!(outcomes[0], ToolOutcome::Result(json!({ "sum": 3 })));
    served.restart();
    // Safe to retry: sent again on a new session.
    let outcomes = run(&tools, &[("c1", "add", json!({ "a": 2, "b": 2 }))]).await?;
    assert_eq!(outcomes[0], ToolOutcome::Result(json!({ "sum": 4 })));
    // And the connection works for a call that is not.
    let outcomes = run(&tools, &[("c1", "note", json!({ "note": "after" }))]).await?;
    assert_eq!(outcomes[0], ToolOutcome::Result(json!("noted")));
    let tools_called: Vec<String> = served
        .log
        .calls()
        .into_iter()
        .map(|call| call.tool)
        .collect();
    assert_eq!(
        tools_called,
        ["add", "add", "note"],
        "the refused request did not reach the tool"
    );
    Ok(())
}

#[tokio::test]
async fn a_server_that_cannot_start_is_a_typed_error() {
    let server = McpServer::stdio("missing", "/nonexistent/mcp-server")
        .connect_timeout(Duration::from_secs(2));
    let error = McpTools::connect(server).await.err();
    assert!(
        matches!(error, Some(McpError::Connect { ref server, .. }) if server == "missing"),
        "{error:?}"
    );
}

#[tokio::test]
async fn python_server_tools_are_listed_and_called() -> anyhow::Result<()> {
    let Some(python) = PythonServer::start().await? else {
        return Ok(());
    };
    let tools = &python.tools;
    assert_eq!(
        tools.tool_names(),
        ["add", "fail", "write_note", "lookup", "book"]
    );
    let definitions = tools.definitions();
    assert!(definitions[0].is_safe_to_retry(), "readOnlyHint");
    assert!(!definitions[2].is_safe_to_retry(), "no hint");
    assert!(definitions[3].is_safe_to_retry(), "idempotentHint");
    let outcomes = run(
        tools,
        &[
            ("c1", "add", json!({ "a": 2, "b": 3 })),
            ("c2", "fail", json!({ "reason": "nope" })),
        ],
    )
    .await?;
    assert_eq!(outcomes[0], ToolOutcome::Result(json!({ "result": 5 })));
    let ToolOutcome::Error(text) = &outcomes[1] else {
        anyhow::bail!("fail succeeded: {:?}", outcomes[1]);
    };
    assert!(text.contains("nope"), "{text}");
    // The two calls run side by side: the server may take either first.
    let mut logged = python.logged();
    logged.sort();
    assert_eq!(logged, ["add 2 3", "fail nope"]);
    Ok(())
}

#[tokio::test]
async fn a_server_dying_mid_call_is_a_durability_error_not_sent_again_and_the_server_restarts(
) -> anyhow::Result<()> {
    let Some(python) = PythonServer::start().await? else {
        return Ok(());
    };
    let tools = &python.tools;
    let outcomes = run(tools, &[("c1", "write_note", json!({ "note": "crash" }))]).await?;
    assert_eq!(
        code(&outcomes[0]),
        Some(ToolErrorCode::ToolDurabilityError),
        "{:?}",
        outcomes[0]
    );
    // Started again: the next call is answered.
    let outcomes = run(tools, &[("c1", "add", json!({ "a": 1, "b": 1 }))]).await?;
    assert_eq!(outcomes[0], ToolOutcome::Result(json!({ "result": 2 })));
    assert_eq!(
        python.logged(),
        ["write_note crash", "add 1 1"],
        "sent once"
    );
    Ok(())
}

#[tokio::test]
async fn an_idempotent_call_cut_by_the_server_dying_is_sent_to_the_restarted_server(
) -> anyhow::Result<()> {
    let Some(python) = PythonServer::start().await? else {
        return Ok(());
    };
    let tools = &python.tools;
    let outcomes = run(tools, &[("c1", "lookup", json!({ "key": "crash-once" }))]).await?;
    assert_eq!(
        outcomes[0],
        ToolOutcome::Result(json!({ "result": "value of crash-once" }))
    );
    assert_eq!(python.logged(), ["lookup crash-once", "lookup crash-once"]);
    Ok(())
}

/// A crash of dormant itself between the call's dispatch and its result's commit (the
/// result's commit fails, as a killed process's would never happen), then the store reopened
/// by a new runtime: the call is recovered by the durable rules.
async fn crash_then_reopen(
    python: &PythonServer,
    tool: &str,
    input: Value,
) -> anyhow::Result<ToolOutcome> {
    let tools = &python.tools;
    let store_path = python.dir.path().join("store");
    let calls = [("c1", tool, input)];
    let id: SessionId = "s1".parse()?;
    {
        let store: Arc<dyn Store> = Arc::new(SledStore::open(&store_path)?);
        let faulty = Arc::new(FaultyStore::new(store));
        faulty.arm(Fault::CrashBefore(CommitKind::ToolResults));
        let runtime = runtime(faulty.clone(), tools, &calls)?;
        assert!(runtime.execute_on(&id, "helper", "go").await.is_err());
        faulty.clear();
        runtime.shutdown().await?;
    }
    let runtime = runtime(Arc::new(SledStore::open(&store_path)?), tools, &calls)?;
    let outcome = runtime.resume(&id).await?;
    assert_eq!(outcome.status, Status::Completed, "{outcome:?}");
    let messages = runtime.messages(&id).await?;
    runtime.shutdown().await?;
    common::tool_result(&messages, "c1")
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no result for c1"))
}

#[tokio::test]
async fn a_call_cut_by_a_crash_of_dormant_is_a_durability_error_never_sent_again(
) -> anyhow::Result<()> {
    let Some(python) = PythonServer::start().await? else {
        return Ok(());
    };
    let outcome = crash_then_reopen(&python, "write_note", json!({ "note": "once" })).await?;
    assert_eq!(
        code(&outcome),
        Some(ToolErrorCode::ToolDurabilityError),
        "{outcome:?}"
    );
    assert_eq!(python.logged(), ["write_note once"]);
    Ok(())
}

#[tokio::test]
async fn an_idempotent_call_cut_by_a_crash_of_dormant_is_sent_again_after_the_reopen(
) -> anyhow::Result<()> {
    let Some(python) = PythonServer::start().await? else {
        return Ok(());
    };
    let outcome = crash_then_reopen(&python, "lookup", json!({ "key": "k" })).await?;
    assert_eq!(
        outcome,
        ToolOutcome::Result(json!({ "result": "value of k" }))
    );
    assert_eq!(python.logged(), ["lookup k", "lookup k"]);
    Ok(())
}
