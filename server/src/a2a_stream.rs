//! A2A's streaming methods (`a2a.rs`): `SendStreamingMessage` and `SubscribeToTask` answer
//! with server-sent events, each a JSON-RPC response whose result is a `StreamResponse`: the
//! task as it stands, then, once its tree settles (it needs input, or ends), its status and,
//! for a completed task, its result as an artifact. The stream keeps alive, ends when the
//! client goes away (the task goes on) and when the server stops. An error is one event with
//! the JSON-RPC error.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Value};

use crate::a2a_message::{begin_message, task_id};
use crate::a2a_rpc::{check, response, RpcError};
use crate::a2a_task::{self, TaskId};
use crate::access::Credentials;
use crate::state::AppState;

/// The SSE answer to a streaming request.
pub(crate) async fn respond(
    state: AppState,
    agent: &str,
    headers: HeaderMap,
    credentials: Credentials,
    request: Value,
) -> Response {
    let id = request.get("id").cloned().unwrap_or(Value::Null);
    let (sender, receiver) = tokio::sync::mpsc::channel::<Bytes>(16);
    match start(&state, agent, &headers, &credentials, &request).await {
        Ok((task, token)) => {
            tokio::spawn(follow(state, id, task, token, sender));
        }
        Err(error) => {
            // The channel holds it: nothing waits on a reader here.
            let _ = sender.try_send(frame(&response(&id, Err(error))));
        }
    }
    let body = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver
            .recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(bytes), receiver))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// The task the request follows: the one a message starts or answers, or the one named.
async fn start(
    state: &AppState,
    agent: &str,
    headers: &HeaderMap,
    credentials: &Credentials,
    request: &Value,
) -> Result<(TaskId, Option<String>), RpcError> {
    check(headers, request)?;
    let params = &request["params"];
    if request["method"] == "SendStreamingMessage" {
        return begin_message(state, agent, credentials, params).await;
    }
    let task = task_id(params)?;
    credentials.session(&task.session).await?;
    let read = a2a_task::read(state, &task).await?;
    let terminal = matches!(
        read["status"]["state"].as_str(),
        Some("TASK_STATE_COMPLETED" | "TASK_STATE_FAILED" | "TASK_STATE_CANCELED")
    );
    if terminal {
        return Err(RpcError::unsupported(
            "the task is in a terminal state: read it with GetTask",
        ));
    }
    Ok((task, None))
}

fn frame(event: &Value) -> Bytes {
    Bytes::from(format!("data: {event}\n\n"))
}

/// Sends the task, waits for its tree to settle, and sends how it stands then.
async fn follow(
    state: AppState,
    id: Value,
    task: TaskId,
    token: Option<String>,
    sender: tokio::sync::mpsc::Sender<Bytes>,
) {
    let send = |result: Result<Value, RpcError>| {
        let sender = sender.clone();
        let event = frame(&response(&id, result));
        async move { sender.send(event).await.is_ok() }
    };
    let first = a2a_task::read(&state, &task).await.map_err(RpcError::from);
    let first = first.map(|mut read| {
        if let Some(token) = &token {
            read["metadata"] = json!({ "dormant_session_token": token });
        }
        json!({ "task": read })
    });
    let failed = first.is_err();
    if !send(first).await || failed {
        return;
    }
    let shutting_down = crate::shutdown::shutting_down(state.closing.clone());
    tokio::pin!(shutting_down);
    let settled = state.runtime.wait_tree_settled(&task.session);
    tokio::pin!(settled);
    let mut keep_alive = tokio::time::interval(state.config.sse_keep_alive);
    keep_alive.tick().await;
    loop {
        tokio::select! {
            () = sender.closed() => return,
            () = &mut shutting_down => return,
            _ = keep_alive.tick() => {
                if sender.send(Bytes::from_static(b":\n\n")).await.is_err() {
                    return;
                }
            }
            () = &mut settled => break,
        }
    }
    let read = match a2a_task::read(&state, &task).await {
        Ok(read) => read,
        Err(error) => {
            send(Err(error.into())).await;
            return;
        }
    };
    let (task_id, context) = (read["id"].clone(), read["contextId"].clone());
    let status = json!({ "statusUpdate": { "taskId": task_id, "contextId": context, "status": read["status"] } });
    if !send(Ok(status)).await {
        return;
    }
    if let Some(artifact) = read["artifacts"].get(0) {
        let update = json!({ "artifactUpdate": { "taskId": task_id, "contextId": context,
                                                  "artifact": artifact, "lastChunk": true } });
        send(Ok(update)).await;
    }
}
