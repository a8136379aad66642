//! The session actor's side of sub-agents: starting and waking children, their reports to the
//! parent, and the background reconciliation of children a crash left marked as running.
//! Parent and child only ever send each other one-way messages through the host, so neither
//! waits on the other and no cycle of sessions can deadlock.

use std::sync::Arc;
use std::time::Duration;

use dormant_actors::{ActorContext, Host, WeakHost};
use tokio::sync::oneshot;

use super::{Loaded, SessionActor, SessionMsg, SessionState};
use crate::error::Error;
use crate::ids::{RunId, SessionId};
use crate::message::ToolOutcome;
use crate::schema;
use crate::session::{
    ChildKind, ChildReport, ChildStart, ChildState, ErrorCode, Input, Resumed, RunOutcome, Session,
    Status,
};
use crate::shared::Shared;
use crate::store::Store;

impl SessionActor {
    /// Starts the child of a sub-agent call, or re-attaches to it if it exists: a child that
    /// ended reports its result again instead of running twice.
    pub(super) async fn start_child(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        start: ChildStart,
    ) {
        let id = ctx.key();
        match self.present(id, state).await {
            Ok(Some(session)) => {
                if session.record().parent.as_ref() != Some(&start.origin.parent) {
                    // Ids are concatenations: refuse to take over a session of another tree.
                    let text =
                        format!("session_id_taken: {id} exists and belongs to another parent");
                    return report(
                        ctx.host(),
                        &start.origin.parent,
                        start.origin.tool_call_id,
                        fail(text),
                    );
                }
                let ChildKind::Companion { fresh } = start.kind else {
                    return self.wake(ctx, state).await;
                };
                let call = &start.origin.tool_call_id;
                if session.record().parent_call.as_ref() == Some(call) {
                    // This call started the companion's current turn already (a replay).
                    return self.wake(ctx, state).await;
                }
                return self.consult(ctx, state, start, fresh).await;
            }
            Ok(None) => {}
            Err(error) => {
                let text = format!("sub_agent_unavailable: child {id} cannot be read: {error}");
                return report(
                    ctx.host(),
                    &start.origin.parent,
                    start.origin.tool_call_id,
                    fail(text),
                );
            }
        }
        let Some(agent) = self
            .shared
            .agents
            .get(&start.agent)
            .map(|agent| Arc::clone(agent.value()))
        else {
            let text = format!("unknown_agent: no agent named {} is defined", start.agent);
            return report(
                ctx.host(),
                &start.origin.parent,
                start.origin.tool_call_id,
                fail(text),
            );
        };
        let now = self.shared.clock.now_ms();
        let policy = Arc::clone(&self.shared.policy);
        let mut session = Session::create_child(id.clone(), agent, policy, now, start.origin);
        let input = Input::Execute {
            run_id: RunId::generate(),
            message: start.message,
        };
        match session.apply(input, now) {
            Ok(transition) => {
                state.loaded = Loaded::Present(Box::new(session));
                // Its settle reports to the parent, and so does a failed commit.
                let _ = self.perform(ctx, state, transition).await;
            }
            Err(error) => {
                let parent = session.record().parent.clone();
                if let (Some(parent), Some(call)) = (parent, session.record().parent_call.clone()) {
                    report(
                        ctx.host(),
                        &parent,
                        call,
                        fail(format!("sub_agent_failed: {error}")),
                    );
                }
            }
        }
    }

    /// A companion's new turn: on its preserved conversation, or fresh. A refusal (its turn is
    /// still running) is the parent's tool error.
    async fn consult(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        start: ChildStart,
        fresh: bool,
    ) {
        let now = self.shared.clock.now_ms();
        let Ok(Some(session)) = self.present(ctx.key(), state).await else {
            return;
        };
        if session.is_busy() {
            // Its run is still stopping (terminated and spawned again in one reply): the new
            // turn starts once that run settles.
            state.deferred_starts.push(start);
            return;
        }
        let parent = start.origin.parent;
        let call = start.origin.tool_call_id;
        if let Err(error) = self.ensure_messages(session) {
            let text = format!("sub_agent_unavailable: {error}");
            return report(ctx.host(), &parent, call, fail(text));
        }
        let input = Input::Consult {
            run_id: RunId::generate(),
            message: start.message,
            tool_call_id: call.clone(),
            fresh,
        };
        match session.apply(input, now) {
            // Its settle reports to the parent, and so does a failed commit.
            Ok(transition) => {
                let _ = self.perform(ctx, state, transition).await;
            }
            Err(error) => {
                let text = format!(
                    "companion_busy: {} cannot take a new turn: {error}",
                    ctx.key()
                );
                report(ctx.host(), &parent, call, fail(text));
            }
        }
    }

    /// The parent wants to go on (a resume cascading down, or a re-attach): resume if
    /// suspended or interrupted, and report where this session stands.
    pub(super) async fn wake(&self, ctx: &ActorContext<Self>, state: &mut SessionState) {
        let now = self.shared.clock.now_ms();
        let session = match self.present(ctx.key(), state).await {
            Ok(Some(session)) => session,
            Ok(None) | Err(_) => return,
        };
        if session.is_busy() {
            // Its run reports when it settles.
            return;
        }
        let resumable = matches!(
            session.record().status,
            Status::SuspendedClientTool
                | Status::SuspendedAwaitingChildren
                | Status::Interrupted
                | Status::Running
        ) && !session.record().aborted;
        if !resumable {
            return self.report_to_parent(session, now);
        }
        if let Err(error) = self.ensure_messages(session) {
            let text = format!("sub_agent_unavailable: {error}");
            return self.send_to_parent(session.record(), fail(text));
        }
        match session.resume(RunId::generate(), now) {
            Ok(Resumed::Started(transition)) => {
                // Its settle reports to the parent, and so does a failed commit.
                let _ = self.perform(ctx, state, *transition).await;
            }
            Ok(Resumed::StillWaiting(_)) | Err(_) => {
                session.release_messages();
                self.report_to_parent(session, now);
            }
        }
    }

    /// A message for a child could not be delivered (it keeps crashing, or cannot be loaded):
    /// its parent records that as the tool's error instead of waiting forever.
    pub(super) fn unreachable_child(
        &self,
        parent: &SessionId,
        tool_call_id: String,
        child: &SessionId,
        error: dormant_actors::Error,
    ) {
        let text = format!(
            "sub_agent_failed: child {child} cannot run: {}",
            super::host_error(error)
        );
        let host = self.shared.sessions.get().and_then(WeakHost::upgrade);
        report(host, parent, tool_call_id, fail(text));
    }

    /// Sends a report to the parent of `record`, if it has one (through the host's weak
    /// handle, so it works inside a handler and outside one alike).
    pub(super) fn send_to_parent(
        &self,
        record: &crate::session::SessionRecord,
        report_: ChildReport,
    ) {
        if let (Some(parent), Some(call)) = (&record.parent, &record.parent_call) {
            let host = self.shared.sessions.get().and_then(WeakHost::upgrade);
            report(host, parent, call.clone(), report_);
        }
    }

    /// Tells the parent (if any) where this session's last run stands.
    pub(super) fn report_to_parent(&self, session: &Session, now: u64) {
        if let Some(report) = child_report(&session.outcome(now), session.record().aborted) {
            self.send_to_parent(session.record(), report);
        }
    }

    /// A child reported: copy its new chunks into this stream and feed the report to the core.
    pub(super) async fn child_reported(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        tool_call_id: String,
        report: ChildReport,
    ) {
        let session = match self.present(ctx.key(), state).await {
            Ok(Some(session)) => session,
            Ok(None) | Err(_) => return,
        };
        let Some((child, forwarded)) = session.report_source(&tool_call_id) else {
            return;
        };
        let chunks = match forwarded
            .map(|from| schema::load_chunks(self.shared.store.as_ref(), &child, from))
        {
            None => Vec::new(),
            Some(Ok(chunks)) => chunks,
            Some(Err(error)) => {
                tracing::warn!(session = %ctx.key(), %child, %error, "subagent.chunks_unreadable");
                Vec::new()
            }
        };
        let input = Input::ChildReported {
            tool_call_id,
            report,
            chunks,
        };
        self.feed(ctx, state, input).await;
    }

    /// Starts reconciling the children a crash left marked as running, once per activation,
    /// in the background: this session serves its messages meanwhile.
    pub(super) fn reconcile_in_background(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
    ) {
        if state.reconciling || state.to_reconcile.is_empty() {
            return;
        }
        let Some(host) = ctx.host() else {
            return;
        };
        state.reconciling = true;
        let snapshot = std::mem::take(&mut state.to_reconcile);
        let shared = Arc::clone(&self.shared);
        let mailbox = ctx.mailbox();
        let session = ctx.key().clone();
        tokio::spawn(async move {
            let bound = shared.child_inspection_timeout;
            let inspections = snapshot.into_iter().map(|(call, child)| {
                let host = host.clone();
                let shared = Arc::clone(&shared);
                async move {
                    let inspected = tokio::time::timeout(bound, inspect(&host, &shared, &child));
                    let state = inspected.await.unwrap_or_else(|_| ChildState::Interrupted {
                        reason: format!(
                            "inspection_timed_out: child {child} did not answer within {} ms",
                            bound.as_millis()
                        ),
                    });
                    (call, state)
                }
            });
            let results = futures::future::join_all(inspections).await;
            tracing::info!(%session, children = results.len(), "subagent.reconciled");
            shared.metrics.record_reconciled(results.len());
            super::send_back(&mailbox, SessionMsg::Reconciled(results));
        });
    }
}

/// Activates the child (which runs its own crash recovery), waits until no run of it is in
/// progress, and reads how it stands from the store.
async fn inspect(host: &Host<SessionActor>, shared: &Shared, child: &SessionId) -> ChildState {
    let (reply, settled) = oneshot::channel();
    host.send(child.clone(), SessionMsg::WaitSettled { reply });
    let _ = settled.await;
    stored_child_state(shared.store.as_ref(), child).unwrap_or_else(|error| {
        ChildState::Interrupted {
            reason: format!("child_unreadable: {error}"),
        }
    })
}

/// How a child stands according to its stored record and last run.
fn stored_child_state(store: &dyn Store, child: &SessionId) -> Result<ChildState, Error> {
    let Some(record) = schema::load_record(store, child)? else {
        return Ok(ChildState::Interrupted {
            reason: format!("child_missing: no session {child} is stored"),
        });
    };
    let run = schema::load_run(store, child, record.run_count)?;
    let outcome = RunOutcome {
        session_id: child.clone(),
        run_id: run.as_ref().map_or_else(RunId::generate, |run| run.run_id),
        turn: record.run_count,
        status: record.status,
        text: run.as_ref().and_then(|run| run.text.clone()),
        output: run.as_ref().and_then(|run| run.output.clone()),
        error: run.and_then(|run| run.error),
        pending: schema::load_pending(store, child)?
            .into_iter()
            .filter(|call| call.answer.is_none())
            .map(|call| call.tool_call_id)
            .collect(),
    };
    Ok(match child_report(&outcome, record.aborted) {
        Some(ChildReport::Finished(outcome)) => ChildState::Finished(outcome),
        // Interrupted, not failed: a companion keeps its conversation, and a resume of the
        // parent re-attaches to an ephemeral child.
        Some(ChildReport::Interrupted(reason)) => ChildState::Interrupted { reason },
        Some(ChildReport::Suspended(waiting)) => ChildState::Suspended { waiting },
        Some(ChildReport::Crashed) | None => ChildState::Interrupted {
            reason: format!("child_interrupted: child {child} was cut by a crash"),
        },
    })
}

/// What a child's run outcome means to its parent; `None` while it is still running.
pub(crate) fn child_report(outcome: &RunOutcome, aborted: bool) -> Option<ChildReport> {
    let error = outcome.error.as_ref();
    Some(match outcome.status {
        Status::Running => return None,
        Status::SuspendedClientTool | Status::SuspendedAwaitingChildren if !aborted => {
            ChildReport::Suspended(outcome.pending.clone())
        }
        Status::Completed => {
            ChildReport::Finished(ToolOutcome::Result(outcome.output.clone().unwrap_or_else(
                || serde_json::Value::String(outcome.text.clone().unwrap_or_default()),
            )))
        }
        Status::Interrupted if error.is_some_and(|error| error.code == ErrorCode::Crashed) => {
            ChildReport::Crashed
        }
        status => {
            let (code, message) = error.map_or(("failed", String::new()), |error| {
                (error.code.as_str(), error.message.clone())
            });
            let text = format!(
                "sub_agent_failed: child {} ended {status} with {code}: {message}",
                outcome.session_id
            );
            if status == Status::Interrupted && !aborted {
                ChildReport::Interrupted(text)
            } else {
                fail(text)
            }
        }
    })
}

fn fail(text: String) -> ChildReport {
    ChildReport::Finished(ToolOutcome::Error(text))
}

/// Sends a report to the parent, activating it if it was evicted.
pub(super) fn report(
    host: Option<Host<SessionActor>>,
    parent: &SessionId,
    tool_call_id: String,
    report: ChildReport,
) {
    if let Some(host) = host {
        host.send(
            parent.clone(),
            SessionMsg::ChildReport {
                tool_call_id,
                report,
            },
        );
    }
}

/// How long recovery waits for one child before writing it off as interrupted.
pub(crate) const DEFAULT_CHILD_INSPECTION_TIMEOUT: Duration = Duration::from_secs(2);
