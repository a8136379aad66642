//! What building a runtime can fail with: [`BuildError`], apart from [`Error`](crate::Error),
//! what the built runtime's calls fail with, so that neither holds a variant its caller can
//! never see.

use crate::definition::DefinitionError;
use crate::store;

/// Why [`RuntimeBuilder::build`](crate::RuntimeBuilder::build) refused to build a runtime.
/// Nothing was started; the store given, if any, is free again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A runtime setting is out of range, or a store several nodes share was given without
    /// its leases.
    #[error("invalid runtime setting {setting}: {reason}")]
    InvalidConfig {
        /// The builder method's name.
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// Another runtime of this process uses this store: one store has one runtime (a second
    /// would accept the same answers and run the same tools again). Shut the other down, or
    /// drop its last handle, first.
    #[error("another runtime of this process already uses this store; shut it down before building a new one on it")]
    StoreInUse,
    /// `build` was called outside a tokio runtime; the runtime's actors run on tokio.
    #[error("a runtime must be built inside a tokio runtime (for example under #[tokio::main])")]
    NoTokioRuntime,
    /// The agent set was refused: a duplicate name, or a sub-agent tool (or companion) naming
    /// an agent that is not in the set.
    #[error("invalid definition: {0}")]
    InvalidDefinition(DefinitionError),
    /// The default temporary store could not be opened.
    #[error("store: {0}")]
    Store(store::Error),
    /// The store was closed by the shutdown of an earlier runtime: a closed store serves no
    /// new one. (The message is the one the calls of a shut-down runtime answer.)
    #[error("the runtime is shut down")]
    StoreClosed,
}

// As in `Error`: the wrapped errors are part of the message, so not also its `source`.
impl From<DefinitionError> for BuildError {
    fn from(error: DefinitionError) -> Self {
        BuildError::InvalidDefinition(error)
    }
}

impl From<store::Error> for BuildError {
    fn from(error: store::Error) -> Self {
        BuildError::Store(error)
    }
}

impl BuildError {
    /// A stable snake_case code for the error, the one [`Error::code`](crate::Error::code)
    /// gave it when `build` returned an `Error`.
    pub fn code(&self) -> &'static str {
        match self {
            BuildError::InvalidConfig { .. } => "invalid_config",
            BuildError::StoreInUse => "store_in_use",
            BuildError::NoTokioRuntime => "no_tokio_runtime",
            BuildError::InvalidDefinition(_) => "invalid_definition",
            BuildError::Store(error) => crate::error::store_code(error),
            BuildError::StoreClosed => "shut_down",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reporter that prints the chain of sources must not print the wrapped error twice.
    #[test]
    fn a_wrapped_error_is_printed_once() {
        let error = BuildError::from(store::Error::Closed);
        assert!(std::error::Error::source(&error).is_none(), "{error}");
        assert_eq!(error.to_string(), "store: store is closed");
        assert_eq!(error.code(), "store_error");
    }
}
