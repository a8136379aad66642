//! A generic virtual-actor host on tokio: one actor per key, activated by its first message,
//! passivated when idle or evicted least-recently-used, restarted from durable state when it
//! panics, and failed after too many crashes in a window.
//!
//! Each actor is one tokio task and a mailbox of the host's own (`mailbox.rs`), 0.7 KB of
//! RSS idle: the task's future is written by hand (`cell.rs`), so an idle actor keeps its
//! fields and nothing more. It was a [ractor](https://docs.rs/ractor) actor until activation, supervision and
//! passivation had all moved into the host; all that was left of ractor was a task and a
//! queue, at 6.6 KB an idle actor (four channels, two of them with 32 slots allocated up
//! front), 7.3 KB with the task the host kept waiting for its end: more than half of what a
//! resident suspended session cost (`cargo bench --bench host` measures a bare ractor actor
//! beside the host's).
//!
//! The host knows nothing of what the actors do. A behaviour implements [`VirtualActor`]:
//! how to load a key's state ([`VirtualActor::activate`]), how to handle a message, when it is
//! safe to stop, and how to answer a message that cannot be delivered.
//!
//! # Guarantees
//!
//! - **One actor per key.** A key's actor is the only one handling its messages; a new actor
//!   for a key is activated only after the previous one has fully stopped.
//! - **No lost messages.** A message sent while its actor is starting or stopping is buffered
//!   in the host and handed, in order, to the next actor for that key. A message that races an
//!   eviction is delivered either to the old actor before it stops or to the re-activated one;
//!   one that reached the old actor's mailbox behind its stop goes to the next actor first.
//! - **Eviction is only a stop.** The behaviour keeps its state durable; the host never asks it
//!   to save anything on the way out (a process can die at any point, so saving there would
//!   not be safe anyway).
//! - **Supervision.** A panic while handling a message is caught inside the actor; its state is
//!   reloaded through [`VirtualActor::activate`] and the mailbox goes on. After
//!   [`HostConfig::max_crashes`] panics within [`HostConfig::crash_window_ms`] the key is marked
//!   failed and every message for it is rejected with [`Error::Failed`].
//!
//! # Example
//!
//! ```
//! use dormant_actors::{ActorContext, Host, HostConfig, HostError, VirtualActor};
//! use tokio::sync::oneshot;
//!
//! #[derive(Debug)]
//! struct Counter;
//! enum CounterMsg { Add(u64, oneshot::Sender<u64>) }
//!
//! impl VirtualActor for Counter {
//!     type Key = String;
//!     type Msg = CounterMsg;
//!     type State = u64;
//!     type Error = std::convert::Infallible;
//!
//!     async fn activate(&self, _key: &String) -> Result<u64, Self::Error> { Ok(0) }
//!
//!     async fn handle(&self, _ctx: &ActorContext<Self>, msg: CounterMsg, total: &mut u64) {
//!         let CounterMsg::Add(n, reply) = msg;
//!         *total += n;
//!         let _ = reply.send(*total);
//!     }
//!
//!     fn reject(&self, _host: &Host<Self>, _msg: CounterMsg, _error: HostError<Self>) {}
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let host = Host::new(Counter, HostConfig::default());
//! let (tx, rx) = oneshot::channel();
//! host.send("a".to_string(), CounterMsg::Add(2, tx));
//! assert_eq!(rx.await.ok(), Some(2));
//! host.shutdown().await;
//! # }
//! ```

mod cell;
mod clock;
mod error;
mod host;
mod mailbox;
mod slot;

use std::fmt::{Debug, Display};
use std::future::Future;
use std::hash::Hash;

pub use cell::{ActorContext, Mailbox};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{Error, HostError};
pub use host::{Host, HostConfig, HostStats, WeakHost};

/// The behaviour of one kind of keyed, durable actor.
///
/// The host calls [`activate`](Self::activate) before the first message of a key (and again
/// after a panic), then [`handle`](Self::handle) for each message in order.
pub trait VirtualActor: Sized + Send + Sync + Debug + 'static {
    /// The identity of an actor, e.g. a session id.
    type Key: Clone + Eq + Hash + Send + Sync + Debug + Display + 'static;
    /// The messages an actor handles.
    type Msg: Send + Sync + 'static;
    /// What an actor keeps in memory while it is resident.
    type State: Send + 'static;
    /// Why loading a key's state failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Loads the state of `key` from durable storage (or creates it).
    fn activate(
        &self,
        key: &Self::Key,
    ) -> impl Future<Output = Result<Self::State, Self::Error>> + Send;

    /// Handles one message.
    fn handle(
        &self,
        ctx: &ActorContext<Self>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> impl Future<Output = ()> + Send;

    /// Whether an activation error is an expected refusal (the key is served elsewhere, say)
    /// rather than a fault: logged at debug instead of warn. The messages waiting for the
    /// actor are rejected either way.
    fn is_refusal(&self, _error: &Self::Error) -> bool {
        false
    }

    /// Whether the actor may stop now. An actor with work in flight (a run waiting on a model
    /// call, say) answers `false`, and an eviction request is dropped until it is idle again.
    fn can_passivate(&self, _state: &Self::State) -> bool {
        true
    }

    /// Called after the actor of `key` stopped because it was passivated or evicted (not on
    /// shutdown). Its state is already durable; this is for logs and metrics.
    fn passivated(&self, _key: &Self::Key) {}

    /// Answers a message that cannot be handled, so the sender learns why. `host` is the host
    /// the message was sent through, to tell other actors.
    fn reject(&self, host: &Host<Self>, msg: Self::Msg, error: HostError<Self>);

    /// Called once the actor of `key` was restarted after a panic (its state reloaded through
    /// [`activate`](Self::activate)), so the behaviour can tell whoever depended on the work the
    /// panic cut, through `host`.
    fn restarted(&self, _host: &Host<Self>, _key: &Self::Key, _state: &mut Self::State) {}

    /// Called when `key` is marked failed (it kept crashing, or its state could not be
    /// reloaded): from now on every message for it is rejected with `error`.
    fn failed(&self, _host: &Host<Self>, _key: &Self::Key, _error: &HostError<Self>) {}
}
