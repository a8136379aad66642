//! The binary's OpenTelemetry export (feature `otel`): the SDK with an OTLP/HTTP exporter,
//! configured by the standard `OTEL_*` variables: traces and metrics when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set, or either alone when only its own endpoint
//! (`…_TRACES_ENDPOINT`, `…_METRICS_ENDPOINT`) is. The runtime records through it.

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;

/// The providers the binary exports with; flushed and stopped by [`Export::shutdown`].
pub(crate) struct Export {
    traces: Option<SdkTracerProvider>,
    metrics: Option<SdkMeterProvider>,
}

/// The variables that ask for an export (the SDK reads these and the others itself:
/// `OTEL_EXPORTER_OTLP_HEADERS`, `…_TIMEOUT`, `…_COMPRESSION`, `OTEL_SERVICE_NAME`,
/// `OTEL_RESOURCE_ATTRIBUTES`, and each one's `_TRACES_`/`_METRICS_` form).
const ENDPOINTS: [&str; 3] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
];

impl Export {
    /// The export the environment asks for, if any.
    ///
    /// # Errors
    /// A protocol this build does not speak (`grpc`: it exports over HTTP), or an exporter
    /// the SDK could not build from the variables.
    pub(crate) fn from_env() -> Result<Option<Self>, String> {
        let disabled = std::env::var("OTEL_SDK_DISABLED")
            .is_ok_and(|value| value.eq_ignore_ascii_case("true"));
        let set = |name: &str| std::env::var_os(name).is_some_and(|value| !value.is_empty());
        let [both, traces_only, metrics_only] = ENDPOINTS.map(set);
        let (want_traces, want_metrics) = (both || traces_only, both || metrics_only);
        if disabled || !(want_traces || want_metrics) {
            return Ok(None);
        }
        for name in [
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
        ] {
            if let Ok(protocol) = std::env::var(name) {
                if protocol != "http/protobuf" {
                    return Err(format!("{name}={protocol}: this build exports over OTLP/HTTP with protobuf only (http/protobuf)"));
                }
            }
        }
        let mut resource = Resource::builder();
        let named = std::env::var_os("OTEL_SERVICE_NAME").is_some()
            || std::env::var("OTEL_RESOURCE_ATTRIBUTES")
                .is_ok_and(|attributes| attributes.contains("service.name="));
        if !named {
            resource = resource.with_service_name("dormant-server");
        }
        let resource = resource.build();
        let traces = if want_traces {
            let spans = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .build()
                .map_err(|error| format!("OTLP span exporter: {error}"))?;
            let provider = SdkTracerProvider::builder()
                .with_resource(resource.clone())
                .with_batch_exporter(spans)
                .build();
            Some(provider)
        } else {
            None
        };
        let metrics = if want_metrics {
            let points = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .build()
                .map_err(|error| format!("OTLP metric exporter: {error}"))?;
            let provider = SdkMeterProvider::builder()
                .with_resource(resource)
                .with_periodic_exporter(points)
                .build();
            Some(provider)
        } else {
            None
        };
        Ok(Some(Self { traces, metrics }))
    }

    /// What the runtime records its spans with, if spans are exported.
    pub(crate) fn telemetry(&self) -> Option<dormant::telemetry::Telemetry> {
        self.traces.as_ref().map(dormant::telemetry::Telemetry::new)
    }

    /// Registers the runtime's metrics, if metrics are exported.
    pub(crate) fn observe(&self, runtime: &dormant::Runtime) {
        if let Some(metrics) = &self.metrics {
            dormant::telemetry::observe_metrics(runtime, &metrics.meter("dormant"));
        }
    }

    /// Exports what is queued and stops.
    pub(crate) fn shutdown(self) {
        if let Some(Err(error)) = self.traces.map(|traces| traces.shutdown()) {
            tracing::warn!(%error, "otel.traces_shutdown_failed");
        }
        if let Some(Err(error)) = self.metrics.map(|metrics| metrics.shutdown()) {
            tracing::warn!(%error, "otel.metrics_shutdown_failed");
        }
    }
}
