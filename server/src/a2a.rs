//! A2A 1.0 over JSON-RPC (`POST /a2a`) and the agent card (`GET
//! /.well-known/agent-card.json`): an agent that calls agents through the open Agent2Agent
//! protocol runs dormant's sessions as its tasks (`a2a_task.rs` says how a session reads as a
//! task). A task is the run a message started and the runs that resumed it
//! (`{session}:{run}`), its context the session; a pending client tool, approval or
//! reconciliation is `TASK_STATE_INPUT_REQUIRED` with the calls in its status message, and the
//! follow-up message answers them through the submit contract. `SendMessage` (blocking),
//! `GetTask`, `CancelTask` (an abort), and, in `a2a_stream.rs`, `SendStreamingMessage` and
//! `SubscribeToTask`. docs/protocols.md says what maps to what.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use dormant::{SessionId, Submit};
use serde_json::{json, Value};

use crate::a2a_task::{self, TaskId};
use crate::access::Credentials;
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::state::AppState;

/// JSON-RPC and A2A error codes.
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL: i64 = -32603;
const TASK_NOT_FOUND: i64 = -32001;
const TASK_NOT_CANCELABLE: i64 = -32002;
const UNSUPPORTED_OPERATION: i64 = -32004;
const VERSION_NOT_SUPPORTED: i64 = -32009;

/// A JSON-RPC error: its code, its message, and dormant's code as data.
#[derive(Debug)]
pub(crate) struct RpcError {
    code: i64,
    message: String,
    data: Option<Value>,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub(crate) fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, message)
    }

    pub(crate) fn unsupported(message: impl Into<String>) -> Self {
        Self::new(UNSUPPORTED_OPERATION, message)
    }
}

impl From<ApiError> for RpcError {
    /// By dormant's code, then by status: what the client did wrong is invalid params, a task
    /// this server does not know is task-not-found, an answer that comes too late an
    /// unsupported operation. dormant's code rides in `data`, as an `ErrorInfo` (A2A's form).
    fn from(error: ApiError) -> Self {
        let code = match (error.code(), error.status()) {
            ("unknown_task" | "unknown_session", _) => TASK_NOT_FOUND,
            ("already_completed" | "stale_approval" | "already_running" | "not_resumable", _) => {
                UNSUPPORTED_OPERATION
            }
            (_, StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY)
            | (_, StatusCode::PAYLOAD_TOO_LARGE | StatusCode::NOT_FOUND) => INVALID_PARAMS,
            (_, StatusCode::CONFLICT) => UNSUPPORTED_OPERATION,
            (_, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => INVALID_REQUEST,
            _ => INTERNAL,
        };
        Self {
            code,
            message: error.message().to_string(),
            data: Some(json!([{
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": error.code().to_uppercase(),
                "domain": "dormant",
                "metadata": { "code": error.code() },
            }])),
        }
    }
}

impl From<dormant::Error> for RpcError {
    fn from(error: dormant::Error) -> Self {
        ApiError::from(error).into()
    }
}

impl From<dormant::ReadError> for RpcError {
    fn from(error: dormant::ReadError) -> Self {
        ApiError::from(error).into()
    }
}

/// `GET /.well-known/agent-card.json`: the card of the server's agent (`page_agent`), its
/// JSON-RPC interface at `/a2a` of the host the card was asked of.
///
/// The URL comes from the request's `Host` (plain HTTP: behind TLS, a proxy rewrites it or the
/// daemon serves its own card), so the answer is never cached for another host.
pub(crate) async fn card(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|host| host.to_str().ok())
        .unwrap_or("127.0.0.1");
    let agent = &state.config.page_agent;
    let card = Json(json!({
        "name": agent,
        "description": format!("dormant agent {agent}: durable sessions that may wait for a person"),
        "version": env!("CARGO_PKG_VERSION"),
        "supportedInterfaces": [{
            "url": format!("http://{host}/a2a"),
            "protocolBinding": "JSONRPC",
            "protocolVersion": "1.0",
        }],
        "capabilities": { "streaming": true, "pushNotifications": false },
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": [{
            "id": agent,
            "name": agent,
            "description": format!("a conversation with the {agent} agent"),
            "tags": ["dormant"],
        }],
    }));
    ([(axum::http::header::CACHE_CONTROL, "no-store")], card).into_response()
}

/// `POST /a2a`: one JSON-RPC request.
pub(crate) async fn rpc(
    State(state): State<AppState>,
    headers: HeaderMap,
    credentials: Credentials,
    JsonBody(request): JsonBody<Value>,
) -> Response {
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    if matches!(
        request["method"].as_str(),
        Some("SendStreamingMessage" | "SubscribeToTask")
    ) {
        return crate::a2a_stream::respond(state, headers, credentials, request).await;
    }
    Json(response(
        &id,
        call(&state, &headers, &credentials, &request).await,
    ))
    .into_response()
}

/// A JSON-RPC response to request `id`.
pub(crate) fn response(id: &Value, answer: Result<Value, RpcError>) -> Value {
    match answer {
        Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        Err(error) => {
            let mut body = json!({ "code": error.code, "message": error.message });
            if let Some(data) = error.data {
                body["data"] = data;
            }
            json!({ "jsonrpc": "2.0", "id": id, "error": body })
        }
    }
}

/// What every request is checked for: protocol 1.0 (a client that names another version is
/// told so) and JSON-RPC 2.0.
pub(crate) fn check(headers: &HeaderMap, request: &Value) -> Result<(), RpcError> {
    if let Some(version) = headers.get("a2a-version").and_then(|v| v.to_str().ok()) {
        if version != "1.0" && !version.starts_with("1.0.") && version != "1" {
            return Err(RpcError::new(
                VERSION_NOT_SUPPORTED,
                format!("A2A version {version} is not supported: 1.0"),
            ));
        }
    }
    if request["jsonrpc"] != "2.0" {
        return Err(RpcError::new(INVALID_REQUEST, "not a JSON-RPC 2.0 request"));
    }
    Ok(())
}

async fn call(
    state: &AppState,
    headers: &HeaderMap,
    credentials: &Credentials,
    request: &Value,
) -> Result<Value, RpcError> {
    check(headers, request)?;
    let params = &request["params"];
    match request["method"].as_str().unwrap_or_default() {
        "SendMessage" => send_message(state, credentials, params).await,
        "GetTask" => {
            let task = task_id(params)?;
            credentials.session(&task.session).await?;
            Ok(a2a_task::read(state, &task).await?)
        }
        "CancelTask" => {
            let task = task_id(params)?;
            credentials.session(&task.session).await?;
            if !a2a_task::cancelable(state, &task).await? {
                return Err(RpcError::new(
                    TASK_NOT_CANCELABLE,
                    "the task is over (completed, failed, canceled, or followed by another in its context)",
                ));
            }
            // An abort: the session's run and its sub-agents stop, and the context takes no
            // more messages.
            state.runtime.abort(&task.session).await?;
            Ok(a2a_task::read(state, &task).await?)
        }
        other => Err(RpcError::new(
            METHOD_NOT_FOUND,
            format!("no method {other:?}"),
        )),
    }
}

pub(crate) fn task_id(params: &Value) -> Result<TaskId, RpcError> {
    let text = params["id"]
        .as_str()
        .ok_or_else(|| RpcError::new(INVALID_PARAMS, "params.id (the task id) is required"))?;
    TaskId::parse(text).ok_or_else(|| RpcError::new(TASK_NOT_FOUND, format!("no task {text:?}")))
}

/// `SendMessage`: a message to a task that waits answers it (and the run goes on once nothing
/// else waits); a message in a context, or in none, starts a turn. Answers the task once its
/// tree has settled (blocking).
async fn send_message(
    state: &AppState,
    credentials: &Credentials,
    params: &Value,
) -> Result<Value, RpcError> {
    let (task, token) = begin_message(state, credentials, params).await?;
    // Blocking, within the request's time (the task as it stands then, still working: the
    // client polls it or subscribes), unless the client asked to be answered at once.
    if params["configuration"]["returnImmediately"] != true {
        let bound = state
            .config
            .request_timeout
            .saturating_sub(std::time::Duration::from_secs(2))
            .max(std::time::Duration::from_millis(100));
        let _ = tokio::time::timeout(bound, state.runtime.wait_tree_settled(&task.session)).await;
    }
    let mut read = a2a_task::read(state, &task).await?;
    if let Some(token) = token {
        read["metadata"] = json!({ "dormant_session_token": token });
    }
    Ok(json!({ "task": read }))
}

/// What a message asks for, started: the task it answers or starts, and, for a session this
/// request made, its token (for the messages that answer it). A new task in a context whose
/// current task waits for input is refused: it would abandon what waits.
pub(crate) async fn begin_message(
    state: &AppState,
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
        a2a_task::continue_task(state, &task, parts, &text).await?;
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
        let agent = state.config.page_agent.clone();
        let started = state.runtime.start_on(&session, &agent, text).await?;
        a2a_task::started(state, &session, started.run_id).await?
    };
    // A session this request made: its token, whatever credentials made it, for the messages
    // that answer it.
    let token = generated.then(|| state.key.issue(&task.session));
    Ok((task, token))
}

/// Submits one answer of a follow-up message; an answer the submit contract refuses is its
/// error (`data.code` says which).
pub(crate) async fn submit(state: &AppState, submit: Submit) -> Result<(), RpcError> {
    let outcome = state.runtime.submit_tool_result(submit).await?;
    crate::error::submit_answer(outcome)
        .map(drop)
        .map_err(RpcError::from)
}
