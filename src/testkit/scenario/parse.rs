//! Reading a scenario file strictly: serde refuses unknown fields, then the cross-field rules
//! serde cannot express (which tool fields fit which kind, which expectations need a session,
//! which agents and tools the file defines). Every error names the file and the JSON path.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::Error;
use super::format::{
    AgentSpec, CheckpointStep, ClockStep, ConfigSpec, CrashStep, DefineStep, ExecuteStep, Expect,
    FileSpec, ForkStep, OnCutSpec, RestartStep, SessionStep, SubmitStep, ToolKindSpec,
};
use super::step::{EvictTarget, Op, Step, OP_NAMES};
use super::unique_keys::UniqueKeys;
use crate::types::ids::SessionId;

/// A scenario file, parsed and checked: agents with their scripts, and steps with what they
/// expect. Run it with [`run`](super::run()).
///
/// ```
/// use dormant::testkit::scenario::Scenario;
///
/// let scenario = Scenario::from_json("inline.json", r#"{
///     "name": "greets",
///     "agents": [ { "name": "greeter", "script": [ { "text": "Hello!" } ] } ],
///     "steps": [ { "op": "execute", "agent": "greeter", "session": "s1", "message": "hi",
///                  "expect": { "status": "completed", "text": "Hello!" } } ]
/// }"#)?;
/// assert_eq!((scenario.name(), scenario.step_count()), ("greets", 1));
///
/// let typo = Scenario::from_json("typo.json", r#"{ "steps": [ { "op": "check",
///     "session": "s1", "expect": { "stauts": "completed" } } ] }"#);
/// assert!(typo.unwrap_err().to_string().starts_with("typo.json: steps[0].expect.stauts:"));
/// # Ok::<(), dormant::testkit::scenario::Error>(())
/// ```
#[derive(Debug)]
pub struct Scenario {
    file: PathBuf,
    name: String,
    pub(crate) config: ConfigSpec,
    pub(crate) agents: Vec<AgentSpec>,
    pub(crate) steps: Vec<Step>,
}

impl Scenario {
    /// Reads and parses the file at `path`.
    ///
    /// # Errors
    /// [`Error::Read`] if the file cannot be read, [`Error::Format`] as for
    /// [`Scenario::from_json`].
    pub fn load(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            file: path.to_path_buf(),
            source,
        })?;
        Self::from_json(path, &text)
    }

    /// Parses `text` as the scenario file `file` (the name is used in messages and as the
    /// default scenario name).
    ///
    /// # Errors
    /// [`Error::Format`] naming the JSON path: invalid JSON, an unknown field or op, a value of
    /// the wrong type, a field that does not fit (a `timeout_ms` on a server tool, a `status`
    /// expected of a `restart`), or an agent or tool the file does not define.
    pub fn from_json(file: impl Into<PathBuf>, text: &str) -> Result<Self, Error> {
        Parser { file: file.into() }.scenario(text)
    }

    /// The scenario's name (its `name`, or the file's stem).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file it was read from.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// How many steps it has.
    pub fn step_count(&self) -> usize {
        self.steps.len()
    }
}

struct Parser {
    file: PathBuf,
}

impl Parser {
    fn scenario(self, text: &str) -> Result<Scenario, Error> {
        let mut de = serde_json::Deserializer::from_str(text);
        let spec: FileSpec = serde_path_to_error::deserialize(&mut de)
            .map_err(|error| self.error(&join("", error.path()), error.inner()))?;
        de.end().map_err(|error| self.error(".", error))?;
        // The file is valid JSON by now; serde_json kept the last of two equal keys.
        serde_path_to_error::deserialize::<_, UniqueKeys>(&mut serde_json::Deserializer::from_str(
            text,
        ))
        .map_err(|error| self.error(&join("", error.path()), error.inner()))?;
        for (index, agent) in spec.agents.iter().enumerate() {
            self.agent(&format!("agents[{index}]"), agent)?;
        }
        let steps = spec
            .steps
            .into_iter()
            .enumerate()
            .map(|(index, value)| self.step(index, value))
            .collect::<Result<Vec<_>, _>>()?;
        self.references(&spec.agents, &steps)?;
        let name = spec.name.unwrap_or_else(|| {
            self.file
                .file_stem()
                .map_or_else(String::new, |stem| stem.to_string_lossy().into_owned())
        });
        Ok(Scenario {
            file: self.file,
            name,
            config: spec.config,
            agents: spec.agents,
            steps,
        })
    }

    fn step(&self, index: usize, value: Value) -> Result<Step, Error> {
        let path = format!("steps[{index}]");
        let Value::Object(mut fields) = value else {
            return Err(self.error(&path, "a step must be an object with an `op`"));
        };
        let op = match fields.remove("op") {
            Some(Value::String(op)) => op,
            Some(other) => {
                return Err(self.error(
                    &format!("{path}.op"),
                    format!("expected a string, got {other}"),
                ))
            }
            None => return Err(self.error(&path, "missing field `op`")),
        };
        let rest = Value::Object(fields);
        let (op, expect) = match op.as_str() {
            "define" => {
                let step: DefineStep = self.read(&path, rest)?;
                self.agent(&format!("{path}.agent"), &step.agent)?;
                (Op::Define(Box::new(step.agent)), step.expect)
            }
            "execute" => {
                let step: ExecuteStep = self.read(&path, rest)?;
                let session = self.session(&path, &step.session)?;
                let op = Op::Execute {
                    agent: step.agent,
                    session,
                    message: step.message,
                };
                (op, step.expect)
            }
            "submit" => {
                let step: SubmitStep = self.read(&path, rest)?;
                self.submit(&path, &step)?;
                // An invalid id is a legitimate test of `invalid_request`, not a file error.
                let raw_session = step
                    .raw
                    .as_ref()
                    .and_then(|raw| raw.get("session_id"))
                    .and_then(Value::as_str);
                let session = step
                    .session
                    .as_deref()
                    .or(raw_session)
                    .and_then(|id| id.parse().ok());
                let expect = step.expect.clone();
                let op = Op::Submit {
                    session,
                    submit: Box::new(step),
                };
                (op, expect)
            }
            "resume" | "interrupt" | "abort" | "evict" | "check" => {
                let step: SessionStep = self.read(&path, rest)?;
                let op = if op == "evict" && step.session == "all" {
                    Op::Evict(EvictTarget::All)
                } else {
                    let session = self.session(&path, &step.session)?;
                    match op.as_str() {
                        "resume" => Op::Resume(session),
                        "interrupt" => Op::Interrupt(session),
                        "abort" => Op::Abort(session),
                        "evict" => Op::Evict(EvictTarget::Session(session)),
                        _ => Op::Check(session),
                    }
                };
                (op, step.expect)
            }
            "checkpoints" | "state_at" => {
                let step: CheckpointStep = self.read(&path, rest)?;
                let session = self.session(&path, &step.session)?;
                let op = match (op.as_str(), step.checkpoint) {
                    ("checkpoints", None) => Op::Checkpoints(session),
                    ("state_at", Some(checkpoint)) => Op::StateAt {
                        session,
                        checkpoint,
                    },
                    ("checkpoints", Some(_)) => {
                        return Err(self.error(
                            &format!("{path}.checkpoint"),
                            "`checkpoints` lists them all and takes no `checkpoint`",
                        ))
                    }
                    _ => return Err(self.error(&path, "missing field `checkpoint`")),
                };
                (op, step.expect)
            }
            "fork" => {
                let step: ForkStep = self.read(&path, rest)?;
                let source = self.session(&path, &step.session)?;
                let fork = step
                    .fork
                    .parse()
                    .map_err(|error| self.error(&format!("{path}.fork"), error))?;
                let mut answers = Vec::new();
                for (call, spec) in step.answers {
                    let answer = crate::types::ForkAnswer::from_fields(
                        spec.result,
                        spec.error,
                        spec.approved,
                        spec.reason,
                    )
                    .ok_or_else(|| {
                        self.error(
                            &format!("{path}.answers.{call}"),
                            "expected exactly one of `result`, `error` or `approved`",
                        )
                    })?;
                    answers.push((call, answer));
                }
                let op = Op::Fork {
                    source,
                    checkpoint: step.checkpoint,
                    fork,
                    message: step.message,
                    edit_message: step.edit_message,
                    answers,
                };
                (op, step.expect)
            }
            "advance_clock" => {
                let step: ClockStep = self.read(&path, rest)?;
                (Op::AdvanceClock { ms: step.ms }, step.expect)
            }
            "restart" => {
                let step: RestartStep = self.read(&path, rest)?;
                (Op::Restart, step.expect)
            }
            "crash_before" => {
                let step: CrashStep = self.read(&path, rest)?;
                (
                    Op::CrashBefore {
                        commit: step.commit,
                    },
                    step.expect,
                )
            }
            other => {
                return Err(self.error(
                    &format!("{path}.op"),
                    format!(
                        "unknown op `{other}`, expected one of {}",
                        OP_NAMES.join(", ")
                    ),
                ))
            }
        };
        self.expect(&format!("{path}.expect"), &op, &expect)?;
        Ok(Step { op, expect })
    }

    /// Reads a step's own struct, keeping the JSON path inside it.
    fn read<T: DeserializeOwned>(&self, path: &str, value: Value) -> Result<T, Error> {
        serde_path_to_error::deserialize(value)
            .map_err(|error| self.error(&join(path, error.path()), error.inner()))
    }

    fn session(&self, path: &str, id: &str) -> Result<SessionId, Error> {
        id.parse()
            .map_err(|error| self.error(&format!("{path}.session"), error))
    }

    /// A submit builds its envelope from `session`, `tool_call` and the answer's fields, or
    /// sends `raw` whole; it does not mix the two.
    fn submit(&self, path: &str, step: &SubmitStep) -> Result<(), Error> {
        if step.raw.is_some() {
            let envelope_fields = [
                ("tool_call", step.tool_call.is_some()),
                ("result", step.result.is_some()),
                ("error", step.error.is_some()),
                ("kind", step.kind.is_some()),
                ("approved", step.approved.is_some()),
                ("reason", step.reason.is_some()),
                ("approval_id", step.approval_id.is_some()),
                ("edited_input", step.edited_input.is_some()),
                ("binding", step.binding.is_some()),
                ("happened", step.happened.is_some()),
            ];
            if let Some((field, _)) = envelope_fields.iter().find(|(_, given)| *given) {
                return Err(self.error(
                    &format!("{path}.{field}"),
                    format!(
                        "`raw` is the whole envelope, so `{field}` does not apply \
                         (only `session`, naming the session the expectations look at)"
                    ),
                ));
            }
            return Ok(());
        }
        if step.session.is_none() || step.tool_call.is_none() {
            return Err(self.error(
                path,
                "a submit needs `session` and `tool_call` (or a `raw` envelope)",
            ));
        }
        Ok(())
    }

    /// The rules of an agent that serde cannot express.
    fn agent(&self, path: &str, agent: &AgentSpec) -> Result<(), Error> {
        for (index, tool) in agent.tools.iter().enumerate() {
            let path = format!("{path}.tools[{index}]");
            let given = [
                ("result", tool.result.is_some()),
                ("error", tool.error.is_some()),
                ("timeout_ms", tool.timeout_ms.is_some()),
                ("output_schema", tool.output_schema.is_some()),
                ("agent", tool.agent.is_some()),
                ("on_cut", tool.on_cut.is_some()),
                ("check", tool.check.is_some()),
            ];
            let (kind, allowed): (&str, &[&str]) = match tool.kind {
                ToolKindSpec::Server => ("server", &["result", "error", "on_cut", "check"]),
                ToolKindSpec::Client => ("client", &["timeout_ms", "output_schema"]),
                ToolKindSpec::SubAgent => ("sub_agent", &["agent"]),
            };
            if let Some((field, _)) = given.iter().find(|(f, set)| *set && !allowed.contains(f)) {
                return Err(self.error(
                    &format!("{path}.{field}"),
                    format!("`{field}` does not apply to a {kind} tool"),
                ));
            }
            if tool.result.is_some() && tool.error.is_some() {
                return Err(self.error(
                    &path,
                    "a server tool has a fixed `result` or an `error`, not both",
                ));
            }
            if tool.check.is_some() && tool.on_cut != Some(OnCutSpec::Reconcile) {
                return Err(self.error(
                    &format!("{path}.check"),
                    "a `check` settles reconcile calls: it needs `on_cut: reconcile`",
                ));
            }
            if tool.kind == ToolKindSpec::SubAgent && tool.agent.is_none() {
                return Err(self.error(&path, "a sub_agent tool needs `agent`"));
            }
        }
        for (index, entry) in agent.script.iter().enumerate() {
            let path = format!("{path}.script[{index}]");
            if entry.text.is_none() && entry.tool_calls.is_none() && entry.finish.is_none() {
                return Err(self.error(
                    &path,
                    "a script entry needs `text`, `tool_calls` or `finish`",
                ));
            }
            if entry.finish.is_some() && agent.output_schema.is_none() {
                return Err(self.error(
                    &format!("{path}.finish"),
                    "`finish` calls __finish__, which only an agent with an `output_schema` has",
                ));
            }
        }
        Ok(())
    }

    /// Expectations that do not fit the op.
    fn expect(&self, path: &str, op: &Op, expect: &Expect) -> Result<(), Error> {
        let about_session = [
            ("status", expect.status.is_some()),
            ("pending", expect.pending.is_some()),
            ("text", expect.text.is_some()),
            ("output", expect.output.is_some()),
            ("tool_results", expect.tool_results.is_some()),
            ("runs", expect.runs.is_some()),
            ("events", expect.events.is_some()),
            ("hooks", expect.hooks.is_some()),
            ("companions", expect.companions.is_some()),
            ("usage", expect.usage.is_some()),
            ("prompt_contains", expect.prompt_contains.is_some()),
            ("prompt_excludes", expect.prompt_excludes.is_some()),
        ];
        if op.session().is_none() {
            if let Some((key, _)) = about_session.iter().find(|(_, given)| *given) {
                return Err(self.error(
                    &format!("{path}.{key}"),
                    format!(
                        "`{key}` looks at a session, and this {} step names none",
                        op.name()
                    ),
                ));
            }
        }
        if expect.checkpoints.is_some() && !matches!(op, Op::Checkpoints(_)) {
            return Err(self.error(
                &format!("{path}.checkpoints"),
                "only a checkpoints step counts checkpoints",
            ));
        }
        if expect.state.is_some() && !matches!(op, Op::StateAt { .. }) {
            return Err(self.error(
                &format!("{path}.state"),
                "only a state_at step reads the state at a checkpoint",
            ));
        }
        if expect.submit.is_some() && !matches!(op, Op::Submit { .. }) {
            return Err(self.error(
                &format!("{path}.submit"),
                "only a submit step has a submit outcome",
            ));
        }
        for (id, result) in expect.tool_results.iter().flatten() {
            if result.result.is_some() == result.error.is_some() {
                return Err(self.error(
                    &format!("{path}.tool_results.{id}"),
                    "expected exactly one of `result` or `error`",
                ));
            }
        }
        Ok(())
    }

    /// Agents that `execute` names and tools that `invocations` counts must be defined in the
    /// file (at the top or by a `define` step), so that a typo is not a silent pass. An
    /// `execute` that expects `unknown_agent` tests exactly that refusal and may name anything.
    fn references(&self, agents: &[AgentSpec], steps: &[Step]) -> Result<(), Error> {
        let defined: Vec<&AgentSpec> = agents
            .iter()
            .chain(steps.iter().filter_map(|step| match &step.op {
                Op::Define(agent) => Some(agent.as_ref()),
                _ => None,
            }))
            .collect();
        let agent_names: BTreeSet<&str> = defined.iter().map(|agent| agent.name.as_str()).collect();
        let server_tools: BTreeSet<&str> = defined
            .iter()
            .flat_map(|agent| &agent.tools)
            .filter(|tool| tool.kind == ToolKindSpec::Server)
            .map(|tool| tool.name.as_str())
            .collect();
        for (index, step) in steps.iter().enumerate() {
            if let Op::Execute { agent, .. } = &step.op {
                if !agent_names.contains(agent.as_str())
                    && step.expect.error.as_deref() != Some("unknown_agent")
                {
                    return Err(self.error(
                        &format!("steps[{index}].agent"),
                        format!(
                            "unknown agent `{agent}` (the file defines: {}); expect the error \
                             `unknown_agent` to test the refusal",
                            agent_names.iter().copied().collect::<Vec<_>>().join(", ")
                        ),
                    ));
                }
            }
            for name in step
                .expect
                .invocations
                .iter()
                .flat_map(|counts| counts.keys())
            {
                if !server_tools.contains(name.as_str()) {
                    return Err(self.error(
                        &format!("steps[{index}].expect.invocations.{name}"),
                        format!("unknown tool `{name}`: no agent of the file has a server tool of that name"),
                    ));
                }
            }
        }
        Ok(())
    }

    fn error(&self, path: &str, message: impl std::fmt::Display) -> Error {
        Error::Format {
            file: self.file.clone(),
            path: if path.is_empty() {
                ".".into()
            } else {
                path.into()
            },
            message: message.to_string(),
        }
    }
}

/// `prefix` followed by a path found inside it (`steps[2]` + `expect.stauts`).
fn join(prefix: &str, inner: &serde_path_to_error::Path) -> String {
    let inner = inner.to_string();
    match (prefix.is_empty(), inner.as_str()) {
        (_, ".") => prefix.to_string(),
        (true, _) => inner,
        (false, _) if inner.starts_with('[') => format!("{prefix}{inner}"),
        (false, _) => format!("{prefix}.{inner}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format_error(text: &str) -> (String, String) {
        match Scenario::from_json("t.json", text) {
            Err(Error::Format { path, message, .. }) => (path, message),
            other => panic!("expected a format error, got {other:?}"),
        }
    }

    const AGENT: &str = r#""agents": [ { "name": "a", "script": [ { "text": "ok" } ],
        "tools": [ { "name": "t", "result": 1 } ] } ]"#;

    #[test]
    fn a_key_given_twice_in_a_step_is_refused_with_its_path() {
        let (path, message) = format_error(&format!(
            r#"{{ {AGENT}, "steps": [ {{ "op": "execute", "agent": "a", "session": "s",
               "message": "m", "expect": {{ "status": "failed", "status": "completed" }} }} ] }}"#
        ));
        assert_eq!(path, "steps[0].expect");
        assert!(message.contains("`status` appears twice"), "{message}");
        let (path, message) = format_error(&format!(
            r#"{{ {AGENT}, "steps": [ {{ "op": "execute", "agent": "a", "session": "s",
               "message": "m", "expect": {{ "status": "failed" }}, "expect": {{}} }} ] }}"#
        ));
        assert_eq!(path, "steps[0]");
        assert!(message.contains("`expect` appears twice"), "{message}");
    }

    #[test]
    fn an_unknown_expectation_field_names_its_json_path() {
        let (path, message) = format_error(&format!(
            r#"{{ {AGENT}, "steps": [ {{ "op": "execute", "agent": "a", "session": "s",
               "message": "m", "expect": {{ "stauts": "completed" }} }} ] }}"#
        ));
        assert_eq!(path, "steps[0].expect.stauts");
        assert!(message.contains("unknown field `stauts`"), "{message}");
    }

    #[test]
    fn an_unknown_field_of_a_tool_names_its_json_path() {
        let (path, message) = format_error(
            r#"{ "agents": [ { "name": "a", "tools": [ { "name": "t", "reslt": 1 } ] } ],
                 "steps": [] }"#,
        );
        assert_eq!(path, "agents[0].tools[0].reslt");
        assert!(message.contains("unknown field"), "{message}");
    }

    #[test]
    fn an_unknown_top_level_field_is_an_error() {
        let (path, _) = format_error(r#"{ "steps": [], "agentz": [] }"#);
        assert_eq!(path, "agentz");
    }

    #[test]
    fn an_unknown_op_is_an_error_listing_the_ops() {
        let (path, message) = format_error(r#"{ "steps": [ { "op": "exekute" } ] }"#);
        assert_eq!(path, "steps[0].op");
        assert!(message.contains("unknown op `exekute`"), "{message}");
        assert!(message.contains("crash_before"), "{message}");
    }

    #[test]
    fn a_field_of_another_op_is_an_error() {
        let (path, _) = format_error(r#"{ "steps": [ { "op": "restart", "session": "s" } ] }"#);
        assert_eq!(path, "steps[0].session");
    }

    #[test]
    fn a_malformed_file_names_the_file_and_the_position() {
        let error = Scenario::from_json("broken.json", r#"{ "steps": [ { "op": "check", } ] }"#)
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("broken.json: "), "{error}");
        assert!(error.contains("line 1"), "{error}");
        let trailing = Scenario::from_json("trail.json", r#"{ "steps": [] } x"#).unwrap_err();
        assert!(
            trailing.to_string().starts_with("trail.json: "),
            "{trailing}"
        );
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_path() {
        let (path, _) = format_error(r#"{ "steps": [ { "op": "advance_clock", "ms": -5 } ] }"#);
        assert_eq!(path, "steps[0].ms");
        let (path, _) = format_error(
            r#"{ "steps": [ { "op": "check", "session": "s", "expect": { "status": "done" } } ] }"#,
        );
        assert_eq!(path, "steps[0].expect.status");
    }

    #[test]
    fn expectations_about_a_session_need_a_session() {
        let (path, _) =
            format_error(r#"{ "steps": [ { "op": "restart", "expect": { "runs": 1 } } ] }"#);
        assert_eq!(path, "steps[0].expect.runs");
    }

    #[test]
    fn an_unknown_agent_is_an_error_unless_it_is_the_test() {
        let step = |expect: &str| {
            format!(
                r#"{{ {AGENT}, "steps": [ {{ "op": "execute", "agent": "ghost", "session": "s",
                   "message": "m", "expect": {expect} }} ] }}"#
            )
        };
        let (path, message) = format_error(&step("{}"));
        assert_eq!(path, "steps[0].agent");
        assert!(message.contains("unknown agent `ghost`"), "{message}");
        assert!(Scenario::from_json("t.json", &step(r#"{ "error": "unknown_agent" }"#)).is_ok());
    }

    #[test]
    fn an_unknown_tool_in_invocations_is_an_error() {
        let (path, _) = format_error(&format!(
            r#"{{ {AGENT}, "steps": [ {{ "op": "check", "session": "s",
               "expect": {{ "invocations": {{ "nope": 1 }} }} }} ] }}"#
        ));
        assert_eq!(path, "steps[0].expect.invocations.nope");
    }

    #[test]
    fn tool_fields_must_fit_the_kind() {
        let (path, _) = format_error(
            r#"{ "agents": [ { "name": "a", "tools": [
                 { "name": "c", "kind": "client", "result": 1 } ] } ], "steps": [] }"#,
        );
        assert_eq!(path, "agents[0].tools[0].result");
        let (path, _) = format_error(
            r#"{ "agents": [ { "name": "a", "tools": [
                 { "name": "s", "result": 1, "error": "x" } ] } ], "steps": [] }"#,
        );
        assert_eq!(path, "agents[0].tools[0]");
    }

    #[test]
    fn finish_needs_an_output_schema() {
        let (path, _) = format_error(
            r#"{ "agents": [ { "name": "a", "script": [ { "finish": 1 } ] } ], "steps": [] }"#,
        );
        assert_eq!(path, "agents[0].script[0].finish");
    }

    #[test]
    fn the_example_of_the_spec_parses_whole() {
        let text = r#"{
          "name": "client tool suspends and resumes",
          "config": { "client_tool_timeout_ms": 300000, "tombstone_retention_ms": 86400000,
                      "max_result_bytes": 1048576, "auto_resume": false,
                      "idle_after_ms": null, "max_resident": null },
          "agents": [
            { "name": "researcher", "script": [ { "text": "found" } ] },
            { "name": "editor", "max_steps": 10, "client_tool_timeout_ms": 60000,
              "output_schema": null,
              "tools": [
                { "name": "editContent", "kind": "client", "timeout_ms": 30000,
                  "output_schema": { "type": "object" } },
                { "name": "getIssue", "kind": "server", "safe_to_retry": true, "result": { "title": "t" } },
                { "name": "explode", "kind": "server", "error": "boom" },
                { "name": "deploy", "kind": "server", "require_approval": true, "result": { "ok": true } },
                { "name": "research", "kind": "sub_agent", "agent": "researcher" },
                { "name": "ship", "finish_with": true }
              ],
              "script": [
                { "tool_calls": [ { "id": "tc-1", "name": "editContent", "input": { "edits": [] } } ] },
                { "text": "All done." }
              ] } ],
          "steps": [
            { "op": "execute", "agent": "editor", "session": "s1", "message": "edit it",
              "expect": { "status": "suspended_client_tool", "pending": ["tc-1"] } },
            { "op": "submit", "session": "s1", "tool_call": "tc-1", "result": { "applied": 1 },
              "expect": { "submit": "accepted" } },
            { "op": "submit", "session": "s1", "tool_call": "tc-9", "kind": "approval-response",
              "approved": false, "reason": "not now", "approval_id": "auto" },
            { "op": "submit", "raw": { "kind": "client-tool-result" },
              "expect": { "submit": "invalid_request" } },
            { "op": "resume", "session": "s1",
              "expect": { "status": "completed", "text": "All done.", "output": null,
                          "tool_results": { "tc-1": { "result": { "applied": 1 } } },
                          "invocations": { "getIssue": 0 }, "runs": 2,
                          "events": ["run_start", "run_suspended", "run_end"],
                          "hooks": ["on_agent_resumed", "after_tool"] } },
            { "op": "interrupt", "session": "s1" },
            { "op": "abort", "session": "s1", "expect": { "error": "aborted" } },
            { "op": "advance_clock", "ms": 1000 },
            { "op": "evict", "session": "all" },
            { "op": "evict", "session": "s1" },
            { "op": "crash_before", "commit": "tool_results" },
            { "op": "restart" },
            { "op": "define", "agent": { "name": "bad", "tools": [ { "name": "__finish__" } ] },
              "expect": { "error": "reserved_finish_name" } },
            { "op": "check", "session": "s1", "expect": { "status": "failed" } },
            { "op": "checkpoints", "session": "s1", "expect": { "checkpoints": 3 } },
            { "op": "state_at", "session": "s1", "checkpoint": { "status": "running" },
              "expect": { "state": { "status": "running", "messages": 1, "open_calls": [] } } },
            { "op": "fork", "session": "s1", "checkpoint": "last", "fork": "f1",
              "edit_message": "again", "expect": { "status": "completed" } }
          ]
        }"#;
        let scenario = Scenario::from_json("spec.json", text).unwrap();
        assert_eq!(scenario.name(), "client tool suspends and resumes");
        assert_eq!(scenario.step_count(), 17);
        let ops: Vec<&str> = scenario.steps.iter().map(|step| step.op.name()).collect();
        assert_eq!(ops.len(), 17);
        assert!(OP_NAMES.iter().all(|op| ops.contains(op)), "{ops:?}");
    }
}
