//! What a caller learns when a run ends or suspends.

use serde_json::Value;

use super::{RunError, Status};
use crate::ids::{RunId, SessionId};

/// How a run ended (or where it suspended).
#[derive(Clone, Debug, PartialEq)]
pub struct RunOutcome {
    /// The session.
    pub session_id: SessionId,
    /// The run.
    pub run_id: RunId,
    /// Its number among the session's runs, from 1: every `execute` and every `resume` is
    /// a run, so an execute, a resume and a second execute are turns 1, 2 and 3.
    pub turn: u32,
    /// How it ended.
    pub status: Status,
    /// The final assistant text.
    pub text: Option<String>,
    /// The finish value.
    pub output: Option<Value>,
    /// Why it failed or was interrupted.
    pub error: Option<RunError>,
    /// Tool calls that wait for an answer (for a suspended run).
    pub pending: Vec<String>,
}
