//! When a parent looks at a remote child by itself, beside `remote_children.rs`: at the
//! deadline of the first call the child waits on (a timeout there settles the child with
//! nobody asking here), and while the child's server does not answer (a restart, a deploy),
//! again and again until it does or the parent's patience runs out. A look is an entry of
//! the parent's deadline index (its key names the sub-agent call), so it survives a restart.

use super::apply_cx::ApplyCx;
use super::core::{Phase, Session};
use super::{ChildReport, ChildState, Effect};
use crate::remote::{Drive, LookReason, RemoteLook, RemoteOrphan};
use crate::store::schema::{self, IndexWrite};
use crate::store::CommitKind;
use crate::types::tool_error::ToolErrorCode;

/// The least wait before a parent looks at a remote child again.
const LOOK_MIN_MS: u64 = 1_000;
/// The longest wait between two looks at a remote child that still waits past its deadline.
const LOOK_MAX_MS: u64 = 60_000;
/// When a parent looks at a remote child after an answer was accepted there, unless the watch
/// that follows the answer reports first (as it does within a few milliseconds when the child
/// waits for its resume; a child that goes on by itself, as over A2A, may take longer).
const LOOK_AFTER_ANSWER_MS: u64 = 5_000;

impl Session {
    /// Arms the look for when the remote settles a call of the child by itself: at `due`, the
    /// earliest deadline among them (the remote's clock), or nothing to look for.
    pub(super) fn look_at_deadline(&mut self, cx: &mut ApplyCx, call_id: &str, due: Option<u64>) {
        let look = due.map(|due_ms| RemoteLook {
            at_ms: next_deadline_look(due_ms, cx.now),
            why: LookReason::Deadline { due_ms },
        });
        self.set_remote_look(cx, call_id, look);
    }

    /// A look at a remote child fell due (its entry in the deadline index fired). For a
    /// deadline: ask the child where it stands. For a remote that did not answer: follow the
    /// child again (and resume it first if a resume of this session asked for that). Either
    /// way the look is armed again in case this one learns nothing; a stale entry (the look
    /// moved, the child no longer waits) does nothing.
    pub(super) fn remote_look_due(&mut self, cx: &mut ApplyCx, call_id: &str) {
        let now = cx.now;
        let Some(entry) = self.children.get(call_id) else {
            return;
        };
        let (Some(_), Some(look)) = (&entry.remote, entry.remote_look) else {
            return;
        };
        if now < look.at_ms || entry.state.is_finished() {
            return;
        }
        let (again, how) = match look.why {
            LookReason::Deadline { due_ms } => {
                if !matches!(entry.state, ChildState::Suspended { .. }) {
                    return;
                }
                let at_ms = next_deadline_look(due_ms, now).max(now.saturating_add(LOOK_MIN_MS));
                (RemoteLook { at_ms, ..look }, Drive::Watch)
            }
            LookReason::Unreachable { since_ms, wake } => {
                let at_ms = now.saturating_add(self.retry_wait(since_ms, now));
                let how = if wake { Drive::Wake } else { Drive::Follow };
                (RemoteLook { at_ms, ..look }, how)
            }
        };
        self.set_remote_look(cx, call_id, Some(again));
        self.put_child_entry(cx, call_id);
        // The entry is a remote child's (checked above): there is a drive.
        cx.extend(self.remote_drive(call_id, how).map(Effect::DriveRemote));
        self.finish_entries(cx, CommitKind::Other);
    }

    /// A remote child's server did not answer its driver. Within the patience of the
    /// runtime's `RemotePolicy`, the tree stays as it was (waiting, and visibly so) and this
    /// session looks again later; a resume that was waking the child goes on without it (its
    /// caller learns the tree still waits) and is carried out once the remote answers. Past
    /// the patience, the child is written off as `remote_subagent_lost`, and recorded to be
    /// stopped there whenever the remote answers again.
    pub(super) fn remote_unreachable(&mut self, cx: &mut ApplyCx, call_id: &str, reason: &str) {
        let now = cx.now;
        let Some(entry) = self.children.get(call_id) else {
            return;
        };
        let Some(remote) = entry.remote.clone() else {
            return;
        };
        if entry.state.is_finished() {
            return;
        }
        let child = entry.child.clone();
        let waking = matches!(&self.phase, Phase::AwaitingChildren { waking, .. } if waking.iter().any(|id| id == call_id));
        let (since_ms, owed) = match entry.remote_look.map(|look| look.why) {
            Some(LookReason::Unreachable { since_ms, wake }) => (since_ms, wake),
            _ => (now, false),
        };
        let wake = owed || waking;
        let patience = self.policy.remote_patience_ms;
        if now.saturating_sub(since_ms) >= patience {
            let outcome = ToolErrorCode::RemoteSubAgentLost.with(format_args!(
                "{} did not answer for {} ms (the runtime's patience): {reason}",
                remote.endpoint,
                now.saturating_sub(since_ms)
            ));
            self.unroute_remote_calls(cx, call_id);
            cx.staged.index.push(IndexWrite::PutOrphan(RemoteOrphan {
                child,
                endpoint: remote.endpoint,
                abort: true,
                since_ms: now,
                held_until_ms: None,
                refusals: 0,
            }));
            let lost = ChildReport::Finished(outcome.into());
            self.child_reported(cx, call_id, lost, Vec::new());
            return self.resume_if_owed(cx, wake);
        }
        let look = RemoteLook {
            at_ms: now.saturating_add(self.retry_wait(since_ms, now)),
            why: LookReason::Unreachable { since_ms, wake },
        };
        self.set_remote_look(cx, call_id, Some(look));
        self.put_child_entry(cx, call_id);
        if let Phase::AwaitingChildren { waking, run_id } = &mut self.phase {
            waking.retain(|id| id != call_id);
            if waking.is_empty() {
                let run_id = *run_id;
                self.phase = Phase::Idle;
                return self.after_waking(cx, run_id);
            }
        }
        self.finish_entries(cx, CommitKind::Other);
    }

    /// A remote child reported after a resume of this session could not reach it: now that
    /// it answered, that resume is carried out if nothing else waits.
    pub(super) fn resume_if_owed(&self, cx: &mut ApplyCx, owed: bool) {
        let idle = matches!(self.phase, Phase::Idle);
        let queued = cx
            .effects()
            .iter()
            .any(|effect| matches!(effect, Effect::AutoResume));
        if owed && idle && !queued && self.is_suspended() && !self.any_waiting(cx.now) {
            cx.push(Effect::AutoResume);
        }
    }

    /// Whether a resume of this session is still to reach the remote child of `call_id`.
    pub(super) fn wake_owed(&self, call_id: &str) -> bool {
        self.children.get(call_id).is_some_and(|entry| {
            matches!(
                entry.remote_look.map(|look| look.why),
                Some(LookReason::Unreachable { wake: true, .. })
            )
        })
    }

    /// An answer was accepted at the server of a remote child that goes on by itself once
    /// answered (an A2A agent does): arms a look at the child [`LOOK_AFTER_ANSWER_MS`] from
    /// now, durably, unless one comes sooner or the remote is being retried. The watch that
    /// follows the answer reports before it, as a rule, and moves the look to the child's next
    /// deadline; a crash before that report is then healed by this look rather than at the
    /// answered call's deadline, while this side still lists the call as waiting. A child over
    /// dormant's own protocol waits for its parent's resume, so its watch reports at once: the
    /// look would cost a commit per answer for a window of milliseconds (BENCHMARKS.md, issue
    /// 33).
    pub(super) fn look_after_answer(&mut self, cx: &mut ApplyCx, call_id: &str) {
        let at_ms = cx.now.saturating_add(LOOK_AFTER_ANSWER_MS);
        let goes_on_by_itself = |entry: &&super::ChildCall| {
            entry
                .remote
                .as_ref()
                .is_some_and(|remote| crate::types::remote::a2a_url(&remote.endpoint).is_some())
        };
        let Some(entry) = self.children.get(call_id).filter(goes_on_by_itself) else {
            return;
        };
        match entry.remote_look {
            Some(RemoteLook {
                why: LookReason::Unreachable { .. },
                ..
            }) => return,
            Some(look) if look.at_ms <= at_ms => return,
            _ => {}
        }
        let look = RemoteLook {
            at_ms,
            why: LookReason::Deadline { due_ms: at_ms },
        };
        self.set_remote_look(cx, call_id, Some(look));
        self.put_child_entry(cx, call_id);
        self.finish_entries(cx, CommitKind::Other);
    }

    /// How long to wait before trying an unreachable remote again: as long as it has been
    /// unreachable, a second at least and the policy's longest wait at most.
    fn retry_wait(&self, since_ms: u64, now: u64) -> u64 {
        let max = self.policy.remote_retry_max_ms.max(LOOK_MIN_MS);
        now.saturating_sub(since_ms).clamp(LOOK_MIN_MS, max)
    }

    /// Stages the child entry of `call_id` as it is now.
    fn put_child_entry(&self, cx: &mut ApplyCx, call_id: &str) {
        if let Some(entry) = self.children.get(call_id).cloned() {
            cx.staged.index.push(IndexWrite::PutChild(entry));
        }
    }

    /// Moves the look at the remote child of `call_id` (its deadline entry with it).
    pub(super) fn set_remote_look(
        &mut self,
        cx: &mut ApplyCx,
        call_id: &str,
        look: Option<RemoteLook>,
    ) {
        let Some(entry) = self.children.get_mut(call_id) else {
            return;
        };
        if entry.remote_look == look {
            return;
        }
        let before = std::mem::replace(&mut entry.remote_look, look);
        if let Some(before) = before {
            cx.staged.index.push(IndexWrite::DeleteDeadline {
                at: before.at_ms,
                call: schema::remote_look_entry(call_id),
            });
            // And under the bare call id, as a look armed before looks had a name of their
            // own is kept.
            cx.staged.index.push(IndexWrite::DeleteDeadline {
                at: before.at_ms,
                call: call_id.to_string(),
            });
        }
        if let Some(look) = look {
            cx.staged.index.push(IndexWrite::PutDeadline {
                at: look.at_ms,
                call: schema::remote_look_entry(call_id),
            });
        }
    }
}

/// When to look at a remote child whose first call falls due at `due` (the remote's clock):
/// then, or if that has passed, after a wait that grows with how late it is (a second at
/// least, a minute at most), so a remote whose clock is behind is not asked every second.
fn next_deadline_look(due: u64, now: u64) -> u64 {
    if due > now {
        return due;
    }
    let late = now - due;
    now.saturating_add(late.clamp(LOOK_MIN_MS, LOOK_MAX_MS))
}
