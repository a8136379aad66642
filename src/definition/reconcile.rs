//! What becomes of a server call a crash cut while it ran ([`OnCut`]), how its effect is
//! settled ([`Reconciled`], by a person or by the tool's [`ReconcileCheck`]), and the key the
//! effect can be looked up by ([`idempotency_key`]).
//!
//! A dispatched call without a result may or may not have taken effect. By default it gets a
//! `tool_durability_error` result the model reads (unless its tool is `safe_to_retry`). A tool
//! with [`OnCut::Reconcile`] instead raises a `reconcile` call that waits like an approval —
//! in the inbox, answered through the submit contract, with a deadline — and is answered
//! [`Reconciled::Happened`] (with the result the effect had), [`Reconciled::DidNotHappen`]
//! (the tool runs once more) or [`Reconciled::Failed`]. A tool that can ask the system it acts
//! on (by the call's idempotency key) settles it itself first.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::types::ids::SessionId;

/// What becomes of a call of the tool that a crash cut while it ran (it was dispatched, and no
/// result was recorded). A `safe_to_retry` tool is simply run again, whatever this says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnCut {
    /// The call's result is a `tool_durability_error` the model can act on (the default).
    #[default]
    DurabilityError,
    /// The run waits on a `reconcile` call, answered by a person or settled by the tool's
    /// check ([`ToolDefinition::reconcile_with`](crate::ToolDefinition::reconcile_with)).
    Reconcile,
}

/// Whether a cut call's effect happened: a person's answer to a `reconcile` call
/// ([`Submit::reconcile`](crate::Submit::reconcile)), or a tool's check.
#[derive(Clone, Debug, PartialEq)]
pub enum Reconciled {
    /// It happened, and this is what the tool would have returned (checked against the
    /// tool's output schema, if it has one): the call's result. Nothing runs.
    Happened(Value),
    /// It did not happen: the tool runs once more, with the same input and idempotency key.
    DidNotHappen,
    /// It was attempted and failed: the call's result is this error. Nothing runs.
    Failed(String),
}

/// Settles a cut call by asking the system the tool acts on: given the call's input and its
/// idempotency key, `Some` says what became of the effect, `None` that it cannot tell (a
/// person is then asked). Every `Fn(Value, String) -> impl Future<Output = Option<Reconciled>>`
/// closure implements it.
pub trait ReconcileCheck: Send + Sync + 'static {
    /// Looks the call's effect up.
    fn check(
        &self,
        input: Value,
        idempotency_key: String,
    ) -> BoxFuture<'static, Option<Reconciled>>;
}

impl<F, Fut> ReconcileCheck for F
where
    F: Fn(Value, String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Option<Reconciled>> + Send + 'static,
{
    fn check(
        &self,
        input: Value,
        idempotency_key: String,
    ) -> BoxFuture<'static, Option<Reconciled>> {
        Box::pin(self(input, idempotency_key))
    }
}

/// A tool's check, as its definition holds it.
#[derive(Clone)]
pub(crate) struct CheckFn(pub(crate) Arc<dyn ReconcileCheck>);

impl fmt::Debug for CheckFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<reconcile check>")
    }
}

/// The idempotency key of call `call_id` of the model reply recorded as message `reply_seq`
/// of `session`: 32 hex digits, the same whenever the call runs (after a crash, after a
/// reconciliation, on any node), and different for every other call, also one that reuses
/// the id in a later reply.
pub(crate) fn idempotency_key(session: &SessionId, reply_seq: u64, call_id: &str) -> String {
    let mut hasher = Sha256::new();
    for part in [session.as_str().as_bytes(), call_id.as_bytes()] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher.update(reply_seq.to_be_bytes());
    hasher.finalize()[..16]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::idempotency_key;

    #[test]
    fn an_idempotency_key_names_one_call_of_one_reply_of_one_session() -> Result<(), String> {
        let session = "s1".parse().map_err(|error| format!("{error:?}"))?;
        let other = "s2".parse().map_err(|error| format!("{error:?}"))?;
        let key = idempotency_key(&session, 3, "tc-1");
        assert_eq!(key.len(), 32);
        assert_eq!(key, idempotency_key(&session, 3, "tc-1"));
        assert_ne!(key, idempotency_key(&session, 5, "tc-1"));
        assert_ne!(key, idempotency_key(&session, 3, "tc-2"));
        assert_ne!(key, idempotency_key(&other, 3, "tc-1"));
        Ok(())
    }
}
