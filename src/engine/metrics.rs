//! Counters and latency histograms the runtime exposes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use parking_lot::Mutex;

use crate::store::Batch;

/// A latency distribution, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Latency {
    /// Samples recorded.
    pub count: u64,
    /// Median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest.
    pub max_us: u64,
    /// All samples added up (from the histogram's buckets, so within its 3 significant
    /// digits): with `count`, a Prometheus summary's `_sum`, and the mean.
    pub sum_us: u64,
}

/// The sum of a histogram's samples, as its mean tells it.
fn sum_of(histogram: &Histogram<u64>) -> u64 {
    // Saturating float-to-int conversion: a sum past u64::MAX µs is past any real run.
    (histogram.mean() * histogram.len() as f64).round() as u64
}

/// A thread-safe histogram of durations (1 µs to 1 hour, 3 significant digits).
#[derive(Debug)]
pub(crate) struct LatencyHistogram {
    histogram: Mutex<Option<Histogram<u64>>>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            histogram: Mutex::new(Histogram::new_with_bounds(1, 3_600_000_000, 3).ok()),
        }
    }
}

impl LatencyHistogram {
    pub(crate) fn record(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        if let Some(histogram) = self.histogram.lock().as_mut() {
            histogram.saturating_record(micros.max(1));
        }
    }

    pub(crate) fn summary(&self) -> Latency {
        match self.histogram.lock().as_ref() {
            Some(histogram) => Latency {
                count: histogram.len(),
                p50_us: histogram.value_at_quantile(0.5),
                p99_us: histogram.value_at_quantile(0.99),
                p999_us: histogram.value_at_quantile(0.999),
                max_us: histogram.max(),
                sum_us: sum_of(histogram),
            },
            None => Latency::default(),
        }
    }
}

/// How client-tool and approval calls fared.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct ClientToolStats {
    /// Time from a call becoming pending to its accepted answer (recorded in µs; the clock's
    /// resolution is milliseconds).
    pub wait: Latency,
    /// Answers accepted.
    pub answered: u64,
    /// Calls that expired.
    pub timeouts: u64,
    /// How late, after its deadline, each timeout was recorded (µs).
    pub timeout_lag: Latency,
    /// Unanswered calls dropped by an interrupt or abort.
    pub aborted: u64,
    /// Unanswered calls closed by a new message.
    pub abandoned: u64,
}

/// What a commit wrote, taken before the batch moves into the store.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchSize {
    bytes: usize,
    writes: usize,
}

impl BatchSize {
    pub(crate) fn of(batch: &Batch) -> Self {
        Self {
            bytes: batch.byte_len(),
            writes: batch.ops().len(),
        }
    }
}

/// The runtime's own measurements.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    commits: LatencyHistogram,
    commit_bytes: AtomicU64,
    commit_writes: AtomicU64,
    waits: LatencyHistogram,
    timeout_lags: LatencyHistogram,
    timeouts: AtomicU64,
    aborted: AtomicU64,
    abandoned: AtomicU64,
    reconciled: AtomicU64,
}

impl Metrics {
    /// Records a durable commit of `batch` that took `elapsed`.
    pub(crate) fn record_commit(&self, elapsed: Duration, batch: &BatchSize) {
        self.commits.record(elapsed);
        self.commit_bytes.fetch_add(
            u64::try_from(batch.bytes).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.commit_writes.fetch_add(
            u64::try_from(batch.writes).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    pub(crate) fn commit_latency(&self) -> Latency {
        self.commits.summary()
    }

    pub(crate) fn commit_bytes(&self) -> u64 {
        self.commit_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn commit_writes(&self) -> u64 {
        self.commit_writes.load(Ordering::Relaxed)
    }

    pub(crate) fn record_answer(&self, wait_ms: u64) {
        self.waits.record(Duration::from_millis(wait_ms));
    }

    pub(crate) fn record_timeout(&self, lag_ms: u64) {
        self.timeouts.fetch_add(1, Ordering::Relaxed);
        self.timeout_lags.record(Duration::from_millis(lag_ms));
    }

    pub(crate) fn record_aborted(&self, count: usize) {
        self.aborted
            .fetch_add(u64::try_from(count).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub(crate) fn record_abandoned(&self, count: usize) {
        self.abandoned
            .fetch_add(u64::try_from(count).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub(crate) fn record_reconciled(&self, count: usize) {
        self.reconciled
            .fetch_add(u64::try_from(count).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Children recovery has inspected and written a terminal outcome for.
    pub(crate) fn reconciled(&self) -> u64 {
        self.reconciled.load(Ordering::Relaxed)
    }

    pub(crate) fn client_tools(&self) -> ClientToolStats {
        let wait = self.waits.summary();
        ClientToolStats {
            answered: wait.count,
            wait,
            timeouts: self.timeouts.load(Ordering::Relaxed),
            timeout_lag: self.timeout_lags.summary(),
            aborted: self.aborted.load(Ordering::Relaxed),
            abandoned: self.abandoned.load(Ordering::Relaxed),
        }
    }
}
