//! The session actor's side of sub-agents: delivering starts and reports to the core, and the
//! background reconciliation of children a crash left marked as running. The rules (who may
//! start whom, when a child resumes, what it reports) are the core's (`session/children.rs`,
//! `session/child_side.rs`). Parent and child only ever send each other one-way messages
//! through the host, so neither waits on the other and no cycle of sessions can deadlock.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use dormant_actors::{ActorContext, Host};
use futures::FutureExt;
use tokio::sync::oneshot;

use super::reports::Report;
use super::{Handled, Loaded, SessionActor, SessionMsg, SessionState};
use crate::engine::shared::Shared;
use crate::error::Error;
use crate::session::{
    ChildReport, ChildStart, ChildState, ChildUnavailable, Effect, Input, LostChild, ReportedChild,
    Session,
};
use crate::store::schema;
use crate::store::Store;
use crate::types::ids::{RunId, SessionId};

/// How many times the lineage of a failed child is read before its parent is given up on, and
/// the wait before the first retry (doubled each time: about 25 s in all).
const LINEAGE_READS: u32 = 8;
const LINEAGE_RETRY: Duration = Duration::from_millis(100);

/// How long a parent waits before it takes again children's reports it could not record.
const REPORTS_RETRY: Duration = Duration::from_secs(1);

/// Tells the parent of `child`, which the host marked failed, that its call failed (`why`).
/// The parent is read from the child's record: a read that fails (the store's error, or its
/// panic, as a crashing store may well give) is tried again a few times, since a parent
/// nobody tells waits for good.
pub(super) async fn tell_parent_of_failed(
    host: Host<SessionActor>,
    shared: Arc<Shared>,
    child: SessionId,
    why: ChildUnavailable,
) {
    let mut wait = LINEAGE_RETRY;
    for read in 1..=LINEAGE_READS {
        let loaded = AssertUnwindSafe(schema::load_record(shared.store.as_ref(), &child))
            .catch_unwind()
            .await;
        let error = match loaded {
            Ok(Ok(Some(record))) => {
                if let (Some(parent), Some(call)) = (record.parent, record.parent_call) {
                    send_reports(&host, &shared, [why.report(&parent, call)]);
                }
                return;
            }
            // Never stored: no parent waits on it.
            Ok(Ok(None)) => return,
            Ok(Err(error)) => error.to_string(),
            Err(panic) => crate::types::panic::panic_text(panic.as_ref()),
        };
        tracing::warn!(session = %child, read, error = %crate::types::Untrusted(&error), "session.failed_lineage_unread");
        if read < LINEAGE_READS {
            tokio::time::sleep(wait).await;
            wait *= 2;
        }
    }
    tracing::error!(session = %child, reads = LINEAGE_READS, "session.failed_parent_untold: its lineage could not be read; a parent waiting on it is not told");
}

impl SessionActor {
    /// Starts the child of a sub-agent call, or gives a companion a new turn, or re-attaches
    /// to either: the core decides; a child that does not exist yet is created here with the
    /// agent its parent named.
    pub(super) async fn start_child(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        start: ChildStart,
    ) {
        let id = ctx.key();
        let now = self.shared.clock.now_ms();
        let refused = match self.present(id, state).await {
            Ok(Some(_)) => None,
            Ok(None) => match self.shared.agents.get(&start.agent) {
                Some(agent) => {
                    let agent = Arc::clone(agent.value());
                    // A new child holds its tree's lease, which this node holds for its
                    // parent: the two always live on one node.
                    let root = start.origin.root.as_str();
                    match self.shared.leases.acquire(id.as_str(), root).await {
                        Ok(()) => {
                            let policy = Arc::clone(&self.shared.policy);
                            let origin = start.origin.clone();
                            let session =
                                Session::create_child(id.clone(), agent, policy, now, origin);
                            state.loaded = Loaded::Present(Box::new(session));
                            None
                        }
                        Err(error) => Some(ChildUnavailable::NotOwnedHere {
                            child: id.clone(),
                            error: error.to_string(),
                        }),
                    }
                }
                None => Some(ChildUnavailable::UnknownAgent {
                    agent: start.agent.clone(),
                }),
            },
            Err(error) => Some(ChildUnavailable::Unreadable {
                child: id.clone(),
                error: error.to_string(),
            }),
        };
        if let Some(why) = refused {
            let told = why.report(&start.origin.parent, start.origin.tool_call_id);
            self.run_effect(ctx, state, told);
            return;
        }
        let origin = start.origin.clone();
        let run_id = RunId::generate();
        let input = Input::StartChild { run_id, start };
        // A panic here (a store that panics in the child's first commit, say) is the host's to
        // supervise, but the restart finds no child to tell its parent of it if the first
        // commit never landed, and the start message is gone: so the parent is told here,
        // before the panic goes on to the host.
        let fed = AssertUnwindSafe(self.feed(ctx, state, input))
            .catch_unwind()
            .await;
        match fed {
            Ok(Handled::Unread(error)) => {
                // The child (a companion's next turn, a re-attach) cannot be read: its parent
                // records that as the tool's error instead of waiting for good.
                let why = ChildUnavailable::Unreadable {
                    child: ctx.key().clone(),
                    error,
                };
                let told = why.report(&origin.parent, origin.tool_call_id);
                self.run_effect(ctx, state, told);
            }
            Ok(Handled::Yes | Handled::No) => {}
            Err(panic) => {
                let reason = crate::types::panic::panic_text(panic.as_ref());
                self.never_started(ctx, origin, run_id, reason).await;
                std::panic::resume_unwind(panic);
            }
        }
    }

    /// This session's parent goes on (a resume cascading down) and waits for its report. A
    /// session that cannot be read reports that instead. A run going on that panics before its
    /// first commit lands leaves the session as it was, and its restart nothing cut to tell the
    /// parent of: the wake is sent again, to be handled after the restart (a session that
    /// keeps crashing is failed by the host, which tells the parent). A wake sent `again` that
    /// finds the session no longer suspended (stopped meanwhile, its parent may have forgotten
    /// it) does not resume it: the session reports where it stands.
    pub(super) async fn wake(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        (parent, tool_call_id): (SessionId, String),
        child: SessionId,
        again: bool,
    ) {
        if again {
            let now = self.shared.clock.now_ms();
            if let Ok(Some(session)) = self.present(ctx.key(), state).await {
                if !session.is_suspended() {
                    if let Some(report) = session.report(now) {
                        self.run_effect(ctx, state, report);
                    }
                    return;
                }
            }
        }
        let run_id = RunId::generate();
        let fed = AssertUnwindSafe(self.feed(ctx, state, Input::Wake { run_id }))
            .catch_unwind()
            .await;
        match fed {
            Ok(Handled::Unread(error)) => {
                let why = ChildUnavailable::Unreadable { child, error };
                self.run_effect(ctx, state, why.report(&parent, tool_call_id));
            }
            Ok(Handled::Yes | Handled::No) => {}
            Err(panic) => {
                let store = self.shared.store.as_ref();
                let read = AssertUnwindSafe(restart_tells(store, ctx.key(), run_id, &tool_call_id))
                    .catch_unwind()
                    .await;
                if !matches!(read, Ok(Ok(true))) {
                    if let Some(host) = ctx.host() {
                        let wake = SessionMsg::Wake {
                            parent,
                            tool_call_id,
                            child,
                            again: true,
                        };
                        host.send(ctx.key().clone(), wake);
                    }
                }
                std::panic::resume_unwind(panic);
            }
        }
    }

    /// A child's start panicked: unless its restart will tell the parent itself, the parent
    /// records the call as `sub_agent_failed`. The restart tells of a run of this call that
    /// was cut (the reload closes it as crashed): the run this start began, if it landed, or
    /// the one a crash cut before this start re-attached to it. A run that never landed over
    /// nothing cut leaves the restart nothing to tell (no child at all, or a companion at its
    /// last turn's end). A child that cannot be read back counts as telling nothing: a parent
    /// waiting forever is worse than a tool error for a run that may exist.
    async fn never_started(
        &self,
        ctx: &ActorContext<Self>,
        origin: crate::session::ChildOrigin,
        run_id: RunId,
        reason: String,
    ) {
        let id = ctx.key();
        let store = self.shared.store.as_ref();
        let call = &origin.tool_call_id;
        let read = AssertUnwindSafe(restart_tells(store, id, run_id, call))
            .catch_unwind()
            .await;
        if matches!(read, Ok(Ok(true))) {
            return;
        }
        tracing::error!(session = %id, parent = %origin.parent, %reason, "subagent.start_panicked");
        let why = ChildUnavailable::CrashedBeforeFirstCommit {
            child: id.clone(),
            panic: reason,
        };
        if let Some(host) = ctx.host() {
            send_reports(
                &host,
                &self.shared,
                [why.report(&origin.parent, origin.tool_call_id)],
            );
        }
    }

    /// Children queued reports for this session: up to a commit's worth is taken, each
    /// one's new chunks read (a report carries none), and all fed to the core as one input.
    /// A queue left longer than that nudges this session again, through the host.
    pub(super) async fn reports_waiting(&self, ctx: &ActorContext<Self>, state: &mut SessionState) {
        let (taken, more) = self.shared.reports.take(ctx.key());
        if more {
            if let Some(host) = ctx.host() {
                let parent = ctx.key().clone();
                host.send(parent.clone(), SessionMsg::ReportsWaiting { parent });
            }
        }
        // Nothing left to record (the queue was emptied, or its reports have no call here
        // any more): a count of earlier failures to record them goes too.
        let nothing_to_record = || self.shared.reports.recorded(ctx.key());
        if taken.is_empty() {
            return nothing_to_record();
        }
        let kept = taken.clone();
        let session = match self.present(ctx.key(), state).await {
            Ok(Some(session)) => session,
            Ok(None) => return nothing_to_record(),
            Err(_) => return self.report_again_later(ctx, kept),
        };
        let mut reports = Vec::with_capacity(taken.len());
        for (tool_call_id, report) in taken {
            let Some((child, forwarded)) = session.report_source(&tool_call_id) else {
                continue;
            };
            let chunks = match forwarded {
                None => Ok(Vec::new()),
                Some(from) => schema::load_chunks(self.shared.store.as_ref(), &child, from).await,
            };
            let chunks = chunks.unwrap_or_else(|error| {
                tracing::warn!(session = %ctx.key(), %child, error = %crate::types::Untrusted(&error), "subagent.chunks_unreadable");
                Vec::new()
            });
            reports.push(ReportedChild {
                tool_call_id,
                report,
                chunks,
            });
        }
        if reports.is_empty() {
            return nothing_to_record();
        }
        let fed = self
            .feed(ctx, state, Input::ChildrenReported { reports })
            .await;
        if fed == Handled::Yes {
            self.shared.reports.recorded(ctx.key());
        } else {
            self.report_again_later(ctx, kept);
        }
    }

    /// Children's reports this session took but did not record (it could not be read, or
    /// its commit failed): like a failed commit's answer they are not lost, but queued again
    /// and taken again later, twice as late each time in a row (a store that keeps failing is
    /// not asked in a busy loop), a few times. A report recorded meanwhile (the child's state
    /// is where it says) changes nothing when it comes again.
    fn report_again_later(&self, ctx: &ActorContext<Self>, reports: Vec<Report>) {
        let parent = ctx.key().clone();
        tracing::warn!(session = %parent, reports = reports.len(), "subagent.reports_requeued");
        let Some(times) = self.shared.reports.requeue(parent.clone(), reports) else {
            return;
        };
        if let Some(host) = ctx.host() {
            let later = REPORTS_RETRY.saturating_mul(1 << (times - 1).min(6));
            tokio::spawn(async move {
                tokio::time::sleep(later).await;
                host.send(parent.clone(), SessionMsg::ReportsWaiting { parent });
            });
        }
    }

    /// Starts reconciling the children a crash left marked as running, once per activation,
    /// in the background: this session serves its messages meanwhile.
    pub(super) fn reconcile_in_background(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
    ) {
        let waiting = &state.to_reconcile;
        if state.reconciling || (waiting.inspect.is_empty() && waiting.watch.is_empty()) {
            return;
        }
        let Some(host) = ctx.host() else {
            return;
        };
        let crate::session::ToReconcile {
            inspect: snapshot,
            watch,
        } = std::mem::take(&mut state.to_reconcile);
        // A remote child is asked for its status by a driver, which reports like a child.
        for drive in watch {
            self.drive_remote(ctx, state, drive);
        }
        if snapshot.is_empty() {
            return;
        }
        state.reconciling = true;
        let ticket = state.outside.start();
        let shared = Arc::clone(&self.shared);
        let mailbox = ctx.mailbox();
        let session = ctx.key().clone();
        tokio::spawn(async move {
            let bound = shared.child_inspection_timeout;
            let inspections = snapshot.into_iter().map(|(call, child)| {
                let host = host.clone();
                let shared = Arc::clone(&shared);
                async move {
                    // A store that panics on the child's keys (sled does, on some damage) must
                    // not leave the parent at work for good, its report never sent: the child
                    // counts as one that cannot be read.
                    let guarded = AssertUnwindSafe(inspect(&host, &shared, &child)).catch_unwind();
                    let state = match tokio::time::timeout(bound, guarded).await {
                        Ok(Ok(state)) => state,
                        Ok(Err(panic)) => {
                            let panic = crate::types::panic::panic_text(panic.as_ref());
                            tracing::error!(%child, %panic, "subagent.inspection_panicked");
                            LostChild::Unreadable {
                                error: format!("its inspection panicked: {panic}"),
                            }
                            .state()
                        }
                        Err(_) => {
                            let after_ms = bound.as_millis();
                            LostChild::InspectionTimedOut { child, after_ms }.state()
                        }
                    };
                    (call, state)
                }
            });
            let results = futures::future::join_all(inspections).await;
            tracing::info!(%session, children = results.len(), "subagent.reconciled");
            shared.metrics.record_reconciled(results.len());
            super::send_back(&mailbox, SessionMsg::Reconciled { ticket, results });
        });
    }
}

/// A message for a child could not be delivered (it keeps crashing, or cannot be loaded): its
/// parent records that as the tool's error instead of waiting forever.
pub(super) fn unreachable_child(
    host: &Host<SessionActor>,
    shared: &Shared,
    parent: &SessionId,
    tool_call_id: String,
    child: &SessionId,
    error: super::HostError,
) {
    let why = ChildUnavailable::CannotRun {
        child: child.clone(),
        error: super::host_error(error).to_string(),
    };
    send_reports(host, shared, [why.report(parent, tool_call_id)]);
}

/// Sends the reports among `effects` from a host callback (outside a handler).
pub(super) fn send_reports(
    host: &Host<SessionActor>,
    shared: &Shared,
    effects: impl IntoIterator<Item = Effect>,
) {
    for effect in effects {
        if let Effect::Report {
            parent,
            tool_call_id,
            report,
        } = effect
        {
            report_to(host, shared, parent, tool_call_id, report);
        }
    }
}

/// Queues a child's report for its `parent`, and nudges the parent if nothing else will (see
/// `actor/reports.rs`).
pub(super) fn report_to(
    host: &Host<SessionActor>,
    shared: &Shared,
    parent: SessionId,
    tool_call_id: String,
    report: ChildReport,
) {
    if shared.reports.push(parent.clone(), (tool_call_id, report)) {
        host.send(parent.clone(), SessionMsg::ReportsWaiting { parent });
    }
}

/// Activates the child (which runs its own crash recovery), waits until no run of it is in
/// progress, and reads how it stands from the store.
async fn inspect(host: &Host<SessionActor>, shared: &Shared, child: &SessionId) -> ChildState {
    let (reply, settled) = oneshot::channel();
    host.send(child.clone(), SessionMsg::WaitSettled { reply });
    let _ = settled.await;
    match read_child(shared.store.as_ref(), child).await {
        Ok(stored) => crate::session::stored_state(child, stored),
        Err(error) => LostChild::Unreadable {
            error: error.to_string(),
        }
        .state(),
    }
}

/// Whether the restart of child `id`, whose start of a run (`run_id`) for `call` panicked,
/// tells its parent itself: whether the child's stored run for the call is one its reload
/// closes as cut by a crash (see [`SessionActor::never_started`]).
async fn restart_tells(
    store: &dyn Store,
    id: &SessionId,
    run_id: RunId,
    call: &str,
) -> Result<bool, Error> {
    let Some(record) = schema::load_record(store, id).await? else {
        return Ok(false);
    };
    if record.current_run == Some(run_id) {
        return Ok(true);
    }
    if record.parent_call.as_deref() != Some(call) {
        return Ok(false);
    }
    Ok(match record.status {
        crate::types::record::Status::Running => true,
        crate::types::record::Status::Interrupted => schema::load_run(store, id, record.run_count)
            .await?
            .and_then(|run| run.error)
            .is_some_and(|error| {
                matches!(
                    error.code,
                    crate::types::record::ErrorCode::Crashed
                        | crate::types::record::ErrorCode::ForkPoint
                )
            }),
        _ => false,
    })
}

/// What the store holds of a child: its record, its last run and its pending calls.
type StoredChild = (
    crate::session::SessionRecord,
    Option<crate::session::RunRecord>,
    Vec<crate::session::PendingCall>,
);

async fn read_child(store: &dyn Store, child: &SessionId) -> Result<Option<StoredChild>, Error> {
    let Some(record) = schema::load_record(store, child).await? else {
        return Ok(None);
    };
    let run = schema::load_run(store, child, record.run_count).await?;
    let pending = schema::load_pending(store, child).await?;
    Ok(Some((record, run, pending)))
}

/// How long recovery waits for one child before writing it off as interrupted.
pub(crate) const DEFAULT_CHILD_INSPECTION_TIMEOUT: Duration = Duration::from_secs(2);
