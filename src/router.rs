//! The ownership router: which session owns a call submitted against a root. It runs on the
//! submitter's own task, with two or three keyed reads (the root's lineage, the ownership
//! entry, and for a root's own call its pending entry), so its cost does not grow with the
//! number of calls pending under the root, and it is no queue every submit waits in.

use crate::error::Error;
use crate::ids::SessionId;
use crate::remote::Owner;
use crate::schema;
use crate::shared::Shared;
use crate::submit::{self, SubmitOutcome};

/// Who owns call `call` under `root` (a session of this runtime, or a remote child's tree),
/// or the outcome to answer at once: the root must be a root (a sub-agent's id is
/// `invalid_request`), and a call that is not pending is answered from its tombstone.
pub(crate) async fn owner(
    shared: &Shared,
    root: &SessionId,
    call: &str,
) -> Result<Result<Owner, SubmitOutcome>, Error> {
    let store = shared.store.as_ref();
    let Some(lineage) = schema::load_lineage(store, root).await? else {
        return Ok(Err(SubmitOutcome::UnknownToolCall));
    };
    if lineage.parent.is_some() {
        return Ok(Err(SubmitOutcome::InvalidRequest {
            reason: format!(
                "{root} is a sub-agent session; submit against its root session {}",
                lineage.root
            ),
        }));
    }
    if let Some(owner) = schema::owner(store, root, call).await? {
        return Ok(Ok(owner));
    }
    // A root's own calls have no ownership entry: their pending entry is the proof.
    if schema::has_pending(store, root, call).await? {
        return Ok(Ok(Owner::Local(root.clone())));
    }
    let outcome = settled_outcome(shared, root, call).await?;
    if outcome == SubmitOutcome::UnknownToolCall {
        tracing::warn!(session = %root, tool_call_id = %crate::Untrusted(&call), "client_tool.submit_unknown");
    }
    Ok(Err(outcome))
}

/// The answer for a call of `root` that is not pending (anymore), by its tombstone.
pub(crate) async fn settled_outcome(
    shared: &Shared,
    root: &SessionId,
    call: &str,
) -> Result<SubmitOutcome, Error> {
    let completed_at = schema::tombstone(shared.store.as_ref(), root, call).await?;
    let now = shared.clock.now_ms();
    Ok(submit::settled(
        completed_at,
        now,
        shared.tombstone_retention_ms,
    ))
}
