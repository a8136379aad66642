//! A subscriber can follow one session: what the actor logs is inside a `session` span, and
//! what a model adapter or a tool logs is inside a `run` span with the session, run and step.

use std::sync::Arc;

use dormant::llm::{BoxFuture, LlmAdapter, LlmError, ModelRequest};
use dormant::{AgentDefinition, ModelReply, Runtime};

/// Logs a line from inside the model call.
#[derive(Debug)]
struct Talkative;

impl LlmAdapter for Talkative {
    fn complete(&self, _request: ModelRequest) -> BoxFuture<'static, Result<ModelReply, LlmError>> {
        Box::pin(async {
            tracing::info!("adapter.called");
            Ok(ModelReply::text("hello"))
        })
    }
}

#[tokio::test]
async fn what_a_run_logs_carries_its_session_and_run() -> anyhow::Result<()> {
    let (captured, _guard) = dormant::testkit::CapturedLogs::start(tracing::Level::INFO);
    let runtime = Runtime::builder()
        .llm(Arc::new(Talkative))
        .agent(AgentDefinition::builder("greeter").build()?)
        .build()?;
    let run = runtime
        .execute_on(&"s-traced".parse()?, "greeter", "hi")
        .await?;
    runtime.shutdown().await?;
    let logs = captured.text()?;
    let line = logs
        .lines()
        .find(|line| line.contains("adapter.called"))
        .ok_or_else(|| anyhow::anyhow!("no adapter line in\n{logs}"))?;
    assert!(
        line.contains(&format!(
            "run{{session=s-traced run={} step=1}}",
            run.run_id
        )),
        "{line}"
    );
    Ok(())
}

#[tokio::test]
async fn a_call_id_the_runtime_replaces_is_logged_escaped() -> anyhow::Result<()> {
    let (captured, _guard) = dormant::testkit::CapturedLogs::start(tracing::Level::INFO);
    let forged = "x\nERROR forged line";
    let llm = dormant::ScriptedLlm::new().script(
        "caller",
        vec![
            ModelReply::tool_calls(vec![
                dormant::ToolCall::new(forged, "ask", serde_json::json!({})),
                dormant::ToolCall::new(forged, "ask", serde_json::json!({})),
            ]),
            ModelReply::text("done"),
        ],
    );
    let runtime = Runtime::builder()
        .llm(Arc::new(llm))
        .agent(
            AgentDefinition::builder("caller")
                .tool(dormant::ToolDefinition::client("ask"))
                .build()?,
        )
        .build()?;
    let session = "s-ids".parse()?;
    runtime.execute_on(&session, "caller", "hi").await?;
    let mut pending: Vec<String> = runtime
        .pending(&session)
        .await?
        .into_iter()
        .map(|call| call.tool_call_id)
        .collect();
    pending.sort();
    assert_eq!(pending, ["call-1-1", forged]);
    runtime.shutdown().await?;
    let logs = captured.text()?;
    let line = logs
        .lines()
        .find(|line| line.contains("tool_call.id_assigned"))
        .ok_or_else(|| anyhow::anyhow!("no id_assigned line in\n{logs}"))?;
    assert!(line.contains(r"x\nERROR forged line"), "{line}");
    assert!(line.contains("call-1-1"), "{line}");
    assert!(
        !logs.lines().any(|line| line.starts_with("ERROR forged")),
        "{logs}"
    );
    Ok(())
}
