//! The two tools an agent with skills gains: `load_skill` (level 2) and `read_skill_file`
//! (level 3). Both only read, so both are safe to run again after a crash.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use super::{ReadRange, SkillProvider};
use crate::definition::{ToolDefinition, ToolError};

/// The tool that returns a skill's instructions.
pub const LOAD_SKILL: &str = "load_skill";
/// The tool that returns one file of a skill, or some of its lines.
pub const READ_SKILL_FILE: &str = "read_skill_file";

#[derive(Deserialize)]
struct LoadInput {
    name: String,
}

#[derive(Deserialize)]
struct ReadInput {
    name: String,
    path: String,
    #[serde(default)]
    start_line: Option<usize>,
    #[serde(default)]
    end_line: Option<usize>,
}

/// `load_skill` and `read_skill_file` over `provider`.
pub(crate) fn skill_tools(provider: &Arc<dyn SkillProvider>) -> [ToolDefinition; 2] {
    let loader = Arc::clone(provider);
    let load = ToolDefinition::server(LOAD_SKILL, move |input: Value, _| {
        let provider = Arc::clone(&loader);
        async move {
            let LoadInput { name } = parse(input)?;
            let skill = provider
                .get(&name)
                .await
                .map_err(|error| ToolError::new(error.to_string()))?
                .ok_or_else(|| {
                    ToolError::new(format!(
                        "skill_not_found: there is no skill named {name:?}; the skills are listed in the system prompt"
                    ))
                })?;
            let mut text = skill.body;
            if !skill.resources.is_empty() {
                text.truncate(text.trim_end().len());
                text.push_str("\n\nFiles of this skill (read one with read_skill_file):\n");
                for path in &skill.resources {
                    text.push_str("- ");
                    text.push_str(path);
                    text.push('\n');
                }
            }
            Ok(Value::String(text))
        }
    })
    .description(
        "Load a skill's full instructions by its name from the skills catalog. A skill is not a \
         tool: load it, then follow what it says.",
    )
    .input_schema(json!({
        "type": "object",
        "properties": { "name": { "type": "string", "description": "The skill's name." } },
        "required": ["name"],
        "additionalProperties": false
    }))
    .safe_to_retry(true);
    let reader = Arc::clone(provider);
    let read = ToolDefinition::server(READ_SKILL_FILE, move |input: Value, _| {
        let provider = Arc::clone(&reader);
        async move {
            let ReadInput {
                name,
                path,
                start_line,
                end_line,
            } = parse(input)?;
            let range = (start_line.is_some() || end_line.is_some()).then_some(ReadRange {
                start_line,
                end_line,
            });
            let text = provider
                .read_resource(&name, &path, range)
                .await
                .map_err(|error| ToolError::new(error.to_string()))?
                .ok_or_else(|| {
                    ToolError::new(format!(
                        "resource_not_found: skill {name:?} has no file {path:?}; load_skill lists its files"
                    ))
                })?;
            Ok(Value::String(text))
        }
    })
    .description(
        "Read a file of a skill (a path that load_skill listed, under references/, scripts/ or \
         assets/), optionally only lines start_line..=end_line (1-based).",
    )
    .input_schema(json!({
        "type": "object",
        "properties": {
            "name": { "type": "string", "description": "The skill's name." },
            "path": { "type": "string", "description": "The file's path inside the skill." },
            "start_line": { "type": "integer", "minimum": 1 },
            "end_line": { "type": "integer", "minimum": 1 }
        },
        "required": ["name", "path"],
        "additionalProperties": false
    }))
    .safe_to_retry(true);
    [load, read]
}

fn parse<T: for<'de> Deserialize<'de>>(input: Value) -> Result<T, ToolError> {
    serde_json::from_value(input).map_err(|error| ToolError::new(format!("invalid_input: {error}")))
}
