//! Reads a server-sent event stream: any as its events (`events`: an A2A agent's
//! `SubscribeToTask`), and a dormant server's `GET /sse` as the chunks it carries (`chunks`):
//! each event with an id is a chunk (its JSON in `data`); `delta` events (no id) are live
//! pieces a parent does not copy; `end` closes the stream and `error` carries the server's
//! typed error.

use bytes::Bytes;
use dormant::remote::RemoteError;
use dormant::Chunk;
use futures::{Stream, StreamExt};

/// The most of one event read (a chunk or a task carries at most a result's bytes).
const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// How long a dormant server's stream may send nothing at all, not even the comment it sends
/// every `sse_keep_alive` (15 s by default), before it is taken for broken: a frozen remote
/// keeps its connection open, and its reader would wait for good.
const SILENCE: std::time::Duration = std::time::Duration::from_secs(120);

/// One event, as far as it is read.
#[derive(Debug, Default)]
pub(crate) struct Event {
    id: Option<String>,
    name: Option<String>,
    /// Its data lines, joined.
    pub(crate) data: String,
}

/// The events of an SSE body, until it ends.
pub(crate) fn events(
    endpoint: String,
    body: impl Stream<Item = Result<Bytes, reqwest::Error>> + Send + 'static,
) -> impl Stream<Item = Result<Event, RemoteError>> + Send + 'static {
    let state = Reader::new(endpoint, body);
    futures::stream::unfold(state, |mut reader| async move {
        let item = reader.next_event().await?;
        Some((item, reader))
    })
}

/// The chunks of an SSE body, until `end`.
pub(crate) fn chunks(
    endpoint: String,
    body: impl Stream<Item = Result<Bytes, reqwest::Error>> + Send + 'static,
) -> impl Stream<Item = Result<Chunk, RemoteError>> + Send + 'static {
    let mut state = Reader::new(endpoint, body);
    state.silence = Some(SILENCE);
    futures::stream::unfold(state, |mut reader| async move {
        let item = reader.next_chunk().await?;
        Some((item, reader))
    })
}

struct Reader {
    endpoint: String,
    body: std::pin::Pin<Box<dyn Stream<Item = Result<Bytes, reqwest::Error>> + Send>>,
    buffer: Vec<u8>,
    event: Event,
    done: bool,
    /// The longest the body may send nothing before it is taken for broken (none: as long
    /// as it takes, for a peer that sends no keep-alive).
    silence: Option<std::time::Duration>,
}

impl Reader {
    fn new(
        endpoint: String,
        body: impl Stream<Item = Result<Bytes, reqwest::Error>> + Send + 'static,
    ) -> Self {
        Self {
            endpoint,
            body: Box::pin(body),
            buffer: Vec::new(),
            event: Event::default(),
            done: false,
            silence: None,
        }
    }

    /// The next chunk: the next event that is one (or the end, or an error).
    async fn next_chunk(&mut self) -> Option<Result<Chunk, RemoteError>> {
        loop {
            match self.next_event().await? {
                Ok(event) => {
                    if let Some(item) = self.dispatch(event) {
                        return Some(item);
                    }
                }
                Err(error) => return Some(Err(error)),
            }
        }
    }

    /// The next complete event, `None` at the end of the body (or after `end`).
    async fn next_event(&mut self) -> Option<Result<Event, RemoteError>> {
        loop {
            if self.done {
                return None;
            }
            while let Some(end) = self.buffer.iter().position(|byte| *byte == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                let line = String::from_utf8_lossy(&line);
                let line = line.trim_end_matches(['\n', '\r']);
                if line.is_empty() {
                    let event = std::mem::take(&mut self.event);
                    if event.name.is_none() && event.id.is_none() && event.data.is_empty() {
                        continue;
                    }
                    return Some(Ok(event));
                }
                let (field, value) = line.split_once(':').unwrap_or((line, ""));
                let value = value.strip_prefix(' ').unwrap_or(value);
                match field {
                    "id" => self.event.id = Some(value.to_string()),
                    "event" => self.event.name = Some(value.to_string()),
                    "data" => {
                        if !self.event.data.is_empty() {
                            self.event.data.push('\n');
                        }
                        self.event.data.push_str(value);
                    }
                    _ => {}
                }
            }
            if self.buffer.len() + self.event.data.len() > MAX_EVENT_BYTES {
                self.done = true;
                return Some(Err(RemoteError::Protocol {
                    endpoint: self.endpoint.clone(),
                    reason: format!("an event over {MAX_EVENT_BYTES} bytes"),
                }));
            }
            let next = match self.silence {
                Some(silence) => match tokio::time::timeout(silence, self.body.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        self.done = true;
                        return Some(Err(RemoteError::Unreachable {
                            endpoint: self.endpoint.clone(),
                            reason: format!(
                                "the stream sent nothing for {} s, not even a keep-alive",
                                silence.as_secs()
                            ),
                        }));
                    }
                },
                None => self.body.next().await,
            };
            match next {
                Some(Ok(bytes)) => self.buffer.extend_from_slice(&bytes),
                Some(Err(error)) => {
                    self.done = true;
                    return Some(Err(RemoteError::Unreachable {
                        endpoint: self.endpoint.clone(),
                        reason: format!("the stream broke: {error}"),
                    }));
                }
                None => {
                    self.done = true;
                    return None;
                }
            }
        }
    }

    /// What one complete event means: a chunk, an error, the end, or nothing to pass on.
    fn dispatch(&mut self, event: Event) -> Option<Result<Chunk, RemoteError>> {
        match event.name.as_deref() {
            Some("end") => {
                self.done = true;
                None
            }
            Some("error") => {
                self.done = true;
                let body: serde_json::Value = serde_json::from_str(&event.data).unwrap_or_default();
                Some(Err(RemoteError::Refused {
                    endpoint: self.endpoint.clone(),
                    status: 200,
                    code: body["code"].as_str().unwrap_or("stream_error").to_string(),
                    message: body["message"].as_str().unwrap_or_default().to_string(),
                }))
            }
            _ if event.id.is_none() || event.data.is_empty() => None,
            _ => Some(serde_json::from_str::<Chunk>(&event.data).map_err(|error| {
                RemoteError::Protocol {
                    endpoint: self.endpoint.clone(),
                    reason: format!("a chunk that is not one: {error}"),
                }
            })),
        }
    }
}
