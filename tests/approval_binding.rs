//! Approvals bound to what they approve (issue 32, item 4): a request carries a digest of the
//! call's input and its tool's definition; a decision bound to another request is refused
//! (`stale_approval`), and an approved call whose tool was redefined before it ran does not run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dormant::types::{ChunkKind, ToolOutcome};
use dormant::{
    AgentDefinition, Approval, ManualClock, Message, ModelReply, Runtime, ScriptedLlm, SessionId,
    SledStore, Status, Submit, SubmitOutcome, ToolCall, ToolDefinition, ToolError,
};
use serde_json::json;

fn runtime(
    store: Arc<dyn dormant::store::Store>,
    description: &str,
    runs: Arc<AtomicUsize>,
) -> anyhow::Result<Runtime> {
    let deploy = ToolDefinition::server("deploy", move |_input: serde_json::Value, _ctx| {
        let runs = Arc::clone(&runs);
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ToolError>(json!({ "ok": true }))
        }
    })
    .description(description)
    .require_approval(Approval::Always);
    let ops = AgentDefinition::builder("ops").tool(deploy).build()?;
    let llm = ScriptedLlm::new().script(
        "ops",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new(
                "d1",
                "deploy",
                json!({ "env": "prod" }),
            )]),
            ModelReply::text("done"),
        ],
    );
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(1_000)))
        .background_deadlines(false)
        .agent(ops)
        .build()?)
}

/// The approval id and binding the request announced on the stream.
async fn request(runtime: &Runtime, id: &SessionId) -> anyhow::Result<(String, String)> {
    runtime
        .chunks(id, 0)
        .await?
        .into_iter()
        .find_map(|chunk| match chunk.kind {
            ChunkKind::ToolApprovalRequest {
                approval_id,
                binding: Some(binding),
                ..
            } => Some((approval_id, binding)),
            _ => None,
        })
        .ok_or_else(|| anyhow::anyhow!("no bound approval request"))
}

#[tokio::test]
async fn a_decision_bound_to_another_request_is_refused_as_stale() -> anyhow::Result<()> {
    let runs = Arc::new(AtomicUsize::new(0));
    let runtime = runtime(
        Arc::new(dormant::MemoryStore::new()),
        "Deploy",
        runs.clone(),
    )?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "ops", "ship").await?;
    let (approval_id, binding) = request(&runtime, &id).await?;
    assert_eq!(
        runtime.pending(&id).await?[0].binding.as_ref(),
        Some(&binding)
    );

    let stale =
        Submit::approval("s1", "d1", approval_id.clone(), true, None).bound_to("0".repeat(64));
    match runtime.submit_tool_result(stale).await? {
        SubmitOutcome::StaleApproval { reason } => {
            assert!(reason.contains("ask the person again"), "{reason}")
        }
        other => anyhow::bail!("expected stale_approval, got {other:?}"),
    }
    let bound = Submit::approval("s1", "d1", approval_id, true, None).bound_to(binding);
    // Through the envelope too.
    assert_eq!(
        runtime.submit_json(&bound.to_json()).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(runtime.resume(&id).await?.status, Status::Completed);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}

#[test]
fn an_approved_call_whose_tool_was_redefined_before_it_ran_does_not_run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let runs = Arc::new(AtomicUsize::new(0));
    let id: SessionId = "s1".parse()?;
    let tokio = tokio::runtime::Runtime::new()?;
    tokio.block_on(async {
        let store = Arc::new(SledStore::open(dir.path())?);
        let runtime = runtime(store, "Deploy to the named environment", runs.clone())?;
        runtime.execute_on(&id, "ops", "ship").await?;
        let (approval_id, _) = request(&runtime, &id).await?;
        let approve = Submit::approval("s1", "d1", approval_id, true, None);
        assert_eq!(
            runtime.submit_tool_result(approve).await?,
            SubmitOutcome::Accepted
        );
        runtime.shutdown().await?;
        anyhow::Ok(())
    })?;
    // A new version of the service: the tool now says something else about what it does.
    tokio.block_on(async {
        let store = Arc::new(SledStore::open(dir.path())?);
        let runtime = runtime(
            store,
            "Deploy to production, whatever the input says",
            runs.clone(),
        )?;
        assert_eq!(runtime.resume(&id).await?.status, Status::Completed);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            0,
            "approved for the tool as it was"
        );
        let result = runtime
            .messages(&id)
            .await?
            .into_iter()
            .find_map(|message| match message {
                Message::Tool { outcome, .. } => Some(outcome),
                _ => None,
            });
        match result {
            Some(ToolOutcome::Error(error)) => {
                assert!(error.starts_with("stale_approval"), "{error}")
            }
            other => anyhow::bail!("expected a stale_approval result, got {other:?}"),
        }
        runtime.shutdown().await?;
        anyhow::Ok(())
    })
}
