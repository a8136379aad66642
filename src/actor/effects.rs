//! Executing a transition: its commit first, then its effects in order.

use std::sync::Arc;
use std::time::Instant;

use dormant_actors::{ActorContext, WeakHost};

use super::{send_back, Loaded, SessionActor, SessionMsg, SessionState};
use crate::dispatch::{run_step, StepContext};
use crate::error::Error;
use crate::ids::SessionId;
use crate::message::ToolOutcome;
use crate::metrics::BatchSize;
use crate::scheduler::{SchedulerKey, SchedulerMsg};
use crate::schema::{self, IndexWrite};
use crate::session::{ChildReport, Effect, Input, Observation, Transition};

impl SessionActor {
    /// Makes the commit durable, then runs the effects in order. A failed commit leaves the
    /// in-memory state unreliable, so it is dropped and read back from the store.
    pub(super) async fn perform(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        transition: Transition,
    ) -> Result<(), Error> {
        if let Some(commit) = transition.commit {
            if let Err(error) = self.commit(&commit).await {
                tracing::error!(session = %ctx.key(), %error, "session.commit_failed");
                let reason = error.to_string();
                let unavailable = || Error::SessionUnavailable {
                    session: ctx.key().clone(),
                    reason: reason.clone(),
                };
                // The caller waiting for this run gets the typed store error; anyone else
                // joined to it learns why in words (store errors are not cloneable).
                let mut typed = Some(error);
                for waiter in state.waiters.drain(..) {
                    let _ = waiter.send(Err(typed.take().unwrap_or_else(unavailable)));
                }
                state.settle_waiters.clear();
                // A child's parent waits for it: it learns of the failure as the tool's error.
                if let Loaded::Present(session) = &state.loaded {
                    let text = format!("sub_agent_failed: {reason}");
                    self.send_to_parent(
                        session.record(),
                        ChildReport::Finished(ToolOutcome::Error(text)),
                    );
                }
                // The run is cut as by a crash: its work in flight goes, and what the store holds
                // is read back, with the run closed as interrupted (the at-most-once rule
                // decides what its cut calls become when it goes on).
                state.work.cancel();
                state.loaded = self
                    .load_recovered(ctx.key())
                    .await
                    .unwrap_or(Loaded::Unreadable);
                return Err(typed.unwrap_or_else(unavailable));
            }
            self.after_commit(ctx.key(), &commit);
        }
        for effect in transition.effects {
            self.run_effect(ctx, state, effect);
        }
        Ok(())
    }

    pub(super) fn run_effect(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        effect: Effect,
    ) {
        match effect {
            Effect::CallModel {
                run_id,
                step,
                request,
            } => {
                let llm = Arc::clone(&self.shared.llm);
                let mailbox = ctx.mailbox();
                state.work.spawn(async move {
                    let reply = crate::llm::complete_caught(llm.as_ref(), request).await;
                    send_back(
                        &mailbox,
                        SessionMsg::Feed(Input::ModelReplied {
                            run_id,
                            step,
                            reply,
                        }),
                    );
                });
            }
            Effect::RunTools {
                run_id,
                step,
                parallel,
                sequential,
                state: custom_state,
            } => {
                let Loaded::Present(session) = &state.loaded else {
                    return;
                };
                let step_context = StepContext {
                    agent: Arc::clone(session.agent()),
                    session: ctx.key().clone(),
                    run_id,
                    state: custom_state,
                };
                let mailbox = ctx.mailbox();
                state.work.spawn(async move {
                    let outcomes = run_step(step_context, parallel, sequential).await;
                    send_back(
                        &mailbox,
                        SessionMsg::Feed(Input::ToolsFinished {
                            run_id,
                            step,
                            outcomes,
                        }),
                    );
                });
            }
            Effect::StartChild(start) => {
                if let Some(host) = ctx.host() {
                    host.send(start.child.clone(), SessionMsg::StartChild(start));
                }
            }
            Effect::WakeChildren(children) => {
                if let Some(host) = ctx.host() {
                    for (tool_call_id, child) in children {
                        let parent = ctx.key().clone();
                        host.send(
                            child.clone(),
                            SessionMsg::Wake {
                                parent,
                                tool_call_id,
                                child,
                            },
                        );
                    }
                }
            }
            Effect::StopChildren { children, abort } => {
                if let Some(host) = ctx.host() {
                    for child in children {
                        // Nobody waits for the answer: the child reports as its run ends, and
                        // stops its own children.
                        host.send(child, SessionMsg::Stop { abort, reply: None });
                    }
                }
            }
            Effect::CancelWork => state.work.cancel(),
            Effect::Hook(event) => crate::hooks::notify(self.shared.hooks.as_ref(), &event),
            Effect::Observe(observation) => self.observe(ctx.key(), observation),
            Effect::AutoResume => {
                // Counted as work in progress until the resume is handled, so nobody waiting
                // for this session to settle is answered in between.
                state.resume_queued = true;
                // Through the host, not the mailbox: a passivation may already be queued, and
                // the host hands messages that arrive while stopping to the next activation.
                if let Some(host) = ctx.host() {
                    host.send(ctx.key().clone(), SessionMsg::Resume { reply: None });
                }
            }
            Effect::Settle(outcome) => {
                // The parent hears first, so whoever learns that this run settled finds the
                // parent's reaction already queued.
                if let Loaded::Present(session) = &mut state.loaded {
                    session.release_messages();
                    let now = self.shared.clock.now_ms();
                    self.report_to_parent(session, now);
                }
                // A companion's new turn that waited for this run to stop starts now.
                for start in state.deferred_starts.drain(..) {
                    super::send_back(&ctx.mailbox(), SessionMsg::StartChild(start));
                }
                for waiter in state.waiters.drain(..) {
                    let _ = waiter.send(Ok(outcome.clone()));
                }
                self.answer_settle_waiters_if_idle(state);
            }
        }
    }

    pub(super) fn observe(&self, id: &SessionId, observation: Observation) {
        let metrics = &self.shared.metrics;
        match observation {
            Observation::Suspended {
                tool_call_id,
                tool_name,
                deadline_at_ms,
            } => {
                tracing::debug!(session = %id, tool_call_id, tool_name, deadline_at_ms, "client_tool.suspended");
            }
            Observation::Answered {
                tool_call_id,
                wait_ms,
                has_error,
            } => {
                metrics.record_answer(wait_ms);
                tracing::debug!(session = %id, tool_call_id, wait_ms, has_error, "client_tool.answered");
            }
            Observation::TimedOut {
                tool_call_id,
                lag_ms,
            } => {
                metrics.record_timeout(lag_ms);
                tracing::warn!(session = %id, tool_call_id, lag_ms, "client_tool.timeout");
            }
            Observation::Aborted { count } => {
                metrics.record_aborted(count);
                tracing::warn!(session = %id, count, "client_tool.aborted");
            }
            Observation::Abandoned { count } => {
                metrics.record_abandoned(count);
                tracing::warn!(session = %id, count, "client_tool.abandoned");
            }
        }
    }

    pub(super) async fn commit(&self, commit: &schema::Commit) -> Result<(), Error> {
        let batch = commit.encode()?;
        let size = BatchSize::of(&batch);
        let started = Instant::now();
        self.shared.store.commit(batch).await?;
        self.shared.metrics.record_commit(started.elapsed(), &size);
        Ok(())
    }

    /// Publishes the commit's chunks to live followers and tells the scheduler about new
    /// deadlines.
    pub(super) fn after_commit(&self, id: &SessionId, commit: &schema::Commit) {
        let earliest = commit
            .index
            .iter()
            .filter_map(|write| match write {
                IndexWrite::PutDeadline { at, .. } => Some(*at),
                _ => None,
            })
            .min();
        if let (Some(at), Some(scheduler)) = (
            earliest,
            self.shared.scheduler.get().and_then(WeakHost::upgrade),
        ) {
            scheduler.send(SchedulerKey, SchedulerMsg::Armed { at });
        }
        if commit.chunks.is_empty() {
            return;
        }
        let followed = match self.shared.streams.get(id) {
            Some(sender) => {
                for chunk in &commit.chunks {
                    let _ = sender.send(chunk.clone());
                }
                sender.receiver_count() > 0
            }
            None => return,
        };
        if !followed {
            self.shared
                .streams
                .remove_if(id, |_, sender| sender.receiver_count() == 0);
        }
    }
}
