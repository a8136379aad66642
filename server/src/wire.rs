//! The JSON bodies of the routes (snake_case, unknown fields refused).

use dormant::remote::RemoteCall;
use dormant::session::RunStarted;
use dormant::types::{Answer, PendingCall, RunError, RunRecord, RunUsage, SessionRecord, ToolInfo};
use dormant::Chunk;
use dormant::{PendingKind, RunId, Status};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /start`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StartRequest {
    pub(crate) agent: String,
    pub(crate) message: String,
    /// Only for a caller that may choose ids, or with the token of that session (a new turn
    /// of a conversation).
    #[serde(default)]
    pub(crate) session_id: Option<String>,
    /// With `session_id`: only if no session has that id (else 409 `session_exists`, and
    /// nothing runs). What a parent on another server sends to start a remote child, so a
    /// start replayed after its crash never gives the child a second turn.
    #[serde(default)]
    pub(crate) new_only: bool,
    /// With `new_only`, from a parent on another server starting its remote sub-agent: the
    /// parent session and the root of its tree there (both or neither). The child records
    /// them and keeps a local child's rules.
    #[serde(default)]
    pub(crate) parent_session_id: Option<String>,
    #[serde(default)]
    pub(crate) root_session_id: Option<String>,
}

/// `POST /resume`, `/interrupt`, `/abort`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionRequest {
    pub(crate) session_id: String,
}

/// `GET /status`, `/runs`, `/messages`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionQuery {
    // Which session, with what token: read by `SessionAccess` (access.rs), named here so
    // that the query refuses a missing id and unknown fields as it always did.
    #[serde(rename = "session_id")]
    _session_id: String,
    #[serde(default, rename = "token")]
    _token: Option<String>,
    /// `GET /status` only: first wait up to this long (ms, at most 10 s) for no run of the
    /// session to be in progress, and say whether it settled. A resume that is still waking
    /// the session's children has the suspended status until it goes on: a parent on another
    /// server must not read that as the child's answer.
    #[serde(default)]
    pub(crate) settle_ms: Option<u64>,
    /// `GET /status` only: also answer the session's stored chunks from this sequence number
    /// on (at most [`MAX_STATUS_CHUNKS`]), read after the status: what a parent on another
    /// server copies into its own stream, without opening a stream for it.
    #[serde(default)]
    pub(crate) chunks_from: Option<u64>,
}

/// `GET /state`: a session and one of its checkpoints.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StateQuery {
    // Read by `SessionAccess`, named here as in `SessionQuery`.
    #[serde(rename = "session_id")]
    _session_id: String,
    #[serde(default, rename = "token")]
    _token: Option<String>,
    /// The checkpoint's id (`GET /checkpoints` lists them).
    pub(crate) checkpoint: u64,
}

/// `GET /inbox`'s query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InboxQuery {
    /// Only calls of sessions of this agent.
    #[serde(default)]
    pub(crate) agent: Option<String>,
    /// Only `client` calls or only `approval`s.
    #[serde(default)]
    pub(crate) kind: Option<dormant::PendingKind>,
    /// Only calls of this tool.
    #[serde(default)]
    pub(crate) tool: Option<String>,
    /// Where the page starts: the previous page's `next`.
    #[serde(default)]
    pub(crate) after: Option<String>,
    /// How many calls at most (50 by default, at most 500).
    #[serde(default)]
    pub(crate) limit: Option<usize>,
}

/// `POST /fork`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkRequest {
    /// The session forked (its token, or an operator, may fork it).
    pub(crate) session_id: String,
    /// Its checkpoint the fork starts from.
    pub(crate) checkpoint: u64,
    /// A new message the fork continues with.
    #[serde(default)]
    pub(crate) message: Option<String>,
    /// The last user message, edited: the fork runs with it instead.
    #[serde(default)]
    pub(crate) edit_message: Option<String>,
    /// Answers the fork starts with, for calls without a result at the checkpoint.
    #[serde(default)]
    pub(crate) answers: Vec<ForkAnswerRequest>,
}

/// One answer of `POST /fork`: `result`, `error`, or `approved` (with a `reason`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkAnswerRequest {
    pub(crate) tool_call_id: String,
    #[serde(default)]
    pub(crate) result: Option<Value>,
    #[serde(default)]
    pub(crate) error: Option<String>,
    #[serde(default)]
    pub(crate) approved: Option<bool>,
    #[serde(default)]
    pub(crate) reason: Option<String>,
}

impl ForkAnswerRequest {
    /// The answer it carries; `None` unless exactly one of `result`, `error`, `approved`.
    pub(crate) fn answer(self) -> Option<(String, dormant::types::ForkAnswer)> {
        let answer = dormant::types::ForkAnswer::from_fields(
            self.result,
            self.error,
            self.approved,
            self.reason,
        )?;
        Some((self.tool_call_id, answer))
    }
}

/// The most chunks one `GET /status?chunks_from=` answers; the caller asks again from the
/// next one.
pub(crate) const MAX_STATUS_CHUNKS: usize = 1_000;

/// `POST /submit-tool-result`'s query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubmitQuery {
    /// Resume the session once the answer is accepted.
    #[serde(default)]
    pub(crate) resume: bool,
    /// With `resume`: answer with the resumed run's stream instead of JSON.
    #[serde(default)]
    pub(crate) stream: bool,
}

/// `POST /start`'s query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamOption {
    /// Answer with the run's stream (first an event with the JSON answer) instead of JSON.
    #[serde(default)]
    pub(crate) stream: bool,
}

/// `GET /sse`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamQuery {
    // Which session, with what token: read by `SessionAccess` (access.rs), named here so
    // that the query refuses a missing id and unknown fields as it always did.
    #[serde(rename = "session_id")]
    _session_id: String,
    #[serde(default, rename = "token")]
    _token: Option<String>,
    /// The first sequence number to send (a `Last-Event-ID` header wins: it is one past it).
    #[serde(default)]
    pub(crate) from: Option<u64>,
    /// `settled` (default): end after the run ends, suspends or is interrupted. `closed`:
    /// stay open for the next turn, until the client goes, the server shuts down or the
    /// stream is idle too long.
    #[serde(default)]
    pub(crate) until: Until,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Until {
    #[default]
    Settled,
    Closed,
}

/// The answer of `POST /start` and `POST /resume`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Started {
    pub(crate) session_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) token: Option<String>,
    pub(crate) run_id: Option<RunId>,
    pub(crate) status: Status,
    pub(crate) from_seq: u64,
    /// Nothing the request started is still at work (a resume that found calls still
    /// waiting and no sub-agent to wake).
    pub(crate) settled: bool,
    /// Where to follow the run (add the token): relative to the request's URL, so it holds
    /// for a router nested under a prefix.
    pub(crate) stream: String,
}

impl Started {
    pub(crate) fn new(started: RunStarted, token: Option<String>) -> Self {
        let session_id = started.session_id.to_string();
        Self {
            stream: format!(
                "sse?session_id={}&from={}",
                encode(&session_id),
                started.from_seq
            ),
            session_id,
            token,
            run_id: started.run_id,
            status: started.status,
            from_seq: started.from_seq,
            settled: started.settled,
        }
    }
}

/// The first event of `POST /submit-tool-result?resume=true&stream=true`: the answer was
/// accepted and the run resumed.
#[derive(Debug, Serialize)]
pub(crate) struct AcceptedAndResumed {
    code: &'static str,
    resumed: Started,
}

impl AcceptedAndResumed {
    pub(crate) fn new(resumed: Started) -> Self {
        Self {
            code: "accepted",
            resumed,
        }
    }
}

/// The answer of `GET /status`.
#[derive(Debug, Serialize)]
pub(crate) struct StatusAnswer {
    pub(crate) session_id: String,
    pub(crate) agent: String,
    pub(crate) status: Status,
    pub(crate) run_id: Option<RunId>,
    pub(crate) turn: u32,
    pub(crate) aborted: bool,
    pub(crate) message_count: u64,
    /// The next chunk's sequence number.
    pub(crate) chunk_count: u64,
    /// The server's clock (ms), to compare deadlines with.
    pub(crate) now_ms: u64,
    pub(crate) pending: Vec<PendingAnswer>,
    /// The current (or last) run's tokens and tool outcomes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) usage: Option<RunUsage>,
    /// The run's final text, once it completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) text: Option<String>,
    /// The run's final value (an output schema's), once it completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) output: Option<Value>,
    /// Why the run failed or was interrupted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<RunError>,
    /// With `settle_ms`: whether no run of the session was in progress when it answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) settled: Option<bool>,
    /// With `chunks_from`: the stored chunks from there on, in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) chunks: Option<Vec<Chunk>>,
    /// Remote sub-agents of the tree whose servers have not answered lately: the tree waits
    /// on them too, and their parents try again by themselves.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) unreachable: Vec<UnreachableAnswer>,
    /// For a fork: the session and checkpoint it was made from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) forked_from: Option<dormant::types::ForkOrigin>,
}

/// A remote sub-agent whose server has not answered since `since_ms` (this server's clock).
#[derive(Debug, Serialize)]
pub(crate) struct UnreachableAnswer {
    /// The child, on the remote.
    pub(crate) session_id: String,
    pub(crate) endpoint: String,
    pub(crate) since_ms: u64,
    /// When its parent tries again (this server's clock).
    pub(crate) retry_at_ms: u64,
    /// A resume of the tree is carried out once the remote answers.
    pub(crate) resume_pending: bool,
}

impl UnreachableAnswer {
    pub(crate) fn of(child: &dormant::types::ChildCall) -> Option<Self> {
        let look = child.remote_look?;
        let dormant::remote::LookReason::Unreachable { since_ms, wake } = look.why else {
            return None;
        };
        Some(Self {
            session_id: child.child.to_string(),
            endpoint: child.remote.as_ref()?.endpoint.clone(),
            since_ms,
            retry_at_ms: look.at_ms,
            resume_pending: wake,
        })
    }
}

impl StatusAnswer {
    pub(crate) fn new(
        record: SessionRecord,
        run: Option<RunRecord>,
        pending: Vec<PendingAnswer>,
        now_ms: u64,
    ) -> Self {
        let (usage, text, output, error) = match run {
            Some(run) => (Some(run.usage), run.text, run.output, run.error),
            None => (None, None, None, None),
        };
        Self {
            usage,
            text,
            output,
            error,
            settled: None,
            chunks: None,
            unreachable: Vec::new(),
            forked_from: record.forked_from,
            session_id: record.id.to_string(),
            agent: record.agent,
            status: record.status,
            run_id: record.current_run,
            turn: record.run_count,
            aborted: record.aborted,
            message_count: record.message_count,
            chunk_count: record.chunk_count,
            now_ms,
            pending,
        }
    }
}

/// One pending call, as `GET /status` lists it.
#[derive(Debug, Serialize)]
pub(crate) struct PendingAnswer {
    /// The session that made the call: the root, or a sub-agent under it (answered through
    /// the root all the same).
    pub(crate) session_id: String,
    pub(crate) tool_call_id: String,
    pub(crate) tool_name: String,
    pub(crate) kind: PendingKind,
    /// For an approval: the id its answer must carry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) approval_id: Option<String>,
    pub(crate) input: Value,
    pub(crate) requested_at_ms: u64,
    pub(crate) deadline_at_ms: u64,
    /// Still waiting for an answer (not answered, not expired).
    pub(crate) waiting: bool,
    /// Answered (by anyone), waiting for a resume to act on it.
    pub(crate) answered: bool,
    /// Its deadline passed and the timeout is recorded.
    pub(crate) timed_out: bool,
    /// For an approval: what it is bound to; the decision names it (`binding`), so that it
    /// is accepted only for this very request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) binding: Option<String>,
    /// The tool's description (for a remote sub-agent's call, as its server's status gave it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) description: Option<String>,
    /// The schema of the tool's input: what an edited approval must match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) input_schema: Option<Value>,
    /// For a client tool: the schema its result must match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) output_schema: Option<Value>,
    /// For an approval: the person may edit the input when approving (`edited_input`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) editable: bool,
    /// For a reconciliation (`kind: "reconcile"`, a call a crash cut): the call's idempotency
    /// key, to look its effect up by before answering whether it happened (a question,
    /// `kind: "input"`, carries its call's too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) idempotency_key: Option<String>,
    /// For an `input` call (a tool asked a person while it ran): the question, and the
    /// schema its answer (a `client-tool-result`) must match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) request: Option<dormant::definition::InputRequest>,
    /// For an `input` call: the number of the question it waits on, which an answer may name
    /// (`question`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) question: Option<u32>,
}

impl PendingAnswer {
    /// `call` of session `owner`, with what `tool` says of its tool (if this server defines
    /// it).
    pub(crate) fn new(
        owner: dormant::SessionId,
        call: PendingCall,
        now_ms: u64,
        tool: Option<ToolInfo>,
    ) -> Self {
        let tool = tool.unwrap_or_default();
        Self {
            binding: call.binding.clone(),
            idempotency_key: call.idempotency_key.clone(),
            request: call.request.clone(),
            question: call.question(),
            description: tool.description,
            input_schema: tool.input_schema,
            output_schema: tool.output_schema,
            editable: tool.editable,
            session_id: owner.to_string(),
            approval_id: (call.kind == PendingKind::Approval).then(|| call.approval_id()),
            waiting: call.is_waiting(now_ms),
            answered: call
                .answer
                .as_ref()
                .is_some_and(|answer| !matches!(answer, Answer::TimedOut)),
            timed_out: matches!(call.answer, Some(Answer::TimedOut)),
            tool_call_id: call.tool_call_id,
            tool_name: call.tool_name,
            kind: call.kind,
            input: call.input,
            requested_at_ms: call.requested_at_ms,
            deadline_at_ms: call.deadline_at_ms,
        }
    }
}

impl From<RemoteCall> for PendingAnswer {
    /// A call a remote sub-agent's tree waits on, as its server listed it (its times are that
    /// server's clock).
    fn from(call: RemoteCall) -> Self {
        Self {
            session_id: call.owner,
            tool_call_id: call.tool_call_id,
            tool_name: call.tool_name,
            kind: call.kind,
            approval_id: call.approval_id,
            input: call.input,
            requested_at_ms: call.requested_at_ms,
            deadline_at_ms: call.deadline_at_ms,
            waiting: call.waiting,
            answered: call.answered,
            timed_out: call.timed_out,
            idempotency_key: call.idempotency_key,
            binding: call.binding,
            description: call.description,
            input_schema: call.input_schema,
            output_schema: call.output_schema,
            editable: call.editable,
            request: call.request,
            question: call.question,
        }
    }
}

/// Percent-encodes a query value (session ids may hold any printable character).
pub(crate) fn encode(text: &str) -> String {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    // One allocation, not one per byte: every start and resume answer carries one.
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                encoded.push(char::from(byte));
            }
            _ => {
                encoded.push('%');
                encoded.push(char::from(DIGITS[usize::from(byte >> 4)]));
                encoded.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
            }
        }
    }
    encoded
}

#[cfg(test)]
mod tests {
    use super::encode;

    #[test]
    fn encode_keeps_unreserved_bytes_and_escapes_the_rest() {
        assert_eq!(encode("aZ09-_.~"), "aZ09-_.~");
        assert_eq!(encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        assert_eq!(encode(""), "");
    }
}
