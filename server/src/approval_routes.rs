//! Approvals decided through a signed token (`approval_token.rs`): `POST /approval-token`
//! issues one for a waiting approval to whoever may act on its session; `GET /approval` shows
//! the holder what it approves, and `POST /approval` decides it, with the token as the only
//! credential.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use dormant::types::PendingCall;
use dormant::{PendingKind, SessionId, Submit};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::access::{session_id, Credentials};
use crate::approval_token::ApprovalGrant;
use crate::body::{JsonBody, Params};
use crate::error::{submit_answer, ApiError};
use crate::state::AppState;

/// `POST /approval-token`'s body: the approval, as a submit names it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenRequest {
    /// The root session.
    session_id: String,
    tool_call_id: String,
    /// The session that made the call, if not the root (as `GET /status` lists it).
    #[serde(default)]
    owner_session_id: Option<String>,
}

/// `GET /approval`'s query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenQuery {
    token: String,
}

/// `POST /approval`'s body: the decision.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Decision {
    token: String,
    approved: bool,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    edited_input: Option<Value>,
}

/// `POST /approval-token`: a token for one waiting approval, valid until its deadline.
pub(crate) async fn issue(
    State(state): State<AppState>,
    credentials: Credentials,
    JsonBody(request): JsonBody<TokenRequest>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let root = session_id(&request.session_id)?;
    credentials.session(&root).await?;
    let owner = match &request.owner_session_id {
        Some(text) => session_id(text)?,
        None => root.clone(),
    };
    let (call, _) = approval(&state, &root, &owner, &request.tool_call_id).await?;
    if !call.is_waiting(state.runtime.now_ms()) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_completed",
            "the approval already has a decision, or its time ran out",
        ));
    }
    let grant = ApprovalGrant {
        root: root.to_string(),
        owner: owner.to_string(),
        approval_id: call.approval_id(),
        call: call.tool_call_id,
        binding: call.binding,
        expires_at_ms: call.deadline_at_ms,
    };
    let token = grant.issue(&state.key)?;
    tracing::info!(session = %owner, tool_call_id = %dormant::types::Untrusted(&grant.call), "server.approval_token_issued");
    Ok((
        StatusCode::CREATED,
        Json(json!({ "token": token, "expires_at_ms": grant.expires_at_ms })),
    ))
}

/// `GET /approval?token=`: what the token approves, for the person's device to show.
pub(crate) async fn show(
    State(state): State<AppState>,
    Params(query): Params<TokenQuery>,
) -> Result<Json<Value>, ApiError> {
    let grant = ApprovalGrant::verify(&state.key, &query.token, state.runtime.now_ms())?;
    let (root, owner) = grant_sessions(&grant)?;
    let (call, agent) = approval(&state, &root, &owner, &grant.call).await?;
    let tool = state
        .runtime
        .tool_info(&agent, &call.tool_name)
        .unwrap_or_default();
    // A request asked again since (a fork, a new run) is another request: it says so.
    let same_request = call.approval_id() == grant.approval_id && call.binding == grant.binding;
    Ok(Json(json!({
        "session_id": owner.as_str(),
        "root": root.as_str(),
        "agent": agent,
        "tool_call_id": call.tool_call_id,
        "tool_name": call.tool_name,
        "description": tool.description,
        "input": call.input,
        "input_schema": tool.input_schema,
        "editable": tool.editable,
        "deadline_at_ms": call.deadline_at_ms,
        "waiting": same_request && call.is_waiting(state.runtime.now_ms()),
    })))
}

/// `POST /approval`: the decision, submitted bound to the request the token names; once it is
/// accepted, the root is resumed (as `POST /submit-tool-result?resume=true` does), so the run
/// goes on when nothing else waits — the person on the device has no other way to move it —
/// and a resume that finds calls still waiting ends at once.
pub(crate) async fn decide(
    State(state): State<AppState>,
    JsonBody(decision): JsonBody<Decision>,
) -> Result<Json<Value>, ApiError> {
    let grant = ApprovalGrant::verify(&state.key, &decision.token, state.runtime.now_ms())?;
    let mut submit = Submit::approval(
        grant.root.clone(),
        grant.call.clone(),
        grant.approval_id.clone(),
        decision.approved,
        decision.reason,
    )
    .owned_by(grant.owner.clone());
    if let Some(binding) = grant.binding {
        submit = submit.bound_to(binding);
    }
    if let Some(input) = decision.edited_input {
        submit = submit.with_edited_input(input);
    }
    let answered = state.runtime.submit_and_resume(submit).await?;
    tracing::info!(session = %dormant::types::Untrusted(&grant.owner), tool_call_id = %dormant::types::Untrusted(&grant.call), outcome = answered.outcome.code(), "server.approval_by_token");
    let mut answer = submit_answer(answered.outcome)?;
    if let (Some(Err(failure)), Some(fields)) = (answered.resumed, answer.as_object_mut()) {
        fields.insert(
            "resume_error".into(),
            json!({ "code": failure.code, "message": failure.message }),
        );
    }
    Ok(Json(answer))
}

fn grant_sessions(grant: &ApprovalGrant) -> Result<(SessionId, SessionId), ApiError> {
    Ok((session_id(&grant.root)?, session_id(&grant.owner)?))
}

/// The approval call `call` of `owner`, a session of `root`'s tree, and `owner`'s agent.
async fn approval(
    state: &AppState,
    root: &SessionId,
    owner: &SessionId,
    call: &str,
) -> Result<(PendingCall, String), ApiError> {
    let unknown = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_tool_call",
            "no call waits under this tool_call_id in that session",
        )
    };
    let record = match state.runtime.session(owner).await {
        Ok(record) => record,
        Err(dormant::ReadError::UnknownSession(_)) => return Err(unknown()),
        Err(error) => return Err(error.into()),
    };
    if record.root != *root {
        return Err(unknown());
    }
    let found = state
        .runtime
        .pending(owner)
        .await?
        .into_iter()
        .find(|pending| pending.tool_call_id == call)
        .ok_or_else(unknown)?;
    if found.kind != PendingKind::Approval {
        return Err(ApiError::invalid(format!(
            "{call} is not an approval: only an approval has a token"
        )));
    }
    Ok((found, record.agent))
}
