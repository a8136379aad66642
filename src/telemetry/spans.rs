//! The spans of a session's runs: opened and closed by its actor as the run's effects and
//! hook events go by (the actor is the only writer, so no lock).

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::SystemTime;

use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::{
    Link, Span, SpanKind, Status as SpanStatus, TraceContextExt, Tracer, TracerProvider,
};
use opentelemetry::{Context, InstrumentationScope, KeyValue};

use super::{ids, RunOrigin};
use crate::definition::{AgentDefinition, Approval, ToolKind};
use crate::llm::reply::ModelReply;
use crate::llm::{LlmError, ModelRequest};
use crate::session::RunOutcome;
use crate::session::NOT_APPROVED;
use crate::types::hooks::HookEvent;
use crate::types::ids::{RunId, SessionId};
use crate::types::message::ToolOutcome;
use crate::types::record::Status;

/// What a runtime records its spans with
/// ([`RuntimeBuilder::telemetry`](crate::RuntimeBuilder::telemetry)): a tracer of the
/// application's tracer provider, and whether content is recorded.
pub struct Telemetry {
    tracer: BoxedTracer,
    capture_content: bool,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("capture_content", &self.capture_content)
            .finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Records with a tracer of `provider` (the SDK's `SdkTracerProvider`, with the
    /// application's exporter), scoped `dormant`.
    pub fn new<P>(provider: &P) -> Self
    where
        P: TracerProvider,
        P::Tracer: Send + Sync + 'static,
        <P::Tracer as Tracer>::Span: Send + Sync + 'static,
    {
        let tracer = provider.tracer_with_scope(scope());
        Self {
            tracer: BoxedTracer::new(Box::new(tracer)),
            capture_content: false,
        }
    }

    /// Records with the global tracer provider (`opentelemetry::global`), as it is when this
    /// is called: set the provider first.
    pub fn global() -> Self {
        Self {
            tracer: opentelemetry::global::tracer_with_scope(scope()),
            capture_content: false,
        }
    }

    /// Records content (off by default: it may hold what a person typed, or secrets): the
    /// conversation sent to the model, the system prompt and the reply on the `chat` spans
    /// (`gen_ai.input.messages`, `gen_ai.system_instructions`, `gen_ai.output.messages`, as
    /// the GenAI conventions' `{role, parts}` JSON), and tool results and the inputs of calls
    /// dispatched in this process on the `execute_tool` spans (`gen_ai.tool.call.result`,
    /// `gen_ai.tool.call.arguments`).
    #[must_use]
    pub fn capture_content(mut self, capture: bool) -> Self {
        self.capture_content = capture;
        self
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("dormant")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

/// The run span a session has open, and when each call in flight began.
#[derive(Debug, Default)]
pub(crate) struct SessionSpans {
    run: Option<OpenRun>,
    /// Each call in flight: when it was dispatched, and its input if content is recorded.
    started: HashMap<String, (SystemTime, Option<String>)>,
}

#[derive(Debug)]
struct OpenRun {
    id: RunId,
    context: Context,
}

impl SessionSpans {
    /// Opens run `run`'s span if it is not open (a run's first effect).
    pub(crate) fn run(
        &mut self,
        tracing: &super::Tracing,
        origin: &RunOrigin<'_>,
        session: &SessionId,
        run: RunId,
    ) {
        if let Some(telemetry) = tracing {
            self.open(telemetry, origin, session, run);
        }
    }

    fn open(
        &mut self,
        telemetry: &Telemetry,
        origin: &RunOrigin<'_>,
        session: &SessionId,
        run: RunId,
    ) -> &Context {
        if self.run.as_ref().is_some_and(|open| open.id != run) {
            // A run's span closes when it settles; one still open here was cut (a commit
            // failed, the actor restarted): it ends as such.
            if let Some(open) = self.run.take() {
                let span = open.context.span();
                span.set_attribute(KeyValue::new("dormant.run.status", "cut"));
                span.end();
            }
        }
        let open = self.run.get_or_insert_with(|| {
            let agent = origin.agent.map_or("agent", AgentDefinition::name);
            let (trace, span) = ids::run_trace(run);
            // A remote child's runs link to the run that called it, in the parent's process.
            let links = origin
                .traceparent
                .and_then(ids::parse_traceparent)
                .map(|call| vec![Link::with_context(call)])
                .unwrap_or_default();
            let span = telemetry
                .tracer
                .span_builder(format!("invoke_agent {agent}"))
                .with_kind(SpanKind::Internal)
                .with_trace_id(trace)
                .with_span_id(span)
                .with_links(links)
                .with_attributes([
                    KeyValue::new("gen_ai.operation.name", "invoke_agent"),
                    KeyValue::new("gen_ai.agent.name", agent.to_string()),
                    KeyValue::new("gen_ai.conversation.id", session.to_string()),
                    KeyValue::new("dormant.run.id", run.to_string()),
                ])
                .start_with_context(&telemetry.tracer, &Context::new());
            OpenRun {
                id: run,
                context: Context::new().with_span(span),
            }
        });
        &open.context
    }

    /// Records what a hook event says: a resume's link, a call's start and end, a suspension.
    pub(crate) fn hook(
        &mut self,
        tracing: &super::Tracing,
        origin: &RunOrigin<'_>,
        event: &HookEvent,
    ) {
        let Some(telemetry) = tracing else { return };
        let agent = origin.agent;
        match event {
            HookEvent::AgentResumed {
                session,
                run_id,
                previous_run_id,
                suspended_ms,
                ..
            } => {
                let context = self.open(telemetry, origin, session, *run_id);
                let span = context.span();
                span.add_link(ids::run_context(*previous_run_id), Vec::new());
                span.set_attribute(KeyValue::new(
                    "dormant.previous_run_id",
                    previous_run_id.to_string(),
                ));
                if let Some(waited) = suspended_ms.and_then(|ms| i64::try_from(ms).ok()) {
                    span.set_attribute(KeyValue::new("dormant.suspended_ms", waited));
                }
            }
            HookEvent::BeforeTool {
                session,
                run_id,
                call,
            } => {
                self.open(telemetry, origin, session, *run_id);
                let input = telemetry.capture_content.then(|| call.input.to_string());
                self.started
                    .insert(call.id.clone(), (SystemTime::now(), input));
            }
            HookEvent::AfterTool {
                run_id,
                tool_call_id,
                tool_name,
                outcome,
                ..
            } => {
                let started = self.started.remove(tool_call_id);
                // A call closed after its run ended (a timeout, an interrupt or an abort of a
                // suspended run): under that run's span, which is not opened again.
                let context = match &self.run {
                    Some(open) if open.id == *run_id => open.context.clone(),
                    _ => Context::new().with_remote_span_context(ids::run_context(*run_id)),
                };
                let kind = agent
                    .and_then(|agent| agent.tool(tool_name))
                    .map(|tool| (&tool.def.kind, tool.def.approval()));
                tool_span(
                    telemetry,
                    &context,
                    *run_id,
                    tool_call_id,
                    tool_name,
                    kind,
                    outcome,
                    started,
                );
            }
            HookEvent::AgentSuspended {
                run_id,
                tool_call_ids,
                ..
            } => {
                // Said by the run as it suspends: its span is open, unless it was never
                // recorded here (then there is nothing to mark).
                let Some(open) = self.run.as_ref().filter(|open| open.id == *run_id) else {
                    return;
                };
                let context = &open.context;
                let waits: Vec<opentelemetry::StringValue> =
                    tool_call_ids.iter().map(|id| id.clone().into()).collect();
                let span = context.span();
                span.set_attribute(KeyValue::new(
                    "dormant.run.pending_calls",
                    opentelemetry::Value::Array(waits.into()),
                ));
                span.add_event("suspended", Vec::new());
            }
            _ => {}
        }
    }

    /// Opens a model call's span under its run's.
    pub(crate) fn chat(
        &mut self,
        tracing: &super::Tracing,
        origin: &RunOrigin<'_>,
        run: RunId,
        request: &ModelRequest,
        provider: &str,
    ) -> ChatSpan {
        let Some(telemetry) = tracing else {
            return ChatSpan(None);
        };
        let context = self
            .open(telemetry, origin, &request.session_id, run)
            .clone();
        let name = match &request.settings.model {
            Some(model) => format!("chat {model}"),
            None => "chat".to_string(),
        };
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.provider.name", provider.to_string()),
            KeyValue::new("gen_ai.agent.name", request.agent.clone()),
        ];
        if let Some(model) = &request.settings.model {
            attributes.push(KeyValue::new("gen_ai.request.model", model.clone()));
        }
        if telemetry.capture_content {
            if !request.system_prompt.is_empty() {
                attributes.push(KeyValue::new(
                    "gen_ai.system_instructions",
                    request.system_prompt.clone(),
                ));
            }
            attributes.push(KeyValue::new(
                "gen_ai.input.messages",
                super::content::input_messages(&request.messages),
            ));
        }
        let span = telemetry
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(&telemetry.tracer, &context);
        ChatSpan(Some((
            Context::new().with_span(span),
            telemetry.capture_content,
        )))
    }

    /// Closes the run's span as the run settles (completed, failed, suspended, interrupted).
    pub(crate) fn settle(&mut self, tracing: &super::Tracing, outcome: &RunOutcome) {
        if tracing.is_none() || self.run.as_ref().map(|open| open.id) != Some(outcome.run_id) {
            return;
        }
        let Some(open) = self.run.take() else { return };
        let span = open.context.span();
        span.set_attribute(KeyValue::new("dormant.run.status", outcome.status.as_str()));
        if outcome.status == Status::Failed {
            let reason = outcome
                .error
                .as_ref()
                .map(|error| format!("{:?}: {}", error.code, error.message))
                .unwrap_or_default();
            span.set_status(SpanStatus::error(reason));
        }
        span.end();
    }
}

/// One `execute_tool` span, under the run's, with the call's derived span id.
#[allow(clippy::too_many_arguments)]
fn tool_span(
    telemetry: &Telemetry,
    run_context: &Context,
    run: RunId,
    tool_call_id: &str,
    tool_name: &str,
    kind: Option<(&ToolKind, &Approval)>,
    outcome: &ToolOutcome,
    started: Option<(SystemTime, Option<String>)>,
) {
    let (started, input) = started.map_or((None, None), |(at, input)| (Some(at), input));
    let mut attributes = vec![
        KeyValue::new("gen_ai.operation.name", "execute_tool"),
        KeyValue::new("gen_ai.tool.name", tool_name.to_string()),
        KeyValue::new("gen_ai.tool.call.id", tool_call_id.to_string()),
        KeyValue::new(
            "dormant.tool.outcome",
            if outcome.is_error() { "error" } else { "ok" },
        ),
    ];
    if let Some((kind, approval)) = kind {
        attributes.push(KeyValue::new("dormant.tool.kind", kind_name(kind)));
        if let Some(decision) = approval_decision(approval, outcome) {
            attributes.push(KeyValue::new("dormant.approval.decision", decision));
        }
    }
    if let Some(code) = outcome.code() {
        attributes.push(KeyValue::new("error.type", code.as_str()));
    }
    if telemetry.capture_content {
        let result = match outcome {
            ToolOutcome::Result(value) => value.to_string(),
            ToolOutcome::Error(text) => text.clone(),
        };
        attributes.push(KeyValue::new("gen_ai.tool.call.result", result));
        if let Some(input) = input {
            attributes.push(KeyValue::new("gen_ai.tool.call.arguments", input));
        }
    }
    let mut builder = telemetry
        .tracer
        .span_builder(format!("execute_tool {tool_name}"))
        .with_kind(SpanKind::Internal)
        .with_span_id(ids::tool_span_id(run, tool_call_id))
        .with_attributes(attributes);
    if let Some(started) = started {
        builder = builder.with_start_time(started);
    }
    let mut span = builder.start_with_context(&telemetry.tracer, run_context);
    if outcome.is_error() {
        span.set_status(SpanStatus::Error {
            description: Cow::Borrowed("tool error"),
        });
    }
    span.end();
}

/// What a person decided about a call of a tool that needs approval, when the outcome says:
/// denied (the seeds' refusal text), or approved (the tool always asks, and it ran: its result,
/// or an error of its own, which carries no runtime code). `None` when the runtime closed the
/// call (a timeout, an abandonment, an abort, input that did not fit: nobody may have decided)
/// or the tool asks only sometimes.
fn approval_decision(approval: &Approval, outcome: &ToolOutcome) -> Option<&'static str> {
    if matches!(approval, Approval::Never) {
        return None;
    }
    if matches!(outcome, ToolOutcome::Error(text) if text.starts_with(NOT_APPROVED)) {
        return Some("denied");
    }
    let always = matches!(approval, Approval::Always | Approval::Editable);
    (always && outcome.code().is_none()).then_some("approved")
}

fn kind_name(kind: &ToolKind) -> &'static str {
    match kind {
        ToolKind::Server(_) => "server",
        ToolKind::Client { .. } => "client",
        ToolKind::SubAgent { .. } => "sub_agent",
        ToolKind::RemoteSubAgent { endpoint, .. }
            if endpoint.starts_with(crate::remote::A2A_SCHEME) =>
        {
            "a2a_agent"
        }
        ToolKind::RemoteSubAgent { .. } => "remote_sub_agent",
    }
}

/// A model call's span, closed with what the model answered.
#[derive(Debug)]
pub(crate) struct ChatSpan(Option<(Context, bool)>);

impl ChatSpan {
    /// Ends the span with the reply's usage and finish reason, or the error.
    pub(crate) fn end(self, reply: &Result<ModelReply, LlmError>) {
        let Some((context, capture_content)) = self.0 else {
            return;
        };
        let span = context.span();
        match reply {
            Ok(reply) => {
                let finish = if reply.tool_calls.is_empty() {
                    "stop"
                } else {
                    "tool_calls"
                };
                if capture_content {
                    span.set_attribute(KeyValue::new(
                        "gen_ai.output.messages",
                        super::content::output_messages(
                            reply.text.as_deref(),
                            &reply.tool_calls,
                            finish,
                        ),
                    ));
                }
                let finish: opentelemetry::StringValue = finish.into();
                span.set_attribute(KeyValue::new(
                    "gen_ai.response.finish_reasons",
                    opentelemetry::Value::Array(vec![finish].into()),
                ));
                if let Some(usage) = &reply.usage {
                    span.set_attribute(KeyValue::new(
                        "gen_ai.usage.input_tokens",
                        usage.input_tokens as i64,
                    ));
                    span.set_attribute(KeyValue::new(
                        "gen_ai.usage.output_tokens",
                        usage.output_tokens as i64,
                    ));
                }
            }
            Err(error) => {
                span.set_attribute(KeyValue::new("error.type", "model_error"));
                span.set_status(SpanStatus::error(error.to_string()));
            }
        }
        span.end();
    }
}
