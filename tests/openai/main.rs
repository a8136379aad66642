//! The OpenAI adapter against a mock OpenAI-compatible server on loopback, through a real
//! runtime: request mapping, JSON and streamed replies, live deltas, retries, error codes,
//! cancellation, and a client-tool round trip across a restart.

#![cfg(feature = "openai")]

mod mock;

use std::sync::Arc;
use std::time::Duration;

use dormant::llm::OpenAiBuilder;
use dormant::store::Store;
use dormant::types::{ChunkKind, Delta, DeltaKind, ErrorCode, Usage};
use dormant::{
    AgentDefinition, ManualClock, Message, ModelSettings, OpenAiAdapter, RunOutcome, Runtime,
    SessionId, SledStore, Status, StreamEvent, ToolCall, ToolDefinition, ToolError,
};
use dormant::{Submit, SubmitOutcome};
use futures::StreamExt;
use mock::{Mock, Reply};
use serde_json::{json, Value};

const TEXT_JSON: &str = include_str!("text.json");
const STREAM_TEXT: &str = include_str!("stream_text.sse");
const STREAM_TOOL_CALL: &str = include_str!("stream_tool_call.sse");
const STREAM_PARALLEL: &str = include_str!("stream_parallel_tool_calls.sse");
const STREAM_CLIENT_TOOL: &str = include_str!("stream_client_tool_call.sse");
const STREAM_CUT: &str = include_str!("stream_cut.sse");
const STREAM_MALFORMED: &str = include_str!("stream_malformed.sse");
const RATE_LIMITED: &str = include_str!("rate_limited.json");
const UNAUTHORIZED: &str = include_str!("unauthorized.json");
const CONTEXT_LENGTH: &str = include_str!("context_length.json");
const SERVER_ERROR: &str = include_str!("server_error.json");
const STREAM_NULLS: &str = include_str!("stream_nulls.sse");
const STREAM_ERROR_FIRST: &str = include_str!("stream_error_first.sse");

/// An adapter for `mock` with instant retries.
fn adapter(mock: &Mock) -> OpenAiBuilder {
    OpenAiAdapter::builder()
        .base_url(&mock.base_url)
        .api_key("sk-test")
        .model("fallback-model")
        .backoff(Duration::ZERO, Duration::ZERO)
}

/// The agent `clerk`: a server tool `lookup` and a client tool `confirm`.
fn clerk() -> anyhow::Result<AgentDefinition> {
    let lookup = ToolDefinition::server("lookup", |input: Value, _ctx| async move {
        Ok::<_, ToolError>(json!({ "item": input["item"], "stock": 3 }))
    })
    .description("Looks an item up in the stock.")
    .input_schema(json!({
        "type": "object",
        "properties": { "item": { "type": "string" } },
        "required": ["item"],
    }));
    let confirm = ToolDefinition::client("confirm")
        .description("Asks the customer to confirm.")
        .input_schema(json!({
            "type": "object",
            "properties": { "question": { "type": "string" } },
        }));
    Ok(AgentDefinition::builder("clerk")
        .system_prompt("You are a shop clerk.")
        .model(
            ModelSettings::model("gpt-4o-mini")
                .temperature(0.2)
                .max_output_tokens(256)
                .extra("seed", json!(7))
                .extra("model", json!("not-this-one")),
        )
        .tool(lookup)
        .tool(confirm)
        .build()?)
}

fn runtime(store: Arc<dyn Store>, llm: OpenAiAdapter) -> anyhow::Result<Runtime> {
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(0)))
        .background_deadlines(false)
        .agent(clerk()?)
        .build()?)
}

/// Serves `replies`, runs one message on a fresh runtime, and hands back what happened.
async fn run_once(
    replies: Vec<Reply>,
    configure: impl FnOnce(OpenAiBuilder) -> OpenAiBuilder,
) -> anyhow::Result<(Mock, Runtime, RunOutcome)> {
    let mock = Mock::start(replies).await?;
    let runtime = runtime(
        Arc::new(SledStore::temporary()?),
        configure(adapter(&mock)).build()?,
    )?;
    let outcome = runtime
        .execute_on(&"s1".parse()?, "clerk", "Any tea?")
        .await?;
    Ok((mock, runtime, outcome))
}

/// Follows `id` live from now on and hands back its deltas once its run ends.
fn deltas_until_run_end(
    runtime: &Runtime,
    id: &SessionId,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<Delta>>> {
    let events = runtime.follow_live(id, 0);
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        let mut deltas = Vec::new();
        while let Some(event) = events.next().await {
            match event? {
                StreamEvent::Delta(delta) => deltas.push(delta),
                StreamEvent::Chunk(chunk) if matches!(chunk.kind, ChunkKind::RunEnd { .. }) => {
                    return Ok(deltas);
                }
                StreamEvent::Chunk(_) => {}
            }
        }
        anyhow::bail!("the stream ended before the run")
    })
}

fn error_code(outcome: &RunOutcome) -> Option<ErrorCode> {
    outcome.error.as_ref().map(|error| error.code)
}

#[tokio::test]
async fn a_json_reply_completes_the_run_with_its_usage() -> anyhow::Result<()> {
    let (mock, runtime, outcome) =
        run_once(vec![Reply::json(200, TEXT_JSON)], |b| b.stream(false)).await?;
    assert_eq!(outcome.status, Status::Completed);
    assert_eq!(outcome.text.as_deref(), Some("We have 3 teas in stock."));
    let runs = runtime.runs(&outcome.session_id).await?;
    assert_eq!(runs[0].usage.tokens, Usage::new(19, 8).cached(0));
    let requests = mock.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].authorization.as_deref(), Some("Bearer sk-test"));
    assert_eq!(requests[0].body.get("stream"), None);
    Ok(())
}

#[tokio::test]
async fn streamed_text_reaches_followers_in_order_and_usage_is_recorded() -> anyhow::Result<()> {
    let mock = Mock::start(vec![Reply::Sse(STREAM_TEXT)]).await?;
    let runtime = runtime(Arc::new(SledStore::temporary()?), adapter(&mock).build()?)?;
    let id: SessionId = "s1".parse()?;
    let deltas = deltas_until_run_end(&runtime, &id);
    let outcome = runtime.execute_on(&id, "clerk", "Any tea?").await?;
    assert_eq!(outcome.status, Status::Completed);
    assert_eq!(outcome.text.as_deref(), Some("We have 3 teas."));
    let deltas = deltas.await??;
    let texts: Vec<&str> = deltas
        .iter()
        .map(|delta| match &delta.kind {
            DeltaKind::TextDelta { text } => Ok(text.as_str()),
            other => Err(anyhow::anyhow!("not text: {other:?}")),
        })
        .collect::<anyhow::Result<_>>()?;
    assert_eq!(texts, ["We", " have", " 3", " teas."]);
    let indexes: Vec<u32> = deltas.iter().map(|delta| delta.index).collect();
    assert_eq!(indexes, [0, 1, 2, 3], "no delta lost or reordered");
    let runs = runtime.runs(&id).await?;
    assert_eq!(runs[0].usage.tokens, Usage::new(41, 5).cached(32));
    let requests = mock.requests();
    assert_eq!(requests[0].body["stream"], true);
    assert_eq!(
        requests[0].body["stream_options"],
        json!({ "include_usage": true })
    );
    assert_eq!(requests[0].accept.as_deref(), Some("text/event-stream"));
    Ok(())
}

#[tokio::test]
async fn a_tool_call_split_across_chunks_is_assembled_and_streamed() -> anyhow::Result<()> {
    let mock = Mock::start(vec![Reply::Sse(STREAM_TOOL_CALL), Reply::Sse(STREAM_TEXT)]).await?;
    let runtime = runtime(Arc::new(SledStore::temporary()?), adapter(&mock).build()?)?;
    let id: SessionId = "s1".parse()?;
    let deltas = deltas_until_run_end(&runtime, &id);
    let outcome = runtime.execute_on(&id, "clerk", "Any tea?").await?;
    assert_eq!(outcome.status, Status::Completed);
    let messages = runtime.messages(&id).await?;
    assert_eq!(
        messages[1],
        Message::Assistant {
            text: None,
            tool_calls: vec![ToolCall::new(
                "call_Xq3vH2Zt8kLm",
                "lookup",
                json!({ "item": "tea" })
            )],
        }
    );
    let first_step: Vec<DeltaKind> = deltas
        .await??
        .into_iter()
        .filter(|delta| delta.step == 1)
        .map(|delta| delta.kind)
        .collect();
    let mut arguments = String::new();
    for (n, kind) in first_step.iter().enumerate() {
        let DeltaKind::ToolCallDelta {
            position,
            id: call_id,
            name,
            arguments: fragment,
        } = kind
        else {
            anyhow::bail!("not a tool call: {kind:?}");
        };
        assert_eq!(*position, 0);
        let first = (call_id.as_deref(), name.as_deref());
        if n == 0 {
            assert_eq!(first, (Some("call_Xq3vH2Zt8kLm"), Some("lookup")));
        } else {
            assert_eq!(first, (None, None), "id and name come once");
        }
        arguments.push_str(fragment);
    }
    assert_eq!(first_step.len(), 6, "one delta per fragment");
    assert_eq!(arguments, r#"{"item":"tea"}"#);
    let runs = runtime.runs(&id).await?;
    assert_eq!(
        runs[0].usage.tokens,
        Usage::new(60 + 41, 14 + 5).cached(32),
        "both steps' tokens are summed"
    );
    Ok(())
}

#[tokio::test]
async fn parallel_tool_calls_run_and_answer_in_the_model_s_order() -> anyhow::Result<()> {
    let (mock, runtime, outcome) = run_once(
        vec![Reply::Sse(STREAM_PARALLEL), Reply::Sse(STREAM_TEXT)],
        |b| b,
    )
    .await?;
    assert_eq!(outcome.status, Status::Completed);
    let messages = runtime.messages(&outcome.session_id).await?;
    let Message::Assistant { tool_calls, .. } = &messages[1] else {
        anyhow::bail!("not the model's reply: {:?}", messages[1]);
    };
    let ids: Vec<&str> = tool_calls.iter().map(|call| call.id.as_str()).collect();
    assert_eq!(ids, ["call_tea0001", "call_cof0002"]);
    assert_eq!(tool_calls[1].input, json!({ "item": "coffee" }));
    let second = &mock.bodies()[1]["messages"];
    let tool_messages: Vec<&Value> = second
        .as_array()
        .into_iter()
        .flatten()
        .filter(|message| message["role"] == "tool")
        .collect();
    assert_eq!(
        tool_messages,
        [
            &json!({ "role": "tool", "tool_call_id": "call_tea0001",
                     "content": r#"{"item":"tea","stock":3}"# }),
            &json!({ "role": "tool", "tool_call_id": "call_cof0002",
                     "content": r#"{"item":"coffee","stock":3}"# }),
        ]
    );
    Ok(())
}

#[tokio::test]
async fn the_request_carries_the_prompt_tools_settings_and_tool_results() -> anyhow::Result<()> {
    let (mock, _runtime, outcome) = run_once(
        vec![Reply::Sse(STREAM_TOOL_CALL), Reply::Sse(STREAM_TEXT)],
        |b| b,
    )
    .await?;
    assert_eq!(outcome.status, Status::Completed);
    let bodies = mock.bodies();
    let first = &bodies[0];
    assert_eq!(first["model"], "gpt-4o-mini", "the agent's model wins");
    assert_eq!(first["temperature"], json!(0.2));
    assert_eq!(first["max_tokens"], 256);
    assert_eq!(first["seed"], 7, "extra fields are passed on");
    assert_eq!(
        first["messages"],
        json!([
            { "role": "system", "content": "You are a shop clerk." },
            { "role": "user", "content": "Any tea?" },
        ])
    );
    assert_eq!(
        first["tools"][0],
        json!({ "type": "function", "function": {
            "name": "lookup",
            "description": "Looks an item up in the stock.",
            "parameters": { "type": "object",
                "properties": { "item": { "type": "string" } }, "required": ["item"] },
        }})
    );
    assert_eq!(first["tools"][1]["function"]["name"], "confirm");
    assert_eq!(
        bodies[1]["messages"].as_array().map(|m| m[2..].to_vec()),
        Some(vec![
            json!({ "role": "assistant", "content": null, "tool_calls": [
                { "id": "call_Xq3vH2Zt8kLm", "type": "function",
                  "function": { "name": "lookup", "arguments": r#"{"item":"tea"}"# } }] }),
            json!({ "role": "tool", "tool_call_id": "call_Xq3vH2Zt8kLm",
                    "content": r#"{"item":"tea","stock":3}"# }),
        ])
    );
    Ok(())
}

#[tokio::test]
async fn a_rate_limit_is_retried_after_retry_after() -> anyhow::Result<()> {
    let rate_limited = Reply::json(429, RATE_LIMITED).header("retry-after", "0");
    let (mock, _runtime, outcome) =
        run_once(vec![rate_limited, Reply::json(200, TEXT_JSON)], |b| {
            // A long backoff that Retry-After overrides: the test would hang without it.
            b.backoff(Duration::from_secs(3600), Duration::from_secs(3600))
        })
        .await?;
    assert_eq!(outcome.status, Status::Completed, "{:?}", outcome.error);
    assert_eq!(mock.requests().len(), 2);
    Ok(())
}

// Tokio's clock is paused: it jumps to the timeout once every task waits, so the test does
// not wait an hour of real time (nor a second).
#[tokio::test(start_paused = true)]
async fn a_timeout_before_any_answer_is_retried() -> anyhow::Result<()> {
    let (mock, _runtime, outcome) = run_once(vec![Reply::Hang, Reply::Sse(STREAM_TEXT)], |b| {
        b.timeout(Duration::from_secs(3600))
    })
    .await?;
    assert_eq!(outcome.status, Status::Completed, "{:?}", outcome.error);
    assert_eq!(mock.requests().len(), 2);
    Ok(())
}

#[tokio::test]
async fn a_rate_limit_that_outlasts_the_retries_fails_the_run_as_rate_limited() -> anyhow::Result<()>
{
    let (mock, _runtime, outcome) =
        run_once(vec![Reply::json(429, RATE_LIMITED)], |b| b.max_retries(2)).await?;
    assert_eq!(outcome.status, Status::Failed);
    assert_eq!(error_code(&outcome), Some(ErrorCode::RateLimited));
    let message = outcome.error.map(|e| e.message).unwrap_or_default();
    assert!(
        message.contains("429") && message.contains("Rate limit reached"),
        "{message}"
    );
    assert_eq!(mock.requests().len(), 3, "one attempt and two retries");
    Ok(())
}

#[tokio::test]
async fn server_errors_are_retried_then_fail_as_model_error() -> anyhow::Result<()> {
    let (mock, _runtime, outcome) =
        run_once(vec![Reply::json(500, SERVER_ERROR)], |b| b.max_retries(1)).await?;
    assert_eq!(error_code(&outcome), Some(ErrorCode::ModelError));
    let message = outcome.error.map(|e| e.message).unwrap_or_default();
    assert!(
        message.contains("500") && message.contains("had an error"),
        "{message}"
    );
    assert_eq!(mock.requests().len(), 2);
    Ok(())
}

#[tokio::test]
async fn a_stream_cut_after_part_of_the_reply_fails_as_model_error_without_retry(
) -> anyhow::Result<()> {
    let mock = Mock::start(vec![Reply::SseThenCut(STREAM_CUT)]).await?;
    let runtime = runtime(Arc::new(SledStore::temporary()?), adapter(&mock).build()?)?;
    let id: SessionId = "s1".parse()?;
    let mut events = Box::pin(runtime.follow_live(&id, 0));
    runtime.start_on(&id, "clerk", "Any tea?").await?;
    let mut error = None;
    while let Some(event) = events.next().await {
        match event? {
            // Part of the reply reached the follower: now the connection breaks.
            StreamEvent::Delta(_) => mock.cut(),
            StreamEvent::Chunk(chunk) => {
                if let ChunkKind::RunEnd { status, error: why } = chunk.kind {
                    assert_eq!(status, Status::Failed);
                    error = why;
                    break;
                }
            }
        }
    }
    let error = error.ok_or_else(|| anyhow::anyhow!("the run failed without an error"))?;
    assert_eq!(error.code, ErrorCode::ModelError);
    assert!(
        error.message.contains("stream ended early"),
        "{}",
        error.message
    );
    assert_eq!(
        mock.requests().len(),
        1,
        "followers saw part of it: no retry"
    );
    Ok(())
}

#[tokio::test]
async fn a_malformed_chunk_fails_as_model_error() -> anyhow::Result<()> {
    let (mock, _runtime, outcome) = run_once(vec![Reply::Sse(STREAM_MALFORMED)], |b| b).await?;
    assert_eq!(error_code(&outcome), Some(ErrorCode::ModelError));
    let message = outcome.error.map(|e| e.message).unwrap_or_default();
    assert!(message.contains("malformed chunk"), "{message}");
    assert_eq!(mock.requests().len(), 1);
    Ok(())
}

#[tokio::test]
async fn refused_credentials_fail_as_auth_at_once() -> anyhow::Result<()> {
    let (mock, _runtime, outcome) = run_once(vec![Reply::json(401, UNAUTHORIZED)], |b| b).await?;
    assert_eq!(error_code(&outcome), Some(ErrorCode::Auth));
    assert_eq!(mock.requests().len(), 1, "no retry");
    Ok(())
}

#[tokio::test]
async fn an_overlong_conversation_fails_as_context_length_exceeded() -> anyhow::Result<()> {
    let (mock, _runtime, outcome) = run_once(vec![Reply::json(400, CONTEXT_LENGTH)], |b| b).await?;
    assert_eq!(error_code(&outcome), Some(ErrorCode::ContextLengthExceeded));
    assert_eq!(mock.requests().len(), 1);
    Ok(())
}

#[tokio::test]
async fn interrupting_a_run_closes_the_stream_in_flight() -> anyhow::Result<()> {
    let mock = Mock::start(vec![Reply::SseThenHold(STREAM_CUT)]).await?;
    let runtime = runtime(Arc::new(SledStore::temporary()?), adapter(&mock).build()?)?;
    let id: SessionId = "s1".parse()?;
    let mut events = Box::pin(runtime.follow_live(&id, 0));
    runtime.start_on(&id, "clerk", "Any tea?").await?;
    // The first text delta means the mock is holding the stream open mid-reply.
    while let Some(event) = events.next().await {
        if let StreamEvent::Delta(_) = event? {
            break;
        }
    }
    runtime.interrupt(&id).await?;
    tokio::time::timeout(Duration::from_secs(30), mock.connection_dropped()).await??;
    assert_eq!(runtime.status(&id).await?, Status::Interrupted);
    assert_eq!(mock.requests().len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_client_tool_call_survives_a_restart_and_the_result_reaches_the_model(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mock = Mock::start(vec![
        Reply::Sse(STREAM_CLIENT_TOOL),
        Reply::Sse(STREAM_TEXT),
    ])
    .await?;
    let id: SessionId = "order-1".parse()?;
    {
        let runtime = runtime(
            Arc::new(SledStore::open(dir.path())?),
            adapter(&mock).build()?,
        )?;
        let outcome = runtime.execute_on(&id, "clerk", "Order 2 teas").await?;
        assert_eq!(outcome.status, Status::SuspendedClientTool);
        assert_eq!(outcome.pending, ["call_conf0002"]);
        drop(runtime);
    }
    let runtime = runtime(
        Arc::new(SledStore::open(dir.path())?),
        adapter(&mock).build()?,
    )?;
    let envelope = json!({
        "kind": "client-tool-result",
        "session_id": "order-1",
        "tool_call_id": "call_conf0002",
        "result": { "confirmed": true },
    });
    let submit = Submit::from_json(&envelope).map_err(anyhow::Error::msg)?;
    assert_eq!(
        runtime.submit_tool_result(submit).await?,
        SubmitOutcome::Accepted
    );
    let resumed = runtime.resume(&id).await?;
    assert_eq!(resumed.status, Status::Completed, "{:?}", resumed.error);
    assert_eq!(resumed.text.as_deref(), Some("We have 3 teas."));

    let runs = runtime.runs(&id).await?;
    let tokens: Vec<Usage> = runs.iter().map(|run| run.usage.tokens).collect();
    assert_eq!(
        tokens,
        [Usage::new(88, 37).cached(0), Usage::new(41, 5).cached(32)]
    );
    assert_eq!(runs[0].usage.model_calls + runs[1].usage.model_calls, 2);

    let bodies = mock.bodies();
    assert_eq!(bodies.len(), 2);
    let messages = bodies[1]["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        messages[2]["tool_calls"][1]["function"],
        json!({ "name": "confirm", "arguments": r#"{"question":"Order 2 teas?"}"# })
    );
    assert_eq!(messages[2]["content"], "Let me check.");
    assert_eq!(
        messages[3..],
        [
            json!({ "role": "tool", "tool_call_id": "call_look0001",
                    "content": r#"{"item":"tea","stock":3}"# }),
            json!({ "role": "tool", "tool_call_id": "call_conf0002",
                    "content": r#"{"confirmed":true}"# }),
        ]
    );
    Ok(())
}

#[tokio::test]
async fn a_server_that_writes_every_optional_field_as_null_is_read() -> anyhow::Result<()> {
    let (_mock, runtime, outcome) = run_once(vec![Reply::Sse(STREAM_NULLS)], |b| b).await?;
    assert_eq!(outcome.status, Status::Completed, "{:?}", outcome.error);
    assert_eq!(outcome.text.as_deref(), Some("We have 3 teas."));
    let runs = runtime.runs(&"s1".parse()?).await?;
    assert_eq!(runs[0].usage.tokens.input_tokens, 30);
    Ok(())
}

#[tokio::test]
async fn a_retry_after_longer_than_the_backoff_allows_fails_at_once() -> anyhow::Result<()> {
    let rate_limited = Reply::json(429, RATE_LIMITED).header("retry-after", "3600");
    let (mock, _runtime, outcome) = run_once(vec![rate_limited], |b| {
        b.backoff(Duration::ZERO, Duration::from_secs(20))
    })
    .await?;
    assert_eq!(error_code(&outcome), Some(ErrorCode::RateLimited));
    let message = outcome.error.map(|e| e.message).unwrap_or_default();
    assert!(message.contains("Retry-After asks for 3600 s"), "{message}");
    assert_eq!(
        mock.requests().len(),
        1,
        "no retry sooner than the provider asked"
    );
    Ok(())
}

#[tokio::test]
async fn an_error_event_before_any_delta_is_retried_like_its_status() -> anyhow::Result<()> {
    let (mock, _runtime, outcome) = run_once(
        vec![Reply::Sse(STREAM_ERROR_FIRST), Reply::Sse(STREAM_TEXT)],
        |b| b,
    )
    .await?;
    assert_eq!(outcome.status, Status::Completed, "{:?}", outcome.error);
    assert_eq!(mock.requests().len(), 2);
    Ok(())
}

#[tokio::test]
async fn a_reply_past_the_size_limit_is_refused_unread() -> anyhow::Result<()> {
    // 33 MiB of content: past the adapter's 32 MiB bound on one reply.
    let content = "a".repeat(33 * 1024 * 1024);
    let body = format!(
        r#"{{"id":"x","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"{content}"}},"finish_reason":"stop"}}]}}"#
    );
    let body: &'static str = Box::leak(body.into_boxed_str());
    let (mock, _runtime, outcome) = run_once(vec![Reply::json(200, body)], |b| b).await?;
    assert_eq!(error_code(&outcome), Some(ErrorCode::ModelError));
    let message = outcome.error.map(|e| e.message).unwrap_or_default();
    assert!(message.contains("larger than 32 MiB"), "{message}");
    assert_eq!(mock.requests().len(), 1, "not retried");
    Ok(())
}
