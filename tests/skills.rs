//! Skills from a folder, through a real runtime: the catalog in the prompt the model sees,
//! `load_skill` and `read_skill_file` answering from disk, and `skill_loaded` in the stream.

mod common;

use std::sync::Arc;

use dormant::llm::{BoxFuture, LlmAdapter, LlmError, ModelRequest};
use dormant::skills::FsSkills;
use dormant::types::{ChunkKind, ToolOutcome};
use dormant::{
    AgentDefinition, ManualClock, Message, ModelReply, Runtime, ScriptedLlm, SessionId, ToolCall,
};
use parking_lot::Mutex;
use serde_json::json;

/// The scripted model, keeping every system prompt it was shown.
struct Prompts {
    scripted: ScriptedLlm,
    seen: Mutex<Vec<String>>,
}

impl LlmAdapter for Prompts {
    fn complete(&self, request: ModelRequest) -> BoxFuture<'static, Result<ModelReply, LlmError>> {
        self.seen.lock().push(request.system_prompt.clone());
        self.scripted.complete(request)
    }
}

/// A runtime whose model replays `script` for the agent `ops`, keeping the prompts it sees.
fn ops_runtime(
    agent: AgentDefinition,
    script: Vec<ModelReply>,
) -> anyhow::Result<(Arc<Prompts>, Runtime)> {
    let model = Arc::new(Prompts {
        scripted: ScriptedLlm::new().script("ops", script),
        seen: Mutex::default(),
    });
    let runtime = Runtime::builder()
        .store(common::temp_store()?)
        .llm(Arc::clone(&model) as Arc<dyn LlmAdapter>)
        .clock(Arc::new(ManualClock::new(0)))
        .background_deadlines(false)
        .agent(agent)
        .build()?;
    Ok((model, runtime))
}

fn write(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, text)?;
    Ok(())
}

#[tokio::test]
async fn an_agent_reads_its_skills_from_a_folder() -> anyhow::Result<()> {
    let root = tempfile::tempdir()?;
    write(
        &root.path().join("deploy-runbook/SKILL.md"),
        "---\nname: deploy-runbook\ndescription: >\n  How to deploy the service.\n  Use before any deploy.\nlicense: MIT\n---\n\n# Deploy\nRun the checks in references/checks.md.\n",
    )?;
    write(
        &root.path().join("deploy-runbook/references/checks.md"),
        "1. pipeline green\n2. no open incident\n3. tag the release\n",
    )?;
    write(
        &root.path().join("broken/SKILL.md"),
        "no front matter here\n",
    )?;

    let agent = AgentDefinition::builder("ops")
        .system_prompt("You run deploys.")
        .skills(FsSkills::new([root.path()]))
        .build()?;
    let script = vec![
        ModelReply::tool_calls(vec![ToolCall::new(
            "l1",
            "load_skill",
            json!({ "name": "deploy-runbook" }),
        )]),
        ModelReply::tool_calls(vec![ToolCall::new(
            "r1",
            "read_skill_file",
            json!({ "name": "deploy-runbook", "path": "references/checks.md", "start_line": 2, "end_line": 2 }),
        )]),
        ModelReply::text("deployed"),
    ];
    let (model, runtime) = ops_runtime(agent, script)?;
    let id: SessionId = "s1".parse()?;
    let outcome = runtime.execute_on(&id, "ops", "ship it").await?;
    assert_eq!(outcome.text.as_deref(), Some("deployed"));

    let prompts = model.seen.lock().clone();
    assert_eq!(prompts.len(), 3);
    assert!(
        prompts[0].starts_with("You run deploys.\n\n## Skills\n"),
        "{}",
        prompts[0]
    );
    assert!(prompts[0].contains(
        "<skill name=\"deploy-runbook\">How to deploy the service. Use before any deploy.</skill>"
    ));
    assert!(
        !prompts[0].contains("broken"),
        "a broken skill is skipped: {}",
        prompts[0]
    );
    assert!(
        prompts.iter().all(|prompt| prompt == &prompts[0]),
        "byte-stable across steps"
    );

    let results: Vec<(String, ToolOutcome)> = runtime
        .messages(&id)
        .await?
        .into_iter()
        .filter_map(|message| match message {
            Message::Tool {
                tool_call_id,
                outcome,
                ..
            } => Some((tool_call_id, outcome)),
            _ => None,
        })
        .collect();
    assert_eq!(
        results,
        vec![
            (
                "l1".to_string(),
                ToolOutcome::Result(json!(
                    "# Deploy\nRun the checks in references/checks.md.\n\nFiles of this skill (read one with read_skill_file):\n- references/checks.md\n"
                ))
            ),
            ("r1".to_string(), ToolOutcome::Result(json!("2. no open incident"))),
        ]
    );
    let loaded: Vec<String> = runtime
        .chunks(&id, 0)
        .await?
        .into_iter()
        .filter_map(|chunk| match chunk.kind {
            ChunkKind::SkillLoaded { name, .. } => Some(name),
            _ => None,
        })
        .collect();
    assert_eq!(loaded, ["deploy-runbook"]);
    Ok(())
}

/// Panics on every call.
struct Panicking;

impl dormant::skills::SkillProvider for Panicking {
    fn list(
        &self,
    ) -> BoxFuture<'static, Result<Vec<dormant::skills::SkillMetadata>, dormant::skills::Error>>
    {
        panic!("the skills backend is gone")
    }

    fn get(
        &self,
        _name: &str,
    ) -> BoxFuture<'static, Result<Option<dormant::skills::Skill>, dormant::skills::Error>> {
        panic!("the skills backend is gone")
    }

    fn read_resource(
        &self,
        _name: &str,
        _path: &str,
        _range: Option<dormant::skills::ReadRange>,
    ) -> BoxFuture<'static, Result<Option<String>, dormant::skills::Error>> {
        panic!("the skills backend is gone")
    }
}

#[tokio::test]
async fn a_provider_that_panics_leaves_the_prompt_without_skills_and_the_run_goes_on(
) -> anyhow::Result<()> {
    let agent = AgentDefinition::builder("ops")
        .system_prompt("You run deploys.")
        .skills(Panicking)
        .build()?;
    let script = vec![
        ModelReply::tool_calls(vec![ToolCall::new(
            "l1",
            "load_skill",
            json!({ "name": "anything" }),
        )]),
        ModelReply::text("carried on"),
    ];
    let (model, runtime) = ops_runtime(agent, script)?;
    let id: SessionId = "s1".parse()?;
    let outcome = runtime.execute_on(&id, "ops", "ship it").await?;
    assert_eq!(outcome.text.as_deref(), Some("carried on"));
    assert!(model
        .seen
        .lock()
        .iter()
        .all(|prompt| prompt == "You run deploys."));
    // The tool's panic is the tool's error, as any tool's.
    let messages = runtime.messages(&id).await?;
    let failed = messages.iter().any(|message| {
        matches!(message, Message::Tool { tool_call_id, outcome: ToolOutcome::Error(_), .. } if tool_call_id == "l1")
    });
    assert!(failed, "{messages:?}");
    Ok(())
}

/// Lists one skill on its first call and fails on every later one.
struct FailsAfterFirst {
    calls: std::sync::atomic::AtomicUsize,
}

impl dormant::skills::SkillProvider for FailsAfterFirst {
    fn list(
        &self,
    ) -> BoxFuture<'static, Result<Vec<dormant::skills::SkillMetadata>, dormant::skills::Error>>
    {
        let first = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        Box::pin(async move {
            if first {
                Ok(vec![dormant::skills::SkillMetadata::new(
                    "runbook",
                    "Operate the service.",
                )])
            } else {
                Err(dormant::skills::Error::TaskFailed {
                    message: "the disk went away".into(),
                })
            }
        })
    }

    fn get(
        &self,
        _name: &str,
    ) -> BoxFuture<'static, Result<Option<dormant::skills::Skill>, dormant::skills::Error>> {
        Box::pin(async { Ok(None) })
    }

    fn read_resource(
        &self,
        _name: &str,
        _path: &str,
        _range: Option<dormant::skills::ReadRange>,
    ) -> BoxFuture<'static, Result<Option<String>, dormant::skills::Error>> {
        Box::pin(async { Ok(None) })
    }
}

#[tokio::test]
async fn a_provider_that_fails_later_keeps_the_last_good_catalog_in_the_prompt(
) -> anyhow::Result<()> {
    let agent = AgentDefinition::builder("ops")
        .tool(dormant::ToolDefinition::server("noop", |_, _| async {
            Ok(json!(null))
        }))
        .skills(FailsAfterFirst {
            calls: Default::default(),
        })
        .build()?;
    let script = vec![
        ModelReply::tool_calls(vec![ToolCall::new("n1", "noop", json!({}))]),
        ModelReply::text("done"),
    ];
    let (model, runtime) = ops_runtime(agent, script)?;
    let outcome = runtime.execute_on(&"s1".parse()?, "ops", "go").await?;
    assert_eq!(outcome.text.as_deref(), Some("done"));
    let prompts = model.seen.lock().clone();
    assert_eq!(prompts.len(), 2);
    assert!(
        prompts[0].contains("<skill name=\"runbook\">"),
        "{}",
        prompts[0]
    );
    assert_eq!(
        prompts[1], prompts[0],
        "the failed listing kept the last good section"
    );
    Ok(())
}
