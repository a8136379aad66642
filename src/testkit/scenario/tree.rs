//! The sessions of a tree: a root and every sub-agent session under it. The expectations that
//! look at "the session tree" (`pending`, `tool_results`), the `approval_id: "auto"` lookup
//! and the settling after each op all go through [`sessions`], so sub-agents join them
//! without further changes.

use crate::error::Error;
use crate::runtime::Runtime;
use crate::types::ids::SessionId;

/// The tree `session` belongs to: its root first, then the other sessions whose root it is,
/// in id order.
///
/// # Errors
/// [`Error::UnknownSession`] if `session` does not exist, or a store failure.
pub(crate) async fn sessions(
    runtime: &Runtime,
    session: &SessionId,
) -> Result<Vec<SessionId>, Error> {
    let root = runtime.session(session).await?.root;
    let mut tree = vec![root.clone()];
    for other in runtime.session_ids().await? {
        if other != root && runtime.session(&other).await?.root == root {
            tree.push(other);
        }
    }
    Ok(tree)
}

/// Every call of the tree that still awaits an answer at `now` (neither answered nor
/// expired), in id order.
///
/// # Errors
/// As [`sessions`].
pub(crate) async fn waiting_calls(
    runtime: &Runtime,
    session: &SessionId,
    now: u64,
) -> Result<Vec<String>, Error> {
    let mut calls = std::collections::BTreeSet::new();
    for member in sessions(runtime, session).await? {
        for call in runtime.pending(&member).await? {
            if call.is_waiting(now) {
                calls.insert(call.tool_call_id);
            }
        }
    }
    Ok(calls.into_iter().collect())
}

/// The remote children of `session`'s tree: the roots on `remote` started by a sub-agent call
/// of one of its members (ids are concatenations: `{member}-sub-{call}`), found by id rather
/// than by the members' child entries, which go once a child's result is adopted.
///
/// # Errors
/// As [`sessions`].
pub(crate) async fn remote_children(
    runtime: &Runtime,
    remote: &Runtime,
    session: &SessionId,
) -> Result<Vec<SessionId>, Error> {
    let members = sessions(runtime, session).await?;
    let mut children = Vec::new();
    for candidate in remote.session_ids().await? {
        let started_here = members
            .iter()
            .any(|member| candidate.as_str().starts_with(&format!("{member}-sub-")));
        if started_here && remote.session(&candidate).await?.root == candidate {
            children.push(candidate);
        }
    }
    Ok(children)
}
