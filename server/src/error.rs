//! Every answer that is not a success, and the one place that maps the runtime's errors and
//! submit outcomes to status codes (the table is in `docs/server.md`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use dormant::SubmitOutcome;
use serde_json::{json, Value};

/// Why a server could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// Neither an authenticate hook nor [`Auth::allow_unauthenticated`](crate::Auth::allow_unauthenticated)
    /// was configured: a server is fail-closed.
    #[error("no authentication configured: give an authenticate hook (Auth::hook, Auth::api_key) or allow unauthenticated access explicitly (Auth::allow_unauthenticated, --allow-unauthenticated)")]
    AuthNotConfigured,
    /// A [`ServerConfig`](crate::ServerConfig) setting is out of range.
    #[error("invalid server setting {setting}: {reason}")]
    InvalidConfig {
        /// The setting.
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The token key file ([`Server::token_key_file`](crate::Server::token_key_file)) could
    /// not be read or created.
    #[error("token key {path}: {source}")]
    TokenKey {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// An error answer: a status code and a JSON body `{ "code", "message", ... }` whose `code`
/// is stable (snake_case).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    extra: Option<Value>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            extra: None,
        }
    }

    pub(crate) fn with(mut self, extra: Value) -> Self {
        self.extra = Some(extra);
        self
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// The status code.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The stable code.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// What went wrong, in words.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "code": self.code, "message": self.message });
        if let (Some(Value::Object(extra)), Some(fields)) = (self.extra, body.as_object_mut()) {
            fields.extend(extra);
        }
        (self.status, Json(body)).into_response()
    }
}

/// The runtime's errors, each with its status code.
impl From<dormant::Error> for ApiError {
    fn from(error: dormant::Error) -> Self {
        use dormant::Error as E;
        let status = match &error {
            E::UnknownSession(_) | E::UnknownAgent(_) => StatusCode::NOT_FOUND,
            E::InvalidDefinition(_) => StatusCode::BAD_REQUEST,
            E::AgentMismatch { .. }
            | E::RunCut { .. }
            | E::SubAgentSession { .. }
            | E::AlreadyRunning(_)
            | E::SessionExists(_)
            | E::Aborted(_)
            | E::NotResumable { .. } => StatusCode::CONFLICT,
            // Retryable: the store may have room again, the session may come back, another
            // node may answer.
            E::Store(store) if store.is_retryable() => StatusCode::SERVICE_UNAVAILABLE,
            // Another node owns the session (PostgreSQL store): nothing was written here.
            E::Store(
                dormant::store::Error::LeaseLost { .. } | dormant::store::Error::LeaseHeld { .. },
            ) => StatusCode::SERVICE_UNAVAILABLE,
            // A store opened to salvage what a damage left: it reads, and writes nothing.
            E::Store(dormant::store::Error::ReadOnly { .. }) => StatusCode::SERVICE_UNAVAILABLE,
            E::SessionUnavailable { .. } | E::ShutDown | E::OwnerUnreachable { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            E::Remote(remote) if remote.is_retryable() => StatusCode::SERVICE_UNAVAILABLE,
            E::Remote(_) => StatusCode::BAD_GATEWAY,
            E::PeerRefused => StatusCode::FORBIDDEN,
            E::BadCursor(_) => StatusCode::BAD_REQUEST,
            E::Fork(dormant::types::ForkError::UnknownCheckpoint { .. }) => StatusCode::NOT_FOUND,
            E::Fork(dormant::types::ForkError::MessageAndEdit) => StatusCode::BAD_REQUEST,
            E::Fork(dormant::types::ForkError::CannotAnswer { .. }) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            E::Fork(dormant::types::ForkError::Compacted { .. }) => StatusCode::GONE,
            E::Fork(_) => StatusCode::CONFLICT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %dormant::types::Untrusted(&error), code = error.code(), "server.runtime_error");
        }
        ApiError::new(status, error.code(), error.to_string())
    }
}

/// A read's errors: those of the runtime's calls of the same name, with their status codes
/// (one table, above).
impl From<dormant::ReadError> for ApiError {
    fn from(error: dormant::ReadError) -> Self {
        ApiError::from(dormant::Error::from(error))
    }
}

/// A submit's outcome: `accepted` is 200, every other outcome an error answer with its
/// stable code.
pub(crate) fn submit_answer(outcome: SubmitOutcome) -> Result<Value, ApiError> {
    let code = outcome.code();
    let (status, message, extra) = match outcome {
        SubmitOutcome::Accepted => return Ok(json!({ "code": code })),
        SubmitOutcome::AlreadyCompleted => (
            StatusCode::CONFLICT,
            "the call already has an answer, expired, or completed".to_string(),
            None,
        ),
        SubmitOutcome::UnknownToolCall => (
            StatusCode::NOT_FOUND,
            "no call waits under this tool_call_id in that session: it was never made there, or an abort dropped it".to_string(),
            None,
        ),
        SubmitOutcome::InvalidRequest { reason } => (StatusCode::BAD_REQUEST, reason, None),
        SubmitOutcome::InvalidResult { reason, errors } => (
            StatusCode::UNPROCESSABLE_ENTITY,
            reason,
            Some(json!({ "errors": errors })),
        ),
        SubmitOutcome::PayloadTooLarge { size, limit } => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the answer is {size} bytes; the limit is {limit}"),
            Some(json!({ "size": size, "limit": limit })),
        ),
        SubmitOutcome::StaleApproval { reason } => (StatusCode::CONFLICT, reason, None),
        other => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unexpected submit outcome {other:?}"),
            None,
        ),
    };
    let error = ApiError::new(status, code, message);
    Err(match extra {
        Some(extra) => error.with(extra),
        None => error,
    })
}
