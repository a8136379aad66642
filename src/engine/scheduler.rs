//! The deadline scheduler: one task that sleeps until the earliest armed deadline, tells the
//! owners of expired calls to record their timeouts, and reaps tombstones past retention. At
//! start it arms from the durable index, so overdue deadlines fire first.
//!
//! A session waiting on a human is never treated as stuck: only its deadline ends the wait.

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use dormant_actors::Host;
use futures::FutureExt;
use tokio::sync::{mpsc, oneshot};

use crate::engine::actor::{SessionActor, SessionMsg};
use crate::engine::deadlines::{SchedulerMsg, SweepReport};
use crate::engine::shared::Shared;
use crate::error::Error;
use crate::store::schema;
use crate::store::{Batch, CommitKind, Tree};
use crate::types::ids::SessionId;

/// Expired calls handled per round of a sweep.
const SWEEP_BATCH: usize = 1024;
/// Tombstones the reaper reads per stretch (each stretch goes on where the last one stopped).
const REAP_BATCH: usize = 4096;
/// Stretches per reap: up to 16,384 tombstones read, a few milliseconds.
const REAP_STRETCHES: usize = 4;
/// The least clock time between two reaps of the background timer. Deadlines can fire many
/// times a second; reading thousands of tombstones each time would cost more than the
/// timeouts. At one reap a second the reaper reads up to 16,384 tombstones a second, so it
/// goes round all of them within their retention as long as calls complete at under 16,384 a
/// second on average.
const REAP_INTERVAL_MS: u64 = 1_000;
/// The lease of the one node that reaps tombstones. A control character keeps it apart from
/// every session id (ids may not hold one).
const REAPER_LEASE: &str = "\u{1}reaper";
/// How long the background timer waits before it looks again at deadlines another node owns.
const DEFERRED_RETRY_MS: u64 = 1_000;
/// How often the background timer looks at a deadline index other nodes share.
const SHARED_INDEX_POLL: Duration = Duration::from_secs(1);
/// The longest the background timer sleeps before it looks at the clock again.
const MAX_SLEEP: Duration = Duration::from_secs(60);

/// The scheduler: one task that owns the timer and the reaper's place. It holds the session
/// host it tells of timeouts; the session actors reach it only through [`Deadlines`](super::deadlines::Deadlines), so it
/// is built after them and nothing is filled in later.
#[derive(Debug)]
pub(crate) struct DeadlineScheduler {
    pub(crate) shared: Arc<Shared>,
    pub(crate) sessions: Host<SessionActor>,
    /// Whether it wakes by itself (off when a test drives time with a manual clock).
    pub(crate) background: bool,
}

/// The armed wake-up, if any, and where the tombstone reaper goes on from.
#[derive(Debug, Default)]
struct Timer {
    wake_at: Option<u64>,
    /// Where the tombstone reaper goes on from.
    reaper: Reaper,
}

/// The tombstone reaper's place in its round.
#[derive(Debug, Default)]
struct Reaper {
    /// The first tombstone key the next reap reads (`None`: from the beginning).
    from: Option<Vec<u8>>,
    /// When it last reaped (clock ms).
    reaped_at: Option<u64>,
}

impl Reaper {
    /// Whether a sweep at `now` reaps: an explicit sweep always does, the background timer's
    /// at most once per [`REAP_INTERVAL_MS`].
    fn due(&self, explicit: bool, now: u64) -> bool {
        explicit
            || self
                .reaped_at
                .is_none_or(|at| now >= at.saturating_add(REAP_INTERVAL_MS))
    }
}

impl DeadlineScheduler {
    /// Runs the scheduler until every [`Deadlines`](super::deadlines::Deadlines) handle is gone (or the task is aborted).
    /// At start it arms the timer from the durable index, so overdue deadlines fire first.
    pub(crate) async fn run(self, mut requests: mpsc::UnboundedReceiver<SchedulerMsg>) {
        let mut timer = Timer::default();
        self.rearm(&mut timer).await;
        if self.background && self.resume_owed().await {
            // What a crash left owed goes on at once.
            timer.wake_at = Some(self.shared.clock.now_ms());
        }
        loop {
            let mut sleep = timer.wake_at.map(|at| self.delay_until(at));
            if self.background && self.shared.leases.is_shared() {
                // Other nodes arm deadlines in the shared index without telling this one:
                // look at it at least this often, so those of a node that died still fire.
                sleep = Some(sleep.map_or(SHARED_INDEX_POLL, |delay| delay.min(SHARED_INDEX_POLL)));
            }
            let msg = tokio::select! {
                msg = requests.recv() => match msg {
                    Some(msg) => msg,
                    None => return,
                },
                () = sleep_for(sleep) => SchedulerMsg::Sweep { reply: None },
            };
            match msg {
                SchedulerMsg::Armed { at } => {
                    if self.background && timer.wake_at.is_none_or(|wake| at < wake) {
                        timer.wake_at = Some(at);
                    }
                }
                SchedulerMsg::Sweep { reply } => {
                    timer.wake_at = None;
                    // The scheduler is one task for the whole runtime: a sweep that panics
                    // (a store that panics on a damaged entry) is a failed sweep, not the end
                    // of every deadline from then on.
                    let swept = AssertUnwindSafe(self.sweep(reply.is_some(), &mut timer.reaper))
                        .catch_unwind()
                        .await;
                    let report = swept.unwrap_or_else(|panic| Err(panicked("sweep", &*panic)));
                    if let Err(error) = &report {
                        tracing::error!(%error, "deadline.sweep_failed");
                    }
                    self.rearm(&mut timer).await;
                    if report.is_err() && self.background {
                        // Tried again later rather than at once, and not never.
                        let later = self.shared.clock.now_ms().saturating_add(DEFERRED_RETRY_MS);
                        timer.wake_at = Some(timer.wake_at.map_or(later, |at| at.max(later)));
                    }
                    if matches!(&report, Ok(report) if report.deferred > 0) {
                        // Deadlines another node owns stay due in the index: look again
                        // later rather than at once (the owner fires them meanwhile, or its
                        // lease expires and this node takes the session over).
                        let later = self.shared.clock.now_ms().saturating_add(DEFERRED_RETRY_MS);
                        timer.wake_at = timer.wake_at.map(|at| at.max(later));
                    }
                    if let Some(reply) = reply {
                        let _ = reply.send(report);
                    }
                }
            }
        }
    }

    /// How long until clock time `at` (at once if it has passed), at most [`MAX_SLEEP`].
    fn delay_until(&self, at: u64) -> Duration {
        Duration::from_millis(at.saturating_sub(self.shared.clock.now_ms())).min(MAX_SLEEP)
    }

    /// Arms the timer for the earliest deadline in the durable index. A read that fails or
    /// panics arms it to read again a little later (sooner, if it was armed sooner): left
    /// unarmed, the timer would wait for a new deadline, which may never come, and the
    /// deadlines in the index would never fire.
    async fn rearm(&self, timer: &mut Timer) {
        if !self.background {
            return;
        }
        let next = AssertUnwindSafe(schema::next_deadline(self.shared.store.as_ref()))
            .catch_unwind()
            .await;
        let error = match next {
            Ok(Ok(next)) => {
                timer.wake_at = next;
                // Only a runtime that resumes by itself writes them: the others fire what a
                // run with `auto_resume` left at start, and read nothing more after a sweep.
                if self.shared.policy.auto_resume && self.resume_owed().await {
                    // Resumes still owed (their resume under way, or its commit failed) are
                    // looked at again a little later, not only when a deadline falls due.
                    let later = self.shared.clock.now_ms().saturating_add(DEFERRED_RETRY_MS);
                    timer.wake_at = Some(timer.wake_at.map_or(later, |at| at.min(later)));
                }
                return;
            }
            Ok(Err(error)) => error.to_string(),
            Err(panic) => panicked("rearm", &*panic).to_string(),
        };
        tracing::error!(%error, "deadline.rearm_failed");
        let later = self.shared.clock.now_ms().saturating_add(DEFERRED_RETRY_MS);
        timer.wake_at = Some(timer.wake_at.map_or(later, |at| at.min(later)));
    }

    /// Whether the index holds resumes owed (`schema::RESUME_DUE`): they sit before every
    /// real deadline, where `next_deadline` does not look, so the first sweep fires them, and
    /// [`Self::rearm`] looks again a second later while any is left. A read that fails or
    /// panics says yes: a sweep for nothing costs a scan.
    async fn resume_owed(&self) -> bool {
        let owed = AssertUnwindSafe(schema::any_resume_due(self.shared.store.as_ref()))
            .catch_unwind()
            .await;
        !matches!(owed, Ok(Ok(false)))
    }

    /// Fires every expired call, earliest first, then reaps old tombstones if the reaper is
    /// due. An explicit sweep (`settle`) also waits for the sessions it touched to settle.
    async fn sweep(&self, settle: bool, reaper: &mut Reaper) -> Result<SweepReport, Error> {
        let store = self.shared.store.as_ref();
        let now = self.shared.clock.now_ms();
        let mut report = SweepReport::default();
        let mut seen = HashSet::new();
        let mut touched: HashSet<SessionId> = HashSet::new();
        let mut undelivered = HashSet::new();
        let mut fired = HashSet::new();
        // Where the scan starts: the index's start, or past a whole page of entries handled
        // already (deferred to the nodes that own them, say), so that they cannot keep the
        // entries after them from ever being read.
        let mut from: Vec<u8> = Vec::new();
        loop {
            let expired = schema::expired_calls_from(store, &from, now, SWEEP_BATCH).await?;
            let fresh: Vec<_> = expired
                .iter()
                .filter(|call| seen.insert((call.session.clone(), call.tool_call_id.clone())))
                .cloned()
                .collect();
            if fresh.is_empty() {
                // Entries that survived their owner's timeout are stale (the owner has no such
                // call): clear them so they are not fired forever. Not those of sessions this
                // node could not handle (another node owns them): their owner fires them.
                let next = (expired.len() >= SWEEP_BATCH)
                    .then(|| expired.last().map(schema::ExpiredCall::key_after))
                    .flatten();
                // Nor resume-due entries: their sessions remove them, in commits their lease
                // fences (one left is a resume under way, or one still owed).
                let stale: Vec<_> = expired
                    .into_iter()
                    .filter(|call| {
                        call.tool_call_id != schema::RESUME_DUE
                            && !undelivered
                                .contains(&(call.session.clone(), call.tool_call_id.clone()))
                    })
                    .collect();
                self.clear_stale(&stale).await?;
                // Fired, they did nothing: not counted as fired.
                let was_fired = stale
                    .iter()
                    .filter(|call| {
                        fired.contains(&(call.session.clone(), call.tool_call_id.clone()))
                    })
                    .count();
                report.fired = report.fired.saturating_sub(was_fired);
                report.cleared += stale.len();
                match next {
                    Some(next) => {
                        from = next;
                        continue;
                    }
                    None => break,
                }
            }
            let mut recorded = Vec::with_capacity(fresh.len());
            for call in &fresh {
                let (reply, done) = oneshot::channel();
                self.sessions.send(
                    call.session.clone(),
                    SessionMsg::Timeout {
                        tool_call_id: call.tool_call_id.clone(),
                        reply,
                    },
                );
                touched.insert(call.session.clone());
                recorded.push(done);
            }
            for (call, done) in fresh.iter().zip(recorded) {
                let delivered = done.await == Ok(true);
                if call.tool_call_id == schema::RESUME_DUE {
                    // Not a call's timeout: neither counted as fired nor, undelivered (a
                    // resume another node owes), put off as one; looked at again by the
                    // resume-due poll (`rearm`).
                    continue;
                }
                if delivered {
                    // A look at a remote sub-agent is no call's timeout.
                    if schema::remote_look_call(&call.tool_call_id).is_none() {
                        report.fired += 1;
                        fired.insert((call.session.clone(), call.tool_call_id.clone()));
                    }
                } else {
                    undelivered.insert((call.session.clone(), call.tool_call_id.clone()));
                }
            }
            // The page is read again: an entry it fired that is still there (its session
            // had no such call, or nothing left to do for it) is then cleared as stale,
            // rather than fired by every sweep after, which kept the background timer
            // sweeping at once, for good.
        }
        report.deferred = undelivered.len();
        if settle {
            for session in touched {
                let (reply, settled) = oneshot::channel();
                self.sessions
                    .send(session, SessionMsg::WaitSettled { reply });
                let _ = settled.await;
            }
        }
        if reaper.due(settle, now) && self.leads_reaping().await {
            report.reaped = self.reap(reaper, now).await?;
        }
        if report.fired > 0 {
            tracing::debug!(
                fired = report.fired,
                reaped = report.reaped,
                "deadline.swept"
            );
        }
        Ok(report)
    }

    /// Whether this node reaps: on a store several nodes share, only the one that holds the
    /// reaper's lease does (it keeps it while it lives; another takes it over once it
    /// expires), so tombstones are reaped once across the nodes. Always, on a store of its own.
    async fn leads_reaping(&self) -> bool {
        match self.shared.leases.acquire(REAPER_LEASE, REAPER_LEASE).await {
            Ok(()) => true,
            Err(error) => {
                tracing::trace!(%error, "deadline.reaping_left_to_another_node");
                false
            }
        }
    }

    /// Reads up to [`REAP_STRETCHES`] stretches of tombstones from where the reaper stopped,
    /// deletes the expired ones, and returns how many it deleted.
    async fn reap(&self, reaper: &mut Reaper, now: u64) -> Result<usize, Error> {
        let mut reaped = 0;
        for _ in 0..REAP_STRETCHES {
            let reap = schema::reap_tombstones(
                self.shared.store.as_ref(),
                reaper.from.as_deref(),
                now,
                self.shared.tombstone_retention_ms,
                REAP_BATCH,
            )
            .await?;
            if !reap.batch.is_empty() {
                self.shared.store.commit(reap.batch).await?;
            }
            reaped += reap.reaped;
            reaper.from = reap.resume_at;
            if reaper.from.is_none() {
                // The end of the round: the next reap starts over.
                break;
            }
        }
        reaper.reaped_at = Some(now);
        Ok(reaped)
    }

    async fn clear_stale(&self, expired: &[schema::ExpiredCall]) -> Result<(), Error> {
        if expired.is_empty() {
            return Ok(());
        }
        let mut batch = Batch::new(CommitKind::Other);
        for call in expired {
            tracing::warn!(session = %call.session, tool_call_id = %crate::types::Untrusted(&call.tool_call_id), "deadline.stale_entry_cleared");
            batch.delete(
                Tree::Deadlines,
                schema::deadline_key(call.deadline_at_ms, &call.session, &call.tool_call_id),
            );
        }
        self.shared.store.commit(batch).await?;
        Ok(())
    }
}

/// Sleeps for `delay`, or forever without one (nothing is armed).
async fn sleep_for(delay: Option<Duration>) {
    match delay {
        Some(delay) => tokio::time::sleep(delay).await,
        None => std::future::pending().await,
    }
}

/// The error of a part of the scheduler's round that panicked.
fn panicked(what: &str, panic: &(dyn std::any::Any + Send)) -> Error {
    let reason = crate::types::panic::panic_text(panic);
    Error::Store(crate::store::Error::backend(format!(
        "the deadline {what} panicked: {reason}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_background_timer_reaps_at_most_once_an_interval_and_an_explicit_sweep_always() {
        let mut reaper = Reaper::default();
        assert!(reaper.due(false, 0), "never reaped: due");
        reaper.reaped_at = Some(5_000);
        assert!(!reaper.due(false, 5_000 + REAP_INTERVAL_MS - 1));
        assert!(
            reaper.due(true, 5_000),
            "an explicit sweep reaps whenever it runs"
        );
        assert!(reaper.due(false, 5_000 + REAP_INTERVAL_MS));
    }
}
