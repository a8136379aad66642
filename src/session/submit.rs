//! The submit contract: how a client's answer for a pending call is expressed, checked and
//! answered.
//!
//! Every expected outcome is a value of [`SubmitOutcome`], not an error: only a store failure
//! is an `Err`.

use serde_json::{Map, Value};

use crate::definition::Reconciled;
use crate::session::Submission;
use crate::types::ids::SessionId;
use crate::types::nesting;

/// The largest result (or error text) accepted by default: 1 MiB.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 1024 * 1024;
/// How deeply a submitted result (and any JSON value from outside: a model's tool-call input,
/// a tool's result) may nest by default, counting arrays and objects, as serde_json's parser
/// does.
pub const DEFAULT_MAX_JSON_DEPTH: usize = 128;
/// How long a completed call's tombstone answers duplicates by default: 24 hours.
pub const DEFAULT_TOMBSTONE_RETENTION_MS: u64 = 24 * 60 * 60 * 1000;

/// An answer for a pending call, always addressed to the ROOT session of its tree.
///
/// ```
/// use dormant::Submit;
/// use serde_json::json;
///
/// let answer = Submit::result("s1", "tc-1", json!({ "applied": 1 }));
/// let parsed = Submit::from_json(&json!({
///     "session_id": "s1", "tool_call_id": "tc-1", "result": { "applied": 1 }
/// }));
/// assert_eq!(parsed, Ok(answer));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Submit {
    /// The root session.
    pub session_id: String,
    /// The pending call.
    pub tool_call_id: String,
    /// The answer.
    pub answer: SubmitAnswer,
    /// Set by the server of a remote sub-agent's parent when it forwards an answer given at
    /// its root: that root (on the parent's server). `session_id` then names the remote
    /// child, which takes answers only this way (see [`Runtime::start_remote_child`]).
    ///
    /// [`Runtime::start_remote_child`]: crate::Runtime::start_remote_child
    pub via_root: Option<String>,
    /// The session that made the call, when the submitter knows it (`GET /status` lists each
    /// pending call with it): needed only when several sessions of the tree wait on calls
    /// with this id (a child's `tc-1` and its sibling's). Without it, such an answer goes to
    /// the call its approval id names, else to the one that has waited longest. Still the
    /// root is the session submitted to.
    pub owner_session_id: Option<String>,
    /// For an answer to a tool's question (an `input` call): the number of the question it
    /// answers (the `question` the inbox and `GET /status` list; 1 for the call's first). A
    /// tool that asks again waits under the same call id, so a retried answer to an earlier
    /// question would otherwise be taken as the answer to the next: named, it is
    /// `already_completed`. Optional.
    pub question: Option<u32>,
}

/// What a [`Submit`] answers with.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum SubmitAnswer {
    /// A client tool's result (checked against the tool's output schema).
    Result(Value),
    /// An error instead of a result; accepted for client calls and approvals alike (an
    /// approval's tool then never runs). Not schema-checked.
    Error(String),
    /// A decision on an approval gate.
    Approval {
        /// `{runId}::{toolCallId}` of the call, as the `tool_approval_request` chunk gave it.
        approval_id: String,
        /// Approved: the tool runs with its stored input on resume. Denied: it never runs.
        approved: bool,
        /// Why (recorded with a denial).
        reason: Option<String>,
        /// Approved with this input instead of the call's (a tool whose approval is
        /// [`Approval::Editable`](crate::definition::Approval::Editable)).
        edited_input: Option<Value>,
        /// The binding of the request the decision was made for (see [`Submit::bound_to`]).
        binding: Option<String>,
    },
    /// Whether the effect of a call a crash cut happened, for a `reconcile` call (a tool with
    /// [`OnCut::Reconcile`](crate::definition::OnCut::Reconcile)).
    Reconcile(Reconciled),
}

impl Submit {
    /// A client tool's result.
    pub fn result(session: impl Into<String>, call: impl Into<String>, result: Value) -> Self {
        Self {
            session_id: session.into(),
            tool_call_id: call.into(),
            answer: SubmitAnswer::Result(result),
            via_root: None,
            owner_session_id: None,
            question: None,
        }
    }

    /// An error instead of a result.
    pub fn error(
        session: impl Into<String>,
        call: impl Into<String>,
        error: impl Into<String>,
    ) -> Self {
        Self {
            session_id: session.into(),
            tool_call_id: call.into(),
            answer: SubmitAnswer::Error(error.into()),
            via_root: None,
            owner_session_id: None,
            question: None,
        }
    }

    /// A decision on an approval gate.
    pub fn approval(
        session: impl Into<String>,
        call: impl Into<String>,
        approval_id: impl Into<String>,
        approved: bool,
        reason: Option<String>,
    ) -> Self {
        Self {
            session_id: session.into(),
            tool_call_id: call.into(),
            answer: SubmitAnswer::Approval {
                approval_id: approval_id.into(),
                approved,
                reason,
                edited_input: None,
                binding: None,
            },
            via_root: None,
            owner_session_id: None,
            question: None,
        }
    }

    /// An answer to a `reconcile` call: whether the effect of the call a crash cut happened.
    /// [`Reconciled::Happened`] records its result (checked against the tool's output
    /// schema), [`Reconciled::DidNotHappen`] runs the tool once more,
    /// [`Reconciled::Failed`] records the error.
    ///
    /// ```
    /// use dormant::definition::Reconciled;
    /// use dormant::Submit;
    /// use serde_json::json;
    ///
    /// let answer = Submit::reconcile("s1", "pay-1", Reconciled::Happened(json!({ "paid": 10 })));
    /// assert_eq!(answer.to_json()["kind"], "reconcile");
    /// assert_eq!(answer.to_json()["happened"], true);
    /// assert_eq!(Submit::from_json(&answer.to_json()), Ok(answer));
    /// ```
    pub fn reconcile(
        session: impl Into<String>,
        call: impl Into<String>,
        reconciled: Reconciled,
    ) -> Self {
        Self {
            session_id: session.into(),
            tool_call_id: call.into(),
            answer: SubmitAnswer::Reconcile(reconciled),
            via_root: None,
            owner_session_id: None,
            question: None,
        }
    }

    /// An approval that approves the call with `input` instead of the call's own (for a
    /// tool whose approval is [`Approval::Editable`](crate::definition::Approval::Editable));
    /// the input is checked against the tool's input schema. No effect on other answers.
    ///
    /// ```
    /// use dormant::Submit;
    /// use serde_json::json;
    /// let submit = Submit::approval("s1", "d1", "RUN::d1", true, None)
    ///     .with_edited_input(json!({ "env": "staging" }));
    /// assert_eq!(submit.to_json()["edited_input"], json!({ "env": "staging" }));
    /// ```
    #[must_use]
    pub fn with_edited_input(mut self, input: Value) -> Self {
        if let SubmitAnswer::Approval { edited_input, .. } = &mut self.answer {
            *edited_input = Some(input);
        }
        self
    }

    /// Binds an approval decision to the request it was made for: the `binding` of its
    /// `tool_approval_request` chunk (or its inbox item). The runtime accepts it only if the
    /// call still waits on that very request, and answers `stale_approval` if its input or
    /// its tool changed since. No effect on other answers.
    #[must_use]
    pub fn bound_to(mut self, binding: impl Into<String>) -> Self {
        if let SubmitAnswer::Approval { binding: bound, .. } = &mut self.answer {
            *bound = Some(binding.into());
        }
        self
    }

    /// Names the question of an `input` call this answers (see [`Submit::question`]).
    ///
    /// ```
    /// use dormant::Submit;
    /// use serde_json::json;
    /// let answer = Submit::result("s1", "book-1", json!({ "seat": "12A" })).for_question(1);
    /// assert_eq!(answer.to_json()["question"], 1);
    /// assert_eq!(Submit::from_json(&answer.to_json()), Ok(answer));
    /// ```
    #[must_use]
    pub fn for_question(mut self, number: u32) -> Self {
        self.question = Some(number);
        self
    }

    /// Names the session that made the call (see [`Submit::owner_session_id`]).
    ///
    /// ```
    /// use dormant::Submit;
    /// use serde_json::json;
    ///
    /// let answer = Submit::result("s1", "tc-1", json!(1)).owned_by("s1-sub-w2");
    /// assert_eq!(answer.to_json()["owner_session_id"], "s1-sub-w2");
    /// assert_eq!(Submit::from_json(&answer.to_json()), Ok(answer));
    /// ```
    #[must_use]
    pub fn owned_by(mut self, session: impl Into<String>) -> Self {
        self.owner_session_id = Some(session.into());
        self
    }

    /// The JSON envelope a client sends (`POST /submit-tool-result`), which
    /// [`Submit::from_json`] reads back as this submit.
    ///
    /// ```
    /// use dormant::Submit;
    /// let answer = Submit::approval("s1", "tc-1", "run-1::tc-1", false, Some("not now".into()));
    /// assert_eq!(Submit::from_json(&answer.to_json()), Ok(answer.clone()));
    /// // A parent's server forwarding it to its remote sub-agent says through which root:
    /// let forwarded = Submit { via_root: Some("root-1".into()), ..answer };
    /// assert_eq!(Submit::from_json(&forwarded.to_json()), Ok(forwarded));
    /// ```
    pub fn to_json(&self) -> Value {
        let mut body = Map::new();
        body.insert("session_id".into(), Value::from(self.session_id.clone()));
        if let Some(root) = &self.via_root {
            body.insert("via_root".into(), Value::from(root.clone()));
        }
        body.insert(
            "tool_call_id".into(),
            Value::from(self.tool_call_id.clone()),
        );
        if let Some(owner) = &self.owner_session_id {
            body.insert("owner_session_id".into(), Value::from(owner.clone()));
        }
        if let Some(question) = self.question {
            body.insert("question".into(), Value::from(question));
        }
        match &self.answer {
            SubmitAnswer::Result(value) => {
                body.insert("result".into(), value.clone());
            }
            SubmitAnswer::Error(text) => {
                body.insert("error".into(), Value::from(text.clone()));
            }
            SubmitAnswer::Approval {
                approval_id,
                approved,
                reason,
                edited_input,
                binding,
            } => {
                if let Some(binding) = binding {
                    body.insert("binding".into(), Value::from(binding.clone()));
                }
                body.insert("kind".into(), Value::from("approval-response"));
                body.insert("approval_id".into(), Value::from(approval_id.clone()));
                body.insert("approved".into(), Value::from(*approved));
                if let Some(reason) = reason {
                    body.insert("reason".into(), Value::from(reason.clone()));
                }
                if let Some(input) = edited_input {
                    body.insert("edited_input".into(), input.clone());
                }
            }
            SubmitAnswer::Reconcile(reconciled) => {
                body.insert("kind".into(), Value::from("reconcile"));
                match reconciled {
                    Reconciled::Happened(value) => {
                        body.insert("happened".into(), Value::Bool(true));
                        body.insert("result".into(), value.clone());
                    }
                    Reconciled::DidNotHappen => {
                        body.insert("happened".into(), Value::Bool(false));
                    }
                    Reconciled::Failed(error) => {
                        body.insert("error".into(), Value::from(error.clone()));
                    }
                }
            }
        }
        Value::Object(body)
    }

    /// Reads the JSON envelope a client sends (snake_case):
    /// `{ "kind": "client-tool-result", "session_id", "tool_call_id", "result" | "error" }` or
    /// `{ "kind": "approval-response", "session_id", "tool_call_id", "approval_id", "approved",
    /// "reason"? }` or `{ "kind": "reconcile", "session_id", "tool_call_id", "happened": true,
    /// "result" }` (the effect happened, with this result), `"happened": false` (it did not:
    /// the tool runs once more), or `"error"` (it failed). `kind` defaults to
    /// `client-tool-result`. Any may carry
    /// `"owner_session_id"`: the session that made the call (see
    /// [`Submit::owner_session_id`]), and `"via_root"` (see [`Submit::via_root`]).
    ///
    /// # Errors
    /// Why the envelope is malformed: an unknown field, a missing or empty id, both or neither
    /// of `result` and `error`, a field of the wrong type.
    pub fn from_json(envelope: &Value) -> Result<Self, String> {
        // Measured before anything is copied out of it: cloning recurses once per level.
        let limit = crate::types::nesting::MAX_JSON_DEPTH_LIMIT + 1;
        if crate::types::nesting::exceeds(envelope, limit) {
            return Err(format!(
                "the envelope nests deeper than {limit} arrays and objects"
            ));
        }
        let fields = envelope
            .as_object()
            .ok_or_else(|| "the envelope must be a JSON object".to_string())?;
        const KNOWN: [&str; 14] = [
            "kind",
            "session_id",
            "via_root",
            "tool_call_id",
            "owner_session_id",
            "result",
            "error",
            "approval_id",
            "approved",
            "reason",
            "edited_input",
            "binding",
            "happened",
            "question",
        ];
        if let Some(unknown) = fields.keys().find(|key| !KNOWN.contains(&key.as_str())) {
            return Err(format!("unknown field {unknown:?}"));
        }
        let session_id = text(fields, "session_id")?.ok_or("session_id is required")?;
        let tool_call_id = text(fields, "tool_call_id")?.ok_or("tool_call_id is required")?;
        let owner_session_id = text(fields, "owner_session_id")?;
        let question = match fields.get("question") {
            None | Some(Value::Null) => None,
            Some(number) => Some(
                number
                    .as_u64()
                    .and_then(|number| u32::try_from(number).ok())
                    .filter(|number| *number > 0)
                    .ok_or("question must be a positive integer (the number of the question)")?,
            ),
        };
        let error = text(fields, "error")?;
        let result = fields.get("result").cloned();
        let answer = match text(fields, "kind")?.as_deref() {
            None | Some("client-tool-result") => {
                if fields.contains_key("happened") {
                    return Err("happened belongs to a reconcile answer".into());
                }
                no_approval_fields(fields)?;
                match (result, error) {
                    (Some(result), None) => SubmitAnswer::Result(result),
                    (None, Some(error)) => SubmitAnswer::Error(error),
                    (Some(_), Some(_)) => return Err("give result or error, not both".into()),
                    (None, None) => return Err("give result or error".into()),
                }
            }
            Some("approval-response") => {
                if fields.contains_key("happened") {
                    return Err("happened belongs to a reconcile answer".into());
                }
                if result.is_some() {
                    return Err("an approval-response carries no result".into());
                }
                let approved = match fields.get("approved") {
                    None => None,
                    Some(Value::Bool(approved)) => Some(*approved),
                    Some(_) => return Err("approved must be true or false".into()),
                };
                match (approved, error) {
                    (None, Some(error)) => SubmitAnswer::Error(error),
                    (Some(_), Some(_)) => {
                        return Err("give approved or error, not both".into());
                    }
                    (None, None) => return Err("an approval-response needs approved".into()),
                    (Some(approved), None) => SubmitAnswer::Approval {
                        approval_id: text(fields, "approval_id")?
                            .ok_or("an approval-response needs approval_id")?,
                        approved,
                        reason: text(fields, "reason")?,
                        edited_input: fields.get("edited_input").cloned(),
                        binding: text(fields, "binding")?,
                    },
                }
            }
            Some("reconcile") => SubmitAnswer::Reconcile(reconciliation(fields, result, error)?),
            Some(other) => return Err(format!("unknown kind {other:?}")),
        };
        Ok(Self {
            session_id,
            tool_call_id,
            answer,
            via_root: text(fields, "via_root")?,
            owner_session_id,
            question,
        })
    }

    /// Checks a submit before it goes anywhere: ids present and well formed, an approval's id
    /// present, the result no deeper and the payload no larger than the runtime allows. Nothing
    /// is read or stored; what fails is answered at once.
    pub(crate) fn check(self, limits: Limits) -> Result<Checked, SubmitOutcome> {
        let invalid = |reason: String| SubmitOutcome::InvalidRequest { reason };
        if let Some(refused) = self.refusal(limits) {
            self.discard();
            return Err(refused);
        }
        let root: SessionId = self
            .session_id
            .parse()
            .map_err(|error| invalid(format!("session_id: {error}")))?;
        let via_root = match &self.via_root {
            Some(text) => Some(
                text.parse::<SessionId>()
                    .map_err(|error| invalid(format!("via_root: {error}")))?,
            ),
            None => None,
        };
        let answered = match self.answer {
            SubmitAnswer::Reconcile(reconciled) => Submission::Reconcile(reconciled),
            SubmitAnswer::Result(value) => Submission::Result(value),
            SubmitAnswer::Error(error) => Submission::Error(error),
            SubmitAnswer::Approval {
                approval_id,
                approved,
                reason,
                edited_input,
                binding,
            } => Submission::Approval {
                approved,
                approval_id,
                reason,
                edited_input,
                binding,
            },
        };
        let submission = match self.question {
            Some(number) => Submission::Question {
                number,
                answer: Box::new(answered),
            },
            None => answered,
        };
        Ok(Checked {
            root,
            tool_call_id: self.tool_call_id,
            submission,
            via_root,
            owner: self.owner_session_id,
        })
    }

    /// Why the submit is refused before anything reads it further: an empty id, a result that
    /// nests too deep, a payload over the size limit. What a node checks before it sends a
    /// submit on to the owner of its tree (which checks it again), so that what it sends is
    /// always an envelope the owner can read.
    pub(crate) fn refusal(&self, limits: Limits) -> Option<SubmitOutcome> {
        let invalid = |reason: String| Some(SubmitOutcome::InvalidRequest { reason });
        if self.tool_call_id.is_empty() || self.session_id.is_empty() {
            return invalid("session_id and tool_call_id may not be empty".into());
        }
        if matches!(&self.answer, SubmitAnswer::Approval { approval_id, .. } if approval_id.is_empty())
        {
            return invalid("approval_id may not be empty".into());
        }
        // Measured before anything serializes, clones or validates it (see `crate::types::nesting`).
        let payload = match &self.answer {
            SubmitAnswer::Result(value) | SubmitAnswer::Reconcile(Reconciled::Happened(value)) => {
                Some(("result", value))
            }
            SubmitAnswer::Approval {
                edited_input: Some(input),
                ..
            } => Some(("edited_input", input)),
            _ => None,
        };
        if let Some((name, value)) = payload {
            if nesting::exceeds(value, limits.max_json_depth) {
                return invalid(format!(
                    "the {name} nests deeper than {} arrays and objects (the runtime's max_json_depth)",
                    limits.max_json_depth
                ));
            }
        }
        if matches!(
            &self.answer,
            SubmitAnswer::Approval {
                approved: false,
                edited_input: Some(_),
                ..
            }
        ) {
            return invalid("edited_input goes with an approval, not a denial".into());
        }
        let size = self.payload_len();
        if size > limits.max_result_bytes {
            return Some(SubmitOutcome::PayloadTooLarge {
                size,
                limit: limits.max_result_bytes,
            });
        }
        None
    }

    /// Drops a refused submit without recursing into its result (which may nest deeper than
    /// the stack allows serde_json's own drop to go).
    pub(crate) fn discard(self) {
        match self.answer {
            SubmitAnswer::Result(value)
            | SubmitAnswer::Approval {
                edited_input: Some(value),
                ..
            } => nesting::dismantle(value),
            _ => {}
        }
    }

    /// Bytes of the answer's payload, as checked against the size limit.
    pub(crate) fn payload_len(&self) -> usize {
        match &self.answer {
            SubmitAnswer::Result(value) => {
                serde_json::to_vec(value).map_or(usize::MAX, |b| b.len())
            }
            SubmitAnswer::Error(error) => error.len(),
            SubmitAnswer::Approval {
                reason,
                edited_input,
                ..
            } => {
                reason.as_ref().map_or(0, String::len)
                    + edited_input.as_ref().map_or(0, |input| {
                        serde_json::to_vec(input).map_or(usize::MAX, |b| b.len())
                    })
            }
            SubmitAnswer::Reconcile(Reconciled::Happened(value)) => {
                serde_json::to_vec(value).map_or(usize::MAX, |b| b.len())
            }
            SubmitAnswer::Reconcile(Reconciled::Failed(error)) => error.len(),
            SubmitAnswer::Reconcile(Reconciled::DidNotHappen) => 0,
        }
    }
}

/// Refuses an envelope that carries an approval-response's fields without being one.
fn no_approval_fields(fields: &Map<String, Value>) -> Result<(), String> {
    const APPROVAL_FIELDS: [&str; 5] = [
        "approval_id",
        "approved",
        "reason",
        "edited_input",
        "binding",
    ];
    match APPROVAL_FIELDS
        .iter()
        .find(|field| fields.contains_key(**field))
    {
        Some(field) => Err(format!("{field} belongs to an approval-response")),
        None => Ok(()),
    }
}

/// The answer of a `reconcile` envelope: `happened` with a `result`, `happened: false`, or an
/// `error` alone.
fn reconciliation(
    fields: &Map<String, Value>,
    result: Option<Value>,
    error: Option<String>,
) -> Result<Reconciled, String> {
    no_approval_fields(fields)?;
    let happened = match fields.get("happened") {
        None => None,
        Some(Value::Bool(happened)) => Some(*happened),
        Some(_) => return Err("happened must be true or false".into()),
    };
    match (happened, result, error) {
        (Some(true), Some(result), None) => Ok(Reconciled::Happened(result)),
        (Some(true), None, None) => {
            Err("a reconcile answer that says it happened needs the result it had".into())
        }
        (Some(false), None, None) => Ok(Reconciled::DidNotHappen),
        (Some(false), Some(_), _) => {
            Err("a reconcile answer that says it did not happen carries no result".into())
        }
        (None, None, Some(error)) => Ok(Reconciled::Failed(error)),
        (Some(_), _, Some(_)) => Err("give happened or error, not both".into()),
        (None, Some(_), _) => {
            Err("a reconcile answer with a result needs \"happened\": true".into())
        }
        (None, None, None) => {
            Err("a reconcile answer needs happened (true or false) or error".into())
        }
    }
}

/// A string field: absent is `None`; present but not a non-empty string is an error.
fn text(fields: &Map<String, Value>, name: &str) -> Result<Option<String>, String> {
    match fields.get(name) {
        None => Ok(None),
        Some(Value::String(value)) if !value.is_empty() => Ok(Some(value.clone())),
        Some(Value::String(_)) => Err(format!("{name} may not be empty")),
        Some(_) => Err(format!("{name} must be a string")),
    }
}

/// What a submit is checked against before it goes anywhere.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) max_json_depth: usize,
    pub(crate) max_result_bytes: usize,
}

/// A submit that passed [`Submit::check`]: the root it names, the call, and the answer as the
/// session core takes it.
#[derive(Debug)]
pub(crate) struct Checked {
    pub(crate) root: SessionId,
    pub(crate) tool_call_id: String,
    pub(crate) submission: Submission,
    /// The root on a remote parent's server this answer was given at.
    pub(crate) via_root: Option<SessionId>,
    /// The session the submitter says made the call.
    pub(crate) owner: Option<String>,
}

/// The answer for a call that is no longer pending: `already_completed` while the tombstone
/// its completion left (at `completed_at`) is within retention, else `unknown_tool_call`
/// (a call that never existed, one an interrupt dropped, or one long forgotten).
pub(crate) fn settled(completed_at: Option<u64>, now: u64, retention_ms: u64) -> SubmitOutcome {
    match completed_at {
        Some(at) if now < at.saturating_add(retention_ms) => SubmitOutcome::AlreadyCompleted,
        _ => SubmitOutcome::UnknownToolCall,
    }
}

/// How the runtime answered a submit.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SubmitOutcome {
    /// Stored durably; the answer will be applied exactly once.
    Accepted,
    /// The call already has an answer, its deadline passed, or it completed within the
    /// tombstone retention period. The submission changed nothing.
    AlreadyCompleted,
    /// No pending call has this id under that session (or the session does not exist). Nothing
    /// was created.
    UnknownToolCall,
    /// The envelope is malformed, or names a sub-agent session instead of the root.
    InvalidRequest {
        /// What was wrong.
        reason: String,
    },
    /// The answer does not fit the call (its output schema, its kind, its approval id).
    InvalidResult {
        /// What was wrong.
        reason: String,
        /// The schema errors, one per line, when the output schema refused it.
        errors: Vec<String>,
    },
    /// The payload is over the limit.
    PayloadTooLarge {
        /// Its size in bytes.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// An approval decision bound to another request of the call ([`Submit::bound_to`]): its
    /// input or its tool changed since the person saw it.
    StaleApproval {
        /// What was wrong.
        reason: String,
    },
}

impl SubmitOutcome {
    /// The stable snake_case code.
    pub fn code(&self) -> &'static str {
        match self {
            SubmitOutcome::Accepted => "accepted",
            SubmitOutcome::AlreadyCompleted => "already_completed",
            SubmitOutcome::UnknownToolCall => "unknown_tool_call",
            SubmitOutcome::InvalidRequest { .. } => "invalid_request",
            SubmitOutcome::InvalidResult { .. } => "invalid_result",
            SubmitOutcome::PayloadTooLarge { .. } => "payload_too_large",
            SubmitOutcome::StaleApproval { .. } => "stale_approval",
        }
    }
}
