//! An MCP server's tool as an agent's tool: its definition, and the handler that sends a call.

use std::borrow::Cow;
use std::sync::{Arc, Weak};

use futures::future::BoxFuture;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, Meta, ServerResult, Tool,
};
use rmcp::service::{PeerRequestOptions, RequestHandle, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpError;
use rmcp::transport::DynamicTransportError;
use rmcp::RoleClient;
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::questions::{Asker, Event, Registered};
use super::result::outcome;
use super::server::McpServer;
use super::shared::Shared;
use crate::definition::{ToolContext, ToolDefinition, ToolError, ToolHandler};
use crate::types::tool_error::ToolErrorCode;

/// The `_meta` key that carries a call's idempotency key to the server.
pub(crate) const IDEMPOTENCY_META_KEY: &str = "dormant/idempotency_key";

/// How many times a call that is safe to retry is sent again to a server that went away
/// with it in flight (and was started again).
const RESENDS: u32 = 3;

/// How long past a call's timeout it may take to send the cancellation before the call is
/// given up anyway.
const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The agent's tool for the server's `tool`.
pub(super) fn definition(shared: &Arc<Shared>, tool: &Tool) -> ToolDefinition {
    let annotations = tool.annotations.as_ref();
    let read_only = annotations.and_then(|a| a.read_only_hint).unwrap_or(false);
    let idempotent = annotations.and_then(|a| a.idempotent_hint).unwrap_or(false);
    let safe = shared
        .server
        .is_safe_to_retry(&tool.name, read_only, idempotent);
    let description = tool
        .description
        .as_deref()
        .or(tool.title.as_deref())
        .unwrap_or_default()
        .to_string();
    let handler = McpCall {
        shared: Arc::clone(shared),
        tool: tool.name.to_string(),
        safe_to_retry: safe,
    };
    ToolDefinition::server_handler(format!("{}{}", shared.server.prefix, tool.name), handler)
        .description(description)
        .input_schema(Value::Object((*tool.input_schema).clone()))
        .safe_to_retry(safe)
}

/// Sends one call of `tool` to the server.
struct McpCall {
    shared: Arc<Shared>,
    tool: String,
    safe_to_retry: bool,
}

impl ToolHandler for McpCall {
    fn call(&self, input: Value, ctx: ToolContext) -> BoxFuture<'static, Result<Value, ToolError>> {
        let shared = Arc::clone(&self.shared);
        let tool = self.tool.clone();
        let safe = self.safe_to_retry;
        Box::pin(async move { run(&shared, &tool, input, &ctx, safe).await })
    }

    /// The session is done with the call's question: a call still parked for it is dropped,
    /// which cancels the question at the server.
    fn question_closed(&self, idempotency_key: &str) {
        if self.shared.parked.take(idempotency_key).is_some() {
            tracing::info!(server = %self.shared.server.name, tool = %self.tool, "MCP question closed by the session: cancelled at the server");
        }
    }
}

/// Runs one call of `tool`: sends it (or, when the session runs it again with the answer to
/// a question it asked, goes on with the call that asked) and waits for its outcome; a
/// question the server asks becomes the session's `input` call ([`super::questions`]).
async fn run(
    shared: &Arc<Shared>,
    tool: &str,
    input: Value,
    ctx: &ToolContext,
    safe_to_retry: bool,
) -> Result<Value, ToolError> {
    let key = ctx.idempotency_key();
    let answers = ctx.answers();
    let (mut events, mut asked) = match shared.parked.take(key) {
        // The call that asked is still open: the person's answer goes to it.
        Some(parked) if answers.len() == parked.asked => {
            parked.question.answer(&answers[parked.asked - 1]);
            (parked.events, parked.asked)
        }
        _ if !answers.is_empty() && !safe_to_retry => {
            return Err(failure(
                ToolErrorCode::ToolDurabilityError,
                format!(
                    "the call of {tool} asked for input, and MCP server {}'s request is no longer open (dormant restarted, the server went away, or nobody answered within {:?}); it may have acted before it asked, and it is not safe to retry, so it was not sent again",
                    shared.server.name, shared.server.input_timeout
                ),
            ))
        }
        _ => (start(shared, tool, input, key, safe_to_retry).await?, 0),
    };
    loop {
        match events.recv().await {
            Some(Event::Done(outcome)) => return outcome,
            // Sent again to a restarted server, which asks its questions again.
            Some(Event::Resent) => asked = 0,
            // A call sent again gets the answers given before, to the questions it asks again
            // in the same order.
            Some(Event::Asked(question)) if asked < answers.len() => {
                question.answer(&answers[asked]);
                asked += 1;
            }
            Some(Event::Asked(question)) => {
                asked += 1;
                let request = question.request.clone();
                let timeout = shared.server.input_timeout;
                shared.parked.park(key, events, question, asked, timeout);
                return Err(ctx.ask(request));
            }
            None => {
                return Err(failure(
                    ToolErrorCode::ToolDurabilityError,
                    format!("the call of {tool} ended without an outcome; it may or may not have taken effect"),
                ))
            }
        }
    }
}

/// Sends the call (on the caller's turn, so that the calls of one step reach the server in
/// call order), then waits for its answer from a task of its own, so that it stays open while
/// the session waits for a person's answer to a question it asked; its questions and outcome
/// come on the channel.
async fn start(
    shared: &Arc<Shared>,
    tool: &str,
    input: Value,
    idempotency_key: &str,
    safe_to_retry: bool,
) -> Result<mpsc::UnboundedReceiver<Event>, ToolError> {
    let arguments = match input {
        Value::Object(arguments) => Some(arguments),
        Value::Null => None,
        other => {
            return Err(failure(
                ToolErrorCode::InvalidInput,
                format!("an MCP tool takes an object, not {other}"),
            ))
        }
    };
    let call = Request::new(&shared.server, tool, arguments, idempotency_key);
    let (sender, events) = mpsc::unbounded_channel();
    let asker = Asker::new(sender);
    let Some(first) = call.put(shared, None, &asker).await else {
        return Err(call.unavailable());
    };
    // Not kept alive by its calls: dropping the last handle stops the server, which ends them.
    let shared = Arc::downgrade(shared);
    tokio::spawn(async move {
        let outcome = call.follow(&shared, first, safe_to_retry, &asker).await;
        asker.done(outcome);
    });
    Ok(events)
}

/// One call's request, as sent (again) to whichever connection is up.
struct Request {
    server: String,
    tool: String,
    params: CallToolRequestParams,
    meta: Meta,
    timeout: std::time::Duration,
    connect_timeout: std::time::Duration,
}

/// A request put on a connection: the connection's number, the call's place among those in
/// flight there, and the handle to its answer (or why it could not be queued).
struct Put {
    number: u64,
    _in_flight: Registered,
    sent: Result<RequestHandle<RoleClient>, ServiceError>,
}

impl Request {
    fn new(
        server: &McpServer,
        tool: &str,
        arguments: Option<Map<String, Value>>,
        idempotency_key: &str,
    ) -> Self {
        let mut meta = Meta::new();
        meta.0
            .insert(IDEMPOTENCY_META_KEY.to_string(), idempotency_key.into());
        Self {
            server: server.name.clone(),
            tool: tool.to_string(),
            params: CallToolRequestParams {
                // rmcp writes `_meta` from the request's options (below); one set here too
                // would be written twice, a body the server cannot read.
                meta: None,
                name: Cow::Owned(tool.to_string()),
                arguments,
                task: None,
            },
            meta,
            timeout: server.call_timeout,
            connect_timeout: server.connect_timeout,
        }
    }

    fn unavailable(&self) -> ToolError {
        failure(
            ToolErrorCode::McpServerUnavailable,
            format!(
                "MCP server {} is down (restarting); the call was not sent",
                self.server
            ),
        )
    }

    /// Puts the request on a working connection newer than `newer_than`, registered there for
    /// its questions; `None` when none comes up within the connect timeout.
    async fn put(
        &self,
        shared: &Shared,
        newer_than: Option<u64>,
        asker: &Arc<Asker>,
    ) -> Option<Put> {
        let live = shared.connection(newer_than).await?;
        // The timeout is kept here, not by rmcp: it does not run while a person is asked.
        let options = PeerRequestOptions {
            timeout: None,
            meta: Some(self.meta.clone()),
        };
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(self.params.clone()));
        // Its questions come to this call while it is in flight on this connection.
        let in_flight = shared.in_flight.register(live.number, asker);
        let sent = live
            .peer
            .send_request_with_option(request, options)
            .await
            // The connection had ended before the request was queued: nothing was sent.
            .map_err(|_| {
                ServiceError::TransportSend(DynamicTransportError {
                    transport_name: Cow::Borrowed("closed connection"),
                    transport_type_id: std::any::TypeId::of::<()>(),
                    error: "the connection had ended".into(),
                })
            });
        Some(Put {
            number: live.number,
            _in_flight: in_flight,
            sent,
        })
    }

    /// Waits for the answer to the request `first` put, sending it again where the rules allow
    /// (a connection that ended first, a call safe to retry).
    async fn follow(
        &self,
        shared: &Weak<Shared>,
        first: Put,
        safe_to_retry: bool,
        asker: &Arc<Asker>,
    ) -> Result<Value, ToolError> {
        let (server, timeout) = (&self.server, self.timeout);
        let gone = || {
            failure(
                ToolErrorCode::McpServerUnavailable,
                "the MCP server was stopped (its tools were dropped)".to_string(),
            )
        };
        let mut first = Some(first);
        let mut newer_than = None;
        let mut resent = 0;
        // Whether an earlier try may have reached the server: then giving up is not "not sent".
        let mut maybe_sent = false;
        loop {
            let put = match first.take() {
                Some(put) => put,
                None => {
                    // Held only while a connection is found and the call put on it, never while
                    // the call waits for its answer.
                    let Some(holding) = shared.upgrade() else {
                        return Err(gone());
                    };
                    // The restarted server asks its questions again, from the first.
                    asker.resent();
                    match self.put(&holding, newer_than, asker).await {
                        Some(put) => put,
                        None if maybe_sent => {
                            return Err(failure(
                                ToolErrorCode::ToolDurabilityError,
                                format!(
                                    "MCP server {server} went away with the call in flight and did not come back within {:?}; it may or may not have taken effect",
                                    self.connect_timeout
                                ),
                            ))
                        }
                        None => return Err(self.unavailable()),
                    }
                }
            };
            let number = put.number;
            let answer = match put.sent {
                Ok(handle) => answer_within(handle, asker, timeout).await,
                Err(error) => Err(error),
            };
            let error = match answer {
                Ok(ServerResult::CallToolResult(result)) => return outcome(result),
                Ok(_) => ServiceError::UnexpectedResponse,
                Err(error) => error,
            };
            self.after_failure(
                shared,
                error,
                number,
                resent,
                safe_to_retry,
                &mut maybe_sent,
            )?;
            newer_than = Some(number);
            resent += 1;
        }
    }

    /// What a failed try of connection `number` means: `Ok` sends the call again (on a newer
    /// connection), `Err` is the call's outcome. `maybe_sent` says whether a try may have
    /// reached the server, and is set when this one may have.
    fn after_failure(
        &self,
        shared: &Weak<Shared>,
        error: ServiceError,
        number: u64,
        resent: u32,
        safe_to_retry: bool,
        maybe_sent: &mut bool,
    ) -> Result<(), ToolError> {
        let (server, tool) = (&self.server, self.tool.as_str());
        match error {
            ServiceError::McpError(error) => Err(failure(
                ToolErrorCode::McpRequestFailed,
                format!(
                    "MCP server {server} refused the call: {} ({})",
                    error.message, error.code.0
                ),
            )),
            ServiceError::UnexpectedResponse => Err(failure(
                ToolErrorCode::McpRequestFailed,
                format!("MCP server {server} answered the call with something else"),
            )),
            // A cancellation was sent (if the connection took it); the server may have acted.
            ServiceError::Timeout { timeout } => Err(failure(
                ToolErrorCode::ToolDurabilityError,
                format!(
                    "MCP server {server} did not answer within {timeout:?}; a cancellation was sent, the call may or may not have taken effect, and it was not sent again"
                ),
            )),
            // Never reached the server: nothing can have run; sent on the next connection.
            ServiceError::TransportSend(error) if never_reached(&error) => {
                tracing::warn!(%server, tool, %error, "MCP call could not be sent; waiting for the server");
                broken(shared, number);
                match (resent == RESENDS, *maybe_sent) {
                    (false, _) => Ok(()),
                    (true, true) => Err(failure(
                        ToolErrorCode::ToolDurabilityError,
                        format!(
                            "MCP server {server} went away with the call in flight, and it could not be sent again; it may or may not have taken effect"
                        ),
                    )),
                    (true, false) => Err(self.unavailable()),
                }
            }
            // Sent, and the connection ended before the answer: the server may have acted.
            error => {
                broken(shared, number);
                if !safe_to_retry || resent == RESENDS {
                    return Err(failure(
                        ToolErrorCode::ToolDurabilityError,
                        format!(
                            "MCP server {server} went away with the call in flight ({error}); it may or may not have taken effect, and it was not sent again"
                        ),
                    ));
                }
                tracing::warn!(%server, tool, %error, "MCP server went away with a call in flight; sending it again (safe to retry)");
                *maybe_sent = true;
                Ok(())
            }
        }
    }
}

/// Tells the supervisor (if the server is still kept) that a call found connection `number`
/// broken.
fn broken(shared: &Weak<Shared>, number: u64) {
    if let Some(shared) = shared.upgrade() {
        shared.broken(number);
    }
}

/// The server's answer to a call, waiting at most `timeout` of the server's own time: the
/// clock stops while a question of the call waits for a person, and starts again from the
/// answer. Past it, a cancellation is sent (bounded too: a stuck connection may never take it).
async fn answer_within(
    mut handle: RequestHandle<RoleClient>,
    asker: &Asker,
    timeout: std::time::Duration,
) -> Result<ServerResult, ServiceError> {
    let sent = Instant::now();
    loop {
        let deadline = asker
            .deadline(sent, timeout)
            .unwrap_or_else(|| Instant::now() + timeout);
        match tokio::time::timeout_at(deadline, &mut handle.rx).await {
            Ok(answer) => return answer.unwrap_or(Err(ServiceError::TransportClosed)),
            Err(_)
                if asker
                    .deadline(sent, timeout)
                    .is_none_or(|due| due > Instant::now()) => {}
            Err(_) => break,
        }
    }
    let cancel = handle.cancel(Some("request timeout".to_string()));
    let _ = tokio::time::timeout(CANCEL_GRACE, cancel).await;
    Err(ServiceError::Timeout { timeout })
}

/// Whether a request that failed to send surely never reached the server: a write to a
/// stdio server's closed pipe, or an HTTP connection that could not be made. An HTTP request
/// that failed later (a reset, an answer that could not be read) may have been acted on.
fn never_reached(error: &DynamicTransportError) -> bool {
    match error
        .error
        .downcast_ref::<StreamableHttpError<reqwest::Error>>()
    {
        Some(StreamableHttpError::Client(error)) => error.is_connect(),
        Some(_) => false,
        None => true,
    }
}

fn failure(code: ToolErrorCode, detail: String) -> ToolError {
    ToolError(code.with(detail).to_string())
}
