//! A session's semantics as a pure state machine: `Session::apply` takes an input and the
//! time and returns the transition (the writes to make durable, then the effects to run). The
//! session actor only executes transitions, so every rule here is testable without actors,
//! sled or time.
//!
//! Public for what the core answers beyond the crate root's front door: a started run
//! ([`RunStarted`]), the answer a [`Submit`](crate::Submit) carries ([`SubmitAnswer`]), the
//! submit contract's defaults.

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
pub(crate) mod outcome;
mod pending;
pub(crate) mod remote_children;
mod remote_looks;
mod resume;
mod resume_due;
mod step;
pub(crate) mod submit;
mod suspend;
mod transition;

pub(crate) use self::child_calls::{ChildOrigin, ChildStart, ToReconcile};
pub(crate) use self::child_calls::{ChildReport, ReportedChild};
pub(crate) use self::child_failures::{ChildUnavailable, LostChild};
pub(crate) use self::child_side::{report_of, stored_state};
pub(crate) use self::core::{duration_ms, Policy, Session, Stored};
pub(crate) use self::input::{Asked, FinishedCall, Input};
pub(crate) use crate::types::record::{
    Answer, ChildCall, ChildState, Companion, CompanionStatus, ErrorCode, PendingCall, PendingKind,
    RunError, RunRecord, SessionRecord, Status, Suspension,
};
pub(crate) use outcome::RunOutcome;
// Public beyond the front door (the crate root has `Submit`, `SubmitOutcome`, `RunOutcome`):
// what a started run answers, the answer a `Submit` carries, the submit contract's defaults.
pub use outcome::RunStarted;
pub use submit::{
    SubmitAnswer, DEFAULT_MAX_JSON_DEPTH, DEFAULT_MAX_RESULT_BYTES, DEFAULT_TOMBSTONE_RETENTION_MS,
};
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
