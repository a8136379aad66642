//! The JSON-RPC layer of the A2A server (`a2a.rs`): the error codes, an error with dormant's
//! code in A2A's `ErrorInfo` form, a response, and what every request is checked for.

use axum::http::{HeaderMap, StatusCode};
use serde_json::{json, Value};

use crate::error::ApiError;

/// JSON-RPC and A2A error codes.
pub(crate) const INVALID_REQUEST: i64 = -32600;
pub(crate) const METHOD_NOT_FOUND: i64 = -32601;
pub(crate) const INVALID_PARAMS: i64 = -32602;
pub(crate) const INTERNAL: i64 = -32603;
pub(crate) const TASK_NOT_FOUND: i64 = -32001;
pub(crate) const TASK_NOT_CANCELABLE: i64 = -32002;
pub(crate) const UNSUPPORTED_OPERATION: i64 = -32004;
pub(crate) const VERSION_NOT_SUPPORTED: i64 = -32009;

/// A JSON-RPC error: its code, its message, and dormant's code as data.
#[derive(Debug)]
pub(crate) struct RpcError {
    code: i64,
    message: String,
    data: Option<Value>,
}

impl RpcError {
    pub(crate) fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub(crate) fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, message)
    }

    pub(crate) fn unsupported(message: impl Into<String>) -> Self {
        Self::new(UNSUPPORTED_OPERATION, message)
    }
}

impl From<ApiError> for RpcError {
    /// By dormant's code, then by status: what the client did wrong is invalid params, a task
    /// this server does not know is task-not-found, an answer that comes too late an
    /// unsupported operation. dormant's code rides in `data`, as an `ErrorInfo` (A2A's form).
    fn from(error: ApiError) -> Self {
        let code = match (error.code(), error.status()) {
            ("unknown_task" | "unknown_session", _) => TASK_NOT_FOUND,
            ("already_completed" | "stale_approval" | "already_running" | "not_resumable", _) => {
                UNSUPPORTED_OPERATION
            }
            (_, StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY)
            | (_, StatusCode::PAYLOAD_TOO_LARGE | StatusCode::NOT_FOUND) => INVALID_PARAMS,
            (_, StatusCode::CONFLICT) => UNSUPPORTED_OPERATION,
            (_, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => INVALID_REQUEST,
            _ => INTERNAL,
        };
        Self {
            code,
            message: error.message().to_string(),
            data: Some(json!([{
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": error.code().to_uppercase(),
                "domain": "dormant",
                "metadata": { "code": error.code() },
            }])),
        }
    }
}

impl From<dormant::Error> for RpcError {
    fn from(error: dormant::Error) -> Self {
        ApiError::from(error).into()
    }
}

impl From<dormant::ReadError> for RpcError {
    fn from(error: dormant::ReadError) -> Self {
        ApiError::from(error).into()
    }
}

/// A JSON-RPC response to request `id`.
pub(crate) fn response(id: &Value, answer: Result<Value, RpcError>) -> Value {
    match answer {
        Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        Err(error) => {
            let mut body = json!({ "code": error.code, "message": error.message });
            if let Some(data) = error.data {
                body["data"] = data;
            }
            json!({ "jsonrpc": "2.0", "id": id, "error": body })
        }
    }
}

/// What every request is checked for: protocol 1.0 (a client that names another version is
/// told so) and JSON-RPC 2.0.
pub(crate) fn check(headers: &HeaderMap, request: &Value) -> Result<(), RpcError> {
    if let Some(version) = headers.get("a2a-version").and_then(|v| v.to_str().ok()) {
        if version != "1.0" && !version.starts_with("1.0.") && version != "1" {
            return Err(RpcError::new(
                VERSION_NOT_SUPPORTED,
                format!("A2A version {version} is not supported: 1.0"),
            ));
        }
    }
    if request["jsonrpc"] != "2.0" {
        return Err(RpcError::new(INVALID_REQUEST, "not a JSON-RPC 2.0 request"));
    }
    Ok(())
}
