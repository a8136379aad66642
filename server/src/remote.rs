//! [`HttpRemoteAgents`]: the transport a runtime uses to reach remote sub-agents hosted by
//! other dormant servers, over their HTTP routes. The parent acts as an operator of the
//! remote (its credential goes to the remote's authenticate hook): it chooses its children's
//! ids, so it needs no per-session token, and a start replayed after a crash finds the child
//! it started (`new_only`) rather than giving it a second turn.

mod a2a;
mod sse;

pub use a2a::DEFAULT_A2A_INPUT_TIMEOUT;

use std::sync::Arc;
use std::time::Duration;

use dormant::remote::{
    a2a_url, RemoteAgents, RemoteCall, RemoteChunks, RemoteError, RemoteParent, RemoteStart,
    RemoteStatus,
};
use dormant::types::RunError;
use dormant::{RunId, SessionId, Status};
use dormant::{Submit, SubmitOutcome};
use futures::StreamExt;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::client::HttpClient;

/// Reaches dormant servers over HTTP, with an operator credential sent as `x-api-key`
/// (what `dormant-server --api-key-env` checks; a daemon's own authenticate hook reads the
/// same header), and any A2A 1.0 agent over its JSON-RPC binding for an endpoint written
/// `a2a+http://…` ([`ToolDefinition::a2a_agent`](dormant::ToolDefinition::a2a_agent); the
/// same credential goes to it as `x-api-key`).
///
/// ```no_run
/// use std::sync::Arc;
/// use dormant::{AgentDefinition, Runtime, ToolDefinition};
/// use dormant_server::HttpRemoteAgents;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let parent = AgentDefinition::builder("planner")
///     .tool(ToolDefinition::remote_sub_agent("research", "http://10.0.0.7:8080", "researcher"))
///     .build()?;
/// let runtime = Runtime::builder()
///     .agent(parent)
///     .remote_agents(Arc::new(HttpRemoteAgents::new(Some("operator-secret".into()))))
///     .build()?;
/// # let _ = runtime; Ok(()) }
/// ```
#[derive(Clone)]
pub struct HttpRemoteAgents {
    client: HttpClient,
    credential: Option<String>,
    a2a: Arc<a2a::A2aClient>,
}

impl std::fmt::Debug for HttpRemoteAgents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpRemoteAgents")
            .field("credential", &self.credential.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl HttpRemoteAgents {
    /// A transport that sends `credential` (if any) to every remote. Connecting times out
    /// after 5 s, and a request other than a stream after 60 s (an interrupt waits for the
    /// remote's tree to stop).
    pub fn new(credential: Option<String>) -> Self {
        Self::with_client(HttpClient::new(), credential)
    }

    /// A transport on `client`, shared with the process's other outgoing calls (its
    /// connections and TLS configuration); `credential` as in [`HttpRemoteAgents::new`].
    pub fn with_client(client: HttpClient, credential: Option<String>) -> Self {
        let a2a = Arc::new(a2a::A2aClient::new(client.clone(), credential.clone()));
        Self {
            client,
            credential,
            a2a,
        }
    }

    /// How long an A2A agent's own request for input (a task in `INPUT_REQUIRED` whose status
    /// message is not a dormant server's list of calls) waits for an answer at the root before
    /// its task is cancelled and the call fails; [`DEFAULT_A2A_INPUT_TIMEOUT`] unless set. Its
    /// deadline runs from when this process first saw the request (an agent gives none).
    #[must_use]
    pub fn a2a_input_timeout(mut self, timeout: Duration) -> Self {
        self.a2a = Arc::new(
            a2a::A2aClient::new(self.client.clone(), self.credential.clone())
                .with_input_timeout(timeout),
        );
        self
    }

    fn request(&self, method: Method, endpoint: &str, path: &str) -> RequestBuilder {
        let request = self
            .client
            .reqwest()
            .request(method, format!("{endpoint}{path}"));
        match &self.credential {
            Some(credential) => request.header("x-api-key", credential),
            None => request,
        }
    }

    async fn send(&self, endpoint: &str, request: RequestBuilder) -> Result<Response, RemoteError> {
        request
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .map_err(|error| unreachable(endpoint, &error))
    }

    async fn post(&self, endpoint: &str, path: &str, body: Value) -> Result<Response, RemoteError> {
        let request = self.request(Method::POST, endpoint, path).json(&body);
        self.send(endpoint, request).await
    }
}

#[async_trait::async_trait]
impl RemoteAgents for HttpRemoteAgents {
    async fn start(
        &self,
        endpoint: &str,
        agent: &str,
        session: &SessionId,
        message: &str,
        parent: &RemoteParent,
    ) -> Result<RemoteStart, RemoteError> {
        if let Some(base) = a2a_url(endpoint) {
            return self.a2a.start(base, session, message, parent).await;
        }
        let body = json!({
            "agent": agent, "message": message, "session_id": session, "new_only": true,
            "parent_session_id": parent.parent, "root_session_id": parent.root,
        });
        let mut request = self.request(Method::POST, endpoint, "/start").json(&body);
        if let Some(traceparent) = &parent.traceparent {
            request = request.header("traceparent", traceparent);
        }
        let response = self.send(endpoint, request).await?;
        match response.status() {
            status if status.is_success() => Ok(RemoteStart::Started),
            _ => match refusal(endpoint, response).await {
                RemoteError::Refused { code, .. } if code == "session_exists" => {
                    Ok(RemoteStart::Existed)
                }
                other => Err(other),
            },
        }
    }

    async fn status(
        &self,
        endpoint: &str,
        session: &SessionId,
        chunks_from: u64,
    ) -> Result<RemoteStatus, RemoteError> {
        if let Some(base) = a2a_url(endpoint) {
            return self.a2a.status(base, session).await;
        }
        let from = chunks_from.to_string();
        let request = self.request(Method::GET, endpoint, "/status").query(&[
            ("session_id", session.as_str()),
            ("settle_ms", "5000"),
            ("chunks_from", from.as_str()),
        ]);
        let response = self.send(endpoint, request).await?;
        if !response.status().is_success() {
            return Err(refusal(endpoint, response).await);
        }
        // A body that breaks off (a reset, a timeout) is a remote out of reach: nothing was
        // read, nothing decided.
        let bytes = read_bounded(endpoint, response, MAX_STATUS_BODY).await?;
        let body: StatusBody = serde_json::from_slice(&bytes)
            .map_err(|error| protocol(endpoint, format!("GET /status: {error}")))?;
        Ok(RemoteStatus {
            status: body.status,
            run_id: body.run_id,
            aborted: body.aborted,
            chunk_count: body.chunk_count,
            text: body.text,
            output: body.output,
            error: body.error,
            pending: body.pending,
            settled: body.settled.unwrap_or(true),
            chunks: body.chunks.unwrap_or_default(),
        })
    }

    async fn chunks(
        &self,
        endpoint: &str,
        session: &SessionId,
        from: u64,
    ) -> Result<RemoteChunks, RemoteError> {
        if let Some(base) = a2a_url(endpoint) {
            return Ok(Arc::clone(&self.a2a).chunks(base.to_string(), session.clone()));
        }
        let from = from.to_string();
        let request = self.request(Method::GET, endpoint, "/sse").query(&[
            ("session_id", session.as_str()),
            ("from", from.as_str()),
            ("until", "closed"),
        ]);
        // No overall timeout: the stream lasts as long as the run (the server closes an idle
        // one, and the driver asks for the status again).
        let response = request
            .send()
            .await
            .map_err(|error| unreachable(endpoint, &error))?;
        if !response.status().is_success() {
            return Err(refusal(endpoint, response).await);
        }
        Ok(sse::chunks(endpoint.to_string(), response.bytes_stream()).boxed())
    }

    async fn resume(&self, endpoint: &str, session: &SessionId) -> Result<(), RemoteError> {
        if let Some(base) = a2a_url(endpoint) {
            return self.a2a.resume(base, session).await;
        }
        let response = self
            .post(endpoint, "/resume", json!({ "session_id": session }))
            .await?;
        if response.status().is_success() {
            return Ok(());
        }
        Err(refusal(endpoint, response).await)
    }

    async fn submit(&self, endpoint: &str, submit: &Submit) -> Result<SubmitOutcome, RemoteError> {
        if let Some(base) = a2a_url(endpoint) {
            return self.a2a.submit(base, submit).await;
        }
        let response = self
            .post(endpoint, "/submit-tool-result", submit.to_json())
            .await?;
        let status = response.status();
        if status.is_success() {
            return Ok(SubmitOutcome::Accepted);
        }
        let body: Value = error_body(endpoint, response).await;
        let code = body["code"].as_str().unwrap_or("http_error");
        let message = body["message"].as_str().unwrap_or_default().to_string();
        let count = |field: &str| {
            body[field]
                .as_u64()
                .and_then(|value| usize::try_from(value).ok())
                .unwrap_or_default()
        };
        // The remote's outcome, as is: the router answers it at the root.
        Ok(match (status, code) {
            (StatusCode::CONFLICT, "already_completed") => SubmitOutcome::AlreadyCompleted,
            (StatusCode::NOT_FOUND, "unknown_tool_call") => SubmitOutcome::UnknownToolCall,
            (StatusCode::BAD_REQUEST, "invalid_request") => {
                SubmitOutcome::InvalidRequest { reason: message }
            }
            (StatusCode::UNPROCESSABLE_ENTITY, "invalid_result") => SubmitOutcome::InvalidResult {
                reason: message,
                errors: body["errors"]
                    .as_array()
                    .map(|errors| {
                        errors
                            .iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default(),
            },
            (StatusCode::CONFLICT, "stale_approval") => {
                SubmitOutcome::StaleApproval { reason: message }
            }
            (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large") => {
                SubmitOutcome::PayloadTooLarge {
                    size: count("size"),
                    limit: count("limit"),
                }
            }
            _ => {
                return Err(RemoteError::Refused {
                    endpoint: endpoint.to_string(),
                    status: status.as_u16(),
                    code: code.to_string(),
                    message,
                })
            }
        })
    }

    async fn stop(
        &self,
        endpoint: &str,
        session: &SessionId,
        abort: bool,
    ) -> Result<(), RemoteError> {
        // A2A has no interrupt: either way the task is cancelled.
        if let Some(base) = a2a_url(endpoint) {
            return self.a2a.stop(base, session).await;
        }
        let path = if abort { "/abort" } else { "/interrupt" };
        let response = self
            .post(endpoint, path, json!({ "session_id": session }))
            .await?;
        if response.status().is_success() {
            return Ok(());
        }
        Err(refusal(endpoint, response).await)
    }
}

/// `GET /status`, as far as a parent reads it.
#[derive(Debug, Deserialize)]
struct StatusBody {
    status: Status,
    run_id: Option<RunId>,
    #[serde(default)]
    aborted: bool,
    chunk_count: u64,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    error: Option<RunError>,
    #[serde(default)]
    pending: Vec<RemoteCall>,
    #[serde(default)]
    settled: Option<bool>,
    #[serde(default)]
    chunks: Option<Vec<dormant::Chunk>>,
}

/// The remote's error answer (`{code, message, …}`) as a typed refusal.
pub(crate) async fn refusal(endpoint: &str, response: Response) -> RemoteError {
    let status = response.status().as_u16();
    let body: Value = error_body(endpoint, response).await;
    RemoteError::Refused {
        endpoint: endpoint.to_string(),
        status,
        code: body["code"].as_str().unwrap_or("http_error").to_string(),
        message: match body["errors"].as_array() {
            Some(errors) if !errors.is_empty() => format!(
                "{}: {}",
                body["message"].as_str().unwrap_or_default(),
                errors
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            _ => body["message"].as_str().unwrap_or_default().to_string(),
        },
    }
}

/// The most bytes a remote's status answer may hold: a thousand chunks (what a status
/// carries at most), each a tool's result of up to a megabyte, would be more; a page that
/// large is refused as unreadable (and asked again until the runtime's patience runs out)
/// rather than read whole into memory, as any size a remote sent was.
const MAX_STATUS_BODY: usize = 128 * 1024 * 1024;

/// The most bytes a remote's error answer may hold (its code and message are what is read).
const MAX_ERROR_BODY: usize = 1024 * 1024;

/// A remote's error answer as JSON (`null` if it is none, or longer than
/// [`MAX_ERROR_BODY`]).
async fn error_body(endpoint: &str, response: Response) -> Value {
    read_bounded(endpoint, response, MAX_ERROR_BODY)
        .await
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// A remote's answer body, refused past `max` bytes.
pub(crate) async fn read_bounded(
    endpoint: &str,
    mut response: Response,
    max: usize,
) -> Result<Vec<u8>, RemoteError> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| unreachable(endpoint, &error))?
    {
        if body.len() + chunk.len() > max {
            return Err(protocol(endpoint, format!("an answer over {max} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

pub(crate) fn unreachable(endpoint: &str, error: &reqwest::Error) -> RemoteError {
    RemoteError::Unreachable {
        endpoint: endpoint.to_string(),
        reason: error.to_string(),
    }
}

fn protocol(endpoint: &str, reason: String) -> RemoteError {
    RemoteError::Protocol {
        endpoint: endpoint.to_string(),
        reason,
    }
}
