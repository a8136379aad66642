//! The body of an SSE answer: a session's stream written as events, straight into the
//! frames hyper sends.
//!
//! Every event that is ready when hyper asks for the next frame goes into that one frame: a
//! chunk that settles the run and the `end` after it, or the chunks one commit published
//! together, are one piece of the chunked answer and one write, not one each. Nothing waits
//! for more to come (only what is ready is taken), so batching adds no latency. Keep-alive
//! comments and the idle end share one timer per stream, set again only when it fires: a
//! timer pushed back at each event takes the timer wheel's lock each time.

use std::convert::Infallible;
use std::future::Future;
use std::io::Write as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, BytesMut};
use dormant::{Error, StreamEvent};
use futures::Stream;
use http_body::Frame;
use serde::Serialize;
use tokio::time::{Instant, Sleep};

use crate::error::ApiError;
use crate::metrics::StreamGuard;
use crate::state::AppState;

/// The most bytes of events one frame takes: a follower catching up on many stored chunks
/// sends them in pieces of about this size.
const FRAME_BYTES: usize = 32 * 1024;

/// Room made for a frame up front: a few events, the size of a run's usual batch, without
/// growing the buffer event by event.
pub(crate) const FRAME_START_BYTES: usize = 2 * 1024;

/// What a keep-alive sends: an SSE comment, which clients skip.
const KEEP_ALIVE: &[u8] = b":\n\n";

pub(crate) type Chunks = Pin<Box<dyn Stream<Item = Result<StreamEvent, Error>> + Send>>;
type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;
type Settled = Pin<Box<dyn Future<Output = Option<u64>> + Send>>;

/// When a stream ends of itself, besides the server's shutdown and the idle end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ends {
    /// With the `end` after the chunk that settles the run (it ends, suspends or is
    /// interrupted): the stream of a run in progress. With `backstop`, also once the
    /// session has settled and every chunk it had then was sent: a resume that woke
    /// sub-agents which still wait writes no chunk of the root's own that settles.
    ///
    /// Only a chunk numbered `after` or later settles it: one before is an earlier run's, in
    /// a stream replayed from before the run it follows began.
    AtSettle { backstop: bool, after: u64 },
    /// After the last chunk before `seq`: the stream of a session at rest when the stream
    /// opened (settled, and no run starts without a request), whose chunks from `seq` on
    /// belong to a run started since. It shows everything the client has not seen yet (every
    /// run of it, when replayed from an earlier one) and ends; waiting for a settle would wait
    /// for a run nobody may start.
    Before(u64),
    /// Never: the stream stays open for the next turn (`until=closed`).
    Never,
}

/// A session's stream as the body of an SSE answer, until it [`Ends`], the server shuts
/// down, or no chunk came for the idle timeout.
pub(crate) struct EventBody {
    /// Sent before anything else: the answer of the request that opened the stream.
    first: Option<BytesMut>,
    chunks: Chunks,
    /// Done once the server shuts down. Made once per stream: a wait on the shared channel
    /// made anew for each event would take its lock twice an event, across every stream.
    shutdown: Shutdown,
    ends: Ends,
    /// For [`Ends::AtSettle`] with a backstop: done once the session settled, with its chunk
    /// count then.
    settled: Option<Settled>,
    /// The sequence number of the next chunk to send.
    next_seq: u64,
    timer: Pin<Box<Sleep>>,
    times: Times,
    done: bool,
    state: AppState,
    _open: StreamGuard,
}

/// When a stream last sent something and last sent a chunk, and how long each may wait.
#[derive(Debug, Clone, Copy)]
struct Times {
    keep_alive: Duration,
    idle: Duration,
    last_sent: Instant,
    last_chunk: Instant,
}

/// What the stream's timer says when it fires at some moment.
#[derive(Debug, PartialEq, Eq)]
enum Due {
    /// No chunk for the whole idle timeout: the stream ends.
    Idle,
    /// Nothing sent for the keep-alive interval: a comment goes out.
    KeepAlive,
    /// Neither yet: fire again then.
    Later(Instant),
}

impl Times {
    fn due(&self, now: Instant) -> Due {
        let idle_at = self.last_chunk + self.idle;
        let keep_alive_at = self.last_sent + self.keep_alive;
        if now >= idle_at {
            Due::Idle
        } else if now >= keep_alive_at {
            Due::KeepAlive
        } else {
            Due::Later(idle_at.min(keep_alive_at))
        }
    }
}

impl EventBody {
    pub(crate) fn new(
        state: &AppState,
        chunks: Chunks,
        shutdown: Shutdown,
        ends: Ends,
        first: BytesMut,
        from: u64,
    ) -> Self {
        let now = Instant::now();
        let times = Times {
            keep_alive: state.config.sse_keep_alive,
            idle: state.config.sse_idle_timeout,
            last_sent: now,
            last_chunk: now,
        };
        let first_due = now + times.keep_alive.min(times.idle);
        Self {
            first: Some(first),
            chunks,
            shutdown,
            ends,
            settled: None,
            next_seq: from,
            timer: Box::pin(tokio::time::sleep_until(first_due)),
            times,
            done: false,
            _open: state.metrics.stream_opened(),
            state: state.clone(),
        }
    }

    /// Ends the stream also once `settled` is done (see [`Ends::AtSettle`]).
    pub(crate) fn ending_when_settled(mut self, settled: Option<Settled>) -> Self {
        self.settled = settled;
        self
    }

    /// Once the session settled with `bound` chunks: the stream ends after the last of them
    /// (at once if it was sent already).
    fn settled_at(&mut self, bound: Option<u64>, frame: &mut BytesMut) {
        self.settled = None;
        let Some(bound) = bound else {
            // The record could not be read: the run's own settle or the idle end ends it.
            return;
        };
        self.ends = Ends::Before(bound);
        if self.next_seq >= bound {
            self.end("settled", frame);
        }
    }

    /// Writes what the follower gave into `frame`.
    fn write_next(&mut self, next: Option<Result<StreamEvent, Error>>, frame: &mut BytesMut) {
        match next {
            None | Some(Err(Error::ShutDown)) => self.end("shutdown", frame),
            Some(Err(error)) => {
                self.done = true;
                let error = ApiError::from(error);
                let data = ErrorData {
                    code: error.code(),
                    message: error.message(),
                };
                write_event(frame, None, "error", &data);
            }
            // Live pieces of a run started after the stream's own had settled.
            Some(Ok(StreamEvent::Delta(_))) if matches!(self.ends, Ends::Before(_)) => {
                self.end("settled", frame);
            }
            Some(Ok(StreamEvent::Delta(delta))) => write_event(frame, None, "delta", &delta),
            Some(Ok(StreamEvent::Chunk(chunk))) => {
                if matches!(self.ends, Ends::Before(bound) if chunk.seq >= bound) {
                    return self.end("settled", frame);
                }
                self.times.last_chunk = Instant::now();
                self.next_seq = chunk.seq + 1;
                let now_ms = self.state.runtime.now_ms();
                self.state
                    .metrics
                    .sse_lag(Duration::from_millis(now_ms.saturating_sub(chunk.at_ms)));
                write_event(frame, Some(chunk.seq), chunk.kind.type_name(), &chunk);
                let settled = match self.ends {
                    Ends::AtSettle { after, .. } => chunk.seq >= after && chunk.kind.settles_run(),
                    Ends::Before(bound) => chunk.seq + 1 >= bound,
                    Ends::Never => false,
                };
                if settled {
                    self.end("settled", frame);
                }
            }
        }
    }

    fn end(&mut self, reason: &'static str, frame: &mut BytesMut) {
        self.done = true;
        write_end(frame, reason);
    }

    /// Polls the timer until it waits: ends an idle stream, or writes a keep-alive.
    fn poll_timer(&mut self, cx: &mut Context<'_>, frame: &mut BytesMut) {
        while self.timer.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            match self.times.due(now) {
                Due::Idle => return self.end("idle", frame),
                Due::KeepAlive => {
                    frame.put_slice(KEEP_ALIVE);
                    self.times.last_sent = now;
                }
                Due::Later(at) => self.timer.as_mut().reset(at),
            }
        }
    }
}

impl HttpBody for EventBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let mut frame = match this.first.take() {
            // The opening already has its buffer (with room to spare): the events go after it.
            Some(first) => first,
            None => BytesMut::with_capacity(FRAME_START_BYTES),
        };
        // In this order: chunks that are ready go out before an end that is ready too.
        let mut waiting = false;
        while !this.done && frame.len() < FRAME_BYTES {
            match this.chunks.as_mut().poll_next(cx) {
                Poll::Ready(next) => this.write_next(next, &mut frame),
                Poll::Pending => {
                    waiting = true;
                    break;
                }
            }
        }
        if waiting && this.shutdown.as_mut().poll(cx).is_ready() {
            this.end("shutdown", &mut frame);
        }
        // Only once every chunk that is ready went out: the bound may be past them.
        if waiting && !this.done {
            if let Some(bound) =
                this.settled
                    .as_mut()
                    .and_then(|settled| match settled.as_mut().poll(cx) {
                        Poll::Ready(bound) => Some(bound),
                        Poll::Pending => None,
                    })
            {
                this.settled_at(bound, &mut frame);
            }
        }
        if !frame.is_empty() {
            this.times.last_sent = Instant::now();
        }
        if !this.done {
            this.poll_timer(cx, &mut frame);
        }
        if frame.is_empty() {
            return Poll::Pending;
        }
        Poll::Ready(Some(Ok(Frame::data(frame.freeze()))))
    }
}

#[derive(Serialize)]
struct EndData {
    reason: &'static str,
}

#[derive(Serialize)]
struct ErrorData<'a> {
    code: &'a str,
    message: &'a str,
}

/// Appends one event: `id` (a chunk's sequence number; none for events that are no chunk),
/// its name and its data as one line of JSON (compact JSON has no raw line break: those in
/// strings are escaped).
pub(crate) fn write_event(
    frame: &mut BytesMut,
    id: Option<u64>,
    name: &str,
    data: &impl Serialize,
) {
    // Writes into a BytesMut cannot fail.
    if let Some(id) = id {
        let _ = writeln!((&mut *frame).writer(), "id: {id}");
    }
    frame.put_slice(b"event: ");
    frame.put_slice(name.as_bytes());
    frame.put_slice(b"\ndata: ");
    let mark = frame.len();
    if let Err(error) = serde_json::to_writer((&mut *frame).writer(), data) {
        // What dormant streams always serializes; should it ever fail, the client is told.
        frame.truncate(mark);
        let _ = serde_json::to_writer(
            (&mut *frame).writer(),
            &ErrorData {
                code: "internal",
                message: &error.to_string(),
            },
        );
    }
    frame.put_slice(b"\n\n");
}

/// Appends the `end` event, which says why the stream ends.
pub(crate) fn write_end(frame: &mut BytesMut, reason: &'static str) {
    write_event(frame, None, "end", &EndData { reason });
}

/// An SSE answer with `body`.
pub(crate) fn response(body: impl Into<Body>) -> Response {
    (
        [
            (CONTENT_TYPE, "text/event-stream"),
            (CACHE_CONTROL, "no-cache"),
        ],
        body.into(),
    )
        .into_response()
}

impl From<EventBody> for Body {
    fn from(body: EventBody) -> Self {
        Body::new(body)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::BytesMut;
    use tokio::time::Instant;

    use super::{write_event, Due, Times};

    #[test]
    fn the_timer_keeps_alive_then_ends_an_idle_stream() {
        let opened = Instant::now();
        let second = Duration::from_secs(1);
        let times = Times {
            keep_alive: 15 * second,
            idle: 60 * second,
            last_sent: opened + 10 * second,
            last_chunk: opened + 10 * second,
        };
        // Nothing due before the keep-alive interval after the last thing sent.
        assert_eq!(
            times.due(opened + 20 * second),
            Due::Later(opened + 25 * second)
        );
        assert_eq!(times.due(opened + 25 * second), Due::KeepAlive);
        // Keep-alives do not count as chunks: the idle end comes a minute after the last.
        let kept_alive = Times {
            last_sent: opened + 55 * second,
            ..times
        };
        assert_eq!(
            kept_alive.due(opened + 65 * second),
            Due::Later(opened + 70 * second)
        );
        assert_eq!(kept_alive.due(opened + 70 * second), Due::Idle);
    }

    #[test]
    fn an_event_is_its_id_name_and_one_line_of_data() {
        let mut frame = BytesMut::new();
        write_event(&mut frame, Some(7), "text", &"two\nlines");
        write_event(
            &mut frame,
            None,
            "end",
            &serde_json::json!({ "reason": "settled" }),
        );
        assert_eq!(
            &frame[..],
            b"id: 7\nevent: text\ndata: \"two\\nlines\"\n\nevent: end\ndata: {\"reason\":\"settled\"}\n\n"
        );
    }
}
