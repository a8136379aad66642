//! Wall-clock time, injected so that deadlines, idle timeouts and retention are testable.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in milliseconds since the Unix epoch.
///
/// Every rule that depends on time (deadlines, retention, idle passivation) reads it through
/// this trait, so tests move time with a [`ManualClock`] instead of sleeping.
pub trait Clock: Send + Sync + Debug + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to. Clones share the same time.
///
/// ```
/// use dormant_actors::{Clock, ManualClock};
/// let clock = ManualClock::new(0);
/// clock.advance(1_500);
/// assert_eq!(clock.now_ms(), 1_500);
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock that reads `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start_ms)),
        }
    }

    /// Moves time forward by `ms`, stopping at `u64::MAX`: time never wraps round to the
    /// past, where armed deadlines would wait forever.
    pub fn advance(&self, ms: u64) {
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(ms))
            });
    }

    /// Sets the time to `ms`.
    pub fn set(&self, ms: u64) {
        self.now.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_stops_at_the_end_of_time_instead_of_wrapping() {
        let clock = ManualClock::new(u64::MAX - 10);
        clock.advance(1_000);
        assert_eq!(clock.now_ms(), u64::MAX);
        clock.advance(1);
        assert_eq!(clock.now_ms(), u64::MAX);
    }
}
