//! The agent definition itself, in a file of its own so that its one public path is the
//! crate root's (`dormant::AgentDefinition`); its builder and rules are in `definition.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use super::{PersistentAgent, Schema, Tool};
use crate::llm::ToolSpec;
use crate::skills::SkillProvider;

/// An agent: its prompt, tools and limits. Build one with [`AgentDefinition::builder`].
///
/// ```
/// use dormant::definition::DefinitionError;
/// use dormant::{AgentDefinition, ToolDefinition, ToolError};
/// use serde_json::json;
///
/// let agent = AgentDefinition::builder("helper")
///     .system_prompt("Be brief.")
///     .tool(ToolDefinition::server("now", |_, _| async { Ok::<_, ToolError>(json!(0)) }))
///     .max_steps(5)
///     .build()?;
/// assert_eq!(agent.name(), "helper");
///
/// let refused = AgentDefinition::builder("x")
///     .tool(ToolDefinition::client("__finish__"))
///     .build();
/// assert!(matches!(refused, Err(DefinitionError::ReservedFinishName { .. })));
/// # Ok::<(), DefinitionError>(())
/// ```
#[derive(Clone, Debug)]
pub struct AgentDefinition {
    pub(super) name: String,
    pub(super) system_prompt: String,
    pub(super) max_steps: u32,
    pub(super) client_tool_timeout_ms: Option<u64>,
    pub(super) output_schema: Option<Schema>,
    pub(super) tools: Vec<Tool>,
    pub(super) by_name: HashMap<String, usize>,
    pub(super) persistent: Vec<PersistentAgent>,
    pub(super) specs: Arc<[ToolSpec]>,
    pub(super) model: Arc<crate::llm::ModelSettings>,
    pub(super) skills: Option<Arc<dyn SkillProvider>>,
    /// Shared with each model call's prompt builder, not copied per step.
    pub(super) preload_skills: Arc<[String]>,
    /// The last skills section built for this agent: a step whose provider fails uses it.
    pub(super) skill_section: crate::skills::LastSection,
    pub(super) retention: crate::types::Retention,
}
