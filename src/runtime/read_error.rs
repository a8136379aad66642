//! What the runtime's reads can fail with: [`ReadError`], five of [`Error`]'s variants. A read
//! goes to the store and to no session's actor, no other node and no remote server, so none
//! of the refusals, crashes or cluster failures a changing call can meet is among them.

use crate::error::Error;
use crate::store::{self, schema};
use crate::types::ids::SessionId;

/// Why a read of the [`Runtime`](crate::Runtime) failed ([`Runtime::session`],
/// [`Runtime::status`], [`Runtime::messages`], [`Runtime::runs`], [`Runtime::run`],
/// [`Runtime::chunks`], [`Runtime::session_ids`], and the other reads of stored state).
/// Each variant is [`Error`]'s of the same name, with the same message and code, and
/// converts into it (`?` in a function that returns an `Error` needs nothing more).
///
/// [`Runtime::session`]: crate::Runtime::session
/// [`Runtime::status`]: crate::Runtime::status
/// [`Runtime::messages`]: crate::Runtime::messages
/// [`Runtime::runs`]: crate::Runtime::runs
/// [`Runtime::run`]: crate::Runtime::run
/// [`Runtime::chunks`]: crate::Runtime::chunks
/// [`Runtime::session_ids`]: crate::Runtime::session_ids
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// No session has this id.
    #[error("unknown session {0}")]
    UnknownSession(SessionId),
    /// The store failed.
    #[error("store: {0}")]
    Store(store::Error),
    /// A stored value could not be read (corrupt, or written by a newer version). A store that
    /// failed while reading is [`ReadError::Store`], never this.
    #[error(transparent)]
    Schema(schema::Error),
    /// The runtime is shut down: every read answers this from the moment `shutdown` begins.
    #[error("the runtime is shut down")]
    ShutDown,
    /// A page cursor ([`Runtime::inbox`](crate::Runtime::inbox)) this runtime did not make.
    #[error("{0} is not a cursor this runtime made")]
    BadCursor(String),
}

// As in `Error`: the wrapped errors are part of the message, so not also its `source`.
impl From<store::Error> for ReadError {
    fn from(error: store::Error) -> Self {
        ReadError::Store(error)
    }
}

impl From<schema::Error> for ReadError {
    /// Keeps a failing store apart from a corrupt value, as [`Error`] does.
    fn from(error: schema::Error) -> Self {
        match error {
            schema::Error::Store(error) => ReadError::Store(error),
            other => ReadError::Schema(other),
        }
    }
}

impl From<ReadError> for Error {
    fn from(error: ReadError) -> Self {
        match error {
            ReadError::UnknownSession(id) => Error::UnknownSession(id),
            ReadError::Store(error) => Error::Store(error),
            ReadError::Schema(error) => Error::Schema(error),
            ReadError::ShutDown => Error::ShutDown,
            ReadError::BadCursor(cursor) => Error::BadCursor(cursor),
        }
    }
}

impl ReadError {
    /// A stable snake_case code for the error: [`Error::code`] of the same error.
    pub fn code(&self) -> &'static str {
        match self {
            ReadError::UnknownSession(_) => "unknown_session",
            ReadError::Store(error) => crate::error::store_code(error),
            ReadError::Schema(schema::Error::UnsupportedVersion { .. }) => "unsupported_version",
            ReadError::Schema(_) => "corrupt_snapshot",
            ReadError::ShutDown => "shut_down",
            ReadError::BadCursor(_) => "invalid_cursor",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each read error is the call error of the same name: same message, same code.
    #[test]
    fn a_read_error_keeps_its_message_and_code_as_an_error() {
        let errors = [
            ReadError::UnknownSession(SessionId::generate()),
            ReadError::from(store::Error::Closed),
            ReadError::from(schema::Error::Store(store::Error::Closed)),
            ReadError::ShutDown,
        ];
        for error in errors {
            let (message, code) = (error.to_string(), error.code());
            assert!(std::error::Error::source(&error).is_none(), "{error}");
            let error = Error::from(error);
            assert_eq!(
                (error.to_string().as_str(), error.code()),
                (message.as_str(), code)
            );
        }
    }
}
