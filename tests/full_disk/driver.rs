//! How the child of `tests/full_disk/main.rs` moves its sessions along: one move per session and
//! round (create it, answer its next waiting call, or resume it), every failure checked to be
//! the typed, retryable `StorageFull` of the store, and reported.

use std::path::Path;

use dormant::types::PendingCall;
use dormant::{Runtime, SessionId, Status};
use dormant::{Submit, SubmitOutcome};
use serde_json::json;

use crate::child::report;

/// What the driver knows of one session.
pub(crate) struct Driven {
    pub(crate) id: SessionId,
    index: usize,
    /// Whether an `execute` was ever sent: from then on the session may exist, and a second
    /// `execute` would start a second turn.
    executed: bool,
    /// Its status and pending calls as last read, for the moves made while reads fail.
    seen: Option<Status>,
    pending: Vec<PendingCall>,
    /// Calls with an answer acknowledged `accepted`, or found answered.
    answered: Vec<String>,
    /// Calls whose submit failed at least once (its commit may have landed all the same).
    failed_submits: Vec<String>,
    /// Answers tried for `e1`, so that each carries a value of its own.
    edit_attempts: usize,
    pub(crate) done: bool,
}

impl Driven {
    pub(crate) fn new(index: usize) -> anyhow::Result<Self> {
        Ok(Self {
            id: format!("s{index}").parse()?,
            index,
            executed: false,
            seen: None,
            pending: Vec::new(),
            answered: Vec::new(),
            failed_submits: Vec::new(),
            edit_attempts: 0,
            done: false,
        })
    }

    /// The first call it waits on that has no answer, as far as the driver knows.
    fn unanswered(&self) -> Option<PendingCall> {
        self.pending
            .iter()
            .find(|call| call.answer.is_none() && !self.answered.contains(&call.tool_call_id))
            .cloned()
    }
}

/// The runtime calls of one move that failed, with what each tried.
type Failures = Vec<(&'static str, dormant::Error)>;

/// One move of session `s`, from what the store shows; while reads fail (the disk is full and
/// the store cannot open its database), from what the driver saw last, so that writes are
/// tried against the full disk too.
async fn advance(runtime: &Runtime, s: &mut Driven) -> anyhow::Result<Failures> {
    let mut failures = Failures::new();
    let status = match runtime.status(&s.id).await {
        Ok(status) => Some(status),
        Err(dormant::ReadError::UnknownSession(_)) => None,
        Err(error) => {
            failures.push(("status", error.into()));
            match s.seen {
                None if !s.executed => None,
                // It may exist: never a second execute.
                None => Some(Status::Interrupted),
                seen => seen,
            }
        }
    };
    let (what, result) = match status {
        None => {
            s.executed = true;
            let run = runtime.execute_on(&s.id, "editor", "go").await;
            ("execute", run.map(drop))
        }
        Some(Status::Completed) => {
            s.done = true;
            return Ok(failures);
        }
        Some(Status::SuspendedClientTool) => {
            s.seen = status;
            if failures.is_empty() {
                match runtime.pending(&s.id).await {
                    Ok(pending) => s.pending = pending,
                    Err(error) => failures.push(("pending", error.into())),
                }
            }
            match s.unanswered() {
                Some(call) => submit(runtime, s, &call).await?,
                // A resume while a call still waits changes nothing (the barrier).
                None => ("resume", runtime.resume(&s.id).await.map(drop)),
            }
        }
        // A run a failed commit cut: interrupted, or still recorded as running when the
        // commit that closes it failed too (the resume closes it first).
        Some(Status::Interrupted | Status::Running) => {
            s.seen = status;
            ("resume", runtime.resume(&s.id).await.map(drop))
        }
        Some(other) => anyhow::bail!("{}: unexpected status {other}", s.id),
    };
    if let Err(error) = result {
        failures.push((what, error));
    }
    Ok(failures)
}

/// Answers `call`: `e1` with a value unique to this attempt, `d1` approved.
async fn submit(
    runtime: &Runtime,
    s: &mut Driven,
    call: &PendingCall,
) -> anyhow::Result<(&'static str, Result<(), dormant::Error>)> {
    let call_id = call.tool_call_id.clone();
    let (what, submit, shown) = match call_id.as_str() {
        "e1" => {
            s.edit_attempts += 1;
            let value = json!({ "applied": s.index * 100 + s.edit_attempts });
            let submit = Submit::result(s.id.as_str(), "e1", value.clone());
            ("submit e1", submit, value.to_string())
        }
        "d1" => {
            let submit = Submit::approval(s.id.as_str(), "d1", call.approval_id(), true, None);
            ("submit d1", submit, "approved".to_string())
        }
        other => anyhow::bail!("{}: unexpected pending call {other}", s.id),
    };
    report(&format!("attempt {} {call_id} {shown}", s.id))?;
    match runtime.submit_tool_result(submit).await {
        Ok(SubmitOutcome::Accepted) => {
            report(&format!("accepted {} {call_id} {shown}", s.id))?;
            s.answered.push(call_id);
            Ok((what, Ok(())))
        }
        // An earlier submit failed, yet its commit reached the disk: the call has an answer.
        Ok(SubmitOutcome::AlreadyCompleted) if s.failed_submits.contains(&call_id) => {
            report(&format!("already {} {call_id} {shown}", s.id))?;
            s.answered.push(call_id);
            Ok((what, Ok(())))
        }
        Ok(other) => anyhow::bail!("{}: {what} answered {}", s.id, other.code()),
        Err(error) => {
            s.failed_submits.push(call_id);
            Ok((what, Err(error)))
        }
    }
}

/// Plays one round: every session started by now makes one move, all at once (so commits of
/// several sessions share groups). Session `i` starts in round `i / 2`, so the sessions are at
/// every stage of their flow when the disk fills. A failure must be the typed, retryable
/// `StorageFull` naming the store `dir`, and only while `full_allowed`.
pub(crate) async fn play_round(
    runtime: &Runtime,
    sessions: &mut [Driven],
    round: usize,
    dir: &Path,
    full_allowed: bool,
) -> anyhow::Result<()> {
    let moves = sessions
        .iter_mut()
        .filter(|s| !s.done && s.index / 2 <= round)
        .map(|s| async move {
            for (what, error) in advance(runtime, s).await? {
                match &error {
                    dormant::Error::Store(
                        store @ dormant::store::Error::StorageFull { path, .. },
                    ) if full_allowed && store.is_retryable() && path.as_deref() == Some(dir) => {
                        report(&format!("storage_full {} {what}", s.id))?;
                    }
                    _ => anyhow::bail!(
                        "{}: {what} failed (round {round}, disk full allowed: {full_allowed}): \
                         {error:?}",
                        s.id
                    ),
                }
            }
            anyhow::Ok(())
        });
    for result in futures::future::join_all(moves).await {
        result?;
    }
    Ok(())
}
