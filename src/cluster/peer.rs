//! Peers: any node answers for any session. On a store several nodes share
//! ([`PgStore`](crate::PgStore)), each tree of sessions is owned by one live node at a time
//! (its lease, [`crate::cluster::leases`]). Every [`Runtime`](crate::Runtime) call that acts on a
//! session is routed once, before anything is activated: by the tree's lease, to this node
//! (the call runs here) or to the owner, where a [`Peers`] transport
//! ([`RuntimeBuilder::peers`](crate::RuntimeBuilder::peers)) sends it as a [`PeerCall`] and
//! the owner's [`PeerAnswer`] is the call's own. The owner serves it with
//! [`Runtime::serve_peer`](crate::Runtime::serve_peer), here and never further, so two nodes
//! that disagree for a moment answer an error rather than pass a call between them. A call
//! routed here that finds another node took the tree meanwhile (its activation is refused
//! with the store's `LeaseHeld`) is routed once more. A session's stream is followed where
//! it runs ([`Peers::follow`]). `dormant_server::HttpPeers` speaks it over HTTP
//! (`POST /peer`).
//!
//! A peer proves it is one with the owner's [`PeerKey`](crate::cluster::leases::PeerKey): a random key each node makes when its
//! store opens, kept beside its address in the store and read from there with the owner
//! ([`Leases::owner`](crate::cluster::leases::Leases::owner)). Whoever can read the store can call the
//! nodes as a peer; whoever can write it could do anything anyway.

use std::fmt;

use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

use crate::cluster::leases::LeaseOwner;
use crate::error::Error;
use crate::remote::RemoteError;
use crate::session::submit::{Submit, SubmitOutcome};
use crate::session::{RunOutcome, RunStarted, Status};
use crate::types::ids::SessionId;
use crate::types::stream::{Chunk, Delta};

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
    /// [`Runtime::submit_tool_result`](crate::Runtime::submit_tool_result), sent as its
    /// envelope ([`Submit::to_json`], read back with [`Submit::from_json`]).
    Submit {
        /// The answer.
        #[serde(rename = "envelope", with = "envelope")]
        submit: Submit,
    },
    /// [`Runtime::submit_and_resume`](crate::Runtime::submit_and_resume): a submit, and once
    /// it is accepted a resume of its session, in one call.
    SubmitAndResume {
        /// The answer.
        #[serde(rename = "envelope", with = "envelope")]
        submit: Submit,
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
    /// [`Runtime::wait_settled`](crate::Runtime::wait_settled) (`tree`:
    /// [`Runtime::wait_tree_settled`](crate::Runtime::wait_tree_settled)): answered once the
    /// session (its tree) is settled on the owner.
    WaitSettled {
        /// The session.
        session: SessionId,
        /// Its whole tree.
        tree: bool,
    },
    /// [`Runtime::is_settled`](crate::Runtime::is_settled): answered at once.
    IsSettled {
        /// The session.
        session: SessionId,
    },
}

impl PeerCall {
    /// The session whose tree's owner serves the call (`None`: a submit that names no valid
    /// session, which is answered wherever it is made).
    pub fn session(&self) -> Option<SessionId> {
        match self {
            PeerCall::Execute { session, .. }
            | PeerCall::Start { session, .. }
            | PeerCall::Resume { session, .. }
            | PeerCall::Stop { session, .. }
            | PeerCall::WaitSettled { session, .. }
            | PeerCall::IsSettled { session } => Some(session.clone()),
            PeerCall::Submit { submit } | PeerCall::SubmitAndResume { submit } => {
                submit.session_id.parse().ok()
            }
        }
    }

    /// The agent the call names (to give an `agent_mismatch` back whole).
    pub fn agent(&self) -> Option<&str> {
        match self {
            PeerCall::Execute { agent, .. } | PeerCall::Start { agent, .. } => Some(agent),
            _ => None,
        }
    }
}

/// A [`Submit`] on the wire: its JSON envelope, as a client sends it.
mod envelope {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::session::submit::Submit;

    pub(super) fn serialize<S: Serializer>(submit: &Submit, to: S) -> Result<S::Ok, S::Error> {
        submit.to_json().serialize(to)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<Submit, D::Error> {
        let envelope = serde_json::Value::deserialize(from)?;
        Submit::from_json(&envelope).map_err(serde::de::Error::custom)
    }
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
    /// A submit's outcome and, for one accepted, how its resume went.
    SubmittedAndResumed(SubmitResumed),
    /// A stop is done.
    Stopped,
    /// Whether the session is settled (for a wait: it is now).
    Settled {
        /// Settled.
        settled: bool,
    },
    /// The call failed on the owner.
    Failed(PeerFailure),
}

/// What [`Runtime::submit_and_resume`](crate::Runtime::submit_and_resume) answers: the
/// submit's outcome and, once the call has its answer, its session's resume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubmitResumed {
    /// The submit's outcome.
    pub outcome: SubmitOutcome,
    /// The resume, tried once the call has its answer (this one, accepted, or an earlier
    /// one: `already_completed`): started (or found calls still waiting), or refused, as the
    /// node that ran it said
    /// ([`PeerFailure::into_error`] gives the error back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<Result<RunStarted, PeerFailure>>,
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
            ("run_cut", _) => Error::RunCut {
                session,
                reason: self.message,
            },
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
            "shut_down" | "store_error" | "remote_unavailable" | "owner_unreachable" => 503,
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

/// One event of a session's stream, as the node that runs it sends it to a peer that follows
/// it ([`Peers::follow`]); on a [`Peers::submit_and_follow`], the answer before them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum PeerEvent {
    /// A stored chunk.
    Chunk(Chunk),
    /// A live delta of a model call.
    Delta(Delta),
    /// The stream failed on the owner; nothing follows.
    Failed(PeerFailure),
    /// The session settled with this many chunks, every one of them sent before; nothing
    /// follows. Sent only on a follow that asked to end there
    /// ([`Peers::follow_to_settle`]).
    Settled {
        /// The session's chunk count once settled.
        chunks: u64,
    },
    /// The answer of a [`Peers::submit_and_follow`]: its first event, before the resumed
    /// run's chunks.
    SubmittedAndResumed(SubmitResumed),
}

/// A session's stream from the node that runs it.
pub type PeerEvents = BoxStream<'static, Result<PeerEvent, RemoteError>>;

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

    /// Follows `session`'s stream on `owner` from sequence number `from`: its stored chunks,
    /// then the live ones and the deltas between them, as
    /// [`Runtime::follow_live`](crate::Runtime::follow_live) gives them there (the owner
    /// serves it with [`Runtime::serve_peer_follow`](crate::Runtime::serve_peer_follow)).
    /// `None`: this transport does not follow, and the session is followed here, from the
    /// store (the default).
    ///
    /// # Errors
    /// As [`Peers::call`].
    async fn follow(
        &self,
        _owner: &LeaseOwner,
        _session: &SessionId,
        _from: u64,
    ) -> Result<Option<PeerEvents>, RemoteError> {
        Ok(None)
    }

    /// [`Peers::follow`], up to the session's next settle: the owner ends the stream with
    /// [`PeerEvent::Settled`] once the session settles and every chunk before it was sent
    /// (it serves it with
    /// [`Runtime::serve_peer_follow_to_settle`](crate::Runtime::serve_peer_follow_to_settle)).
    /// A follower that must end there learns it on the stream it reads, with no call of its
    /// own to wait for the settle. `None` (the default): this transport does not, and the
    /// follower waits for the settle with a [`PeerCall::WaitSettled`] beside
    /// [`Peers::follow`].
    ///
    /// # Errors
    /// As [`Peers::call`].
    async fn follow_to_settle(
        &self,
        _owner: &LeaseOwner,
        _session: &SessionId,
        _from: u64,
    ) -> Result<Option<PeerEvents>, RemoteError> {
        Ok(None)
    }

    /// [`PeerCall::SubmitAndResume`] and the follow of the run it resumes, in one call: the
    /// owner's first event is its answer ([`PeerEvent::SubmittedAndResumed`], or
    /// [`PeerEvent::Failed`]); for a resume that started a run, [`Peers::follow_to_settle`]
    /// from the resume's first chunk follows (the owner serves it with
    /// [`Runtime::serve_peer_submit_follow`](crate::Runtime::serve_peer_submit_follow)). One
    /// round trip to the owner where the two calls take two. `None` (the default): this
    /// transport (or the owner) does not, and the runtime makes the two calls.
    ///
    /// # Errors
    /// As [`Peers::call`].
    async fn submit_and_follow(
        &self,
        _owner: &LeaseOwner,
        _submit: &Submit,
    ) -> Result<Option<PeerEvents>, RemoteError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Every call, answer and event reads back as it was sent; a submit travels as the
    /// envelope a client sends (the wire form of the calls before routing).
    #[test]
    fn calls_answers_and_events_cross_the_wire_unchanged() -> Result<(), serde_json::Error> {
        let session: SessionId = "s1".parse().unwrap_or_else(|_| unreachable!());
        let submit = Submit::result("s1", "tc-1", serde_json::json!({ "ok": true }));
        let calls = [
            PeerCall::Submit {
                submit: submit.clone(),
            },
            PeerCall::WaitSettled {
                session: session.clone(),
                tree: true,
            },
            PeerCall::IsSettled {
                session: session.clone(),
            },
        ];
        for call in calls {
            let wire = serde_json::to_value(&call)?;
            assert_eq!(serde_json::from_value::<PeerCall>(wire)?, call);
        }
        let wire = serde_json::to_value(PeerCall::Submit {
            submit: submit.clone(),
        })?;
        assert_eq!(wire["call"], "submit");
        assert_eq!(wire["envelope"], submit.to_json());
        for answer in [
            PeerAnswer::Settled { settled: false },
            PeerAnswer::Stopped,
            PeerAnswer::Failed(PeerFailure::of(&Error::ShutDown)),
        ] {
            let wire = serde_json::to_value(&answer)?;
            assert_eq!(serde_json::from_value::<PeerAnswer>(wire)?, answer);
        }
        let answered = SubmitResumed {
            outcome: SubmitOutcome::Accepted,
            resumed: Some(Err(PeerFailure::of(&Error::AlreadyRunning(
                session.clone(),
            )))),
        };
        for event in [
            PeerEvent::Failed(PeerFailure::of(&Error::Crashed(session))),
            PeerEvent::Settled { chunks: 7 },
            PeerEvent::SubmittedAndResumed(answered),
        ] {
            let wire = serde_json::to_vec(&event)?;
            assert_eq!(serde_json::from_slice::<PeerEvent>(&wire)?, event);
        }
        Ok(())
    }
}
