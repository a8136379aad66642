//! An MCP tool that asks for input mid-call (an elicitation; issue 34): the question is an
//! `input` call of the session that made the call — in the inbox, answered through the submit
//! contract from the root of the tree, with a deadline — and the answer goes back to the MCP
//! server, whose call goes on. Against the `rmcp` server of this test (streamable HTTP) and the
//! official Python SDK's (stdio), with a restart of dormant while the question waits: a call
//! that is not safe to retry is then a durability error, never sent again; one that is, is sent
//! again and its question answered with the answer given.

mod common;
#[path = "mcp/python.rs"]
mod python;
#[path = "mcp/rmcp_server.rs"]
mod rmcp_server;

use std::sync::Arc;

use dormant::mcp::{McpServer, McpTools};
use dormant::store::Store;
use dormant::types::{InboxFilter, ToolErrorCode, ToolOutcome};
use dormant::{
    AgentDefinition, ManualClock, MemoryStore, ModelReply, PendingKind, Runtime, ScriptedLlm,
    SessionId, SledStore, Status, Submit, SubmitOutcome, ToolCall, ToolDefinition,
};
use python::PythonServer;
use serde_json::{json, Value};

/// `lead` delegates to the sub-agent `traveller`, whose model calls the MCP tool `tool` with
/// `input` (call `t1`), then says "done".
fn tree(
    store: Arc<dyn Store>,
    tools: &McpTools,
    tool: &str,
    input: Value,
) -> anyhow::Result<Runtime> {
    tree_on_clock(store, tools, tool, input, Arc::new(ManualClock::new(0)))
}

/// [`tree`] on `clock`.
fn tree_on_clock(
    store: Arc<dyn Store>,
    tools: &McpTools,
    tool: &str,
    input: Value,
    clock: Arc<ManualClock>,
) -> anyhow::Result<Runtime> {
    let llm = ScriptedLlm::new()
        .script(
            "lead",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new(
                    "c1",
                    "travel",
                    json!({ "message": "book it" }),
                )]),
                ModelReply::text("all set"),
            ],
        )
        .script(
            "traveller",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new("t1", tool, input)]),
                ModelReply::text("done"),
            ],
        );
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .clock(clock)
        .background_deadlines(false)
        .agent(
            AgentDefinition::builder("lead")
                .tool(ToolDefinition::sub_agent("travel", "traveller"))
                .build()?,
        )
        .agent(
            AgentDefinition::builder("traveller")
                .tools(tools.definitions())
                .build()?,
        )
        .build()?)
}

/// The one question the tree waits on: its asking session and message, after checking it is
/// an `input` call `t1` under `root` with the seat schema.
async fn the_question(runtime: &Runtime, root: &SessionId) -> anyhow::Result<String> {
    let inbox = runtime.inbox(&InboxFilter::all(), None, 10).await?;
    anyhow::ensure!(inbox.items.len() == 1, "{inbox:?}");
    let item = &inbox.items[0];
    assert_eq!(item.kind, PendingKind::Input);
    assert_eq!(&item.root, root);
    assert_eq!(item.session, root.ephemeral_child("c1"));
    assert_eq!(item.tool_call_id, "t1");
    let request = item
        .request
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no question"))?;
    let schema = request.schema.unwrap_or_default();
    assert_eq!(schema["required"], json!(["seat"]), "{schema}");
    Ok(request.message)
}

/// The rmcp server's `book` of `flight` asked in a tree on a `MemoryStore`, on `clock`: its
/// log, the runtime, and the root, once the question waits at the root.
async fn booking(
    flight: &str,
    clock: Arc<ManualClock>,
) -> anyhow::Result<(rmcp_server::Log, Runtime, SessionId)> {
    let served = rmcp_server::serve().await?;
    // The agent's tools keep the connection once this handle is gone.
    let tools = McpTools::connect(McpServer::http("air", served.url)).await?;
    let input = json!({ "flight": flight });
    let store = Arc::new(MemoryStore::new());
    let runtime = tree_on_clock(store, &tools, "book", input, clock)?;
    let root: SessionId = "trip".parse()?;
    let waiting = runtime.execute_on(&root, "lead", "go").await?;
    assert_eq!(waiting.status, Status::SuspendedAwaitingChildren);
    let question = the_question(&runtime, &root).await?;
    assert_eq!(question, format!("Which seat on {flight}?"));
    Ok((served.log, runtime, root))
}

/// The result of the child's call `t1`.
async fn child_result(runtime: &Runtime, root: &SessionId) -> anyhow::Result<ToolOutcome> {
    let messages = runtime.messages(&root.ephemeral_child("c1")).await?;
    common::tool_result(&messages, "t1")
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no result for t1"))
}

fn answers(log: &rmcp_server::Log) -> Vec<Value> {
    log.answers
        .lock()
        .map(|answers| answers.clone())
        .unwrap_or_default()
}

/// Whether the server's question was cancelled. The question open when dormant stops is
/// cancelled at the server if the closing connection still carries the reply, which is a race
/// with the connection's end: the restart tests allow it and nothing else.
fn is_cancel(answer: &Value) -> bool {
    answer == &json!({ "action": "cancel" })
}

#[tokio::test]
async fn an_rmcp_tool_asks_in_a_sub_agent_is_answered_at_the_root_and_its_call_goes_on(
) -> anyhow::Result<()> {
    let (log, runtime, root) = booking("LH1", Arc::new(ManualClock::new(0))).await?;

    // An answer that is not what the server asked for is refused; the question keeps waiting.
    let wrong = Submit::result("trip", "t1", json!({ "row": 12 }));
    assert!(matches!(
        runtime.submit_tool_result(wrong).await?,
        SubmitOutcome::InvalidResult { .. }
    ));
    assert!(answers(&log).is_empty(), "nothing reached the server");

    let answer = Submit::result("trip", "t1", json!({ "seat": "12A" }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    let done = runtime.resume(&root).await?;
    assert_eq!(done.status, Status::Completed);
    assert_eq!(done.text.as_deref(), Some("all set"));
    assert_eq!(
        child_result(&runtime, &root).await?,
        ToolOutcome::Result(json!("booked 12A on LH1"))
    );
    assert_eq!(
        answers(&log),
        vec![json!({ "action": "accept", "content": { "seat": "12A" } })]
    );
    assert_eq!(log.calls().len(), 1, "the call was sent once");
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_refused_question_is_declined_at_the_server() -> anyhow::Result<()> {
    let (log, runtime, root) = booking("LH2", Arc::new(ManualClock::new(0))).await?;
    let refuse = Submit::error("trip", "t1", "no window seats left");
    assert_eq!(
        runtime.submit_tool_result(refuse).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(runtime.resume(&root).await?.status, Status::Completed);
    assert_eq!(
        child_result(&runtime, &root).await?,
        ToolOutcome::Result(json!("not booked: \"decline\""))
    );
    assert_eq!(answers(&log), vec![json!({ "action": "decline" })]);
    runtime.shutdown().await?;
    Ok(())
}

/// Asks `tool` of the rmcp server in a tree on a sled store in `dir`, then stops dormant (the
/// runtime and its MCP connection) while the question waits, and starts it again on the
/// reopened store with a new connection; answers the question there and resumes. Returns the
/// child's result and the server's log.
async fn restart_while_asking(tool: &str) -> anyhow::Result<(ToolOutcome, rmcp_server::Log)> {
    let served = rmcp_server::serve().await?;
    let log = served.log.clone();
    let dir = tempfile::tempdir()?;
    let root: SessionId = "trip".parse()?;
    let flight = json!({ "flight": "LH3" });
    {
        let tools = McpTools::connect(McpServer::http("air", served.url.clone())).await?;
        let runtime = tree(
            Arc::new(SledStore::open(dir.path())?),
            &tools,
            tool,
            flight.clone(),
        )?;
        let waiting = runtime.execute_on(&root, "lead", "go").await?;
        assert_eq!(waiting.status, Status::SuspendedAwaitingChildren);
        runtime.shutdown().await?;
    }
    let tools = McpTools::connect(McpServer::http("air", served.url)).await?;
    let runtime = tree(Arc::new(SledStore::open(dir.path())?), &tools, tool, flight)?;
    assert_eq!(the_question(&runtime, &root).await?, "Which seat on LH3?");
    let answer = Submit::result("trip", "t1", json!({ "seat": "7C" }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(runtime.resume(&root).await?.status, Status::Completed);
    let result = child_result(&runtime, &root).await?;
    runtime.shutdown().await?;
    Ok((result, log))
}

#[tokio::test]
async fn after_a_restart_of_dormant_a_call_that_asked_is_not_sent_again_unless_safe(
) -> anyhow::Result<()> {
    let (result, log) = restart_while_asking("book").await?;
    assert_eq!(
        result.code(),
        Some(ToolErrorCode::ToolDurabilityError),
        "{result:?}"
    );
    assert_eq!(log.calls().len(), 1, "book is not safe to retry: sent once");
    assert!(
        answers(&log).iter().all(is_cancel),
        "the answer had nowhere to go: {:?}",
        answers(&log)
    );
    Ok(())
}

#[tokio::test]
async fn after_a_restart_of_dormant_an_idempotent_call_that_asked_is_sent_again_and_answered(
) -> anyhow::Result<()> {
    let (result, log) = restart_while_asking("reserve").await?;
    assert_eq!(result, ToolOutcome::Result(json!("booked 7C on LH3")));
    let calls = log.calls();
    assert_eq!(calls.len(), 2, "reserve is idempotent: sent again");
    assert_eq!(
        calls[0].idempotency_key, calls[1].idempotency_key,
        "with the same idempotency key"
    );
    let answers = answers(&log);
    let (last, before) = answers.split_last().unwrap_or((&Value::Null, &[]));
    assert_eq!(
        last,
        &json!({ "action": "accept", "content": { "seat": "7C" } }),
        "the question asked again got the answer given: {answers:?}"
    );
    assert!(before.iter().all(is_cancel), "{answers:?}");
    Ok(())
}

#[tokio::test]
async fn a_python_sdk_tool_asks_and_the_answer_at_the_root_reaches_it() -> anyhow::Result<()> {
    let Some(python) = PythonServer::start().await? else {
        return Ok(());
    };
    let runtime = tree(
        Arc::new(MemoryStore::new()),
        &python.tools,
        "book",
        json!({ "flight": "BA9" }),
    )?;
    let root: SessionId = "trip".parse()?;
    runtime.execute_on(&root, "lead", "go").await?;
    assert_eq!(the_question(&runtime, &root).await?, "Which seat on BA9?");
    let answer = Submit::result("trip", "t1", json!({ "seat": "1A" }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(runtime.resume(&root).await?.status, Status::Completed);
    let result = child_result(&runtime, &root).await?;
    let ToolOutcome::Result(value) = &result else {
        anyhow::bail!("the call failed: {result:?}");
    };
    assert!(value.to_string().contains("booked 1A on BA9"), "{value}");
    assert_eq!(python.logged(), ["book BA9", "answer accept 1A"]);
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_restart_of_dormant_while_a_python_sdk_tool_asks_is_a_durability_error(
) -> anyhow::Result<()> {
    let Some(python) = PythonServer::start().await? else {
        return Ok(());
    };
    let store_dir = python.dir.path().join("store");
    let root: SessionId = "trip".parse()?;
    let flight = json!({ "flight": "BA10" });
    {
        let store = Arc::new(SledStore::open(&store_dir)?);
        let runtime = tree(store, &python.tools, "book", flight.clone())?;
        runtime.execute_on(&root, "lead", "go").await?;
        runtime.shutdown().await?;
    }
    // dormant starts again: the server it spawned is gone with it, and a new one is started.
    let log = python.log.clone();
    drop(python.tools);
    let Some(again) = PythonServer::start_logging_to(&log).await? else {
        return Ok(());
    };
    let runtime = tree(
        Arc::new(SledStore::open(&store_dir)?),
        &again.tools,
        "book",
        flight,
    )?;
    assert_eq!(the_question(&runtime, &root).await?, "Which seat on BA10?");
    let answer = Submit::result("trip", "t1", json!({ "seat": "2B" }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(runtime.resume(&root).await?.status, Status::Completed);
    let result = child_result(&runtime, &root).await?;
    assert_eq!(
        result.code(),
        Some(ToolErrorCode::ToolDurabilityError),
        "{result:?}"
    );
    assert_eq!(
        again.logged(),
        ["book BA10"],
        "reached the server once, never again"
    );
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_question_that_times_out_in_the_session_is_cancelled_at_the_server() -> anyhow::Result<()>
{
    let clock = Arc::new(ManualClock::new(0));
    let (log, runtime, root) = booking("LH4", clock.clone()).await?;
    // Past the agent's client-tool deadline (5 minutes by default).
    let answered = log.answered.notified();
    clock.advance(dormant::definition::DEFAULT_CLIENT_TOOL_TIMEOUT_MS);
    runtime.sweep_deadlines().await?;
    // The session lets the open request go: the server hears "cancel" at once, not after the
    // MCP server's input_timeout (an hour).
    tokio::time::timeout(std::time::Duration::from_secs(30), answered).await?;
    assert_eq!(answers(&log), vec![json!({ "action": "cancel" })]);
    let result = child_result(&runtime, &root).await?;
    assert_eq!(
        result.code(),
        Some(ToolErrorCode::ClientToolTimeout),
        "{result:?}"
    );
    runtime.shutdown().await?;
    Ok(())
}
