//! The runtime's counters as OpenTelemetry metrics: observed from [`Runtime::stats`] and
//! [`Runtime::client_tool_stats`] whenever the application's meter provider collects.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::metrics::{AsyncInstrument, Meter};
use parking_lot::Mutex;

use crate::runtime::handle::Runtime;
use crate::runtime::WeakRuntime;

/// How old the count of waiting calls may be before a collection has it counted again: the
/// count reads every pending call, too much to do at every collection of a large store.
const WAITING_COUNTED_EVERY: Duration = Duration::from_secs(30);

/// Registers the runtime's metrics with `meter` (from the application's meter provider): the
/// resident sessions, the commits and their latency, the bytes they wrote, the calls that
/// wait for an answer, and the client-tool and approval calls answered, timed out, aborted and
/// abandoned (a suspension cycle is one answered call). The instruments hold the runtime
/// weakly: they read nothing once it is gone.
///
/// `dormant.client_tool.pending` is [`Runtime::waiting_calls`], every session's (on a store
/// several nodes share, the cluster's): a read of every pending call, so a collection has it
/// counted in the background when the count it has is older than 30 seconds, and reports
/// that last count meanwhile (nothing before the first).
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
    let waiting = WaitingCount::new(runtime.downgrade());
    meter
        .u64_observable_gauge("dormant.client_tool.pending")
        .with_description(
            "Calls that wait for an answer: client tools, approvals, questions, reconciliations",
        )
        .with_unit("{call}")
        .with_callback(move |observer| {
            if let Some(count) = waiting.observe() {
                observer.observe(count, &[]);
            }
        })
        .build();
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

/// The last count of waiting calls, counted again in the background once it is stale.
struct WaitingCount {
    runtime: WeakRuntime,
    last: Arc<Last>,
}

#[derive(Default)]
struct Last {
    /// The last count that succeeded (`None`: none yet).
    count: Mutex<Option<u64>>,
    /// When the last count began, whether it succeeded or not: a count that fails (a store
    /// fault, an entry that does not read) is not tried again at every collection.
    tried: Mutex<Option<Instant>>,
    counting: AtomicBool,
}

impl WaitingCount {
    fn new(runtime: WeakRuntime) -> Self {
        Self {
            runtime,
            last: Arc::default(),
        }
    }

    /// The last count, after starting another if it is stale and none is under way.
    fn observe(&self) -> Option<u64> {
        let runtime = self.runtime.upgrade()?;
        let stale = self
            .last
            .tried
            .lock()
            .is_none_or(|at| at.elapsed() >= WAITING_COUNTED_EVERY);
        if stale && !self.last.counting.swap(true, Ordering::AcqRel) {
            *self.last.tried.lock() = Some(Instant::now());
            let last = Arc::clone(&self.last);
            let weak = runtime.downgrade();
            runtime.spawn_detached(async move {
                let counted = match weak.upgrade() {
                    Some(runtime) => runtime.waiting_calls().await,
                    None => Err(crate::ReadError::ShutDown),
                };
                match counted {
                    Ok(count) => *last.count.lock() = Some(count),
                    // Kept as it was; counted again once the attempt is stale.
                    Err(error) => tracing::debug!(%error, "telemetry.waiting_count_failed"),
                }
                last.counting.store(false, Ordering::Release);
            });
        }
        *self.last.count.lock()
    }
}
