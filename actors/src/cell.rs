//! The cell that carries one key's behaviour: one task taking its mailbox's messages in turn,
//! with supervision done inside it.
//!
//! A panic in [`VirtualActor::handle`] is caught here, so it never ends the task or drops the
//! rest of the mailbox: the state is reloaded from its durable form, which is what a restart
//! would do, and the queued messages go on to it.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{ready, Context, Poll};

use futures::FutureExt;

use crate::error::{Error, HostError};
use crate::host::{Host, Inner};
use crate::mailbox::{mailbox, CellRef, Inbox};
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

/// What a cell's task has left to do before it can take its next message.
type Step<A> = Pin<Box<dyn Future<Output = Stepped<A>> + Send>>;

/// How a step ended.
enum Stepped<A: VirtualActor> {
    /// The handler returned; the state it worked on comes back.
    Handled(A::State),
    /// The handler panicked, and its state went with it.
    Panicked(String),
    /// The state was loaded again after a panic.
    Reloaded(Result<A::State, HostError<A>>),
}

/// A live actor's task: takes its mailbox's messages in turn until it is stopped, then hands
/// what the stop left unhandled to the host.
///
/// A future written out by hand rather than an async fn, because an idle resident actor keeps
/// its task's future allocated, and that should be these fields and nothing more. The async
/// fns this replaced kept room for every await at once, and a moved future twice: 1,928 B for
/// a session's actor, where these fields are 456 B. The handler's future, with the state it
/// works on, lives in a box for the length of one message.
pub(crate) struct Running<A: VirtualActor> {
    behaviour: Arc<A>,
    host: Weak<Inner<A>>,
    generation: u64,
    ctx: Arc<ActorContext<A>>,
    inbox: Inbox<Envelope<A::Msg>>,
    /// `None` while a step holds it, or once the key failed.
    state: Option<A::State>,
    step: Option<Step<A>>,
    /// Clock times of recent panics, oldest first.
    crashes: VecDeque<u64>,
    failed: Option<HostError<A>>,
}

// Nothing of a `Running` is ever pinned in place: the futures it polls are boxed.
impl<A: VirtualActor> Unpin for Running<A> {}

impl<A: VirtualActor> Running<A> {
    /// The task of `key`'s actor of `generation`, with `state` loaded, and the sending end
    /// of its new mailbox.
    pub(crate) fn new(
        behaviour: Arc<A>,
        host: Weak<Inner<A>>,
        (key, generation): (A::Key, u64),
        state: A::State,
    ) -> (Self, CellRef<Envelope<A::Msg>>) {
        let (myself, inbox) = mailbox();
        let ctx = ActorContext {
            key,
            myself: myself.clone(),
            host: host.clone(),
        };
        let running = Self {
            behaviour,
            host,
            generation,
            ctx: Arc::new(ctx),
            inbox,
            state: Some(state),
            step: None,
            crashes: VecDeque::new(),
            failed: None,
        };
        (running, myself)
    }

    /// Runs steps and messages until the mailbox is stopped (`Ready`) or nothing can go on now.
    fn drive(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if let Some(step) = self.step.as_mut() {
                let stepped = ready!(step.as_mut().poll(cx));
                self.step = None;
                self.after(stepped);
                continue;
            }
            // A message takes a unit of the task's budget, as one from a tokio channel would: a
            // cell with a long queue of messages its handler answers at once still lets its
            // worker's other tasks run now and then.
            let budget = ready!(tokio::task::coop::poll_proceed(cx));
            let Some(message) = ready!(self.inbox.poll_next(cx)) else {
                return Poll::Ready(());
            };
            budget.made_progress();
            match message {
                Envelope::User(msg) => self.deliver(msg),
                Envelope::Passivate { generation, force } => self.passivate(generation, force),
            }
        }
    }

    fn deliver(&mut self, msg: A::Msg) {
        if let Some(error) = &self.failed {
            self.reject(msg, error.clone());
            return;
        }
        let Some(mut state) = self.state.take() else {
            // Only a failed cell has no state between steps, and that case returned above.
            self.reject(
                msg,
                Error::ActivationPanicked {
                    key: self.ctx.key.clone(),
                    panic: "no state loaded".into(),
                },
            );
            return;
        };
        let behaviour = Arc::clone(&self.behaviour);
        let ctx = Arc::clone(&self.ctx);
        self.step = Some(Box::pin(async move {
            let outcome = AssertUnwindSafe(behaviour.handle(&ctx, msg, &mut state))
                .catch_unwind()
                .await;
            match outcome {
                Ok(()) => Stepped::Handled(state),
                Err(panic) => Stepped::Panicked(panic_message(panic.as_ref())),
            }
        }));
    }

    fn after(&mut self, stepped: Stepped<A>) {
        match stepped {
            Stepped::Handled(state) => {
                self.state = Some(state);
                self.stop_if_over_limit();
            }
            Stepped::Panicked(panic) => self.recover(panic),
            Stepped::Reloaded(Ok(mut state)) => {
                tracing::info!(key = %self.ctx.key, "actor.restarted");
                if let Some(host) = self.host.upgrade() {
                    let handle = Host::from_inner(host);
                    self.behaviour.restarted(&handle, &self.ctx.key, &mut state);
                }
                self.state = Some(state);
            }
            Stepped::Reloaded(Err(error)) => {
                if let Some(host) = self.host.upgrade() {
                    self.fail(&host, error);
                }
            }
        }
    }

    /// An actor that was busy when the host last evicted past its limit refused to stop; now
    /// that it can stop, it is the one to go if the host is still over the limit. The limit is
    /// checked first: it is one atomic load, paid after every message.
    fn stop_if_over_limit(&self) {
        let Some(host) = self.host.upgrade() else {
            return;
        };
        if host.over_limit() && self.idle() {
            host.request_stop(&self.ctx.key, false);
        }
    }

    fn idle(&self) -> bool {
        self.state
            .as_ref()
            .is_some_and(|state| self.behaviour.can_passivate(state))
    }

    fn passivate(&self, generation: u64, force: bool) {
        let busy = self.state.is_some() && !self.idle();
        match self.host.upgrade() {
            Some(host) if busy && !force => host.cancel_stop(&self.ctx.key, generation),
            _ => self.ctx.myself.stop(),
        }
    }

    /// Counts a panic; loads the state again from durable storage, or fails the key when it
    /// keeps crashing.
    fn recover(&mut self, panic: String) {
        let Some(host) = self.host.upgrade() else {
            return;
        };
        let config = host.config();
        let now = host.now_ms();
        self.crashes.push_back(now);
        while self
            .crashes
            .front()
            .is_some_and(|&at| now.saturating_sub(at) > config.crash_window_ms)
        {
            self.crashes.pop_front();
        }
        host.record_crash();
        let crashes = u32::try_from(self.crashes.len()).unwrap_or(u32::MAX);
        tracing::error!(key = %self.ctx.key, crashes, %panic, "actor.crashed");
        if crashes >= config.max_crashes {
            let error = Error::Failed {
                key: self.ctx.key.clone(),
                crashes,
                window_ms: config.crash_window_ms,
                last_panic: panic,
            };
            tracing::error!(key = %self.ctx.key, %error, "actor.failed");
            self.fail(&host, error);
            return;
        }
        let behaviour = Arc::clone(&self.behaviour);
        let key = self.ctx.key.clone();
        self.step = Some(Box::pin(async move {
            Stepped::Reloaded(load(&*behaviour, &key).await)
        }));
    }

    fn fail(&mut self, host: &Arc<Inner<A>>, error: HostError<A>) {
        host.mark_failed(self.ctx.key.clone(), error.clone());
        let handle = Host::from_inner(Arc::clone(host));
        self.behaviour.failed(&handle, &self.ctx.key, &error);
        self.failed = Some(error);
    }

    /// Hands an undeliverable message back to the behaviour (dropped with the host: nothing
    /// is left to answer through).
    fn reject(&self, msg: A::Msg, error: HostError<A>) {
        if let Some(host) = self.host.upgrade() {
            self.behaviour.reject(&Host::from_inner(host), msg, error);
        }
    }

    /// The task ends: what was sent to the actor but left behind its stop (a message its
    /// background work sent back, say) goes to its successor.
    fn stopped(&mut self) {
        // The state goes first, with whatever it holds (work in flight that it cancels when
        // dropped, say), before the host may start a successor or report the key stopped.
        self.step = None;
        self.state = None;
        let unhandled = self
            .inbox
            .close()
            .into_iter()
            .filter_map(Envelope::into_user);
        let unhandled = unhandled.collect();
        if let Some(host) = self.host.upgrade() {
            host.on_stopped(self.ctx.key.clone(), self.generation, unhandled);
        }
    }
}

impl<A: VirtualActor> Future for Running<A> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        // The handler's panics are caught in its step; one anywhere else (the behaviour's
        // `can_passivate`, say) ends the actor, and the key must still be forgotten after it.
        match std::panic::catch_unwind(AssertUnwindSafe(|| this.drive(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(())) | Err(_) => {
                this.stopped();
                Poll::Ready(())
            }
        }
    }
}

/// One actor's task: its activation, then its life (none when the activation failed).
pub(crate) enum CellTask<A: VirtualActor> {
    Activating(Pin<Box<dyn Future<Output = Option<Running<A>>> + Send>>),
    Running(Running<A>),
}

impl<A: VirtualActor> Future for CellTask<A> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            match this {
                CellTask::Activating(activation) => match ready!(activation.as_mut().poll(cx)) {
                    Some(running) => *this = CellTask::Running(running),
                    None => return Poll::Ready(()),
                },
                CellTask::Running(running) => return Pin::new(running).poll(cx),
            }
        }
    }
}

/// Loads the state of `key`; a panic of the behaviour's activation is its failure.
pub(crate) async fn load<A: VirtualActor>(
    behaviour: &A,
    key: &A::Key,
) -> Result<A::State, HostError<A>> {
    match AssertUnwindSafe(Box::pin(behaviour.activate(key)))
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
