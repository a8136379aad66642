//! Persistent sub-agents ("companions"): the agents a parent may keep alive across turns, and
//! the `companion__*` tools the runtime gives the parent to drive them.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::COMPANION_PREFIX;
use crate::llm::ToolSpec;

/// Whether the parent waits for a companion's turn to end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompanionMode {
    /// `spawnAgent` and `sendMessage` wait for the companion's reply, which is their result
    /// (and the parent suspends while the companion waits on a person).
    Blocking,
    /// `spawnAgent` and `sendMessage` return at once; the parent reads the reply later with
    /// `getChildStatus` (or waits with `waitForResult`, when some companion is blocking).
    NonBlocking,
}

impl CompanionMode {
    /// The stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            CompanionMode::Blocking => "blocking",
            CompanionMode::NonBlocking => "non_blocking",
        }
    }
}

/// An agent a parent may run as a persistent sub-agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistentAgent {
    /// The registered agent it runs (the `agentType` of `companion__spawnAgent`).
    pub agent: String,
    /// Whether the parent waits for its replies.
    pub mode: CompanionMode,
}

/// The companion tools, as the model names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CompanionTool {
    Spawn,
    Send,
    List,
    Status,
    Terminate,
    Wait,
}

impl CompanionTool {
    const ALL: [CompanionTool; 6] = [
        CompanionTool::Spawn,
        CompanionTool::Send,
        CompanionTool::List,
        CompanionTool::Status,
        CompanionTool::Terminate,
        CompanionTool::Wait,
    ];

    fn suffix(self) -> &'static str {
        match self {
            CompanionTool::Spawn => "spawnAgent",
            CompanionTool::Send => "sendMessage",
            CompanionTool::List => "listChildren",
            CompanionTool::Status => "getChildStatus",
            CompanionTool::Terminate => "terminateChild",
            CompanionTool::Wait => "waitForResult",
        }
    }

    /// The full tool name, `companion__…`.
    pub(crate) fn name(self) -> String {
        format!("{COMPANION_PREFIX}{}", self.suffix())
    }

    /// The companion tool called `name`, if `agents` gives the agent that tool: the five are
    /// there whenever some persistent agent is configured, `waitForResult` only when one of
    /// them is blocking.
    pub(crate) fn parse(name: &str, agents: &[PersistentAgent]) -> Option<Self> {
        let suffix = name.strip_prefix(COMPANION_PREFIX)?;
        Self::ALL
            .into_iter()
            .find(|tool| tool.suffix() == suffix)
            .filter(|tool| offered(*tool, agents))
    }

    fn description(self) -> &'static str {
        match self {
            CompanionTool::Spawn => {
                "Start a persistent sub-agent (or consult one that finished again) with a message."
            }
            CompanionTool::Send => {
                "Send a new message to a persistent sub-agent; it continues its conversation."
            }
            CompanionTool::List => {
                "List the persistent sub-agents of this session and where each stands."
            }
            CompanionTool::Status => "Where one persistent sub-agent stands, with its last reply.",
            CompanionTool::Terminate => {
                "Stop a persistent sub-agent for good; spawning the name again starts it fresh."
            }
            CompanionTool::Wait => {
                "Wait until a persistent sub-agent's current turn ends and return its reply."
            }
        }
    }

    fn input_schema(self, agents: &[PersistentAgent]) -> Value {
        let name = json!({ "type": "string", "minLength": 1 });
        let message = json!({ "type": "string" });
        match self {
            CompanionTool::Spawn => {
                let types: Vec<&str> = agents.iter().map(|agent| agent.agent.as_str()).collect();
                json!({
                    "type": "object",
                    "required": ["agentType", "message"],
                    "properties": {
                        "agentType": { "type": "string", "enum": types },
                        "name": name,
                        "message": message,
                    },
                })
            }
            CompanionTool::Send => json!({
                "type": "object",
                "required": ["name", "message"],
                "properties": { "name": name, "message": message },
            }),
            CompanionTool::List => json!({ "type": "object" }),
            CompanionTool::Status | CompanionTool::Terminate | CompanionTool::Wait => json!({
                "type": "object",
                "required": ["name"],
                "properties": { "name": name },
            }),
        }
    }
}

fn offered(tool: CompanionTool, agents: &[PersistentAgent]) -> bool {
    match tool {
        _ if agents.is_empty() => false,
        CompanionTool::Wait => agents
            .iter()
            .any(|agent| agent.mode == CompanionMode::Blocking),
        _ => true,
    }
}

/// The specs of the companion tools an agent with these persistent agents gets.
pub(crate) fn companion_specs(agents: &[PersistentAgent]) -> Vec<ToolSpec> {
    CompanionTool::ALL
        .into_iter()
        .filter(|tool| offered(*tool, agents))
        .map(|tool| ToolSpec {
            name: tool.name(),
            description: tool.description().into(),
            input_schema: tool.input_schema(agents),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(mode: CompanionMode) -> PersistentAgent {
        PersistentAgent {
            agent: "helper".into(),
            mode,
        }
    }

    #[test]
    fn wait_for_result_is_offered_only_when_some_companion_blocks() {
        let names = |agents: &[PersistentAgent]| -> Vec<String> {
            companion_specs(agents)
                .into_iter()
                .map(|spec| spec.name)
                .collect()
        };
        assert!(names(&[]).is_empty());
        let non_blocking = names(&[agent(CompanionMode::NonBlocking)]);
        assert_eq!(non_blocking.len(), 5);
        assert!(!non_blocking.contains(&"companion__waitForResult".to_string()));
        assert!(names(&[agent(CompanionMode::Blocking)])
            .contains(&"companion__waitForResult".to_string()));
        assert_eq!(
            CompanionTool::parse(
                "companion__waitForResult",
                &[agent(CompanionMode::NonBlocking)]
            ),
            None
        );
        assert_eq!(
            CompanionTool::parse("companion__listChildren", &[agent(CompanionMode::Blocking)]),
            Some(CompanionTool::List)
        );
    }
}
