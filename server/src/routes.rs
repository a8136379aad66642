//! The routes that act on sessions. Each takes who may act (access.rs), calls the runtime
//! once, and answers JSON; errors go through `error.rs`.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use dormant::types::Untrusted;
use dormant::SessionId;
use dormant::Submit;
use serde_json::{json, Value};

use crate::access::{session_id, Credentials, SessionAccess};
use crate::body::{json_value, JsonBody, Params};
use crate::error::{submit_answer, ApiError};
use crate::sse;
use crate::sse_body::Ends;
use crate::state::AppState;
use crate::wire::{
    AcceptedAndResumed, ForkRequest, InboxQuery, SessionQuery, SessionRequest, StartRequest,
    Started, StateQuery, StatusAnswer, StreamOption, SubmitQuery,
};

/// `POST /start`: a new session (server-issued id, or named by a caller that may choose ids),
/// or a new turn of one the caller holds a token for or operates. Answered once the turn is durably started, with the session's
/// token and where to follow it.
pub(crate) async fn start(
    State(state): State<AppState>,
    Params(query): Params<StreamOption>,
    credentials: Credentials,
    request: Request,
) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    let JsonBody(body) = JsonBody::<StartRequest>::read(&headers, body, &state).await?;
    // Whether the caller may give an existing session a new turn: with its token, or as an
    // operator. A caller that may only choose ids names a session it starts, never one that
    // someone else started (whose token this answer would hand it).
    let (id, may_continue) = match &body.session_id {
        None => {
            credentials.caller().await?;
            // A fresh id: no session has it to continue.
            (SessionId::generate(), true)
        }
        Some(text) => {
            let id = session_id(text)?;
            if credentials.has_session_token() {
                credentials.session(&id).await?;
                (id, true)
            } else {
                let caller = credentials.caller().await?;
                if !caller.may_choose_session_id {
                    return Err(ApiError::new(
                        StatusCode::FORBIDDEN,
                        "session_id_not_allowed",
                        "this caller may not choose a session id: leave session_id out, or send the session's token to start a new turn of it",
                    ));
                }
                (id, caller.all_sessions)
            }
        }
    };
    let remote_parent = remote_parent(&body, &headers)?;
    if remote_parent.is_some() && !body.new_only {
        return Err(ApiError::invalid(
            "parent_session_id and root_session_id start a remote sub-agent: add new_only",
        ));
    }
    let started = if body.new_only || !may_continue {
        if body.session_id.is_none() {
            return Err(ApiError::invalid("new_only needs a session_id"));
        }
        match remote_parent {
            Some(parent) => {
                state
                    .runtime
                    .start_remote_child(&id, &body.agent, body.message, parent)
                    .await?
            }
            None => {
                let started = state
                    .runtime
                    .start_new(&id, &body.agent, body.message)
                    .await;
                match started {
                    Err(dormant::Error::SessionExists(_)) if !body.new_only => {
                        return Err(ApiError::new(
                            StatusCode::FORBIDDEN,
                            "session_token_required",
                            format!("session {id} exists: a new turn of it needs its token (Authorization: Bearer <token>)"),
                        ));
                    }
                    started => started?,
                }
            }
        }
    } else {
        state
            .runtime
            .start_on(&id, &body.agent, body.message)
            .await?
    };
    tracing::info!(session = %id, agent = %Untrusted(&body.agent), "server.started");
    let token = state.key.issue(&id);
    let from = started.from_seq;
    let answer = Started::new(started, Some(token));
    if query.stream {
        let first = sse::first_event("started", &answer);
        let ends = Ends::AtSettle {
            backstop: true,
            after: from,
        };
        return Ok(sse::events(&state, &id, from, ends, Some(first)));
    }
    Ok((StatusCode::ACCEPTED, Json(answer)).into_response())
}

/// The parent on another server a start names, if any (both ids or neither), with the W3C
/// `traceparent` of its calling run when the request carries one (kept only if well formed).
fn remote_parent(
    body: &StartRequest,
    headers: &axum::http::HeaderMap,
) -> Result<Option<dormant::remote::RemoteParent>, ApiError> {
    let traceparent = headers
        .get("traceparent")
        .and_then(|value| value.to_str().ok())
        .filter(|value| is_traceparent(value))
        .map(str::to_string);
    match (&body.parent_session_id, &body.root_session_id) {
        (None, None) => Ok(None),
        (Some(parent), Some(root)) => Ok(Some(dormant::remote::RemoteParent {
            parent: parent
                .parse()
                .map_err(|error| ApiError::invalid(format!("parent_session_id: {error}")))?,
            root: root
                .parse()
                .map_err(|error| ApiError::invalid(format!("root_session_id: {error}")))?,
            traceparent,
        })),
        _ => Err(ApiError::invalid(
            "give parent_session_id and root_session_id together",
        )),
    }
}

/// Whether `value` has the shape of a W3C `traceparent` (version 00): what the start route
/// keeps of a header a client may fill with anything.
fn is_traceparent(value: &str) -> bool {
    let hex = |part: &str, len: usize| {
        part.len() == len
            && part
                .bytes()
                .all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
    };
    let zero = |part: &str| part.bytes().all(|byte| byte == b'0');
    let parts: Vec<&str> = value.split('-').collect();
    matches!(parts.as_slice(), [version, trace, span, flags]
        if *version == "00" && hex(trace, 32) && hex(span, 16) && hex(flags, 2)
            && !zero(trace) && !zero(span))
}

/// `POST /resume`: continues a suspended or interrupted run; answered once it is durably
/// resumed (or found still waiting).
pub(crate) async fn resume(
    State(state): State<AppState>,
    credentials: Credentials,
    JsonBody(body): JsonBody<SessionRequest>,
) -> Result<(StatusCode, Json<Started>), ApiError> {
    let id = session_id(&body.session_id)?;
    credentials.session(&id).await?;
    let started = state.runtime.start_resume(&id).await?;
    Ok((StatusCode::ACCEPTED, Json(Started::new(started, None))))
}

/// `POST /submit-tool-result`: the envelope of [`Submit::from_json`]; 200 `accepted` only
/// once the answer is durable. With `?resume=true`, an accepted answer is followed by a
/// resume in the same request (one round trip instead of two for the last answer a run
/// waits on): the answer adds `resumed` (as `POST /resume` answers), or `resume_error` if the
/// resume was refused; the answer stays accepted either way.
pub(crate) async fn submit(
    State(state): State<AppState>,
    Params(query): Params<SubmitQuery>,
    credentials: Credentials,
    request: Request,
) -> Result<Response, ApiError> {
    if query.stream && !query.resume {
        return Err(ApiError::invalid(
            "stream=true streams the resumed run: add resume=true",
        ));
    }
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    let envelope = json_value(&headers, body, &state).await?;
    let submit = Submit::from_json(&envelope).map_err(ApiError::invalid)?;
    let id = session_id(&submit.session_id)?;
    credentials.session(&id).await?;
    let call = submit.tool_call_id.clone();
    // With the resume, one call of the runtime: one hop to the node that owns the session
    // (with the stream, the same hop brings the resumed run's stream).
    let (outcome, resumed, follow) = if query.stream {
        let followed = state.runtime.submit_resume_and_follow(submit).await?;
        let answer = followed.answer;
        (answer.outcome, answer.resumed, followed.follow)
    } else if query.resume {
        let answer = state.runtime.submit_and_resume(submit).await?;
        (answer.outcome, answer.resumed, None)
    } else {
        (state.runtime.submit_tool_result(submit).await?, None, None)
    };
    tracing::info!(session = %id, tool_call_id = %Untrusted(&call), outcome = outcome.code(), "server.submit");
    let mut answer = submit_answer(outcome)?;
    let Some(resumed) = resumed else {
        return Ok(Json(answer).into_response());
    };
    match resumed {
        Ok(started) => {
            let from = started.from_seq;
            let settled = started.settled;
            let resumed = Started::new(started, None);
            if query.stream {
                let first = sse::first_event("accepted", &AcceptedAndResumed::new(resumed));
                // A resume that found calls still waiting, and no sub-agent to wake, ran
                // nothing: there is no run to stream, and the stream says so at once.
                if settled {
                    return Ok(sse::settled_at_once(first));
                }
                // A run, or sub-agents woken (their runs, copied into this stream when they
                // report, and this session's own if it goes on), until it all settles: on
                // the follow the runtime opened with the answer.
                return Ok(match follow {
                    Some(follow) => sse::followed(&state, &id, from, follow, first),
                    None => {
                        let ends = Ends::AtSettle {
                            backstop: true,
                            after: from,
                        };
                        sse::events(&state, &id, from, ends, Some(first))
                    }
                });
            }
            if let Some(fields) = answer.as_object_mut() {
                fields.insert(
                    "resumed".into(),
                    serde_json::to_value(resumed).unwrap_or_default(),
                );
            }
        }
        Err(failure) => {
            if let Some(fields) = answer.as_object_mut() {
                fields.insert(
                    "resume_error".into(),
                    json!({ "code": failure.code, "message": failure.message }),
                );
            }
        }
    }
    Ok(Json(answer).into_response())
}

/// `POST /interrupt`: returns once the whole tree has stopped.
pub(crate) async fn interrupt(
    State(state): State<AppState>,
    credentials: Credentials,
    JsonBody(body): JsonBody<SessionRequest>,
) -> Result<Json<Value>, ApiError> {
    stop(&state, &credentials, &body, false).await
}

/// `POST /abort`: terminal; returns once the whole tree has stopped.
pub(crate) async fn abort(
    State(state): State<AppState>,
    credentials: Credentials,
    JsonBody(body): JsonBody<SessionRequest>,
) -> Result<Json<Value>, ApiError> {
    stop(&state, &credentials, &body, true).await
}

async fn stop(
    state: &AppState,
    credentials: &Credentials,
    body: &SessionRequest,
    abort: bool,
) -> Result<Json<Value>, ApiError> {
    let id = session_id(&body.session_id)?;
    credentials.session(&id).await?;
    if abort {
        state.runtime.abort(&id).await?;
    } else {
        state.runtime.interrupt(&id).await?;
    }
    let status = state.runtime.status(&id).await?;
    let mut answer = json!({ "session_id": id, "status": status });
    if let (true, Some(fields)) = (abort, answer.as_object_mut()) {
        fields.insert("aborted".into(), Value::Bool(true));
    }
    Ok(Json(answer))
}

/// The longest `GET /status?settle_ms=` waits.
const MAX_SETTLE_WAIT: Duration = Duration::from_secs(10);

/// `GET /status`: the run's status and the calls it waits on.
pub(crate) async fn status(
    State(state): State<AppState>,
    Params(query): Params<SessionQuery>,
    SessionAccess(id): SessionAccess,
) -> Result<Json<StatusAnswer>, ApiError> {
    let settled = match query.settle_ms {
        Some(ms) => {
            let wait = Duration::from_millis(ms).min(MAX_SETTLE_WAIT);
            // The whole tree here: a sub-agent that goes on by itself (an answer accepted
            // with auto_resume) is at work before its parent learns of it.
            let waited = tokio::time::timeout(wait, state.runtime.wait_tree_settled(&id)).await;
            Some(waited.is_ok())
        }
        None => None,
    };
    let record = state.runtime.session(&id).await?;
    let waits = crate::tree::waits(&state.runtime, &id).await?;
    let run = state.runtime.run(&id, record.run_count).await?;
    let now = state.runtime.now_ms();
    let mut answer = StatusAnswer::new(record, run, waits.pending, now);
    answer.unreachable = waits.unreachable;
    answer.settled = settled;
    if let Some(from) = query.chunks_from {
        // Read after the record: every chunk the status counts is in the answer.
        let chunks = state
            .runtime
            .chunks_at_most(&id, from, crate::wire::MAX_STATUS_CHUNKS)
            .await?;
        answer.chunks = Some(chunks);
    }
    Ok(Json(answer))
}

/// `GET /runs`: every run record of the session, in order.
pub(crate) async fn runs(
    State(state): State<AppState>,
    Params(_query): Params<SessionQuery>,
    SessionAccess(id): SessionAccess,
) -> Result<Json<Value>, ApiError> {
    let runs = state.runtime.runs(&id).await?;
    Ok(Json(json!({ "session_id": id, "runs": runs })))
}

/// `GET /messages`: the conversation.
pub(crate) async fn messages(
    State(state): State<AppState>,
    Params(_query): Params<SessionQuery>,
    SessionAccess(id): SessionAccess,
) -> Result<Json<Value>, ApiError> {
    let messages = state.runtime.messages(&id).await?;
    Ok(Json(json!({ "session_id": id, "messages": messages })))
}

/// `GET /checkpoints`: every checkpoint of the session, oldest first.
pub(crate) async fn checkpoints(
    State(state): State<AppState>,
    Params(_query): Params<SessionQuery>,
    SessionAccess(id): SessionAccess,
) -> Result<Json<Value>, ApiError> {
    let checkpoints = state.runtime.checkpoints(&id).await?;
    Ok(Json(
        json!({ "session_id": id, "checkpoints": checkpoints }),
    ))
}

/// `GET /state?checkpoint=`: the session as it was at a checkpoint.
pub(crate) async fn state_at(
    State(state): State<AppState>,
    Params(query): Params<StateQuery>,
    SessionAccess(id): SessionAccess,
) -> Result<Json<Value>, ApiError> {
    let checkpoint = dormant::types::CheckpointId(query.checkpoint);
    match state.runtime.state_at(&id, checkpoint).await? {
        dormant::types::StateAt::Found(past) => {
            Ok(Json(json!({ "session_id": id, "state": past })))
        }
        dormant::types::StateAt::Compacted { oldest_kept } => Err(ApiError::new(
            StatusCode::GONE,
            "checkpoint_compacted",
            format!("checkpoint {checkpoint} of session {id} was compacted away; its oldest checkpoint is {oldest_kept}"),
        )),
        _ => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_checkpoint",
            format!("session {id} has no checkpoint {checkpoint}"),
        )),
    }
}

/// `POST /fork`: a new session whose history is the source's up to a checkpoint. Whoever may
/// act on the source may fork it; the fork gets a server-issued id and a token of its own.
/// Answered once the fork is durable (and its first run, if a message starts one, settled).
pub(crate) async fn fork(
    State(state): State<AppState>,
    credentials: Credentials,
    JsonBody(body): JsonBody<ForkRequest>,
) -> Result<Response, ApiError> {
    let source = session_id(&body.session_id)?;
    credentials.session(&source).await?;
    let mut options = dormant::types::ForkOptions::new();
    if let Some(message) = body.message {
        options = options.message(message);
    }
    if let Some(text) = body.edit_message {
        options = options.edit_last_message(text);
    }
    for answer in body.answers {
        let call = answer.tool_call_id.clone();
        let (call, answer) = answer.answer().ok_or_else(|| {
            ApiError::invalid(format!(
                "answers: {call} needs exactly one of result, error or approved"
            ))
        })?;
        options = options.answer(call, answer);
    }
    let checkpoint = dormant::types::CheckpointId(body.checkpoint);
    // A fork that was made but could not go on is still the caller's: it gets its id and
    // token, with what failed.
    let (fork, failed) = match state.runtime.fork(&source, checkpoint, options).await {
        Ok(fork) => (fork, None),
        Err(dormant::Error::Fork(dormant::types::ForkError::ContinuationFailed {
            fork,
            code,
            reason,
        })) => (fork, Some(json!({ "code": code, "message": reason }))),
        Err(error) => return Err(error.into()),
    };
    tracing::info!(session = %fork, source = %source, checkpoint = %checkpoint, "server.forked");
    let record = state.runtime.session(&fork).await?;
    let mut answer = json!({
        "session_id": fork,
        "token": state.key.issue(&fork),
        "status": record.status,
        "forked_from": record.forked_from,
    });
    if let (Some(failed), Some(fields)) = (failed, answer.as_object_mut()) {
        fields.insert("continuation_error".into(), failed);
    }
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// The most calls one page of `GET /inbox` lists.
const MAX_INBOX_PAGE: usize = 500;

/// `GET /inbox`: every call that waits for a person, across sessions, soonest deadline first.
/// It lists every session's calls, so only an operator may read it.
pub(crate) async fn inbox(
    State(state): State<AppState>,
    Params(query): Params<InboxQuery>,
    credentials: Credentials,
) -> Result<Json<Value>, ApiError> {
    let caller = credentials.caller().await?;
    if !caller.all_sessions {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "operator_only",
            "the inbox lists the calls of every session: an operator's credentials only",
        ));
    }
    let mut filter = dormant::types::InboxFilter::all();
    if let Some(agent) = query.agent {
        filter = filter.agent(agent);
    }
    if let Some(kind) = query.kind {
        filter = filter.kind(kind);
    }
    if let Some(tool) = query.tool {
        filter = filter.tool(tool);
    }
    let limit = query.limit.unwrap_or(50).clamp(1, MAX_INBOX_PAGE);
    let after = query.after.map(dormant::types::InboxCursor);
    let page = state.runtime.inbox(&filter, after.as_ref(), limit).await?;
    Ok(Json(json!(page)))
}

#[cfg(test)]
mod tests {
    use super::is_traceparent;

    #[test]
    fn only_a_well_formed_traceparent_is_kept() {
        assert!(is_traceparent(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        ));
        for bad in [
            "",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c80319c\n-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        ] {
            assert!(!is_traceparent(bad), "{bad:?}");
        }
    }
}
