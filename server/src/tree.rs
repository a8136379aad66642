//! The calls a session's tree waits on: its own, and those of every sub-agent (and companion)
//! under it that has not finished. A submit made against the root reaches any of them, so
//! `GET /status` of the root lists them all, each with the session that owns it.

use std::collections::VecDeque;

use dormant::types::CompanionStatus;
use dormant::{Error, Runtime, SessionId};

use crate::wire::{PendingAnswer, UnreachableAnswer};

/// Sessions visited at most: a bound on one status request, far above any real tree (the
/// runtime's `max_depth` bounds how deep it goes, not how wide).
const MAX_SESSIONS: usize = 10_000;

/// What a tree waits on: calls, and remote sub-agents whose servers do not answer.
#[derive(Debug, Default)]
pub(crate) struct Waits {
    pub(crate) pending: Vec<PendingAnswer>,
    pub(crate) unreachable: Vec<UnreachableAnswer>,
}

/// Every pending entry of `root`'s tree, owner first, breadth first, and then the calls
/// remote sub-agents' trees wait on (a root records those itself); and the remote sub-agents
/// of the tree whose servers have not answered lately (their parents try again by
/// themselves).
pub(crate) async fn waits(runtime: &Runtime, root: &SessionId) -> Result<Waits, Error> {
    let now = runtime.now_ms();
    let mut out = Vec::new();
    let mut unreachable = Vec::new();
    let mut queue = VecDeque::from([root.clone()]);
    let mut visited = 0;
    while let Some(session) = queue.pop_front() {
        visited += 1;
        if visited > MAX_SESSIONS {
            tracing::warn!(%root, "server.status_tree_truncated");
            break;
        }
        let calls = runtime.pending(&session).await?;
        // The session's agent defines the tools its calls name (read only when it waits).
        let agent = match calls.is_empty() {
            true => String::new(),
            false => runtime.session(&session).await?.agent,
        };
        for call in calls {
            let tool = runtime.tool_info(&agent, &call.tool_name);
            out.push(PendingAnswer::new(session.clone(), call, now, tool));
        }
        for child in runtime.children(&session).await? {
            if let Some(answer) = UnreachableAnswer::of(&child) {
                unreachable.push(answer);
            }
            // A remote child's calls are the root's remote entries, below.
            if !child.state.is_finished() && child.remote.is_none() {
                queue.push_back(child.child);
            }
        }
        for companion in runtime.companions(&session).await? {
            if matches!(companion.status, CompanionStatus::Suspended { .. }) {
                queue.push_back(companion.child);
            }
        }
    }
    for (_, call) in runtime.pending_remote(root).await? {
        out.push(PendingAnswer::from(call));
    }
    Ok(Waits {
        pending: out,
        unreachable,
    })
}
