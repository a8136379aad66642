//! `POST /token`: a session's token, for an operator. The page's inbox opens the conversation of
//! a waiting call with it: a browser's `EventSource` follows a stream with `?token=` and cannot
//! send an operator's header.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use crate::access::{session_id, Credentials};
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::state::AppState;
use crate::wire::SessionRequest;

/// Answers `{ session_id, token }` for an existing session, to an operator only (who may act
/// on every session anyway: the token grants nothing more).
pub(crate) async fn token(
    State(state): State<AppState>,
    credentials: Credentials,
    JsonBody(body): JsonBody<SessionRequest>,
) -> Result<Json<Value>, ApiError> {
    let id = session_id(&body.session_id)?;
    let caller = credentials.caller().await?;
    if !caller.all_sessions {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "operator_only",
            "a session's token is handed to an operator only; anyone else got it when the session started",
        ));
    }
    // Only for a session that exists: a token of no session would be a puzzle later.
    state.runtime.session(&id).await?;
    Ok(Json(
        json!({ "session_id": id, "token": state.key.issue(&id) }),
    ))
}
