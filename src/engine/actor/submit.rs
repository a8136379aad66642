//! Submits: an accepted answer is committed beside the mailbox (its commit writes only the
//! call's own entries, so many answers for one session commit in parallel), and every other
//! input of the session first waits for those commits (the barrier), as does another answer
//! to a call whose answer is being committed.
//!
//! Commit, then effects, here too: the caller is answered `accepted` by the commit's task once
//! the commit is durable, and the transition's effects (a metric, an automatic resume) run on
//! the actor when it learns the commit is durable (`SubmitSettled`, or the barrier). An answer
//! whose commit failed is forgotten (`Input::AnswerLost`) before any other input is handled.
//! What makes committing beside the mailbox safe: the core has applied the answer in memory
//! already, so a second submit of the same call answers `already_completed`, and no input that
//! reads answers or writes the session's own keys runs before the barrier.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dormant_actors::ActorContext;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{send_back, Loaded, SessionActor, SessionMsg, SessionState};
use crate::error::Error;
use crate::session::submit::SubmitOutcome;
use crate::session::{Effect, Input, Submission, Transition, Verdict};
use crate::types::ids::SessionId;
use crate::types::Untrusted;

/// An accepted answer's commit in flight: the call; whether its commit ended (set by its task
/// before it sends `SubmitSettled`); the task, which yields the transition's effects once the
/// commit is durable, or `None` if it failed.
type Committing = (String, Arc<AtomicBool>, JoinHandle<Option<Vec<Effect>>>);

/// The accepted answers whose commits are in flight.
#[derive(Debug, Default)]
pub(crate) struct InFlightSubmits {
    committing: Vec<Committing>,
}

impl InFlightSubmits {
    pub(crate) fn is_empty(&self) -> bool {
        self.committing.is_empty()
    }

    /// Whether an answer to `tool_call_id` is among them.
    fn answers(&self, tool_call_id: &str) -> bool {
        self.committing
            .iter()
            .any(|(call, _, _)| call == tool_call_id)
    }
}

impl SessionActor {
    pub(super) async fn submit(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        root: &SessionId,
        tool_call_id: String,
        submission: Submission,
        reply: oneshot::Sender<Result<SubmitOutcome, Error>>,
    ) {
        // An answer to a call whose earlier answer is still being committed waits for that
        // commit: if it fails, the earlier answer is forgotten and this one is the answer,
        // rather than told `already_completed` about an answer that was never stored.
        if state.inflight.answers(&tool_call_id) {
            self.barrier(ctx, state).await;
        }
        let now = self.shared.clock.now_ms();
        let session = match self.present(ctx.key(), state).await {
            Ok(Some(session)) => session,
            Ok(None) => {
                let _ = reply.send(
                    crate::engine::router::settled_outcome(&self.shared, root, &tool_call_id).await,
                );
                return;
            }
            Err(error) => {
                let _ = reply.send(Err(error));
                return;
            }
        };
        let input = Input::Submit {
            tool_call_id: tool_call_id.clone(),
            submission,
        };
        let transition = match session.apply(input, now) {
            Ok(transition) => transition,
            Err(error) => {
                let _ = reply.send(Err(error));
                return;
            }
        };
        let outcome = match transition.verdict.clone() {
            Some(Verdict::Accepted) => {
                return self.commit_beside_mailbox(ctx, state, tool_call_id, transition, reply);
            }
            Some(Verdict::AlreadyCompleted) => {
                // A late submit may have recorded the timeout: that commit is ordinary.
                self.barrier(ctx, state).await;
                match self.perform(ctx, state, transition).await {
                    Ok(()) => Ok(SubmitOutcome::AlreadyCompleted),
                    Err(error) => Err(error),
                }
            }
            Some(Verdict::NotPending) | None => {
                crate::engine::router::settled_outcome(&self.shared, root, &tool_call_id).await
            }
            Some(Verdict::InvalidResult { reason, errors }) => {
                tracing::warn!(session = %ctx.key(), tool_call_id = %Untrusted(&tool_call_id), reason = %Untrusted(&reason), "client_tool.validation_failed");
                Ok(SubmitOutcome::InvalidResult { reason, errors })
            }
            Some(Verdict::StaleApproval { reason }) => {
                tracing::warn!(session = %ctx.key(), tool_call_id = %Untrusted(&tool_call_id), "approval.stale");
                Ok(SubmitOutcome::StaleApproval { reason })
            }
        };
        let _ = reply.send(outcome);
    }

    /// Commits an accepted answer without holding the mailbox: its task answers the caller
    /// once the commit is durable and hands the transition's effects back to the actor.
    fn commit_beside_mailbox(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        tool_call_id: String,
        transition: Transition,
        reply: oneshot::Sender<Result<SubmitOutcome, Error>>,
    ) {
        let shared = Arc::clone(&self.shared);
        let mailbox = ctx.mailbox();
        let session = ctx.key().clone();
        let call = tool_call_id.clone();
        let ended = Arc::new(AtomicBool::new(false));
        let ending = Arc::clone(&ended);
        let hold = self.shared.landing.hold(&session);
        let task = tokio::spawn(async move {
            let committed = match &transition.commit {
                Some(commit) => shared.commit(commit).await,
                None => Ok(()),
            };
            shared.landing.let_go(&session, hold);
            let effects = match committed {
                Ok(()) => {
                    tracing::debug!(session = %session, tool_call_id = %Untrusted(&call), "client_tool.submitted");
                    let _ = reply.send(Ok(SubmitOutcome::Accepted));
                    Some(transition.effects)
                }
                Err(error) => {
                    tracing::error!(session = %session, tool_call_id = %Untrusted(&call), error = %Untrusted(&error), "client_tool.submit_commit_failed");
                    let _ = reply.send(Err(error));
                    None
                }
            };
            // Told before the task is done: the actor may take the message first, and must
            // then count this commit as ended, or its effects wait for another message.
            ending.store(true, Ordering::Release);
            send_back(&mailbox, SessionMsg::SubmitSettled);
            effects
        });
        state.inflight.committing.push((tool_call_id, ended, task));
    }

    /// Runs the effects of the submit commits that are durable, and forgets the answers whose
    /// commit failed; those still in flight stay.
    pub(super) async fn settle_submits(&self, ctx: &ActorContext<Self>, state: &mut SessionState) {
        let (done, in_flight) = std::mem::take(&mut state.inflight.committing)
            .into_iter()
            .partition(|(_, ended, _)| ended.load(Ordering::Acquire));
        state.inflight.committing = in_flight;
        self.conclude(ctx, state, done).await;
    }

    /// Waits for every submit commit in flight and concludes each (see
    /// [`SessionActor::settle_submits`]), before an input that reads answers or writes the
    /// session's own entries.
    pub(super) async fn barrier(&self, ctx: &ActorContext<Self>, state: &mut SessionState) {
        let all = std::mem::take(&mut state.inflight.committing);
        self.conclude(ctx, state, all).await;
    }

    async fn conclude(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        committing: Vec<Committing>,
    ) {
        let now = self.shared.clock.now_ms();
        for (tool_call_id, _, task) in committing {
            match task.await.unwrap_or(None) {
                Some(effects) => {
                    for effect in effects {
                        self.run_effect(ctx, state, effect);
                    }
                }
                None => {
                    if let Loaded::Present(session) = &mut state.loaded {
                        let _ = session.apply(Input::AnswerLost { tool_call_id }, now);
                    }
                }
            }
        }
    }
}
