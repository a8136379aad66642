//! What a caller learns when a run ends or suspends.

use serde_json::Value;

use super::{RunError, Status};
use crate::types::ids::{RunId, SessionId};

/// How a run ended (or where it suspended).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
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

/// What a caller learns when a run has started, without waiting for it to end
/// ([`Runtime::start_on`](crate::Runtime::start_on), [`Runtime::start_resume`](crate::Runtime::start_resume)):
/// the request's first commit is durable, and the run goes on in the runtime.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunStarted {
    /// The session.
    pub session_id: SessionId,
    /// The session's current run (the one started, or the one a resume joined or found
    /// waiting).
    pub run_id: Option<RunId>,
    /// Where the session stands right after that commit: `running` while the run goes on,
    /// or already settled (a resume that found calls still pending answers their suspended
    /// status; nothing ran).
    pub status: Status,
    /// The sequence number of the first stream chunk this request produced: follow the
    /// stream from here to see the run ([`Runtime::follow`](crate::Runtime::follow)).
    pub from_seq: u64,
    /// Whether nothing the request started is still at work: `false` while the run goes on,
    /// and while a resume wakes the session's sub-agents (its status stays suspended until
    /// they report, and then it may go on); `true` for a resume that found calls still
    /// waiting and nothing to wake (nothing ran).
    #[serde(default)]
    pub settled: bool,
}
