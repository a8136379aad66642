//! A mock OpenAI-compatible server on loopback: it replays recorded replies in order (the
//! last one repeats) and records each request it got.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::mpsc;

/// One recorded reply.
#[derive(Clone, Debug)]
pub(crate) enum Reply {
    /// A whole JSON body with a status and extra headers.
    Json {
        status: u16,
        body: &'static str,
        headers: Vec<(&'static str, &'static str)>,
    },
    /// An SSE transcript, each event sent as its own body frame.
    Sse(&'static str),
    /// The events of an SSE transcript, then a broken connection once [`Mock::cut`] is
    /// called (so that the client has read the events first).
    SseThenCut(&'static str),
    /// The events of an SSE transcript, then nothing: the stream stays open until the client
    /// goes away, which the mock reports on its `dropped` channel.
    SseThenHold(&'static str),
    /// No answer at all, not even a status line.
    Hang,
}

impl Reply {
    /// A JSON body with `status`.
    pub(crate) fn json(status: u16, body: &'static str) -> Self {
        Reply::Json {
            status,
            body,
            headers: Vec::new(),
        }
    }

    /// The same reply with a header.
    pub(crate) fn header(mut self, name: &'static str, value: &'static str) -> Self {
        if let Reply::Json { headers, .. } = &mut self {
            headers.push((name, value));
        }
        self
    }
}

/// A request the mock got.
#[derive(Clone, Debug)]
pub(crate) struct Recorded {
    pub(crate) authorization: Option<String>,
    pub(crate) accept: Option<String>,
    pub(crate) body: Value,
}

struct State {
    replies: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<Recorded>>,
    dropped: mpsc::UnboundedSender<()>,
    cut: tokio::sync::Notify,
}

/// The running mock; it stops when dropped.
pub(crate) struct Mock {
    pub(crate) base_url: String,
    state: Arc<State>,
    dropped: tokio::sync::Mutex<mpsc::UnboundedReceiver<()>>,
    server: tokio::task::JoinHandle<()>,
}

impl Mock {
    /// Serves `replies` in order on 127.0.0.1 (an ephemeral port); the last one repeats.
    pub(crate) async fn start(replies: Vec<Reply>) -> anyhow::Result<Self> {
        let (dropped, dropped_rx) = mpsc::unbounded_channel();
        let state = Arc::new(State {
            replies: Mutex::new(replies.into()),
            requests: Mutex::default(),
            dropped,
            cut: tokio::sync::Notify::new(),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base_url = format!("http://{}/v1", listener.local_addr()?);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            base_url,
            state,
            dropped: tokio::sync::Mutex::new(dropped_rx),
            server,
        })
    }

    /// The requests so far, in order.
    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().clone()
    }

    /// The request bodies so far, in order.
    pub(crate) fn bodies(&self) -> Vec<Value> {
        self.requests().into_iter().map(|r| r.body).collect()
    }

    /// Breaks the connection of a [`Reply::SseThenCut`] stream (now, or once it has sent its
    /// events).
    pub(crate) fn cut(&self) {
        self.state.cut.notify_one();
    }

    /// Waits until a held stream's client went away.
    pub(crate) async fn connection_dropped(&self) -> anyhow::Result<()> {
        self.dropped
            .lock()
            .await
            .recv()
            .await
            .ok_or_else(|| anyhow::anyhow!("the mock stopped"))
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn complete(
    axum::extract::State(state): axum::extract::State<Arc<State>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_string)
    };
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    state.requests.lock().push(Recorded {
        authorization: header("authorization"),
        accept: header("accept"),
        body,
    });
    let reply = {
        let mut replies = state.replies.lock();
        if replies.len() > 1 {
            replies.pop_front()
        } else {
            replies.front().cloned()
        }
    };
    match reply {
        None => respond(500, "application/json", Body::from("{}"), &[]),
        Some(Reply::Json {
            status,
            body,
            headers,
        }) => respond(status, "application/json", Body::from(body), &headers),
        Some(Reply::Sse(transcript)) => {
            let frames = frames(transcript).map(Ok::<_, Infallible>);
            sse(Body::from_stream(futures::stream::iter(frames)))
        }
        Some(Reply::SseThenCut(transcript)) => {
            let frames = futures::stream::iter(frames(transcript).map(Ok));
            let cut = futures::stream::once(async move {
                state.cut.notified().await;
                Err(std::io::Error::other("connection cut"))
            });
            sse(Body::from_stream(futures::StreamExt::chain(frames, cut)))
        }
        Some(Reply::Hang) => std::future::pending().await,
        Some(Reply::SseThenHold(transcript)) => {
            let guard = DropGuard(state.dropped.clone());
            let held = futures::stream::pending::<Result<Bytes, Infallible>>();
            let frames = futures::stream::iter(frames(transcript).map(Ok));
            let stream =
                futures::StreamExt::map(futures::StreamExt::chain(frames, held), move |frame| {
                    let _keep = &guard;
                    frame
                });
            sse(Body::from_stream(stream))
        }
    }
}

/// Reports, when the held stream is dropped, that its client went away.
struct DropGuard(mpsc::UnboundedSender<()>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// A transcript's events, each with the blank line that ends it.
fn frames(transcript: &'static str) -> impl Iterator<Item = Bytes> {
    transcript
        .split_inclusive("\n\n")
        .filter(|frame| !frame.trim().is_empty())
        .map(|frame| Bytes::from_static(frame.as_bytes()))
}

fn sse(body: Body) -> Response {
    respond(200, "text/event-stream", body, &[])
}

fn respond(
    status: u16,
    content_type: &str,
    body: Body,
    headers: &[(&'static str, &'static str)],
) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let map = response.headers_mut();
    if let Ok(value) = content_type.parse() {
        map.insert("content-type", value);
    }
    for (name, value) in headers {
        if let Ok(value) = value.parse() {
            map.insert(*name, value);
        }
    }
    response
}
