//! Why the host could not deliver a message.

/// Why a message could not be handled by its actor. Handed to
/// [`VirtualActor::reject`](crate::VirtualActor::reject) together with the message, so the
/// behaviour can answer its caller with a typed error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The actor's state could not be loaded (a storage error, a corrupt snapshot, a panic).
    #[error("actor {key} could not be activated: {reason}")]
    ActivationFailed {
        /// The key, rendered.
        key: String,
        /// What went wrong.
        reason: String,
    },
    /// The actor crashed too often within the supervision window and is marked failed.
    #[error("actor {key} failed after {crashes} crashes within {window_ms} ms: {last_panic}")]
    Failed {
        /// The key, rendered.
        key: String,
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
