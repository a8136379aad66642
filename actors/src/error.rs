//! Why the host could not deliver a message.

use std::sync::Arc;

use crate::VirtualActor;

/// The [`Error`] of a host of `A`: its key and its activation error, as the behaviour typed
/// them.
pub type HostError<A> = Error<<A as VirtualActor>::Key, <A as VirtualActor>::Error>;

/// Why a message could not be handled by its actor. Handed to
/// [`VirtualActor::reject`](crate::VirtualActor::reject) together with the message, so the
/// behaviour can answer its caller with a typed error. `K` is the actor's key and `E` its
/// activation error ([`HostError`] names them for a behaviour): both are kept as the
/// behaviour gave them, so a caller can act on what went wrong (another node serves the key,
/// say) without reading it back out of a message.
#[derive(Debug, thiserror::Error)]
pub enum Error<K, E> {
    /// [`VirtualActor::activate`](crate::VirtualActor::activate) returned an error (a storage
    /// error, a corrupt snapshot, a key served elsewhere). Shared: every message that waited
    /// for the activation is rejected with it, and a failed key keeps it.
    #[error("actor {key} could not be activated: {error}")]
    ActivationFailed {
        /// The key.
        key: K,
        /// What the behaviour answered.
        error: Arc<E>,
    },
    /// [`VirtualActor::activate`](crate::VirtualActor::activate) panicked, or the actor has no
    /// state to handle the message with.
    #[error("actor {key} could not be activated: {panic}")]
    ActivationPanicked {
        /// The key.
        key: K,
        /// The message of the panic.
        panic: String,
    },
    /// The actor crashed too often within the supervision window and is marked failed.
    #[error("actor {key} failed after {crashes} crashes within {window_ms} ms: {last_panic}")]
    Failed {
        /// The key.
        key: K,
        /// Crashes counted within the window.
        crashes: u32,
        /// The supervision window.
        window_ms: u64,
        /// The message of the last panic.
        last_panic: String,
    },
    /// The host is shutting down and accepts no more messages.
    #[error("the actor host is shut down")]
    ShutDown,
}

// By hand: a derived `Clone` would ask `E: Clone`, which the shared error does not need.
impl<K: Clone, E> Clone for Error<K, E> {
    fn clone(&self) -> Self {
        match self {
            Error::ActivationFailed { key, error } => Error::ActivationFailed {
                key: key.clone(),
                error: Arc::clone(error),
            },
            Error::ActivationPanicked { key, panic } => Error::ActivationPanicked {
                key: key.clone(),
                panic: panic.clone(),
            },
            Error::Failed {
                key,
                crashes,
                window_ms,
                last_panic,
            } => Error::Failed {
                key: key.clone(),
                crashes: *crashes,
                window_ms: *window_ms,
                last_panic: last_panic.clone(),
            },
            Error::ShutDown => Error::ShutDown,
        }
    }
}

impl<K, E> Error<K, E> {
    /// The key the message was for (`None` for [`Error::ShutDown`]).
    pub fn key(&self) -> Option<&K> {
        match self {
            Error::ActivationFailed { key, .. }
            | Error::ActivationPanicked { key, .. }
            | Error::Failed { key, .. } => Some(key),
            Error::ShutDown => None,
        }
    }

    /// What the behaviour's activation answered, if that is why.
    pub fn activation_error(&self) -> Option<&E> {
        match self {
            Error::ActivationFailed { error, .. } => Some(error),
            _ => None,
        }
    }
}
