//! A session's turn as an A2A task (`a2a.rs`): its id, its state read from the session, and
//! a follow-up message that answers what it waits on.

use dormant::{PendingKind, SessionId, Status, Submit};
use serde_json::{json, Map, Value};

use crate::a2a::{submit, RpcError};
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
    let record = state.runtime.session(&task.session).await?;
    let run = latest_run(state, task).await?;
    let current = run.turn == record.run_count;
    let status = if current { record.status } else { run.status };
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
    let (state_name, message) = match status {
        _ if aborted => ("TASK_STATE_CANCELED", None),
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

/// The last run of a task: the run its message started, or the last resume of it.
async fn latest_run(
    state: &AppState,
    task: &TaskId,
) -> Result<dormant::types::RunRecord, ApiError> {
    let runs = state.runtime.runs(&task.session).await?;
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
    let record = state.runtime.session(&task.session).await?;
    let run = latest_run(state, task).await?;
    Ok(run.turn == record.run_count
        && !record.aborted
        && !matches!(record.status, Status::Completed | Status::Failed))
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
            };
            format!("{what} {} ({})", call.tool_name, call.tool_call_id)
        })
        .collect();
    format!("Waiting for {}.", calls.join(", "))
}

/// A follow-up message to task `task`: its data parts answer the calls it waits on (each
/// `{ "tool_call_id", "owner_session_id"?, and the submit envelope's answer fields }`; a text
/// alone answers the one client tool that waits if it has no output schema), through the
/// submit contract; the run is resumed once nothing waits. A message to an interrupted task
/// resumes it.
pub(crate) async fn continue_task(
    state: &AppState,
    task: &TaskId,
    parts: &[Value],
    text: &str,
) -> Result<(), RpcError> {
    let record = state.runtime.session(&task.session).await?;
    if latest_run(state, task).await?.turn != record.run_count {
        return Err(unsupported(
            "this task is over: send a message in its context (contextId) to start another",
        ));
    }
    match record.status {
        Status::Interrupted if !record.aborted => {
            state.runtime.start_resume(&task.session).await?;
            return Ok(());
        }
        Status::SuspendedClientTool | Status::SuspendedAwaitingChildren => {}
        Status::Running => {
            return Err(unsupported("the task is working: wait for it to need input"));
        }
        _ => {
            return Err(unsupported(
                "the task is in a terminal state: send a message in its context (contextId) to start another",
            ))
        }
    }
    let waits = crate::tree::waits(&state.runtime, &task.session).await?;
    let waiting: Vec<&PendingAnswer> = waits.pending.iter().filter(|call| call.waiting).collect();
    if waiting.is_empty() {
        // Every answer is in (given elsewhere, or by a message whose resume did not happen):
        // the message goes on with them.
        state.runtime.start_resume(&task.session).await?;
        return Ok(());
    }
    let answers: Vec<&Map<String, Value>> = parts
        .iter()
        .filter_map(|part| part["data"].as_object())
        .collect();
    if answers.is_empty() {
        let [call] = waiting.as_slice() else {
            return Err(invalid(
                "answer the calls the task waits on with data parts: { \"tool_call_id\", and \"result\" | \"error\" | \"approved\" | \"happened\" }",
            ));
        };
        if call.kind != PendingKind::Client || call.output_schema.is_some() || text.is_empty() {
            return Err(invalid(format!(
                "answer {} ({}) with a data part: {{ \"tool_call_id\", and its answer }}",
                call.tool_name, call.tool_call_id
            )));
        }
        let answer = Submit::result(
            task.session.to_string(),
            call.tool_call_id.clone(),
            Value::from(text),
        )
        .owned_by(call.session_id.clone());
        submit(state, answer).await?;
    }
    // Every part read before any is submitted.
    let submits = answers
        .into_iter()
        .map(|fields| envelope(task, &waiting, fields))
        .collect::<Result<Vec<_>, _>>()?;
    for answer in submits {
        submit(state, answer).await?;
    }
    state.runtime.start_resume(&task.session).await?;
    Ok(())
}

/// The submit one data part stands for: the call it names (among those that wait), and the
/// answer's fields of the submit envelope, with the kind the call needs.
fn envelope(
    task: &TaskId,
    waiting: &[&PendingAnswer],
    fields: &Map<String, Value>,
) -> Result<Submit, RpcError> {
    let id = fields
        .get("tool_call_id")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("a data part that answers a call names it: tool_call_id"))?;
    let owner = fields.get("owner_session_id").and_then(Value::as_str);
    let mut envelope = fields.clone();
    envelope.insert("session_id".into(), Value::from(task.session.to_string()));
    let Some(call) = waiting
        .iter()
        .find(|call| call.tool_call_id == id && owner.is_none_or(|owner| owner == call.session_id))
    else {
        // Not a call that waits: the submit contract says what it is (answered already, a
        // duplicate: `already_completed`; never made: `unknown_tool_call`), with the kind its
        // fields say.
        if !envelope.contains_key("kind") {
            if envelope.contains_key("approved") {
                envelope.insert("kind".into(), Value::from("approval-response"));
                // The call no longer waits: its approval id is not known here, and the router
                // answers from the call's tombstone first.
                envelope
                    .entry("approval_id")
                    .or_insert(Value::from("unknown"));
            } else if envelope.contains_key("happened") {
                envelope.insert("kind".into(), Value::from("reconcile"));
            }
        }
        return Submit::from_json(&Value::Object(envelope)).map_err(invalid);
    };
    envelope.insert(
        "owner_session_id".into(),
        Value::from(call.session_id.clone()),
    );
    let kind = match call.kind {
        PendingKind::Client => "client-tool-result",
        PendingKind::Approval => "approval-response",
        PendingKind::Reconcile => "reconcile",
    };
    envelope.entry("kind").or_insert(Value::from(kind));
    if call.kind == PendingKind::Approval {
        if let Some(approval) = &call.approval_id {
            envelope
                .entry("approval_id")
                .or_insert(Value::from(approval.clone()));
        }
        if let Some(binding) = &call.binding {
            envelope
                .entry("binding")
                .or_insert(Value::from(binding.clone()));
        }
    }
    Submit::from_json(&Value::Object(envelope)).map_err(invalid)
}

fn invalid(message: impl Into<String>) -> RpcError {
    RpcError::invalid_params(message)
}

fn unsupported(message: &str) -> RpcError {
    RpcError::unsupported(message)
}
