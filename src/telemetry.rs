//! OpenTelemetry traces and metrics after the GenAI semantic conventions, with the feature
//! `otel`.
//!
//! dormant records through the OpenTelemetry API only; the application installs the SDK and
//! its exporter (OTLP, say) and hands the runtime a [`Telemetry`]
//! ([`RuntimeBuilder::telemetry`](crate::RuntimeBuilder::telemetry)). Without one, nothing is
//! recorded and nothing is spent.
//!
//! **Spans.** Each run is an `invoke_agent {agent}` span (`gen_ai.operation.name`,
//! `gen_ai.agent.name`, `gen_ai.conversation.id` = the session id, `dormant.run.id`,
//! `dormant.run.status` when it ends: `completed`, `failed`, `interrupted`, or the suspended
//! status with `dormant.run.pending_calls`, the calls it waits on). Under it, a `chat {model}`
//! span per model call (`gen_ai.request.model`, `gen_ai.usage.input_tokens`,
//! `gen_ai.usage.output_tokens`, `gen_ai.response.finish_reasons`) and an `execute_tool {tool}`
//! span per call (`gen_ai.tool.name`, `gen_ai.tool.call.id`, `dormant.tool.kind`,
//! `dormant.tool.outcome`; for an approval-gated tool, `dormant.approval.decision`).
//!
//! **Across suspensions and restarts.** A run's trace id and span id are derived from its run
//! id ([`run_trace`]), so the run that resumes a suspended one (after a restart too: nothing
//! is kept in memory between them) links to the suspended run's span and carries
//! `dormant.previous_run_id` and `dormant.suspended_ms` (how long it waited), and a remote child's runs link to the run that called it, from
//! another process, through the W3C `traceparent` the remote protocol carries
//! ([`traceparent`]).
//!
//! **Content** (the messages sent to the model and its replies, the system prompt, tool
//! inputs and results) is not recorded unless [`Telemetry::capture_content`] says so.
//!
//! ```no_run
//! # fn demo(provider: &opentelemetry::global::GlobalTracerProvider) -> Result<(), Box<dyn std::error::Error>> {
//! use dormant::telemetry::Telemetry;
//! use dormant::Runtime;
//!
//! // `provider`: the SDK's tracer provider with its exporter, set up by the application.
//! let runtime = Runtime::builder()
//!     .telemetry(Telemetry::new(provider))
//!     .build()?;
//! # let _ = runtime;
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "otel")]
mod content;
#[cfg(feature = "otel")]
mod ids;
#[cfg(feature = "otel")]
mod metrics;
#[cfg(feature = "otel")]
mod spans;

#[cfg(feature = "otel")]
pub use ids::{run_trace, traceparent};
#[cfg(feature = "otel")]
pub use metrics::observe_metrics;
#[cfg(feature = "otel")]
pub(crate) use spans::SessionSpans;
#[cfg(feature = "otel")]
pub use spans::Telemetry;

/// The W3C `traceparent` a remote child's start carries: that of the run `run` that calls it.
/// Derived from the run id alone, so it is carried whether or not the runtime records spans
/// (a child's server may, where this one does not).
#[cfg(feature = "otel")]
pub(crate) fn call_traceparent(run: crate::types::ids::RunId) -> Option<String> {
    Some(traceparent(run))
}

/// Without the `otel` feature: no trace context to carry.
#[cfg(not(feature = "otel"))]
pub(crate) fn call_traceparent(_run: crate::types::ids::RunId) -> Option<String> {
    None
}

/// What a session's spans are named and linked by: its agent, and for a remote child the
/// `traceparent` of the run that called it.
#[derive(Clone, Copy, Debug, Default)]
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
pub(crate) struct RunOrigin<'a> {
    pub(crate) agent: Option<&'a crate::definition::AgentDefinition>,
    pub(crate) traceparent: Option<&'a str>,
}

/// What the engine records spans with: the runtime's [`Telemetry`], if it has one.
#[cfg(feature = "otel")]
pub(crate) type Tracing = Option<std::sync::Arc<Telemetry>>;

/// Without the `otel` feature: nothing to record with.
#[cfg(not(feature = "otel"))]
pub(crate) type Tracing = ();

/// Without the `otel` feature: a session's spans are nothing, and cost nothing.
#[cfg(not(feature = "otel"))]
#[derive(Debug, Default)]
pub(crate) struct SessionSpans;

#[cfg(not(feature = "otel"))]
impl SessionSpans {
    #[inline]
    pub(crate) fn hook(
        &mut self,
        _tracing: &Tracing,
        _origin: &RunOrigin<'_>,
        _event: &crate::types::hooks::HookEvent,
    ) {
    }

    #[inline]
    pub(crate) fn run(
        &mut self,
        _tracing: &Tracing,
        _origin: &RunOrigin<'_>,
        _session: &crate::types::ids::SessionId,
        _run: crate::types::ids::RunId,
    ) {
    }

    #[inline]
    pub(crate) fn chat(
        &mut self,
        _tracing: &Tracing,
        _origin: &RunOrigin<'_>,
        _run: crate::types::ids::RunId,
        _request: &crate::llm::ModelRequest,
        _provider: &str,
    ) -> ChatSpan {
        ChatSpan
    }

    #[inline]
    pub(crate) fn settle(&mut self, _tracing: &Tracing, _outcome: &crate::session::RunOutcome) {}
}

/// Without the `otel` feature: a model call's span is nothing.
#[cfg(not(feature = "otel"))]
#[derive(Debug)]
pub(crate) struct ChatSpan;

#[cfg(not(feature = "otel"))]
impl ChatSpan {
    #[inline]
    pub(crate) fn end(self, _reply: &Result<crate::llm::reply::ModelReply, crate::llm::LlmError>) {}
}
