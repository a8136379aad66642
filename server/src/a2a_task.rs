//! A session's run as an A2A task (`a2a.rs`): its id, its state read from the session (what
//! it waits on, its result), and whether it is current or may be canceled. A message that
//! starts or answers one is `a2a_message.rs`.

use dormant::{PendingKind, SessionId, Status};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::state::AppState;
use crate::wire::PendingAnswer;

/// A task: the run of session `session` that a message started, number `turn` among its runs,
/// with the runs that resumed it (`{session}:{turn}`; the session is its context).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TaskId {
    pub(crate) session: SessionId,
    pub(crate) turn: u32,
}

impl TaskId {
    /// The task `text` names, if it is one this server makes.
    pub(crate) fn parse(text: &str) -> Option<Self> {
        let (session, turn) = text.rsplit_once(':')?;
        Some(Self {
            session: session.parse().ok()?,
            turn: turn.parse().ok()?,
        })
    }

    fn text(&self) -> String {
        format!("{}:{}", self.session, self.turn)
    }
}

/// The task as A2A's `Task` (protobuf JSON): its state, a status message (what it waits on,
/// or its final text), and, once completed, its result as an artifact.
pub(crate) async fn read(state: &AppState, task: &TaskId) -> Result<Value, ApiError> {
    let snap = snapshot(state, task).await?;
    let (record, run, current) = (&snap.record, &snap.run, snap.current);
    let status = snap.status();
    let waiting = if current && status.as_str().starts_with("suspended") {
        crate::tree::waits(&state.runtime, &task.session)
            .await?
            .pending
            .into_iter()
            .filter(|call| call.waiting)
            .collect()
    } else {
        Vec::new()
    };
    // Canceled: this task was aborted, or a later task of its context took its place while
    // it was not over (its calls were abandoned).
    let aborted = (current && record.aborted)
        || run
            .error
            .as_ref()
            .is_some_and(|error| error.code == dormant::types::ErrorCode::Aborted)
        || (!current && !matches!(status, Status::Completed | Status::Failed));
    // Suspended with nothing left to answer (every answer in, or a deadline passed, and no
    // resume yet) and nothing at work in its tree: the next message resumes it.
    let resumable = current
        && !aborted
        && !state.a2a_answering.lock().contains_key(&task.session)
        && waiting.is_empty()
        && status.as_str().starts_with("suspended")
        && tokio::time::timeout(SETTLED_NOW, state.runtime.wait_tree_settled(&task.session))
            .await
            .is_ok()
        && unchanged_since(state, record).await?;
    let (state_name, message) = match status {
        _ if aborted => ("TASK_STATE_CANCELED", None),
        _ if resumable => (
            "TASK_STATE_INPUT_REQUIRED",
            Some("Every answer is in: send a message to go on.".to_string()),
        ),
        Status::Completed => ("TASK_STATE_COMPLETED", run.text.clone()),
        Status::Failed => (
            "TASK_STATE_FAILED",
            run.error.as_ref().map(|error| error.message.clone()),
        ),
        // Waiting on what a follow-up message answers; an interrupted run goes on with the
        // next message too.
        Status::SuspendedClientTool | Status::SuspendedAwaitingChildren if !waiting.is_empty() => {
            ("TASK_STATE_INPUT_REQUIRED", Some(waiting_text(&waiting)))
        }
        Status::Interrupted => (
            "TASK_STATE_INPUT_REQUIRED",
            Some("The run was interrupted: send a message to go on.".to_string()),
        ),
        _ => ("TASK_STATE_WORKING", None),
    };
    let mut status_json = json!({ "state": state_name });
    // A run that goes on with the next message says so, and an interrupted one why, in the
    // message's metadata (dormant's extension): dormant's A2A client resumes it when its
    // parent resumes, as over dormant's own protocol.
    let interrupted = (status == Status::Interrupted && !aborted).then(|| {
        run.error
            .as_ref()
            .map_or("interrupted", |error| error.code.as_str())
    });
    let marker = match (interrupted, resumable) {
        (Some(code), _) => Some(json!({ "interrupted": code })),
        (None, true) => Some(json!({ "resumable": true })),
        (None, false) => None,
    };
    if message.is_some() || !waiting.is_empty() {
        let mut parts = Vec::new();
        if let Some(text) = message {
            parts.push(json!({ "text": text }));
        }
        if !waiting.is_empty() {
            parts.push(json!({ "data": { "pending": waiting } }));
        }
        status_json["message"] = json!({
            "messageId": format!("{}-status", task.text()),
            "contextId": task.session.as_str(),
            "taskId": task.text(),
            "role": "ROLE_AGENT",
            "parts": parts,
        });
        if let Some(marker) = marker {
            status_json["message"]["metadata"] = json!({ "dormant": marker });
        }
    }
    let mut out = json!({
        "id": task.text(),
        "contextId": task.session.as_str(),
        "status": status_json,
    });
    if status == Status::Completed && !aborted {
        let part = match (&run.output, &run.text) {
            (Some(output), _) => json!({ "data": output }),
            (None, Some(text)) => json!({ "text": text }),
            (None, None) => json!({ "text": "" }),
        };
        out["artifacts"] = json!([{ "artifactId": "result", "name": "result", "parts": [part] }]);
    }
    Ok(out)
}

/// How long a task's read waits to learn whether its tree is settled (it answers at once
/// when it is).
const SETTLED_NOW: std::time::Duration = std::time::Duration::from_millis(20);

/// The tasks of context `session`, the latest first: `limit` of them after the first `skip`,
/// and how many it has. A context this server does not know has none.
pub(crate) async fn list(
    state: &AppState,
    session: &SessionId,
    skip: usize,
    limit: usize,
) -> Result<(Vec<Value>, usize), ApiError> {
    let runs = match state.runtime.runs(session).await {
        Ok(runs) => runs,
        Err(dormant::ReadError::UnknownSession(_)) => return Ok((Vec::new(), 0)),
        Err(error) => return Err(error.into()),
    };
    let total = runs
        .iter()
        .filter(|run| run.previous_run_id.is_none())
        .count();
    let mut tasks = Vec::new();
    for run in runs
        .iter()
        .rev()
        .filter(|run| run.previous_run_id.is_none())
        .skip(skip)
    {
        if tasks.len() == limit {
            break;
        }
        let task = TaskId {
            session: session.clone(),
            turn: run.turn,
        };
        tasks.push(read(state, &task).await?);
    }
    Ok((tasks, total))
}

/// A task as read: its session's record, its last run (the run its message started, or the
/// last resume of it), and whether that run is the session's last (the task is current).
pub(crate) struct Snapshot {
    pub(crate) record: dormant::types::SessionRecord,
    pub(crate) run: dormant::types::RunRecord,
    pub(crate) current: bool,
}

impl Snapshot {
    /// The task's status: the record's when the record is of its last run, else the run's
    /// own.
    pub(crate) fn status(&self) -> Status {
        if self.current && self.record.run_count == self.run.turn {
            self.record.status
        } else {
            self.run.status
        }
    }
}

/// The task as of one moment, as far as two reads allow: the record and the runs are two
/// reads, and a run that began between them (a resume) must not make a current task read as
/// one a later task took the place of. The record is read first, so the runs can only be
/// newer: read again until they are not; and whether the task is current is decided by the
/// runs alone (the later read), so a session resumed again and again meanwhile still reads
/// right, with its run's status.
pub(crate) async fn snapshot(state: &AppState, task: &TaskId) -> Result<Snapshot, ApiError> {
    let mut tries = 0;
    loop {
        tries += 1;
        let record = state.runtime.session(&task.session).await?;
        let runs = state.runtime.runs(&task.session).await?;
        let last = runs.last().map_or(0, |run| run.turn);
        if last <= record.run_count || tries == SNAPSHOT_TRIES {
            let run = latest_run(&runs, task)?;
            let current = run.turn == last;
            return Ok(Snapshot {
                record,
                run,
                current,
            });
        }
    }
}

/// Whether the session is as `record` had it (the same run, still suspended): what was read
/// of it since (its waiting calls, whether its tree is settled) is then of that state, not of
/// a resume that began and perhaps ended meanwhile.
async fn unchanged_since(
    state: &AppState,
    record: &dormant::types::SessionRecord,
) -> Result<bool, ApiError> {
    let now = state.runtime.session(&record.id).await?;
    Ok(now.run_count == record.run_count && now.status == record.status)
}

/// How many times [`snapshot`] reads before it takes what it read (a session resumed that
/// often in a moment is at work: what it answers is current enough).
const SNAPSHOT_TRIES: u32 = 5;

/// The last run of `task` among `runs`.
fn latest_run(
    runs: &[dormant::types::RunRecord],
    task: &TaskId,
) -> Result<dormant::types::RunRecord, ApiError> {
    let start = runs
        .iter()
        .position(|run| run.turn == task.turn && run.previous_run_id.is_none())
        .ok_or_else(|| {
            ApiError::new(
                axum::http::StatusCode::NOT_FOUND,
                "unknown_task",
                format!("session {} has no task {}", task.session, task.turn),
            )
        })?;
    let resumes = runs[start + 1..]
        .iter()
        .take_while(|run| run.previous_run_id.is_some())
        .count();
    Ok(runs[start + resumes].clone())
}

/// The task a message just started: its run (`run_id`), looked up by id (a resume may already
/// have followed it).
pub(crate) async fn started(
    state: &AppState,
    session: &SessionId,
    run_id: Option<dormant::RunId>,
) -> Result<TaskId, ApiError> {
    let runs = state.runtime.runs(session).await?;
    let turn = runs
        .iter()
        .rev()
        .find(|run| Some(run.run_id) == run_id)
        .or(runs.last())
        .map_or(0, |run| run.turn);
    Ok(TaskId {
        session: session.clone(),
        turn,
    })
}

/// Whether the session's current task waits for input (a call of its tree waits).
pub(crate) async fn waits(state: &AppState, session: &SessionId) -> Result<bool, ApiError> {
    match state.runtime.session(session).await {
        Ok(record) if record.status.as_str().starts_with("suspended") => {
            Ok(crate::tree::waits(&state.runtime, session)
                .await?
                .pending
                .iter()
                .any(|call| call.waiting))
        }
        Ok(_) | Err(dormant::ReadError::UnknownSession(_)) => Ok(false),
        Err(error) => Err(error.into()),
    }
}

/// Whether the task may be canceled: it is its context's current task and not over.
pub(crate) async fn cancelable(state: &AppState, task: &TaskId) -> Result<bool, ApiError> {
    let snap = snapshot(state, task).await?;
    Ok(snap.current
        && !snap.record.aborted
        && !matches!(snap.status(), Status::Completed | Status::Failed))
}

/// What a task that waits asks for, in words.
fn waiting_text(waiting: &[PendingAnswer]) -> String {
    let calls: Vec<String> = waiting
        .iter()
        .map(|call| {
            let what = match call.kind {
                PendingKind::Client => "a result for",
                PendingKind::Approval => "a decision on",
                PendingKind::Reconcile => "whether this took effect:",
                PendingKind::Input => "an answer to the question of",
            };
            format!("{what} {} ({})", call.tool_name, call.tool_call_id)
        })
        .collect();
    format!("Waiting for {}.", calls.join(", "))
}
