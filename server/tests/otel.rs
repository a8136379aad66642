//! OpenTelemetry at the server (issue 34, item 2), exported over OTLP/HTTP to a receiver on
//! loopback that decodes the protobuf: W3C trace context across the remote protocol (a
//! parent's call of a remote sub-agent carries the `traceparent` of the calling run's span in
//! the start's header, and the child's run, in the other runtime, links to that span), and the
//! binary configured by the standard `OTEL_*` variables alone.

mod common;
#[path = "../../tests/otel/receiver.rs"]
mod receiver;

use std::sync::Arc;

use common::binary::Binary;
use common::serve;
use dormant::telemetry::{run_trace, Telemetry};
use dormant::{
    AgentDefinition, ModelReply, Runtime, ScriptedLlm, SledStore, Status, ToolCall, ToolDefinition,
};
use dormant_server::{Auth, HttpRemoteAgents, ServerConfig};
use serde_json::json;

const KEY: &str = "operator-key-for-tests";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_childs_run_links_to_the_parents_run_across_the_boundary() -> anyhow::Result<()> {
    let (base, received) = receiver::serve().await?;
    let provider = receiver::tracer_provider(&base)?;

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
    assert_eq!(child.links.len(), 1, "linked to the run that called it");
    assert_eq!(child.links[0].trace_id, parent_trace.to_bytes());
    assert_eq!(child.links[0].span_id, parent_span.to_bytes());
    provider.shutdown()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exports_spans_and_metrics_where_the_otel_variables_say() -> anyhow::Result<()> {
    let (base, received) = receiver::serve().await?;
    let dir = tempfile::tempdir()?;
    let server = Binary::start_with_env(
        &dir.path().join("store"),
        "127.0.0.1:0",
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", base.as_str()),
            ("OTEL_SERVICE_NAME", "dormant-under-test"),
        ],
    )?;
    let http = reqwest::Client::new();
    let started: serde_json::Value = http
        .post(format!("{}/start", server.base))
        .json(&json!({ "agent": "demo", "message": "weather in Porto" }))
        .send()
        .await?
        .json()
        .await?;
    let (id, token) = (
        started["session_id"].as_str().unwrap_or_default(),
        started["token"].as_str().unwrap_or_default(),
    );
    // The stream ends when the run suspends (the demo asks the user).
    http.get(format!("{}/sse?session_id={id}&token={token}", server.base))
        .send()
        .await?
        .text()
        .await?;
    // A graceful stop exports what is queued.
    let status = server.terminate()?;
    assert!(status.success(), "{status}");
    let spans = received.spans();
    let run = spans
        .iter()
        .find(|span| span.name == "invoke_agent demo")
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no run span among {:?}",
                spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            )
        })?;
    let session = run
        .attributes
        .iter()
        .find(|kv| kv.key == "gen_ai.conversation.id");
    assert!(format!("{session:?}").contains(id), "{session:?}");
    assert!(spans.iter().any(|span| span.name.starts_with("chat")));
    assert!(received
        .metric_names()
        .iter()
        .any(|name| name == "dormant.commits"));
    assert!(received
        .service_names()
        .iter()
        .any(|name| name == "dormant-under-test"));
    Ok(())
}
