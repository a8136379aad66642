//! Submits: an accepted answer is committed beside the mailbox (it writes only its own call's
//! entries), and every other input first waits for those commits (the barrier).

use std::sync::Arc;
use std::time::Instant;

use dormant_actors::ActorContext;
use tokio::sync::oneshot;

use super::{send_back, Loaded, SessionActor, SessionMsg, SessionState};
use crate::error::Error;
use crate::ids::SessionId;
use crate::metrics::BatchSize;
use crate::schema;
use crate::session::{Submission, Transition, Verdict};
use crate::submit::SubmitOutcome;

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
        let now = self.shared.clock.now_ms();
        let session = match self.present(ctx.key(), state).await {
            Ok(Some(session)) => session,
            Ok(None) => {
                let _ = reply.send(self.shared.settled_call_outcome(root, &tool_call_id));
                return;
            }
            Err(error) => {
                let _ = reply.send(Err(error));
                return;
            }
        };
        let (verdict, transition) = session.submit(&tool_call_id, submission, now);
        let outcome = match verdict {
            Verdict::Accepted => {
                self.pipeline_submit(ctx, state, tool_call_id, transition, reply);
                return;
            }
            Verdict::AlreadyCompleted => {
                // A late submit may have recorded the timeout: that commit is ordinary.
                self.barrier(state).await;
                match self.perform(ctx, state, transition).await {
                    Ok(()) => Ok(SubmitOutcome::AlreadyCompleted),
                    Err(error) => Err(error),
                }
            }
            Verdict::NotPending => self.shared.settled_call_outcome(root, &tool_call_id),
            Verdict::InvalidResult { reason, errors } => {
                tracing::warn!(session = %ctx.key(), tool_call_id, %reason, "client_tool.validation_failed");
                Ok(SubmitOutcome::InvalidResult { reason, errors })
            }
        };
        let _ = reply.send(outcome);
    }

    /// Commits an accepted answer without holding the mailbox: the caller is answered once it
    /// is durable, and the actor learns the result through `SubmitSettled`.
    pub(super) fn pipeline_submit(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        tool_call_id: String,
        transition: Transition,
        reply: oneshot::Sender<Result<SubmitOutcome, Error>>,
    ) {
        let batch = transition.commit.as_ref().map(schema::Commit::encode);
        let shared = Arc::clone(&self.shared);
        let mailbox = ctx.mailbox();
        let session = ctx.key().clone();
        let call = tool_call_id.clone();
        let task = tokio::spawn(async move {
            let result = match batch {
                Some(Ok(batch)) => {
                    let size = BatchSize::of(&batch);
                    let started = Instant::now();
                    let committed = shared.store.commit(batch).await;
                    shared.metrics.record_commit(started.elapsed(), &size);
                    committed.map_err(Error::from)
                }
                Some(Err(error)) => Err(Error::from(error)),
                None => Ok(()),
            };
            let committed = result.is_ok();
            match result {
                Ok(()) => {
                    tracing::debug!(session = %session, tool_call_id = %call, "client_tool.submitted");
                    let _ = reply.send(Ok(SubmitOutcome::Accepted));
                }
                Err(error) => {
                    tracing::error!(session = %session, tool_call_id = %call, %error, "client_tool.submit_commit_failed");
                    let _ = reply.send(Err(error));
                }
            }
            send_back(
                &mailbox,
                SessionMsg::SubmitSettled {
                    tool_call_id: call,
                    committed,
                },
            );
            committed
        });
        state.inflight.push((tool_call_id, task));
        for effect in transition.effects {
            self.run_effect(ctx, state, effect);
        }
    }

    /// Waits for the submit commits in flight, and forgets the answers whose commit failed,
    /// before any input that reads answers or writes the session's own entries.
    pub(super) async fn barrier(&self, state: &mut SessionState) {
        for (tool_call_id, task) in std::mem::take(&mut state.inflight) {
            let committed = task.await.unwrap_or(false);
            if !committed {
                if let Loaded::Present(session) = &mut state.loaded {
                    session.revert_answer(&tool_call_id);
                }
            }
        }
    }
}
