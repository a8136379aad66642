//! Who may act, as extractors: a handler takes [`SessionAccess`] (a session named in the
//! query, already checked) or [`Credentials`] (checked once the body names the session, or
//! says a new one is started), rather than calling the auth hook and the token check by hand.

use std::convert::Infallible;

use axum::extract::{FromRequestParts, Query};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use dormant::SessionId;
use serde::Deserialize;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;

/// A session id a request names, or a typed 400.
pub(crate) fn session_id(text: &str) -> Result<SessionId, ApiError> {
    text.parse()
        .map_err(|error| ApiError::invalid(format!("session_id: {error}")))
}

/// The credentials of a request whose session is named in its body (or that starts one):
/// checked by the handler once the body is read, so that a malformed body is a 400 before
/// any credential is looked at, as for a route that names its session in the query.
#[derive(Debug)]
pub(crate) struct Credentials {
    state: AppState,
    headers: HeaderMap,
}

impl FromRequestParts<AppState> for Credentials {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Infallible> {
        Ok(Self {
            state: state.clone(),
            headers: parts.headers.clone(),
        })
    }
}

impl Credentials {
    /// The caller, for a request that is about no existing session (starting a new one).
    pub(crate) async fn caller(&self) -> Result<Caller, ApiError> {
        self.state.auth.caller(&self.headers).await
    }

    /// Whether the request may act on `session`: its token, or an operator.
    pub(crate) async fn session(&self, session: &SessionId) -> Result<(), ApiError> {
        self.state
            .auth
            .session(&self.state.key, &self.headers, None, session)
            .await
    }

    /// Whether it carries what looks like a session token (`Authorization: Bearer …`), which
    /// makes a start naming a session a new turn of it rather than a caller's choice of id.
    pub(crate) fn has_session_token(&self) -> bool {
        crate::auth::bearer_token(&self.headers).is_some()
    }
}

/// The session a request names in its query (`session_id`, and `token` on a GET), which
/// the request may act on: its token (header or query), or an operator. No credential is
/// 401, a token of another session 403.
#[derive(Debug)]
pub(crate) struct SessionAccess(pub(crate) SessionId);

/// The query's part that says which session and with what token.
#[derive(Deserialize)]
struct Named {
    session_id: String,
    #[serde(default)]
    token: Option<String>,
}

impl FromRequestParts<AppState> for SessionAccess {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Query(named) = Query::<Named>::try_from_uri(&parts.uri).map_err(|error| {
            ApiError::invalid(format!("malformed query: {}", error.body_text()))
        })?;
        let id = session_id(&named.session_id)?;
        state
            .auth
            .session(&state.key, &parts.headers, named.token.as_deref(), &id)
            .await?;
        Ok(Self(id))
    }
}
