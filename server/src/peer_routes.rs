//! `POST /peer`, `POST /peer/follow` and `POST /peer/submit-follow`: the calls of the other
//! nodes of a cluster, answered here (the client side, [`HttpPeers`](crate::HttpPeers), is
//! peers.rs). Not client routes: a call carries the node's key, not a session token, and is
//! served by the runtime itself, here and never further.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use dormant::cluster::peer::{PeerAnswer, PeerCall, PeerEvent, PeerFailure};
use futures::StreamExt;

use crate::error::ApiError;
use crate::peers::{Follow, FOLLOW_TO_SETTLE, PEER_KEY};
use crate::state::AppState;

/// The caller's key, if it is this node's: a caller without it is refused whatever it sent,
/// and learns nothing of how its body would have been read.
fn peer_key<'h>(state: &AppState, headers: &'h HeaderMap) -> Result<&'h str, ApiError> {
    let key = headers
        .get(PEER_KEY)
        .and_then(|key| key.to_str().ok())
        .unwrap_or_default();
    if !state.runtime.accepts_peer_key(key) {
        return Err(ApiError::from(dormant::Error::PeerRefused));
    }
    Ok(key)
}

/// A body that is no call: 400.
fn unreadable(what: &str, error: &serde_json::Error) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_request",
        format!("not a peer {what}: {error}"),
    )
}

/// The caller's key, checked before a byte of the body is read, then the body: within the
/// body cap and the request timeout. A peer's call may wait for a run as long as it takes (the
/// request timeout is off for `POST /peer`), but its body may not: a caller that sends headers
/// and then nothing would hold its connection, and the server's drain at shutdown, for good.
async fn keyed_body<'h>(
    state: &AppState,
    headers: &'h HeaderMap,
    body: Body,
) -> Result<(&'h str, Bytes), ApiError> {
    let key = peer_key(state, headers)?;
    let (limit, timeout) = (state.config.max_body_bytes, state.config.request_timeout);
    let read = tokio::time::timeout(timeout, axum::body::to_bytes(body, limit))
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!("the body was not read within {} ms", timeout.as_millis()),
            )
        })?;
    let bytes = read.map_err(|error| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the body could not be read within {limit} bytes: {error}"),
        )
    })?;
    Ok((key, bytes))
}

/// The caller's key (checked first) and the call its body holds.
async fn peer_call<'h>(
    state: &AppState,
    headers: &'h HeaderMap,
    body: Body,
) -> Result<(&'h str, PeerCall), ApiError> {
    let (key, body) = keyed_body(state, headers, body).await?;
    let call = serde_json::from_slice(&body).map_err(|error| unreadable("call", &error))?;
    Ok((key, call))
}

/// `POST /peer`: a call from another node of the cluster, answered 200 with its
/// [`PeerAnswer`](dormant::cluster::peer::PeerAnswer) (a failure of the call included), 403
/// `peer_refused` without this node's key, 400 for a body that is no call. The key is checked
/// first.
pub(crate) async fn serve(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (key, call) = peer_call(&state, &headers, body).await?;
    // A call that waits for a run to settle (an execute, a resume, a wait) could wait longer
    // than a shutdown's drain, which waits for it: at a shutdown it is answered that this
    // node shut down (the caller reads the owner as gone, and asks again); its run is
    // stopped by the runtime's own shutdown after the drain. Other calls are answered as
    // they end.
    let waits = matches!(
        call,
        PeerCall::Execute { .. }
            | PeerCall::Resume { wait: true, .. }
            | PeerCall::WaitSettled { .. }
    );
    let served = state.runtime.serve_peer(key, call);
    let answer = if waits {
        tokio::select! {
            answer = served => answer?,
            () = crate::shutdown::shutting_down(state.closing.clone()) => {
                PeerAnswer::Failed(PeerFailure::of(&dormant::Error::ShutDown))
            }
        }
    } else {
        served.await?
    };
    Ok(Json(answer).into_response())
}

/// `POST /peer/follow`: another node follows a session's stream here, where it runs: 200 with
/// one JSON [`PeerEvent`](dormant::cluster::peer::PeerEvent) a line, as the chunks and deltas come,
/// until the caller hangs up (or the stream fails here, which its last event says), or with
/// `to_settle` until the session settles (a last `settled` event). 403 and 400 as
/// `POST /peer`.
pub(crate) async fn follow(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (key, body) = keyed_body(&state, &headers, body).await?;
    let Follow {
        session,
        from,
        to_settle,
    } = serde_json::from_slice(&body).map_err(|error| unreadable("follow", &error))?;
    let events = if to_settle {
        state
            .runtime
            .serve_peer_follow_to_settle(key, &session, from)?
            .boxed()
    } else {
        state
            .runtime
            .serve_peer_follow(key, &session, from)?
            .boxed()
    };
    let mut response = ndjson(&state, events);
    if to_settle {
        // Says this stream ends at the settle: a node of an earlier version ignores
        // `to_settle`, and its follower must then wait for the settle by a call.
        response
            .headers_mut()
            .insert(FOLLOW_TO_SETTLE, axum::http::HeaderValue::from_static("1"));
    }
    Ok(response)
}

/// `POST /peer/submit-follow`: another node's
/// [`Peers::submit_and_follow`](dormant::cluster::peer::Peers::submit_and_follow), a
/// [`PeerCall::SubmitAndResume`] (any other call is 400): 200 with its answer as the first
/// line (or the call's failure, alone), then, for a resume that started a run, its stream to
/// the settle as `POST /peer/follow` sends it with `to_settle`. 403 and 400 as `POST /peer`.
pub(crate) async fn submit_follow(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (key, call) = peer_call(&state, &headers, body).await?;
    let PeerCall::SubmitAndResume { submit } = call else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "not a peer submit_and_resume call",
        ));
    };
    let events = state.runtime.serve_peer_submit_follow(key, submit)?;
    Ok(ndjson(&state, events.boxed()))
}

/// `events` as a body of one JSON line each, until the server shuts down: a follow may be
/// open-ended (until the caller hangs up), and must not hold the drain of a shutdown. The
/// node that follows reads an end as the owner gone, and follows the rest from the store.
fn ndjson(state: &AppState, events: futures::stream::BoxStream<'static, PeerEvent>) -> Response {
    let shutting_down = crate::shutdown::shutting_down(state.closing.clone());
    let lines = events.take_until(Box::pin(shutting_down)).map(|event| {
        let mut line = serde_json::to_vec(&event).unwrap_or_default();
        line.push(b'\n');
        Ok::<_, std::convert::Infallible>(Bytes::from(line))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}
