//! The parent's side of remote sub-agents, beside `children.rs`: a remote child reports as a
//! local one does (its driver, `remote/driver.rs`, turns the remote's status into the same
//! report), and in the same commit the calls its tree waits on are recorded on this session's
//! root with where they live, so that a submit at the root reaches them; calls it no longer
//! waits on are cleared, with a tombstone (a duplicate answers `already_completed` here).

use super::core::Session;
use super::{ChildReport, ChildState, Effect, Transition};
use crate::ids::SessionId;
use crate::remote::{
    RemoteCall, RemoteChild, RemoteLook, RemoteOwner, REMOTE_LOOK_MAX_MS, REMOTE_LOOK_MIN_MS,
};
use crate::schema::IndexWrite;
use crate::store::CommitKind;
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
        call_id: &str,
        report: ChildReport,
        chunks: Vec<Chunk>,
        calls: Vec<RemoteCall>,
        position: ReportPosition,
        now: u64,
    ) -> Transition {
        let Some(entry) = self.children.get(call_id) else {
            return Transition::default();
        };
        // Read before a report this session already acted on, or a watch while a start or a
        // wake of the child is in flight (its own report answers what waits).
        if position.as_of < entry.forwarded || (position.watch && self.waits_on(call_id)) {
            return Transition::default();
        }
        if let (Some(remote), false) = (entry.remote.clone(), entry.state.is_finished()) {
            let before = waiting_of(&entry.state);
            let child = entry.child.clone();
            let after = match &report {
                ChildReport::Suspended(_) => calls,
                _ => Vec::new(),
            };
            self.route_remote_calls(call_id, &child, &remote, &before, after, now);
        }
        self.child_reported(call_id, report, chunks, now)
    }

    /// Records on the root each call of `after` still waiting as owned through this session's
    /// call `call_id`, and clears (with a tombstone) each call of `before` that is not; arms
    /// the next look at the child for when the remote settles one of them by itself.
    fn route_remote_calls(
        &mut self,
        call_id: &str,
        child: &SessionId,
        remote: &RemoteChild,
        before: &[String],
        after: Vec<RemoteCall>,
        now: u64,
    ) {
        // Look at the child by itself when the first of its calls falls due: a timeout there
        // settles it with nobody asking here.
        let due = after
            .iter()
            .filter_map(RemoteCall::settles_by_itself_at)
            .min();
        let after: Vec<RemoteCall> = after.into_iter().filter(|call| call.waiting).collect();
        let look = due.map(|due_ms| RemoteLook {
            due_ms,
            at_ms: next_look(due_ms, now),
        });
        self.set_remote_look(call_id, look);
        let root = self.record.root.clone();
        for gone in before
            .iter()
            .filter(|id| !after.iter().any(|call| &call.tool_call_id == *id))
        {
            self.staged.index.push(IndexWrite::DeleteOwnership {
                root: root.clone(),
                call: gone.clone(),
            });
            self.staged.index.push(IndexWrite::PutTombstone {
                root: root.clone(),
                call: gone.clone(),
                at: now,
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
            self.staged.index.push(IndexWrite::PutRemoteOwnership {
                root: root.clone(),
                owner: Box::new(owner),
            });
        }
    }

    /// A look at a remote child fell due (its entry in the deadline index fired): ask the
    /// child where it stands, and look again after a backoff in case it still waits past its
    /// deadline then (the remote's clock may be behind, its scheduler late). A stale entry
    /// (the look moved, the child no longer waits) does nothing.
    pub(super) fn remote_look_due(&mut self, call_id: &str, now: u64) -> Transition {
        let Some(entry) = self.children.get(call_id) else {
            return Transition::default();
        };
        let (Some(_), Some(look), ChildState::Suspended { .. }) =
            (&entry.remote, entry.remote_look, &entry.state)
        else {
            return Transition::default();
        };
        if now < look.at_ms {
            return Transition::default();
        }
        let again = RemoteLook {
            due_ms: look.due_ms,
            at_ms: next_look(look.due_ms, now).max(now.saturating_add(REMOTE_LOOK_MIN_MS)),
        };
        self.set_remote_look(call_id, Some(again));
        if let Some(entry) = self.children.get(call_id).cloned() {
            self.staged.index.push(IndexWrite::PutChild(entry));
        }
        self.finish_entries(
            CommitKind::Other,
            vec![Effect::WatchRemote(call_id.to_string())],
        )
    }

    /// Moves the look at the remote child of `call_id` (its deadline entry with it).
    fn set_remote_look(&mut self, call_id: &str, look: Option<RemoteLook>) {
        let Some(entry) = self.children.get_mut(call_id) else {
            return;
        };
        if entry.remote_look == look {
            return;
        }
        let before = std::mem::replace(&mut entry.remote_look, look);
        if let Some(before) = before {
            self.staged.index.push(IndexWrite::DeleteDeadline {
                at: before.at_ms,
                call: call_id.to_string(),
            });
        }
        if let Some(look) = look {
            self.staged.index.push(IndexWrite::PutDeadline {
                at: look.at_ms,
                call: call_id.to_string(),
            });
        }
    }

    /// Clears the root's entries of the calls a remote child's entry still waits on, without
    /// tombstones (its wait was abandoned: an interrupt, an abort): a late submit answers
    /// `unknown_tool_call`, as for a local child's dropped calls.
    pub(super) fn unroute_remote_calls(&mut self, call_id: &str) {
        let Some(entry) = self.children.get(call_id) else {
            return;
        };
        if entry.remote.is_none() {
            return;
        }
        let waiting = waiting_of(&entry.state);
        self.set_remote_look(call_id, None);
        let root = self.record.root.clone();
        for call in waiting {
            self.staged.index.push(IndexWrite::DeleteOwnership {
                root: root.clone(),
                call,
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

/// When to look at a remote child whose first call falls due at `due` (the remote's clock):
/// then, or if that has passed, after a wait that grows with how late it is (a second at
/// least, a minute at most), so a remote whose clock is behind is not asked every second.
fn next_look(due: u64, now: u64) -> u64 {
    if due > now {
        return due;
    }
    let late = now - due;
    now.saturating_add(late.clamp(REMOTE_LOOK_MIN_MS, REMOTE_LOOK_MAX_MS))
}

fn waiting_of(state: &ChildState) -> Vec<String> {
    match state {
        ChildState::Suspended { waiting } => waiting.clone(),
        _ => Vec::new(),
    }
}
