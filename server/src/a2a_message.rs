//! A message to the A2A server (`a2a.rs`): a new task (a session, or a turn of one), or a
//! follow-up that answers what a task waits on, through the submit contract.

use dormant::{PendingKind, SessionId, Status, Submit};
use serde_json::{Map, Value};

use crate::a2a_rpc::{RpcError, INVALID_PARAMS, TASK_NOT_FOUND};
use crate::a2a_task::{self, TaskId};
use crate::access::Credentials;
use crate::state::AppState;
use crate::wire::PendingAnswer;

/// The task `params.id` names (`GetTask`, `CancelTask`, `SubscribeToTask`).
pub(crate) fn task_id(params: &Value) -> Result<TaskId, RpcError> {
    let text = params["id"]
        .as_str()
        .ok_or_else(|| RpcError::new(INVALID_PARAMS, "params.id (the task id) is required"))?;
    TaskId::parse(text).ok_or_else(|| RpcError::new(TASK_NOT_FOUND, format!("no task {text:?}")))
}

/// What a message asks for, started: the task it answers or starts (a new one of `agent`),
/// and, for a session this request made, its token (for the messages that answer it). A new
/// task in a context whose current task waits for input is refused: it would abandon what
/// waits.
pub(crate) async fn begin_message(
    state: &AppState,
    agent: &str,
    credentials: &Credentials,
    params: &Value,
) -> Result<(TaskId, Option<String>), RpcError> {
    let message = &params["message"];
    let parts = message["parts"]
        .as_array()
        .ok_or_else(|| RpcError::new(INVALID_PARAMS, "params.message.parts is required"))?;
    let text: Vec<&str> = parts
        .iter()
        .filter_map(|part| part["text"].as_str())
        .collect();
    let text = text.join("\n");
    let mut generated = false;
    let task = if let Some(task) = message["taskId"].as_str() {
        let task = TaskId::parse(task)
            .ok_or_else(|| RpcError::new(TASK_NOT_FOUND, format!("no task {task:?}")))?;
        if message["contextId"]
            .as_str()
            .is_some_and(|context| context != task.session.as_str())
        {
            return Err(RpcError::invalid_params(
                "the message's contextId is not its task's",
            ));
        }
        credentials.session(&task.session).await?;
        continue_task(state, &task, parts, &text).await?;
        task
    } else {
        let session = match message["contextId"].as_str() {
            Some(context) => {
                let session: SessionId = context.parse().map_err(|error| {
                    RpcError::new(INVALID_PARAMS, format!("contextId: {error}"))
                })?;
                credentials.session(&session).await?;
                session
            }
            None => {
                credentials.caller().await?;
                generated = true;
                SessionId::generate()
            }
        };
        if !generated && a2a_task::waits(state, &session).await? {
            return Err(RpcError::unsupported(
                "the context's current task waits for input: answer it (taskId), or cancel it, before a new task",
            ));
        }
        if text.trim().is_empty() {
            return Err(RpcError::new(
                INVALID_PARAMS,
                "a message that starts a task needs a text part",
            ));
        }
        let started = state.runtime.start_on(&session, agent, text).await?;
        a2a_task::started(state, &session, started.run_id).await?
    };
    // A session this request made: its token, whatever credentials made it, for the messages
    // that answer it.
    let token = generated.then(|| state.key.issue(&task.session));
    Ok((task, token))
}

/// Submits one answer of a follow-up message; an answer the submit contract refuses is its
/// error (its `ErrorInfo` names dormant's code).
pub(crate) async fn submit(state: &AppState, submit: Submit) -> Result<(), RpcError> {
    let outcome = state.runtime.submit_tool_result(submit).await?;
    crate::error::submit_answer(outcome)
        .map(drop)
        .map_err(RpcError::from)
}

/// A follow-up message to task `task`: its data parts answer the calls it waits on (each
/// `{ "tool_call_id", "owner_session_id"?, and the submit envelope's answer fields }`; a text
/// alone answers the one client tool that waits if it has no output schema), through the
/// submit contract; the run is resumed once nothing waits. A message to an interrupted task
/// resumes it.
async fn continue_task(
    state: &AppState,
    task: &TaskId,
    parts: &[Value],
    text: &str,
) -> Result<(), RpcError> {
    let snap = a2a_task::snapshot(state, task).await?;
    if !snap.current {
        return Err(unsupported(
            "this task is over: send a message in its context (contextId) to start another",
        ));
    }
    let answers: Vec<&Map<String, Value>> = parts
        .iter()
        .filter_map(|part| part["data"].as_object())
        .collect();
    match snap.status() {
        Status::Interrupted if !snap.record.aborted => {
            judge_late(state, task, &answers).await?;
            state.runtime.start_resume(&task.session).await?;
            return Ok(());
        }
        Status::SuspendedClientTool | Status::SuspendedAwaitingChildren => {}
        _ if !answers.is_empty() => {
            judge_late(state, task, &answers).await?;
            return Ok(());
        }
        Status::Running => {
            return Err(unsupported("the task is working: wait for it to need input"));
        }
        _ => {
            return Err(unsupported(
                "the task is in a terminal state: send a message in its context (contextId) to start another",
            ))
        }
    }
    // From the first answer recorded to the resume started, the task reads as working.
    let _answering = Answering::begin(state, &task.session);
    let waits = crate::tree::waits(&state.runtime, &task.session).await?;
    let waiting: Vec<&PendingAnswer> = waits.pending.iter().filter(|call| call.waiting).collect();
    if waiting.is_empty() {
        // Every answer is in (given elsewhere, or by a message whose resume did not happen):
        // the message goes on with them.
        judge_late(state, task, &answers).await?;
        state.runtime.start_resume(&task.session).await?;
        return Ok(());
    }
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

/// A follow-up message being applied to its context (`Shared::a2a_answering`), until dropped.
struct Answering<'a> {
    state: &'a AppState,
    session: SessionId,
}

impl<'a> Answering<'a> {
    fn begin(state: &'a AppState, session: &SessionId) -> Self {
        *state
            .a2a_answering
            .lock()
            .entry(session.clone())
            .or_default() += 1;
        Self {
            state,
            session: session.clone(),
        }
    }
}

impl Drop for Answering<'_> {
    fn drop(&mut self) {
        let mut answering = self.state.a2a_answering.lock();
        if let Some(count) = answering.get_mut(&self.session) {
            *count -= 1;
            if *count == 0 {
                answering.remove(&self.session);
            }
        }
    }
}

/// Answers to calls that no longer wait (a client that sends its answer again): the submit
/// contract says what each is (`already_completed` for a duplicate), and the first refusal is
/// the message's error.
async fn judge_late(
    state: &AppState,
    task: &TaskId,
    answers: &[&Map<String, Value>],
) -> Result<(), RpcError> {
    let submits = answers
        .iter()
        .map(|fields| envelope(task, &[], fields))
        .collect::<Result<Vec<_>, _>>()?;
    for answer in submits {
        submit(state, answer).await?;
    }
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
        // A tool's question is answered as a client tool is: the answer is a result.
        PendingKind::Client | PendingKind::Input => "client-tool-result",
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
