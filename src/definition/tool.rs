//! Tool definitions: what a tool is called, what it accepts and returns, and who runs it.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::{Map, Value};

use super::input::{InputAnswer, InputRequest};
use super::reconcile::{CheckFn, OnCut, ReconcileCheck};
use crate::types::ids::{RunId, SessionId};

/// An error a server tool returns; the model reads its text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

impl ToolError {
    /// An error with this text.
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }
}

impl From<&str> for ToolError {
    fn from(text: &str) -> Self {
        Self(text.to_string())
    }
}

impl From<String> for ToolError {
    fn from(text: String) -> Self {
        Self(text)
    }
}

/// What a server tool's handler can see and change besides its input.
#[derive(Clone, Debug)]
pub struct ToolContext {
    session_id: SessionId,
    run_id: RunId,
    tool_call_id: String,
    idempotency_key: String,
    state: Arc<Value>,
    updates: Arc<Mutex<Map<String, Value>>>,
    answers: Arc<[InputAnswer]>,
    asked: Arc<Mutex<Option<InputRequest>>>,
}

impl ToolContext {
    pub(crate) fn new(
        session_id: SessionId,
        run_id: RunId,
        tool_call_id: String,
        idempotency_key: String,
        state: Arc<Value>,
        answers: Arc<[InputAnswer]>,
    ) -> Self {
        Self {
            session_id,
            run_id,
            tool_call_id,
            idempotency_key,
            state,
            updates: Arc::default(),
            answers,
            asked: Arc::default(),
        }
    }

    /// The session that called the tool.
    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }

    /// The run in progress.
    pub fn run_id(&self) -> RunId {
        self.run_id
    }

    /// This call's id.
    pub fn tool_call_id(&self) -> &str {
        &self.tool_call_id
    }

    /// This call's idempotency key: 32 hex digits, the same every time this call runs (again
    /// after a crash, once more after a reconciliation said its effect did not happen, on
    /// any node) and different for any other call. Hand it to the system the tool acts on
    /// (as an `Idempotency-Key` header, a unique column) so an effect is applied once, and
    /// look the effect up by it in a [`ReconcileCheck`](crate::definition::ReconcileCheck).
    pub fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }

    /// The session's custom state as the step began (a JSON object).
    pub fn state(&self) -> &Value {
        &self.state
    }

    /// Sets `key` of the session's custom state; committed with the tool's result.
    pub fn set_state(&self, key: impl Into<String>, value: Value) {
        self.updates.lock().insert(key.into(), value);
    }

    pub(crate) fn take_updates(&self) -> Map<String, Value> {
        std::mem::take(&mut *self.updates.lock())
    }

    /// The answers a person gave to this call's questions ([`ToolContext::ask`]), in the
    /// order they were asked; empty on the call's first run.
    pub fn answers(&self) -> &[InputAnswer] {
        &self.answers
    }

    /// Asks a person for input: return the error this makes from the handler
    /// (`return Err(ctx.ask(..))`). The run suspends on an `input` call of the session (in the
    /// inbox, answered through the submit contract from the root of the tree: a result is the
    /// answer, an error a refusal; with the agent's client-tool deadline, after which the call's
    /// result is `client_tool_timeout`). Once answered, the handler runs again from its start,
    /// with the same input and idempotency key and the answer last in
    /// [`ToolContext::answers`]. State set before asking is not kept. See
    /// [`crate::definition::input`].
    ///
    /// ```
    /// use dormant::definition::{InputAnswer, InputRequest};
    /// use dormant::{ToolDefinition, ToolError};
    /// use serde_json::json;
    ///
    /// let transfer = ToolDefinition::server("transfer", |input, ctx| async move {
    ///     let Some(InputAnswer::Accepted { content }) = ctx.answers().first() else {
    ///         if let Some(InputAnswer::Declined { .. }) = ctx.answers().first() {
    ///             return Err(ToolError::new("the person declined"));
    ///         }
    ///         let question = InputRequest::new("Which account should the money come from?")
    ///             .schema(json!({"type": "object", "required": ["account"]}));
    ///         return Err(ctx.ask(question));
    ///     };
    ///     Ok(json!({ "from": content["account"], "amount": input["amount"] }))
    /// });
    /// # let _ = transfer;
    /// ```
    pub fn ask(&self, request: InputRequest) -> ToolError {
        let message = format!("waiting for input: {}", request.message);
        *self.asked.lock() = Some(request);
        ToolError(message)
    }

    /// The question the handler asked, if it asked one.
    pub(crate) fn take_asked(&self) -> Option<InputRequest> {
        self.asked.lock().take()
    }
}

/// Runs a server tool. Every `Fn(Value, ToolContext) -> impl Future` closure implements it; a
/// type of your own returns a [`BoxFuture`](crate::llm::BoxFuture), which this crate re-exports.
pub trait ToolHandler: Send + Sync + 'static {
    /// Runs the tool on `input`.
    fn call(&self, input: Value, ctx: ToolContext) -> BoxFuture<'static, Result<Value, ToolError>>;

    /// The question the call with this idempotency key asked ([`ToolContext::ask`]) is
    /// closed: its answer was used, or it never will be (its deadline passed, or the run
    /// stopped: a new message, an interrupt, an abort, another call that finished the run). A
    /// handler that holds something open for the answer (an MCP call's request) lets it go.
    /// Told once the closing is durable, by the process that closed it (after a restart
    /// nothing is held); a question the tool asks again is not closed. It may be told more than
    /// once, and for a call that was cut while it ran whether or not it asked: make it
    /// idempotent. It runs on the session's actor: do not block in it. Nothing by default.
    fn question_closed(&self, idempotency_key: &str) {
        let _ = idempotency_key;
    }
}

impl<F, Fut> ToolHandler for F
where
    F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
{
    fn call(&self, input: Value, ctx: ToolContext) -> BoxFuture<'static, Result<Value, ToolError>> {
        Box::pin(self(input, ctx))
    }
}

/// Decides from a call's input whether it needs approval; `Err` means it does.
pub type ApprovalPredicate = Arc<dyn Fn(&Value) -> Result<bool, String> + Send + Sync>;

/// Whether a call must be approved by a person before it runs.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum Approval {
    /// Never (the default).
    #[default]
    Never,
    /// Always.
    Always,
    /// Always, and the person may edit the call's input when approving: the decision may
    /// carry edited input (`Submit::with_edited_input`), checked against the tool's input
    /// schema, and the tool runs with it. The original stays recorded beside it.
    Editable,
    /// When the predicate says so; a predicate that errs or panics means approval is required.
    When(ApprovalPredicate),
}

impl fmt::Debug for Approval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Approval::Never => f.write_str("Never"),
            Approval::Always => f.write_str("Always"),
            Approval::Editable => f.write_str("Editable"),
            Approval::When(_) => f.write_str("When(<predicate>)"),
        }
    }
}

/// Who runs a tool.
#[derive(Clone)]
#[non_exhaustive]
pub enum ToolKind {
    /// The runtime, with this handler.
    Server(Arc<dyn ToolHandler>),
    /// A client outside the runtime (a browser); the run suspends until it answers.
    Client {
        /// How long the client has to answer, in milliseconds (falls back to the agent's).
        timeout_ms: Option<u64>,
    },
    /// A sub-agent session of the named agent.
    SubAgent {
        /// The agent the child runs.
        agent: String,
    },
    /// A sub-agent session of `agent` on another dormant server (see [`crate::remote`]).
    RemoteSubAgent {
        /// The base URL of the server that hosts it.
        endpoint: String,
        /// The agent the child runs there.
        agent: String,
    },
}

impl fmt::Debug for ToolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolKind::Server(_) => f.write_str("Server(<handler>)"),
            ToolKind::Client { timeout_ms } => f
                .debug_struct("Client")
                .field("timeout_ms", timeout_ms)
                .finish(),
            ToolKind::SubAgent { agent } => {
                f.debug_struct("SubAgent").field("agent", agent).finish()
            }
            ToolKind::RemoteSubAgent { endpoint, agent } => f
                .debug_struct("RemoteSubAgent")
                .field("endpoint", endpoint)
                .field("agent", agent)
                .finish(),
        }
    }
}

/// The input schema a sub-agent tool ([`ToolDefinition::sub_agent`],
/// [`ToolDefinition::remote_sub_agent`]) advertises to the model: an object with a required
/// `message` string, the child's first message. Other fields are allowed (and ignored).
///
/// ```
/// use serde_json::json;
/// let schema = dormant::definition::sub_agent_input_schema();
/// assert_eq!(schema["required"], json!(["message"]));
/// ```
pub fn sub_agent_input_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "required": ["message"],
        "properties": {
            "message": {
                "type": "string",
                "description": "The task for the sub-agent: its first message."
            }
        }
    })
}

/// A tool an agent may call. Checked when the agent is built
/// ([`AgentDefinition::builder`](crate::AgentDefinition::builder)).
///
/// ```
/// use dormant::{ToolDefinition, ToolError};
/// use serde_json::json;
///
/// let lookup = ToolDefinition::server("lookup", |input, _ctx| async move {
///     Ok::<_, ToolError>(json!({ "found": input["key"] }))
/// })
/// .description("Looks a key up")
/// .safe_to_retry(true);
/// assert_eq!(lookup.name(), "lookup");
/// ```
#[derive(Clone, Debug)]
pub struct ToolDefinition {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) input_schema: Option<Value>,
    pub(crate) output_schema: Option<Value>,
    pub(crate) kind: ToolKind,
    pub(crate) approval: Approval,
    pub(crate) safe_to_retry: bool,
    pub(crate) finish_with: bool,
    pub(crate) on_cut: OnCut,
    pub(crate) check: Option<CheckFn>,
}

impl ToolDefinition {
    fn with_kind(name: impl Into<String>, kind: ToolKind) -> Self {
        Self {
            name: name.into(),
            description: String::new(),
            input_schema: None,
            output_schema: None,
            kind,
            approval: Approval::Never,
            safe_to_retry: false,
            finish_with: false,
            on_cut: OnCut::DurabilityError,
            check: None,
        }
    }

    /// A tool the runtime runs with the async closure `handler`.
    pub fn server<F, Fut>(name: impl Into<String>, handler: F) -> Self
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        Self::server_handler(name, handler)
    }

    /// A tool the runtime runs with `handler` (any [`ToolHandler`], such as a struct that
    /// holds a connection pool).
    pub fn server_handler(name: impl Into<String>, handler: impl ToolHandler) -> Self {
        Self::with_kind(name, ToolKind::Server(Arc::new(handler)))
    }

    /// A tool a client runs; the run suspends until its result is submitted.
    pub fn client(name: impl Into<String>) -> Self {
        Self::with_kind(name, ToolKind::Client { timeout_ms: None })
    }

    /// A tool that delegates to a sub-agent session of `agent`.
    ///
    /// The model calls it with `{"message": string}`: the message is the child's first user
    /// message, and the child's final text (or finish value) is the call's result. That is
    /// the input schema advertised to the model ([`sub_agent_input_schema`]); other fields are
    /// allowed and ignored. A call without a `message` string is the tool error
    /// `invalid_input`. [`ToolDefinition::input_schema`] replaces the advertised schema (the
    /// child still needs its `message`).
    ///
    /// ```
    /// use dormant::{AgentDefinition, ToolDefinition};
    /// use serde_json::json;
    ///
    /// let lead = AgentDefinition::builder("lead")
    ///     .tool(ToolDefinition::sub_agent("research", "researcher"))
    ///     .build()?;
    /// let schema = &lead.tool_specs()[0].input_schema;
    /// assert_eq!(schema["required"], json!(["message"]));
    /// assert_eq!(schema["properties"]["message"]["type"], "string");
    /// # Ok::<(), dormant::definition::DefinitionError>(())
    /// ```
    pub fn sub_agent(name: impl Into<String>, agent: impl Into<String>) -> Self {
        Self::with_kind(
            name,
            ToolKind::SubAgent {
                agent: agent.into(),
            },
        )
        .input_schema(sub_agent_input_schema())
    }

    /// A tool that delegates to a sub-agent session of `agent` on the dormant server at
    /// `endpoint` (its base URL). The child's client tools and approvals are answered at this
    /// side's root, as a local child's are; the runtime reaches the server through its
    /// [`RemoteAgents`](crate::remote::RemoteAgents) transport
    /// ([`RuntimeBuilder::remote_agents`](crate::RuntimeBuilder::remote_agents)). Its input
    /// is that of [`ToolDefinition::sub_agent`]: `{"message": string}`, the child's first
    /// message ([`sub_agent_input_schema`] is advertised to the model).
    ///
    /// ```
    /// use dormant::ToolDefinition;
    ///
    /// let research = ToolDefinition::remote_sub_agent("research", "http://10.0.0.7:8080", "researcher")
    ///     .description("Delegates a question to the research agent");
    /// assert_eq!(research.name(), "research");
    /// ```
    pub fn remote_sub_agent(
        name: impl Into<String>,
        endpoint: impl Into<String>,
        agent: impl Into<String>,
    ) -> Self {
        Self::with_kind(
            name,
            ToolKind::RemoteSubAgent {
                endpoint: endpoint.into().trim_end_matches('/').to_string(),
                agent: agent.into(),
            },
        )
        .input_schema(sub_agent_input_schema())
    }

    /// A tool that delegates to any agent that speaks **A2A 1.0** (Agent2Agent) over its
    /// JSON-RPC binding, whose agent card is at `{url}/.well-known/agent-card.json`: a remote
    /// sub-agent whose child is an A2A task. The call is recorded as
    /// `a2a+{url}` (the endpoint of [`ToolDefinition::remote_sub_agent`] with the protocol
    /// named), so the runtime's [`RemoteAgents`](crate::remote::RemoteAgents) transport
    /// (`dormant_server::HttpRemoteAgents`) speaks A2A to it. The child's first message opens
    /// the A2A context named by the child's session id (`{parent}-sub-{call}`, in the commit
    /// that dispatches the call), so a replay after a crash finds the task it started rather
    /// than starting a second; a task in `INPUT_REQUIRED` or `AUTH_REQUIRED` is a call
    /// answered at this side's root, sent back as the follow-up message. See
    /// `docs/protocols.md` ("A2A client").
    ///
    /// ```
    /// use dormant::ToolDefinition;
    ///
    /// let billing = ToolDefinition::a2a_agent("billing", "http://10.0.0.9:9999")
    ///     .description("Asks the billing agent");
    /// assert_eq!(billing.name(), "billing");
    /// ```
    pub fn a2a_agent(name: impl Into<String>, url: impl AsRef<str>) -> Self {
        Self::remote_sub_agent(
            name,
            format!("{}{}", crate::types::remote::A2A_SCHEME, url.as_ref()),
            "a2a",
        )
    }

    /// Sets the description shown to the model.
    #[must_use]
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.description = text.into();
        self
    }

    /// Sets the JSON Schema the input must satisfy.
    #[must_use]
    pub fn input_schema(mut self, schema: Value) -> Self {
        self.input_schema = Some(schema);
        self
    }

    /// Sets the JSON Schema a result must satisfy (checked for client results).
    #[must_use]
    pub fn output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(schema);
        self
    }

    /// Sets a client tool's timeout in milliseconds (0: expired at once). No effect on other
    /// kinds.
    #[must_use]
    pub fn timeout_ms(mut self, timeout_ms: u64) -> Self {
        if let ToolKind::Client { timeout_ms: slot } = &mut self.kind {
            *slot = Some(timeout_ms);
        }
        self
    }

    /// Requires approval before the tool runs.
    #[must_use]
    pub fn require_approval(mut self, approval: Approval) -> Self {
        self.approval = approval;
        self
    }

    /// Declares that running the tool twice is harmless, so a call cut by a crash is re-run.
    #[must_use]
    pub fn safe_to_retry(mut self, safe: bool) -> Self {
        self.safe_to_retry = safe;
        self
    }

    /// What becomes of a call a crash cut while it ran (see [`OnCut`]). With
    /// [`OnCut::Reconcile`] the run waits on a `reconcile` call a person answers (it is in the
    /// inbox), instead of giving the model a `tool_durability_error`. No effect on a
    /// `safe_to_retry` tool, which is simply run again.
    ///
    /// ```
    /// use dormant::definition::OnCut;
    /// use dormant::{ToolDefinition, ToolError};
    /// use serde_json::json;
    ///
    /// let pay = ToolDefinition::server("pay", |input, ctx| async move {
    ///     // The payment provider applies one payment per key.
    ///     let key = ctx.idempotency_key().to_string();
    ///     Ok::<_, ToolError>(json!({ "paid": input["amount"], "key": key }))
    /// })
    /// .on_cut(OnCut::Reconcile);
    /// assert_eq!(pay.cut_policy(), OnCut::Reconcile);
    /// ```
    #[must_use]
    pub fn on_cut(mut self, on_cut: OnCut) -> Self {
        self.on_cut = on_cut;
        self
    }

    /// Settles a cut call by itself before asking a person ([`OnCut::Reconcile`] is implied):
    /// `check` is given the call's input and idempotency key and looks the effect up in the
    /// system the tool acts on. `Some(Happened(result))` records that result, `Some(Failed)`
    /// the error, `Some(DidNotHappen)` runs the tool once more; `None` (it cannot tell, or the
    /// check panicked) raises the `reconcile` call for a person.
    ///
    /// ```
    /// use dormant::definition::Reconciled;
    /// use dormant::{ToolDefinition, ToolError};
    /// use serde_json::json;
    ///
    /// let pay = ToolDefinition::server("pay", |_input, _ctx| async move {
    ///     Ok::<_, ToolError>(json!({ "paid": true }))
    /// })
    /// .reconcile_with(|_input, key: String| async move {
    ///     // Ask the payment provider about `key`; here, it has never heard of it.
    ///     let _ = key;
    ///     Some(Reconciled::DidNotHappen)
    /// });
    /// assert!(pay.has_reconcile_check());
    /// ```
    #[must_use]
    pub fn reconcile_with(mut self, check: impl ReconcileCheck) -> Self {
        self.on_cut = OnCut::Reconcile;
        self.check = Some(CheckFn(Arc::new(check)));
        self
    }

    /// Makes the tool's successful result the run's final output.
    #[must_use]
    pub fn finish_with(mut self, finish: bool) -> Self {
        self.finish_with = finish;
        self
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Who runs the tool.
    pub fn kind(&self) -> &ToolKind {
        &self.kind
    }

    /// Whether a crash-cut call may be re-run.
    pub fn is_safe_to_retry(&self) -> bool {
        self.safe_to_retry
    }

    /// Whether the tool's result finishes the run.
    pub fn is_finish_with(&self) -> bool {
        self.finish_with
    }

    /// Whether the tool requires approval.
    pub fn approval(&self) -> &Approval {
        &self.approval
    }

    /// What becomes of a call a crash cut while it ran ([`ToolDefinition::on_cut`]).
    pub fn cut_policy(&self) -> OnCut {
        self.on_cut
    }

    /// Whether the tool settles cut calls by itself ([`ToolDefinition::reconcile_with`]).
    pub fn has_reconcile_check(&self) -> bool {
        self.check.is_some()
    }
}
