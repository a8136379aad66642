//! Timing a bench's operation over many runs: the sorted durations, for medians and tails.

use std::future::Future;
use std::time::{Duration, Instant};

/// `runs` timings of `op` (called with the run's number), sorted, shortest first.
pub(crate) async fn timed<F, Fut>(runs: usize, mut op: F) -> anyhow::Result<Vec<Duration>>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let mut times = Vec::with_capacity(runs);
    for i in 0..runs {
        let started = Instant::now();
        op(i).await?;
        times.push(started.elapsed());
    }
    times.sort();
    Ok(times)
}

/// The timing at `percent` of sorted `times` (50: the median).
pub(crate) fn percentile(times: &[Duration], percent: usize) -> Duration {
    times
        .get(times.len() * percent / 100)
        .or(times.last())
        .copied()
        .unwrap_or_default()
}
