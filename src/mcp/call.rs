//! An MCP server's tool as an agent's tool: its definition, and the handler that sends a call.

use std::borrow::Cow;
use std::sync::Arc;

use futures::future::BoxFuture;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientRequest, Meta, ServerResult, Tool,
};
use rmcp::service::{PeerRequestOptions, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpError;
use rmcp::transport::DynamicTransportError;
use serde_json::Value;

use super::result::outcome;
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
        Box::pin(async move { send(&shared, &tool, input, ctx.idempotency_key(), safe).await })
    }
}

async fn send(
    shared: &Shared,
    tool: &str,
    input: Value,
    idempotency_key: &str,
    safe_to_retry: bool,
) -> Result<Value, ToolError> {
    let server = &shared.server.name;
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
    let mut meta = Meta::new();
    meta.0
        .insert(IDEMPOTENCY_META_KEY.to_string(), idempotency_key.into());
    let params = CallToolRequestParams {
        // rmcp writes `_meta` from the request's options (below); one set here too would be
        // written twice, a body the server cannot read.
        meta: None,
        name: Cow::Owned(tool.to_string()),
        arguments,
        task: None,
    };
    let timeout = shared.server.call_timeout;
    let unavailable = || {
        failure(
            ToolErrorCode::McpServerUnavailable,
            format!("MCP server {server} is down (restarting); the call was not sent"),
        )
    };
    let mut newer_than = None;
    let mut resent = 0;
    // Whether an earlier try may have reached the server: then giving up is not "not sent".
    let mut maybe_sent = false;
    loop {
        let Some(live) = shared.connection(newer_than).await else {
            if maybe_sent {
                return Err(failure(
                    ToolErrorCode::ToolDurabilityError,
                    format!(
                        "MCP server {server} went away with the call in flight and did not come back within {:?}; it may or may not have taken effect",
                        shared.server.connect_timeout
                    ),
                ));
            }
            return Err(unavailable());
        };
        let options = PeerRequestOptions {
            timeout: Some(timeout),
            meta: Some(meta.clone()),
        };
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params.clone()));
        let sent = live.peer.send_request_with_option(request, options).await;
        let answer = match sent {
            // Bounded here too: after its timeout rmcp waits to send the cancellation, which
            // a stuck connection may never take.
            Ok(handle) => {
                let bound = timeout.saturating_add(CANCEL_GRACE);
                match tokio::time::timeout(bound, handle.await_response()).await {
                    Ok(answer) => answer,
                    Err(_) => Err(ServiceError::Timeout { timeout }),
                }
            }
            // The connection had ended before the request was queued: nothing was sent.
            Err(_) => Err(ServiceError::TransportSend(DynamicTransportError {
                transport_name: Cow::Borrowed("closed connection"),
                transport_type_id: std::any::TypeId::of::<()>(),
                error: "the connection had ended".into(),
            })),
        };
        let error = match answer {
            Ok(ServerResult::CallToolResult(result)) => return outcome(result),
            Ok(_) => ServiceError::UnexpectedResponse,
            Err(error) => error,
        };
        match error {
            ServiceError::McpError(error) => {
                return Err(failure(
                    ToolErrorCode::McpRequestFailed,
                    format!(
                        "MCP server {server} refused the call: {} ({})",
                        error.message, error.code.0
                    ),
                ))
            }
            ServiceError::UnexpectedResponse => {
                return Err(failure(
                    ToolErrorCode::McpRequestFailed,
                    format!("MCP server {server} answered the call with something else"),
                ))
            }
            // A cancellation was sent (if the connection took it); the server may have acted.
            ServiceError::Timeout { timeout } => {
                return Err(failure(
                    ToolErrorCode::ToolDurabilityError,
                    format!(
                        "MCP server {server} did not answer within {timeout:?}; a cancellation was sent, the call may or may not have taken effect, and it was not sent again"
                    ),
                ))
            }
            // Never reached the server: nothing can have run; sent on the next connection.
            ServiceError::TransportSend(error) if never_reached(&error) => {
                tracing::warn!(%server, tool, %error, "MCP call could not be sent; waiting for the server");
                shared.broken(live.number);
                if resent == RESENDS {
                    return Err(unavailable());
                }
            }
            // Sent, and the connection ended before the answer: the server may have acted.
            error => {
                shared.broken(live.number);
                if !safe_to_retry || resent == RESENDS {
                    return Err(failure(
                        ToolErrorCode::ToolDurabilityError,
                        format!(
                            "MCP server {server} went away with the call in flight ({error}); it may or may not have taken effect, and it was not sent again"
                        ),
                    ));
                }
                tracing::warn!(%server, tool, %error, "MCP server went away with a call in flight; sending it again (safe to retry)");
                maybe_sent = true;
            }
        }
        newer_than = Some(live.number);
        resent += 1;
    }
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
