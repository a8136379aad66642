//! What the host knows about one key: whether its actor is starting, live or stopping, and the
//! messages buffered while it is not live.

use std::sync::atomic::AtomicU64;

use crate::cell::Envelope;
use crate::mailbox::CellRef;
use crate::VirtualActor;

/// The lifecycle of a key's actor, as seen by the host.
pub(crate) enum Phase<A: VirtualActor> {
    /// Activation is loading state; messages wait here in arrival order.
    Starting { queue: Vec<A::Msg> },
    /// The actor takes messages directly.
    Live { actor: CellRef<Envelope<A::Msg>> },
    /// A passivation request is in the actor's mailbox; later messages wait here and go to the
    /// next actor for this key (or back to this one if it refuses to stop).
    Stopping {
        actor: CellRef<Envelope<A::Msg>>,
        queue: Vec<A::Msg>,
    },
}

/// One entry of the host's table.
pub(crate) struct Slot<A: VirtualActor> {
    /// Distinguishes successive actors of one key, so late events of an old actor are ignored.
    pub(crate) generation: u64,
    pub(crate) phase: Phase<A>,
    /// Host-wide use counter at the last message: the LRU order.
    pub(crate) last_use: AtomicU64,
    /// Clock time of the last message, for idle passivation.
    pub(crate) last_use_ms: AtomicU64,
}

impl<A: VirtualActor> Slot<A> {
    pub(crate) fn is_live(&self) -> bool {
        matches!(self.phase, Phase::Live { .. })
    }
}
