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
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use dormant::SessionId;
use serde_json::{json, Value};

use crate::a2a_message::{begin_message, task_id};
use crate::a2a_rpc::{check, response, RpcError, METHOD_NOT_FOUND, TASK_NOT_CANCELABLE};
use crate::a2a_task;
use crate::access::Credentials;
use crate::body::{JsonBody, Segment};
use crate::state::AppState;

/// The A2A extension a dormant server's card declares: its tasks list their calls, and answers
/// are judged by its submit contract (docs/protocols.md). dormant's A2A client speaks to such
/// an agent call by call.
pub const DORMANT_EXTENSION: &str = "urn:dormant:a2a:calls:v1";

/// `GET /.well-known/agent-card.json`: the card of the server's agent (`page_agent`), its
/// JSON-RPC interface at `/a2a` of the host the card was asked of.
///
/// The URL comes from the request's `Host`, over plain HTTP unless a proxy in front says
/// `X-Forwarded-Proto: https` (or rewrites it; or the daemon serves its own card), so the
/// answer is never cached for another host.
pub(crate) async fn card(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let agent = state.config.page_agent.clone();
    card_of(&state, &headers, &agent, "/a2a")
}

/// `GET /a2a/{agent}/.well-known/agent-card.json`: the card of any agent of the server, its
/// JSON-RPC interface at `/a2a/{agent}`.
pub(crate) async fn agent_card(
    State(state): State<AppState>,
    Segment(agent): Segment,
    headers: HeaderMap,
) -> Response {
    if !state.runtime.has_agent(&agent) {
        return unknown_agent(&agent);
    }
    card_of(&state, &headers, &agent, &format!("/a2a/{agent}"))
}

fn unknown_agent(agent: &str) -> Response {
    crate::error::ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "unknown_agent",
        format!("no agent {agent:?} here"),
    )
    .into_response()
}

fn card_of(state: &AppState, headers: &HeaderMap, agent: &str, path: &str) -> Response {
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|host| host.to_str().ok())
        .unwrap_or("127.0.0.1");
    // Behind a TLS proxy that says so, the interface is https as the card was.
    let scheme = match headers
        .get("x-forwarded-proto")
        .and_then(|proto| proto.to_str().ok())
    {
        Some(proto) if proto.eq_ignore_ascii_case("https") => "https",
        _ => "http",
    };
    let (schemes, requirements) = state.auth.card_security();
    let card = Json(json!({
        "name": agent,
        "description": format!("dormant agent {agent}: durable sessions that may wait for a person"),
        "version": env!("CARGO_PKG_VERSION"),
        "supportedInterfaces": [{
            "url": format!("{scheme}://{host}{path}"),
            "protocolBinding": "JSONRPC",
            "protocolVersion": "1.0",
        }],
        "capabilities": {
            "streaming": true,
            "pushNotifications": false,
            "extensions": [{
                "uri": DORMANT_EXTENSION,
                "description": "dormant's calls: a waiting task lists the calls of its tree (a data part {\"pending\": [...]}), a follow-up's data parts answer them through dormant's submit contract, and a status message's metadata.dormant says when the next message resumes the run (interrupted, resumable)",
                "required": false,
            }],
        },
        "securitySchemes": schemes,
        "securityRequirements": requirements,
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

/// `POST /a2a`: one JSON-RPC request; a message that starts a task starts the server's agent
/// (`page_agent`).
pub(crate) async fn rpc(
    State(state): State<AppState>,
    headers: HeaderMap,
    credentials: Credentials,
    JsonBody(request): JsonBody<Value>,
) -> Response {
    let agent = state.config.page_agent.clone();
    rpc_of(state, agent, headers, credentials, request).await
}

/// `POST /a2a/{agent}`: one JSON-RPC request to `agent`.
pub(crate) async fn agent_rpc(
    State(state): State<AppState>,
    Segment(agent): Segment,
    headers: HeaderMap,
    credentials: Credentials,
    JsonBody(request): JsonBody<Value>,
) -> Response {
    if !state.runtime.has_agent(&agent) {
        return unknown_agent(&agent);
    }
    rpc_of(state, agent, headers, credentials, request).await
}

async fn rpc_of(
    state: AppState,
    agent: String,
    headers: HeaderMap,
    credentials: Credentials,
    request: Value,
) -> Response {
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    if matches!(
        request["method"].as_str(),
        Some("SendStreamingMessage" | "SubscribeToTask")
    ) {
        return crate::a2a_stream::respond(state, &agent, headers, credentials, request).await;
    }
    Json(response(
        &id,
        call(&state, &agent, &headers, &credentials, &request).await,
    ))
    .into_response()
}

async fn call(
    state: &AppState,
    agent: &str,
    headers: &HeaderMap,
    credentials: &Credentials,
    request: &Value,
) -> Result<Value, RpcError> {
    check(headers, request)?;
    let params = &request["params"];
    match request["method"].as_str().unwrap_or_default() {
        "SendMessage" => send_message(state, agent, credentials, params).await,
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
        "ListTasks" => list_tasks(state, credentials, params).await,
        other => Err(RpcError::new(
            METHOD_NOT_FOUND,
            format!("no method {other:?}"),
        )),
    }
}

/// `ListTasks` of one context (`contextId`, which is required: a context is a session, and
/// a caller may list only the sessions it may act on), the latest first, one page of at most
/// `pageSize` (50 by default, 100 at most) from `pageToken` (the `nextPageToken` of the page
/// before: how many tasks it has passed).
async fn list_tasks(
    state: &AppState,
    credentials: &Credentials,
    params: &Value,
) -> Result<Value, RpcError> {
    let context = params["contextId"].as_str().ok_or_else(|| {
        RpcError::invalid_params("ListTasks lists the tasks of one context: params.contextId")
    })?;
    let session: SessionId = context
        .parse()
        .map_err(|error| RpcError::invalid_params(format!("contextId: {error}")))?;
    credentials.session(&session).await?;
    let limit = params["pageSize"]
        .as_u64()
        .map_or(50, |size| size.clamp(1, 100));
    let skip = match params["pageToken"]
        .as_str()
        .filter(|token| !token.is_empty())
    {
        Some(token) => token.parse::<usize>().map_err(|_| {
            RpcError::invalid_params(format!("pageToken {token:?} is not one of this server's"))
        })?,
        None => 0,
    };
    let limit = usize::try_from(limit).unwrap_or(100);
    let (tasks, total) = a2a_task::list(state, &session, skip, limit).await?;
    let passed = skip.saturating_add(tasks.len());
    let next = if passed < total {
        passed.to_string()
    } else {
        String::new()
    };
    Ok(json!({
        "tasks": tasks, "nextPageToken": next, "pageSize": limit, "totalSize": total,
    }))
}

/// `SendMessage`: a message to a task that waits answers it (and the run goes on once nothing
/// else waits); a message in a context, or in none, starts a turn. Answers the task once its
/// tree has settled (blocking).
async fn send_message(
    state: &AppState,
    agent: &str,
    credentials: &Credentials,
    params: &Value,
) -> Result<Value, RpcError> {
    let (task, token) = begin_message(state, agent, credentials, params).await?;
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
