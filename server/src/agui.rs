//! `POST /ag-ui`: an AG-UI endpoint (AG-UI 1.0; `agui_events.rs` encodes the stream). The
//! run input's `threadId` is the session, a message starts a turn of it, and a `resume`
//! answers what the previous run's interrupt listed — client tools, approvals and
//! reconciliations of the whole tree, sub-agents' included — through the submit contract,
//! then resumes. The answer is the run as AG-UI events over SSE, ending with `RUN_FINISHED`
//! (a success, or an interrupt listing every call of the tree that waits for a person) or
//! `RUN_ERROR`. docs/protocols.md says what maps to what and what is not supported.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use dormant::definition::Reconciled;
use dormant::session::RunStarted;
use dormant::{PendingKind, SessionId, Submit};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::access::{session_id, Credentials};
use crate::agui_events::{Settled, Translator};
use crate::body::JsonBody;
use crate::error::{submit_answer, ApiError};
use crate::state::AppState;
use crate::wire::{encode, PendingAnswer};

/// The run input (AG-UI's `RunAgentInput`), as far as dormant reads it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RunInput {
    thread_id: String,
    run_id: String,
    #[serde(default)]
    messages: Vec<Value>,
    /// Present (even empty) when the run resumes the previous one.
    #[serde(default)]
    resume: Option<Vec<ResumeEntry>>,
    #[serde(default)]
    forwarded_props: Value,
}

/// An answer to one interrupt of the previous run.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResumeEntry {
    interrupt_id: String,
    status: String,
    #[serde(default)]
    payload: Value,
}

/// `POST /ag-ui`.
pub(crate) async fn run(
    State(state): State<AppState>,
    credentials: Credentials,
    JsonBody(input): JsonBody<RunInput>,
) -> Result<Response, ApiError> {
    let id = session_id(&input.thread_id)?;
    if *state.closing.borrow() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is shutting down",
        ));
    }
    let record = match state.runtime.session(&id).await {
        Ok(record) => Some(record),
        Err(dormant::ReadError::UnknownSession(_)) => None,
        Err(error) => return Err(error.into()),
    };
    if record.is_some() || credentials.has_session_token() {
        credentials.session(&id).await?;
    } else if !credentials.caller().await?.may_choose_session_id {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "session_id_not_allowed",
            "a new thread names its session (threadId): this caller may not choose a session id",
        ));
    }
    let run_id = input.run_id.clone();
    let thread = input.thread_id.clone();
    // From here on, what goes wrong is the run's error, as AG-UI says: a RUN_ERROR event.
    let begun = begin(&state, &id, record.as_ref(), input).await;
    let (sender, receiver) = tokio::sync::mpsc::channel::<Bytes>(64);
    match begun {
        Ok(started) => {
            tracing::info!(session = %id, "server.agui_run");
            let token = (record.is_none() && !credentials.has_session_token())
                .then(|| state.key.issue(&id));
            tokio::spawn(stream_run(state, id, run_id, started, token, sender));
        }
        Err(error) => {
            let events = [
                json!({ "type": "RUN_STARTED", "threadId": thread, "runId": run_id }),
                json!({ "type": "RUN_ERROR", "code": error.code(), "message": error.message() }),
            ];
            for event in events {
                // The channel holds both: nothing waits on a reader here.
                let _ = sender.try_send(frame(&event));
            }
        }
    }
    let body = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver
            .recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(bytes), receiver))
    });
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(body),
    )
        .into_response())
}

/// Starts what the run input asks for: a turn (its last message is the person's), or, with
/// `resume`, the answers to the previous run's interrupts and the resume. A thread whose calls
/// wait takes only a resume that answers every one of them (a message would abandon them).
async fn begin(
    state: &AppState,
    id: &SessionId,
    record: Option<&dormant::types::SessionRecord>,
    input: RunInput,
) -> Result<RunStarted, ApiError> {
    let waiting: Vec<PendingAnswer> = match record {
        Some(_) => crate::tree::waits(&state.runtime, id)
            .await?
            .pending
            .into_iter()
            .filter(|call| call.waiting)
            .collect(),
        None => Vec::new(),
    };
    let Some(resume) = input.resume else {
        if !waiting.is_empty() {
            let open: Vec<String> = waiting.iter().map(interrupt_id).collect();
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "pending_interrupts",
                format!(
                    "the thread waits on interrupts {open:?}: the next run must resume them all"
                ),
            ));
        }
        let message = last_user_message(&input.messages).ok_or_else(|| {
            ApiError::invalid("a run input needs the person's message last, or resume entries")
        })?;
        // A thread keeps its agent; a new one takes the one named, or the server's.
        let agent = match record {
            Some(record) => record.agent.clone(),
            None => input.forwarded_props["dormant"]["agent"]
                .as_str()
                .map_or_else(|| state.config.page_agent.clone(), str::to_string),
        };
        return match record {
            Some(_) => Ok(state.runtime.start_on(id, &agent, message).await?),
            None => Ok(state.runtime.start_new(id, &agent, message).await?),
        };
    };
    answer(state, id, &waiting, resume).await?;
    Ok(state.runtime.start_resume(id).await?)
}

/// The text of the last user message (a string, or text parts).
fn last_user_message(messages: &[Value]) -> Option<String> {
    // The person's message must be the last: an input that ends with the agent's messages
    // asks for nothing new (and must not send an old message again).
    let message = messages
        .last()
        .filter(|message| message["role"] == "user")?;
    match &message["content"] {
        Value::String(text) if !text.trim().is_empty() => Some(text.clone()),
        Value::Array(parts) => {
            let text: Vec<&str> = parts
                .iter()
                .filter(|part| part["type"] == "text")
                .filter_map(|part| part["text"].as_str())
                .collect();
            (!text.is_empty()).then(|| text.join("\n"))
        }
        _ => None,
    }
}

/// The interrupt id of a waiting call: its session and call id, each percent-encoded, so the
/// one `/` between them is unambiguous.
fn interrupt_id(call: &PendingAnswer) -> String {
    let id = format!(
        "{}/{}",
        encode(&call.session_id),
        encode(&call.tool_call_id)
    );
    // A tool that asks again waits under the same call: each question is its own interrupt,
    // so a resume replayed for an earlier one is refused, not taken for the next.
    match call.question {
        Some(question) => format!("{id}/q{question}"),
        None => id,
    }
}

/// Submits each resume entry as the answer of the call its interrupt names (at the root,
/// naming the call's session), once all of them are read: an entry the previous run did not
/// list, one named twice, a payload that does not fit its kind, or an open interrupt left
/// unanswered refuses the whole resume before anything is submitted. An entry for a call that
/// has its answer already (given elsewhere) is left: the first answer stands.
async fn answer(
    state: &AppState,
    root: &SessionId,
    waiting: &[PendingAnswer],
    entries: Vec<ResumeEntry>,
) -> Result<(), ApiError> {
    let listed = crate::tree::waits(&state.runtime, root).await?.pending;
    let mut named = std::collections::HashSet::new();
    let mut submits = Vec::new();
    for entry in &entries {
        if !named.insert(entry.interrupt_id.as_str()) {
            return Err(ApiError::invalid(format!(
                "interrupt {:?} is answered twice in one resume",
                entry.interrupt_id
            )));
        }
        let call = listed
            .iter()
            .find(|call| interrupt_id(call) == entry.interrupt_id)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    "unknown_interrupt",
                    format!(
                        "no call of this thread waits under interrupt {:?}",
                        entry.interrupt_id
                    ),
                )
            })?;
        if call.answered {
            continue;
        }
        submits.push(submission(root, call, entry)?.owned_by(call.session_id.clone()));
    }
    let open: Vec<String> = waiting
        .iter()
        .map(interrupt_id)
        .filter(|id| !named.contains(id.as_str()))
        .collect();
    if !open.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "interrupts_not_answered",
            format!("a resume answers every open interrupt; not answered: {open:?}"),
        ));
    }
    for submit in submits {
        submit_answer(state.runtime.submit_tool_result(submit).await?)?;
    }
    Ok(())
}

/// The submit a resume entry stands for, by the kind of the call it answers (naming the
/// question, for a tool's).
fn submission(
    root: &SessionId,
    call: &PendingAnswer,
    entry: &ResumeEntry,
) -> Result<Submit, ApiError> {
    let submit = answer_of(root, call, entry)?;
    Ok(match call.question {
        Some(question) => submit.for_question(question),
        None => submit,
    })
}

fn answer_of(
    root: &SessionId,
    call: &PendingAnswer,
    entry: &ResumeEntry,
) -> Result<Submit, ApiError> {
    let (root, id) = (root.to_string(), call.tool_call_id.clone());
    let payload = &entry.payload;
    let cancelled = match entry.status.as_str() {
        "resolved" => false,
        "cancelled" => true,
        other => {
            return Err(ApiError::invalid(format!(
                "resume status {other:?}: resolved or cancelled"
            )))
        }
    };
    Ok(match call.kind {
        PendingKind::Client | PendingKind::Input if cancelled => {
            Submit::error(root, id, "cancelled by the user")
        }
        _ if payload.is_null() && !cancelled => {
            return Err(ApiError::invalid(format!(
                "the resume entry for {id} carries no payload"
            )))
        }
        PendingKind::Client | PendingKind::Input => {
            match payload.get("error").and_then(Value::as_str) {
                Some(error) if payload.as_object().is_some_and(|fields| fields.len() == 1) => {
                    Submit::error(root, id, error)
                }
                _ => Submit::result(root, id, payload.clone()),
            }
        }
        PendingKind::Approval => {
            let approved = match payload["approved"].as_bool() {
                _ if cancelled => false,
                Some(approved) => approved,
                None => {
                    return Err(ApiError::invalid(format!(
                        "the resume entry for approval {id} needs \"approved\": true or false"
                    )))
                }
            };
            let reason = payload["reason"].as_str().map(str::to_string);
            let approval_id = call.approval_id.clone().unwrap_or_default();
            let mut submit = Submit::approval(root, id, approval_id, approved, reason);
            if let Some(binding) = &call.binding {
                submit = submit.bound_to(binding.clone());
            }
            match payload.get("edited_input") {
                Some(input) if approved => submit.with_edited_input(input.clone()),
                _ => submit,
            }
        }
        PendingKind::Reconcile if cancelled => {
            return Err(ApiError::invalid(
                "a reconciliation cannot be cancelled: say whether its effect happened",
            ))
        }
        PendingKind::Reconcile => {
            let reconciled = match (payload["happened"].as_bool(), payload.get("error")) {
                (Some(true), _) => Reconciled::Happened(payload.get("result").cloned().unwrap_or(Value::Null)),
                (Some(false), _) => Reconciled::DidNotHappen,
                (None, Some(Value::String(error))) => Reconciled::Failed(error.clone()),
                _ => {
                    return Err(ApiError::invalid(
                        "a reconciliation's payload is {\"happened\": true, \"result\"}, {\"happened\": false} or {\"error\"}",
                    ))
                }
            };
            Submit::reconcile(root, id, reconciled)
        }
    })
}

/// One event as an SSE frame.
fn frame(event: &Value) -> Bytes {
    Bytes::from(format!("data: {event}\n\n"))
}

/// Streams the run: its events until it settles, then how it finished.
async fn stream_run(
    state: AppState,
    id: SessionId,
    run_id: String,
    started: RunStarted,
    token: Option<String>,
    sender: tokio::sync::mpsc::Sender<Bytes>,
) {
    let thread = id.to_string();
    let send = |event: Value| {
        let sender = sender.clone();
        async move { sender.send(frame(&event)).await.is_ok() }
    };
    if !send(json!({ "type": "RUN_STARTED", "threadId": thread, "runId": run_id })).await {
        return;
    }
    if let Some(token) = token {
        let event = json!({ "type": "CUSTOM", "name": "dormant.session_token",
                            "value": { "session_id": thread, "token": token } });
        if !send(event).await {
            return;
        }
    }
    let mut translator = Translator::default();
    let mut settled = None;
    if !started.settled {
        let mut events = Box::pin(state.runtime.follow_live(&id, started.from_seq));
        let tree_settled = state.runtime.wait_tree_settled(&id);
        tokio::pin!(tree_settled);
        let mut next_seq = started.from_seq;
        let shutting_down = crate::shutdown::shutting_down(state.closing.clone());
        tokio::pin!(shutting_down);
        let mut keep_alive = tokio::time::interval(state.config.sse_keep_alive);
        keep_alive.tick().await;
        loop {
            tokio::select! {
                // The client went away: the run goes on without it; nothing is left running
                // here for it.
                () = sender.closed() => return,
                () = &mut shutting_down => {
                    settled = Some(Settled::Failed {
                        code: "shutting_down".into(),
                        message: "the server is shutting down: the run goes on when it is back (resume it, or read it over GET /sse)".into(),
                    });
                    break;
                }
                _ = keep_alive.tick() => {
                    if sender.send(Bytes::from_static(b":\n\n")).await.is_err() {
                        return;
                    }
                }
                event = events.next() => {
                    let event = match event {
                        Some(Ok(event)) => event,
                        Some(Err(error)) => {
                            settled = Some(Settled::Failed {
                                code: error.code().to_string(),
                                message: error.to_string(),
                            });
                            break;
                        }
                        None => break,
                    };
                    let (out, done) = match event {
                        dormant::StreamEvent::Chunk(chunk) => {
                            next_seq = chunk.seq + 1;
                            translator.chunk(&chunk)
                        }
                        dormant::StreamEvent::Delta(delta) => (translator.delta(&delta), None),
                    };
                    for event in out {
                        if !send(event).await {
                            return;
                        }
                    }
                    if done.is_some() {
                        settled = done;
                        break;
                    }
                }
                () = &mut tree_settled => {
                    // A resume that woke sub-agents which still wait writes no chunk of this
                    // session's own that settles: what was written is sent, and the status says.
                    for chunk in state.runtime.chunks(&id, next_seq).await.unwrap_or_default() {
                        let (out, done) = translator.chunk(&chunk);
                        for event in out {
                            if !send(event).await {
                                return;
                            }
                        }
                        if done.is_some() {
                            settled = done;
                        }
                    }
                    break;
                }
            }
        }
    }
    let settled = match settled {
        Some(settled) => settled,
        None => settled_from_status(&state, &id).await,
    };
    let closing_events = translator.close_open();
    for event in closing_events
        .into_iter()
        .chain(finish(&state, &id, &thread, &run_id, settled).await)
    {
        if !send(event).await {
            return;
        }
    }
}

/// How a run that settled without a settling chunk of its own (nothing ran, or only
/// sub-agents did) stands.
async fn settled_from_status(state: &AppState, id: &SessionId) -> Settled {
    let failed = |code: &str, message: String| Settled::Failed {
        code: code.to_string(),
        message,
    };
    let record = match state.runtime.session(id).await {
        Ok(record) => record,
        Err(error) => return failed(error.code(), error.to_string()),
    };
    match record.status {
        status if status.as_str().starts_with("suspended") => Settled::Suspended,
        dormant::Status::Completed => Settled::Completed(None),
        dormant::Status::Running => failed(
            "running",
            "the run is still going: its stream ended early (read it over GET /sse)".into(),
        ),
        status => {
            // The run's own error, when it has one.
            let run = state.runtime.run(id, record.run_count).await.ok().flatten();
            match run.and_then(|run| run.error) {
                Some(error) => failed(error.code.as_str(), error.message),
                None => failed(status.as_str(), format!("the session is {status}")),
            }
        }
    }
}

/// The events that end the run: a snapshot of what waits and the interrupt, the success
/// with the run's output or text, or the error.
async fn finish(
    state: &AppState,
    id: &SessionId,
    thread: &str,
    run_id: &str,
    settled: Settled,
) -> Vec<Value> {
    match settled {
        Settled::Suspended => {
            let waiting: Vec<PendingAnswer> = match crate::tree::waits(&state.runtime, id).await {
                Ok(waits) => waits
                    .pending
                    .into_iter()
                    .filter(|call| call.waiting)
                    .collect(),
                Err(error) => {
                    return vec![
                        json!({ "type": "RUN_ERROR", "code": error.code(), "message": error.to_string() }),
                    ]
                }
            };
            let interrupts: Vec<Value> = waiting.iter().map(interrupt).collect();
            let snapshot = json!({ "type": "STATE_SNAPSHOT", "snapshot": { "pending": waiting } });
            if interrupts.is_empty() {
                // The tree waits on its sub-agents (a remote one whose server does not
                // answer), not on a person: not a success, and nothing to answer. A run with
                // an empty `resume` tries again.
                return vec![
                    snapshot,
                    json!({ "type": "RUN_ERROR", "code": "awaiting_sub_agents",
                            "message": "the thread waits on sub-agents that are still at work; resume it (an empty resume) to try again" }),
                ];
            }
            // What a client needs to go on from here, before the interrupt (AG-UI's rule).
            let messages = match state.runtime.messages(id).await {
                Ok(messages) => crate::agui_events::messages_snapshot(&messages),
                Err(error) => {
                    return vec![
                        json!({ "type": "RUN_ERROR", "code": error.code(), "message": error.to_string() }),
                    ]
                }
            };
            vec![
                snapshot,
                messages,
                json!({ "type": "RUN_FINISHED", "threadId": thread, "runId": run_id,
                        "outcome": { "type": "interrupt", "interrupts": interrupts } }),
            ]
        }
        Settled::Completed(text) => {
            let output = state
                .runtime
                .session(id)
                .await
                .ok()
                .map(|record| record.run_count);
            let output = match output {
                Some(turn) => state
                    .runtime
                    .run(id, turn)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|run| run.output),
                None => None,
            };
            let mut finished = json!({ "type": "RUN_FINISHED", "threadId": thread, "runId": run_id,
                                       "outcome": { "type": "success" } });
            if let Some(result) = output.or(text) {
                finished["result"] = result;
            }
            vec![finished]
        }
        Settled::Failed { code, message } => {
            vec![json!({ "type": "RUN_ERROR", "code": code, "message": message })]
        }
    }
}

/// One waiting call as an AG-UI interrupt: its id, why (the kind), a prompt, the tool call it
/// concerns, the shape of the answer, and dormant's details.
fn interrupt(call: &PendingAnswer) -> Value {
    let (reason, message, schema) = match call.kind {
        PendingKind::Client => (
            "client_tool",
            format!("{} waits for its result", call.tool_name),
            call.output_schema.clone(),
        ),
        PendingKind::Approval => (
            "approval",
            format!("approve {}?", call.tool_name),
            Some(
                json!({ "type": "object", "required": ["approved"], "properties": {
                "approved": { "type": "boolean" },
                "reason": { "type": "string" },
                "edited_input": call.input_schema.clone().unwrap_or(json!({ "type": "object" })),
            } }),
            ),
        ),
        PendingKind::Input => (
            "input",
            call.request.as_ref().map_or_else(
                || format!("{} asks for input", call.tool_name),
                |request| request.message.clone(),
            ),
            call.request
                .as_ref()
                .and_then(|request| request.schema.clone()),
        ),
        PendingKind::Reconcile => (
            "reconcile",
            format!(
                "did {} take effect? The process stopped while it ran",
                call.tool_name
            ),
            Some(json!({ "type": "object", "properties": {
                "happened": { "type": "boolean" },
                "result": {},
                "error": { "type": "string" },
            } })),
        ),
    };
    // A tool's question is the prompt; otherwise the tool's description says more.
    let message = match call.kind {
        PendingKind::Input => message,
        _ => call.description.clone().unwrap_or(message),
    };
    let mut interrupt = json!({
        "id": interrupt_id(call),
        "reason": reason,
        "message": message,
        "toolCallId": call.tool_call_id,
        "expiresAt": rfc3339(call.deadline_at_ms),
        "metadata": call,
    });
    if let Some(schema) = schema.filter(Value::is_object) {
        interrupt["responseSchema"] = schema;
    }
    interrupt
}

/// Milliseconds since the Unix epoch as an RFC 3339 UTC time (`2026-11-27T17:47:25.123Z`), the
/// form of an interrupt's `expiresAt`: a call's deadline.
fn rfc3339(ms: u64) -> String {
    let days = ms / 86_400_000;
    let of_day = ms % 86_400_000;
    // Days since the epoch to a civil date (the proleptic Gregorian calendar; H. Hinnant).
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3_600_000,
        of_day / 60_000 % 60,
        of_day / 1_000 % 60,
        of_day % 1_000
    )
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn a_deadline_reads_as_an_rfc3339_utc_time() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_801_645_123), "2026-11-27T17:47:25.123Z");
        assert_eq!(rfc3339(4_102_444_799_999), "2099-12-31T23:59:59.999Z");
    }
}
