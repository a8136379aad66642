//! The server's own measurements, and `GET /metrics` in the Prometheus text format (the
//! runtime's counters beside them).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use dormant::runtime::{Latency, RuntimeStats};
use hdrhistogram::Histogram;
use parking_lot::Mutex;

#[derive(Debug)]
pub(crate) struct HttpMetrics {
    /// The routes, by name, for the counters (a path outside them counts as `other`): the
    /// route table's own paths (server.rs), not a list of their own.
    routes: Vec<&'static str>,
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    latency: Mutex<BTreeMap<&'static str, Histogram<u64>>>,
    /// From a chunk's commit (its `at_ms`) to its event leaving for the client, in µs.
    sse_lag: Mutex<Option<Histogram<u64>>>,
    open_streams: AtomicI64,
}

impl HttpMetrics {
    /// Counters for the routes at `routes`.
    pub(crate) fn new(routes: Vec<&'static str>) -> Self {
        Self {
            routes,
            requests: Mutex::default(),
            latency: Mutex::default(),
            sse_lag: Mutex::new(histogram()),
            open_streams: AtomicI64::new(0),
        }
    }
}

fn histogram() -> Option<Histogram<u64>> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).ok()
}

/// Whether `path` is one of `route`'s: segment by segment, where a `{…}` segment of the
/// route stands for any one segment that is not empty.
fn matches(route: &str, path: &str) -> bool {
    let (mut route, mut path) = (route.split('/'), path.split('/'));
    loop {
        match (route.next(), path.next()) {
            (None, None) => return true,
            (Some(expected), Some(got)) => {
                let any = expected.starts_with('{') && expected.ends_with('}');
                if !(expected == got || (any && !got.is_empty())) {
                    return false;
                }
            }
            _ => return false,
        }
    }
}

fn micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

fn summary(histogram: &Histogram<u64>) -> Latency {
    Latency {
        count: histogram.len(),
        p50_us: histogram.value_at_quantile(0.5),
        p99_us: histogram.value_at_quantile(0.99),
        p999_us: histogram.value_at_quantile(0.999),
        max_us: histogram.max(),
        // As its mean tells it (saturating: past u64::MAX µs is past any real run).
        sum_us: (histogram.mean() * histogram.len() as f64).round() as u64,
    }
}

impl HttpMetrics {
    /// The name `path` is counted under: its route's (`/a2a/{agent}` for `/a2a/demo`), or
    /// `other`.
    pub(crate) fn route_of(&self, path: &str) -> &'static str {
        self.routes
            .iter()
            .find(|route| matches(route, path))
            .copied()
            .unwrap_or("other")
    }

    pub(crate) fn request(&self, route: &'static str, status: StatusCode, elapsed: Duration) {
        *self
            .requests
            .lock()
            .entry((route, status.as_u16()))
            .or_default() += 1;
        if route != "/sse" {
            let mut latency = self.latency.lock();
            if !latency.contains_key(route) {
                if let Some(fresh) = histogram() {
                    latency.insert(route, fresh);
                }
            }
            if let Some(histogram) = latency.get_mut(route) {
                histogram.saturating_record(micros(elapsed));
            }
        }
    }

    pub(crate) fn sse_lag(&self, lag: Duration) {
        if let Some(histogram) = self.sse_lag.lock().as_mut() {
            histogram.saturating_record(micros(lag));
        }
    }

    pub(crate) fn stream_opened(self: &Arc<Self>) -> StreamGuard {
        self.open_streams.fetch_add(1, Ordering::Relaxed);
        StreamGuard(Arc::clone(self))
    }

    /// The Prometheus text exposition of these and the runtime's measurements.
    pub(crate) fn render(
        &self,
        runtime: &RuntimeStats,
        client: &dormant::runtime::ClientToolStats,
    ) -> String {
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        };
        counter(
            "dormant_activations_total",
            "Session actors started.",
            runtime.host.activations,
        );
        counter(
            "dormant_passivations_total",
            "Session actors stopped when idle or evicted.",
            runtime.host.passivations,
        );
        counter(
            "dormant_actor_crashes_total",
            "Panics caught in session actors.",
            runtime.host.crashes,
        );
        counter(
            "dormant_commit_bytes_total",
            "Bytes written by step commits.",
            runtime.commit_bytes,
        );
        counter(
            "dormant_commit_writes_total",
            "Key writes made by step commits.",
            runtime.commit_writes,
        );
        counter(
            "dormant_client_answers_total",
            "Client-tool and approval answers accepted.",
            client.answered,
        );
        counter(
            "dormant_client_timeouts_total",
            "Client-tool and approval calls that expired.",
            client.timeouts,
        );
        let _ = writeln!(
            out,
            "# HELP dormant_resident_sessions Session actors resident now.\n# TYPE dormant_resident_sessions gauge\ndormant_resident_sessions {}",
            runtime.host.resident
        );
        let _ = writeln!(
            out,
            "# HELP dormant_http_open_streams SSE streams open now.\n# TYPE dormant_http_open_streams gauge\ndormant_http_open_streams {}",
            self.open_streams.load(Ordering::Relaxed)
        );
        summary_lines(
            &mut out,
            "dormant_commit_latency_seconds",
            "Durable step commit latency.",
            &[("", runtime.commit_latency)],
        );
        summary_lines(
            &mut out,
            "dormant_client_wait_seconds",
            "From a call becoming pending to its accepted answer.",
            &[("", client.wait)],
        );
        let routes: Vec<(String, Latency)> = self
            .latency
            .lock()
            .iter()
            .map(|(route, histogram)| (format!("route=\"{route}\""), summary(histogram)))
            .collect();
        let labelled: Vec<(&str, Latency)> = routes
            .iter()
            .map(|(label, latency)| (label.as_str(), *latency))
            .collect();
        summary_lines(
            &mut out,
            "dormant_http_request_seconds",
            "Time to answer a request, by route.",
            &labelled,
        );
        if let Some(lag) = self.sse_lag.lock().as_ref() {
            summary_lines(
                &mut out,
                "dormant_http_sse_lag_seconds",
                "From a chunk's commit to its event leaving for the client.",
                &[("", summary(lag))],
            );
        }
        let _ = writeln!(out, "# HELP dormant_http_requests_total Requests answered, by route and status.\n# TYPE dormant_http_requests_total counter");
        for ((route, status), count) in self.requests.lock().iter() {
            let _ = writeln!(
                out,
                "dormant_http_requests_total{{route=\"{route}\",status=\"{status}\"}} {count}"
            );
        }
        out
    }
}

/// Counts a stream as open until it is dropped.
#[derive(Debug)]
pub(crate) struct StreamGuard(Arc<HttpMetrics>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.open_streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A Prometheus summary from a latency distribution in µs (quantiles in seconds).
fn summary_lines(out: &mut String, name: &str, help: &str, series: &[(&str, Latency)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} summary");
    for (labels, latency) in series {
        let sep = if labels.is_empty() { "" } else { "," };
        for (quantile, micros) in [
            ("0.5", latency.p50_us),
            ("0.99", latency.p99_us),
            ("0.999", latency.p999_us),
        ] {
            let _ = writeln!(
                out,
                "{name}{{{labels}{sep}quantile=\"{quantile}\"}} {}",
                seconds(micros)
            );
        }
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {}", seconds(latency.sum_us));
        let _ = writeln!(out, "{name}_count{braces} {}", latency.count);
    }
}

fn seconds(micros: u64) -> String {
    format!("{:.6}", micros as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::HttpMetrics;

    #[test]
    fn a_path_counts_under_its_routes_name_with_its_segments_filled_in() {
        let metrics = HttpMetrics::new(vec![
            "/start",
            "/a2a/{agent}",
            "/a2a/{agent}/.well-known/agent-card.json",
        ]);
        assert_eq!(metrics.route_of("/start"), "/start");
        assert_eq!(metrics.route_of("/a2a/demo"), "/a2a/{agent}");
        assert_eq!(
            metrics.route_of("/a2a/demo/.well-known/agent-card.json"),
            "/a2a/{agent}/.well-known/agent-card.json"
        );
        for other in ["/a2a/", "/a2a", "/a2a/demo/more", "/start/", "/nowhere"] {
            assert_eq!(metrics.route_of(other), "other", "{other}");
        }
    }
}
