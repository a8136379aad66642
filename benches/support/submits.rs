//! Submits under load, shared by the benches that measure submit latency.

use std::time::{Duration, Instant};

use dormant::Runtime;
use dormant::{Submit, SubmitOutcome};
use futures::{stream, StreamExt};
use hdrhistogram::Histogram;

/// Sends `submits` with `in_flight` at a time, each expected `accepted`; returns the latency
/// histogram (µs) and the wall time of the whole batch.
pub(crate) async fn submit_latencies(
    runtime: &Runtime,
    submits: Vec<Submit>,
    in_flight: usize,
) -> anyhow::Result<(Histogram<u64>, Duration)> {
    let started = Instant::now();
    let latencies: Vec<anyhow::Result<Duration>> = stream::iter(submits)
        .map(|submit| {
            let runtime = runtime.clone();
            async move {
                let started = Instant::now();
                let outcome = runtime.submit_tool_result(submit).await?;
                anyhow::ensure!(outcome == SubmitOutcome::Accepted, "{outcome:?}");
                Ok(started.elapsed())
            }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let elapsed = started.elapsed();
    let mut histogram = Histogram::<u64>::new(3)?;
    for latency in latencies {
        histogram.record(u64::try_from(latency?.as_micros()).unwrap_or(u64::MAX))?;
    }
    Ok((histogram, elapsed))
}
