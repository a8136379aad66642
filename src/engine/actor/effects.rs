//! Executing a transition: its commit first, then its effects in order.

use std::sync::Arc;

use dormant_actors::ActorContext;

use super::{send_back, Loaded, SessionActor, SessionMsg, SessionState};
use crate::engine::deadlines::SchedulerMsg;
use crate::engine::dispatch::{run_step, StepContext};
use crate::error::Error;
use crate::session::{ChildAt, Effect, Input, Observation, Status, Transition};
use crate::store::schema;
use crate::types::ids::SessionId;
use crate::types::stream::{Delta, StreamEvent};
use crate::types::Untrusted;
use tracing::Instrument;

/// Answers everyone waiting on the session's run, which a failed commit (or a lost lease) cut:
/// the first gets `typed`, the others `SessionUnavailable` with `reason` in words (store errors
/// are not cloneable). With `lease_lost`, a waiter for whom a commit of its run already landed
/// gets [`Error::RunCut`] instead: a lost lease, typed, says that nothing was written, and the
/// call would be sent to the node that took the tree over, to run its message again there.
/// Settle waiters are let go. Returns `typed` if nobody took it.
pub(super) fn answer_cut_waiters(
    id: &SessionId,
    state: &mut SessionState,
    mut typed: Option<Error>,
    reason: &str,
    lease_lost: bool,
) -> Option<Error> {
    let landed = std::mem::take(&mut state.landed_for);
    for (n, waiter) in state.waiters.drain(..).enumerate() {
        let answer = if lease_lost && n < landed {
            Error::RunCut {
                session: id.clone(),
                reason: reason.to_string(),
            }
        } else {
            typed.take().unwrap_or_else(|| Error::SessionUnavailable {
                session: id.clone(),
                reason: reason.to_string(),
            })
        };
        let _ = waiter.send(Err(answer));
    }
    state.settle_waiters.clear();
    typed
}

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
            if let Err(error) = self.shared.commit(&commit).await {
                tracing::error!(session = %ctx.key(), error = %Untrusted(&error), "session.commit_failed");
                let fenced = matches!(&error, Error::Store(crate::store::Error::LeaseLost { .. }));
                let reason = error.to_string();
                let unavailable = || Error::SessionUnavailable {
                    session: ctx.key().clone(),
                    reason: reason.clone(),
                };
                // The caller waiting for this run gets the typed store error; anyone else
                // joined to it learns why in words (store errors are not cloneable). But a
                // waiter for whom a commit of its run already landed does not get a lost
                // lease typed: typed, it says that nothing was written, and the call would be
                // sent to the node that took the tree over, to run its message again there.
                let typed = answer_cut_waiters(ctx.key(), state, Some(error), &reason, fenced);
                if fenced {
                    // Another node owns the session now: this actor stops, having acknowledged
                    // nothing of the commit (its parent is not told: the session lives on
                    // there); its next activation asks for the lease again.
                    tracing::warn!(session = %ctx.key(), "session.lease_lost");
                    state.work.cancel();
                    state.loaded = Loaded::Unreadable;
                    if let Some(host) = ctx.host() {
                        host.evict(ctx.key());
                    }
                    return Err(typed.unwrap_or_else(unavailable));
                }
                // A child's parent waits for it: it learns of the failure as the tool's error.
                let now = self.shared.clock.now_ms();
                let told = match &mut state.loaded {
                    Loaded::Present(session) => {
                        let failed = Input::CommitFailed {
                            reason: reason.clone(),
                        };
                        session.apply(failed, now).map(|told| told.effects)
                    }
                    _ => Ok(Vec::new()),
                };
                // The run is cut as by a crash: its work in flight goes, and what the store holds
                // is read back, with the run closed as interrupted (the at-most-once rule
                // decides what its cut calls become when it goes on).
                state.work.cancel();
                state.loaded = self
                    .load_recovered(ctx.key())
                    .await
                    .unwrap_or(Loaded::Unreadable);
                // Unless no run was cut: a suspended child (its timeout's commit failed, or
                // the first of the run its wake began) is read back suspended, its calls
                // still open. Its parent hears where it stands, which a wake waits for; a
                // failed call would be final, and the child's answers would reach no one.
                let standing = match &state.loaded {
                    Loaded::Present(session) => session.suspended_report(now),
                    _ => None,
                };
                let effects = match standing {
                    Some(report) => vec![report],
                    None => told.unwrap_or_default(),
                };
                for effect in effects {
                    self.run_effect(ctx, state, effect);
                }
                return Err(typed.unwrap_or_else(unavailable));
            }
            // Every waiter so far has seen a commit of its run land.
            state.landed_for = state.waiters.len();
            self.publish(ctx.key(), &commit);
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
                after_seq,
                mut request,
                skills,
            } => {
                request.deltas = delta_sink(&self.shared, ctx.key(), run_id, step, after_seq);
                let chat = {
                    let origin = run_origin(&state.loaded);
                    let provider = self.shared.llm.provider();
                    let tracing = &self.shared.telemetry;
                    state
                        .spans
                        .chat(tracing, &origin, run_id, &request, provider)
                };
                let llm = Arc::clone(&self.shared.llm);
                let mailbox = ctx.mailbox();
                let span = run_span(ctx.key(), run_id, step);
                state.work.spawn(
                    async move {
                        if let Some(skills) = skills {
                            skills.extend_prompt(&mut request).await;
                        }
                        let reply = crate::llm::complete_caught(llm.as_ref(), request).await;
                        chat.end(&reply);
                        send_back(
                            &mailbox,
                            SessionMsg::Feed(Input::ModelReplied {
                                run_id,
                                step,
                                reply,
                            }),
                        );
                    }
                    .instrument(span),
                );
            }
            Effect::RunTools {
                agent,
                run_id,
                step,
                parallel,
                sequential,
                state: custom_state,
                reply_seq,
                checks,
                answers,
            } => {
                let origin = crate::telemetry::RunOrigin {
                    agent: Some(&agent),
                    ..run_origin(&state.loaded)
                };
                state
                    .spans
                    .run(&self.shared.telemetry, &origin, ctx.key(), run_id);
                let step_context = StepContext {
                    agent,
                    session: ctx.key().clone(),
                    run_id,
                    state: custom_state,
                    reply_seq,
                    checks,
                    answers,
                };
                let mailbox = ctx.mailbox();
                let span = run_span(ctx.key(), run_id, step);
                state.work.spawn(
                    async move {
                        let outcomes = run_step(step_context, parallel, sequential).await;
                        send_back(
                            &mailbox,
                            SessionMsg::Feed(Input::ToolsFinished {
                                run_id,
                                step,
                                outcomes,
                            }),
                        );
                    }
                    .instrument(span),
                );
            }
            Effect::StartChild(start) => {
                if let Some(host) = ctx.host() {
                    host.send(start.child.clone(), SessionMsg::StartChild(start));
                }
            }
            Effect::WakeChildren(children) => {
                let woken = children.iter().map(|(call, _)| call.as_str()).collect();
                self.shared.reports.superseded(ctx.key(), &woken);
                if let Some(host) = ctx.host() {
                    for (tool_call_id, child) in children {
                        let parent = ctx.key().clone();
                        host.send(
                            child.clone(),
                            SessionMsg::Wake {
                                parent,
                                tool_call_id,
                                child,
                                again: false,
                            },
                        );
                    }
                }
            }
            Effect::DriveRemote(drive) => self.drive_remote(ctx, state, drive),
            Effect::StopChildren { children, abort } => {
                let mut here = Vec::new();
                let mut remotes = Vec::new();
                for ChildAt { child, remote } in children {
                    match remote {
                        Some(remote) => remotes.push((child, remote)),
                        None => here.push(child),
                    }
                }
                self.stop_remotes(ctx, state, remotes, abort);
                if let Some(host) = ctx.host() {
                    for child in here {
                        // Nobody waits for the answer: the child reports as its run ends, and
                        // stops its own children.
                        host.send(child, SessionMsg::Stop { abort, reply: None });
                    }
                }
            }
            Effect::CancelWork => state.work.cancel(),
            Effect::QuestionClosed {
                agent,
                tool,
                idempotency_key,
            } => {
                if let Some(crate::definition::ToolKind::Server(handler)) =
                    agent.tool(&tool).map(|tool| &tool.def.kind)
                {
                    crate::engine::dispatch::question_closed(
                        handler.as_ref(),
                        &idempotency_key,
                        ctx.key(),
                        &tool,
                    );
                }
            }
            Effect::Hook(event) => {
                let origin = run_origin(&state.loaded);
                state.spans.hook(&self.shared.telemetry, &origin, &event);
                crate::types::hooks::notify(self.shared.hooks.as_ref(), &event);
            }
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
            Effect::Report {
                parent,
                tool_call_id,
                report,
            } => {
                if let Some(host) = ctx.host() {
                    super::children::report_to(&host, &self.shared, parent, tool_call_id, report);
                }
            }
            Effect::StartAgain(start) => {
                // Through the host, as for an automatic resume: a passivation may be queued.
                if let Some(host) = ctx.host() {
                    host.send(ctx.key().clone(), SessionMsg::StartChild(start));
                }
            }
            Effect::ArmDeadline { at } => self.deadlines.send(SchedulerMsg::Armed { at }),
            Effect::Settle(outcome) => {
                state.spans.settle(&self.shared.telemetry, &outcome);
                if let Loaded::Present(session) = &mut state.loaded {
                    session.release_messages();
                    // The agent keeps fewer checkpoints: once the run has answered, after it.
                    let ended = matches!(outcome.status, Status::Completed | Status::Failed);
                    let retention = session.agent().retention();
                    if let (true, false, Some(host)) = (ended, retention.is_all(), ctx.host()) {
                        let reply = None;
                        host.send(ctx.key().clone(), SessionMsg::Compact { retention, reply });
                    }
                }
                state.landed_for = 0;
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
                tracing::debug!(session = %id, tool_call_id = %Untrusted(&tool_call_id), tool_name = %Untrusted(&tool_name), deadline_at_ms, "client_tool.suspended");
            }
            Observation::Answered {
                tool_call_id,
                wait_ms,
                has_error,
            } => {
                metrics.record_answer(wait_ms);
                tracing::debug!(session = %id, tool_call_id = %Untrusted(&tool_call_id), wait_ms, has_error, "client_tool.answered");
            }
            Observation::TimedOut {
                tool_call_id,
                lag_ms,
            } => {
                metrics.record_timeout(lag_ms);
                tracing::warn!(session = %id, tool_call_id = %Untrusted(&tool_call_id), lag_ms, "client_tool.timeout");
            }
            Observation::Aborted { count } => {
                metrics.record_aborted(count);
                tracing::warn!(session = %id, count, "client_tool.aborted");
            }
            Observation::Abandoned { count } => {
                metrics.record_abandoned(count);
                tracing::warn!(session = %id, count, "client_tool.abandoned");
            }
            Observation::CallIdAssigned {
                original,
                assigned,
                reason,
            } => {
                // The model's id is untrusted text: escaped and cut short before it is logged.
                let original = crate::types::Untrusted(&original);
                tracing::warn!(session = %id, %original, tool_call_id = %assigned, reason, "tool_call.id_assigned");
            }
        }
    }

    /// Publishes a durable commit's chunks to the session's live followers.
    pub(super) fn publish(&self, id: &SessionId, commit: &schema::Commit) {
        if commit.chunks.is_empty() {
            return;
        }
        let followed = match self.shared.streams.get(id) {
            Some(sender) => {
                for chunk in &commit.chunks {
                    let _ = sender.send(StreamEvent::Chunk(chunk.clone()));
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

/// The sink of one model call's deltas: each goes to the session's live followers, if it has
/// any at that moment (a map lookup otherwise).
fn delta_sink(
    shared: &Arc<crate::engine::shared::Shared>,
    session: &crate::types::ids::SessionId,
    run_id: crate::types::ids::RunId,
    step: u32,
    after_seq: u64,
) -> crate::llm::DeltaSink {
    let shared = Arc::downgrade(shared);
    let session = session.clone();
    crate::llm::DeltaSink::new(move |index, kind| {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let Some(sender) = shared.streams.get(&session).map(|entry| entry.clone()) else {
            return;
        };
        let delta = Delta {
            run_id,
            step,
            index,
            after_seq,
            kind,
        };
        let _ = sender.send(StreamEvent::Delta(delta));
    })
}

/// What a session's spans are named and linked by, from what is loaded.
fn run_origin(loaded: &Loaded) -> crate::telemetry::RunOrigin<'_> {
    match loaded {
        Loaded::Present(session) => crate::telemetry::RunOrigin {
            agent: Some(session.agent()),
            traceparent: session
                .record()
                .remote_parent
                .as_ref()
                .and_then(|parent| parent.traceparent.as_deref()),
        },
        _ => crate::telemetry::RunOrigin::default(),
    }
}

/// The span of a run's work in flight (a model call, a step's tools): a subscriber follows
/// one session by its `session` field, one run by its `run` field.
fn run_span(
    session: &crate::types::ids::SessionId,
    run_id: crate::types::ids::RunId,
    step: u32,
) -> tracing::Span {
    tracing::info_span!("run", session = %session, run = %run_id, step)
}
