//! OpenTelemetry (issue 34, item 2) through a real OTLP/HTTP exporter (the SDK's, as an
//! application installs it) to a receiver on loopback that decodes the protobuf: the span tree
//! of a run that suspends, is answered after a restart of the runtime (the store reopened),
//! and resumes — names, attributes, parents, and the resumed run's link to the suspended one.

#[path = "otel/receiver.rs"]
mod receiver;

use std::sync::Arc;

use dormant::telemetry::{run_trace, Telemetry};
use dormant::{
    AgentDefinition, Approval, ManualClock, ModelReply, Runtime, ScriptedLlm, SessionId, SledStore,
    Status, Submit, SubmitOutcome, ToolCall, ToolDefinition, ToolError,
};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::json;

/// Agent `helper`: `lookup` (a server tool), `pick` (a client tool) and `send` (approval).
fn runtime(store: Arc<SledStore>, provider: &SdkTracerProvider) -> anyhow::Result<Runtime> {
    runtime_with(store, Telemetry::new(provider), 0)
}

/// The runtime of every test here, its clock at `now_ms`.
fn runtime_with(
    store: Arc<SledStore>,
    telemetry: Telemetry,
    now_ms: u64,
) -> anyhow::Result<Runtime> {
    let lookup = ToolDefinition::server("lookup", |_input, _ctx| async {
        Ok::<_, ToolError>(json!({ "found": true }))
    });
    let send = ToolDefinition::server("send", |_input, _ctx| async {
        Ok::<_, ToolError>(json!("sent"))
    })
    .require_approval(Approval::Always);
    let agent = AgentDefinition::builder("helper")
        .tool(lookup)
        .tool(ToolDefinition::client("pick"))
        .tool(send)
        .build()?;
    let mut first = ModelReply::tool_calls(vec![
        ToolCall::new("c1", "lookup", json!({})),
        ToolCall::new("c2", "pick", json!({})),
        ToolCall::new("c3", "send", json!({})),
    ]);
    first.usage = Some(dormant::types::Usage {
        input_tokens: 120,
        output_tokens: 30,
        ..Default::default()
    });
    let llm = ScriptedLlm::new().script("helper", vec![first, ModelReply::text("done")]);
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(now_ms)))
        .background_deadlines(false)
        .telemetry(telemetry)
        .agent(agent)
        .build()?)
}

fn attribute<'s>(span: &'s Span, key: &str) -> Option<&'s AnyValue> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|value| value.value.as_ref())
}

fn text(span: &Span, key: &str) -> Option<String> {
    match attribute(span, key) {
        Some(AnyValue::StringValue(text)) => Some(text.clone()),
        _ => None,
    }
}

fn int(span: &Span, key: &str) -> Option<i64> {
    match attribute(span, key) {
        Some(AnyValue::IntValue(value)) => Some(*value),
        _ => None,
    }
}

fn named<'s>(spans: &'s [Span], name: &str) -> anyhow::Result<&'s Span> {
    let names: Vec<_> = spans.iter().map(|span| span.name.as_str()).collect();
    spans
        .iter()
        .find(|span| span.name == name)
        .ok_or_else(|| anyhow::anyhow!("no span {name} among {names:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_run_answered_after_a_restart_is_one_linked_span_tree() -> anyhow::Result<()> {
    let (base, received) = receiver::serve().await?;
    let provider = receiver::tracer_provider(&base)?;
    let dir = tempfile::tempdir()?;
    let id: SessionId = "s-otel".parse()?;

    let first = {
        let runtime = runtime(Arc::new(SledStore::open(dir.path())?), &provider)?;
        let outcome = runtime.execute_on(&id, "helper", "go").await?;
        assert_eq!(outcome.status, Status::SuspendedClientTool);
        runtime.shutdown().await?;
        outcome.run_id
    };
    // Restarted 40 s later: a new runtime on the reopened store answers and resumes.
    let store = Arc::new(SledStore::open(dir.path())?);
    let runtime = runtime_with(store, Telemetry::new(&provider), 40_000)?;
    let answer = Submit::result("s-otel", "c2", json!({ "picked": "a" }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    let pending = runtime.pending(&id).await?;
    let approval_id = pending
        .iter()
        .find(|call| call.tool_call_id == "c3")
        .map(|call| call.approval_id())
        .ok_or_else(|| anyhow::anyhow!("no approval pending: {pending:?}"))?;
    let approve = Submit::approval("s-otel", "c3", approval_id, true, None);
    assert_eq!(
        runtime.submit_tool_result(approve).await?,
        SubmitOutcome::Accepted
    );
    let second = runtime.resume(&id).await?;
    assert_eq!(second.status, Status::Completed);
    runtime.shutdown().await?;
    provider.force_flush()?;

    let spans = received.spans();
    let runs: Vec<&Span> = spans
        .iter()
        .filter(|span| span.name == "invoke_agent helper")
        .collect();
    assert_eq!(
        runs.len(),
        2,
        "{:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let (trace, span_id) = run_trace(first);
    let suspended = runs
        .iter()
        .find(|span| span.trace_id == trace.to_bytes())
        .ok_or_else(|| anyhow::anyhow!("no span in the first run's trace"))?;
    assert_eq!(suspended.span_id, span_id.to_bytes());
    assert!(
        suspended.parent_span_id.is_empty(),
        "a run is its trace's root"
    );
    assert_eq!(
        text(suspended, "gen_ai.operation.name").as_deref(),
        Some("invoke_agent")
    );
    assert_eq!(
        text(suspended, "gen_ai.agent.name").as_deref(),
        Some("helper")
    );
    assert_eq!(
        text(suspended, "gen_ai.conversation.id").as_deref(),
        Some("s-otel")
    );
    assert_eq!(
        text(suspended, "dormant.run.status").as_deref(),
        Some("suspended_client_tool")
    );
    let pending = match attribute(suspended, "dormant.run.pending_calls") {
        Some(AnyValue::ArrayValue(values)) => values.values.len(),
        other => anyhow::bail!("pending calls: {other:?}"),
    };
    assert_eq!(pending, 2, "pick and send wait");

    let (resumed_trace, resumed_span) = run_trace(second.run_id);
    let resumed = runs
        .iter()
        .find(|span| span.trace_id == resumed_trace.to_bytes())
        .ok_or_else(|| anyhow::anyhow!("no span in the resumed run's trace"))?;
    assert_eq!(resumed.span_id, resumed_span.to_bytes());
    assert_eq!(
        text(resumed, "dormant.run.status").as_deref(),
        Some("completed")
    );
    assert_eq!(
        text(resumed, "dormant.previous_run_id"),
        Some(first.to_string())
    );
    assert_eq!(
        int(resumed, "dormant.suspended_ms"),
        Some(40_000),
        "how long it waited, across the restart"
    );
    assert_eq!(resumed.links.len(), 1, "linked to the suspended run");
    assert_eq!(resumed.links[0].trace_id, trace.to_bytes());
    assert_eq!(resumed.links[0].span_id, span_id.to_bytes());

    // Each model call under its run, with its usage and finish reason.
    let chats: Vec<&Span> = spans
        .iter()
        .filter(|span| span.name.starts_with("chat"))
        .collect();
    assert_eq!(chats.len(), 2);
    let first_chat = chats
        .iter()
        .find(|span| span.parent_span_id == span_id.to_bytes())
        .ok_or_else(|| anyhow::anyhow!("no model call under the first run"))?;
    assert_eq!(int(first_chat, "gen_ai.usage.input_tokens"), Some(120));
    assert_eq!(
        text(first_chat, "gen_ai.provider.name").as_deref(),
        Some("dormant.scripted")
    );
    assert_eq!(int(first_chat, "gen_ai.usage.output_tokens"), Some(30));
    assert!(chats
        .iter()
        .any(|span| span.parent_span_id == resumed_span.to_bytes()));

    // Each call: the server tool under the first run; the client tool and the approved one,
    // answered after the restart, under the resumed run.
    let lookup = named(&spans, "execute_tool lookup")?;
    assert_eq!(lookup.parent_span_id, span_id.to_bytes());
    assert_eq!(text(lookup, "gen_ai.tool.call.id").as_deref(), Some("c1"));
    assert_eq!(text(lookup, "dormant.tool.kind").as_deref(), Some("server"));
    assert_eq!(text(lookup, "dormant.tool.outcome").as_deref(), Some("ok"));
    assert!(
        text(lookup, "gen_ai.tool.call.result").is_none(),
        "no content by default"
    );
    assert!(chats
        .iter()
        .all(|chat| text(chat, "gen_ai.input.messages").is_none()
            && text(chat, "gen_ai.output.messages").is_none()));
    let pick = named(&spans, "execute_tool pick")?;
    assert_eq!(pick.parent_span_id, resumed_span.to_bytes());
    assert_eq!(text(pick, "dormant.tool.kind").as_deref(), Some("client"));
    let send = named(&spans, "execute_tool send")?;
    assert_eq!(
        text(send, "dormant.approval.decision").as_deref(),
        Some("approved")
    );
    assert_eq!(send.trace_id, resumed_trace.to_bytes());
    provider.shutdown()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtimes_metrics_are_exported_over_otlp() -> anyhow::Result<()> {
    use opentelemetry::metrics::MeterProvider;
    let (base, received) = receiver::serve().await?;
    let exporter = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(format!("{base}/v1/metrics"))
        .build()?;
    let meters = opentelemetry_sdk::metrics::SdkMeterProvider::builder()
        .with_periodic_exporter(exporter)
        .build();
    let traces = receiver::tracer_provider(&base)?;
    let dir = tempfile::tempdir()?;
    let runtime = runtime(Arc::new(SledStore::open(dir.path())?), &traces)?;
    let id: SessionId = "s-metrics".parse()?;
    runtime.execute_on(&id, "helper", "go").await?;
    let answer = Submit::result("s-metrics", "c2", json!({ "picked": "a" }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    dormant::telemetry::observe_metrics(&runtime, &meters.meter("dormant"));
    // The calls that wait are counted in the background, at the first collection: the
    // collections after it report the count (the approval c3; c2 is answered).
    let mut waiting = Vec::new();
    for _ in 0..1_000 {
        meters.force_flush()?;
        waiting = received.gauge("dormant.client_tool.pending");
        if !waiting.is_empty() {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(waiting.first(), Some(&1), "{waiting:?}");
    let names = received.metric_names();
    for expected in [
        "dormant.sessions.resident",
        "dormant.commits",
        "dormant.commit.latency.p99",
        "dormant.client_tool.answered",
        "dormant.client_tool.timeouts",
        "dormant.client_tool.pending",
    ] {
        assert!(
            names.iter().any(|name| name == expected),
            "{expected} not in {names:?}"
        );
    }
    runtime.shutdown().await?;
    meters.shutdown()?;
    traces.shutdown()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_is_recorded_only_when_asked() -> anyhow::Result<()> {
    let (base, received) = receiver::serve().await?;
    let provider = receiver::tracer_provider(&base)?;
    let dir = tempfile::tempdir()?;
    let telemetry = Telemetry::new(&provider).capture_content(true);
    let runtime = runtime_with(Arc::new(SledStore::open(dir.path())?), telemetry, 0)?;
    runtime
        .execute_on(&"s-content".parse()?, "helper", "go")
        .await?;
    runtime.shutdown().await?;
    provider.force_flush()?;
    let spans = received.spans();
    let lookup = named(&spans, "execute_tool lookup")?;
    assert_eq!(
        text(lookup, "gen_ai.tool.call.arguments").as_deref(),
        Some("{}")
    );
    assert_eq!(
        text(lookup, "gen_ai.tool.call.result").as_deref(),
        Some(r#"{"found":true}"#)
    );
    // The model call: what it was sent, and what it answered.
    let chat = named(&spans, "chat")?;
    let sent: serde_json::Value = serde_json::from_str(
        &text(chat, "gen_ai.input.messages").ok_or_else(|| anyhow::anyhow!("no input"))?,
    )?;
    assert_eq!(
        sent,
        json!([{ "role": "user", "parts": [{ "type": "text", "content": "go" }] }])
    );
    let answered: serde_json::Value = serde_json::from_str(
        &text(chat, "gen_ai.output.messages").ok_or_else(|| anyhow::anyhow!("no output"))?,
    )?;
    assert_eq!(answered[0]["finish_reason"], "tool_calls");
    assert_eq!(answered[0]["parts"][0]["name"], "lookup");
    provider.shutdown()?;
    Ok(())
}
