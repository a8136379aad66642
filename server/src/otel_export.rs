//! The binary's OpenTelemetry export (feature `otel`): the SDK with an OTLP/HTTP exporter for
//! traces and metrics, configured by the standard `OTEL_*` variables, when any
//! `OTEL_EXPORTER_OTLP_*ENDPOINT` is set. The runtime records its spans and metrics through it.

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;

/// The providers the binary exports with; flushed and stopped by [`Export::shutdown`].
pub(crate) struct Export {
    traces: SdkTracerProvider,
    metrics: SdkMeterProvider,
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
        let wanted = ENDPOINTS
            .iter()
            .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()));
        if disabled || !wanted {
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
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("dormant-server");
        }
        let resource = resource.build();
        let spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
            .map_err(|error| format!("OTLP span exporter: {error}"))?;
        let traces = SdkTracerProvider::builder()
            .with_resource(resource.clone())
            .with_batch_exporter(spans)
            .build();
        let points = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .build()
            .map_err(|error| format!("OTLP metric exporter: {error}"))?;
        let metrics = SdkMeterProvider::builder()
            .with_resource(resource)
            .with_periodic_exporter(points)
            .build();
        Ok(Some(Self { traces, metrics }))
    }

    /// What the runtime records its spans with.
    pub(crate) fn telemetry(&self) -> dormant::telemetry::Telemetry {
        dormant::telemetry::Telemetry::new(&self.traces)
    }

    /// Registers the runtime's metrics.
    pub(crate) fn observe(&self, runtime: &dormant::Runtime) {
        dormant::telemetry::observe_metrics(runtime, &self.metrics.meter("dormant"));
    }

    /// Exports what is queued and stops.
    pub(crate) fn shutdown(self) {
        if let Err(error) = self.traces.shutdown() {
            tracing::warn!(%error, "otel.traces_shutdown_failed");
        }
        if let Err(error) = self.metrics.shutdown() {
            tracing::warn!(%error, "otel.metrics_shutdown_failed");
        }
    }
}
