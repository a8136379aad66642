//! The deadline scheduler's inbox: what the session actors and the runtime send it
//! ([`SchedulerMsg`] through [`Deadlines`]) and what a sweep reports. Apart from the scheduler
//! (scheduler.rs), so that the session actor, which the scheduler tells of timeouts, can arm a
//! deadline without importing the scheduler back.

use tokio::sync::{mpsc, oneshot};

use crate::error::Error;

/// What one sweep did. Read its fields; a later version may add more.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweepReport {
    /// Expired calls whose owners were told to record a timeout.
    pub fired: usize,
    /// Expired calls left for another node: their session's tree is owned there (a store
    /// several nodes share), and that node fires them; this one tries again later.
    pub deferred: usize,
    /// Tombstones removed because their retention ended.
    pub reaped: usize,
    /// Expired entries that no call waits on any more (fired, their session had nothing to
    /// do for them; or no such session): removed from the index, and not counted in `fired`.
    /// On a healthy store they do not occur: each is a deadline the store kept after the
    /// commit that removed it.
    pub cleared: usize,
}

/// Requests the scheduler handles.
#[derive(Debug)]
pub(crate) enum SchedulerMsg {
    /// A deadline at `at` was armed: wake up by then.
    Armed { at: u64 },
    /// Fire what has expired now. With a reply, it is sent once every affected session has
    /// settled (its timeouts recorded and any automatic resume finished).
    Sweep {
        reply: Option<oneshot::Sender<Result<SweepReport, Error>>>,
    },
}

/// Where the scheduler's requests go: the session actors tell it of new deadlines, the runtime
/// asks it to sweep. Cloneable; sending to a scheduler that stopped does nothing (a sweep's
/// caller then learns it from the dropped reply).
#[derive(Clone, Debug)]
pub(crate) struct Deadlines {
    inbox: mpsc::UnboundedSender<SchedulerMsg>,
}

impl Deadlines {
    /// A handle and the receiving end the scheduler is started with.
    pub(crate) fn channel() -> (Self, mpsc::UnboundedReceiver<SchedulerMsg>) {
        let (inbox, requests) = mpsc::unbounded_channel();
        (Self { inbox }, requests)
    }

    pub(crate) fn send(&self, msg: SchedulerMsg) {
        let _ = self.inbox.send(msg);
    }
}
