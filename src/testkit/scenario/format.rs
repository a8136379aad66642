//! The serde shape of a scenario file (`docs/scenario-format.md`). Every struct refuses
//! unknown fields; a step is read in two passes (its `op` first, then the op's own struct, see
//! `parse.rs`) so that errors inside a step still carry their JSON path.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::session::Status;

/// A whole file. `steps` stay raw here: each is read by the struct of its op.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileSpec {
    #[serde(default)]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) config: ConfigSpec,
    #[serde(default)]
    pub(crate) agents: Vec<AgentSpec>,
    pub(crate) steps: Vec<Value>,
}

/// `config`: every key optional, `null` meaning the runtime's default.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConfigSpec {
    #[serde(default)]
    pub(crate) client_tool_timeout_ms: Option<u64>,
    #[serde(default)]
    pub(crate) tombstone_retention_ms: Option<u64>,
    #[serde(default)]
    pub(crate) max_result_bytes: Option<u64>,
    #[serde(default)]
    pub(crate) auto_resume: Option<bool>,
    #[serde(default)]
    pub(crate) idle_after_ms: Option<u64>,
    #[serde(default)]
    pub(crate) max_resident: Option<usize>,
}

/// An agent with its tools and the script of its model.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentSpec {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) max_steps: Option<u32>,
    #[serde(default)]
    pub(crate) client_tool_timeout_ms: Option<u64>,
    #[serde(default)]
    pub(crate) output_schema: Option<Value>,
    #[serde(default)]
    pub(crate) tools: Vec<ToolSpec>,
    #[serde(default)]
    pub(crate) script: Vec<ScriptEntry>,
    /// Agents it may run as persistent sub-agents (an addition to the format, documented in
    /// `docs/scenario-format.md`): it gains the `companion__*` tools.
    #[serde(default)]
    pub(crate) persistent_agents: Vec<PersistentSpec>,
    /// In-code skills (an addition to the format): the agent gains the catalog in its
    /// prompt and the `load_skill` and `read_skill_file` tools.
    #[serde(default)]
    pub(crate) skills: Vec<SkillSpec>,
    /// Skills whose bodies go into the system prompt (an addition to the format).
    #[serde(default)]
    pub(crate) preload_skills: Vec<String>,
    /// Lives on another runtime, served over HTTP (an addition to the format): `true` for
    /// the one remote runtime, or a name, one runtime per name. A `sub_agent` tool naming it
    /// from another runtime is a remote sub-agent.
    #[serde(default, deserialize_with = "remote_side")]
    pub(crate) remote: Option<String>,
    /// How many of a session's newest checkpoints are kept (an addition: `keep_checkpoints`).
    #[serde(default)]
    pub(crate) keep_checkpoints: Option<usize>,
}

/// The runtime `"remote": true` stands for.
pub(crate) const DEFAULT_REMOTE: &str = "remote";

/// `"remote"`: `false` (here), `true` (the default remote runtime) or a runtime's name.
fn remote_side<'de, D>(deserializer: D) -> Result<Option<String>, D::Error>
where
    D: Deserializer<'de>,
{
    match Value::deserialize(deserializer)? {
        Value::Bool(false) | Value::Null => Ok(None),
        Value::Bool(true) => Ok(Some(DEFAULT_REMOTE.to_string())),
        Value::String(name) if !name.is_empty() => Ok(Some(name)),
        other => Err(serde::de::Error::custom(format!(
            "remote must be true, false or a runtime's name, not {other}"
        ))),
    }
}

/// An in-code skill.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SkillSpec {
    pub(crate) name: String,
    pub(crate) description: String,
    #[serde(default)]
    pub(crate) body: String,
    /// Path inside the skill (`references/…`, `scripts/…`, `assets/…`) → text.
    #[serde(default)]
    pub(crate) resources: BTreeMap<String, String>,
}

/// A persistent sub-agent of an agent.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PersistentSpec {
    pub(crate) agent: String,
    #[serde(default = "blocking")]
    pub(crate) mode: crate::definition::CompanionMode,
}

fn blocking() -> crate::definition::CompanionMode {
    crate::definition::CompanionMode::Blocking
}

/// Who runs a tool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ToolKindSpec {
    /// The runner's fixed handler.
    #[default]
    Server,
    /// A client outside the runtime.
    Client,
    /// A sub-agent session.
    SubAgent,
}

/// A tool. Which fields apply depends on `kind`; `parse.rs` checks that.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolSpec {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) kind: ToolKindSpec,
    #[serde(default, deserialize_with = "present")]
    pub(crate) result: Option<Value>,
    #[serde(default)]
    pub(crate) error: Option<String>,
    #[serde(default)]
    pub(crate) timeout_ms: Option<u64>,
    #[serde(default)]
    pub(crate) output_schema: Option<Value>,
    #[serde(default)]
    pub(crate) agent: Option<String>,
    #[serde(default)]
    pub(crate) require_approval: bool,
    /// With `require_approval`: the person may edit the input when approving (an addition:
    /// `Approval::Editable`).
    #[serde(default)]
    pub(crate) editable: bool,
    #[serde(default)]
    pub(crate) safe_to_retry: bool,
    #[serde(default)]
    pub(crate) finish_with: bool,
    /// A server tool: what a call a crash cut becomes (an addition: `reconcile` raises a
    /// reconcile call, see `OnCut`).
    #[serde(default)]
    pub(crate) on_cut: Option<OnCutSpec>,
    /// With `on_cut: reconcile`: what the tool's check says (an addition); without it, a
    /// person answers.
    #[serde(default)]
    pub(crate) check: Option<CheckSpec>,
}

/// `on_cut` of a server tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OnCutSpec {
    DurabilityError,
    Reconcile,
}

/// The scripted answer of a tool's reconcile check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CheckSpec {
    /// The effect happened: the call's result is the tool's `result`.
    Happened,
    /// It did not: the tool runs once more.
    DidNotHappen,
    /// It failed: the call's result is the error `failed (by its check)`.
    Failed,
    /// It cannot tell: a person is asked.
    Unknown,
}

/// One model reply: text, tool calls, a finish value, or a mix.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScriptEntry {
    #[serde(default)]
    pub(crate) text: Option<String>,
    #[serde(default)]
    pub(crate) tool_calls: Option<Vec<ToolCallSpec>>,
    #[serde(default, deserialize_with = "present")]
    pub(crate) finish: Option<Value>,
    /// The tokens the reply reports (an addition to the format).
    #[serde(default)]
    pub(crate) usage: Option<crate::types::usage::Usage>,
}

/// A tool call in a script entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolCallSpec {
    pub(crate) id: String,
    pub(crate) name: String,
    #[serde(default = "empty_object")]
    pub(crate) input: Value,
}

/// `define`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DefineStep {
    pub(crate) agent: AgentSpec,
    #[serde(default)]
    pub(crate) expect: Expect,
}

/// `execute`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecuteStep {
    pub(crate) agent: String,
    pub(crate) session: String,
    pub(crate) message: String,
    #[serde(default)]
    pub(crate) expect: Expect,
}

/// The `kind` of a submit envelope.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum SubmitKind {
    /// A client tool's result or error (the default).
    ClientToolResult,
    /// A person's answer to an approval request.
    ApprovalResponse,
    /// Whether a cut call's effect happened (an addition).
    Reconcile,
}

impl SubmitKind {
    /// The name as written, the same as the envelope's `kind`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SubmitKind::ClientToolResult => "client-tool-result",
            SubmitKind::ApprovalResponse => "approval-response",
            SubmitKind::Reconcile => "reconcile",
        }
    }
}

/// `submit`: the fields of the envelope it builds, or `raw`, the envelope itself (then
/// `session` only names the session the expectations look at).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubmitStep {
    #[serde(default)]
    pub(crate) session: Option<String>,
    #[serde(default)]
    pub(crate) tool_call: Option<String>,
    #[serde(default, deserialize_with = "present")]
    pub(crate) result: Option<Value>,
    #[serde(default)]
    pub(crate) error: Option<String>,
    #[serde(default)]
    pub(crate) kind: Option<SubmitKind>,
    #[serde(default)]
    pub(crate) approved: Option<bool>,
    #[serde(default)]
    pub(crate) reason: Option<String>,
    #[serde(default)]
    pub(crate) approval_id: Option<String>,
    /// An approval's edited input (an addition).
    #[serde(default)]
    pub(crate) edited_input: Option<Value>,
    /// The binding an approval names (an addition: a wrong one is `stale_approval`).
    #[serde(default)]
    pub(crate) binding: Option<String>,
    /// A reconcile answer: whether the effect happened (an addition).
    #[serde(default)]
    pub(crate) happened: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    pub(crate) raw: Option<Value>,
    #[serde(default)]
    pub(crate) expect: Expect,
}

/// `resume`, `interrupt`, `abort`, `evict` and `check`: a session and expectations.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionStep {
    pub(crate) session: String,
    #[serde(default)]
    pub(crate) expect: Expect,
}

/// Which checkpoint of a session a `state_at` or `fork` step means: its id, `"last"`, or the
/// last one that matches every field given (`status`: the session's status there;
/// `open_call`: a call without a result there).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum CheckpointSpec {
    Id(u64),
    Last(LastSpec),
    Matching(CheckpointMatch),
}

/// `"last"`.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LastSpec {
    Last,
}

/// The fields a checkpoint must match.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckpointMatch {
    #[serde(default)]
    pub(crate) status: Option<Status>,
    #[serde(default)]
    pub(crate) open_call: Option<String>,
    /// The first that matches, not the last.
    #[serde(default)]
    pub(crate) first: bool,
}

/// `checkpoints` and `state_at` (with `checkpoint`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckpointStep {
    pub(crate) session: String,
    #[serde(default)]
    pub(crate) checkpoint: Option<CheckpointSpec>,
    #[serde(default)]
    pub(crate) expect: Expect,
}

/// `fork`: the source `session` at `checkpoint`, into the new session `fork`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkStep {
    pub(crate) session: String,
    pub(crate) checkpoint: CheckpointSpec,
    pub(crate) fork: String,
    #[serde(default)]
    pub(crate) message: Option<String>,
    #[serde(default)]
    pub(crate) edit_message: Option<String>,
    /// Call id → the answer the fork starts with.
    #[serde(default)]
    pub(crate) answers: BTreeMap<String, ForkAnswerSpec>,
    #[serde(default)]
    pub(crate) expect: Expect,
}

/// One answer of a `fork` step: exactly one of `result`, `error`, `approved` (with `reason`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkAnswerSpec {
    #[serde(default)]
    pub(crate) result: Option<Value>,
    #[serde(default)]
    pub(crate) error: Option<String>,
    #[serde(default)]
    pub(crate) approved: Option<bool>,
    #[serde(default)]
    pub(crate) reason: Option<String>,
}

/// What a `state_at` step expects of the session at the checkpoint.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StateSpec {
    #[serde(default)]
    pub(crate) status: Option<Status>,
    #[serde(default)]
    pub(crate) messages: Option<usize>,
    #[serde(default)]
    pub(crate) open_calls: Option<Vec<String>>,
}

/// `advance_clock`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClockStep {
    pub(crate) ms: u64,
    #[serde(default)]
    pub(crate) expect: Expect,
}

/// `restart`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RestartStep {
    #[serde(default)]
    pub(crate) expect: Expect,
}

/// The commit a `crash_before` fault cuts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CommitSpec {
    /// Commit #1: the model's tool calls.
    ToolCalls,
    /// Commit #2: the tools' results.
    ToolResults,
}

/// `crash_before`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CrashStep {
    pub(crate) commit: CommitSpec,
    #[serde(default)]
    pub(crate) expect: Expect,
}

/// What a step expects; every key optional, each one given must match.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Expect {
    #[serde(default)]
    pub(crate) status: Option<Status>,
    #[serde(default)]
    pub(crate) pending: Option<Vec<String>>,
    /// `Some(None)` is an explicit `null`: the run has no text.
    #[serde(default, deserialize_with = "present")]
    pub(crate) text: Option<Option<String>>,
    /// `Some(Value::Null)` is an explicit `null`: the run has no output.
    #[serde(default, deserialize_with = "present")]
    pub(crate) output: Option<Value>,
    #[serde(default)]
    pub(crate) error: Option<String>,
    #[serde(default)]
    pub(crate) submit: Option<SubmitOutcomeSpec>,
    #[serde(default)]
    pub(crate) tool_results: Option<BTreeMap<String, ToolResultSpec>>,
    #[serde(default)]
    pub(crate) invocations: Option<BTreeMap<String, u64>>,
    #[serde(default)]
    pub(crate) runs: Option<usize>,
    #[serde(default)]
    pub(crate) events: Option<Vec<EventName>>,
    #[serde(default)]
    pub(crate) hooks: Option<Vec<HookName>>,
    /// Companion name → status (`running`, `suspended`, `completed`, `failed`,
    /// `interrupted`, `terminated`), as the session knows its persistent sub-agents (an
    /// addition to the format).
    #[serde(default)]
    pub(crate) companions: Option<BTreeMap<String, String>>,
    /// The last run's usage: each key given must match (an addition to the format).
    #[serde(default)]
    pub(crate) usage: Option<UsageSpec>,
    /// Texts that must appear, in this order, in the system prompt of the session's last
    /// model call (an addition to the format).
    #[serde(default)]
    pub(crate) prompt_contains: Option<Vec<String>>,
    /// Texts that must not appear in that prompt (an addition to the format).
    #[serde(default)]
    pub(crate) prompt_excludes: Option<Vec<String>>,
    /// How many checkpoints the session has (a `checkpoints` step; an addition).
    #[serde(default)]
    pub(crate) checkpoints: Option<usize>,
    /// The session at the checkpoint (a `state_at` step; an addition).
    #[serde(default)]
    pub(crate) state: Option<StateSpec>,
}

/// What a run used, as a step may expect it; a key left out is not checked.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UsageSpec {
    #[serde(default)]
    pub(crate) input_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) output_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) cached_input_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) model_calls: Option<u32>,
    #[serde(default)]
    pub(crate) tool_calls: Option<u32>,
    #[serde(default)]
    pub(crate) tool_errors: Option<u32>,
    /// Tool call ids whose usage entry says `success: false`, exactly.
    #[serde(default)]
    pub(crate) failed_tools: Option<Vec<String>>,
}

/// The outcome of a submit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SubmitOutcomeSpec {
    Accepted,
    AlreadyCompleted,
    UnknownToolCall,
    InvalidRequest,
    InvalidResult,
    PayloadTooLarge,
    StaleApproval,
}

impl SubmitOutcomeSpec {
    /// The name as written, the same as [`SubmitOutcome::code`](crate::session::submit::SubmitOutcome::code).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SubmitOutcomeSpec::Accepted => "accepted",
            SubmitOutcomeSpec::AlreadyCompleted => "already_completed",
            SubmitOutcomeSpec::UnknownToolCall => "unknown_tool_call",
            SubmitOutcomeSpec::InvalidRequest => "invalid_request",
            SubmitOutcomeSpec::InvalidResult => "invalid_result",
            SubmitOutcomeSpec::PayloadTooLarge => "payload_too_large",
            SubmitOutcomeSpec::StaleApproval => "stale_approval",
        }
    }
}

/// `{ "result": VALUE }` or `{ "error": "substring" }`; `parse.rs` checks that exactly one is
/// given.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolResultSpec {
    #[serde(default, deserialize_with = "present")]
    pub(crate) result: Option<Value>,
    #[serde(default)]
    pub(crate) error: Option<String>,
}

/// A stream chunk type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EventName {
    RunStart,
    Text,
    ToolStart,
    ToolEnd,
    ToolApprovalRequest,
    ToolApprovalResponse,
    SkillLoaded,
    SubagentStart,
    SubagentEnd,
    RunSuspended,
    RunInterrupted,
    RunEnd,
}

impl EventName {
    /// The name as written, the same as [`ChunkKind::type_name`](crate::types::ChunkKind::type_name).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            EventName::RunStart => "run_start",
            EventName::Text => "text",
            EventName::ToolStart => "tool_start",
            EventName::ToolEnd => "tool_end",
            EventName::ToolApprovalRequest => "tool_approval_request",
            EventName::ToolApprovalResponse => "tool_approval_response",
            EventName::SkillLoaded => "skill_loaded",
            EventName::SubagentStart => "subagent_start",
            EventName::SubagentEnd => "subagent_end",
            EventName::RunSuspended => "run_suspended",
            EventName::RunInterrupted => "run_interrupted",
            EventName::RunEnd => "run_end",
        }
    }
}

/// A hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum HookName {
    BeforeTool,
    OnStateChange,
    OnMessage,
    AfterTool,
    OnAgentSuspended,
    OnAgentResumed,
}

impl HookName {
    /// The name as written, the same as [`HookEvent::name`](crate::types::HookEvent::name).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            HookName::BeforeTool => "before_tool",
            HookName::OnStateChange => "on_state_change",
            HookName::OnMessage => "on_message",
            HookName::AfterTool => "after_tool",
            HookName::OnAgentSuspended => "on_agent_suspended",
            HookName::OnAgentResumed => "on_agent_resumed",
        }
    }
}

/// Reads a field that is present, even as `null`, as `Some`: with `#[serde(default)]`, an
/// absent field stays `None`, so `"result": null` and no `result` differ.
fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}
