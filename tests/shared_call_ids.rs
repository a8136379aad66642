//! Calls of several sessions of one tree that share an id (models number their calls per
//! conversation): each is answered at the root, an approval by the approval id that names
//! its owner's run, and a store written with one ownership entry per call still routes.

mod common;

use std::sync::Arc;

use dormant::store::{Op, Store, Tree};
use dormant::types::{Answer, ToolOutcome};
use dormant::{
    AgentDefinition, ManualClock, ModelReply, Runtime, ScriptedLlm, SessionId, SledStore, Status,
    ToolCall, ToolDefinition, ToolError,
};
use dormant::{Submit, SubmitOutcome};
use serde_json::json;

/// A lead that starts two children of `child` in one reply (`w1`, `w2`), then says "done";
/// each child makes the call `tc-1` of `tool`, then says "ok".
fn runtime(store: Arc<dyn Store>, child: AgentDefinition, tool: &str) -> anyhow::Result<Runtime> {
    let llm = ScriptedLlm::new()
        .script(
            "lead",
            vec![
                ModelReply::tool_calls(vec![
                    ToolCall::new("w1", "delegate", json!({ "message": "one" })),
                    ToolCall::new("w2", "delegate", json!({ "message": "two" })),
                ]),
                ModelReply::text("done"),
            ],
        )
        .script(
            "child",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new("tc-1", tool, json!({}))]),
                ModelReply::text("ok"),
            ],
        );
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(0)))
        .agent(
            AgentDefinition::builder("lead")
                .tool(ToolDefinition::sub_agent("delegate", "child"))
                .build()?,
        )
        .agent(child)
        .build()?)
}

fn deployer() -> anyhow::Result<AgentDefinition> {
    let deploy = ToolDefinition::server("deploy", |_input, _ctx| async {
        Ok::<_, ToolError>(json!({ "deployed": true }))
    })
    .require_approval(dormant::Approval::Always);
    Ok(AgentDefinition::builder("child").tool(deploy).build()?)
}

async fn approval_id(runtime: &Runtime, session: &SessionId) -> anyhow::Result<String> {
    let pending = runtime.pending(session).await?;
    let call = pending
        .first()
        .ok_or_else(|| anyhow::anyhow!("{session} waits on nothing"))?;
    Ok(call.approval_id())
}

async fn answer_of(runtime: &Runtime, session: &SessionId) -> anyhow::Result<Option<Answer>> {
    Ok(runtime
        .pending(session)
        .await?
        .into_iter()
        .next()
        .and_then(|call| call.answer))
}

#[tokio::test]
async fn approvals_sharing_a_call_id_go_to_the_run_their_approval_id_names() -> anyhow::Result<()> {
    let runtime = runtime(Arc::new(SledStore::temporary()?), deployer()?, "deploy")?;
    let root: SessionId = "r".parse()?;
    let outcome = runtime.execute_on(&root, "lead", "go").await?;
    assert_eq!(outcome.status, Status::SuspendedAwaitingChildren);
    let (w1, w2) = (root.ephemeral_child("w1"), root.ephemeral_child("w2"));
    let (first, second) = (
        approval_id(&runtime, &w1).await?,
        approval_id(&runtime, &w2).await?,
    );
    assert_ne!(first, second);
    // The later child's decision first, then the earlier's: each lands in its own call.
    let deny = Submit::approval("r", "tc-1", &second, false, Some("not this one".into()));
    assert_eq!(
        runtime.submit_tool_result(deny).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(answer_of(&runtime, &w1).await?, None);
    assert!(matches!(
        answer_of(&runtime, &w2).await?,
        Some(Answer::Denied { .. })
    ));
    let approve = Submit::approval("r", "tc-1", &first, true, None);
    assert_eq!(
        runtime.submit_tool_result(approve.clone()).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(answer_of(&runtime, &w1).await?, Some(Answer::Approved));
    assert_eq!(
        runtime.submit_tool_result(approve).await?,
        SubmitOutcome::AlreadyCompleted
    );
    let done = runtime.resume(&root).await?;
    assert_eq!(done.status, Status::Completed);
    match common::tool_result(&runtime.messages(&w2).await?, "tc-1") {
        Some(ToolOutcome::Error(text)) => assert!(text.contains("not approved"), "{text}"),
        other => panic!("w2's deploy was denied, got {other:?}"),
    }
    assert_eq!(
        common::tool_result(&runtime.messages(&w1).await?, "tc-1"),
        Some(&ToolOutcome::Result(json!({ "deployed": true })))
    );
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_store_with_one_ownership_entry_per_call_still_routes_answers() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let asker = || -> anyhow::Result<AgentDefinition> {
        Ok(AgentDefinition::builder("child")
            .tool(ToolDefinition::client("ask"))
            .build()?)
    };
    let store: Arc<dyn Store> = Arc::new(SledStore::open(dir.path())?);
    let first = runtime(Arc::clone(&store), asker()?, "ask")?;
    let root: SessionId = "r".parse()?;
    first.execute_on(&root, "lead", "go").await?;
    first.shutdown().await?;
    drop((first, store));
    let store: Arc<dyn Store> = Arc::new(SledStore::open(dir.path())?);
    // Rewrite w1's entry as an earlier version stored it (root · call → owner) and drop w2's,
    // as if only one of them had been recorded then.
    let entries = store.scan_prefix(Tree::Ownership, &[]).await?;
    assert_eq!(entries.len(), 2, "one entry per owner");
    let mut legacy = dormant::store::Batch::new(dormant::store::CommitKind::Other);
    for (key, _) in &entries {
        legacy.delete(Tree::Ownership, key.clone());
    }
    let owner_of_w1 = entries
        .iter()
        .find(|(key, _)| key.ends_with(b"r-sub-w1"))
        .ok_or_else(|| anyhow::anyhow!("no entry of w1"))?;
    let mut old_key = vec![0, 1, b'r'];
    old_key.extend_from_slice(b"tc-1");
    legacy.put(Tree::Ownership, old_key.clone(), owner_of_w1.1.clone());
    store.commit(legacy.clone()).await?;
    assert!(legacy
        .ops()
        .iter()
        .any(|op| matches!(op, Op::Put { key, .. } if *key == old_key)));
    store.close().await?;
    drop(store);

    let store: Arc<dyn Store> = Arc::new(SledStore::open(dir.path())?);
    let second = runtime(Arc::clone(&store), asker()?, "ask")?;
    let answer = Submit::result("r", "tc-1", json!("from an old store"));
    assert_eq!(
        second.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    let w1 = root.ephemeral_child("w1");
    assert!(matches!(
        answer_of(&second, &w1).await?,
        Some(Answer::Result(_))
    ));
    second.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_answers_for_a_shared_call_id_each_find_a_call() -> anyhow::Result<()> {
    let asker = AgentDefinition::builder("child")
        .tool(ToolDefinition::client("ask"))
        .build()?;
    let runtime = runtime(Arc::new(SledStore::temporary()?), asker, "ask")?;
    for round in 0..20 {
        let root: SessionId = format!("r{round}").parse()?;
        runtime.execute_on(&root, "lead", "go").await?;
        let answer = |text: &str| Submit::result(root.as_str(), "tc-1", json!(text));
        let (a, b) = tokio::join!(
            runtime.submit_tool_result(answer("a")),
            runtime.submit_tool_result(answer("b")),
        );
        assert_eq!(
            (a?, b?),
            (SubmitOutcome::Accepted, SubmitOutcome::Accepted),
            "round {round}"
        );
        assert_eq!(
            runtime.submit_tool_result(answer("c")).await?,
            SubmitOutcome::AlreadyCompleted
        );
    }
    runtime.shutdown().await?;
    Ok(())
}
