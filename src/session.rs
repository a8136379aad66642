//! A session's semantics as a pure state machine: `Session::apply` takes an input and the
//! time and returns the transition (the writes to make durable, then the effects to run). The
//! session actor only executes transitions, so every rule here is testable without actors,
//! sled or time.

mod apply_cx;
mod call_ids;
mod child_calls;
mod child_failures;
mod child_side;
mod children;
mod companion_list;
mod companions;
mod core;
mod cut;
mod input;
mod outcome;
mod pending;
pub(crate) mod remote_children;
mod remote_looks;
mod resume;
mod step;
pub mod submit;
mod suspend;
mod transition;

pub(crate) use self::child_calls::{ChildOrigin, ChildStart, ToReconcile};
pub(crate) use self::child_calls::{ChildReport, ReportedChild};
pub(crate) use self::child_failures::{ChildUnavailable, LostChild};
pub(crate) use self::child_side::{report_of, stored_state};
pub(crate) use self::core::{duration_ms, Policy, Session, Stored};
pub(crate) use self::input::{FinishedCall, Input};
pub use crate::types::record::{
    Answer, ChildCall, ChildState, Companion, CompanionStatus, ErrorCode, PendingCall, PendingKind,
    RunError, RunRecord, SessionRecord, Status, Suspension,
};
pub use outcome::{RunOutcome, RunStarted};
pub use suspend::NOT_APPROVED;
pub(crate) use suspend::{Submission, Verdict};
pub(crate) use transition::{ChildAt, Effect, Observation, RemoteDrive, Transition};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_call_ids;
#[cfg(test)]
mod tests_children;
#[cfg(test)]
mod tests_companions;
#[cfg(test)]
mod tests_golden;
#[cfg(test)]
mod tests_reach;
#[cfg(test)]
mod tests_remote;
#[cfg(test)]
mod tests_replay;
