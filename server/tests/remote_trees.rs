//! Remote sub-agents in deeper and mixed trees, in one process (each runtime its own sled
//! store, the remotes served on loopback ports): a remote child with a local grandchild, two
//! hops, a local and a remote child in one step under one barrier, interrupt and abort of the
//! tree, a timeout on the remote, and the parent's store reopened while the child waits.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{serve, TestServer};
use dormant::remote::RemotePolicy;
use dormant::store::Store;
use dormant::types::ToolOutcome;
use dormant::{
    AgentDefinition, ManualClock, Message, ModelReply, Runtime, RuntimeBuilder, ScriptedLlm,
    SessionId, SledStore, Status, ToolCall, ToolDefinition,
};
use dormant::{Submit, SubmitOutcome};
use dormant_server::{Auth, HttpRemoteAgents, ServerConfig};
use serde_json::json;

const KEY: &str = "operator-key-for-tests";

fn operator_auth() -> Auth {
    Auth::api_key(KEY)
}

/// A runtime builder on `store` that can reach remotes with the operator key.
fn builder(store: Arc<dyn Store>, llm: ScriptedLlm) -> RuntimeBuilder {
    Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .remote_agents(Arc::new(HttpRemoteAgents::new(Some(KEY.into()))))
        .remote_policy(RemotePolicy {
            attempts: 3,
            backoff: Duration::from_millis(20),
            ..RemotePolicy::default()
        })
        .background_deadlines(false)
}

async fn served(builder: RuntimeBuilder) -> anyhow::Result<TestServer> {
    serve(builder.build()?, operator_auth(), ServerConfig::default()).await
}

fn delegate(call: &str, tool: &str) -> ModelReply {
    ModelReply::tool_calls(vec![ToolCall::new(
        call,
        tool,
        json!({ "message": "please" }),
    )])
}

/// The parent side, on a temporary sled store: `lead` delegates its call `d1` (tool `far`)
/// to `agent` on the server at `base`, then says "lead done".
fn parent_of(base: &str, agent: &str) -> anyhow::Result<Runtime> {
    let lead = AgentDefinition::builder("lead")
        .tool(ToolDefinition::remote_sub_agent("far", base, agent))
        .build()?;
    let llm = ScriptedLlm::new().script(
        "lead",
        vec![delegate("d1", "far"), ModelReply::text("lead done")],
    );
    Ok(builder(Arc::new(SledStore::temporary()?), llm)
        .agent(lead)
        .build()?)
}

fn ask(call: &str) -> ModelReply {
    ModelReply::tool_calls(vec![ToolCall::new(call, "ask", json!({}))])
}

/// An agent `name` with a client tool `ask`.
fn asker(name: &str) -> anyhow::Result<AgentDefinition> {
    Ok(AgentDefinition::builder(name)
        .tool(ToolDefinition::client("ask"))
        .build()?)
}

/// The result the root's conversation recorded for its call `call`.
async fn result_of(runtime: &Runtime, root: &SessionId, call: &str) -> anyhow::Result<ToolOutcome> {
    runtime
        .messages(root)
        .await?
        .into_iter()
        .find_map(|message| match message {
            Message::Tool {
                tool_call_id,
                outcome,
                ..
            } if tool_call_id == call => Some(outcome),
            _ => None,
        })
        .ok_or_else(|| anyhow::anyhow!("no result for {call}"))
}

fn answer(root: &str, call: &str) -> Submit {
    Submit::result(root, call, json!({ "ok": true }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_child_with_a_local_grandchild_is_answered_at_the_root() -> anyhow::Result<()> {
    // The remote: `mid` delegates locally to `leaf`, which asks.
    let mid = AgentDefinition::builder("mid")
        .tool(ToolDefinition::sub_agent("local", "leaf"))
        .build()?;
    let llm = ScriptedLlm::new()
        .script(
            "mid",
            vec![delegate("m1", "local"), ModelReply::text("mid done")],
        )
        .script("leaf", vec![ask("g1"), ModelReply::text("leaf done")]);
    let remote = served(
        builder(Arc::new(SledStore::temporary()?), llm)
            .agent(mid)
            .agent(asker("leaf")?),
    )
    .await?;
    let parent = parent_of(&remote.base, "mid")?;

    let root: SessionId = "tree-a".parse()?;
    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren);
    assert_eq!(run.pending, vec!["g1".to_string()]);
    let listed = parent.pending_remote(&root).await?;
    assert_eq!(
        listed[0].1.owner, "tree-a-sub-d1-sub-m1",
        "the grandchild owns it"
    );

    assert_eq!(
        parent.submit_tool_result(answer("tree-a", "g1")).await?,
        SubmitOutcome::Accepted
    );
    let run = parent.resume(&root).await?;
    assert_eq!(run.status, Status::Completed, "{run:?}");
    assert_eq!(
        result_of(&parent, &root, "d1").await?,
        ToolOutcome::Result(json!("mid done"))
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hops_route_a_submit_at_the_root_through_the_middle_server() -> anyhow::Result<()> {
    let llm = ScriptedLlm::new().script("leaf", vec![ask("g1"), ModelReply::text("leaf done")]);
    let far = served(builder(Arc::new(SledStore::temporary()?), llm).agent(asker("leaf")?)).await?;
    let mid = AgentDefinition::builder("mid")
        .tool(ToolDefinition::remote_sub_agent(
            "farther", &far.base, "leaf",
        ))
        .build()?;
    let llm = ScriptedLlm::new().script(
        "mid",
        vec![delegate("m1", "farther"), ModelReply::text("mid done")],
    );
    let middle = served(builder(Arc::new(SledStore::temporary()?), llm).agent(mid)).await?;
    let parent = parent_of(&middle.base, "mid")?;

    let root: SessionId = "tree-b".parse()?;
    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");
    let listed = parent.pending_remote(&root).await?;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].1.owner, "tree-b-sub-d1-sub-m1");

    assert_eq!(
        parent.submit_tool_result(answer("tree-b", "g1")).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(
        parent.submit_tool_result(answer("tree-b", "g1")).await?,
        SubmitOutcome::AlreadyCompleted
    );
    let run = parent.resume(&root).await?;
    assert_eq!(run.status, Status::Completed, "{run:?}");
    assert_eq!(
        result_of(&parent, &root, "d1").await?,
        ToolOutcome::Result(json!("mid done"))
    );
    let leaf = far
        .runtime
        .session(&"tree-b-sub-d1-sub-m1".parse()?)
        .await?;
    assert_eq!(leaf.status, Status::Completed);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_and_a_remote_child_of_one_step_wait_under_one_barrier() -> anyhow::Result<()> {
    let llm = ScriptedLlm::new().script("helper", vec![ask("r1"), ModelReply::text("remote done")]);
    let remote =
        served(builder(Arc::new(SledStore::temporary()?), llm).agent(asker("helper")?)).await?;
    let lead = AgentDefinition::builder("lead")
        .tool(ToolDefinition::remote_sub_agent(
            "far",
            &remote.base,
            "helper",
        ))
        .tool(ToolDefinition::sub_agent("near", "nearby"))
        .build()?;
    let both = ModelReply::tool_calls(vec![
        ToolCall::new("d1", "far", json!({ "message": "a" })),
        ToolCall::new("d2", "near", json!({ "message": "b" })),
    ]);
    let llm = ScriptedLlm::new()
        .script("lead", vec![both, ModelReply::text("lead done")])
        .script("nearby", vec![ask("l1"), ModelReply::text("local done")]);
    let parent = builder(Arc::new(SledStore::temporary()?), llm)
        .agent(lead)
        .agent(asker("nearby")?)
        .build()?;

    let root: SessionId = "tree-c".parse()?;
    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren);
    let mut pending = run.pending.clone();
    pending.sort();
    assert_eq!(pending, vec!["l1".to_string(), "r1".to_string()]);

    // One answered: the barrier holds, nothing runs.
    assert_eq!(
        parent.submit_tool_result(answer("tree-c", "r1")).await?,
        SubmitOutcome::Accepted
    );
    let run = parent.resume(&root).await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren, "{run:?}");
    assert_eq!(run.pending, vec!["l1".to_string()]);
    assert_eq!(
        parent.submit_tool_result(answer("tree-c", "l1")).await?,
        SubmitOutcome::Accepted
    );
    let run = parent.resume(&root).await?;
    assert_eq!(run.status, Status::Completed, "{run:?}");
    assert_eq!(
        result_of(&parent, &root, "d1").await?,
        ToolOutcome::Result(json!("remote done"))
    );
    assert_eq!(
        result_of(&parent, &root, "d2").await?,
        ToolOutcome::Result(json!("local done"))
    );
    Ok(())
}

/// A parent `lead` delegating to `helper` (which asks) on a fresh remote.
async fn simple_tree(root: &str) -> anyhow::Result<(TestServer, Runtime, SessionId)> {
    let llm = ScriptedLlm::new().script("helper", vec![ask("q1"), ModelReply::text("helper done")]);
    let remote =
        served(builder(Arc::new(SledStore::temporary()?), llm).agent(asker("helper")?)).await?;
    let parent = parent_of(&remote.base, "helper")?;
    let root: SessionId = root.parse()?;
    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren);
    Ok((remote, parent, root))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_and_abort_of_the_root_reach_the_remote_child_before_they_return(
) -> anyhow::Result<()> {
    let (remote, parent, root) = simple_tree("tree-d").await?;
    parent.interrupt(&root).await?;
    let child: SessionId = "tree-d-sub-d1".parse()?;
    assert_eq!(
        remote.runtime.session(&child).await?.status,
        Status::Interrupted
    );
    assert!(parent.pending_remote(&root).await?.is_empty());
    assert_eq!(
        parent.submit_tool_result(answer("tree-d", "q1")).await?,
        SubmitOutcome::UnknownToolCall
    );

    let (remote, parent, root) = simple_tree("tree-e").await?;
    parent.abort(&root).await?;
    let child = remote.runtime.session(&"tree-e-sub-d1".parse()?).await?;
    assert!(child.aborted, "{child:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_on_the_remote_reaches_the_parent_as_the_childs_tool_error() -> anyhow::Result<()>
{
    let clock = Arc::new(ManualClock::new(1_000));
    let llm = ScriptedLlm::new().script(
        "helper",
        vec![ask("q1"), ModelReply::text("helper went on")],
    );
    let remote = served(
        builder(Arc::new(SledStore::temporary()?), llm)
            .clock(clock.clone())
            .client_tool_timeout_ms(5_000)
            .agent(asker("helper")?),
    )
    .await?;
    let parent = parent_of(&remote.base, "helper")?;
    let root: SessionId = "tree-f".parse()?;
    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren);
    assert_eq!(
        parent.pending_remote(&root).await?[0].1.deadline_at_ms,
        6_000
    );

    // The remote's own deadline passes there.
    clock.advance(10_000);
    remote.runtime.sweep_deadlines().await?;
    assert_eq!(
        parent.submit_tool_result(answer("tree-f", "q1")).await?,
        SubmitOutcome::AlreadyCompleted,
        "the remote answers for its expired call"
    );
    let run = parent.resume(&root).await?;
    assert_eq!(run.status, Status::Completed, "{run:?}");
    let child = remote.runtime.messages(&"tree-f-sub-d1".parse()?).await?;
    let timed_out = child.iter().any(|message| {
        matches!(message, Message::Tool { outcome: ToolOutcome::Error(text), .. } if text.starts_with("client_tool_timeout"))
    });
    assert!(timed_out, "{child:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_parents_store_reopened_while_the_remote_child_waits_still_routes_and_completes(
) -> anyhow::Result<()> {
    let llm = ScriptedLlm::new().script("helper", vec![ask("q1"), ModelReply::text("helper done")]);
    let remote =
        served(builder(Arc::new(SledStore::temporary()?), llm).agent(asker("helper")?)).await?;
    let dir = tempfile::tempdir()?;
    let lead = || -> anyhow::Result<AgentDefinition> {
        Ok(AgentDefinition::builder("lead")
            .tool(ToolDefinition::remote_sub_agent(
                "far",
                &remote.base,
                "helper",
            ))
            .build()?)
    };
    let llm = ScriptedLlm::new().script("lead", vec![delegate("d1", "far")]);
    let parent = builder(Arc::new(SledStore::open(dir.path())?), llm)
        .agent(lead()?)
        .build()?;
    let root: SessionId = "tree-g".parse()?;
    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren);
    parent.shutdown().await?;

    // The script is read by the session's model-call count: the whole of it again.
    let llm = ScriptedLlm::new().script(
        "lead",
        vec![delegate("d1", "far"), ModelReply::text("lead done")],
    );
    let parent = builder(Arc::new(SledStore::open(dir.path())?), llm)
        .agent(lead()?)
        .build()?;
    assert_eq!(parent.pending_remote(&root).await?.len(), 1);
    assert_eq!(
        parent.submit_tool_result(answer("tree-g", "q1")).await?,
        SubmitOutcome::Accepted
    );
    let run = parent.resume(&root).await?;
    assert_eq!(run.status, Status::Completed, "{run:?}");
    assert_eq!(
        result_of(&parent, &root, "d1").await?,
        ToolOutcome::Result(json!("helper done"))
    );
    parent.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_a_tool_asks_on_the_remote_is_listed_and_answered_at_the_root(
) -> anyhow::Result<()> {
    use dormant::definition::{InputAnswer, InputRequest};
    // The remote: `desk`'s tool `book` asks which seat (as an MCP server's elicitation would).
    let book = ToolDefinition::server("book", |_input, ctx| async move {
        match ctx.answers().first() {
            Some(InputAnswer::Accepted { content }) => Ok(json!({ "seat": content["seat"] })),
            Some(InputAnswer::Declined { .. }) => Err(dormant::ToolError::new("declined")),
            None => Err(ctx.ask(InputRequest::new("Which seat?").schema(json!({
                "type": "object",
                "required": ["seat"],
                "properties": { "seat": { "type": "string" } }
            })))),
        }
    });
    let desk = AgentDefinition::builder("desk").tool(book).build()?;
    let llm = ScriptedLlm::new().script(
        "desk",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new("b1", "book", json!({}))]),
            ModelReply::text("desk done"),
        ],
    );
    let remote = served(builder(Arc::new(SledStore::temporary()?), llm).agent(desk)).await?;
    let parent = parent_of(&remote.base, "desk")?;

    let root: SessionId = "tree-q".parse()?;
    let run = parent.execute_on(&root, "lead", "go").await?;
    assert_eq!(run.pending, vec!["b1".to_string()]);
    // The root lists the question, as the remote asked it.
    let listed = parent.pending_remote(&root).await?;
    let call = &listed[0].1;
    assert_eq!(call.kind, dormant::PendingKind::Input);
    assert_eq!(
        call.request
            .as_ref()
            .map(|request| request.message.as_str()),
        Some("Which seat?")
    );
    // The remote checks the answer against the schema the tool asked for.
    let wrong = Submit::result("tree-q", "b1", json!({ "row": 3 })).for_question(1);
    assert!(matches!(
        parent.submit_tool_result(wrong).await?,
        SubmitOutcome::InvalidResult { .. }
    ));
    assert_eq!(call.question, Some(1));
    // Naming the question it answers, as the remote listed it.
    let answer = Submit::result("tree-q", "b1", json!({ "seat": "3F" })).for_question(1);
    assert_eq!(
        parent.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    let run = parent.resume(&root).await?;
    assert_eq!(run.status, Status::Completed, "{run:?}");
    assert_eq!(
        result_of(&parent, &root, "d1").await?,
        ToolOutcome::Result(json!("desk done"))
    );
    let remote_child = remote.runtime.messages(&"tree-q-sub-d1".parse()?).await?;
    assert!(
        remote_child.iter().any(|message| matches!(message,
            Message::Tool { outcome: ToolOutcome::Result(value), .. } if value == &json!({ "seat": "3F" }))),
        "{remote_child:?}"
    );
    Ok(())
}
