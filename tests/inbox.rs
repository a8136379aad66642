//! The inbox (issue 32, item 1): every call that waits for a person, across sessions and
//! sub-agents, soonest deadline first, filtered and paged, read from the deadline index.

use std::sync::Arc;

use dormant::types::{InboxCursor, InboxFilter};
use dormant::{
    AgentDefinition, Approval, ManualClock, ModelReply, PendingKind, ReadError, Runtime,
    ScriptedLlm, SessionId, Submit, SubmitOutcome, ToolCall, ToolDefinition, ToolError,
};
use serde_json::json;

fn runtime(clock: &ManualClock) -> anyhow::Result<Runtime> {
    let editor = AgentDefinition::builder("editor")
        .tool(
            ToolDefinition::client("edit")
                .description("Edit the draft")
                .input_schema(
                    json!({ "type": "object", "properties": { "doc": { "type": "integer" } } }),
                )
                .timeout_ms(60_000),
        )
        .build()?;
    let ops = AgentDefinition::builder("ops")
        .tool(
            ToolDefinition::server("deploy", |_input: serde_json::Value, _ctx| async {
                Ok::<_, ToolError>(json!({ "ok": true }))
            })
            .require_approval(Approval::Always),
        )
        .client_tool_timeout_ms(30_000)
        .build()?;
    let llm = ScriptedLlm::new()
        .script(
            "editor",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new("e1", "edit", json!({ "doc": 1 }))]),
                ModelReply::text("edited"),
            ],
        )
        .script(
            "ops",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new(
                    "d1",
                    "deploy",
                    json!({ "env": "prod" }),
                )]),
                ModelReply::text("shipped"),
            ],
        );
    Ok(Runtime::builder()
        .llm(Arc::new(llm))
        .clock(Arc::new(clock.clone()))
        .background_deadlines(false)
        .agent(editor)
        .agent(ops)
        .build()?)
}

fn ids(inbox: &dormant::types::Inbox) -> Vec<(String, String)> {
    inbox
        .items
        .iter()
        .map(|item| (item.session.to_string(), item.tool_call_id.clone()))
        .collect()
}

#[tokio::test]
async fn the_inbox_lists_every_waiting_call_soonest_deadline_first() -> anyhow::Result<()> {
    let clock = ManualClock::new(1_000);
    let runtime = runtime(&clock)?;
    // Deadlines: a's at 61,000, b's at 32,000 (30 s), c's at 62,000.
    runtime.execute_on(&"a".parse()?, "editor", "edit").await?;
    clock.advance(1_000);
    runtime.execute_on(&"b".parse()?, "ops", "ship").await?;
    runtime.execute_on(&"c".parse()?, "editor", "edit").await?;

    let all = runtime.inbox(&InboxFilter::all(), None, 50).await?;
    assert_eq!(
        ids(&all),
        [
            ("b".into(), "d1".into()),
            ("a".into(), "e1".into()),
            ("c".into(), "e1".into())
        ]
    );
    assert_eq!(all.next, None, "read to the end");
    assert_eq!(runtime.waiting_calls().await?, 3, "counted as listed");
    let deploy = &all.items[0];
    assert_eq!(deploy.kind, PendingKind::Approval);
    assert_eq!(deploy.agent, "ops");
    assert!(deploy
        .approval_id
        .as_deref()
        .is_some_and(|id| id.ends_with("::d1")));
    assert_eq!(deploy.input, json!({ "env": "prod" }));
    let edit = &all.items[1];
    assert_eq!(edit.description.as_deref(), Some("Edit the draft"));
    assert!(edit.input_schema.is_some());
    assert_eq!((edit.since_ms, edit.deadline_at_ms), (1_000, 61_000));

    // Filters.
    let approvals = runtime
        .inbox(&InboxFilter::all().kind(PendingKind::Approval), None, 50)
        .await?;
    assert_eq!(ids(&approvals), [("b".into(), "d1".into())]);
    let editor = runtime
        .inbox(&InboxFilter::all().agent("editor"), None, 50)
        .await?;
    assert_eq!(
        ids(&editor),
        [("a".into(), "e1".into()), ("c".into(), "e1".into())]
    );
    let none = runtime
        .inbox(&InboxFilter::all().tool("nothing"), None, 50)
        .await?;
    assert!(none.items.is_empty() && none.next.is_none());

    // Pages of one.
    let mut seen = Vec::new();
    let mut after: Option<InboxCursor> = None;
    loop {
        let page = runtime
            .inbox(&InboxFilter::all(), after.as_ref(), 1)
            .await?;
        seen.extend(ids(&page));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ids(&all));
    assert!(matches!(
        runtime
            .inbox(&InboxFilter::all(), Some(&InboxCursor("not hex".into())), 1)
            .await,
        Err(ReadError::BadCursor(_))
    ));

    // An answered call no longer waits for a person, even before the resume.
    let answer = Submit::result("a", "e1", json!({ "done": true }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    let left = runtime.inbox(&InboxFilter::all(), None, 50).await?;
    assert_eq!(
        ids(&left),
        [("b".into(), "d1".into()), ("c".into(), "e1".into())]
    );
    assert_eq!(runtime.waiting_calls().await?, 2);
    // Past its deadline (32,000), a call no longer waits, swept or not.
    clock.advance(31_000);
    let left = runtime.inbox(&InboxFilter::all(), None, 50).await?;
    assert_eq!(ids(&left), [("c".into(), "e1".into())]);
    assert_eq!(runtime.waiting_calls().await?, 1);
    Ok(())
}

#[tokio::test]
async fn a_sub_agents_call_is_listed_with_the_root_it_is_answered_at() -> anyhow::Result<()> {
    let clock = ManualClock::new(1_000);
    let lead = AgentDefinition::builder("lead")
        .tool(ToolDefinition::sub_agent("review", "reviewer"))
        .build()?;
    let reviewer = AgentDefinition::builder("reviewer")
        .tool(ToolDefinition::client("confirm"))
        .build()?;
    let llm = ScriptedLlm::new()
        .script(
            "lead",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new(
                    "r1",
                    "review",
                    json!({ "message": "check it" }),
                )]),
                ModelReply::text("done"),
            ],
        )
        .script(
            "reviewer",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new("c1", "confirm", json!({}))]),
                ModelReply::text("reviewed"),
            ],
        );
    let runtime = Runtime::builder()
        .llm(Arc::new(llm))
        .clock(Arc::new(clock.clone()))
        .background_deadlines(false)
        .agent(lead)
        .agent(reviewer)
        .build()?;
    let root: SessionId = "root".parse()?;
    runtime.execute_on(&root, "lead", "go").await?;
    let inbox = runtime.inbox(&InboxFilter::all(), None, 50).await?;
    assert_eq!(inbox.items.len(), 1);
    let item = &inbox.items[0];
    assert_eq!(item.session, root.ephemeral_child("r1"));
    assert_eq!(item.root, root);
    assert_eq!(item.agent, "reviewer");
    // Answered at the root, as the item says.
    let answer = Submit::result(
        item.root.as_str(),
        item.tool_call_id.as_str(),
        json!({ "ok": 1 }),
    );
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    assert!(runtime
        .inbox(&InboxFilter::all(), None, 50)
        .await?
        .items
        .is_empty());
    Ok(())
}
