//! A session's semantics as a pure state machine: [`Session::apply`] takes an input and the
//! time and returns the transition (the writes to make durable, then the effects to run). The
//! session actor only executes transitions, so every rule here is testable without actors,
//! sled or time.

mod core;
mod outcome;
mod state;
mod transition;

pub(crate) use self::core::{FinishedCall, Input, Session};
pub use outcome::RunOutcome;
pub use state::{ErrorCode, RunError, RunRecord, SessionRecord, Status};
pub(crate) use transition::{Effect, Transition};

#[cfg(test)]
mod tests;
