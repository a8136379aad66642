//! The session actor: one per live session id, the only writer of its state. It holds no
//! rules: it feeds inputs to the [`Session`] core, makes each transition's commit durable, then
//! executes its effects.

use std::sync::Arc;
use std::time::Instant;

use dashmap::DashMap;
use dormant_actors::{ActorContext, Clock, Mailbox, VirtualActor};
use tokio::sync::{broadcast, oneshot};

use crate::definition::AgentDefinition;
use crate::dispatch::{run_step, StepContext};
use crate::error::Error;
use crate::hooks::Hooks;
use crate::ids::{RunId, SessionId};
use crate::llm::{LlmAdapter, LlmError, ModelReply};
use crate::metrics::Metrics;
use crate::schema;
use crate::session::{Effect, FinishedCall, Input, RunOutcome, Session, Transition};
use crate::store::Store;
use crate::stream::Chunk;

/// What every session actor shares.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) llm: Arc<dyn LlmAdapter>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) hooks: Arc<dyn Hooks>,
    pub(crate) agents: DashMap<String, Arc<AgentDefinition>>,
    /// Live followers of a session's stream; chunks are published after their commit.
    pub(crate) streams: DashMap<SessionId, broadcast::Sender<Chunk>>,
    pub(crate) metrics: Metrics,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("store", &self.store)
            .field("agents", &self.agents.len())
            .finish()
    }
}

/// Requests a session actor handles. Replies travel in `reply`.
#[derive(Debug)]
pub(crate) enum SessionMsg {
    /// Start a run (creating the session if it does not exist).
    Execute {
        agent: Arc<AgentDefinition>,
        message: String,
        reply: oneshot::Sender<Result<RunOutcome, Error>>,
    },
    /// The model answered (sent by the actor's own model task).
    ModelReplied {
        run_id: RunId,
        step: u32,
        reply: Result<ModelReply, LlmError>,
    },
    /// The step's tools finished (sent by the actor's own tool task).
    ToolsFinished {
        run_id: RunId,
        step: u32,
        outcomes: Vec<FinishedCall>,
    },
}

/// The session actor's behaviour (stateless: the state lives in [`SessionState`]).
#[derive(Debug)]
pub(crate) struct SessionActor {
    pub(crate) shared: Arc<Shared>,
}

/// What a resident session actor holds.
#[derive(Debug)]
pub(crate) enum Loaded {
    /// No session has this id yet.
    Absent,
    /// The session.
    Present(Session),
    /// The stored session cannot be read; every request answers why (and retries the read).
    Unreadable,
}

/// A resident session: what was loaded, and who waits for the current run.
#[derive(Debug)]
pub(crate) struct SessionState {
    loaded: Loaded,
    waiters: Vec<oneshot::Sender<Result<RunOutcome, Error>>>,
}

impl VirtualActor for SessionActor {
    type Key = SessionId;
    type Msg = SessionMsg;
    type State = SessionState;
    type Error = Error;

    async fn activate(&self, id: &SessionId) -> Result<SessionState, Error> {
        let loaded = match self.load(id) {
            Ok(loaded) => loaded,
            Err(error) => {
                tracing::warn!(session = %id, %error, "session.unreadable");
                Loaded::Unreadable
            }
        };
        let mut state = SessionState {
            loaded,
            waiters: Vec::new(),
        };
        if let Loaded::Present(session) = &mut state.loaded {
            let now = self.shared.clock.now_ms();
            if let Some(recovery) = session.recover_after_crash(now) {
                tracing::warn!(session = %id, "session.recovered_interrupted_run");
                if let Some(commit) = &recovery.commit {
                    self.shared.store.commit(commit.encode()?).await?;
                }
            }
        }
        tracing::debug!(session = %id, "session.activated");
        Ok(state)
    }

    async fn handle(&self, ctx: &ActorContext<Self>, msg: SessionMsg, state: &mut SessionState) {
        match msg {
            SessionMsg::Execute {
                agent,
                message,
                reply,
            } => self.execute(ctx, state, agent, message, reply).await,
            SessionMsg::ModelReplied {
                run_id,
                step,
                reply,
            } => {
                let input = Input::ModelReplied {
                    run_id,
                    step,
                    reply,
                };
                self.feed(ctx, state, input).await;
            }
            SessionMsg::ToolsFinished {
                run_id,
                step,
                outcomes,
            } => {
                let input = Input::ToolsFinished {
                    run_id,
                    step,
                    outcomes,
                };
                self.feed(ctx, state, input).await;
            }
        }
    }

    fn can_passivate(&self, state: &SessionState) -> bool {
        state.waiters.is_empty()
            && !matches!(&state.loaded, Loaded::Present(session) if session.is_busy())
    }

    fn passivated(&self, id: &SessionId) {
        tracing::debug!(session = %id, "session.evicted");
    }

    fn reject(&self, msg: SessionMsg, error: dormant_actors::Error) {
        if let SessionMsg::Execute { reply, .. } = msg {
            let _ = reply.send(Err(host_error(error)));
        }
    }
}

/// The typed error for a message the host could not deliver.
pub(crate) fn host_error(error: dormant_actors::Error) -> Error {
    match error {
        dormant_actors::Error::ShutDown => Error::ShutDown,
        dormant_actors::Error::ActivationFailed { key, reason }
        | dormant_actors::Error::Failed {
            key,
            last_panic: reason,
            ..
        } => match key.parse() {
            Ok(session) => Error::SessionUnavailable { session, reason },
            Err(_) => Error::ShutDown,
        },
    }
}

impl SessionActor {
    /// Reads a session back from the store.
    fn load(&self, id: &SessionId) -> Result<Loaded, Error> {
        let store = self.shared.store.as_ref();
        let Some(record) = schema::load_record(store, id)? else {
            return Ok(Loaded::Absent);
        };
        let agent = self
            .shared
            .agents
            .get(&record.agent)
            .map(|agent| Arc::clone(agent.value()))
            .ok_or_else(|| Error::UnknownAgent(record.agent.clone()))?;
        let run = match record.current_run {
            Some(_) => schema::load_run(store, id, record.run_count)?,
            None => None,
        };
        Ok(Loaded::Present(Session::restore(record, agent, run)))
    }

    async fn execute(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        agent: Arc<AgentDefinition>,
        message: String,
        reply: oneshot::Sender<Result<RunOutcome, Error>>,
    ) {
        let id = ctx.key();
        let now = self.shared.clock.now_ms();
        if matches!(state.loaded, Loaded::Unreadable) {
            match self.load(id) {
                Ok(loaded) => state.loaded = loaded,
                Err(error) => {
                    let _ = reply.send(Err(error));
                    return;
                }
            }
        }
        if matches!(state.loaded, Loaded::Absent) {
            state.loaded = Loaded::Present(Session::create(id.clone(), agent.clone(), now));
        }
        let Loaded::Present(session) = &mut state.loaded else {
            return;
        };
        if session.agent().name() != agent.name() {
            let _ = reply.send(Err(Error::AgentMismatch {
                session: id.clone(),
                actual: session.agent().name().to_string(),
                requested: agent.name().to_string(),
            }));
            return;
        }
        if session.needs_messages() {
            match schema::load_messages(self.shared.store.as_ref(), id) {
                Ok(messages) => session.attach_messages(messages),
                Err(error) => {
                    let _ = reply.send(Err(error.into()));
                    return;
                }
            }
        }
        let input = Input::Execute {
            run_id: RunId::generate(),
            message,
        };
        match session.apply(input, now) {
            Ok(transition) => {
                state.waiters.push(reply);
                self.perform(ctx, state, transition).await;
            }
            Err(error) => {
                let _ = reply.send(Err(error));
            }
        }
    }

    async fn feed(&self, ctx: &ActorContext<Self>, state: &mut SessionState, input: Input) {
        let Loaded::Present(session) = &mut state.loaded else {
            return;
        };
        let now = self.shared.clock.now_ms();
        match session.apply(input, now) {
            Ok(transition) => self.perform(ctx, state, transition).await,
            Err(error) => tracing::warn!(session = %ctx.key(), %error, "session.input_refused"),
        }
    }

    /// Makes the commit durable, then runs the effects in order. A failed commit leaves the
    /// in-memory state unreliable, so it is dropped and read back from the store.
    async fn perform(
        &self,
        ctx: &ActorContext<Self>,
        state: &mut SessionState,
        transition: Transition,
    ) {
        if let Some(commit) = transition.commit {
            if let Err(error) = self.commit(&commit).await {
                tracing::error!(session = %ctx.key(), %error, "session.commit_failed");
                let reason = error.to_string();
                let mut first = Some(error);
                for waiter in state.waiters.drain(..) {
                    let error = first.take().unwrap_or_else(|| Error::SessionUnavailable {
                        session: ctx.key().clone(),
                        reason: reason.clone(),
                    });
                    let _ = waiter.send(Err(error));
                }
                state.loaded = self.load(ctx.key()).unwrap_or(Loaded::Unreadable);
                return;
            }
            self.publish(ctx.key(), commit.chunks);
        }
        for effect in transition.effects {
            match effect {
                Effect::CallModel {
                    run_id,
                    step,
                    request,
                } => {
                    let llm = Arc::clone(&self.shared.llm);
                    let mailbox = ctx.mailbox();
                    tokio::spawn(async move {
                        let reply = llm.complete(request).await;
                        send_back(&mailbox, SessionMsg::ModelReplied { run_id, step, reply });
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
                        continue;
                    };
                    let step_context = StepContext {
                        agent: Arc::clone(session.agent()),
                        session: ctx.key().clone(),
                        run_id,
                        state: custom_state,
                    };
                    let mailbox = ctx.mailbox();
                    tokio::spawn(async move {
                        let outcomes = run_step(step_context, parallel, sequential).await;
                        send_back(
                            &mailbox,
                            SessionMsg::ToolsFinished {
                                run_id,
                                step,
                                outcomes,
                            },
                        );
                    });
                }
                Effect::Hook(event) => self.shared.hooks.on_event(&event),
                Effect::Settle(outcome) => {
                    for waiter in state.waiters.drain(..) {
                        let _ = waiter.send(Ok(outcome.clone()));
                    }
                    if let Loaded::Present(session) = &mut state.loaded {
                        session.release_messages();
                    }
                }
            }
        }
    }

    async fn commit(&self, commit: &schema::Commit) -> Result<(), Error> {
        let batch = commit.encode()?;
        let bytes = batch.byte_len();
        let started = Instant::now();
        self.shared.store.commit(batch).await?;
        self.shared.metrics.record_commit(started.elapsed(), bytes);
        Ok(())
    }

    fn publish(&self, id: &SessionId, chunks: Vec<Chunk>) {
        if chunks.is_empty() {
            return;
        }
        let followed = match self.shared.streams.get(id) {
            Some(sender) => {
                for chunk in chunks {
                    let _ = sender.send(chunk);
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

/// Work the actor started reports back to it; the actor stays resident while it waits (it
/// refuses passivation), so the mailbox is still there unless the runtime is shutting down.
fn send_back(mailbox: &Mailbox<SessionActor>, msg: SessionMsg) {
    if mailbox.send(msg).is_err() {
        tracing::debug!("session.result_after_stop");
    }
}
