//! The parent's side of remote sub-agents, beside `children.rs`: a remote child reports as a
//! local one does (its driver, `remote/driver.rs`, turns the remote's status into the same
//! report), and in the same commit the calls its tree waits on are recorded on this session's
//! root with where they live, so that a submit at the root reaches them; calls it no longer
//! waits on are cleared, with a tombstone (a duplicate answers `already_completed` here). The
//! core also decides how each child is reached: a remote child by a driver
//! ([`Effect::DriveRemote`]), any other in this process, so the actor never asks.

use super::apply_cx::ApplyCx;
use super::core::Session;
use super::{ChildAt, ChildReport, ChildState, Effect, RemoteDrive};
use crate::remote::{Drive, RemoteCall, RemoteChild, RemoteOwner};
use crate::store::schema::IndexWrite;
use crate::types::ids::SessionId;
use crate::types::stream::Chunk;

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
            self.stop_unclaimed(cx, call_id, &report, position);
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
            let before = routed_of(entry);
            let child = entry.child.clone();
            let after = match &report {
                ChildReport::Suspended(_) => calls,
                _ => Vec::new(),
            };
            self.route_remote_calls(cx, call_id, &child, &remote, &before, after);
        }
        // A run of the child a crash cut there, seen by a watch (nobody here waits on a wake of
        // it): its server keeps it until its parent wakes it, so wake it now. A child that
        // goes on by itself once answered (over A2A) would otherwise sit cut, listing nothing,
        // until the root's next resume.
        let cut = position.watch && matches!(report, ChildReport::Crashed);
        self.child_reported(cx, call_id, report, chunks);
        if cut && self.children_entry_unfinished(call_id) {
            cx.extend(
                self.remote_drive(call_id, Drive::Wake)
                    .map(Effect::DriveRemote),
            );
        }
        self.resume_if_owed(cx, owed);
    }

    /// A start's or a wake's report of a remote child whose entry is gone: an abort, or a
    /// message that abandoned the call, came while the start or the wake was in flight, and
    /// its stop may have reached the child's server first (finding nothing to stop, or a
    /// child the wake then set going). A child that waits there now waits for nobody: it is
    /// aborted. (A watch only informs; a child that ended needs nothing.)
    fn stop_unclaimed(
        &self,
        cx: &mut ApplyCx,
        call_id: &str,
        report: &ChildReport,
        position: ReportPosition,
    ) {
        if position.watch || !matches!(report, ChildReport::Suspended(_)) {
            return;
        }
        let child = self.record.id.ephemeral_child(call_id);
        let Some(remote) = self.children.remote_of(&child) else {
            return;
        };
        tracing::warn!(parent = %self.record.id, %child, "remote_subagent.unclaimed_stopped");
        cx.push(Effect::StopChildren {
            children: vec![ChildAt {
                child,
                remote: Some(remote.clone()),
            }],
            abort: true,
        });
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
        if let Some(entry) = self.children.by_id.get_mut(call_id) {
            // Staged with the entry by the report that follows.
            entry.routed_calls = after.iter().map(|call| call.tool_call_id.clone()).collect();
        }
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
        let waiting = routed_of(entry);
        let child = entry.child.clone();
        if let Some(entry) = self.children.by_id.get_mut(call_id) {
            entry.routed_calls.clear();
        }
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

    /// The drive that does `how` to the child of call `call_id`, if that child is remote.
    pub(super) fn remote_drive(&self, call_id: &str, how: Drive) -> Option<RemoteDrive> {
        let entry = self.children.get(call_id)?;
        Some(RemoteDrive {
            call: call_id.to_string(),
            child: entry.child.clone(),
            remote: entry.remote.clone()?,
            forwarded: entry.forwarded,
            how,
        })
    }

    /// Wakes the children of these calls: a remote one through its driver, the others in
    /// this process.
    pub(super) fn wake_children(&self, cx: &mut ApplyCx, children: Vec<(String, SessionId)>) {
        let mut here = Vec::new();
        for (call, child) in children {
            match self.remote_drive(&call, Drive::Wake) {
                Some(drive) => cx.push(Effect::DriveRemote(drive)),
                None => here.push((call, child)),
            }
        }
        if !here.is_empty() {
            cx.push(Effect::WakeChildren(here));
        }
    }

    /// A child of this session, and where it lives: a remote child is known by where it
    /// lives even after its entry went (a transition that removes the entry may also stop it).
    pub(super) fn child_at(&self, child: SessionId) -> ChildAt {
        let remote = self.children.remote_of(&child).cloned();
        ChildAt { child, remote }
    }

    /// An answer for a call under the remote child of `call_id` was accepted at the remote:
    /// a child that has not finished is watched, to learn where it stands now (it may have
    /// gone on by itself), and looked at again by itself if a crash here loses that watch.
    pub(super) fn remote_answered(&mut self, cx: &mut ApplyCx, call_id: &str) {
        if !self.children_entry_unfinished(call_id) {
            return;
        }
        self.look_after_answer(cx, call_id);
        if let Some(drive) = self.remote_drive(call_id, Drive::Watch) {
            cx.push(Effect::DriveRemote(drive));
        }
    }

    /// Whether call `call_id` waits on a child that has not finished.
    fn children_entry_unfinished(&self, call_id: &str) -> bool {
        self.children
            .get(call_id)
            .is_some_and(|entry| !entry.state.is_finished())
    }
}

/// The calls the root lists as owned through a remote child's entry: those it recorded, and
/// (for an entry stored before they were kept apart) those the child last waited on.
fn routed_of(entry: &crate::types::record::ChildCall) -> Vec<String> {
    let mut routed = entry.routed_calls.clone();
    for call in waiting_of(&entry.state) {
        if !routed.contains(&call) {
            routed.push(call);
        }
    }
    routed
}

fn waiting_of(state: &ChildState) -> Vec<String> {
    match state {
        ChildState::Suspended { waiting } => waiting.clone(),
        _ => Vec::new(),
    }
}
