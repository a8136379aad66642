//! Who may do what: the authenticate hook (or explicit unauthenticated access) for starting
//! sessions, and session-bound tokens for everything done to one session.

use std::fmt;
use std::sync::Arc;

use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, StatusCode};
use dormant::llm::BoxFuture;
use dormant::SessionId;

use crate::error::ApiError;
use crate::token::{is_token, TokenKey};

type Hook = dyn Fn(HeaderMap) -> BoxFuture<'static, Result<Caller, Denied>> + Send + Sync;

/// How a server authenticates callers. There is no default that lets anyone in: a server
/// built with [`Auth::default`] refuses to build ([`ServerError::AuthNotConfigured`](crate::ServerError::AuthNotConfigured)).
#[derive(Clone, Default)]
pub struct Auth {
    mode: Mode,
    /// Made by [`Auth::api_key`]: an A2A agent card can say so (`x-api-key`).
    api_key_header: bool,
}

#[derive(Clone, Default)]
enum Mode {
    #[default]
    Unset,
    Anonymous,
    Hook(Arc<Hook>),
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.mode {
            Mode::Unset => "Auth::Unset",
            Mode::Anonymous => "Auth::AllowUnauthenticated",
            Mode::Hook(_) => "Auth::Hook",
        })
    }
}

/// Who a request comes from, as the authenticate hook decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// A name for the logs.
    pub name: String,
    /// May name the id of a session it starts (`session_id` in `POST /start`); otherwise
    /// the server issues one.
    pub may_choose_session_id: bool,
    /// May act on every session without its token (an operator).
    pub all_sessions: bool,
}

impl Caller {
    /// A caller that may start sessions with server-issued ids, and act on a session only
    /// with its token.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            may_choose_session_id: false,
            all_sessions: false,
        }
    }

    /// Also allowed to choose session ids.
    pub fn choosing_session_ids(mut self) -> Self {
        self.may_choose_session_id = true;
        self
    }

    /// Also allowed to act on every session without its token.
    pub fn operator(mut self) -> Self {
        self.all_sessions = true;
        self
    }
}

/// The hook's refusal: answered 401 with this reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denied(pub String);

impl Auth {
    /// Authenticates each request with `hook`, which reads its headers. Session tokens are
    /// checked by the server itself and never reach the hook.
    ///
    /// ```
    /// use dormant_server::{Auth, Caller, Denied};
    ///
    /// let auth = Auth::hook(|headers| {
    ///     let key = headers.get("x-api-key").and_then(|value| value.to_str().ok());
    ///     let caller = match key {
    ///         Some("operator-secret") => Ok(Caller::new("ops").operator()),
    ///         Some("app-secret") => Ok(Caller::new("app").choosing_session_ids()),
    ///         _ => Err(Denied("a valid x-api-key is required".into())),
    ///     };
    ///     Box::pin(async move { caller })
    /// });
    /// # let _ = auth;
    /// ```
    pub fn hook<F>(hook: F) -> Self
    where
        F: Fn(HeaderMap) -> BoxFuture<'static, Result<Caller, Denied>> + Send + Sync + 'static,
    {
        Self {
            mode: Mode::Hook(Arc::new(hook)),
            api_key_header: false,
        }
    }

    /// Lets in, as an operator that may choose session ids, a request whose `x-api-key` is
    /// `key` (compared in constant time); refuses every other. What `dormant-server
    /// --api-key-env` does, and what [`HttpRemoteAgents`](crate::HttpRemoteAgents) sends.
    ///
    /// ```
    /// let auth = dormant_server::Auth::api_key("a-key-of-at-least-16-characters");
    /// # let _ = auth;
    /// ```
    pub fn api_key(key: impl Into<String>) -> Self {
        let key: Arc<str> = key.into().into();
        let auth = Self::hook(move |headers| {
            let given = headers
                .get("x-api-key")
                .map(|value| value.as_bytes().to_vec());
            let key = Arc::clone(&key);
            Box::pin(async move {
                match given {
                    Some(given) if constant_time_eq(&given, key.as_bytes()) => {
                        Ok(Caller::new("api-key").choosing_session_ids().operator())
                    }
                    _ => Err(Denied("send the API key in x-api-key".into())),
                }
            })
        });
        Self {
            api_key_header: true,
            ..auth
        }
    }

    /// How a caller authenticates, as an A2A agent card's `securitySchemes` and
    /// `securityRequirements` say it: a session's token (bearer) always; the API key
    /// (`x-api-key`) when the server checks one. What a hook of your own checks is not known
    /// here: its card lists the session token only.
    pub(crate) fn card_security(&self) -> (serde_json::Value, serde_json::Value) {
        let mut schemes = serde_json::json!({
            "sessionToken": { "httpAuthSecurityScheme": {
                "scheme": "bearer",
                "description": "the token of a task's session (its metadata.dormant_session_token)",
            } },
        });
        let mut requirements = vec![serde_json::json!({ "schemes": { "sessionToken": {} } })];
        if self.api_key_header {
            schemes["apiKey"] = serde_json::json!({ "apiKeySecurityScheme": {
                "location": "header",
                "name": "x-api-key",
                "description": "the server's API key: an operator",
            } });
            requirements.push(serde_json::json!({ "schemes": { "apiKey": {} } }));
        }
        (schemes, serde_json::Value::Array(requirements))
    }

    /// Lets anyone start sessions (with server-issued ids); each session is still reached
    /// only with its token. For loopback demos and tests: say so explicitly.
    pub fn allow_unauthenticated() -> Self {
        Self {
            mode: Mode::Anonymous,
            api_key_header: false,
        }
    }

    pub(crate) fn is_configured(&self) -> bool {
        !matches!(self.mode, Mode::Unset)
    }

    /// The caller of a request that is not about one session (starting a new one).
    pub(crate) async fn caller(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        match &self.mode {
            Mode::Unset => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "the server has no authentication configured",
            )),
            Mode::Anonymous => Ok(Caller::new("anonymous")),
            Mode::Hook(hook) => hook(headers.clone()).await.map_err(|Denied(reason)| {
                ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", reason)
            }),
        }
    }

    /// Whether a request may act on `session` (a root): its token, or an operator.
    /// No credential is 401, a token of another session 403.
    pub(crate) async fn session(
        &self,
        key: &TokenKey,
        headers: &HeaderMap,
        query_token: Option<&str>,
        session: &SessionId,
    ) -> Result<(), ApiError> {
        if let Some(token) = bearer_token(headers).or(query_token) {
            let owner = key.verify(token).map_err(|_| {
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "invalid_token",
                    "the session token is not one this server issued",
                )
            })?;
            if owner != session.as_str() {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "wrong_session",
                    format!("the token authorizes another session, not {session}"),
                ));
            }
            return Ok(());
        }
        if let Mode::Hook(hook) = &self.mode {
            if let Ok(caller) = hook(headers.clone()).await {
                if caller.all_sessions {
                    return Ok(());
                }
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "session_token_required",
                    format!(
                        "{} may not act on session {session} without its token",
                        caller.name
                    ),
                ));
            }
        }
        // A credential that is no session token, and that the hook (if any) did not take
        // for an operator's, is not a missing token: saying so would ask for what was sent.
        if headers.contains_key(AUTHORIZATION) {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_token",
                format!("the Authorization header holds no session token this server issued; session {session} needs its own: Authorization: Bearer <token>, or ?token= on a GET"),
            ));
        }
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing_token",
            format!("session {session} needs its token: Authorization: Bearer <token>, or ?token= on a GET"),
        ))
    }
}

/// A session token in `Authorization: Bearer …` (other bearer credentials are the hook's).
/// The scheme's name is case-insensitive (RFC 9110, 11.1): `bearer` and `BEARER` are
/// `Bearer` too.
pub(crate) fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim_start().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    is_token(token).then_some(token)
}

/// Whether two byte strings are equal, in a time that depends only on their lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
