//! A trivial counter behaviour whose "durable storage" is a shared map, for host tests.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dormant_actors::{ActorContext, Host, HostError, Mailbox, VirtualActor};
use parking_lot::Mutex;
use tokio::sync::oneshot;

/// What the host answers a counter's message with when it cannot deliver it.
pub type Error = HostError<Counter>;

/// What a counter actor is asked to do.
#[derive(Debug)]
pub enum CounterMsg {
    /// Record `id` durably and answer with how many ids the key has.
    Apply {
        id: u64,
        reply: oneshot::Sender<Result<usize, Error>>,
    },
    /// Panic while handling.
    Panic {
        reply: oneshot::Sender<Result<usize, Error>>,
    },
    /// Mark the actor busy (it refuses to passivate) or idle.
    SetBusy {
        busy: bool,
        reply: oneshot::Sender<Result<usize, Error>>,
    },
    /// Hand out the actor's own mailbox (as background work holds it), then handle nothing
    /// more until `gate` opens (or is dropped).
    Hold {
        mailbox_to: oneshot::Sender<Mailbox<Counter>>,
        gate: oneshot::Receiver<()>,
    },
}

impl CounterMsg {
    fn into_reply(self) -> Option<oneshot::Sender<Result<usize, Error>>> {
        match self {
            CounterMsg::Apply { reply, .. }
            | CounterMsg::Panic { reply }
            | CounterMsg::SetBusy { reply, .. } => Some(reply),
            CounterMsg::Hold { .. } => None,
        }
    }
}

/// In-memory state of one counter: its ids (a copy of the durable list) and a busy flag.
#[derive(Debug, Default)]
pub struct CounterState {
    ids: Vec<u64>,
    busy: bool,
}

/// The counter behaviour. Every id is written to `durable` before the reply, so eviction is
/// only a stop.
#[derive(Debug, Default)]
pub struct Counter {
    pub durable: Arc<Mutex<HashMap<String, Vec<u64>>>>,
    pub activations: Arc<AtomicU64>,
    pub fail_activation_of: Option<String>,
}

impl VirtualActor for Counter {
    type Key = String;
    type Msg = CounterMsg;
    type State = CounterState;
    type Error = std::io::Error;

    async fn activate(&self, key: &String) -> Result<CounterState, std::io::Error> {
        self.activations.fetch_add(1, Ordering::SeqCst);
        if self.fail_activation_of.as_deref() == Some(key.as_str()) {
            return Err(std::io::Error::other("snapshot is corrupt"));
        }
        let ids = self.durable.lock().get(key).cloned().unwrap_or_default();
        Ok(CounterState { ids, busy: false })
    }

    async fn handle(&self, ctx: &ActorContext<Self>, msg: CounterMsg, state: &mut CounterState) {
        match msg {
            CounterMsg::Apply { id, reply } => {
                state.ids.push(id);
                self.durable
                    .lock()
                    .insert(ctx.key().clone(), state.ids.clone());
                let _ = reply.send(Ok(state.ids.len()));
            }
            CounterMsg::Panic { reply } => {
                drop(reply);
                panic!("counter asked to panic");
            }
            CounterMsg::SetBusy { busy, reply } => {
                state.busy = busy;
                let _ = reply.send(Ok(state.ids.len()));
            }
            CounterMsg::Hold { mailbox_to, gate } => {
                let _ = mailbox_to.send(ctx.mailbox());
                let _ = gate.await;
            }
        }
    }

    fn can_passivate(&self, state: &CounterState) -> bool {
        !state.busy
    }

    fn reject(&self, _host: &Host<Self>, msg: CounterMsg, error: Error) {
        if let Some(reply) = msg.into_reply() {
            let _ = reply.send(Err(error));
        }
    }
}

/// Sends `Apply { id }` to `key` and returns the receiver of its answer.
pub fn apply(
    host: &dormant_actors::Host<Counter>,
    key: &str,
    id: u64,
) -> oneshot::Receiver<Result<usize, Error>> {
    let (reply, rx) = oneshot::channel();
    host.send(key.to_string(), CounterMsg::Apply { id, reply });
    rx
}

/// Sends a message built by `make` and awaits its answer.
pub async fn ask(
    host: &dormant_actors::Host<Counter>,
    key: &str,
    make: impl FnOnce(oneshot::Sender<Result<usize, Error>>) -> CounterMsg,
) -> anyhow::Result<Result<usize, Error>> {
    let (reply, rx) = oneshot::channel();
    host.send(key.to_string(), make(reply));
    Ok(rx.await?)
}

/// How many times `key` was activated.
pub fn activations(counter: &Counter) -> u64 {
    counter.activations.load(Ordering::SeqCst)
}
