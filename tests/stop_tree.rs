//! Interrupting or aborting the root of a deep tree returns only once every descendant, at any
//! depth and evicted or not, has stopped and no call of the tree is pending.

mod common;

use std::sync::Arc;

use common::temp_store;
use dormant::{
    AgentDefinition, ModelReply, Runtime, ScriptedLlm, SessionId, Status, ToolCall, ToolDefinition,
};
use dormant::{Submit, SubmitOutcome};
use serde_json::json;

/// Agents `a0` … `a{depth-1}`: each delegates to the next through `down` (call `c{i}`), and
/// the last waits on the client tool `ask` (call `leaf`).
fn chain_runtime(depth: usize) -> anyhow::Result<Runtime> {
    let mut llm = ScriptedLlm::new();
    let mut builder = Runtime::builder().store(temp_store()?);
    for level in 0..depth {
        let name = format!("a{level}");
        let (agent, call) = if level + 1 < depth {
            let tool = ToolDefinition::sub_agent("down", format!("a{}", level + 1));
            let call = ToolCall::new(format!("c{level}"), "down", json!({ "message": "go" }));
            (AgentDefinition::builder(&name).tool(tool).build()?, call)
        } else {
            let tool = ToolDefinition::client("ask");
            let call = ToolCall::new("leaf", "ask", json!({}));
            (AgentDefinition::builder(&name).tool(tool).build()?, call)
        };
        llm = llm.script(
            &name,
            vec![ModelReply::tool_calls(vec![call]), ModelReply::text("done")],
        );
        builder = builder.agent(agent);
    }
    Ok(builder.llm(Arc::new(llm)).build()?)
}

/// The sessions of the chain under `root`, root first.
fn chain(root: &str, depth: usize) -> anyhow::Result<Vec<SessionId>> {
    let mut ids = vec![root.to_string()];
    for level in 0..depth - 1 {
        let below = format!("{}-sub-c{level}", ids[level]);
        ids.push(below);
    }
    Ok(ids
        .into_iter()
        .map(|id| id.parse())
        .collect::<Result<_, _>>()?)
}

async fn stop_deep_trees(depth: usize, rounds: usize) -> anyhow::Result<()> {
    let runtime = chain_runtime(depth)?;
    for round in 0..rounds {
        let root = format!("r{round}");
        let ids = chain(&root, depth)?;
        let run = runtime.execute_on(&ids[0], "a0", "start").await?;
        assert_eq!(run.status, Status::SuspendedAwaitingChildren);
        assert_eq!(run.pending, ["leaf"]);
        // Every other round, the whole tree is evicted first: the stop must reach sessions
        // that are not resident.
        if round % 2 == 0 {
            runtime.evict_all().await;
        }
        let abort = round % 4 >= 2;
        if abort {
            runtime.abort(&ids[0]).await?;
        } else {
            runtime.interrupt(&ids[0]).await?;
        }
        // No waiting, no settling: the call returned, so the whole tree is stopped.
        let stopped = if abort {
            Status::Failed
        } else {
            Status::Interrupted
        };
        for id in &ids {
            assert_eq!(
                runtime.status(id).await?,
                stopped,
                "round {round} (abort {abort}): {id} at depth {depth}"
            );
            assert!(runtime.pending(id).await?.is_empty(), "round {round}: {id}");
        }
        assert!(
            runtime
                .find_expired_pending(u64::MAX - 1)
                .await?
                .iter()
                .all(|call| !ids.contains(&call.session)),
            "round {round}: a deadline of the tree is still armed"
        );
        let late = Submit::result(root.as_str(), "leaf", json!("late"));
        assert_eq!(
            runtime.submit_tool_result(late).await?,
            SubmitOutcome::UnknownToolCall,
            "round {round}"
        );
    }
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_tree_three_deep_returns_once_every_descendant_stopped() -> anyhow::Result<()> {
    stop_deep_trees(3, 24).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_tree_five_deep_returns_once_every_descendant_stopped() -> anyhow::Result<()> {
    stop_deep_trees(5, 24).await
}
