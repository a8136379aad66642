//! The ownership router: which session owns a call submitted against a root. It runs on the
//! submitter's own task, with three keyed reads (the root's lineage, the root's ownership
//! entries of the call, one prefix scan, and the root's own pending entry), so its cost does
//! not grow with the number of calls pending under the root, and it is no queue every submit
//! waits in.
//!
//! Several sessions of one tree may wait on calls with the same id (models number their calls
//! per conversation: a child's `tc-1` and its sibling's, or the root's own). Each is a
//! candidate, and the answer goes to exactly one: the session the submit names
//! (`owner_session_id`), else the call its approval id names (`{runId}::{call}` names the
//! owner's run), else the call that has waited longest among those still waiting (then by
//! owner id). So answering the same id twice at the root answers both, oldest first. Calls
//! still waiting always come before tombstones: a sibling's completed `tc-1` never makes a
//! waiting `tc-1` answer `already_completed`.
//!
//! Without a name or an approval id, the router hands back the candidates in that order, and
//! the caller offers the answer to each in turn while they answer `already_completed`: what
//! the router read may be stale (another submit for the same id committed meanwhile, or a
//! remote call was answered there and its entry here not rewritten yet), and the owner's own
//! actor is what decides.

use crate::engine::shared::Shared;
use crate::error::Error;
use crate::remote::Owner;
use crate::session::submit::{self, SubmitOutcome};
use crate::session::{PendingCall, Submission};
use crate::store::schema;
use crate::types::ids::SessionId;

/// What a submit says that may tell the owner of its call among several.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Hint<'a> {
    /// The session the submitter says made the call.
    pub(crate) owner: Option<&'a str>,
    /// An approval's `{runId}::{toolCallId}`.
    pub(crate) approval_id: Option<&'a str>,
}

impl<'a> Hint<'a> {
    /// What `submission` and the named owner say.
    pub(crate) fn of(submission: &'a Submission, owner: Option<&'a str>) -> Self {
        let approval_id = match submission {
            Submission::Approval { approval_id, .. } => Some(approval_id.as_str()),
            Submission::Question { answer, .. } => match answer.as_ref() {
                Submission::Approval { approval_id, .. } => Some(approval_id.as_str()),
                _ => None,
            },
            _ => None,
        };
        Self { owner, approval_id }
    }
}

/// One session (or remote tree) that may own the call, with what the router knows of it.
struct Candidate {
    owner: Owner,
    /// A local owner's pending entry (read only when there are several candidates).
    pending: Option<PendingCall>,
}

impl Candidate {
    /// The session the candidate is known by to a submitter (`GET /status` lists a remote
    /// call with the remote session that made it).
    fn named(&self, name: &str) -> bool {
        match &self.owner {
            Owner::Local(session) => session.as_str() == name,
            Owner::Remote(remote) => {
                remote.call.owner == name || remote.remote_root.as_str() == name
            }
        }
    }

    /// Whether the call still waits for an answer at `now`.
    fn waiting(&self, now: u64) -> bool {
        match &self.owner {
            Owner::Local(_) => self
                .pending
                .as_ref()
                .is_some_and(|call| call.is_waiting(now)),
            Owner::Remote(remote) => remote.call.waiting,
        }
    }

    /// When the call became pending (a remote's by its own clock).
    fn requested_at(&self) -> u64 {
        match &self.owner {
            Owner::Local(_) => self
                .pending
                .as_ref()
                .map_or(u64::MAX, |call| call.requested_at_ms),
            Owner::Remote(remote) => remote.call.requested_at_ms,
        }
    }

    /// The approval id an answer to the call must carry, for an approval.
    fn approval_id(&self) -> Option<String> {
        match &self.owner {
            Owner::Local(_) => self
                .pending
                .as_ref()
                .filter(|call| call.kind == crate::session::PendingKind::Approval)
                .map(PendingCall::approval_id),
            Owner::Remote(remote) => remote.call.approval_id.clone(),
        }
    }
}

/// Who may own call `call` under `root` (sessions of this runtime, or remote children's
/// trees), in the order an answer is offered to them (never empty), or the outcome to answer
/// at once: the root must be a root (a sub-agent's id is `invalid_request`, and so is a
/// remote sub-agent's unless the answer comes `via_root`, its root on its parent's server),
/// a named owner must be one of the call's owners, and a call that is not pending is answered
/// from its tombstone.
pub(crate) async fn owners(
    shared: &Shared,
    root: &SessionId,
    call: &str,
    hint: Hint<'_>,
    via_root: Option<&SessionId>,
) -> Result<Result<Vec<Owner>, SubmitOutcome>, Error> {
    let store = shared.store.as_ref();
    let Some(lineage) = shared.lineages.of(store, root).await? else {
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
    if let Some(outside) = &lineage.remote_parent {
        if via_root != Some(&outside.root) {
            return Ok(Err(SubmitOutcome::InvalidRequest {
                reason: format!(
                    "{root} is a remote sub-agent of {} on another server; submit against its root session {} there",
                    outside.parent, outside.root
                ),
            }));
        }
    }
    let mut candidates = Vec::new();
    // A root's own calls have no ownership entry: their pending entry is the proof. The root
    // sorts before every session under it, as its id is a prefix of theirs.
    if let Some(pending) = schema::pending_call(store, root, call).await? {
        candidates.push(Candidate {
            owner: Owner::Local(root.clone()),
            pending: Some(pending),
        });
    }
    for owner in schema::owners(store, root, call).await? {
        candidates.push(Candidate {
            owner,
            pending: None,
        });
    }
    if candidates.is_empty() {
        // Written before ownership entries were kept per owner, and not moved yet.
        if let Some(owner) = schema::legacy_owner(store, root, call).await? {
            candidates.push(Candidate {
                owner,
                pending: None,
            });
        }
    }
    if let Some(name) = hint.owner {
        candidates.retain(|candidate| candidate.named(name));
        if candidates.is_empty() {
            tracing::warn!(session = %root, tool_call_id = %crate::types::Untrusted(&call), "client_tool.submit_unknown_owner");
            return Ok(Err(SubmitOutcome::UnknownToolCall));
        }
    }
    if candidates.len() > 1 {
        return Ok(Ok(order(shared, call, candidates, hint).await?));
    }
    if let Some(only) = candidates.pop() {
        return Ok(Ok(vec![only.owner]));
    }
    let outcome = settled_outcome(shared, root, call).await?;
    if outcome == SubmitOutcome::UnknownToolCall {
        tracing::warn!(session = %root, tool_call_id = %crate::types::Untrusted(&call), "client_tool.submit_unknown");
    }
    Ok(Err(outcome))
}

/// The order in which several candidates are offered an answer: only the call its approval id
/// names, if one does; else those still waiting, earliest requested first (then by owner
/// id), then the others likewise (whose owners answer why they take no answer).
async fn order(
    shared: &Shared,
    call: &str,
    mut candidates: Vec<Candidate>,
    hint: Hint<'_>,
) -> Result<Vec<Owner>, Error> {
    let store = shared.store.as_ref();
    for candidate in &mut candidates {
        if let (Owner::Local(session), None) = (&candidate.owner, &candidate.pending) {
            candidate.pending = schema::pending_call(store, session, call).await?;
        }
    }
    if let Some(approval_id) = hint.approval_id {
        if let Some(index) = candidates
            .iter()
            .position(|candidate| candidate.approval_id().as_deref() == Some(approval_id))
        {
            return Ok(vec![candidates.swap_remove(index).owner]);
        }
    }
    let now = shared.clock.now_ms();
    // A stable sort: among equal times, the key order (the root, then owners by id) decides.
    candidates.sort_by_key(|candidate| (!candidate.waiting(now), candidate.requested_at()));
    Ok(candidates
        .into_iter()
        .map(|candidate| candidate.owner)
        .collect())
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
