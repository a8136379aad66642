//! `GET /sse`: the session's stream as server-sent events. Each chunk is an event whose id
//! is its sequence number and whose name is its type; a reconnecting client sends
//! `Last-Event-ID` and gets what follows, with no gap and no repeat. The stream ends with an
//! `end` event (no id) saying why: the run settled, the server shuts down, or it was idle.
//! Between chunks, a streaming model's pieces arrive as `delta` events without an id: they
//! are live only (never stored, so never replayed), and the step's stored `text` chunk
//! carries the whole reply either way.

use std::future::Future;
use std::pin::Pin;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bytes::{BufMut, BytesMut};
use tokio::sync::watch;

use crate::access::SessionAccess;
use crate::body::Params;
use crate::error::ApiError;
use crate::sse_body::{write_end, write_event, Ends, EventBody};
use crate::state::AppState;
use crate::wire::{StreamQuery, Until};

/// Opens every stream: a browser that loses it reconnects after a second (its own default
/// is about three), with Last-Event-ID.
const RETRY: &[u8] = b"retry: 1000\n";

/// The opening of a stream that answers no request: the `retry` alone.
const RETRY_ALONE: &[u8] = b"retry: 1000\n\n";

pub(crate) async fn stream(
    State(state): State<AppState>,
    headers: HeaderMap,
    Params(query): Params<StreamQuery>,
    SessionAccess(id): SessionAccess,
) -> Result<Response, ApiError> {
    if *state.closing.borrow() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is shutting down; reconnect with Last-Event-ID",
        ));
    }
    // Refuses unknown sessions (follow would wait for one to appear). The runtime follows
    // the session where it runs.
    let session = state.runtime.session(&id).await?;
    let from = match last_event_id(&headers)? {
        Some(last) => last.saturating_add(1),
        None => query.from.unwrap_or(0),
    };
    let ends = match query.until {
        Until::Closed => Ends::Never,
        Until::Settled => match standing(&state.runtime, &id, session.status).await {
            // Settled, and no run starts without a request: what follows `from` up to now
            // is all there is to show.
            Standing::AtRest => Ends::Before(session.chunk_count),
            // The work it follows settles with a chunk it has not written yet.
            Standing::AtWork => Ends::AtSettle {
                backstop: true,
                after: session.chunk_count,
            },
            Standing::ResumesByItself => Ends::AtSettle {
                backstop: false,
                after: session.chunk_count,
            },
        },
    };
    if matches!(ends, Ends::Before(bound) if from >= bound) {
        return Ok(settled_at_once(opening(RETRY)));
    }
    Ok(events(&state, &id, from, ends, None))
}

/// How a session stands for a stream that follows it to its next settle.
enum Standing {
    /// Nothing happens to it until a client asks (a start, a resume): a stream that waited
    /// for its next settle could wait forever.
    AtRest,
    /// A run, or a resume waking its sub-agents (here or on other servers), is at work: the
    /// stream ends when it settles, whether or not a chunk of its own says so (a resume whose
    /// children still wait writes none).
    AtWork,
    /// Suspended, quiet, and the runtime resumes it by itself once its calls are answered or
    /// expire: the stream waits for that run's settle.
    ResumesByItself,
}

async fn standing(
    runtime: &dormant::Runtime,
    id: &dormant::SessionId,
    status: dormant::Status,
) -> Standing {
    use dormant::Status;
    match status {
        Status::Completed | Status::Failed | Status::Interrupted => Standing::AtRest,
        Status::Running => Standing::AtWork,
        Status::SuspendedClientTool | Status::SuspendedAwaitingChildren => {
            if !runtime.is_settled(id).await {
                Standing::AtWork
            } else if runtime.auto_resumes() {
                Standing::ResumesByItself
            } else {
                Standing::AtRest
            }
        }
    }
}

/// The stream of `id` from `from` as an SSE response, after `first` if given (the answer of
/// a request that started the run it streams: `POST /start?stream=true`,
/// `POST /submit-tool-result?resume=true&stream=true`).
pub(crate) fn events(
    state: &AppState,
    id: &dormant::SessionId,
    from: u64,
    ends: Ends,
    first: Option<BytesMut>,
) -> Response {
    tracing::debug!(session = %id, from, "server.stream_opened");
    let shutdown = shutdown(state.closing.clone());
    // `retry` rides on the request's answer where there is one, rather than on an event of
    // its own: one event less to frame and send.
    let first = first.unwrap_or_else(|| opening(RETRY_ALONE));
    let body = match ends {
        // Done once no work of the session is in progress, with the number of chunks it has
        // then (the stream ends after sending those); on another node, its stream says so.
        Ends::AtSettle { backstop: true, .. } => {
            let (chunks, settled) = state.runtime.follow_live_to_settle(id, from);
            let settled: Pin<Box<dyn Future<Output = Option<u64>> + Send>> = Box::pin(settled);
            EventBody::new(state, Box::pin(chunks), shutdown, ends, first, from)
                .ending_when_settled(Some(settled))
        }
        _ => {
            let chunks = Box::pin(state.runtime.follow_live(id, from));
            EventBody::new(state, chunks, shutdown, ends, first, from).ending_when_settled(None)
        }
    };
    crate::sse_body::response(body)
}

/// [`events`] to the settle of a run a request started, from `from`, on a follow the runtime
/// opened with the request (`POST /submit-tool-result?resume=true&stream=true`: one call to
/// the node that owns the session), after `first`, the request's answer.
pub(crate) fn followed(
    state: &AppState,
    id: &dormant::SessionId,
    from: u64,
    follow: dormant::FollowToSettle,
    first: BytesMut,
) -> Response {
    tracing::debug!(session = %id, from, "server.stream_opened");
    let shutdown = shutdown(state.closing.clone());
    let ends = Ends::AtSettle {
        backstop: true,
        after: from,
    };
    let body = EventBody::new(state, follow.events, shutdown, ends, first, from)
        .ending_when_settled(Some(follow.settled));
    crate::sse_body::response(body)
}

/// `Last-Event-ID`: the last sequence number the client saw.
fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| ApiError::invalid("Last-Event-ID must be a chunk's sequence number"))
}

/// Done once `closing` says the server shuts down.
fn shutdown(closing: watch::Receiver<bool>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(crate::shutdown::shutting_down(closing))
}

/// The event that opens a stream answering a request: the JSON the request would have
/// answered without `stream=true`, named `name`, without an id (it is no chunk), and the
/// stream's `retry`.
pub(crate) fn first_event(name: &str, answer: &impl serde::Serialize) -> BytesMut {
    let mut frame = opening(RETRY);
    write_event(&mut frame, None, name, answer);
    frame
}

/// A stream's first frame, starting with `retry`, with room for the events that go with it.
fn opening(retry: &[u8]) -> BytesMut {
    let mut frame = BytesMut::with_capacity(crate::sse_body::FRAME_START_BYTES);
    frame.put_slice(retry);
    frame
}

/// A stream of `first` and the `end` (`settled`): the answer of a request that started no run.
pub(crate) fn settled_at_once(mut first: BytesMut) -> Response {
    write_end(&mut first, "settled");
    crate::sse_body::response(first.freeze())
}
