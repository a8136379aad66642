//! What a panic says: the text of a caught panic's payload, for a log line or an error
//! message. A tool handler, a model adapter, a skill provider or a hook that panics is caught
//! where it runs, and this is what is kept of it.

/// The text a panic carries, for a log line or an error message.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with a non-string payload".into())
}
