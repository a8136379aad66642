//! The ractor actor that carries one key's behaviour, with supervision done inside it.
//!
//! A panic in [`VirtualActor::handle`] is caught here rather than left to ractor, which would
//! stop the actor and drop the rest of its mailbox. Catching it keeps the queued messages and
//! lets the state be reloaded from its durable form, which is what a restart would do.

use std::collections::VecDeque;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Weak};

use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::error::{Error, HostError};
use crate::host::{Host, Inner};
use crate::VirtualActor;

/// What travels through a cell's mailbox.
pub(crate) enum Envelope<M> {
    /// A message for the behaviour.
    User(M),
    /// Stop if the behaviour allows it (or always, when `force`); sent by the host after it
    /// stopped routing new messages to this actor.
    Passivate { generation: u64, force: bool },
}

/// Handed to [`VirtualActor::handle`]: who the actor is and how to reach itself and the host.
pub struct ActorContext<A: VirtualActor> {
    key: A::Key,
    myself: ActorRef<Envelope<A::Msg>>,
    host: Weak<Inner<A>>,
}

impl<A: VirtualActor> fmt::Debug for ActorContext<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActorContext")
            .field("key", &self.key)
            .finish()
    }
}

impl<A: VirtualActor> ActorContext<A> {
    /// The key this actor serves.
    pub fn key(&self) -> &A::Key {
        &self.key
    }

    /// Queues a message to this same actor, behind what is already in its mailbox. Used to feed
    /// back the results of work the actor started in the background.
    ///
    /// # Errors
    /// Gives the message back if the actor has stopped.
    pub fn send_self(&self, msg: A::Msg) -> Result<(), A::Msg> {
        send_user(&self.myself, msg)
    }

    /// An owned handle to this actor's mailbox, for background work that reports back later.
    pub fn mailbox(&self) -> Mailbox<A> {
        Mailbox {
            actor: self.myself.clone(),
        }
    }

    /// The host, to send messages to other keys (None while it is shutting down).
    pub fn host(&self) -> Option<Host<A>> {
        self.host.upgrade().map(Host::from_inner)
    }
}

/// A cloneable handle to one actor's mailbox (see [`ActorContext::mailbox`]). It reaches that
/// actor only, not its successor after an eviction: use it for work the actor waits on, which
/// keeps it from being passivated.
pub struct Mailbox<A: VirtualActor> {
    actor: ActorRef<Envelope<A::Msg>>,
}

impl<A: VirtualActor> Clone for Mailbox<A> {
    fn clone(&self) -> Self {
        Self {
            actor: self.actor.clone(),
        }
    }
}

impl<A: VirtualActor> fmt::Debug for Mailbox<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mailbox")
            .field("actor", &self.actor.get_id())
            .finish()
    }
}

impl<A: VirtualActor> Mailbox<A> {
    /// Queues `msg` behind what is already in the mailbox.
    ///
    /// # Errors
    /// Gives the message back if the actor has stopped.
    pub fn send(&self, msg: A::Msg) -> Result<(), A::Msg> {
        send_user(&self.actor, msg)
    }
}

/// The ractor actor type; stateless, as ractor wants.
pub(crate) struct Cell<A: VirtualActor> {
    pub(crate) behaviour: Arc<A>,
    pub(crate) host: Weak<Inner<A>>,
    /// The error the behaviour's activation answered, kept typed for the host: ractor hands
    /// back only a boxed error from a failed start.
    pub(crate) activation_error: Arc<parking_lot::Mutex<Option<A::Error>>>,
}

pub(crate) struct CellArgs<A: VirtualActor> {
    pub(crate) key: A::Key,
}

pub(crate) struct CellState<A: VirtualActor> {
    ctx: ActorContext<A>,
    state: Option<A::State>,
    /// Clock times of recent panics, oldest first.
    crashes: VecDeque<u64>,
    failed: Option<HostError<A>>,
}

impl<A: VirtualActor> Actor for Cell<A> {
    type Msg = Envelope<A::Msg>;
    type State = CellState<A>;
    type Arguments = CellArgs<A>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: CellArgs<A>,
    ) -> Result<CellState<A>, ActorProcessingErr> {
        let state = match Box::pin(self.behaviour.activate(&args.key)).await {
            Ok(state) => state,
            Err(error) => {
                // ractor wants an error of its own: the host reads the typed one from here.
                let shown = error.to_string();
                *self.activation_error.lock() = Some(error);
                return Err(shown.into());
            }
        };
        Ok(CellState {
            ctx: ActorContext {
                key: args.key,
                myself,
                host: self.host.clone(),
            },
            state: Some(state),
            crashes: VecDeque::new(),
            failed: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        cell: &mut CellState<A>,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            Envelope::User(msg) => self.deliver(msg, cell).await,
            Envelope::Passivate { generation, force } => {
                let busy = cell
                    .state
                    .as_ref()
                    .is_some_and(|state| !self.behaviour.can_passivate(state));
                match self.host.upgrade() {
                    Some(host) if busy && !force => host.cancel_stop(&cell.ctx.key, generation),
                    _ => myself.stop(None),
                }
            }
        }
        Ok(())
    }
}

impl<A: VirtualActor> Cell<A> {
    async fn deliver(&self, msg: A::Msg, cell: &mut CellState<A>) {
        if let Some(error) = &cell.failed {
            self.reject(msg, error.clone());
            return;
        }
        let Some(state) = cell.state.as_mut() else {
            // Only a failed cell has no state, and that case returned above.
            self.reject(
                msg,
                Error::ActivationPanicked {
                    key: cell.ctx.key.clone(),
                    panic: "no state loaded".into(),
                },
            );
            return;
        };
        // Boxed: an idle cell's task keeps its future allocated, and an inline handler future
        // would make every resident actor as large as the largest state of any handler.
        let outcome = AssertUnwindSafe(Box::pin(self.behaviour.handle(&cell.ctx, msg, state)))
            .catch_unwind()
            .await;
        if let Err(panic) = outcome {
            Box::pin(self.recover(cell, panic_message(panic.as_ref()))).await;
            return;
        }
        // An actor that was busy when the host last evicted past its limit refused to stop;
        // now that it can stop, it is the one to go if the host is still over the limit.
        // The limit is checked first: it is one atomic load, paid after every message.
        let Some(host) = self.host.upgrade() else {
            return;
        };
        let idle = || {
            cell.state
                .as_ref()
                .is_some_and(|state| self.behaviour.can_passivate(state))
        };
        if host.over_limit() && idle() {
            host.request_stop(&cell.ctx.key, false);
        }
    }

    /// Restarts the behaviour's state from durable storage, or fails the key when it keeps
    /// crashing.
    async fn recover(&self, cell: &mut CellState<A>, panic: String) {
        let Some(host) = self.host.upgrade() else {
            return;
        };
        let config = host.config();
        let now = host.now_ms();
        cell.crashes.push_back(now);
        while cell
            .crashes
            .front()
            .is_some_and(|&at| now.saturating_sub(at) > config.crash_window_ms)
        {
            cell.crashes.pop_front();
        }
        host.record_crash();
        let crashes = u32::try_from(cell.crashes.len()).unwrap_or(u32::MAX);
        tracing::error!(key = %cell.ctx.key, crashes, %panic, "actor.crashed");
        cell.state = None;
        if crashes >= config.max_crashes {
            let error = Error::Failed {
                key: cell.ctx.key.clone(),
                crashes,
                window_ms: config.crash_window_ms,
                last_panic: panic,
            };
            tracing::error!(key = %cell.ctx.key, %error, "actor.failed");
            host.mark_failed(cell.ctx.key.clone(), error.clone());
            let handle = Host::from_inner(Arc::clone(&host));
            self.behaviour.failed(&handle, &cell.ctx.key, &error);
            cell.failed = Some(error);
            return;
        }
        let reloaded = AssertUnwindSafe(self.behaviour.activate(&cell.ctx.key))
            .catch_unwind()
            .await;
        match reloaded {
            Ok(Ok(mut state)) => {
                tracing::info!(key = %cell.ctx.key, "actor.restarted");
                let handle = Host::from_inner(Arc::clone(&host));
                self.behaviour.restarted(&handle, &cell.ctx.key, &mut state);
                cell.state = Some(state);
            }
            Ok(Err(error)) => {
                let error = Error::ActivationFailed {
                    key: cell.ctx.key.clone(),
                    error: Arc::new(error),
                };
                self.fail_reload(&host, cell, error);
            }
            Err(panic) => {
                let error = Error::ActivationPanicked {
                    key: cell.ctx.key.clone(),
                    panic: panic_message(panic.as_ref()),
                };
                self.fail_reload(&host, cell, error);
            }
        }
    }

    fn fail_reload(&self, host: &Arc<Inner<A>>, cell: &mut CellState<A>, error: HostError<A>) {
        host.mark_failed(cell.ctx.key.clone(), error.clone());
        let handle = Host::from_inner(Arc::clone(host));
        self.behaviour.failed(&handle, &cell.ctx.key, &error);
        cell.failed = Some(error);
    }

    /// Hands an undeliverable message back to the behaviour (dropped with the host: nothing
    /// is left to answer through).
    fn reject(&self, msg: A::Msg, error: HostError<A>) {
        if let Some(host) = self.host.upgrade() {
            self.behaviour.reject(&Host::from_inner(host), msg, error);
        }
    }
}

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Sends a behaviour message to a cell; gives it back if the mailbox is closed.
pub(crate) fn send_user<M: Send + Sync + 'static>(
    actor: &ActorRef<Envelope<M>>,
    msg: M,
) -> Result<(), M> {
    match actor.send_message(Envelope::User(msg)) {
        Ok(()) => Ok(()),
        Err(ractor::MessagingErr::SendErr(Envelope::User(msg))) => Err(msg),
        // ractor gives back what it was handed on every failed send; a passivation envelope
        // cannot come back from a user send.
        Err(_) => Ok(()),
    }
}
