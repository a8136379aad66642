//! Turning a file's agents into runtime definitions: fixed server handlers that count their
//! invocations, and the scripted model's replies.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;

use super::format::{AgentSpec, CheckSpec, OnCutSpec, ScriptEntry, ToolKindSpec, ToolSpec};
use crate::definition::{
    AgentDefinition, Approval, DefinitionError, OnCut, Reconciled, ToolDefinition, ToolError,
    FINISH_TOOL,
};
use crate::llm::ModelReply;
use crate::skills::{InCodeSkills, SkillDefinition};
use crate::types::message::ToolCall;

/// How many times each server tool's handler ran, by tool name, over the whole scenario
/// (restarts included).
#[derive(Debug, Default)]
pub(crate) struct Invocations(Mutex<BTreeMap<String, u64>>);

impl Invocations {
    fn record(&self, tool: &str) {
        *self.0.lock().entry(tool.to_string()).or_default() += 1;
    }

    /// The count of `tool` (0 if it never ran).
    pub(crate) fn count(&self, tool: &str) -> u64 {
        self.0.lock().get(tool).copied().unwrap_or_default()
    }
}

/// The agents that live on other runtimes than the one being built, each with the endpoint
/// of the server that hosts it.
#[derive(Clone, Debug, Default)]
pub(crate) struct RemoteAgentsAt {
    pub(crate) endpoints: BTreeMap<String, String>,
}

/// Builds the agent; the runtime's own checks refuse it as they would any definition.
pub(crate) fn agent(
    spec: &AgentSpec,
    invocations: &Arc<Invocations>,
) -> Result<AgentDefinition, DefinitionError> {
    agent_beside(spec, invocations, &RemoteAgentsAt::default())
}

/// As [`agent`], with a `sub_agent` tool naming one of `remote`'s agents made a remote
/// sub-agent tool.
pub(crate) fn agent_beside(
    spec: &AgentSpec,
    invocations: &Arc<Invocations>,
    remote: &RemoteAgentsAt,
) -> Result<AgentDefinition, DefinitionError> {
    let mut builder = AgentDefinition::builder(spec.name.as_str());
    if let Some(keep) = spec.keep_checkpoints {
        builder = builder.retention(crate::types::Retention::keep_last(keep));
    }
    if let Some(steps) = spec.max_steps {
        builder = builder.max_steps(steps);
    }
    if let Some(timeout) = spec.client_tool_timeout_ms {
        builder = builder.client_tool_timeout_ms(timeout);
    }
    if let Some(schema) = &spec.output_schema {
        builder = builder.output_schema(schema.clone());
    }
    for tool in &spec.tools {
        builder = builder.tool(self::tool(tool, invocations, remote));
    }
    for persistent in &spec.persistent_agents {
        builder = builder.persistent_agent(persistent.agent.as_str(), persistent.mode);
    }
    if !spec.skills.is_empty() {
        let definitions = spec.skills.iter().map(|skill| {
            let mut definition = SkillDefinition::new(&skill.name, &skill.description, &skill.body);
            for (path, text) in &skill.resources {
                definition = definition.resource(path, text);
            }
            definition
        });
        let skills =
            InCodeSkills::new(definitions).map_err(|error| DefinitionError::InvalidSkill {
                agent: spec.name.clone(),
                reason: error.to_string(),
            })?;
        builder = builder.skills(skills);
    }
    if !spec.preload_skills.is_empty() {
        builder = builder.preload_skills(spec.preload_skills.iter().cloned());
    }
    builder.build()
}

fn tool(
    spec: &ToolSpec,
    invocations: &Arc<Invocations>,
    remote: &RemoteAgentsAt,
) -> ToolDefinition {
    let mut tool = match spec.kind {
        ToolKindSpec::Server => {
            let name = spec.name.clone();
            let answer = match &spec.error {
                Some(error) => Err(ToolError::new(error.as_str())),
                None => Ok(spec.result.clone().unwrap_or(Value::Null)),
            };
            let invocations = Arc::clone(invocations);
            ToolDefinition::server(spec.name.as_str(), move |_input, _ctx| {
                invocations.record(&name);
                let answer = answer.clone();
                async move { answer }
            })
        }
        ToolKindSpec::Client => {
            let mut tool = ToolDefinition::client(spec.name.as_str());
            if let Some(timeout) = spec.timeout_ms {
                tool = tool.timeout_ms(timeout);
            }
            if let Some(schema) = &spec.output_schema {
                tool = tool.output_schema(schema.clone());
            }
            tool
        }
        ToolKindSpec::SubAgent => {
            let agent = spec.agent.as_deref().unwrap_or_default();
            match remote.endpoints.get(agent) {
                Some(endpoint) => {
                    ToolDefinition::remote_sub_agent(spec.name.as_str(), endpoint, agent)
                }
                None => ToolDefinition::sub_agent(spec.name.as_str(), agent),
            }
        }
    };
    if spec.require_approval {
        let approval = if spec.editable {
            Approval::Editable
        } else {
            Approval::Always
        };
        tool = tool.require_approval(approval);
    }
    if spec.on_cut == Some(OnCutSpec::Reconcile) {
        tool = tool.on_cut(OnCut::Reconcile);
    }
    if let Some(check) = spec.check {
        let result = spec.result.clone().unwrap_or(Value::Null);
        tool = tool.reconcile_with(move |_input, _key| {
            let settled = match check {
                CheckSpec::Happened => Some(Reconciled::Happened(result.clone())),
                CheckSpec::DidNotHappen => Some(Reconciled::DidNotHappen),
                CheckSpec::Failed => Some(Reconciled::Failed("failed (by its check)".into())),
                CheckSpec::Unknown => None,
            };
            async move { settled }
        });
    }
    tool.safe_to_retry(spec.safe_to_retry)
        .finish_with(spec.finish_with)
}

/// The model's replies. `{ "finish": V }` at entry K is a call of `__finish__` with id
/// `finish-K` and input V, after the entry's other calls.
pub(crate) fn script(entries: &[ScriptEntry]) -> Vec<ModelReply> {
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            let mut tool_calls: Vec<ToolCall> = entry
                .tool_calls
                .iter()
                .flatten()
                .map(|call| ToolCall::new(call.id.as_str(), call.name.as_str(), call.input.clone()))
                .collect();
            if let Some(value) = &entry.finish {
                tool_calls.push(ToolCall::new(
                    format!("finish-{index}"),
                    FINISH_TOOL,
                    value.clone(),
                ));
            }
            ModelReply {
                text: entry.text.clone(),
                tool_calls,
                usage: entry.usage,
            }
        })
        .collect()
}

/// The snake_case name of the rule a definition broke, which a `define` step may expect as
/// well as the general `invalid_definition`.
pub(crate) fn definition_error_code(error: &DefinitionError) -> &'static str {
    match error {
        DefinitionError::EmptyAgentName => "empty_agent_name",
        DefinitionError::EmptyToolName { .. } => "empty_tool_name",
        DefinitionError::ReservedPrefix { .. } => "reserved_prefix",
        DefinitionError::ReservedFinishName { .. } => "reserved_finish_name",
        DefinitionError::ReservedToolName { .. } => "reserved_tool_name",
        DefinitionError::InvalidPreloadSkill { .. } => "invalid_preload_skill",
        DefinitionError::InvalidSkill { .. } => "invalid_skill",
        DefinitionError::DuplicateTool { .. } => "duplicate_tool",
        DefinitionError::ClientWithApproval { .. } => "client_with_approval",
        DefinitionError::ClientWithFinish { .. } => "client_with_finish",
        DefinitionError::SubAgentWithFlags { .. } => "sub_agent_with_flags",
        DefinitionError::InvalidSchema { .. } => "invalid_schema",
        DefinitionError::ZeroMaxSteps { .. } => "zero_max_steps",
        DefinitionError::UnknownSubAgent { .. } => "unknown_sub_agent",
        DefinitionError::DuplicateAgent { .. } => "duplicate_agent",
        DefinitionError::DuplicatePersistentAgent { .. } => "duplicate_persistent_agent",
        DefinitionError::UnknownPersistentAgent { .. } => "unknown_persistent_agent",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::scenario::format::ToolCallSpec;
    use serde_json::json;

    #[test]
    fn a_finish_entry_calls_finish_with_an_id_from_its_index() {
        let entries = vec![
            ScriptEntry {
                text: Some("thinking".into()),
                tool_calls: None,
                finish: None,
                usage: None,
            },
            ScriptEntry {
                text: None,
                tool_calls: Some(vec![ToolCallSpec {
                    id: "c".into(),
                    name: "t".into(),
                    input: json!({}),
                }]),
                finish: Some(json!({ "score": 1 })),
                usage: None,
            },
        ];
        let replies = script(&entries);
        assert_eq!(replies[0], ModelReply::text("thinking"));
        let names: Vec<(&str, &str)> = replies[1]
            .tool_calls
            .iter()
            .map(|call| (call.id.as_str(), call.name.as_str()))
            .collect();
        assert_eq!(names, vec![("c", "t"), ("finish-1", "__finish__")]);
    }
}
