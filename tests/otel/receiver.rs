//! An OTLP/HTTP receiver on loopback: what the SDK's exporter posts to `/v1/traces` and
//! `/v1/metrics`, decoded from protobuf with the protocol's own messages.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::metrics::v1::{number_data_point, Metric};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

#[derive(Clone, Debug, Default)]
pub(crate) struct Received {
    spans: Arc<Mutex<Vec<Span>>>,
    metrics: Arc<Mutex<Vec<String>>>,
    gauges: Arc<Mutex<Vec<(String, i64)>>>,
    services: Arc<Mutex<Vec<String>>>,
}

impl Received {
    pub(crate) fn spans(&self) -> Vec<Span> {
        self.spans
            .lock()
            .map(|spans| spans.clone())
            .unwrap_or_default()
    }

    /// The `service.name` of each resource whose spans were received.
    #[allow(dead_code)] // Not every test binary that includes the receiver reads it.
    pub(crate) fn service_names(&self) -> Vec<String> {
        self.services
            .lock()
            .map(|names| names.clone())
            .unwrap_or_default()
    }

    /// The integer values of the gauge `name` received, in order.
    #[allow(dead_code)] // Not every test binary that includes the receiver reads metrics.
    pub(crate) fn gauge(&self, name: &str) -> Vec<i64> {
        self.gauges
            .lock()
            .map(|gauges| {
                gauges
                    .iter()
                    .filter(|(gauge, _)| gauge == name)
                    .map(|(_, value)| *value)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The names of the metrics received.
    #[allow(dead_code)] // Not every test binary that includes the receiver reads metrics.
    pub(crate) fn metric_names(&self) -> Vec<String> {
        self.metrics
            .lock()
            .map(|names| names.clone())
            .unwrap_or_default()
    }
}

async fn traces(State(received): State<Received>, body: Bytes) -> &'static str {
    if let Ok(request) = ExportTraceServiceRequest::decode(body) {
        let services = request
            .resource_spans
            .iter()
            .filter_map(|resource| resource.resource.as_ref())
            .flat_map(|resource| &resource.attributes)
            .filter(|kv| kv.key == "service.name")
            .filter_map(
                |kv| match kv.value.as_ref().and_then(|value| value.value.as_ref()) {
                    Some(AnyValue::StringValue(name)) => Some(name.clone()),
                    _ => None,
                },
            );
        if let Ok(mut all) = received.services.lock() {
            all.extend(services);
        }
        let spans = request
            .resource_spans
            .into_iter()
            .flat_map(|resource| resource.scope_spans)
            .flat_map(|scope| scope.spans);
        if let Ok(mut all) = received.spans.lock() {
            all.extend(spans);
        }
    }
    ""
}

async fn metrics(State(received): State<Received>, body: Bytes) -> &'static str {
    if let Ok(request) = ExportMetricsServiceRequest::decode(body) {
        let metrics: Vec<Metric> = request
            .resource_metrics
            .into_iter()
            .flat_map(|resource| resource.scope_metrics)
            .flat_map(|scope| scope.metrics)
            .collect();
        let gauges =
            metrics.iter().filter_map(|metric| match &metric.data {
                Some(Data::Gauge(gauge)) => gauge.data_points.iter().find_map(|point| match point
                    .value
                {
                    Some(number_data_point::Value::AsInt(value)) => {
                        Some((metric.name.clone(), value))
                    }
                    _ => None,
                }),
                _ => None,
            });
        if let Ok(mut all) = received.gauges.lock() {
            all.extend(gauges);
        }
        if let Ok(mut all) = received.metrics.lock() {
            all.extend(metrics.into_iter().map(|metric| metric.name));
        }
    }
    ""
}

/// The SDK's tracer provider, exporting over OTLP/HTTP (protobuf) to the receiver at `base`,
/// as an application installs it.
pub(crate) fn tracer_provider(
    base: &str,
) -> anyhow::Result<opentelemetry_sdk::trace::SdkTracerProvider> {
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(format!("{base}/v1/traces"))
        .build()?;
    Ok(opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .build())
}

/// Serves the receiver on a loopback port: its base URL and what it received.
pub(crate) async fn serve() -> anyhow::Result<(String, Received)> {
    let received = Received::default();
    let router = axum::Router::new()
        .route("/v1/traces", post(traces))
        .route("/v1/metrics", post(metrics))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok((format!("http://{address}"), received))
}
