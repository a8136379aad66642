//! Approvals that edit (issue 32, item 3): a tool whose approval is `Approval::Editable` runs
//! with the input the person approved it with, checked against its input schema, the original
//! kept beside it; other tools refuse edits.

mod common;

use std::sync::{Arc, Mutex};

use dormant::types::{ChunkKind, ToolOutcome};
use dormant::{
    AgentDefinition, Approval, ManualClock, Message, ModelReply, Runtime, ScriptedLlm, SessionId,
    Status, Submit, SubmitOutcome, ToolCall, ToolDefinition, ToolError,
};
use serde_json::{json, Value};

/// Agent `ops`: `deploy` (editable approval, input `{env: string}` required) and `drop`
/// (plain approval); both record the input they ran with.
fn runtime(ran: Arc<Mutex<Vec<Value>>>, calls: Vec<ToolCall>) -> anyhow::Result<Runtime> {
    runtime_on(Arc::new(dormant::MemoryStore::new()), ran, calls)
}

/// [`runtime`] on `store`.
fn runtime_on(
    store: Arc<dyn dormant::store::Store>,
    ran: Arc<Mutex<Vec<Value>>>,
    calls: Vec<ToolCall>,
) -> anyhow::Result<Runtime> {
    let tool = |name: &str, approval: Approval| {
        let ran = Arc::clone(&ran);
        ToolDefinition::server(name, move |input: Value, _ctx| {
            let ran = Arc::clone(&ran);
            async move {
                ran.lock()
                    .map_err(|_| ToolError::new("poisoned"))?
                    .push(input.clone());
                Ok::<_, ToolError>(json!({ "ran_with": input }))
            }
        })
        .input_schema(json!({ "type": "object", "required": ["env"],
                              "properties": { "env": { "type": "string" } } }))
        .require_approval(approval)
    };
    let ops = AgentDefinition::builder("ops")
        .tool(tool("deploy", Approval::Editable))
        .tool(tool("drop", Approval::Always))
        .tool(tool("rerun", Approval::Editable).safe_to_retry(true))
        .build()?;
    let llm = ScriptedLlm::new().script(
        "ops",
        vec![ModelReply::tool_calls(calls), ModelReply::text("done")],
    );
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(1_000)))
        .background_deadlines(false)
        .agent(ops)
        .build()?)
}

fn approval(runtime_run: &dormant::RunOutcome, call: &str) -> String {
    format!("{}::{call}", runtime_run.run_id)
}

#[tokio::test]
async fn an_edited_approval_runs_the_tool_with_the_edit_and_keeps_the_original(
) -> anyhow::Result<()> {
    let ran = Arc::new(Mutex::new(Vec::new()));
    let calls = vec![ToolCall::new("d1", "deploy", json!({ "env": "prod" }))];
    let runtime = runtime(ran.clone(), calls)?;
    let id: SessionId = "s1".parse()?;
    let run = runtime.execute_on(&id, "ops", "ship").await?;

    // Not fitting the input schema: refused with the schema's errors, nothing recorded.
    let wrong = Submit::approval("s1", "d1", approval(&run, "d1"), true, None)
        .with_edited_input(json!({ "env": 3 }));
    match runtime.submit_tool_result(wrong).await? {
        SubmitOutcome::InvalidResult { errors, .. } => assert!(!errors.is_empty()),
        other => anyhow::bail!("expected invalid_result, got {other:?}"),
    }
    // A denial carries no edit.
    let denied = Submit::approval("s1", "d1", approval(&run, "d1"), false, None)
        .with_edited_input(json!({ "env": "staging" }));
    assert!(matches!(
        runtime.submit_tool_result(denied).await?,
        SubmitOutcome::InvalidRequest { .. }
    ));

    let edited = Submit::approval("s1", "d1", approval(&run, "d1"), true, None)
        .with_edited_input(json!({ "env": "staging" }));
    // Through the JSON envelope, as a front end sends it.
    let outcome = runtime.submit_json(&edited.to_json()).await?;
    assert_eq!(outcome, SubmitOutcome::Accepted);
    let pending = runtime.pending(&id).await?;
    assert_eq!(pending[0].input, json!({ "env": "staging" }));
    assert_eq!(pending[0].original_input, Some(json!({ "env": "prod" })));

    assert_eq!(runtime.resume(&id).await?.status, Status::Completed);
    assert_eq!(
        *ran.lock().map_err(|_| anyhow::anyhow!("poisoned"))?,
        [json!({ "env": "staging" })]
    );
    let messages = runtime.messages(&id).await?;
    // The model's reply keeps what it asked for; the result says what ran.
    assert!(messages.iter().any(|message| matches!(message,
        Message::Assistant { tool_calls, .. } if tool_calls[0].input == json!({ "env": "prod" }))));
    assert!(messages.iter().any(|message| matches!(message,
        Message::Tool { outcome: ToolOutcome::Result(result), .. }
            if result == &json!({ "ran_with": { "env": "staging" } }))));
    // The stream says the decision carried an edit.
    let decided = runtime
        .chunks(&id, 0)
        .await?
        .into_iter()
        .find_map(|chunk| match chunk.kind {
            ChunkKind::ToolApprovalResponse { edited_input, .. } => Some(edited_input),
            _ => None,
        });
    assert_eq!(decided, Some(Some(json!({ "env": "staging" }))));
    Ok(())
}

#[tokio::test]
async fn a_tool_that_does_not_allow_edits_refuses_an_edited_approval() -> anyhow::Result<()> {
    let ran = Arc::new(Mutex::new(Vec::new()));
    let calls = vec![ToolCall::new("x1", "drop", json!({ "env": "prod" }))];
    let runtime = runtime(ran.clone(), calls)?;
    let id: SessionId = "s1".parse()?;
    let run = runtime.execute_on(&id, "ops", "drop it").await?;
    let edited = Submit::approval("s1", "x1", approval(&run, "x1"), true, None)
        .with_edited_input(json!({ "env": "staging" }));
    match runtime.submit_tool_result(edited).await? {
        SubmitOutcome::InvalidResult { reason, .. } => {
            assert!(reason.contains("does not allow edits"), "{reason}");
        }
        other => anyhow::bail!("expected invalid_result, got {other:?}"),
    }
    // The plain approval still works, with the call's own input.
    let plain = Submit::approval("s1", "x1", approval(&run, "x1"), true, None);
    assert_eq!(
        runtime.submit_tool_result(plain).await?,
        SubmitOutcome::Accepted
    );
    runtime.resume(&id).await?;
    assert_eq!(
        *ran.lock().map_err(|_| anyhow::anyhow!("poisoned"))?,
        [json!({ "env": "prod" })]
    );
    Ok(())
}

/// An edited approval whose commit failed left nothing behind: approved again without an
/// edit, the tool runs with the model's input; sent again with the same edit, it runs with the
/// edit (not refused as stale, as if the edit were the model's own input).
#[tokio::test]
async fn an_edited_approval_whose_commit_failed_leaves_the_calls_own_input() -> anyhow::Result<()> {
    use dormant::testkit::{Fault, FaultyStore};
    for edit_again in [false, true] {
        let ran = Arc::new(Mutex::new(Vec::new()));
        let store = Arc::new(FaultyStore::new(Arc::new(dormant::MemoryStore::new())));
        let calls = vec![ToolCall::new("d1", "deploy", json!({ "env": "prod" }))];
        let runtime = runtime_on(store.clone(), ran.clone(), calls)?;
        let id: SessionId = "s1".parse()?;
        let run = runtime.execute_on(&id, "ops", "ship").await?;
        let edited = || {
            Submit::approval("s1", "d1", approval(&run, "d1"), true, None)
                .with_edited_input(json!({ "env": "staging" }))
        };
        store.arm(Fault::NextCommit);
        let failed = runtime.submit_tool_result(edited()).await;
        assert!(
            matches!(failed, Err(dormant::Error::Store(_))),
            "{failed:?}"
        );
        let pending = runtime.pending(&id).await?;
        assert_eq!(pending[0].input, json!({ "env": "prod" }));

        let again = if edit_again {
            edited()
        } else {
            Submit::approval("s1", "d1", approval(&run, "d1"), true, None)
        };
        assert_eq!(
            runtime.submit_tool_result(again).await?,
            SubmitOutcome::Accepted
        );
        assert_eq!(runtime.resume(&id).await?.status, Status::Completed);
        let expected = if edit_again { "staging" } else { "prod" };
        assert_eq!(
            *ran.lock().map_err(|_| anyhow::anyhow!("poisoned"))?,
            [json!({ "env": expected })],
            "edited again: {edit_again}"
        );
    }
    Ok(())
}

/// A fork made where an approved call was running (its decision on the stream, no result yet)
/// runs it again, being safe to retry, with the input the person approved: not with the
/// model's, which the edit replaced.
#[tokio::test]
async fn a_fork_where_an_edited_approval_ran_runs_it_again_with_the_edit() -> anyhow::Result<()> {
    let ran = Arc::new(Mutex::new(Vec::new()));
    let calls = vec![ToolCall::new("r1", "rerun", json!({ "env": "prod" }))];
    let runtime = runtime(ran.clone(), calls)?;
    let id: SessionId = "s1".parse()?;
    let run = runtime.execute_on(&id, "ops", "ship").await?;
    let edited = Submit::approval("s1", "r1", approval(&run, "r1"), true, None)
        .with_edited_input(json!({ "env": "staging" }));
    assert_eq!(
        runtime.submit_tool_result(edited).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(runtime.resume(&id).await?.status, Status::Completed);
    let running = runtime
        .checkpoints(&id)
        .await?
        .into_iter()
        .rfind(|c| c.status == Status::Running && !c.open_calls.is_empty())
        .ok_or_else(|| anyhow::anyhow!("no checkpoint while the call ran"))?;
    let fork = runtime
        .fork(&id, running.id, dormant::types::ForkOptions::new())
        .await?;
    assert_eq!(runtime.resume(&fork).await?.status, Status::Completed);
    assert_eq!(
        *ran.lock().map_err(|_| anyhow::anyhow!("poisoned"))?,
        [json!({ "env": "staging" }), json!({ "env": "staging" })]
    );
    Ok(())
}

/// An approved call of a tool safe to retry, cut by a stop while it ran, and its tool
/// redefined before the next start (a deploy of a new version): the resume does not run it
/// again on the approval of the tool as it was; the call's result says so (`stale_approval`).
#[tokio::test]
async fn an_approved_call_cut_while_it_ran_is_not_run_again_once_its_tool_was_redefined(
) -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let runs = Arc::new(AtomicUsize::new(0));
    let (block, started) = (
        Arc::new(AtomicBool::new(true)),
        Arc::new(tokio::sync::Notify::new()),
    );
    let store: Arc<dyn dormant::store::Store> = Arc::new(dormant::MemoryStore::new());
    let build = |description: &str| -> anyhow::Result<Runtime> {
        let (runs, block, started) = (Arc::clone(&runs), Arc::clone(&block), Arc::clone(&started));
        let rerun = ToolDefinition::server("rerun", move |_input: Value, _ctx| {
            let (runs, block, started) =
                (Arc::clone(&runs), Arc::clone(&block), Arc::clone(&started));
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                if block.load(Ordering::SeqCst) {
                    started.notify_one();
                    std::future::pending::<()>().await;
                }
                Ok::<_, ToolError>(json!("ran"))
            }
        })
        .description(description)
        .require_approval(Approval::Always)
        .safe_to_retry(true);
        let ops = AgentDefinition::builder("ops").tool(rerun).build()?;
        let script = vec![
            ModelReply::tool_calls(vec![ToolCall::new("r1", "rerun", json!({}))]),
            ModelReply::text("done"),
        ];
        Ok(Runtime::builder()
            .store(Arc::clone(&store))
            .llm(Arc::new(ScriptedLlm::new().script("ops", script)))
            .clock(Arc::new(ManualClock::new(1_000)))
            .background_deadlines(false)
            .agent(ops)
            .build()?)
    };
    let first = build("version 1")?;
    let id: SessionId = "s1".parse()?;
    let asked = first.execute_on(&id, "ops", "go").await?;
    let approve = Submit::approval("s1", "r1", approval(&asked, "r1"), true, None);
    assert_eq!(
        first.submit_tool_result(approve).await?,
        SubmitOutcome::Accepted
    );
    common::stop_while_a_resumed_tool_runs(&first, &id, &started).await?;
    block.store(false, Ordering::SeqCst);
    let bounded = std::time::Duration::from_secs(30);

    let second = build("version 2")?;
    let resumed = tokio::time::timeout(bounded, second.resume(&id))
        .await
        .map_err(|_| anyhow::anyhow!("the resume never ended"))??;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "run again on a stale approval"
    );
    assert_eq!(resumed.status, Status::Completed);
    let messages = second.messages(&id).await?;
    let result = messages.iter().find_map(|message| match message {
        Message::Tool {
            tool_call_id,
            outcome,
            ..
        } if tool_call_id == "r1" => Some(outcome.clone()),
        _ => None,
    });
    match result {
        Some(ToolOutcome::Error(error)) => assert!(error.starts_with("stale_approval"), "{error}"),
        other => anyhow::bail!("expected stale_approval, got {other:?}"),
    }
    Ok(())
}
