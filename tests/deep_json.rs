//! JSON nested deeper than the runtime's limit is refused wherever it comes from (a submitted
//! result, a model's tool-call input, a server tool's result) and nothing of it is stored: a
//! session never becomes unreadable, and nothing recurses without a bound.

mod common;

use std::sync::Arc;

use common::{calls_then_text, editor_runtime, temp_store, tool_result};
use dormant::types::{ErrorCode, ToolOutcome};
use dormant::{
    AgentDefinition, BuildError, ManualClock, ModelReply, Runtime, ScriptedLlm, SessionId, Status,
    ToolCall, ToolDefinition, ToolError,
};
use dormant::{Submit, SubmitOutcome};
use serde_json::{json, Value};

/// `[[…[0]…]]`, `levels` arrays deep, built without recursion.
fn nested(levels: usize) -> Value {
    let mut value = json!(0);
    for _ in 0..levels {
        value = Value::Array(vec![value]);
    }
    value
}

/// Drops a deep value without recursing (serde_json's drop recurses once per level).
fn drop_deep(value: Value) {
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.into_iter().map(|(_, item)| item)),
            _ => {}
        }
    }
}

fn suspended_editor() -> anyhow::Result<Runtime> {
    editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        calls_then_text(&[("tc-1", "edit")], "done"),
        Arc::default(),
        |b| b,
    )
}

/// What the issue found: a result 1,030 levels deep was accepted, and the session could
/// never be read again; one 10,000 levels deep aborted the process. Both are refused with the
/// limit named, nothing is stored, and the call still waits for a proper answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_nested_too_deep_is_refused_and_the_session_stays_readable() -> anyhow::Result<()>
{
    let runtime = suspended_editor()?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "editor", "go").await?;
    for levels in [129, 1_030, 100_000] {
        // On a worker of its own, as a server's request handler would call it.
        let submit = Submit::result("s1", "tc-1", nested(levels));
        let answer = tokio::spawn({
            let runtime = runtime.clone();
            async move { runtime.submit_tool_result(submit).await }
        })
        .await??;
        match answer {
            SubmitOutcome::InvalidRequest { reason } => {
                assert!(reason.contains("128"), "the limit is named: {reason}");
            }
            other => anyhow::bail!("{levels} levels: expected invalid_request, got {other:?}"),
        }
    }
    assert_eq!(
        runtime.pending(&id).await?[0].answer,
        None,
        "nothing was stored"
    );
    let envelope = json!({ "session_id": "s1", "tool_call_id": "tc-1", "result": nested(1_030) });
    let answer = runtime.submit_json(&envelope).await?;
    assert_eq!(answer.code(), "invalid_request");
    drop_deep(envelope);
    // At the limit is fine, and the session reads back.
    let fine = Submit::result("s1", "tc-1", json!({ "applied": 1, "deep": nested(126) }));
    assert_eq!(
        runtime.submit_tool_result(fine).await?,
        SubmitOutcome::Accepted
    );
    runtime.evict(&id).await;
    assert_eq!(runtime.resume(&id).await?.status, Status::Completed);
    assert_eq!(runtime.messages(&id).await?.len(), 4);
    Ok(())
}

#[tokio::test]
async fn a_model_reply_with_a_tool_input_nested_too_deep_fails_the_run_and_is_not_stored(
) -> anyhow::Result<()> {
    let call = ToolCall::new("l1", "lookup", json!({ "query": nested(200) }));
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        vec![ModelReply::tool_calls(vec![call])],
        Arc::default(),
        |b| b,
    )?;
    let id: SessionId = "s1".parse()?;
    let run = runtime.execute_on(&id, "editor", "go").await?;
    assert_eq!(run.status, Status::Failed);
    let error = run.error.ok_or_else(|| anyhow::anyhow!("no error"))?;
    assert_eq!(error.code, ErrorCode::ModelError);
    assert!(error.message.contains("128"), "{}", error.message);
    runtime.evict(&id).await;
    assert_eq!(
        runtime.messages(&id).await?.len(),
        1,
        "only the user's message"
    );
    Ok(())
}

#[tokio::test]
async fn a_tool_result_nested_too_deep_becomes_a_tool_error() -> anyhow::Result<()> {
    let deep = ToolDefinition::server(
        "deep",
        |_input, ctx: dormant::definition::ToolContext| async move {
            ctx.set_state("fine", json!(1));
            Ok::<_, ToolError>(nested(300))
        },
    );
    let agent = AgentDefinition::builder("digger").tool(deep).build()?;
    let script = calls_then_text(&[("d1", "deep")], "dug");
    let runtime = Runtime::builder()
        .store(temp_store()?)
        .llm(Arc::new(ScriptedLlm::new().script("digger", script)))
        .agent(agent)
        .build()?;
    let run = runtime.execute("digger", "dig").await?;
    assert_eq!(run.status, Status::Completed);
    runtime.evict(&run.session_id).await;
    match tool_result(&runtime.messages(&run.session_id).await?, "d1") {
        Some(ToolOutcome::Error(error)) => assert!(error.starts_with("invalid_output"), "{error}"),
        other => anyhow::bail!("expected invalid_output, got {other:?}"),
    }
    assert!(
        runtime
            .session(&run.session_id)
            .await?
            .custom_state
            .is_empty(),
        "the changes of a refused result are not kept"
    );
    Ok(())
}

#[tokio::test]
async fn the_limit_is_configurable_within_what_the_store_can_read() -> anyhow::Result<()> {
    let build = |configure: fn(dormant::RuntimeBuilder) -> dormant::RuntimeBuilder| {
        configure(Runtime::builder().store(Arc::new(dormant::MemoryStore::new()))).build()
    };
    for refused in [
        build(|b| b.max_json_depth(0)),
        build(|b| b.max_json_depth(513)),
        build(|b| b.max_depth(17)),
    ] {
        match refused {
            Err(error) => assert_eq!(error.code(), "invalid_config", "{error}"),
            Ok(_) => anyhow::bail!("an out-of-range limit was accepted"),
        }
    }
    Ok(())
}

/// A limit out of range is refused by `build` as a `BuildError` (not a call's `Error`), with
/// the code and message it had when `build` returned an `Error`.
#[tokio::test]
async fn a_limit_out_of_range_is_a_build_error_with_the_message_it_always_had() -> anyhow::Result<()>
{
    let refused = Runtime::builder()
        .store(Arc::new(dormant::MemoryStore::new()))
        .max_json_depth(0)
        .build();
    match refused {
        Err(
            error @ BuildError::InvalidConfig {
                setting: "max_json_depth",
                ..
            },
        ) => {
            assert_eq!(
                error.to_string(),
                "invalid runtime setting max_json_depth: 0 is not within 1..=512"
            );
            assert_eq!(error.code(), "invalid_config");
        }
        other => anyhow::bail!("expected an invalid max_json_depth, got {other:?}"),
    }
    Ok(())
}

/// The deepest value the runtime accepts, at the bottom of the deepest tree it allows, is
/// forwarded up into the root's stream and still reads back everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deepest_value_allowed_in_the_deepest_tree_allowed_reads_back() -> anyhow::Result<()> {
    const LEVELS: usize = 17; // a root and 16 levels below it
    let mut llm = ScriptedLlm::new();
    let mut builder = Runtime::builder()
        .store(temp_store()?)
        .max_depth(16)
        .max_json_depth(512);
    for level in 0..LEVELS {
        let name = format!("a{level}");
        let (tool, call) = if level + 1 < LEVELS {
            (
                ToolDefinition::sub_agent("down", format!("a{}", level + 1)),
                ToolCall::new(format!("c{level}"), "down", json!({ "message": "go" })),
            )
        } else {
            (
                ToolDefinition::client("ask"),
                ToolCall::new("leaf", "ask", json!({})),
            )
        };
        llm = llm.script(
            &name,
            vec![ModelReply::tool_calls(vec![call]), ModelReply::text("done")],
        );
        builder = builder.agent(AgentDefinition::builder(&name).tool(tool).build()?);
    }
    let runtime = builder.llm(Arc::new(llm)).build()?;
    let root: SessionId = "r".parse()?;
    let run = runtime.execute_on(&root, "a0", "start").await?;
    assert_eq!(run.pending, ["leaf"]);
    let answer = Submit::result("r", "leaf", nested(512));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(runtime.resume(&root).await?.status, Status::Completed);
    runtime.evict_all().await;
    let sessions = runtime.session_ids().await?;
    assert_eq!(sessions.len(), LEVELS);
    for id in &sessions {
        // Every stored form of every session decodes.
        runtime.messages(id).await?;
        runtime.chunks(id, 0).await?;
        runtime.runs(id).await?;
        assert_eq!(runtime.status(id).await?, Status::Completed, "{id}");
    }
    let forwarded = runtime.chunks(&root, 0).await?;
    assert!(forwarded.iter().any(|chunk| chunk.kind.is_forwarded()));
    Ok(())
}
