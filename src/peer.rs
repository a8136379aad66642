//! Peers: the in-process API answers for sessions another node owns. On a store several
//! nodes share ([`PgStore`](crate::PgStore)), a [`Runtime`](crate::Runtime) call for a
//! session whose tree another live node owns is refused here (the activation cannot take the
//! tree's lease); with a [`Peers`] transport configured
//! ([`RuntimeBuilder::peers`](crate::RuntimeBuilder::peers)), the call is sent to that owner
//! instead, as a [`PeerCall`], and its [`PeerAnswer`] returned as the call's own. The owner
//! serves it with [`Runtime::serve_peer`](crate::Runtime::serve_peer), here and never further,
//! so two nodes that disagree for a moment answer an error rather than pass a call between
//! them. `dormant_server::HttpPeers` speaks it over HTTP (`POST /peer`).
//!
//! A peer proves it is one with the owner's [`PeerKey`]: a random key each node makes when its
//! store opens, kept beside its address in the store and read from there with the owner
//! ([`Store::lease_owner`](crate::Store::lease_owner)). Whoever can read the store can call
//! the nodes as a peer; whoever can write it could do anything anyway.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Error;
use crate::ids::SessionId;
use crate::remote::RemoteError;
use crate::session::{RunOutcome, RunStarted, Status};
use crate::store::LeaseOwner;
use crate::submit::SubmitOutcome;

/// A node's key for calls from its peers. Its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PeerKey(String);

impl PeerKey {
    /// A fresh random key (244 random bits).
    pub fn random() -> Self {
        Self(format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        ))
    }

    /// A key as stored.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key, to send with a call.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this key, in time that does not depend on where they differ.
    pub fn matches(&self, presented: &str) -> bool {
        let (ours, theirs) = (self.0.as_bytes(), presented.as_bytes());
        ours.len() == theirs.len()
            && ours
                .iter()
                .zip(theirs)
                .fold(0u8, |differ, (a, b)| differ | (a ^ b))
                == 0
    }
}

impl fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PeerKey(..)")
    }
}

/// A call of the in-process API, sent to the node that owns the session's tree.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
#[non_exhaustive]
pub enum PeerCall {
    /// [`Runtime::execute_on`](crate::Runtime::execute_on): answered when the run settles.
    Execute {
        /// The session.
        session: SessionId,
        /// Its agent.
        agent: String,
        /// The message.
        message: String,
    },
    /// [`Runtime::start_on`](crate::Runtime::start_on) (`new_only`:
    /// [`Runtime::start_new`](crate::Runtime::start_new)).
    Start {
        /// The session.
        session: SessionId,
        /// Its agent.
        agent: String,
        /// The message.
        message: String,
        /// Only if the session does not exist.
        new_only: bool,
        /// For a remote child: its parent on another server.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        remote_parent: Option<crate::remote::RemoteParent>,
    },
    /// [`Runtime::submit_tool_result`](crate::Runtime::submit_tool_result), its envelope as
    /// [`Submit::to_json`](crate::Submit::to_json) writes it.
    Submit {
        /// The envelope.
        envelope: Value,
    },
    /// [`Runtime::resume`](crate::Runtime::resume) (`wait`) or
    /// [`Runtime::start_resume`](crate::Runtime::start_resume).
    Resume {
        /// The session.
        session: SessionId,
        /// Answer when the run settles, not when the resume is applied.
        wait: bool,
    },
    /// [`Runtime::interrupt`](crate::Runtime::interrupt) (`abort`:
    /// [`Runtime::abort`](crate::Runtime::abort)).
    Stop {
        /// The session.
        session: SessionId,
        /// Abort rather than interrupt.
        abort: bool,
    },
}

/// The owner's answer to a [`PeerCall`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
#[non_exhaustive]
pub enum PeerAnswer {
    /// A run settled.
    Ran(RunOutcome),
    /// A run started, or a resume was applied.
    Started(RunStarted),
    /// A submit's outcome.
    Submitted(SubmitOutcome),
    /// A stop is done.
    Stopped,
    /// The call failed on the owner.
    Failed(PeerFailure),
}

/// A call that failed on its owner: the error's stable code and message, with what this side
/// needs to give it back as the same [`Error`] variant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerFailure {
    /// [`Error::code`].
    pub code: String,
    /// The error's message.
    pub message: String,
    /// For `not_resumable`: the last run's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// For `agent_mismatch`: the session's agent; for `sub_agent_session`: its parent; for
    /// `unknown_agent`: the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl PeerFailure {
    /// What the owner sends back for `error`.
    pub fn of(error: &Error) -> Self {
        let (status, detail) = match error {
            Error::NotResumable { status, .. } => (Some(*status), None),
            Error::AgentMismatch { actual, .. } => (None, Some(actual.clone())),
            Error::SubAgentSession { parent, .. } => (None, Some(parent.to_string())),
            Error::UnknownAgent(agent) => (None, Some(agent.clone())),
            _ => (None, None),
        };
        Self {
            code: error.code().to_string(),
            message: error.to_string(),
            status,
            detail,
        }
    }

    /// The error as the owner had it, for a call on `session` (`agent`: the agent the call
    /// named), where the code says which; any other, a refusal by the node at `endpoint`.
    pub fn into_error(self, session: &SessionId, agent: Option<&str>, endpoint: &str) -> Error {
        let session = session.clone();
        let detail = self.detail.clone().unwrap_or_default();
        match (self.code.as_str(), self.status) {
            ("unknown_session", _) => Error::UnknownSession(session),
            ("already_running", _) => Error::AlreadyRunning(session),
            ("session_exists", _) => Error::SessionExists(session),
            ("aborted", _) => Error::Aborted(session),
            ("crashed", _) => Error::Crashed(session),
            ("not_resumable", Some(status)) => Error::NotResumable { session, status },
            ("unknown_agent", _) => Error::UnknownAgent(detail),
            ("agent_mismatch", _) => Error::AgentMismatch {
                session,
                actual: detail,
                requested: agent.unwrap_or_default().to_string(),
            },
            ("sub_agent_session", _) => match detail.parse() {
                Ok(parent) => Error::SubAgentSession { session, parent },
                Err(_) => self.refusal(endpoint),
            },
            ("session_unavailable" | "lease_held" | "lease_lost", _) => Error::SessionUnavailable {
                session,
                reason: format!(
                    "its owner at {endpoint} could not serve it: {}",
                    self.message
                ),
            },
            _ => self.refusal(endpoint),
        }
    }

    fn refusal(self, endpoint: &str) -> Error {
        // A shut-down or busy owner is worth another try; anything else is its answer.
        let status = match self.code.as_str() {
            "shut_down" | "store_error" | "remote_unavailable" => 503,
            _ => 500,
        };
        Error::Remote(RemoteError::Refused {
            endpoint: endpoint.to_string(),
            status,
            code: self.code,
            message: self.message,
        })
    }
}

/// How a runtime sends a call to the node that owns a session's tree
/// ([`RuntimeBuilder::peers`](crate::RuntimeBuilder::peers)).
#[async_trait::async_trait]
pub trait Peers: Send + Sync + fmt::Debug + 'static {
    /// Sends `call` to `owner` (its address and key are in it) and returns its answer.
    ///
    /// # Errors
    /// The owner could not be reached ([`RemoteError::Unreachable`], retryable), refused the
    /// call (a wrong key), or answered something unreadable.
    async fn call(&self, owner: &LeaseOwner, call: &PeerCall) -> Result<PeerAnswer, RemoteError>;
}

tokio::task_local! {
    /// Set while the calls of a task may not be sent on (see [`here_only`]).
    static HERE_ONLY: ();
}

/// Runs `calls` with every [`Runtime`](crate::Runtime) call they make served on this node
/// only, never sent to another. The agent server runs each request in it: it sends a whole
/// request on to the owner itself (one hop for the request, not one per call it makes), and
/// one another node sent it is never sent on again, so two nodes that disagree for a moment
/// answer an error rather than pass it between them.
pub async fn here_only<F: std::future::Future>(calls: F) -> F::Output {
    HERE_ONLY.scope((), calls).await
}

/// Whether calls made now may be sent to another node.
pub(crate) fn may_forward() -> bool {
    HERE_ONLY.try_with(|()| ()).is_err()
}

/// Whether `error` means the session's tree is owned by another node (the activation could
/// not take its lease, or this node lost it).
pub(crate) fn owned_elsewhere(error: &Error) -> bool {
    matches!(
        error,
        Error::SessionUnavailable { .. }
            | Error::Store(
                crate::store::Error::LeaseHeld { .. } | crate::store::Error::LeaseLost { .. }
            )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_matches_itself_only() {
        let key = PeerKey::random();
        assert!(key.matches(key.as_str()));
        assert!(!key.matches(PeerKey::random().as_str()));
        assert!(!key.matches(""));
        assert_eq!(format!("{key:?}"), "PeerKey(..)");
    }

    #[test]
    fn a_failure_comes_back_as_the_same_error() {
        let session: SessionId = "s1".parse().unwrap_or_else(|_| unreachable!());
        let errors = [
            Error::AlreadyRunning(session.clone()),
            Error::NotResumable {
                session: session.clone(),
                status: Status::Completed,
            },
            Error::AgentMismatch {
                session: session.clone(),
                actual: "a".into(),
                requested: "b".into(),
            },
        ];
        for error in errors {
            let failure: PeerFailure = serde_json::from_value(
                serde_json::to_value(PeerFailure::of(&error)).unwrap_or_default(),
            )
            .unwrap_or_else(|_| unreachable!());
            let back = failure.into_error(&session, Some("b"), "http://owner");
            assert_eq!(back.to_string(), error.to_string());
            assert_eq!(back.code(), error.code());
        }
    }
}
