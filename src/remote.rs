//! Remote sub-agents: a sub-agent call whose child runs on another dormant server, reached
//! through a [`RemoteAgents`] transport (`dormant_server::HttpRemoteAgents` speaks the agent
//! server's HTTP routes; a test may answer in process).
//!
//! The parent treats a remote child as it treats a local one: the child call is recorded
//! with the remote's endpoint and the child's session id (deterministic: `{parent}-sub-{call}`,
//! so a replay after a crash finds the same child and never starts a second) in the commit
//! that dispatches it; the child's stream is copied into the parent's when it reports; its
//! final text or value becomes the tool result. What is new is that the calls the remote
//! child waits on (its client tools and approvals, and those of its own children) become
//! routable from the parent's root: the parent records each on the root with where it lives,
//! and a submit made at the root is forwarded to the remote, whose answer is returned as is.
//! See `ARCHITECTURE.md` ("Remote sub-agents") for the protocol and its crash table.

mod driver;
mod forward;
mod orphans;
mod owner;

use std::fmt;
use std::time::Duration;

use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::session::submit::{Submit, SubmitOutcome};
use crate::session::{PendingKind, RunError, Status};
use crate::types::ids::{RunId, SessionId};
use crate::types::stream::Chunk;

/// Where a remote parent or child is, and when a parent looks at its remote child: defined
/// beside the records that hold them (`types/remote.rs`).
pub use crate::types::remote::{
    a2a_url, LookReason, RemoteChild, RemoteLook, RemoteParent, A2A_SCHEME,
};
pub(crate) use driver::{drive, stop_remote, Drive, Driven};
pub(crate) use forward::forward;
pub(crate) use orphans::{
    forget as forget_orphan, forget_if_recorded as forget_orphan_if_recorded,
    pass as stop_orphans_once, record as record_orphan, run as stop_orphans,
};
pub(crate) use owner::{Owner, RemoteOwner};

/// A remote child its parent let go (wrote off after the remote stayed unreachable, aborted,
/// or interrupted) whose server did not answer the stop: kept in the store until the remote
/// answers a stop (or says it does not know the child), so a tree that gave up on a remote
/// leaves nothing running there once it is back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RemoteOrphan {
    /// The child, on the remote.
    pub(crate) child: SessionId,
    /// The remote's base URL.
    pub(crate) endpoint: String,
    /// Abort (else interrupt) it.
    pub(crate) abort: bool,
    /// When its parent let it go (clock ms).
    pub(crate) since_ms: u64,
    /// The orphan pass leaves it alone until then (clock ms). Set by the commit that let it
    /// go, while that stop itself is under way (a stop that fails records it again without;
    /// past then, a crash or a caller gone cut that stop), and after each refusal of its stop,
    /// for longer each time (see `refusals`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) held_until_ms: Option<u64>,
    /// How many times in a row its server refused to stop it for good (a 401, a 500): each
    /// refusal doubles the wait before the next try, up to [`REFUSED_STOP_MAX_WAIT_MS`]. Such
    /// a refusal may end with a change on either side (credentials mended), so it is tried
    /// again, rarely, rather than given up.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) refusals: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The longest wait between two tries to stop an orphan whose server refuses it for good.
pub(crate) const REFUSED_STOP_MAX_WAIT_MS: u64 = 60 * 60 * 1000;

impl RemoteOrphan {
    /// The wait before the try after the `refusals`-th refusal in a row: 2 s, doubled each
    /// time, an hour at most.
    pub(crate) fn wait_after_refusals(refusals: u32) -> u64 {
        1_000u64
            .saturating_mul(1u64 << refusals.min(32))
            .min(REFUSED_STOP_MAX_WAIT_MS)
    }
}

/// How long the stop of a remote child is left to itself before the orphan pass takes it
/// over: longer than the stop's own tries (`RemotePolicy`'s attempts, each bounded by its
/// request's timeout).
pub(crate) const STOP_UNDER_WAY_MS: u64 = 10 * 60 * 1000;

/// A call a remote child's tree waits on, as the remote's status lists it (the JSON of the
/// agent server's `GET /status` `pending` entries).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemoteCall {
    /// The session on the remote that owns the call (the remote child, or one under it).
    #[serde(rename = "session_id")]
    pub owner: String,
    /// The call.
    pub tool_call_id: String,
    /// The tool.
    pub tool_name: String,
    /// A client tool, an approval or a reconciliation.
    pub kind: PendingKind,
    /// For an approval: the id its answer must carry.
    #[serde(default)]
    pub approval_id: Option<String>,
    /// The call's input.
    #[serde(default)]
    pub input: Value,
    /// When it became pending (the remote's clock, ms).
    #[serde(default)]
    pub requested_at_ms: u64,
    /// When it times out (the remote's clock, ms).
    #[serde(default)]
    pub deadline_at_ms: u64,
    /// Still waiting for an answer (not answered, not expired).
    #[serde(default = "yes")]
    pub waiting: bool,
    /// Answered, waiting for a resume to act on the answer.
    #[serde(default)]
    pub answered: bool,
    /// Its deadline passed and the remote recorded the timeout.
    #[serde(default)]
    pub timed_out: bool,
    /// For a reconciliation (a call a crash cut there) or a question: the call's idempotency key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// For an approval: what it is bound to (the decision may name it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<String>,
    /// The tool's description, as the remote's status gives it (for a person's side).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The tool's input schema (what an edited approval must match).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
    /// For a client tool: the schema its result must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// For an approval: the person may edit the input when approving.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub editable: bool,
    /// For an `input` call (a tool asked a person while it ran): the question, and the schema
    /// its answer must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<crate::definition::InputRequest>,
    /// For an `input` call: the number of the question it waits on (1 for its first); an
    /// answer may name it, so that a retried answer to an earlier question is not taken for
    /// this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<u32>,
}

fn yes() -> bool {
    true
}

impl RemoteCall {
    /// When the remote will settle this call by itself (its clock), if it has not yet: the
    /// deadline of a call still waiting, or of one whose deadline passed but whose timeout
    /// the remote has not recorded yet (its scheduler is about to).
    pub(crate) fn settles_by_itself_at(&self) -> Option<u64> {
        (self.waiting || !(self.answered || self.timed_out)).then_some(self.deadline_at_ms)
    }
}

/// How a remote session stands: what its parent needs to report it.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteStatus {
    /// The status of its last (or current) run.
    pub status: Status,
    /// That run.
    pub run_id: Option<RunId>,
    /// Aborted: it never runs again.
    pub aborted: bool,
    /// The next chunk's sequence number.
    pub chunk_count: u64,
    /// The run's final text, once it completed.
    pub text: Option<String>,
    /// The run's final value (an output schema's), once it completed.
    pub output: Option<Value>,
    /// Why the run failed or was interrupted.
    pub error: Option<RunError>,
    /// The calls its tree waits on.
    pub pending: Vec<RemoteCall>,
    /// No run of it was in progress when the status was read (a resume still waking its
    /// own children shows the suspended status, but has not answered yet).
    pub settled: bool,
    /// Its stored chunks from the sequence number asked for (a transport may answer fewer
    /// than `chunk_count` holds, or none: the caller reads the rest from [`RemoteAgents::chunks`]).
    pub chunks: Vec<Chunk>,
}

/// Whether a start created the remote session or found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteStart {
    /// Created now, its first run started.
    Started,
    /// It existed already (a replay after a crash): re-attach to it.
    Existed,
}

/// Why a remote could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// No answer: connection refused, reset or timed out. Retryable: nothing was decided.
    #[error("remote {endpoint} is unreachable: {reason}")]
    Unreachable {
        /// The remote's base URL.
        endpoint: String,
        /// What failed.
        reason: String,
    },
    /// The remote answered with an error of its own.
    #[error("remote {endpoint} answered {status} {code}: {message}")]
    Refused {
        /// The remote's base URL.
        endpoint: String,
        /// The HTTP status (or 0 in process).
        status: u16,
        /// The remote's stable error code.
        code: String,
        /// Its message.
        message: String,
    },
    /// The remote answered something this side cannot read.
    #[error("remote {endpoint} answered something unreadable: {reason}")]
    Protocol {
        /// The remote's base URL.
        endpoint: String,
        /// What was wrong.
        reason: String,
    },
    /// No transport is configured (`RuntimeBuilder::remote_agents`).
    #[error("no remote transport is configured: RuntimeBuilder::remote_agents")]
    NoTransport,
}

impl RemoteError {
    /// Whether trying again later may succeed: the remote was unreachable, overloaded (429,
    /// 503), did not read the request in time (408), or answered through a proxy that could
    /// not reach it (502, 504: a remote that restarts behind one). A 500 is the remote's own
    /// answer, and final.
    pub fn is_retryable(&self) -> bool {
        match self {
            RemoteError::Unreachable { .. } => true,
            RemoteError::Refused { status, .. } => matches!(status, 408 | 429 | 502 | 503 | 504),
            RemoteError::Protocol { .. } | RemoteError::NoTransport => false,
        }
    }

    /// Whether the remote said the session does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, RemoteError::Refused { status: 404, .. })
    }
}

/// A stream of a remote session's chunks.
pub type RemoteChunks = BoxStream<'static, Result<Chunk, RemoteError>>;

/// How a runtime reaches the servers its remote sub-agents live on. Credentials are the
/// transport's: the parent acts on its children as an operator of the remote (it chooses
/// their ids, and needs no per-session token).
#[async_trait::async_trait]
pub trait RemoteAgents: Send + Sync + fmt::Debug + 'static {
    /// Creates session `session` of `agent` at `endpoint` with its first message, as the
    /// remote child of `parent` (which the remote records: the child keeps a local child's
    /// rules there), or finds it if it exists (never a second turn: a replayed start
    /// re-attaches).
    async fn start(
        &self,
        endpoint: &str,
        agent: &str,
        session: &SessionId,
        message: &str,
        parent: &RemoteParent,
    ) -> Result<RemoteStart, RemoteError>;

    /// How the session stands, once no run of it is in progress, or after a short wait
    /// (then [`RemoteStatus::settled`] is `false`), with its chunks from `chunks_from` on.
    async fn status(
        &self,
        endpoint: &str,
        session: &SessionId,
        chunks_from: u64,
    ) -> Result<RemoteStatus, RemoteError>;

    /// The session's chunks from sequence number `from` on, staying open for new ones (the
    /// caller drops the stream when it has what it needs).
    async fn chunks(
        &self,
        endpoint: &str,
        session: &SessionId,
        from: u64,
    ) -> Result<RemoteChunks, RemoteError>;

    /// Resumes the session (a resume cascading down from the parent's root).
    async fn resume(&self, endpoint: &str, session: &SessionId) -> Result<(), RemoteError>;

    /// Submits an answer at the remote (`submit.session_id` is the remote root).
    async fn submit(&self, endpoint: &str, submit: &Submit) -> Result<SubmitOutcome, RemoteError>;

    /// Interrupts (or with `abort`, aborts) the session and its tree; returns once stopped.
    async fn stop(
        &self,
        endpoint: &str,
        session: &SessionId,
        abort: bool,
    ) -> Result<(), RemoteError>;
}

/// How a runtime retries a remote that does not answer.
///
/// Each request to a remote is tried `attempts` times, `backoff` apart (doubling). A start
/// that never gets an answer then makes the call the tool error `remote_subagent_failed`.
/// A child that exists is not given up so soon: a remote that does not answer while the
/// parent resumes or follows the child (a restart, a deploy) keeps the tree waiting, and the
/// parent tries again by itself, at growing intervals of at most `max_retry_wait`, for
/// `patience`; a resume asked for meanwhile is carried out once the remote is back. Only a
/// remote unreachable for longer makes the call `remote_subagent_lost` (and the child is
/// stopped there whenever the remote answers again). Recovery after a crash asks each remote
/// child for its status in the background with the same tries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemotePolicy {
    /// Tries at most per request (the first included).
    pub attempts: u32,
    /// The wait before the second try; doubled each time.
    pub backoff: Duration,
    /// How long a remote child may stay unreachable before its parent writes it off.
    pub patience: Duration,
    /// The longest wait between two tries of an unreachable remote child.
    pub max_retry_wait: Duration,
}

impl Default for RemotePolicy {
    fn default() -> Self {
        Self {
            attempts: 5,
            backoff: Duration::from_millis(100),
            patience: Duration::from_secs(10 * 60),
            max_retry_wait: Duration::from_secs(30),
        }
    }
}
