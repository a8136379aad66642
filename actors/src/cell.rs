//! The cell that carries one key's behaviour: one task taking its mailbox's messages in turn,
//! with supervision done inside it.
//!
//! A panic in [`VirtualActor::handle`] is caught here, so it never ends the task or drops the
//! rest of the mailbox: the state is reloaded from its durable form, which is what a restart
//! would do, and the queued messages go on to it.

use std::collections::VecDeque;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Weak};

use futures::FutureExt;

use crate::error::{Error, HostError};
use crate::host::{Host, Inner};
use crate::mailbox::{CellRef, Inbox};
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
    myself: CellRef<Envelope<A::Msg>>,
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
/// actor, and refuses messages once the actor has stopped (one that arrived behind the stop
/// goes to its successor): use it for work the actor waits on, which keeps it from being
/// passivated.
pub struct Mailbox<A: VirtualActor> {
    actor: CellRef<Envelope<A::Msg>>,
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
            .field("actor", &self.actor.id())
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

/// What a cell's task runs its messages with: the behaviour and the host.
pub(crate) struct Cell<A: VirtualActor> {
    pub(crate) behaviour: Arc<A>,
    pub(crate) host: Weak<Inner<A>>,
}

/// What a cell's task keeps between messages.
pub(crate) struct CellState<A: VirtualActor> {
    ctx: ActorContext<A>,
    state: Option<A::State>,
    /// Clock times of recent panics, oldest first.
    crashes: VecDeque<u64>,
    failed: Option<HostError<A>>,
}

impl<A: VirtualActor> CellState<A> {
    /// The state of a cell that serves `key` through mailbox `myself`, its behaviour's state
    /// loaded.
    pub(crate) fn new(
        key: A::Key,
        myself: CellRef<Envelope<A::Msg>>,
        host: Weak<Inner<A>>,
        state: A::State,
    ) -> Self {
        Self {
            ctx: ActorContext { key, myself, host },
            state: Some(state),
            crashes: VecDeque::new(),
            failed: None,
        }
    }
}

impl<A: VirtualActor> Cell<A> {
    /// Loads the state of `key`; a panic of the behaviour's activation is its failure.
    pub(crate) async fn activate(&self, key: &A::Key) -> Result<A::State, HostError<A>> {
        match AssertUnwindSafe(Box::pin(self.behaviour.activate(key)))
            .catch_unwind()
            .await
        {
            Ok(Ok(state)) => Ok(state),
            Ok(Err(error)) => Err(Error::ActivationFailed {
                key: key.clone(),
                error: Arc::new(error),
            }),
            Err(panic) => Err(Error::ActivationPanicked {
                key: key.clone(),
                panic: panic_message(panic.as_ref()),
            }),
        }
    }

    /// Handles the mailbox's messages in turn until the cell is stopped (what the stop left
    /// unhandled stays in `inbox`).
    pub(crate) async fn run(&self, inbox: &mut Inbox<Envelope<A::Msg>>, mut cell: CellState<A>) {
        while let Some(message) = inbox.next().await {
            match message {
                Envelope::User(msg) => self.deliver(msg, &mut cell).await,
                Envelope::Passivate { generation, force } => {
                    let busy = cell
                        .state
                        .as_ref()
                        .is_some_and(|state| !self.behaviour.can_passivate(state));
                    match self.host.upgrade() {
                        Some(host) if busy && !force => host.cancel_stop(&cell.ctx.key, generation),
                        _ => cell.ctx.myself.stop(),
                    }
                }
            }
        }
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
        match self.activate(&cell.ctx.key).await {
            Ok(mut state) => {
                tracing::info!(key = %cell.ctx.key, "actor.restarted");
                let handle = Host::from_inner(Arc::clone(&host));
                self.behaviour.restarted(&handle, &cell.ctx.key, &mut state);
                cell.state = Some(state);
            }
            Err(error) => self.fail_reload(&host, cell, error),
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

impl<M> Envelope<M> {
    /// The behaviour's message, if this is one.
    pub(crate) fn into_user(self) -> Option<M> {
        match self {
            Envelope::User(msg) => Some(msg),
            Envelope::Passivate { .. } => None,
        }
    }
}

/// Sends a behaviour message to a cell; gives it back if the cell was stopped.
pub(crate) fn send_user<M>(actor: &CellRef<Envelope<M>>, msg: M) -> Result<(), M> {
    match actor.send(Envelope::User(msg)) {
        Ok(()) => Ok(()),
        Err(Envelope::User(msg)) => Err(msg),
        // A send gives back what it was handed; a passivation envelope cannot come back from
        // a user send.
        Err(Envelope::Passivate { .. }) => Ok(()),
    }
}
