//! `GET /sse`: the session's stream as server-sent events. Each chunk is an event whose id
//! is its sequence number and whose name is its type; a reconnecting client sends
//! `Last-Event-ID` and gets what follows, with no gap and no repeat. The stream ends with an
//! `end` event (no id) saying why: the run settled, the server shuts down, or it was idle.
//! Between chunks, a streaming model's pieces arrive as `delta` events without an id: they
//! are live only (never stored, so never replayed), and the step's stored `text` chunk
//! carries the whole reply either way.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use dormant::{Chunk, ChunkKind, Delta, Error, StreamEvent};
use futures::{Stream, StreamExt};
use serde_json::json;
use tokio::sync::watch;

use crate::body::Params;
use crate::error::ApiError;
use crate::metrics::StreamGuard;
use crate::server::AppState;
use crate::wire::{StreamQuery, Until};

/// How long a client waits before it reconnects a lost stream (the `retry` field).
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

type Chunks = Pin<Box<dyn Stream<Item = Result<StreamEvent, Error>> + Send>>;

pub(crate) async fn stream(
    State(state): State<AppState>,
    headers: HeaderMap,
    Params(query): Params<StreamQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let id: dormant::SessionId = query
        .session_id
        .parse()
        .map_err(|error| ApiError::invalid(format!("session_id: {error}")))?;
    state
        .auth
        .session(&state.key, &headers, query.token.as_deref(), &id)
        .await?;
    if *state.closing.borrow() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is shutting down; reconnect with Last-Event-ID",
        ));
    }
    // Refuses unknown sessions (follow would wait for one to appear).
    state.runtime.status(&id).await?;
    // The live chunks are sent by the node that runs the session: follow it there.
    if let Some(owner) = state.runtime.owner_of(&id).await? {
        return Err(dormant::Error::SessionUnavailable {
            session: id,
            reason: format!("its tree is owned by node {}", owner.node),
        }
        .into());
    }
    let from = match last_event_id(&headers)? {
        Some(last) => last.saturating_add(1),
        None => query.from.unwrap_or(0),
    };
    Ok(events(&state, &id, from, query.until, None))
}

/// The stream of `id` from `from` as an SSE response, after `first` if given (the answer of
/// a request that started the run it streams: `POST /start?stream=true`,
/// `POST /submit-tool-result?resume=true&stream=true`).
pub(crate) fn events(
    state: &AppState,
    id: &dormant::SessionId,
    from: u64,
    until: Until,
    first: Option<Event>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    tracing::debug!(session = %id, from, "server.stream_opened");
    let follower = Follower {
        chunks: Box::pin(state.runtime.follow_live(id, from)),
        shutdown: shutdown(state.closing.clone()),
        until,
        idle: state.config.sse_idle_timeout,
        idle_timer: Box::pin(tokio::time::sleep(state.config.sse_idle_timeout)),
        last_chunk: tokio::time::Instant::now(),
        settled: false,
        done: false,
        _open: state.metrics.stream_opened(),
        state: state.clone(),
    };
    let events = futures::stream::unfold(follower, |mut follower| async move {
        let event = follower.next().await?;
        Some((Ok(event), follower))
    });
    // `retry` on the first event: a browser that loses the stream reconnects after a second
    // (its own default is about three), with Last-Event-ID. It rides on the request's answer
    // where there is one, rather than on an event of its own: one event less to frame and send.
    let first = first.unwrap_or_default().retry(RECONNECT_AFTER);
    let first = futures::stream::iter(std::iter::once(Ok(first)));
    Sse::new(first.chain(events)).keep_alive(KeepAlive::new().interval(state.config.sse_keep_alive))
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

/// Done once `closing` says the server shuts down (or its sender is gone).
fn shutdown(mut closing: watch::Receiver<bool>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        let _ = closing.wait_for(|closing| *closing).await;
    })
}

struct Follower {
    chunks: Chunks,
    /// Done once the server shuts down. Made once per stream: a wait on the shared channel
    /// made anew for each event would take its lock twice an event, across every stream.
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    until: Until,
    idle: Duration,
    /// One timer for the stream's life. A chunk does not push it back (that would take the
    /// timer wheel's lock for every event): when it fires, it is set again for `idle` after
    /// the last chunk, if that is still to come.
    idle_timer: Pin<Box<tokio::time::Sleep>>,
    last_chunk: tokio::time::Instant,
    /// The run settled: the next event is the `end`.
    settled: bool,
    done: bool,
    _open: StreamGuard,
    state: AppState,
}

impl Follower {
    async fn next(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        if self.settled {
            return Some(self.end("settled"));
        }
        let next = loop {
            let next = tokio::select! {
                // In this order: a chunk that is ready goes out before an end that is too.
                biased;
                chunk = self.chunks.next() => Ok(chunk),
                () = self.shutdown.as_mut() => Err("shutdown"),
                () = self.idle_timer.as_mut() => Err("idle"),
            };
            match next {
                Ok(next) => break next,
                Err("idle") if self.rearmed_for_a_recent_chunk() => {}
                Err(reason) => return Some(self.end(reason)),
            }
        };
        match next {
            None | Some(Err(Error::ShutDown)) => Some(self.end("shutdown")),
            Some(Err(error)) => {
                self.done = true;
                let error = ApiError::from(error);
                Some(
                    Event::default().event("error").data(
                        json!({ "code": error.code(), "message": error.message() }).to_string(),
                    ),
                )
            }
            Some(Ok(StreamEvent::Delta(delta))) => Some(delta_event(&delta)),
            Some(Ok(StreamEvent::Chunk(chunk))) => {
                self.last_chunk = tokio::time::Instant::now();
                let now = self.state.runtime.now_ms();
                self.state
                    .metrics
                    .sse_lag(Duration::from_millis(now.saturating_sub(chunk.at_ms)));
                if self.until == Until::Settled && settles(&chunk.kind) {
                    // The chunk goes out now; the `end` event follows on the next poll.
                    self.settled = true;
                }
                Some(event(&chunk))
            }
        }
    }

    /// When the idle timer fires: if a chunk came less than `idle` ago, sets it again for
    /// `idle` after that chunk and says so; the stream was idle for all of `idle` otherwise.
    fn rearmed_for_a_recent_chunk(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        match idle_again_at(self.last_chunk, self.idle, now) {
            Some(due) => {
                self.idle_timer.as_mut().reset(due);
                true
            }
            None => false,
        }
    }

    fn end(&mut self, reason: &str) -> Event {
        self.done = true;
        Event::default()
            .event("end")
            .data(json!({ "reason": reason }).to_string())
    }
}

/// When an idle timer that fired at `now` must fire again: `idle` after the last chunk, if
/// that is still to come.
fn idle_again_at(
    last_chunk: tokio::time::Instant,
    idle: Duration,
    now: tokio::time::Instant,
) -> Option<tokio::time::Instant> {
    let due = last_chunk + idle;
    (due > now).then_some(due)
}

/// Whether the root's run stops here: it ended, suspended or was interrupted (a forwarded
/// child's chunk never does).
fn settles(kind: &ChunkKind) -> bool {
    !kind.is_forwarded()
        && matches!(
            kind,
            ChunkKind::RunEnd { .. }
                | ChunkKind::RunSuspended { .. }
                | ChunkKind::RunInterrupted { .. }
        )
}

fn event(chunk: &Chunk) -> Event {
    let named = || {
        Event::default()
            .id(chunk.seq.to_string())
            .event(chunk.kind.type_name())
    };
    // Serialized straight into the event, with no string between.
    named()
        .json_data(chunk)
        .unwrap_or_else(|error| named().data(serialize_error(&error)))
}

fn delta_event(delta: &Delta) -> Event {
    let named = || Event::default().event("delta");
    named()
        .json_data(delta)
        .unwrap_or_else(|error| named().data(serialize_error(&error)))
}

/// What dormant streams always serializes; should it ever fail, the client is told so.
fn serialize_error(error: &axum::Error) -> String {
    json!({ "error": error.to_string() }).to_string()
}

/// The event that opens a stream answering a request: the JSON the request would have
/// answered without `stream=true`, named `name`, without an id (it is no chunk).
pub(crate) fn first_event(name: &str, answer: &impl serde::Serialize) -> Result<Event, ApiError> {
    let data = serde_json::to_string(answer).map_err(|error| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            error.to_string(),
        )
    })?;
    Ok(Event::default().event(name).data(data))
}

/// A stream of `first` and the `end` (`settled`): the answer of a request that started no run.
pub(crate) fn settled_at_once(first: Event) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let end = Event::default()
        .event("end")
        .data(json!({ "reason": "settled" }).to_string());
    Sse::new(futures::stream::iter([Ok(first), Ok(end)]))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::idle_again_at;

    #[test]
    fn the_idle_timer_waits_for_idle_after_the_last_chunk() {
        let idle = Duration::from_secs(60);
        let opened = Instant::now();
        // Fired a minute after the stream opened, with a chunk 10 s before: 50 s more.
        let chunk = opened + Duration::from_secs(50);
        let fired = opened + idle;
        assert_eq!(idle_again_at(chunk, idle, fired), Some(chunk + idle));
        // No chunk since the stream opened (or none for a whole minute): idle now.
        assert_eq!(idle_again_at(opened, idle, fired), None);
        assert_eq!(idle_again_at(chunk, idle, chunk + idle), None);
    }
}
