//! W3C trace context across the remote protocol (issue 34, item 2): a parent's call of a
//! remote sub-agent carries the `traceparent` of its `execute_tool` span in the start's
//! header; the child's run, in the other runtime, links to that span. Both runtimes export
//! over OTLP/HTTP to a receiver on loopback that decodes the protobuf.

mod common;
#[path = "../../tests/otel/receiver.rs"]
mod receiver;

use std::sync::Arc;

use common::serve;
use dormant::telemetry::{run_trace, Telemetry};
use dormant::{
    AgentDefinition, ModelReply, Runtime, ScriptedLlm, SledStore, Status, ToolCall, ToolDefinition,
};
use dormant_server::{Auth, HttpRemoteAgents, ServerConfig};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::json;

const KEY: &str = "operator-key-for-tests";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_childs_run_links_to_the_parents_call_across_the_boundary() -> anyhow::Result<()> {
    let (base, received) = receiver::serve().await?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{base}/v1/traces"))
        .build()?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .build();

    let helper = AgentDefinition::builder("helper").build()?;
    let remote = Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(
            ScriptedLlm::new().script("helper", vec![ModelReply::text("helped")]),
        ))
        .agent(helper)
        .background_deadlines(false)
        .telemetry(Telemetry::new(&provider))
        .build()?;
    let remote = serve(remote, Auth::api_key(KEY), ServerConfig::default()).await?;

    let lead = AgentDefinition::builder("lead")
        .tool(ToolDefinition::remote_sub_agent(
            "delegate",
            &remote.base,
            "helper",
        ))
        .build()?;
    let llm = ScriptedLlm::new().script(
        "lead",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new(
                "d1",
                "delegate",
                json!({ "message": "help" }),
            )]),
            ModelReply::text("lead done"),
        ],
    );
    let parent = Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(llm))
        .agent(lead)
        .remote_agents(Arc::new(HttpRemoteAgents::new(Some(KEY.into()))))
        .background_deadlines(false)
        .telemetry(Telemetry::new(&provider))
        .build()?;
    let run = parent.execute_on(&"root-1".parse()?, "lead", "go").await?;
    assert_eq!(run.status, Status::Completed, "{run:?}");
    parent.shutdown().await?;
    provider.force_flush()?;

    let spans = received.spans();
    let (parent_trace, parent_span) = run_trace(run.run_id);
    let call = spans
        .iter()
        .find(|span| span.name == "execute_tool delegate")
        .ok_or_else(|| anyhow::anyhow!("no span of the parent's call"))?;
    assert_eq!(call.trace_id, parent_trace.to_bytes());
    assert_eq!(call.parent_span_id, parent_span.to_bytes());
    let child = spans
        .iter()
        .find(|span| span.name == "invoke_agent helper")
        .ok_or_else(|| anyhow::anyhow!("no span of the child's run"))?;
    assert_ne!(
        child.trace_id,
        parent_trace.to_bytes(),
        "the child's run is its own trace"
    );
    assert_eq!(child.links.len(), 1, "linked to the call that made it");
    assert_eq!(child.links[0].trace_id, call.trace_id);
    assert_eq!(child.links[0].span_id, call.span_id);
    provider.shutdown()?;
    Ok(())
}
