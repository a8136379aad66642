//! One model call: attempts, retried while nothing of the reply has reached anyone.

use std::time::{Duration, SystemTime};

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::{Response, StatusCode};

use super::config::Config;
use super::error::{self, describe};
use super::stream::{Assembler, Progress};
use super::{request, response, retry, sse::SseParser};
use crate::llm::{DeltaSink, LlmError, ModelReply, ModelRequest};

/// The most of an error body read; the rest is not worth waiting for.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The most bytes one reply may take on the wire (JSON or the whole stream): far above any
/// model's output limit, and a bound on what a broken or hostile server can make the process
/// hold.
const MAX_REPLY_BYTES: usize = 32 * 1024 * 1024;

/// Why an attempt failed.
enum Failure {
    /// Another attempt may succeed: nothing of this one reached a follower.
    Transient {
        error: LlmError,
        status: Option<StatusCode>,
        retry_after: Option<Duration>,
    },
    /// Final: the provider refused the request itself, or part of the reply was sent.
    Final(LlmError),
}

impl Failure {
    fn transient(error: LlmError) -> Self {
        Failure::Transient {
            error,
            status: None,
            retry_after: None,
        }
    }
}

/// Answers `request`, retrying transient failures with backoff. Dropping the future drops
/// the HTTP request in flight (its connection closes), which is how a run cancels a call.
pub(crate) async fn complete(
    config: &Config,
    request: ModelRequest,
) -> Result<ModelReply, LlmError> {
    let body = request::body(&request, config.model.as_deref(), config.stream)?;
    let body = serde_json::to_vec(&body)
        .map_err(|error| LlmError::Provider(format!("request body: {error}")))?;
    let mut retry = 0;
    loop {
        match attempt(config, body.clone(), &request.deltas).await {
            Ok(reply) => return Ok(reply),
            Err(Failure::Transient {
                error,
                status,
                retry_after,
            }) if retry < config.max_retries => {
                let Some(wait) = config.backoff.delay(retry, retry_after) else {
                    // The provider asks for a longer wait than the backoff allows: retrying
                    // sooner would be refused again and use up the retries.
                    let asked = retry_after.map_or(0, |wait| wait.as_secs());
                    let note = format!(
                        " (Retry-After asks for {asked} s, more than the backoff's longest wait)"
                    );
                    return Err(after(noted(error, &note), retry + 1));
                };
                retry += 1;
                tracing::warn!(
                    session = %request.session_id,
                    status = status.map(|status| status.as_u16()),
                    attempt = retry,
                    wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                    error = %crate::types::Untrusted(&error),
                    "openai.retry"
                );
                tokio::time::sleep(wait).await;
            }
            Err(Failure::Transient { error, .. }) => return Err(after(error, retry + 1)),
            Err(Failure::Final(error)) => return Err(error),
        }
    }
}

/// `error` saying how many attempts were made, when there were several.
fn after(error: LlmError, attempts: u32) -> LlmError {
    if attempts < 2 {
        return error;
    }
    noted(error, &format!(" (after {attempts} attempts)"))
}

/// `error` with `note` after its message (the retried kinds: rate limits and provider
/// failures).
fn noted(error: LlmError, note: &str) -> LlmError {
    match error {
        LlmError::RateLimited(message) => LlmError::RateLimited(message + note),
        LlmError::Provider(message) => LlmError::Provider(message + note),
        other => other,
    }
}

async fn attempt(
    config: &Config,
    body: Vec<u8>,
    deltas: &DeltaSink,
) -> Result<ModelReply, Failure> {
    let mut post = config
        .client
        .post(&config.endpoint)
        .headers(config.headers.clone())
        .body(body);
    if config.stream {
        post = post.header(ACCEPT, "text/event-stream");
    }
    let response = post.send().await.map_err(|error| {
        Failure::transient(LlmError::Provider(format!(
            "request failed: {}",
            describe(error)
        )))
    })?;
    let status = response.status();
    if !status.is_success() {
        // Read at the edge: the parsing itself takes `now` so that it is testable.
        let retry_after = retry::retry_after(response.headers(), SystemTime::now());
        let error = error::from_status(status, &error_body(response).await);
        return Err(if retry::is_retryable(status) {
            Failure::Transient {
                error,
                status: Some(status),
                retry_after,
            }
        } else {
            Failure::Final(error)
        });
    }
    if config.stream && !is_json(&response) {
        read_stream(response, deltas).await
    } else {
        // A server that ignores `stream: true` answers with one JSON body; read it as such.
        let mut body = Vec::new();
        read_up_to(response, MAX_REPLY_BYTES, &mut body)
            .await
            .map_err(|error| {
                Failure::transient(LlmError::Provider(format!(
                    "reading the response: {}",
                    describe(error)
                )))
            })?;
        if body.len() > MAX_REPLY_BYTES {
            return Err(Failure::Final(too_large()));
        }
        response::parse(&body).map_err(Failure::Final)
    }
}

fn is_json(response: &Response) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.contains("json"))
}

/// Reads the event stream to `[DONE]` (or its end after a finish reason), sending each
/// piece to `deltas` as it comes.
async fn read_stream(mut response: Response, deltas: &DeltaSink) -> Result<ModelReply, Failure> {
    let mut parser = SseParser::new();
    let mut assembler = Assembler::new();
    let mut events = Vec::new();
    let mut received = 0usize;
    let malformed = |error: super::sse::SseError| {
        Failure::Final(LlmError::Provider(format!("malformed chunk: {error}")))
    };
    loop {
        let bytes = match response.chunk().await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => break,
            Err(error) => {
                let error = LlmError::Provider(format!("stream ended early: {}", describe(error)));
                return Err(cut(error, assembler.started()));
            }
        };
        received = received.saturating_add(bytes.len());
        if received > MAX_REPLY_BYTES {
            return Err(Failure::Final(too_large()));
        }
        parser.push(&bytes, &mut events).map_err(malformed)?;
        for data in events.drain(..) {
            match assembler.apply(&data, deltas) {
                Ok(Progress::Done) => return Ok(assembler.reply()),
                Ok(Progress::Reading) => {}
                Err(error) => return Err(stream_error(error, &assembler)),
            }
        }
    }
    if let Some(data) = parser.finish().map_err(malformed)? {
        match assembler.apply(&data, deltas) {
            Ok(Progress::Done) => return Ok(assembler.reply()),
            Ok(Progress::Reading) => {}
            Err(error) => return Err(stream_error(error, &assembler)),
        }
    }
    let started = assembler.started();
    assembler.end().map_err(|error| cut(error, started))
}

/// An error the stream itself reported: an error event before any piece of the reply
/// (OpenRouter passes an upstream 429 or 502 on this way) is retried like the same status;
/// a malformed chunk, or anything after the first piece, is final.
fn stream_error(error: LlmError, assembler: &Assembler) -> Failure {
    let retryable = match &error {
        LlmError::RateLimited(_) => true,
        LlmError::Provider(message) => !message.starts_with("malformed chunk"),
        _ => false,
    };
    if retryable {
        cut(error, assembler.started())
    } else {
        Failure::Final(error)
    }
}

fn too_large() -> LlmError {
    LlmError::Provider(format!(
        "the reply is larger than {} MiB; it was not read further",
        MAX_REPLY_BYTES / (1024 * 1024)
    ))
}

/// A stream that failed: retried only if no piece of the reply went out yet (`started`).
fn cut(error: LlmError, started: bool) -> Failure {
    if started {
        Failure::Final(error)
    } else {
        Failure::transient(error)
    }
}

/// Reads the body into `body` until it ends or has grown past `limit` (the caller tells which
/// by its length); on a transport error, `body` keeps what arrived before it.
async fn read_up_to(
    mut response: Response,
    limit: usize,
    body: &mut Vec<u8>,
) -> Result<(), reqwest::Error> {
    while body.len() <= limit {
        match response.chunk().await? {
            Some(bytes) => body.extend_from_slice(&bytes),
            None => break,
        }
    }
    Ok(())
}

/// The start of an error response's body (lossy UTF-8; what arrived before a transport
/// error, if one cut it).
async fn error_body(response: Response) -> String {
    let mut body = Vec::new();
    let _ = read_up_to(response, MAX_ERROR_BODY, &mut body).await;
    body.truncate(MAX_ERROR_BODY);
    String::from_utf8_lossy(&body).into_owned()
}
