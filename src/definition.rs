//! Agent definitions, validated when built: an invalid definition never reaches a run.
//!
//! Public for what a definition needs beyond the crate root's front door
//! ([`AgentDefinition`], [`ToolDefinition`], [`ToolError`], [`Approval`]): [`AgentBuilder`],
//! [`DefinitionError`], [`ToolContext`] and [`ToolHandler`] for a handler of your own type,
//! companions ([`CompanionMode`], [`PersistentAgent`]), the reserved names and the defaults.

pub(crate) mod agent;
pub(crate) mod binding;
mod companion;
pub mod input;
pub(crate) mod reconcile;
pub(crate) mod tool;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use crate::llm::ToolSpec;
use crate::skills::{SkillProvider, RESERVED_TOOL_NAMES};

pub(crate) use agent::AgentDefinition;
pub(crate) use companion::CompanionTool;
pub use companion::{CompanionMode, PersistentAgent};
pub use input::{InputAnswer, InputRequest};
pub use reconcile::{OnCut, ReconcileCheck, Reconciled};
pub(crate) use tool::{Approval, ToolDefinition, ToolError};
// Public beyond the front door (the crate root has `AgentDefinition`, `ToolDefinition`,
// `ToolError`, `Approval`): the builder, the handler trait and context, companions, the
// reserved names and defaults.
pub use tool::{sub_agent_input_schema, ApprovalPredicate, ToolContext, ToolHandler, ToolKind};

/// The name of the tool that ends a run with a value checked against the agent's output schema.
pub const FINISH_TOOL: &str = "__finish__";
/// Prefix reserved for the tools the runtime makes for ephemeral sub-agents.
pub const SUBAGENT_PREFIX: &str = "subagent__";
/// Prefix reserved for the companion tools of persistent sub-agents.
pub const COMPANION_PREFIX: &str = "companion__";
/// Model calls a run may make when the definition does not say.
pub const DEFAULT_MAX_STEPS: u32 = 10;
/// A client tool's timeout when neither the tool nor the agent sets one: five minutes.
pub const DEFAULT_CLIENT_TOOL_TIMEOUT_MS: u64 = 300_000;

/// Why a definition was refused. Each rule has its own variant.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DefinitionError {
    /// The agent's name is empty.
    #[error("an agent needs a name")]
    EmptyAgentName,
    /// A tool's name is empty.
    #[error("agent {agent}: a tool needs a name")]
    EmptyToolName {
        /// The agent.
        agent: String,
    },
    /// A user tool uses a prefix the runtime reserves.
    #[error("agent {agent}: tool {tool} uses the reserved prefix {prefix}")]
    ReservedPrefix {
        /// The agent.
        agent: String,
        /// The tool.
        tool: String,
        /// The reserved prefix.
        prefix: &'static str,
    },
    /// A user tool is named `__finish__`.
    #[error("agent {agent}: the tool name {FINISH_TOOL} is reserved")]
    ReservedFinishName {
        /// The agent.
        agent: String,
    },
    /// Two tools share a name.
    #[error("agent {agent}: two tools are named {tool}")]
    DuplicateTool {
        /// The agent.
        agent: String,
        /// The name used twice.
        tool: String,
    },
    /// A user tool is named `load_skill` or `read_skill_file`, the tools of skills.
    #[error("agent {agent}: the tool name {tool} is reserved for skills")]
    ReservedToolName {
        /// The agent.
        agent: String,
        /// The tool.
        tool: String,
    },
    /// A skill named in `preload_skills` is not a valid skill name, or the agent has no skills.
    #[error("agent {agent}: cannot preload skill {name:?}: {reason}")]
    InvalidPreloadSkill {
        /// The agent.
        agent: String,
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A skill given in code is invalid (its name, description or a file's path).
    #[error("agent {agent}: invalid skill: {reason}")]
    InvalidSkill {
        /// The agent.
        agent: String,
        /// What is wrong, with the skill error's code first.
        reason: String,
    },
    /// A client tool requires approval: the client already is the person in the loop.
    #[error("agent {agent}: client tool {tool} may not also require approval")]
    ClientWithApproval {
        /// The agent.
        agent: String,
        /// The tool.
        tool: String,
    },
    /// A client tool is `finish_with`: its result arrives after the run has suspended.
    #[error("agent {agent}: client tool {tool} may not also be finish_with")]
    ClientWithFinish {
        /// The agent.
        agent: String,
        /// The tool.
        tool: String,
    },
    /// A sub-agent tool is `finish_with` or requires approval.
    #[error("agent {agent}: sub-agent tool {tool} may not be finish_with or require approval")]
    SubAgentWithFlags {
        /// The agent.
        agent: String,
        /// The tool.
        tool: String,
    },
    /// A schema does not compile.
    #[error("agent {agent}: {which} schema of {owner} is not a valid JSON Schema: {reason}")]
    InvalidSchema {
        /// The agent.
        agent: String,
        /// The tool, or the agent for its output schema.
        owner: String,
        /// `input` or `output`.
        which: &'static str,
        /// The compiler's complaint.
        reason: String,
    },
    /// `max_steps` is zero.
    #[error("agent {agent}: max_steps must be at least 1")]
    ZeroMaxSteps {
        /// The agent.
        agent: String,
    },
    /// A sub-agent tool names an agent that is not registered.
    #[error("agent {agent}: sub-agent tool {tool} names unknown agent {target}")]
    UnknownSubAgent {
        /// The agent.
        agent: String,
        /// The tool.
        tool: String,
        /// The agent it names.
        target: String,
    },
    /// The same agent is listed twice as a persistent sub-agent.
    #[error("agent {agent}: persistent agent {target} is listed twice")]
    DuplicatePersistentAgent {
        /// The agent.
        agent: String,
        /// The agent listed twice.
        target: String,
    },
    /// A persistent sub-agent names an agent that is not registered.
    #[error("agent {agent}: persistent agent {target} is not a defined agent")]
    UnknownPersistentAgent {
        /// The agent.
        agent: String,
        /// The agent it names.
        target: String,
    },
    /// An agent with this name is already registered.
    #[error("an agent named {agent} is already defined")]
    DuplicateAgent {
        /// The agent.
        agent: String,
    },
}

/// A compiled JSON Schema and its source.
#[derive(Clone)]
pub(crate) struct Schema {
    source: Value,
    validator: Arc<jsonschema::Validator>,
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Schema").field(&self.source).finish()
    }
}

/// The most schema errors reported for one value.
pub(crate) const SCHEMA_ERRORS: usize = 16;

/// The longest schema error line, in characters.
pub(crate) const SCHEMA_ERROR_CHARS: usize = 300;

/// `line` cut to [`SCHEMA_ERROR_CHARS`], marked with `…` where it was cut.
fn shortened(line: String) -> String {
    match line.char_indices().nth(SCHEMA_ERROR_CHARS) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line,
    }
}

impl Schema {
    pub(crate) fn compile(source: &Value) -> Result<Self, String> {
        let validator = jsonschema::validator_for(source).map_err(|error| error.to_string())?;
        Ok(Self {
            source: source.clone(),
            validator: Arc::new(validator),
        })
    }

    /// How `value` fails the schema, as `path: message` lines; empty when valid. The
    /// messages quote the failing value, which may be as large as the submitted answer: at
    /// most [`SCHEMA_ERRORS`] lines of at most [`SCHEMA_ERROR_CHARS`] characters each go back
    /// to the caller (or the model), and a last line says how many more there were.
    pub(crate) fn errors(&self, value: &Value) -> Vec<String> {
        let mut errors = self.validator.iter_errors(value);
        let mut lines: Vec<String> = errors
            .by_ref()
            .take(SCHEMA_ERRORS)
            .map(|error| {
                let path = error.instance_path().to_string();
                let path = if path.is_empty() { "/".into() } else { path };
                shortened(format!("{path}: {error}"))
            })
            .collect();
        let more = errors.count();
        if more > 0 {
            lines.push(format!("… and {more} more"));
        }
        lines
    }

    /// The schema as written.
    pub(crate) fn source(&self) -> &Value {
        &self.source
    }
}

/// A validated tool with its compiled schemas.
#[derive(Clone, Debug)]
pub(crate) struct Tool {
    pub(crate) def: ToolDefinition,
    pub(crate) input: Option<Schema>,
    /// Checked against submitted client results (the submit contract).
    pub(crate) output: Option<Schema>,
}

impl AgentDefinition {
    /// Starts a definition of the agent `name`.
    pub fn builder(name: impl Into<String>) -> AgentBuilder {
        AgentBuilder {
            name: name.into(),
            system_prompt: String::new(),
            max_steps: DEFAULT_MAX_STEPS,
            client_tool_timeout_ms: None,
            output_schema: None,
            tools: Vec::new(),
            persistent: Vec::new(),
            model: crate::llm::ModelSettings::default(),
            skills: None,
            preload_skills: Vec::new(),
            retention: crate::types::Retention::all(),
        }
    }

    /// Which checkpoints of its sessions are kept once a run ends (all by default); see
    /// [`AgentBuilder::retention`].
    pub fn retention(&self) -> crate::types::Retention {
        self.retention
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The system prompt.
    pub fn system_prompt(&self) -> &str {
        &self.system_prompt
    }

    /// Model calls one run may make.
    pub fn max_steps(&self) -> u32 {
        self.max_steps
    }

    /// The client-tool timeout for tools that do not set their own.
    pub fn client_tool_timeout_ms(&self) -> Option<u64> {
        self.client_tool_timeout_ms
    }

    /// The output schema, if the agent finishes with `__finish__`.
    pub fn output_schema(&self) -> Option<&Value> {
        self.output_schema.as_ref().map(Schema::source)
    }

    /// The tools as the model sees them (with `__finish__` when there is an output schema).
    pub fn tool_specs(&self) -> Arc<[ToolSpec]> {
        Arc::clone(&self.specs)
    }

    /// The user tools, in definition order.
    pub fn tools(&self) -> impl Iterator<Item = &ToolDefinition> {
        self.tools.iter().map(|tool| &tool.def)
    }

    /// The agents this one may run as persistent sub-agents (companions).
    pub fn persistent_agents(&self) -> &[PersistentAgent] {
        &self.persistent
    }

    /// The agent's skills, if it has any (a sub-agent never inherits its parent's).
    pub fn skills(&self) -> Option<&Arc<dyn SkillProvider>> {
        self.skills.as_ref()
    }

    /// The skills whose bodies go into the system prompt on every step.
    pub fn preload_skills(&self) -> &[String] {
        &self.preload_skills
    }

    pub(crate) fn preload_skills_shared(&self) -> Arc<[String]> {
        Arc::clone(&self.preload_skills)
    }

    pub(crate) fn skill_section(&self) -> &crate::skills::LastSection {
        &self.skill_section
    }

    /// The model settings every request of this agent carries.
    pub fn model_settings(&self) -> Arc<crate::llm::ModelSettings> {
        Arc::clone(&self.model)
    }

    pub(crate) fn tool(&self, name: &str) -> Option<&Tool> {
        self.by_name
            .get(name)
            .and_then(|&index| self.tools.get(index))
    }

    pub(crate) fn output(&self) -> Option<&Schema> {
        self.output_schema.as_ref()
    }
}

/// Builds an [`AgentDefinition`]; [`AgentBuilder::build`] checks every rule.
#[derive(Debug)]
#[must_use]
pub struct AgentBuilder {
    name: String,
    system_prompt: String,
    max_steps: u32,
    client_tool_timeout_ms: Option<u64>,
    output_schema: Option<Value>,
    tools: Vec<ToolDefinition>,
    persistent: Vec<PersistentAgent>,
    model: crate::llm::ModelSettings,
    skills: Option<Arc<dyn SkillProvider>>,
    preload_skills: Vec<String>,
    retention: crate::types::Retention,
}

impl AgentBuilder {
    /// Which checkpoints of a session are kept: the newest `keep_last`, those younger than
    /// `max_age_ms`, or both rules at once (a checkpoint either lets go goes). Once a run of
    /// the session ends (completed or failed) and enough has piled up (half as many again as
    /// kept, or half the age again), the older entries of its log become one entry, which
    /// holds everything they recorded: the session reads as before (its conversation, its
    /// runs, its stream), and a compacted checkpoint can no longer be read or forked
    /// ([`StateAt::Compacted`](crate::types::StateAt), [`ForkError::Compacted`](crate::types::ForkError)).
    /// Compaction is a write of its own after the run has answered, never part of a commit of
    /// the run. By default every checkpoint is kept.
    ///
    /// ```
    /// use dormant::types::Retention;
    /// use dormant::AgentDefinition;
    /// let agent = AgentDefinition::builder("assistant")
    ///     .retention(Retention::keep_last(100).and_max_age_ms(7 * 24 * 3600 * 1000))
    ///     .build()?;
    /// assert_eq!(agent.retention().keep_last, Some(100));
    /// # Ok::<(), dormant::definition::DefinitionError>(())
    /// ```
    pub fn retention(mut self, retention: crate::types::Retention) -> Self {
        self.retention = retention;
        self
    }

    /// Sets the model settings (model name, temperature, output limit, provider extras) that
    /// every request of this agent carries.
    ///
    /// ```
    /// use dormant::{AgentDefinition, ModelSettings};
    /// let agent = AgentDefinition::builder("assistant")
    ///     .model(ModelSettings::model("gpt-4o-mini").temperature(0.2))
    ///     .build()?;
    /// assert_eq!(agent.model_settings().temperature, Some(0.2));
    /// # Ok::<(), dormant::definition::DefinitionError>(())
    /// ```
    pub fn model(mut self, settings: crate::llm::ModelSettings) -> Self {
        self.model = settings;
        self
    }

    /// Sets the system prompt.
    pub fn system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = prompt.into();
        self
    }

    /// Gives the agent skills: their catalog (name and description) is appended to the
    /// system prompt of every step, and the agent gains the tools `load_skill` (a skill's
    /// instructions) and `read_skill_file` (one of its files, or some lines of it). Sub-agents
    /// do not inherit them.
    ///
    /// ```
    /// use dormant::skills::{InCodeSkills, SkillDefinition};
    /// use dormant::AgentDefinition;
    ///
    /// let skills = InCodeSkills::new([SkillDefinition::new(
    ///     "deploy-runbook",
    ///     "How to deploy the service. Use before any deploy.",
    ///     "1. Check the pipeline is green. 2. …",
    /// )])?;
    /// let agent = AgentDefinition::builder("ops")
    ///     .skills(skills)
    ///     .preload_skills(["deploy-runbook"])
    ///     .build()?;
    /// let names: Vec<String> = agent.tool_specs().iter().map(|spec| spec.name.clone()).collect();
    /// assert!(names.contains(&"load_skill".to_string()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// From a folder of `<name>/SKILL.md` directories: `.skills(FsSkills::new(["./skills"]))`.
    pub fn skills(mut self, provider: impl SkillProvider) -> Self {
        self.skills = Some(Arc::new(provider));
        self
    }

    /// [`AgentBuilder::skills`] with a provider already shared.
    pub fn skills_shared(mut self, provider: Arc<dyn SkillProvider>) -> Self {
        self.skills = Some(provider);
        self
    }

    /// Puts these skills' bodies into the system prompt on every step (an `Active Skills`
    /// section after the catalog), so the model needs no `load_skill` call for them. A name
    /// the provider does not know is skipped with a warning when the prompt is built.
    pub fn preload_skills<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.preload_skills
            .extend(names.into_iter().map(Into::into));
        self
    }

    /// Adds a tool.
    pub fn tool(mut self, tool: ToolDefinition) -> Self {
        self.tools.push(tool);
        self
    }

    /// Adds tools, in order (an MCP server's, say: `dormant::mcp::McpTools::definitions`).
    ///
    /// ```
    /// use dormant::{AgentDefinition, ToolDefinition};
    ///
    /// let agent = AgentDefinition::builder("helper")
    ///     .tools([ToolDefinition::client("pick_file"), ToolDefinition::client("confirm")])
    ///     .build()?;
    /// assert_eq!(agent.tools().count(), 2);
    /// # Ok::<(), dormant::definition::DefinitionError>(())
    /// ```
    pub fn tools(mut self, tools: impl IntoIterator<Item = ToolDefinition>) -> Self {
        self.tools.extend(tools);
        self
    }

    /// Sets how many model calls one run may make (default [`DEFAULT_MAX_STEPS`]).
    pub fn max_steps(mut self, steps: u32) -> Self {
        self.max_steps = steps;
        self
    }

    /// Sets the timeout of client tools that do not set their own.
    pub fn client_tool_timeout_ms(mut self, timeout_ms: u64) -> Self {
        self.client_tool_timeout_ms = Some(timeout_ms);
        self
    }

    /// Gives the agent an output schema: it gains the `__finish__` tool, whose input must
    /// satisfy the schema and becomes the run's output.
    pub fn output_schema(mut self, schema: Value) -> Self {
        self.output_schema = Some(schema);
        self
    }

    /// Lets the agent run `agent` as a persistent sub-agent: it gains the `companion__*` tools
    /// (`spawnAgent`, `sendMessage`, `listChildren`, `getChildStatus`, `terminateChild`, and
    /// `waitForResult` once some persistent agent is [`CompanionMode::Blocking`]).
    ///
    /// ```
    /// use dormant::AgentDefinition;
    /// use dormant::definition::CompanionMode;
    /// let lead = AgentDefinition::builder("lead")
    ///     .persistent_agent("researcher", CompanionMode::Blocking)
    ///     .build()?;
    /// let names: Vec<String> = lead.tool_specs().iter().map(|spec| spec.name.clone()).collect();
    /// assert!(names.contains(&"companion__spawnAgent".to_string()));
    /// assert!(names.contains(&"companion__waitForResult".to_string()));
    /// # Ok::<(), dormant::definition::DefinitionError>(())
    /// ```
    pub fn persistent_agent(mut self, agent: impl Into<String>, mode: CompanionMode) -> Self {
        self.persistent.push(PersistentAgent {
            agent: agent.into(),
            mode,
        });
        self
    }

    /// Checks every rule and builds the definition.
    ///
    /// # Errors
    /// The first rule broken, as its own [`DefinitionError`] variant.
    pub fn build(self) -> Result<AgentDefinition, DefinitionError> {
        let agent = self.name;
        if agent.is_empty() {
            return Err(DefinitionError::EmptyAgentName);
        }
        if self.max_steps == 0 {
            return Err(DefinitionError::ZeroMaxSteps { agent });
        }
        for def in &self.tools {
            if RESERVED_TOOL_NAMES.contains(&def.name.as_str()) {
                return Err(DefinitionError::ReservedToolName {
                    agent,
                    tool: def.name.clone(),
                });
            }
        }
        for name in &self.preload_skills {
            let reason = match (&self.skills, crate::skills::validate_skill_name(name)) {
                (None, _) => "the agent has no skills".to_string(),
                (Some(_), Err(error)) => error.to_string(),
                (Some(_), Ok(())) => continue,
            };
            return Err(DefinitionError::InvalidPreloadSkill {
                agent,
                name: name.clone(),
                reason,
            });
        }
        let mut user_tools = self.tools;
        if let Some(provider) = &self.skills {
            user_tools.extend(crate::skills::skill_tools(provider));
        }
        let mut tools = Vec::with_capacity(user_tools.len());
        let mut by_name = HashMap::with_capacity(user_tools.len());
        for def in user_tools {
            check_tool(&agent, &def)?;
            if by_name.insert(def.name.clone(), tools.len()).is_some() {
                return Err(DefinitionError::DuplicateTool {
                    agent,
                    tool: def.name,
                });
            }
            let compile = |schema: &Option<Value>, which| {
                schema
                    .as_ref()
                    .map(Schema::compile)
                    .transpose()
                    .map_err(|reason| DefinitionError::InvalidSchema {
                        agent: agent.clone(),
                        owner: def.name.clone(),
                        which,
                        reason,
                    })
            };
            let input = compile(&def.input_schema, "input")?;
            let output = compile(&def.output_schema, "output")?;
            tools.push(Tool { def, input, output });
        }
        let output_schema = self
            .output_schema
            .as_ref()
            .map(Schema::compile)
            .transpose()
            .map_err(|reason| DefinitionError::InvalidSchema {
                agent: agent.clone(),
                owner: agent.clone(),
                which: "output",
                reason,
            })?;
        let mut specs: Vec<ToolSpec> = tools
            .iter()
            .map(|tool| ToolSpec {
                name: tool.def.name.clone(),
                description: tool.def.description.clone(),
                input_schema: tool
                    .def
                    .input_schema
                    .clone()
                    .unwrap_or_else(|| serde_json::json!({ "type": "object" })),
            })
            .collect();
        for (index, persistent) in self.persistent.iter().enumerate() {
            if self.persistent[..index]
                .iter()
                .any(|earlier| earlier.agent == persistent.agent)
            {
                return Err(DefinitionError::DuplicatePersistentAgent {
                    agent,
                    target: persistent.agent.clone(),
                });
            }
        }
        specs.extend(companion::companion_specs(&self.persistent));
        if let Some(schema) = &output_schema {
            specs.push(ToolSpec {
                name: FINISH_TOOL.into(),
                description: "Finish the run with this value as its output.".into(),
                input_schema: schema.source().clone(),
            });
        }
        Ok(AgentDefinition {
            name: agent,
            system_prompt: self.system_prompt,
            max_steps: self.max_steps,
            client_tool_timeout_ms: self.client_tool_timeout_ms,
            output_schema,
            tools,
            by_name,
            persistent: self.persistent,
            specs: specs.into(),
            model: Arc::new(self.model),
            skills: self.skills,
            preload_skills: self.preload_skills.into(),
            skill_section: Default::default(),
            retention: self.retention,
        })
    }
}

fn check_tool(agent: &str, def: &ToolDefinition) -> Result<(), DefinitionError> {
    let agent = agent.to_string();
    let tool = def.name.clone();
    if tool.is_empty() {
        return Err(DefinitionError::EmptyToolName { agent });
    }
    if tool == FINISH_TOOL {
        return Err(DefinitionError::ReservedFinishName { agent });
    }
    for prefix in [SUBAGENT_PREFIX, COMPANION_PREFIX] {
        if tool.starts_with(prefix) {
            return Err(DefinitionError::ReservedPrefix {
                agent,
                tool,
                prefix,
            });
        }
    }
    let needs_approval = !matches!(def.approval, Approval::Never);
    match def.kind {
        ToolKind::Client { .. } if needs_approval => {
            Err(DefinitionError::ClientWithApproval { agent, tool })
        }
        ToolKind::Client { .. } if def.finish_with => {
            Err(DefinitionError::ClientWithFinish { agent, tool })
        }
        ToolKind::SubAgent { .. } | ToolKind::RemoteSubAgent { .. }
            if needs_approval || def.finish_with =>
        {
            Err(DefinitionError::SubAgentWithFlags { agent, tool })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{Schema, SCHEMA_ERRORS, SCHEMA_ERROR_CHARS};

    #[test]
    fn schema_errors_are_bounded_in_number_and_length() -> Result<(), String> {
        let schema = Schema::compile(&json!({ "type": "array", "items": { "type": "integer" } }))?;
        let long = "y".repeat(100_000);
        let errors = schema.errors(&json!([long]));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("/0: "), "{}", errors[0]);
        assert_eq!(errors[0].chars().count(), SCHEMA_ERROR_CHARS + 1);
        assert!(errors[0].ends_with('…'));

        let many: Vec<String> = (0..40).map(|n| n.to_string()).collect();
        let errors = schema.errors(&json!(many));
        assert_eq!(errors.len(), SCHEMA_ERRORS + 1);
        assert_eq!(errors.last().map(String::as_str), Some("… and 24 more"));
        assert!(schema.errors(&json!([1, 2])).is_empty());
        Ok(())
    }
}
