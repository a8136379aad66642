//! The context of one [`Session::apply`](super::Session::apply): the time of its input, the
//! writes it stages, the effects it asks for, the commit those writes become and, for a
//! submit, the verdict. Every handler writes its output here and nowhere else, and `apply`
//! turns it into the [`Transition`] (the idea of restate's `StateMachineApplyContext`): one
//! way to collect output, and no time or effect list threaded through the handlers.

use super::{Effect, Transition, Verdict};
use crate::store::schema::{self, Commit, IndexWrite};
use crate::types::message::Message;
use crate::types::stream::Chunk;

/// Writes gathered while applying one input; they become the transition's commit.
#[derive(Debug, Default)]
pub(super) struct Staged {
    pub(super) messages: Vec<(u64, Message)>,
    pub(super) chunks: Vec<Chunk>,
    pub(super) index: Vec<IndexWrite>,
    pub(super) run_changed: bool,
}

impl Staged {
    fn is_empty(&self) -> bool {
        self.messages.is_empty()
            && self.chunks.is_empty()
            && self.index.is_empty()
            && !self.run_changed
    }
}

/// What one apply gathers (see the module's documentation).
#[derive(Debug)]
pub(super) struct ApplyCx {
    /// The time of the input (clock ms): every time the core records comes from here.
    pub(super) now: u64,
    /// Writes staged and not yet made into the commit.
    pub(super) staged: Staged,
    effects: Vec<Effect>,
    commit: Option<Commit>,
    verdict: Option<Verdict>,
}

/// A point in an apply's effects to go back to (see [`ApplyCx::rewind`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Mark(usize);

impl ApplyCx {
    /// The context of an input applied at `now`.
    pub(super) fn new(now: u64) -> Self {
        Self {
            now,
            staged: Staged::default(),
            effects: Vec::new(),
            commit: None,
            verdict: None,
        }
    }

    /// Asks for an effect, after those asked for so far.
    pub(super) fn push(&mut self, effect: Effect) {
        self.effects.push(effect);
    }

    /// Asks for each of `effects`, in order.
    pub(super) fn extend(&mut self, effects: impl IntoIterator<Item = Effect>) {
        self.effects.extend(effects);
    }

    /// The effects asked for so far.
    pub(super) fn effects(&self) -> &[Effect] {
        &self.effects
    }

    /// Keeps only the effects asked for so far that match `keep`.
    pub(super) fn retain(&mut self, keep: impl FnMut(&Effect) -> bool) {
        self.effects.retain(keep);
    }

    /// Where the effects stand now, to [`rewind`](Self::rewind) to.
    pub(super) fn mark(&self) -> Mark {
        Mark(self.effects.len())
    }

    /// Drops the effects asked for since `mark`: a step whose outcome its caller discards
    /// (it must have staged and committed nothing).
    pub(super) fn rewind(&mut self, mark: Mark) {
        debug_assert!(self.commit.is_none() && self.staged.is_empty());
        self.effects.truncate(mark.0);
    }

    /// Records what the session decided about a submit.
    pub(super) fn decide(&mut self, verdict: Verdict) {
        self.verdict = Some(verdict);
    }

    /// Whether the apply has made its commit.
    pub(super) fn has_commit(&self) -> bool {
        self.commit.is_some()
    }

    /// Makes `commit` the apply's commit (one per apply), then asks for the scheduler to be
    /// told of the earliest deadline it arms.
    pub(super) fn commit(&mut self, commit: Commit) {
        debug_assert!(self.commit.is_none(), "one commit per input");
        debug_assert!(self
            .effects
            .iter()
            .all(|effect| match (effect, &commit.record) {
                (Effect::CallModel { after_seq, .. }, Some(record)) =>
                    *after_seq == record.chunk_count,
                _ => true,
            }));
        self.effects.extend(earliest_deadline(&commit.index));
        self.commit = Some(commit);
    }

    /// For a session the runtime resumes by itself (`auto_resume`): an automatic resume is a
    /// message to the session's actor, which a crash loses, so the commit that makes it owed
    /// records it in the deadline index too ([`schema::RESUME_DUE`]), where the scheduler
    /// finds it after a restart. Not armed: the resume under way removes it.
    pub(super) fn record_resume_due(&mut self) {
        let resumes = self
            .effects
            .iter()
            .any(|effect| matches!(effect, Effect::AutoResume));
        if let (true, Some(commit)) = (resumes, &mut self.commit) {
            commit.index.push(schema::resume_due_write(true));
        }
    }

    /// Remote children this apply stops are recorded in its commit to be stopped by the
    /// orphan pass (`remote/orphans.rs`) should the stop itself not get through: a crash, a
    /// caller gone, a remote that does not answer. Told of them only after the commit that
    /// lets them go, nothing durable would point at them then. The stop that gets through
    /// forgets them; the pass leaves them to it while it may be under way.
    pub(super) fn record_remote_stops(&mut self) {
        let Some(commit) = &mut self.commit else {
            return;
        };
        for effect in &self.effects {
            let Effect::StopChildren { children, abort } = effect else {
                continue;
            };
            for child in children {
                if let Some(remote) = &child.remote {
                    commit
                        .index
                        .push(IndexWrite::PutOrphan(crate::remote::RemoteOrphan {
                            child: child.child.clone(),
                            endpoint: remote.endpoint.clone(),
                            abort: *abort,
                            since_ms: self.now,
                            held_until_ms: Some(
                                self.now.saturating_add(crate::remote::STOP_UNDER_WAY_MS),
                            ),
                            refusals: 0,
                        }));
                }
            }
        }
    }

    /// The transition the apply produced.
    pub(super) fn into_transition(self) -> Transition {
        // Whatever was staged went into the commit: nothing is left to a later input.
        debug_assert!(self.staged.is_empty(), "staged writes without a commit");
        Transition {
            commit: self.commit,
            effects: self.effects,
            verdict: self.verdict,
        }
    }
}

/// The scheduler is told of the earliest deadline a commit arms (once it is durable), so that
/// it can wake earlier than it planned.
fn earliest_deadline(index: &[IndexWrite]) -> Option<Effect> {
    index
        .iter()
        .filter_map(|write| match write {
            IndexWrite::PutDeadline { at, .. } => Some(*at),
            _ => None,
        })
        .min()
        .map(|at| Effect::ArmDeadline { at })
}
