//! Drives the sessions: a queue of turns with a bounded number of runs in flight, and a
//! simulated client that answers (or not) at every suspension.
//!
//! Scheduling: turn 1 of every session is queued first, in order; when a turn ends, the next
//! turn of that session goes to the back of the queue. A turn holds one of the
//! `--concurrency` slots only while a run is in progress (`execute_on`, `resume`): while its
//! session waits for the simulated client it holds nothing, like a dormant session in
//! production, so many sessions wait at once and the resident limit evicts them.
//!
//! A store error stops everything at once (see halt.rs): the queue stops, the turns in flight
//! are cancelled, and [`run`] returns the error.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dormant::types::{ChunkKind, Clock, RunError, ToolOutcome};
use dormant::{Chunk, RunId, RunOutcome, Runtime, SessionId, Status, SubmitOutcome, SystemClock};
use futures::StreamExt;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

use crate::halt::Halt;
use crate::plan::{
    confirm_result, deploy_input, deploy_result, suspension_call_id, Kind, Plan, TIMEOUT_CODE,
};
use crate::Args;

/// One queued turn, or the turns of a session that will never be queued.
#[derive(Clone, Copy, Debug)]
enum Job {
    Run {
        session: usize,
        turn: usize,
    },
    /// A turn failed: its session's remaining turns will never be queued.
    Skip(usize),
}

/// Counters of what the simulated clients did and what they were told.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Suspensions carried through: suspend → answer (or timeout) → resume.
    pub(crate) cycles: AtomicU64,
    /// Suspensions on a client tool.
    pub(crate) client_calls: AtomicU64,
    /// Suspensions on an approval.
    pub(crate) approvals: AtomicU64,
    /// Answers accepted.
    pub(crate) accepted: AtomicU64,
    /// Approvals accepted (the tool then runs once).
    pub(crate) approved: AtomicU64,
    /// Calls the client never answered.
    pub(crate) never_answered: AtomicU64,
    /// Timeouts of never-answered calls the client saw on the session's stream.
    pub(crate) timeouts_seen: AtomicU64,
    /// Answers that arrived after the deadline (`already_completed`, the call timed out).
    pub(crate) late: AtomicU64,
    /// Duplicate answers sent.
    pub(crate) duplicates: AtomicU64,
    /// Duplicates answered `already_completed`.
    pub(crate) duplicates_already_completed: AtomicU64,
    /// Answers of the wrong kind sent.
    pub(crate) wrong_kind: AtomicU64,
    /// Wrong kinds answered `invalid_result`.
    pub(crate) wrong_kind_invalid: AtomicU64,
    /// Wrong kinds that arrived after the deadline (`already_completed`).
    pub(crate) wrong_kind_late: AtomicU64,
    /// Wrong kinds whose correct answer was then accepted.
    pub(crate) wrong_kind_then_accepted: AtomicU64,
    /// Sessions the driver evicted right after they suspended.
    pub(crate) explicit_evictions: AtomicU64,
    /// First submits that found their session not resident (evicted while it waited).
    pub(crate) submits_to_evicted: AtomicU64,
    /// Of those, sessions the driver had not evicted: the resident limit (LRU) did.
    pub(crate) submits_to_lru_evicted: AtomicU64,
    /// Explicit resumes that found their session not resident.
    pub(crate) resumes_of_evicted: AtomicU64,
}

impl Counters {
    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Latency histograms (µs).
#[derive(Debug, Clone)]
pub(crate) struct Histograms {
    /// Each `execute_on` and explicit `resume` call.
    pub(crate) run: Histogram<u64>,
    /// Each turn, from `execute_on` to the completed run, client waits included.
    pub(crate) turn: Histogram<u64>,
    /// Each explicit `resume` call (rehydration, draining, the rest of the turn's run).
    pub(crate) resume: Histogram<u64>,
    /// Each accepted submit (the answer is durable when it returns).
    pub(crate) submit_accepted: Histogram<u64>,
    /// Every submit, whatever its outcome.
    pub(crate) submit_all: Histogram<u64>,
}

impl Histograms {
    fn new() -> anyhow::Result<Self> {
        let new = || Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3);
        Ok(Self {
            run: new()?,
            turn: new()?,
            resume: new()?,
            submit_accepted: new()?,
            submit_all: new()?,
        })
    }
}

fn micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// What the end check expects as the result of a suspension's call.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Expected {
    /// This exact outcome (an accepted client result, or an approved tool's result).
    Exact(ToolOutcome),
    /// A `client_tool_timeout` error.
    Timeout,
}

/// What one session's suspensions must have produced: (call id, expected result).
pub(crate) type Expectations = Vec<(String, Expected)>;

/// What the run measured, before verification.
#[derive(Debug)]
pub(crate) struct Measured {
    pub(crate) elapsed: Duration,
    pub(crate) histograms: Histograms,
    pub(crate) counters: Counters,
    pub(crate) expected: Vec<Expectations>,
    pub(crate) errors: Vec<String>,
}

/// Where a run stopped: the part of a [`RunOutcome`] (or of the stream) the driver needs.
#[derive(Clone, Debug)]
struct Settled {
    status: Status,
    run_id: RunId,
    pending: Vec<String>,
    error: Option<RunError>,
}

impl From<RunOutcome> for Settled {
    fn from(outcome: RunOutcome) -> Self {
        Self {
            status: outcome.status,
            run_id: outcome.run_id,
            pending: outcome.pending,
            error: outcome.error,
        }
    }
}

/// Everything the turn tasks share.
#[derive(Debug)]
struct Sim {
    runtime: Runtime,
    ids: Arc<Vec<SessionId>>,
    plan: Plan,
    auto_resume: bool,
    client_timeout_ms: u64,
    slots: Arc<Semaphore>,
    counters: Counters,
    histograms: Mutex<Histograms>,
    expected: Vec<Mutex<Expectations>>,
    /// Raised by the first store error.
    halt: Halt,
}

/// Runs every turn of every session with at most `args.concurrency` runs in flight.
///
/// # Errors
/// The first store error, as a [`crate::halt::StoreFailure`], as soon as it happens.
pub(crate) async fn run(
    runtime: &Runtime,
    ids: &Arc<Vec<SessionId>>,
    args: &Args,
) -> anyhow::Result<Measured> {
    let total = args.sessions * args.turns;
    let progress = progress_bar(total, args)?;
    let (queue, mut jobs) = mpsc::unbounded_channel::<Job>();
    for session in 0..args.sessions {
        queue.send(Job::Run { session, turn: 1 })?;
    }
    let sim = Arc::new(Sim {
        runtime: runtime.clone(),
        ids: Arc::clone(ids),
        plan: Plan::new(args),
        auto_resume: args.auto_resume,
        client_timeout_ms: args.client_timeout_ms,
        slots: Arc::new(Semaphore::new(args.concurrency)),
        counters: Counters::default(),
        histograms: Mutex::new(Histograms::new()?),
        expected: (0..args.sessions).map(|_| Mutex::default()).collect(),
        halt: Halt::default(),
    });
    let errors = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = JoinSet::new();
    let mut remaining = total;
    let start = Instant::now();

    while remaining > 0 {
        let job = tokio::select! {
            biased;
            () = sim.halt.raised() => break,
            job = jobs.recv() => job,
        };
        let Some(job) = job else { break };
        let (session, turn) = match job {
            Job::Skip(turns) => {
                remaining = remaining.saturating_sub(turns);
                progress.inc(u64::try_from(turns)?);
                continue;
            }
            Job::Run { session, turn } => (session, turn),
        };
        remaining -= 1;
        let permit = tokio::select! {
            biased;
            () = sim.halt.raised() => break,
            permit = Arc::clone(&sim.slots).acquire_owned() => permit?,
        };
        let sim = Arc::clone(&sim);
        let queue = queue.clone();
        let errors = Arc::clone(&errors);
        let progress = progress.clone();
        let turns = args.turns;
        tasks.spawn(async move {
            let failed = sim.turn(session, turn, permit).await.err();
            let next = match failed {
                Some(problem) => {
                    errors.lock().push(problem);
                    Job::Skip(turns - turn)
                }
                None => Job::Run {
                    session,
                    turn: turn + 1,
                },
            };
            if turn < turns {
                // The receiver lives until every job is accounted for.
                let _ = queue.send(next);
            }
            progress.inc(1);
        });
        while let Some(joined) = tasks.try_join_next() {
            joined?;
        }
    }
    loop {
        let joined = tokio::select! {
            biased;
            () = sim.halt.raised() => break,
            joined = tasks.join_next() => joined,
        };
        match joined {
            Some(joined) => joined?,
            None => break,
        }
    }
    progress.finish_and_clear();
    if let Some(failure) = sim.halt.take() {
        // The turns in flight may be waiting for chunks the failed store will never
        // commit (a timeout, an automatic resume): cancel them rather than wait.
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        return Err(failure.into());
    }
    let elapsed = start.elapsed();
    let sim =
        Arc::try_unwrap(sim).map_err(|_| anyhow::anyhow!("a turn task outlived the simulation"))?;
    let errors = std::mem::take(&mut *errors.lock());
    Ok(Measured {
        elapsed,
        histograms: sim.histograms.into_inner(),
        counters: sim.counters,
        expected: sim.expected.into_iter().map(Mutex::into_inner).collect(),
        errors,
    })
}

fn progress_bar(total: usize, args: &Args) -> anyhow::Result<ProgressBar> {
    if args.json || !std::io::stderr().is_terminal() {
        return Ok(ProgressBar::with_draw_target(
            Some(u64::try_from(total)?),
            ProgressDrawTarget::hidden(),
        ));
    }
    let bar = ProgressBar::new(u64::try_from(total)?);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} turns ({rate} turns/s, eta {eta})",
        )?
        .with_key(
            "rate",
            |state: &indicatif::ProgressState, out: &mut dyn std::fmt::Write| {
                let _ = write!(out, "{:.0}", state.per_sec());
            },
        )
        .progress_chars("=> "),
    );
    Ok(bar)
}

impl Sim {
    /// Runs turn `turn` of session `session` to completion, through its suspensions.
    async fn turn(
        &self,
        session: usize,
        turn: usize,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<(), String> {
        let id = &self.ids[session];
        let here = |what: String| format!("session {id} turn {turn}: {what}");
        let began = Instant::now();
        // Where this turn's chunks start: the stream is read from here to find approval ids,
        // timeouts and (with --auto-resume) where each automatic resume stopped.
        let mut cursor = match self.runtime.session(id).await {
            Ok(record) => record.chunk_count,
            Err(dormant::ReadError::UnknownSession(_)) => 0,
            Err(error) => return Err(self.halt.check(here("reading the session".into()), error)),
        };
        let mut started_ms = SystemClock.now_ms();
        let run_began = Instant::now();
        let outcome = self
            .runtime
            .execute_on(id, Plan::agent(session), format!("turn {turn}: any tea?"))
            .await;
        self.histograms
            .lock()
            .run
            .saturating_record(micros(run_began.elapsed()));
        drop(permit);
        let mut settled =
            Settled::from(outcome.map_err(|error| self.halt.check(here("execute".into()), error))?);
        for index in self.plan.suspensions_in_turn(turn) {
            let call = suspension_call_id(turn, index);
            if settled.status != Status::SuspendedClientTool || settled.pending != [call.clone()] {
                return Err(here(format!(
                    "expected to suspend on {call}, got status {:?} pending {:?} error {:?}",
                    settled.status, settled.pending, settled.error
                )));
            }
            settled = self
                .suspension(
                    session,
                    index,
                    &call,
                    &settled,
                    &mut cursor,
                    &mut started_ms,
                )
                .await
                .map_err(&here)?;
            Counters::add(&self.counters.cycles);
        }
        if settled.status != Status::Completed {
            return Err(here(format!(
                "status {:?}, pending {:?}, error {:?}",
                settled.status, settled.pending, settled.error
            )));
        }
        self.histograms
            .lock()
            .turn
            .saturating_record(micros(began.elapsed()));
        Ok(())
    }

    /// One suspension: the simulated client answers (or not), then the run goes on. Returns
    /// where the continuation stopped.
    async fn suspension(
        &self,
        session: usize,
        index: usize,
        call: &str,
        suspended: &Settled,
        cursor: &mut u64,
        started_ms: &mut u64,
    ) -> Result<Settled, String> {
        let id = &self.ids[session];
        let kind = Plan::kind(session, index);
        let behaviour = self.plan.behaviour(session, index);
        Counters::add(match kind {
            Kind::Client => &self.counters.client_calls,
            Kind::Approval => &self.counters.approvals,
        });
        let root = id.to_string();
        // The envelopes a browser would send: the right answer and the wrong kind.
        let (answer, wrong, applied) = match kind {
            Kind::Client => {
                let result = confirm_result(behaviour.token);
                (
                    json!({ "kind": "client-tool-result", "session_id": root,
                            "tool_call_id": call, "result": result }),
                    json!({ "kind": "approval-response", "session_id": root,
                            "tool_call_id": call, "approved": true,
                            "approval_id": format!("{}::{call}", suspended.run_id) }),
                    result,
                )
            }
            Kind::Approval => {
                let approval_id = self.approval_id(id, *cursor, call).await?;
                let expected_id = format!("{}::{call}", suspended.run_id);
                if approval_id != expected_id {
                    return Err(format!(
                        "approval id {approval_id:?} on the stream, expected {expected_id:?}"
                    ));
                }
                (
                    json!({ "kind": "approval-response", "session_id": root,
                            "tool_call_id": call, "approved": true,
                            "approval_id": approval_id }),
                    json!({ "kind": "client-tool-result", "session_id": root,
                            "tool_call_id": call,
                            "result": confirm_result(behaviour.token) }),
                    deploy_result(&deploy_input(index)),
                )
            }
        };
        if behaviour.evict {
            self.runtime.evict(id).await;
            Counters::add(&self.counters.explicit_evictions);
        }

        // The call became pending after its run started, so its deadline is no earlier than
        // this; and (with --auto-resume) the continuation starts no earlier than the accepted
        // answer or the deadline.
        let earliest_deadline = started_ms.saturating_add(self.client_timeout_ms);
        let mut continuation_from = earliest_deadline;
        let expected = if behaviour.never_answer {
            Counters::add(&self.counters.never_answered);
            // Sleep until the deadline could have passed, and only then watch the stream for
            // the scheduler's timeout (a follower costs memory).
            let left = earliest_deadline.saturating_sub(SystemClock.now_ms());
            tokio::time::sleep(Duration::from_millis(left)).await;
            self.await_timeout(id, *cursor, call).await?;
            Counters::add(&self.counters.timeouts_seen);
            Expected::Timeout
        } else {
            tokio::time::sleep(Duration::from_millis(behaviour.delay_ms)).await;
            if !self.runtime.is_resident(id) {
                Counters::add(&self.counters.submits_to_evicted);
                if !behaviour.evict {
                    Counters::add(&self.counters.submits_to_lru_evicted);
                }
            }
            let mut late = false;
            if behaviour.wrong_kind {
                Counters::add(&self.counters.wrong_kind);
                match self.submit(&wrong).await? {
                    (SubmitOutcome::InvalidResult { .. }, _) => {
                        Counters::add(&self.counters.wrong_kind_invalid);
                    }
                    (SubmitOutcome::AlreadyCompleted, at) if at >= earliest_deadline => {
                        Counters::add(&self.counters.wrong_kind_late);
                        late = true;
                    }
                    (other, _) => {
                        return Err(format!(
                            "the wrong kind of answer for {call} got {}, expected invalid_result",
                            other.code()
                        ))
                    }
                }
            }
            continuation_from = continuation_from.min(SystemClock.now_ms());
            match self.submit(&answer).await? {
                (SubmitOutcome::Accepted, _) if !late => {
                    Counters::add(&self.counters.accepted);
                    if kind == Kind::Approval {
                        Counters::add(&self.counters.approved);
                    }
                    if behaviour.wrong_kind {
                        Counters::add(&self.counters.wrong_kind_then_accepted);
                    }
                    Expected::Exact(ToolOutcome::Result(applied))
                }
                (SubmitOutcome::AlreadyCompleted, at) if at >= earliest_deadline => {
                    // The deadline is authoritative: the answer came too late.
                    Counters::add(&self.counters.late);
                    Expected::Timeout
                }
                (other, _) => {
                    return Err(format!(
                        "the answer for {call} got {}{}",
                        other.code(),
                        match &other {
                            SubmitOutcome::InvalidResult { reason, errors } =>
                                format!(": {reason} {errors:?}"),
                            _ => String::new(),
                        }
                    ))
                }
            }
        };
        self.expected[session]
            .lock()
            .push((call.to_string(), expected));
        if behaviour.duplicate && !behaviour.duplicate_after_resume {
            self.duplicate(&answer, call).await?;
        }

        *started_ms = continuation_from;
        let settled = if self.auto_resume {
            // The runtime runs the continuation by itself; the driver holds a slot while it
            // follows it, so at most --concurrency continuations are followed at once.
            let permit = Arc::clone(&self.slots)
                .acquire_owned()
                .await
                .map_err(|error| error.to_string())?;
            let settled = self.await_settled(id, suspended.run_id, cursor).await;
            drop(permit);
            settled?
        } else {
            let permit = Arc::clone(&self.slots)
                .acquire_owned()
                .await
                .map_err(|error| error.to_string())?;
            if !self.runtime.is_resident(id) {
                Counters::add(&self.counters.resumes_of_evicted);
            }
            *started_ms = SystemClock.now_ms();
            let began = Instant::now();
            let outcome = self.runtime.resume(id).await;
            let took = micros(began.elapsed());
            drop(permit);
            {
                let mut histograms = self.histograms.lock();
                histograms.run.saturating_record(took);
                histograms.resume.saturating_record(took);
            }
            Settled::from(outcome.map_err(|error| {
                self.halt
                    .check(format!("session {id}: resume after {call}"), error)
            })?)
        };
        if behaviour.duplicate && behaviour.duplicate_after_resume {
            self.duplicate(&answer, call).await?;
        }
        Ok(settled)
    }

    /// Submits an envelope; returns the outcome and the clock time it came back.
    async fn submit(&self, envelope: &Value) -> Result<(SubmitOutcome, u64), String> {
        let began = Instant::now();
        let outcome = self.runtime.submit_json(envelope).await.map_err(|error| {
            let field = |name: &str| envelope[name].as_str().unwrap_or("?").to_string();
            let context = format!(
                "session {}: submit ({}) for {}",
                field("session_id"),
                field("kind"),
                field("tool_call_id")
            );
            self.halt.check(context, error)
        })?;
        let took = micros(began.elapsed());
        let mut histograms = self.histograms.lock();
        histograms.submit_all.saturating_record(took);
        if outcome == SubmitOutcome::Accepted {
            histograms.submit_accepted.saturating_record(took);
        }
        Ok((outcome, SystemClock.now_ms()))
    }

    /// Sends `answer` again: it must be `already_completed`.
    async fn duplicate(&self, answer: &Value, call: &str) -> Result<(), String> {
        Counters::add(&self.counters.duplicates);
        match self.submit(answer).await?.0 {
            SubmitOutcome::AlreadyCompleted => {
                Counters::add(&self.counters.duplicates_already_completed);
                Ok(())
            }
            other => Err(format!(
                "a duplicate answer for {call} got {}, expected already_completed",
                other.code()
            )),
        }
    }

    /// The approval id of `call`, as its `tool_approval_request` chunk gives it.
    async fn approval_id(&self, id: &SessionId, from: u64, call: &str) -> Result<String, String> {
        let chunks = self.runtime.chunks(id, from).await.map_err(|error| {
            self.halt
                .check(format!("session {id}: reading the stream"), error)
        })?;
        chunks
            .into_iter()
            .find_map(|chunk| match chunk.kind {
                ChunkKind::ToolApprovalRequest {
                    tool_call_id,
                    approval_id,
                    ..
                } if tool_call_id == call => Some(approval_id),
                _ => None,
            })
            .ok_or_else(|| format!("no tool_approval_request for {call} on the stream"))
    }

    /// Follows the session's stream from `from` until `found` picks a chunk, or fails after a
    /// generous bound (the deadline scheduler should act within milliseconds of a deadline).
    async fn follow_until(
        &self,
        id: &SessionId,
        from: u64,
        what: &str,
        mut found: impl FnMut(&Chunk) -> bool,
    ) -> Result<Chunk, String> {
        let bound = Duration::from_millis(self.client_timeout_ms.saturating_add(60_000));
        let mut stream = std::pin::pin!(self.runtime.follow(id, from));
        let wait = async {
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|error| {
                    self.halt
                        .check(format!("session {id}: following the stream"), error)
                })?;
                if found(&chunk) {
                    return Ok(chunk);
                }
            }
            Err(format!("the stream ended before {what}"))
        };
        tokio::time::timeout(bound, wait)
            .await
            .map_err(|_| format!("no {what} within {} ms", bound.as_millis()))?
    }

    /// Waits until the session's stream reports that `call` timed out.
    async fn await_timeout(&self, id: &SessionId, from: u64, call: &str) -> Result<(), String> {
        self.follow_until(id, from, &format!("timeout of {call}"), |chunk| {
            matches!(&chunk.kind, ChunkKind::ToolEnd {
                tool_call_id,
                outcome: ToolOutcome::Error(error),
                ..
            } if tool_call_id == call && error.starts_with(TIMEOUT_CODE))
        })
        .await
        .map(|_| ())
    }

    /// With `--auto-resume`: waits on the stream for the automatic resume of `suspended` to
    /// end or suspend, and moves `cursor` to the resumed run's first chunk.
    async fn await_settled(
        &self,
        id: &SessionId,
        suspended: RunId,
        cursor: &mut u64,
    ) -> Result<Settled, String> {
        let mut first = None;
        let chunk = self
            .follow_until(id, *cursor, "the automatic resume", |chunk| {
                if chunk.run_id == suspended {
                    return false;
                }
                first.get_or_insert(chunk.seq);
                matches!(
                    chunk.kind,
                    ChunkKind::RunSuspended { .. }
                        | ChunkKind::RunEnd { .. }
                        | ChunkKind::RunInterrupted { .. }
                )
            })
            .await?;
        *cursor = first.unwrap_or(chunk.seq);
        Ok(match chunk.kind {
            ChunkKind::RunSuspended {
                status,
                tool_call_ids,
            } => Settled {
                status,
                run_id: chunk.run_id,
                pending: tool_call_ids,
                error: None,
            },
            ChunkKind::RunEnd { status, error } => Settled {
                status,
                run_id: chunk.run_id,
                pending: Vec::new(),
                error,
            },
            ChunkKind::RunInterrupted { error } => Settled {
                status: Status::Interrupted,
                run_id: chunk.run_id,
                pending: Vec::new(),
                error,
            },
            other => return Err(format!("unexpected chunk {}", other.type_name())),
        })
    }
}
