//! Work a session's actor started outside itself and waits to hear back from: a remote child's
//! driver or stop, the reconciliation of children a crash left running. Until each piece of
//! this activation reports, the session is at work: neither settled nor evicted.
//!
//! A panic in the actor reloads its state from the store, and the count starts again from
//! nothing: the reloaded activation reconciles the children it finds recorded as running and
//! watches the remote ones again, and a remote stop the earlier one started is not waited
//! for. Work the earlier activation started still reports afterwards, so each piece carries a
//! [`Ticket`] of the activation that started it, and a report whose ticket is of another
//! activation is not counted against this one. Without the tickets, such a report lowered the
//! new activation's count, and a session could be told settled while work the new activation
//! started was still running.

use std::sync::atomic::{AtomicU64, Ordering};

/// Numbers activations, so a ticket names the one that issued it. Process-wide: unique is
/// all a number needs to be.
static ACTIVATIONS: AtomicU64 = AtomicU64::new(0);

/// The pieces of outside work of one activation of a session's actor.
#[derive(Debug)]
pub(super) struct Outside {
    activation: u64,
    in_flight: usize,
}

/// Given when a piece of outside work starts, handed back with its report. Neither `Clone`
/// nor `Copy`: a piece is counted done once.
#[derive(Debug)]
#[must_use = "a piece of work is counted done only when its ticket is handed back"]
pub(crate) struct Ticket {
    activation: u64,
}

impl Outside {
    /// The outside work of a new activation: none yet.
    pub(super) fn new() -> Self {
        Self {
            activation: ACTIVATIONS.fetch_add(1, Ordering::Relaxed),
            in_flight: 0,
        }
    }

    /// Counts a piece of work as started, until its ticket comes back.
    pub(super) fn start(&mut self) -> Ticket {
        self.in_flight += 1;
        Ticket {
            activation: self.activation,
        }
    }

    /// Counts a piece of work as done. `false`, and nothing counted, when this activation did
    /// not start it (the state was reloaded after a panic since).
    pub(super) fn finish(&mut self, ticket: Ticket) -> bool {
        if ticket.activation != self.activation {
            return false;
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        true
    }

    /// No piece of outside work is in flight.
    pub(super) fn is_idle(&self) -> bool {
        self.in_flight == 0
    }
}

#[cfg(test)]
mod tests {
    use super::Outside;

    #[test]
    fn work_is_done_when_every_ticket_came_back() {
        let mut outside = Outside::new();
        let (first, second) = (outside.start(), outside.start());
        assert!(outside.finish(first));
        assert!(!outside.is_idle(), "one piece is still in flight");
        assert!(outside.finish(second));
        assert!(outside.is_idle());
    }

    #[test]
    fn a_report_of_work_an_earlier_activation_started_is_not_counted() {
        let mut before_the_panic = Outside::new();
        let stale = before_the_panic.start();
        let mut reloaded = Outside::new();
        let own = reloaded.start();
        assert!(!reloaded.finish(stale), "counted as this activation's");
        assert!(!reloaded.is_idle(), "idle while its own work is in flight");
        assert!(reloaded.finish(own));
        assert!(reloaded.is_idle());
    }
}
