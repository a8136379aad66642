//! The suspension cycle the `hitl` and `otel` benches measure: agent `editor` calls its client
//! tool `edit` once, suspends, is answered, resumes and completes, each cycle on a fresh
//! session, through the public API.

use std::sync::Arc;

use dormant::store::Store;
use dormant::{
    AgentDefinition, ModelReply, RuntimeBuilder, ScriptedLlm, SessionId, Status, Submit,
    SubmitOutcome, ToolCall, ToolDefinition,
};
use futures::stream::{self, StreamExt};
use serde_json::json;

/// The model's part of one cycle: call `edit`, then answer.
pub(crate) fn one_call_script() -> Vec<ModelReply> {
    vec![
        ModelReply::tool_calls(vec![ToolCall::new("tc-1", "edit", json!({ "doc": 1 }))]),
        ModelReply::text("applied"),
    ]
}

/// A runtime builder over `store` with agent `editor` (client tool `edit`), whose model says
/// `script`.
pub(crate) fn editor_runtime(
    store: Arc<dyn Store>,
    script: Vec<ModelReply>,
) -> anyhow::Result<RuntimeBuilder> {
    let agent = AgentDefinition::builder("editor")
        .tool(ToolDefinition::client("edit"))
        .build()?;
    Ok(dormant::Runtime::builder()
        .store(store)
        .llm(Arc::new(ScriptedLlm::new().script("editor", script)))
        .background_deadlines(false)
        .agent(agent))
}

/// One cycle on session `id`.
async fn cycle(runtime: &dormant::Runtime, id: SessionId) -> anyhow::Result<()> {
    let run = runtime.execute_on(&id, "editor", "edit it").await?;
    anyhow::ensure!(run.status == Status::SuspendedClientTool);
    let submit = Submit::result(id.as_str(), "tc-1", json!({ "applied": 1 }));
    anyhow::ensure!(runtime.submit_tool_result(submit).await? == SubmitOutcome::Accepted);
    let done = runtime.resume(&id).await?;
    anyhow::ensure!(done.status == Status::Completed);
    Ok(())
}

/// Runs `cycles` cycles, `concurrency` at a time, on sessions `c0`, `c1`, …
pub(crate) async fn drive(
    runtime: &dormant::Runtime,
    concurrency: usize,
    cycles: usize,
) -> anyhow::Result<()> {
    let results: Vec<anyhow::Result<()>> = stream::iter(0..cycles)
        .map(|i| {
            let runtime = runtime.clone();
            async move { cycle(&runtime, format!("c{i}").parse()?).await }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}
