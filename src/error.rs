//! What the runtime's calls fail with: [`Error`]. Building a runtime fails with
//! [`BuildError`](crate::BuildError), a read of stored state with
//! [`ReadError`](crate::ReadError) (four of these variants, converting into them).

use crate::definition::DefinitionError;
use crate::store::{self, schema};
use crate::types::ids::SessionId;

/// What went wrong in a call to the [`Runtime`](crate::Runtime) that changes a session, routes
/// to another node or defines an agent. Each variant is one some public call can return
/// (the one exception, [`Error::PeerRefused`], says so); what only
/// [`RuntimeBuilder::build`](crate::RuntimeBuilder::build) can meet is a
/// [`BuildError`](crate::BuildError), and the reads answer a
/// [`ReadError`](crate::ReadError), which converts into this.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No session has this id.
    #[error("unknown session {0}")]
    UnknownSession(SessionId),
    /// No agent has this name.
    #[error("unknown agent {0}")]
    UnknownAgent(String),
    /// The session exists and runs another agent.
    #[error("session {session} runs agent {actual}, not {requested}")]
    AgentMismatch {
        /// The session.
        session: SessionId,
        /// The agent it runs.
        actual: String,
        /// The agent asked for.
        requested: String,
    },
    /// The session is a sub-agent's, whose turns only its parent starts.
    #[error("session {session} is a sub-agent of {parent}: only its parent starts its turns")]
    SubAgentSession {
        /// The sub-agent's session.
        session: SessionId,
        /// Its parent.
        parent: SessionId,
    },
    /// The session exists already ([`Runtime::start_new`](crate::Runtime::start_new)).
    #[error("session {0} exists already")]
    SessionExists(SessionId),
    /// A run of the session is in progress.
    #[error("session {0} is already running")]
    AlreadyRunning(SessionId),
    /// The session was aborted; it never runs again.
    #[error("session {0} was aborted")]
    Aborted(SessionId),
    /// There is nothing to resume: the last run completed or failed.
    #[error("session {session} has nothing to resume: its last run is {status}")]
    NotResumable {
        /// The session.
        session: SessionId,
        /// Its status.
        status: crate::types::record::Status,
    },
    /// A definition was refused.
    #[error("invalid definition: {0}")]
    InvalidDefinition(DefinitionError),
    /// The store failed; nothing of the operation was acknowledged.
    #[error("store: {0}")]
    Store(store::Error),
    /// A stored value could not be read (corrupt, or written by a newer version). A store that
    /// failed while reading is [`Error::Store`], never this.
    #[error(transparent)]
    Schema(schema::Error),
    /// The session's actor crashed too often and is marked failed, or could not start.
    #[error("session {session} is unavailable: {reason}")]
    SessionUnavailable {
        /// The session.
        session: SessionId,
        /// Why.
        reason: String,
    },
    /// The session's actor went away before answering (it crashed while handling the call).
    #[error("session {0} crashed while handling the request")]
    Crashed(SessionId),
    /// The run this call began (its message is in the session) was cut when this node lost
    /// the session's lease to another (PostgreSQL store): the session's next owner closes it
    /// as interrupted. Sending the call again would run its message a second time; resume the
    /// session instead.
    #[error("session {session}: its run began and was cut ({reason}); resume the session, do not send the call again")]
    RunCut {
        /// The session.
        session: SessionId,
        /// Why.
        reason: String,
    },
    /// The runtime is shut down: every method of it and of its clones answers this from the
    /// moment `shutdown` begins.
    #[error("the runtime is shut down")]
    ShutDown,
    /// A call owned by a remote sub-agent could not be forwarded to its server: nothing was
    /// stored on either side. Retryable when [`RemoteError::is_retryable`](crate::remote::RemoteError::is_retryable)
    /// says so (the server did not answer): the same submit is accepted once it is back.
    #[error(transparent)]
    Remote(crate::remote::RemoteError),
    /// The session's tree is owned by another node of the cluster, which did not answer the
    /// call sent to it ([`crate::cluster::peer`]): it may be restarting, or dead until its lease lapses.
    /// Nothing was written here; retryable.
    #[error(
        "session {session} is owned by node {node} at {endpoint}, which did not answer: {reason}"
    )]
    OwnerUnreachable {
        /// The session.
        session: SessionId,
        /// The node that owns its tree.
        node: String,
        /// Where it was called.
        endpoint: String,
        /// What failed.
        reason: String,
    },
    /// A call from a peer ([`Runtime::serve_peer`](crate::Runtime::serve_peer)) did not carry
    /// this node's key, or this node takes no calls from peers (its store is its own). Only
    /// that hidden plumbing returns it (dormant-server's `POST /peer` answers it as 403); no
    /// call a daemon makes does. It stays here because `serve_peer` answers the other
    /// changing calls' errors too, and one variant does not earn a type of its own.
    #[error("refused: not a peer of this node (a wrong key, or a store only this node uses)")]
    PeerRefused,
    /// A page cursor ([`Runtime::inbox`](crate::Runtime::inbox)) this runtime did not make.
    #[error("{0} is not a cursor this runtime made")]
    BadCursor(String),
    /// A fork ([`Runtime::fork`](crate::Runtime::fork)) was refused (nothing written), or made
    /// and then could not go on ([`ForkError::ContinuationFailed`](crate::types::ForkError)).
    #[error("fork refused: {0}")]
    Fork(crate::types::ForkError),
}

// The wrapped errors are part of the message, so they are not also given as its `source`:
// an error reporter that prints the chain (anyhow's `{:#}`, say) would print each twice.
impl From<DefinitionError> for Error {
    fn from(error: DefinitionError) -> Self {
        Error::InvalidDefinition(error)
    }
}

impl From<crate::types::ForkError> for Error {
    fn from(error: crate::types::ForkError) -> Self {
        Error::Fork(error)
    }
}

impl From<store::Error> for Error {
    fn from(error: store::Error) -> Self {
        Error::Store(error)
    }
}

impl From<schema::Error> for Error {
    /// Keeps a failing store apart from a corrupt value: a daemon that maps codes to alerts
    /// must not report corruption for an I/O error or a closed store.
    fn from(error: schema::Error) -> Self {
        match error {
            schema::Error::Store(error) => Error::Store(error),
            other => Error::Schema(other),
        }
    }
}

impl Error {
    /// A stable snake_case code for the error.
    pub fn code(&self) -> &'static str {
        match self {
            Error::UnknownSession(_) => "unknown_session",
            Error::UnknownAgent(_) => "unknown_agent",
            Error::AgentMismatch { .. } => "agent_mismatch",
            Error::SubAgentSession { .. } => "sub_agent_session",
            Error::AlreadyRunning(_) => "already_running",
            Error::SessionExists(_) => "session_exists",
            Error::Aborted(_) => "aborted",
            Error::NotResumable { .. } => "not_resumable",
            Error::InvalidDefinition(_) => "invalid_definition",
            Error::Store(error) => store_code(error),
            Error::Schema(schema::Error::UnsupportedVersion { .. }) => "unsupported_version",
            Error::Schema(_) => "corrupt_snapshot",
            Error::SessionUnavailable { .. } => "session_unavailable",
            Error::Crashed(_) => "crashed",
            Error::RunCut { .. } => "run_cut",
            Error::ShutDown => "shut_down",
            Error::Remote(error) if error.is_retryable() => "remote_unavailable",
            Error::Remote(_) => "remote_error",
            Error::OwnerUnreachable { .. } => "owner_unreachable",
            Error::PeerRefused => "peer_refused",
            Error::BadCursor(_) => "invalid_cursor",
            Error::Fork(crate::types::ForkError::UnknownCheckpoint { .. }) => "unknown_checkpoint",
            Error::Fork(crate::types::ForkError::Compacted { .. }) => "checkpoint_compacted",
            Error::Fork(crate::types::ForkError::ContinuationFailed { .. }) => {
                "fork_continuation_failed"
            }
            Error::Fork(crate::types::ForkError::IdTaken(_)) => "session_exists",
            Error::Fork(_) => "fork_refused",
        }
    }
}

/// The code of a store failure, in [`Error::code`] and
/// [`BuildError::code`](crate::BuildError::code) alike.
pub(crate) fn store_code(error: &store::Error) -> &'static str {
    match error {
        store::Error::LeaseLost { .. } => "lease_lost",
        store::Error::LeaseHeld { .. } => "lease_held",
        store::Error::Damaged { .. } => "store_damaged",
        store::Error::ReadOnly { .. } => "store_read_only",
        _ => "store_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reporter that prints an error and then its chain of sources (anyhow's `{:#}` and
    /// `{:?}`) must not print the wrapped error a second time.
    #[test]
    fn a_wrapped_error_is_printed_once() {
        let errors = [
            Error::from(store::Error::Closed),
            Error::from(schema::Error::Store(store::Error::Closed)),
        ];
        for error in errors {
            assert!(std::error::Error::source(&error).is_none(), "{error}");
        }
        assert_eq!(
            Error::from(store::Error::Closed).to_string(),
            "store: store is closed"
        );
    }
}
