//! The session actor: one per live session id, the only writer of its state. It holds no
//! rules: it turns each message into an [`Input`] of the [`Session`] core, makes the
//! transition's commit durable, then executes its effects (`effects.rs`); accepted submits are
//! committed beside the mailbox (`submit.rs`); children are started and recovery reconciles
//! them in the background (`children.rs`).

mod children;
mod effects;
mod outside;
mod remote;
pub(crate) mod reports;
mod submit;
mod work;

pub(crate) use children::DEFAULT_CHILD_INSPECTION_TIMEOUT;
pub(crate) use remote::orphan;

use std::sync::Arc;

use dormant_actors::{ActorContext, Host, Mailbox, VirtualActor};
use tracing::Instrument;

use children::{send_reports, unreachable_child};
use tokio::sync::oneshot;

use crate::definition::AgentDefinition;
use crate::engine::shared::Shared;
use crate::error::Error;
use crate::session::submit::SubmitOutcome;
use crate::session::{
    ChildStart, ChildState, Effect, Input, RunOutcome, RunStarted, Session, Stored, Submission,
};
use crate::store::schema;
use crate::types::ids::{RunId, SessionId};

type RunReply = oneshot::Sender<Result<RunOutcome, Error>>;
type StartReply = oneshot::Sender<Result<RunStarted, Error>>;

/// Who waits on a request that starts (or resumes) a run, and for what.
#[derive(Debug)]
pub(crate) enum Reply {
    /// Until the run ends or suspends.
    Settled(RunReply),
    /// Until the request's first commit is durable (the run then goes on without a waiter).
    Started(StartReply),
}

impl Reply {
    fn fail(self, error: Error) {
        match self {
            Reply::Settled(reply) => {
                let _ = reply.send(Err(error));
            }
            Reply::Started(reply) => {
                let _ = reply.send(Err(error));
            }
        }
    }
}

/// The answer to a [`SessionMsg::Stop`]: the children the stopped session asked to stop, each
/// with whether to abort it.
pub(crate) type StopReply = oneshot::Sender<Result<Vec<StopTarget>, Error>>;

/// A child a stopped session asked to stop: whether to abort it, and where it lives if it is
/// a remote child (the caller walking the tree stops it there).
pub(crate) type StopTarget = (SessionId, bool, Option<crate::remote::RemoteChild>);

/// Requests a session actor handles. Replies travel in `reply`.
#[derive(Debug)]
pub(crate) enum SessionMsg {
    /// Start a run (creating the session if it does not exist).
    Execute {
        agent: Arc<AgentDefinition>,
        message: String,
        reply: Reply,
        /// Only if the session does not exist yet (a remote parent's start, replayed or not).
        new_only: bool,
        /// The parent on another server that starts it as its remote child (with `new_only`).
        remote_parent: Option<crate::remote::RemoteParent>,
    },
    /// Continue a suspended or interrupted run; joins a run already in progress.
    Resume { reply: Option<Reply> },
    /// An answer for one of this session's pending calls (routed here by the router).
    Submit {
        root: SessionId,
        tool_call_id: String,
        submission: Submission,
        reply: oneshot::Sender<Result<SubmitOutcome, Error>>,
    },
    /// A deadline passed (sent by the scheduler); answered once the timeout is recorded.
    Timeout {
        tool_call_id: String,
        /// Whether this node applied it as the session's owner (or the session has no such
        /// call): `false` leaves the deadline for the owner.
        reply: oneshot::Sender<bool>,
    },
    /// A durable interrupt, or with `abort` a terminal abort. With a `reply`, the caller walks
    /// the tree: the children this session stops are not told here but handed back, for the
    /// caller to stop in turn (so it knows when the whole tree has stopped). Without one (a
    /// parent stopping its children), this session stops its own children itself.
    Stop {
        abort: bool,
        reply: Option<StopReply>,
    },
    /// Answered when no run is in progress.
    WaitSettled { reply: oneshot::Sender<()> },
    /// Answered at once: whether the session is settled (nothing of it at work) now.
    IsSettled { reply: oneshot::Sender<bool> },
    /// A pipelined submit's commit finished (sent by the commit's own task).
    SubmitSettled,
    /// Work the actor started finished: the model answered, or dispatched tools returned
    /// (sent by the actor's own tasks, fed to the core as it is).
    Feed(Input),
    /// Start this session as the child of a sub-agent call (or re-attach to it).
    StartChild(ChildStart),
    /// The parent goes on: resume if suspended, and report where this session stands.
    Wake {
        parent: SessionId,
        tool_call_id: String,
        /// The session woken (named in the parent's error if it cannot be reached).
        child: SessionId,
        /// Sent again by the session itself, after handling the first panicked: it goes on
        /// only if the session is still suspended (a stop may have come in between).
        again: bool,
    },
    /// Children of this session queued reports for it (`actor/reports.rs`): sent by the
    /// child whose report found the queue empty.
    ReportsWaiting {
        /// This session (named so that a nudge the host cannot deliver lets its queue go).
        parent: SessionId,
    },
    /// A remote child's driver finished: where the child stands, or that its server did not
    /// answer. Sent by the driver's task, once per driver.
    RemoteReport {
        tool_call_id: String,
        driven: crate::remote::Driven,
        /// The driver was a watch.
        watch: bool,
        ticket: outside::Ticket,
    },
    /// An answer for a call under the remote child of `tool_call_id` was accepted at the
    /// remote (sent by the router's forward).
    RemoteAnswered { tool_call_id: String },
    /// Background recovery finished inspecting the children recorded as running.
    Reconciled {
        ticket: outside::Ticket,
        results: Vec<(String, ChildState)>,
    },
    /// Become a fork: write this history (`runtime/fork.rs`) as the session's first commit,
    /// under the session's lease. Refused if the session exists.
    Fork {
        batch: crate::store::Batch,
        reply: oneshot::Sender<Result<(), Error>>,
    },
    /// Keep the newest `keep` checkpoints and merge the older ones (`runtime/fork.rs`); sent
    /// without a reply by the session itself when a run ends and its agent keeps fewer.
    Compact {
        retention: crate::types::Retention,
        reply: Option<oneshot::Sender<Result<crate::types::Compaction, Error>>>,
    },
}

/// The session actor's behaviour (stateless: the state lives in [`SessionState`]).
#[derive(Debug)]
pub(crate) struct SessionActor {
    pub(crate) shared: Arc<Shared>,
    /// Told of the deadlines its commits arm.
    pub(crate) deadlines: crate::engine::deadlines::Deadlines,
}

/// What a resident session actor holds.
#[derive(Debug)]
pub(crate) enum Loaded {
    /// No session has this id yet.
    Absent,
    /// The session (boxed: it is large, and most resident actors of a busy host hold one).
    Present(Box<Session>),
    /// The stored session cannot be read; every request answers why (and retries the read).
    Unreadable,
}

/// A resident session: what was loaded, and who waits for the current run to settle.
#[derive(Debug)]
pub(crate) struct SessionState {
    loaded: Loaded,
    waiters: Vec<RunReply>,
    /// How many of `waiters` (the first ones) have seen a commit of their run land: a lost
    /// lease is no longer "nothing written" for them.
    landed_for: usize,
    settle_waiters: Vec<oneshot::Sender<()>>,
    /// Accepted submits whose commits are in flight (see `submit.rs`).
    inflight: submit::InFlightSubmits,
    /// Children recorded as running when the session was loaded (a crash cut their parent's
    /// step): reconciled in the background, once (inspected here, or watched if remote).
    to_reconcile: crate::session::ToReconcile,
    /// The background reconciliation was started and has not reported (it is counted in
    /// `outside` too).
    reconciling: bool,
    /// Work this activation started outside the actor that has not reported yet (remote
    /// children's drivers and stops, the reconciliation): work in progress, as a local child's
    /// run is (a settled session has none).
    outside: outside::Outside,
    /// The calls whose remote child a watch follows now: one watch of a child at a time. A
    /// watch asked for meanwhile (a look fell due, another answer was accepted there) runs
    /// once the one in flight has reported, as one, since what it would learn may be newer.
    remote_watches: std::collections::HashMap<String, Option<crate::session::RemoteDrive>>,
    /// An automatic resume was sent to this session and has not been handled yet.
    resume_queued: bool,
    /// The model call or tools in flight, cancelled by an interrupt or abort (and when the
    /// actor stops).
    work: work::InFlight,
    /// The OpenTelemetry span of the run in progress (nothing without the `otel` feature).
    spans: crate::telemetry::SessionSpans,
}

impl VirtualActor for SessionActor {
    type Key = SessionId;
    type Msg = SessionMsg;
    type State = SessionState;
    type Error = Error;

    /// Another node took the session's tree between the call's route and this activation: an
    /// answer (the call is routed once more), not a fault.
    fn is_refusal(&self, error: &Error) -> bool {
        matches!(error, Error::Store(crate::store::Error::LeaseHeld { .. }))
    }

    async fn activate(&self, id: &SessionId) -> Result<SessionState, Error> {
        // After a panic, answers an earlier state was committing may not have landed yet:
        // they land (or fail, fenced) under the lease they were made under, before this node
        // takes it again.
        self.shared.landing.settled(id).await;
        self.take_lease(id).await?;
        let loaded = match self.load_recovered(id).await {
            Ok(loaded) => loaded,
            Err(error) => {
                tracing::warn!(session = %id, error = %crate::types::Untrusted(&error), "session.unreadable");
                Loaded::Unreadable
            }
        };
        let to_reconcile = match &loaded {
            // A snapshot taken before anything runs: children started from now on are never
            // part of it.
            Loaded::Present(session) => session.children_to_reconcile(),
            _ => crate::session::ToReconcile::default(),
        };
        tracing::debug!(session = %id, "session.activated");
        Ok(SessionState {
            loaded,
            waiters: Vec::new(),
            landed_for: 0,
            settle_waiters: Vec::new(),
            inflight: submit::InFlightSubmits::default(),
            to_reconcile,
            reconciling: false,
            outside: outside::Outside::new(),
            remote_watches: std::collections::HashMap::new(),
            resume_queued: false,
            work: work::InFlight::default(),
            spans: Default::default(),
        })
    }

    async fn handle(&self, ctx: &ActorContext<Self>, msg: SessionMsg, state: &mut SessionState) {
        // Everything the actor logs while it handles a message is inside its session's span.
        let span = tracing::info_span!("session", session = %ctx.key());
        self.handle_in_span(ctx, msg, state).instrument(span).await;
    }
    fn can_passivate(&self, state: &SessionState) -> bool {
        !state.resume_queued
            && state.waiters.is_empty()
            && state.settle_waiters.is_empty()
            && state.inflight.is_empty()
            && state.outside.is_idle()
            && state.to_reconcile.inspect.is_empty()
            && state.to_reconcile.watch.is_empty()
            && !matches!(&state.loaded, Loaded::Present(session) if session.is_busy())
    }

    fn restarted(&self, host: &Host<Self>, _id: &SessionId, state: &mut SessionState) {
        // A child whose run the panic cut tells its parent, which wakes it to go on.
        if let Loaded::Present(session) = &mut state.loaded {
            let now = self.shared.clock.now_ms();
            if let Ok(transition) = session.apply(Input::Restarted, now) {
                send_reports(host, &self.shared, transition.effects);
            }
        }
    }

    fn failed(&self, host: &Host<Self>, id: &SessionId, error: &HostError) {
        // The parent of a child that keeps crashing records that as the tool's error. The
        // callback is synchronous and the store's reads are not: a task reads the lineage.
        let (shared, host, id) = (Arc::clone(&self.shared), host.clone(), id.clone());
        let why = crate::session::ChildUnavailable::Failed {
            child: id.clone(),
            error: error.to_string(),
        };
        tokio::spawn(children::tell_parent_of_failed(host, shared, id, why));
    }

    fn passivated(&self, id: &SessionId) {
        tracing::debug!(session = %id, "session.evicted");
        // Its state is durable: another node may own it from now on.
        self.shared.leases.release_session(id.as_str());
    }

    fn reject(&self, host: &Host<Self>, msg: SessionMsg, error: HostError) {
        match msg {
            SessionMsg::Execute { reply, .. } | SessionMsg::Resume { reply: Some(reply) } => {
                reply.fail(host_error(error));
            }
            SessionMsg::Submit { reply, .. } => {
                let _ = reply.send(Err(host_error(error)));
            }
            SessionMsg::Stop {
                reply: Some(reply), ..
            } => {
                let _ = reply.send(Err(host_error(error)));
            }
            SessionMsg::Fork { reply, .. } => {
                let _ = reply.send(Err(host_error(error)));
            }
            SessionMsg::Compact {
                reply: Some(reply), ..
            } => {
                let _ = reply.send(Err(host_error(error)));
            }
            // The parent must learn that its child cannot run, or it would wait forever.
            SessionMsg::StartChild(start) => unreachable_child(
                host,
                &self.shared,
                &start.origin.parent,
                start.origin.tool_call_id,
                &start.child,
                error,
            ),
            SessionMsg::Wake {
                parent,
                tool_call_id,
                child,
                ..
            } => unreachable_child(host, &self.shared, &parent, tool_call_id, &child, error),
            // The parent cannot hear them: its queue goes, or no later report would nudge it.
            SessionMsg::ReportsWaiting { parent } => self.shared.reports.drop_all(&parent),
            // Dropping the reply tells a waiting sweep or settle call that nothing will happen.
            _ => {}
        }
    }
}

/// Whether an input was handled by the session's owner: applied, or refused by the session's
/// rules (a deadline of a call it no longer has, say); not when the store could not be read
/// or written (another node owns the session, say).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Handled {
    Yes,
    /// Its commit failed (whoever waited on the session was told).
    No,
    /// The session could not be read (its reason): nothing was applied, nobody was told.
    Unread(String),
}

/// What the host answers a session's message with when it cannot deliver it.
pub(crate) type HostError = dormant_actors::HostError<SessionActor>;

/// The typed error for a message the host could not deliver. An activation refused because
/// another live node holds the tree's lease is that store error, as the actor typed it (a
/// call routed here routes again on it); any other failure makes the session unavailable.
pub(crate) fn host_error(error: HostError) -> Error {
    use dormant_actors::Error as Host;
    match error {
        Host::ShutDown => Error::ShutDown,
        Host::ActivationFailed { key, error } => match error.as_ref() {
            Error::Store(crate::store::Error::LeaseHeld { session, owner }) => {
                Error::Store(crate::store::Error::LeaseHeld {
                    session: session.clone(),
                    owner: owner.clone(),
                })
            }
            other => Error::SessionUnavailable {
                session: key,
                reason: other.to_string(),
            },
        },
        Host::ActivationPanicked { key, panic: reason }
        | Host::Failed {
            key,
            last_panic: reason,
            ..
        } => Error::SessionUnavailable {
            session: key,
            reason,
        },
    }
}

impl SessionActor {
    /// Reads a session back from the store.
    async fn load(&self, id: &SessionId) -> Result<Loaded, Error> {
        let Some(parts) = schema::load_session(self.shared.store.as_ref(), id).await? else {
            return Ok(Loaded::Absent);
        };
        let agent = self
            .shared
            .agents
            .get(&parts.record.agent)
            .map(|agent| Arc::clone(agent.value()))
            .ok_or_else(|| Error::UnknownAgent(parts.record.agent.clone()))?;
        let stored = Stored {
            run: parts.run,
            pending: parts.pending,
            children: parts.children,
            companions: parts.companions,
        };
        let policy = Arc::clone(&self.shared.policy);
        Ok(Loaded::Present(Box::new(Session::restore(
            parts.record,
            agent,
            policy,
            stored,
        ))))
    }

    /// Reads a session back from the store and gives the core its `Recover` input: a run that
    /// no live actor drives (a crash cut it, or a commit of this actor failed) is closed as
    /// interrupted, and its cut calls are dealt with by the at-most-once rule when it goes on.
    pub(super) async fn load_recovered(&self, id: &SessionId) -> Result<Loaded, Error> {
        let mut loaded = self.load(id).await?;
        if let Loaded::Present(session) = &mut loaded {
            let now = self.shared.clock.now_ms();
            let recovery = session.apply(Input::Recover, now)?;
            if let Some(commit) = &recovery.commit {
                tracing::warn!(session = %id, "session.recovered_interrupted_run");
                self.shared.commit(commit).await?;
                // A follower that read the store before this commit hears it live, or never.
                self.publish(id, commit);
            }
        }
        Ok(loaded)
    }

    /// Writes a fork's history as this session's first commit and loads it.
    async fn become_fork(
        &self,
        id: &SessionId,
        state: &mut SessionState,
        batch: crate::store::Batch,
    ) -> Result<(), Error> {
        if self.present(id, state).await?.is_some() {
            return Err(crate::types::ForkError::IdTaken(id.clone()).into());
        }
        self.shared.store.commit(batch).await?;
        state.loaded = self.load_recovered(id).await?;
        Ok(())
    }

    /// Merges the checkpoints `retention` lets go into the oldest kept. With `slack` (the
    /// agent's retention after a run), only once half as many again as kept (or half the age
    /// again) have piled up, so that a compaction is one write every so many commits, and the
    /// usual run end costs one read (of the oldest entry).
    async fn compact(
        &self,
        id: &SessionId,
        state: &mut SessionState,
        retention: crate::types::Retention,
        slack: bool,
    ) -> Result<crate::types::Compaction, Error> {
        let Some(session) = self.present(id, state).await? else {
            return Err(Error::UnknownSession(id.clone()));
        };
        let (log_count, tree) = (session.record().log_count, session.record().root.clone());
        let store = self.shared.store.as_ref();
        let now = self.shared.clock.now_ms();
        let Some((oldest, oldest_at)) = schema::history::oldest_checkpoint(store, id).await? else {
            return Err(Error::UnknownSession(id.clone()));
        };
        let unchanged = crate::types::Compaction {
            removed: 0,
            oldest_kept: oldest,
        };
        let held = log_count.saturating_sub(oldest.0);
        let too_many = retention.keep_last.is_some_and(|keep| {
            let margin = if slack { (keep / 2).max(1) } else { 0 };
            held > u64::try_from(keep.saturating_add(margin)).unwrap_or(u64::MAX)
        });
        let too_old = retention.max_age_ms.is_some_and(|age| {
            let margin = if slack { age / 2 } else { 0 };
            now.saturating_sub(oldest_at) > age.saturating_add(margin)
        });
        if !(too_many || too_old) {
            return Ok(unchanged);
        }
        let history = schema::history::load_history(store, id, None).await?;
        let Some(target) = schema::history::compaction_target(&history, retention, now) else {
            return Ok(unchanged);
        };
        let Some((batch, oldest_kept, removed)) =
            schema::history::compact_batch(id, &tree, &history, target)?
        else {
            return Ok(unchanged);
        };
        self.shared.store.commit(batch).await?;
        tracing::debug!(session = %id, removed, oldest_kept = %oldest_kept, "session.checkpoints_compacted");
        Ok(crate::types::Compaction {
            removed,
            oldest_kept,
        })
    }

    /// On a store several nodes share, makes this process the owner of the session's tree
    /// (its root's lease) before it reads the session: another live owner makes the
    /// activation fail, and the message with it. A tree has one owner, so a parent and its
    /// children always talk in process.
    async fn take_lease(&self, id: &SessionId) -> Result<(), Error> {
        let leases = self.shared.leases.as_ref();
        if !leases.is_shared() {
            return Ok(());
        }
        // A session's place in its tree never changes once written: read before the lease
        // (remembered from the call's routing, usually). A session not written yet is a new
        // root, or a child its start moves to its root.
        let root = self.shared.root_of(id).await?;
        leases.acquire(id.as_str(), root.as_str()).await?;
        Ok(())
    }

    /// On a store several nodes share: a session loaded under a lease this node has lost
    /// since (its liveness lapsed: a database out of reach, a pause) may have been taken over
    /// and written elsewhere, so its run is cut as by a failed, fenced commit: its waiters are
    /// answered (`RunCut` for those whose run wrote something; sending the call again would
    /// run its message twice), its work in flight cancelled, and it is read again as its
    /// owner, its run closed as interrupted, as after a crash. A child tells its parent, which
    /// wakes it to go on (or, having lost the same lease, is cut in turn, its own waiters
    /// answered): left, they all waited for good on a run nobody would finish.
    async fn cut_if_lease_lost(&self, ctx: &ActorContext<Self>, state: &mut SessionState) {
        let id = ctx.key();
        if !matches!(state.loaded, Loaded::Present(_))
            || self.shared.leases.holds_current(id.as_str())
        {
            return;
        }
        tracing::warn!(session = %id, "session.stale_after_lease_lost");
        let reason = "this node lost the session's lease while its run was under way";
        effects::answer_cut_waiters(id, state, None, reason, true);
        state.work.cancel();
        state.loaded = Loaded::Unreadable;
        let now = self.shared.clock.now_ms();
        if let Ok(Some(session)) = self.present(id, state).await {
            if let (Ok(transition), Some(host)) = (session.apply(Input::Restarted, now), ctx.host())
            {
                send_reports(&host, &self.shared, transition.effects);
            }
        }
    }

    /// The loaded session, re-reading an unreadable one; `None` if it does not exist.
    async fn present<'s>(
        &self,
        id: &SessionId,
        state: &'s mut SessionState,
    ) -> Result<Option<&'s mut Session>, Error> {
        // Loaded under a lease this node lost (and maybe took again) since: another node may
        // have written the session meanwhile, so what is in memory is read again.
        if matches!(state.loaded, Loaded::Present(_))
            && !self.shared.leases.holds_current(id.as_str())
        {
            tracing::warn!(session = %id, "session.stale_after_lease_lost");
            state.loaded = Loaded::Unreadable;
        }
        if matches!(state.loaded, Loaded::Unreadable) {
            // Answers accepted before are still being committed beside the mailbox: read
            // before they land, the session would wait on them again (no deadline left to end
            // the wait) and take a second answer. They land (or fail, fenced) first, under the
            // lease they were made under.
            self.shared.landing.settled(id).await;
            // Read again only as its owner: a lost lease made it unreadable, say.
            self.take_lease(id).await?;
            state.loaded = self.load_recovered(id).await?;
        }
        Ok(match &mut state.loaded {
            Loaded::Present(session) => Some(&mut **session),
            _ => None,
        })
    }

    /// Loads the conversation if `input` may read it (an idle session keeps it on disk).
    async fn prepare(&self, session: &mut Session, input: &Input) -> Result<(), Error> {
        if input.needs_conversation() && session.needs_messages() {
            let messages =
                schema::load_conversation(self.shared.store.as_ref(), session.record()).await?;
            session.attach_messages(messages);
        }
        Ok(())
    }

    /// A request whose caller waits for a run (an execute, a resume): the caller joins the
    /// session's waiters and is answered when the run ends or suspends (or at once by a
    /// refusal). `create` is the agent to create the session with if it does not exist (the
    /// input says the rest: whether only a new session takes it, a remote parent).
    async fn request(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        create: Option<Arc<AgentDefinition>>,
        input: Input,
        reply: Option<Reply>,
    ) {
        let id = ctx.key();
        let now = self.shared.clock.now_ms();
        let answer = |reply: Option<Reply>, error: Error| {
            if let Some(reply) = reply {
                reply.fail(error);
            }
        };
        match (self.present(id, state).await, create) {
            (Ok(Some(_)), _) => {}
            (Ok(None), Some(agent)) => {
                let policy = Arc::clone(&self.shared.policy);
                let session = Session::create(id.clone(), agent, policy, now);
                state.loaded = Loaded::Present(Box::new(session));
            }
            (Ok(None), None) => return answer(reply, Error::UnknownSession(id.clone())),
            (Err(error), _) => return answer(reply, error),
        }
        let Loaded::Present(session) = &mut state.loaded else {
            return;
        };
        let from_seq = session.record().chunk_count;
        let applied = match self.prepare(session, &input).await {
            Ok(()) => session.apply(input, now),
            Err(error) => Err(error),
        };
        match applied {
            Ok(transition) => match reply {
                Some(Reply::Started(reply)) => {
                    let performed = self.perform(ctx, state, transition).await;
                    let _ = reply.send(performed.and_then(|()| started(id, state, from_seq)));
                }
                reply => {
                    state.waiters.extend(reply.and_then(|reply| match reply {
                        Reply::Settled(reply) => Some(reply),
                        Reply::Started(_) => None,
                    }));
                    // A failed commit has already answered the waiters.
                    let _ = self.perform(ctx, state, transition).await;
                }
            },
            Err(error) => {
                session.release_messages();
                answer(reply, error);
            }
        }
    }

    /// An input nobody waits on (a timeout, a reply of the model or the tools, a wake, a
    /// report): applied to the loaded session, if there is one.
    pub(super) async fn feed(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        input: Input,
    ) -> Handled {
        let now = self.shared.clock.now_ms();
        let session = match self.present(ctx.key(), state).await {
            Ok(Some(session)) => session,
            Ok(None) => return Handled::Yes,
            Err(error) => {
                tracing::warn!(session = %ctx.key(), error = %crate::types::Untrusted(&error), "session.input_unreadable");
                return Handled::Unread(error.to_string());
            }
        };
        let applied = match self.prepare(session, &input).await {
            Ok(()) => session.apply(input, now),
            Err(error) => Err(error),
        };
        match applied {
            Ok(transition) => match self.perform(ctx, state, transition).await {
                Ok(_) => Handled::Yes,
                Err(_) => Handled::No,
            },
            Err(error @ Error::Store(_)) => {
                tracing::warn!(session = %ctx.key(), error = %crate::types::Untrusted(&error), "session.input_unreadable");
                Handled::Unread(error.to_string())
            }
            Err(error) => {
                tracing::warn!(session = %ctx.key(), error = %crate::types::Untrusted(&error), "session.input_refused");
                Handled::Yes
            }
        }
    }

    /// An interrupt or abort. With `walked`, the children it stops are handed back (see
    /// [`SessionMsg::Stop`]) instead of being told here.
    async fn stop(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        abort: bool,
        walked: bool,
    ) -> Result<Vec<StopTarget>, Error> {
        let now = self.shared.clock.now_ms();
        let Some(session) = self.present(ctx.key(), state).await? else {
            return Err(Error::UnknownSession(ctx.key().clone()));
        };
        let input = if abort {
            Input::Abort
        } else {
            Input::Interrupt
        };
        self.prepare(session, &input).await?;
        let mut transition = session.apply(input, now)?;
        session.release_messages();
        let mut stopped = Vec::new();
        if walked {
            transition.effects.retain(|effect| match effect {
                Effect::StopChildren { children, abort } => {
                    for at in children {
                        if !stopped.iter().any(|(known, _, _)| *known == at.child) {
                            stopped.push((at.child.clone(), *abort, at.remote.clone()));
                        }
                    }
                    false
                }
                _ => true,
            });
        }
        self.perform(ctx, state, transition).await?;
        Ok(stopped)
    }

    fn when_settled(&self, state: &mut SessionState, reply: oneshot::Sender<()>) {
        // Those who stopped waiting go first: a client that asks again and again with a short
        // wait while a long run goes on (`GET /status?settle_ms=`) would pile them up, and
        // the actor could not passivate while any is held.
        state.settle_waiters.retain(|waiter| !waiter.is_closed());
        state.settle_waiters.push(reply);
        self.answer_settle_waiters_if_idle(state);
    }

    /// Answers those waiting for the session to settle if nothing is in progress (see
    /// [`is_at_work`]).
    pub(super) fn answer_settle_waiters_if_idle(&self, state: &mut SessionState) {
        if !is_at_work(state) {
            for waiter in state.settle_waiters.drain(..) {
                let _ = waiter.send(());
            }
        }
    }
}

/// Work the actor started reports back to it; the actor stays resident while it waits (it
/// refuses passivation), so the mailbox is still there unless the runtime is shutting down.
fn send_back(mailbox: &Mailbox<SessionActor>, msg: SessionMsg) {
    if mailbox.send(msg).is_err() {
        tracing::debug!("session.result_after_stop");
    }
}

impl SessionActor {
    async fn handle_in_span(
        &self,
        ctx: &ActorContext<Self>,
        msg: SessionMsg,
        state: &mut SessionState,
    ) {
        // Recovery never holds up the message that woke the session.
        self.reconcile_in_background(ctx, state);
        if !matches!(msg, SessionMsg::Submit { .. } | SessionMsg::SubmitSettled) {
            self.barrier(ctx, state).await;
        }
        self.cut_if_lease_lost(ctx, state).await;
        match msg {
            SessionMsg::Execute {
                agent,
                message,
                reply,
                new_only,
                remote_parent,
            } => {
                let input = Input::Execute {
                    run_id: RunId::generate(),
                    message,
                    agent: agent.name().to_string(),
                    new_only,
                    remote_parent,
                };
                self.request(ctx, state, Some(agent), input, Some(reply))
                    .await;
            }
            SessionMsg::Resume { reply } => {
                state.resume_queued = false;
                let input = Input::Resume {
                    run_id: RunId::generate(),
                };
                self.request(ctx, state, None, input, reply).await;
                self.answer_settle_waiters_if_idle(state);
            }
            SessionMsg::Submit {
                root,
                tool_call_id,
                submission,
                reply,
            } => {
                self.submit(ctx, state, &root, tool_call_id, submission, reply)
                    .await;
            }
            SessionMsg::SubmitSettled => self.settle_submits(ctx, state).await,
            SessionMsg::Timeout {
                tool_call_id,
                reply,
            } => {
                let input = if tool_call_id == schema::RESUME_DUE {
                    Input::ResumeDue {
                        run_id: RunId::generate(),
                    }
                } else {
                    // A look at a remote sub-agent is keyed by its call.
                    let tool_call_id = schema::remote_look_call(&tool_call_id)
                        .map_or(tool_call_id.clone(), str::to_string);
                    Input::Timeout { tool_call_id }
                };
                let handled = self.feed(ctx, state, input).await;
                let _ = reply.send(handled == Handled::Yes);
            }
            SessionMsg::Stop { abort, reply } => {
                let walked = reply.is_some();
                let result = self.stop(ctx, state, abort, walked).await;
                if let Some(reply) = reply {
                    let _ = reply.send(result);
                }
            }
            SessionMsg::WaitSettled { reply } => self.when_settled(state, reply),
            SessionMsg::IsSettled { reply } => {
                let _ = reply.send(!is_at_work(state));
            }
            SessionMsg::Feed(input) => {
                self.feed(ctx, state, input).await;
            }
            SessionMsg::StartChild(start) => self.start_child(ctx, state, start).await,
            SessionMsg::Wake {
                parent,
                tool_call_id,
                child,
                again,
            } => {
                self.wake(ctx, state, (parent, tool_call_id), child, again)
                    .await
            }
            SessionMsg::ReportsWaiting { .. } => self.reports_waiting(ctx, state).await,
            SessionMsg::RemoteReport {
                tool_call_id,
                driven,
                watch,
                ticket,
            } => {
                // A driver of an activation before a panic: what it learnt is still fed, but
                // this activation's count and watches are its own.
                let ours = state.outside.finish(ticket);
                let next = if watch && ours {
                    state.remote_watches.remove(&tool_call_id).flatten()
                } else {
                    None
                };
                // The next watch is counted before the report may answer settle waiters: a
                // session is not settled with a watch about to start. Its report comes back
                // as a later message, after this one's is fed.
                if let Some(next) = next {
                    self.drive_remote(ctx, state, next);
                }
                self.remote_reported(ctx, state, tool_call_id, driven).await;
            }
            SessionMsg::RemoteAnswered { tool_call_id } => {
                self.feed(ctx, state, Input::RemoteAnswered { tool_call_id })
                    .await;
            }
            SessionMsg::Reconciled { ticket, results } => {
                if state.outside.finish(ticket) {
                    state.reconciling = false;
                    self.feed(ctx, state, Input::Reconciled { results }).await;
                    self.answer_settle_waiters_if_idle(state);
                } else {
                    // Started before a panic reloaded the state: this activation reconciles
                    // the children it loaded itself.
                    tracing::debug!(session = %ctx.key(), "subagent.stale_reconciliation");
                }
            }
            SessionMsg::Fork { batch, reply } => {
                let _ = reply.send(self.become_fork(ctx.key(), state, batch).await);
            }
            SessionMsg::Compact { retention, reply } => {
                let compacted = self
                    .compact(ctx.key(), state, retention, reply.is_none())
                    .await;
                match reply {
                    Some(reply) => {
                        let _ = reply.send(compacted);
                    }
                    None => {
                        if let Err(error) = compacted {
                            tracing::warn!(session = %ctx.key(), error = %crate::types::Untrusted(&error), "session.compaction_failed");
                        }
                    }
                }
            }
        }
    }
}

/// Whether something of the session is in progress: a run (or a resume waking its children),
/// a queued automatic resume, work outside the actor (a reconciliation, a remote child's
/// driver or stop).
fn is_at_work(state: &SessionState) -> bool {
    state.resume_queued
        || !state.outside.is_idle()
        || matches!(&state.loaded, Loaded::Present(session) if session.is_busy())
}

/// Where a run stands right after the request that started it was committed.
fn started(id: &SessionId, state: &SessionState, from_seq: u64) -> Result<RunStarted, Error> {
    match &state.loaded {
        Loaded::Present(session) => {
            let record = session.record();
            Ok(RunStarted {
                session_id: id.clone(),
                run_id: record.current_run,
                status: record.status,
                from_seq,
                settled: !is_at_work(state),
            })
        }
        Loaded::Absent | Loaded::Unreadable => Err(Error::SessionUnavailable {
            session: id.clone(),
            reason: "the session could not be read back after its commit".into(),
        }),
    }
}
