//! A session's history longer than a page of the store's reads: followed from its start, or
//! asked for a few chunks, it is read a page at a time, every chunk once and in order.

mod common;

use std::sync::Arc;

use common::editor_runtime;
use dormant::{ManualClock, ModelReply, SessionId, Status, Submit, SubmitOutcome, ToolCall};
use futures::StreamExt;
use serde_json::json;

/// Turns of the session, and client-tool cycles in each (a run ends at its step limit).
const TURNS: usize = 5;
const CYCLES: usize = 8;

#[tokio::test]
async fn a_long_history_is_followed_from_its_start_every_chunk_once() -> anyhow::Result<()> {
    let mut script = Vec::new();
    for turn in 0..TURNS {
        script.extend((0..CYCLES).map(|cycle| {
            ModelReply::tool_calls(vec![ToolCall::new(
                format!("tc-{turn}-{cycle}"),
                "edit",
                json!({}),
            )])
        }));
        script.push(ModelReply::text("done"));
    }
    let runtime = editor_runtime(
        common::temp_store()?,
        ManualClock::new(0),
        script,
        Arc::default(),
        |builder| builder,
    )?;
    let id: SessionId = "s1".parse()?;
    for turn in 0..TURNS {
        runtime.execute_on(&id, "editor", "go").await?;
        for cycle in 0..CYCLES {
            let call = format!("tc-{turn}-{cycle}");
            let answer = Submit::result("s1", call, json!({ "applied": cycle }));
            assert_eq!(
                runtime.submit_tool_result(answer).await?,
                SubmitOutcome::Accepted
            );
            runtime.resume(&id).await?;
        }
    }
    assert_eq!(runtime.status(&id).await?, Status::Completed);
    let stored: Vec<u64> = runtime
        .chunks(&id, 0)
        .await?
        .iter()
        .map(|chunk| chunk.seq)
        .collect();
    assert_eq!(stored, (0..stored.len() as u64).collect::<Vec<_>>());
    // Two commits a cycle at least (the suspension's and the resume's): 80 log entries and
    // more, past two pages of 32.
    assert!(stored.len() > 150, "{} chunks", stored.len());

    let followed: Vec<u64> = runtime
        .follow(&id, 0)
        .take(stored.len())
        .map(|chunk| chunk.map(|chunk| chunk.seq))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    assert_eq!(followed, stored);
    let some: Vec<u64> = runtime
        .chunks_at_most(&id, 100, 5)
        .await?
        .iter()
        .map(|chunk| chunk.seq)
        .collect();
    assert_eq!(some, vec![100, 101, 102, 103, 104]);
    runtime.shutdown().await?;
    Ok(())
}
