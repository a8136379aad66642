//! The parent's side of remote sub-agents, beside `children.rs`: a remote child reports as a
//! local one does (its driver, `remote/driver.rs`, turns the remote's status into the same
//! report), and in the same commit the calls its tree waits on are recorded on this session's
//! root with where they live, so that a submit at the root reaches them; calls it no longer
//! waits on are cleared, with a tombstone (a duplicate answers `already_completed` here).

use super::apply_cx::ApplyCx;
use super::core::Session;
use super::{ChildReport, ChildState};
use crate::ids::SessionId;
use crate::remote::{RemoteCall, RemoteChild, RemoteOwner};
use crate::schema::IndexWrite;
use crate::stream::Chunk;

/// Where a remote child's report stands among the reports of its drivers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReportPosition {
    /// The child's stream position when its status was read.
    pub(crate) as_of: u64,
    /// From a watch, not from the start or wake the parent may wait for.
    pub(crate) watch: bool,
}

impl Session {
    /// A remote child reported where it stands, with the calls its tree waits on, as of the
    /// child's stream position `as_of`.
    pub(super) fn remote_reported(
        &mut self,
        cx: &mut ApplyCx,
        call_id: &str,
        report: ChildReport,
        chunks: Vec<Chunk>,
        calls: Vec<RemoteCall>,
        position: ReportPosition,
    ) {
        let Some(entry) = self.children.get(call_id) else {
            return;
        };
        // Read before a report this session already acted on, or a watch while a start or a
        // wake of the child is in flight (its own report answers what waits).
        if position.as_of < entry.forwarded || (position.watch && self.waits_on(call_id)) {
            return;
        }
        // A resume this session owes the child since its server did not answer: carried out
        // now that it did, if nothing else waits.
        let owed = self.wake_owed(call_id);
        if let (Some(remote), false) = (entry.remote.clone(), entry.state.is_finished()) {
            let before = waiting_of(&entry.state);
            let child = entry.child.clone();
            let after = match &report {
                ChildReport::Suspended(_) => calls,
                _ => Vec::new(),
            };
            self.route_remote_calls(cx, call_id, &child, &remote, &before, after);
        }
        self.child_reported(cx, call_id, report, chunks);
        self.resume_if_owed(cx, owed);
    }

    /// Records on the root each call of `after` still waiting as owned through this session's
    /// call `call_id`, and clears (with a tombstone) each call of `before` that is not; arms
    /// the next look at the child for when the remote settles one of them by itself.
    fn route_remote_calls(
        &mut self,
        cx: &mut ApplyCx,
        call_id: &str,
        child: &SessionId,
        remote: &RemoteChild,
        before: &[String],
        after: Vec<RemoteCall>,
    ) {
        // Look at the child by itself when the first of its calls falls due: a timeout there
        // settles it with nobody asking here.
        let due = after
            .iter()
            .filter_map(RemoteCall::settles_by_itself_at)
            .min();
        let after: Vec<RemoteCall> = after.into_iter().filter(|call| call.waiting).collect();
        self.look_at_deadline(cx, call_id, due);
        let root = self.record.root.clone();
        for gone in before
            .iter()
            .filter(|id| !after.iter().any(|call| &call.tool_call_id == *id))
        {
            cx.staged.index.push(IndexWrite::DeleteOwnership {
                root: root.clone(),
                call: gone.clone(),
                owner: child.clone(),
            });
            cx.staged.index.push(IndexWrite::PutTombstone {
                root: root.clone(),
                call: gone.clone(),
                at: cx.now,
            });
        }
        for call in after {
            let owner = RemoteOwner {
                via: self.record.id.clone(),
                parent_call: call_id.to_string(),
                endpoint: remote.endpoint.clone(),
                remote_root: child.clone(),
                call,
            };
            cx.staged.index.push(IndexWrite::PutRemoteOwnership {
                root: root.clone(),
                owner: Box::new(owner),
            });
        }
    }

    /// Clears the root's entries of the calls a remote child's entry still waits on, without
    /// tombstones (its wait was abandoned: an interrupt, an abort): a late submit answers
    /// `unknown_tool_call`, as for a local child's dropped calls.
    pub(super) fn unroute_remote_calls(&mut self, cx: &mut ApplyCx, call_id: &str) {
        let Some(entry) = self.children.get(call_id) else {
            return;
        };
        if entry.remote.is_none() {
            return;
        }
        let waiting = waiting_of(&entry.state);
        let child = entry.child.clone();
        self.set_remote_look(cx, call_id, None);
        let root = self.record.root.clone();
        for call in waiting {
            cx.staged.index.push(IndexWrite::DeleteOwnership {
                root: root.clone(),
                call,
                owner: child.clone(),
            });
        }
    }

    /// The remote child of call `call_id`: its id, where it lives, and how much of its stream
    /// this session has copied.
    pub(crate) fn remote_child(&self, call_id: &str) -> Option<(SessionId, RemoteChild, u64)> {
        let entry = self.children.get(call_id)?;
        let remote = entry.remote.clone()?;
        Some((entry.child.clone(), remote, entry.forwarded))
    }

    /// Whether call `call_id` waits on a child that has not finished.
    pub(crate) fn children_entry_unfinished(&self, call_id: &str) -> bool {
        self.children
            .get(call_id)
            .is_some_and(|entry| !entry.state.is_finished())
    }

    /// Where remote child `child` of this session lives.
    pub(crate) fn children_remote_of(&self, child: &SessionId) -> Option<RemoteChild> {
        self.children.remote_of(child).cloned()
    }

    /// Where each of `children` lives that is a remote child of this session.
    pub(crate) fn remote_children(&self, children: &[SessionId]) -> Vec<(SessionId, RemoteChild)> {
        children
            .iter()
            .filter_map(|child| Some((child.clone(), self.children.remote_of(child)?.clone())))
            .collect()
    }
}

pub(super) fn waiting_of(state: &ChildState) -> Vec<String> {
    match state {
        ChildState::Suspended { waiting } => waiting.clone(),
        _ => Vec::new(),
    }
}
