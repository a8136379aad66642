//! The runtime's counters as OpenTelemetry metrics: observed from [`Runtime::stats`] and
//! [`Runtime::client_tool_stats`] whenever the application's meter provider collects.

use opentelemetry::metrics::{AsyncInstrument, Meter};

use crate::runtime::handle::Runtime;

/// Registers the runtime's metrics with `meter` (from the application's meter provider): the
/// resident sessions, the commits and their latency, the bytes they wrote, and the client-tool
/// and approval calls answered, timed out, aborted and abandoned (a suspension cycle is one
/// answered call). The instruments hold the runtime weakly: they read nothing once it is gone.
///
/// ```no_run
/// # fn demo(runtime: &dormant::Runtime) {
/// let meter = opentelemetry::global::meter("dormant");
/// dormant::telemetry::observe_metrics(runtime, &meter);
/// # }
/// ```
pub fn observe_metrics(runtime: &Runtime, meter: &Meter) {
    let weak = runtime.downgrade();
    // Each instrument reads one figure of the runtime, while it lives.
    let observe = move |read: fn(&Runtime) -> u64| {
        let weak = weak.clone();
        move |observer: &dyn AsyncInstrument<u64>| {
            if let Some(runtime) = weak.upgrade() {
                observer.observe(read(&runtime), &[]);
            }
        }
    };
    let gauge = |name: &'static str, description: &'static str, unit: &'static str, read| {
        meter
            .u64_observable_gauge(name)
            .with_description(description)
            .with_unit(unit)
            .with_callback(observe(read))
            .build();
    };
    let counter = |name: &'static str, description: &'static str, unit: &'static str, read| {
        meter
            .u64_observable_counter(name)
            .with_description(description)
            .with_unit(unit)
            .with_callback(observe(read))
            .build();
    };
    gauge(
        "dormant.sessions.resident",
        "Sessions with an actor in memory",
        "{session}",
        |runtime| runtime.stats().host.resident as u64,
    );
    counter(
        "dormant.commits",
        "Durable step commits",
        "{commit}",
        |runtime| runtime.stats().commit_latency.count,
    );
    gauge(
        "dormant.commit.latency.p50",
        "Median latency of a durable step commit, as a session waited for it",
        "us",
        |runtime| runtime.stats().commit_latency.p50_us,
    );
    gauge(
        "dormant.commit.latency.p99",
        "99th percentile latency of a durable step commit",
        "us",
        |runtime| runtime.stats().commit_latency.p99_us,
    );
    counter(
        "dormant.commit.bytes",
        "Bytes written by step commits",
        "By",
        |runtime| runtime.stats().commit_bytes,
    );
    counter(
        "dormant.client_tool.answered",
        "Client-tool and approval calls answered: suspension cycles",
        "{call}",
        |runtime| runtime.client_tool_stats().answered,
    );
    counter(
        "dormant.client_tool.timeouts",
        "Client-tool and approval calls that expired",
        "{call}",
        |runtime| runtime.client_tool_stats().timeouts,
    );
    counter(
        "dormant.client_tool.aborted",
        "Unanswered calls dropped by an interrupt or abort",
        "{call}",
        |runtime| runtime.client_tool_stats().aborted,
    );
    counter(
        "dormant.client_tool.abandoned",
        "Unanswered calls closed by a new message",
        "{call}",
        |runtime| runtime.client_tool_stats().abandoned,
    );
}
