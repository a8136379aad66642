//! Bad input gets a typed error that names what was wrong, and changes nothing.

mod common;

use std::sync::Arc;

use dormant::definition::DefinitionError;
use dormant::store::schema;
use dormant::store::Store;
use dormant::store::{Batch, CommitKind, Tree};
use dormant::{
    AgentDefinition, Approval, BuildError, Error, ReadError, Runtime, SessionId, ToolDefinition,
    ToolError,
};
use serde_json::json;

fn server(name: &str) -> ToolDefinition {
    ToolDefinition::server(name, |_input, _ctx| async {
        Ok::<_, ToolError>(json!(null))
    })
}

#[test]
fn every_definition_rule_has_its_own_refusal() {
    let build = |tool: ToolDefinition| AgentDefinition::builder("a").tool(tool).build();
    assert!(matches!(
        build(server("subagent__x")),
        Err(DefinitionError::ReservedPrefix {
            prefix: "subagent__",
            ..
        })
    ));
    assert!(matches!(
        build(server("companion__x")),
        Err(DefinitionError::ReservedPrefix {
            prefix: "companion__",
            ..
        })
    ));
    assert!(matches!(
        build(server("__finish__")),
        Err(DefinitionError::ReservedFinishName { .. })
    ));
    assert!(matches!(
        build(ToolDefinition::client("edit").require_approval(Approval::Always)),
        Err(DefinitionError::ClientWithApproval { .. })
    ));
    assert!(matches!(
        build(ToolDefinition::client("edit").finish_with(true)),
        Err(DefinitionError::ClientWithFinish { .. })
    ));
    assert!(matches!(
        build(ToolDefinition::sub_agent("ask", "b").finish_with(true)),
        Err(DefinitionError::SubAgentWithFlags { .. })
    ));
    assert!(matches!(
        build(server("")),
        Err(DefinitionError::EmptyToolName { .. })
    ));
    assert!(matches!(
        build(server("t").input_schema(json!({ "type": 12 }))),
        Err(DefinitionError::InvalidSchema { which: "input", .. })
    ));
    assert!(matches!(
        AgentDefinition::builder("a").tool(server("t")).tool(server("t")).build(),
        Err(DefinitionError::DuplicateTool { tool, .. }) if tool == "t"
    ));
    assert!(matches!(
        AgentDefinition::builder("a").max_steps(0).build(),
        Err(DefinitionError::ZeroMaxSteps { .. })
    ));
    assert!(matches!(
        AgentDefinition::builder("").build(),
        Err(DefinitionError::EmptyAgentName)
    ));
    let message = build(server("subagent__x"))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("subagent__x") && message.contains("reserved"),
        "{message}"
    );
}

/// An agent set `build` refuses is a `BuildError` with the message a refused `define` gives.
#[tokio::test]
async fn a_duplicate_agent_at_build_is_a_build_error_with_the_message_define_gives(
) -> anyhow::Result<()> {
    let refused = Runtime::builder()
        .store(common::temp_store()?)
        .agent(AgentDefinition::builder("a").build()?)
        .agent(AgentDefinition::builder("a").build()?)
        .build();
    match refused {
        Err(error @ BuildError::InvalidDefinition(DefinitionError::DuplicateAgent { .. })) => {
            assert_eq!(
                error.to_string(),
                "invalid definition: an agent named a is already defined"
            );
            assert_eq!(error.code(), "invalid_definition");
        }
        other => anyhow::bail!("expected a duplicate agent, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn runtime_refuses_duplicate_agents_and_unknown_sub_agents() -> anyhow::Result<()> {
    let runtime = Runtime::builder()
        .store(common::temp_store()?)
        .agent(AgentDefinition::builder("a").build()?)
        .build()?;
    let duplicate = runtime.define(AgentDefinition::builder("a").build()?);
    assert!(matches!(
        duplicate,
        Err(Error::InvalidDefinition(
            DefinitionError::DuplicateAgent { .. }
        ))
    ));
    let orphan = AgentDefinition::builder("b")
        .tool(ToolDefinition::sub_agent("ask", "nobody"))
        .build()?;
    assert!(matches!(
        runtime.define(orphan),
        Err(Error::InvalidDefinition(
            DefinitionError::UnknownSubAgent { .. }
        ))
    ));
    assert_eq!(
        Error::from(DefinitionError::EmptyAgentName).code(),
        "invalid_definition"
    );
    Ok(())
}

#[test]
fn malformed_session_ids_are_refused() {
    assert!("".parse::<SessionId>().is_err());
    assert!("a\nb".parse::<SessionId>().is_err());
    assert!("x".repeat(513).parse::<SessionId>().is_err());
}

async fn put_raw_snapshot(store: &Arc<dyn Store>, id: &str, bytes: Vec<u8>) -> anyhow::Result<()> {
    let mut batch = Batch::new(CommitKind::Other);
    batch.put(Tree::Sessions, id.as_bytes().to_vec(), bytes);
    store.commit(batch).await?;
    Ok(())
}

#[tokio::test]
async fn corrupt_and_future_snapshots_are_typed_errors_naming_the_session() -> anyhow::Result<()> {
    let store = common::temp_store()?;
    put_raw_snapshot(&store, "garbled", vec![schema::FORMAT_VERSION, 0xc1, 0xff]).await?;
    put_raw_snapshot(
        &store,
        "from-the-future",
        vec![schema::FORMAT_VERSION + 8, 0x80],
    )
    .await?;
    let runtime = Runtime::builder()
        .store(Arc::clone(&store))
        .agent(AgentDefinition::builder("a").build()?)
        .build()?;
    let garbled: SessionId = "garbled".parse()?;
    let future: SessionId = "from-the-future".parse()?;
    match runtime.status(&garbled).await {
        Err(ReadError::Schema(schema::Error::Corrupt { session, .. })) => {
            assert_eq!(session, garbled)
        }
        other => anyhow::bail!("expected Corrupt, got {other:?}"),
    }
    match runtime.execute_on(&future, "a", "hi").await {
        Err(error @ Error::Schema(schema::Error::UnsupportedVersion { .. })) => {
            assert!(error.to_string().contains("from-the-future"), "{error}");
            assert_eq!(error.code(), "unsupported_version");
        }
        other => anyhow::bail!("expected UnsupportedVersion, got {other:?}"),
    }
    match runtime.execute_on(&garbled, "a", "hi").await {
        Err(Error::Schema(schema::Error::Corrupt { session, .. })) => assert_eq!(session, garbled),
        other => anyhow::bail!("expected Corrupt, got {other:?}"),
    }
    // Nothing was written over the unreadable snapshots, and other sessions still work.
    assert_eq!(
        store.get(Tree::Sessions, b"garbled").await?,
        Some(vec![schema::FORMAT_VERSION, 0xc1, 0xff])
    );
    let fine = runtime.execute("a", "hi").await?;
    assert_eq!(
        fine.error.map(|e| e.code.as_str()),
        Some("script_exhausted")
    );
    Ok(())
}

#[tokio::test]
async fn a_second_execute_while_running_is_refused_with_already_running() -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let release = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(tokio::sync::Notify::new());
    let entered = Arc::new(AtomicBool::new(false));
    let (gate, signal, flag) = (release.clone(), started.clone(), entered.clone());
    let agent = AgentDefinition::builder("slow")
        .tool(ToolDefinition::server("wait", move |_input, _ctx| {
            let (gate, signal, flag) = (gate.clone(), signal.clone(), flag.clone());
            async move {
                flag.store(true, Ordering::SeqCst);
                signal.notify_one();
                gate.notified().await;
                Ok::<_, ToolError>(json!("released"))
            }
        }))
        .build()?;
    let llm = dormant::ScriptedLlm::new().script("slow", common::tool_script("wait", 1));
    let runtime = Runtime::builder()
        .store(common::temp_store()?)
        .llm(Arc::new(llm))
        .agent(agent)
        .build()?;
    let id: SessionId = "busy".parse()?;
    let first = tokio::spawn({
        let runtime = runtime.clone();
        let id = id.clone();
        async move { runtime.execute_on(&id, "slow", "go").await }
    });
    started.notified().await;
    assert!(entered.load(Ordering::SeqCst));
    let second = runtime.execute_on(&id, "slow", "again").await;
    assert!(
        matches!(second, Err(Error::AlreadyRunning(ref s)) if *s == id),
        "{second:?}"
    );
    // A running session refuses eviction rather than losing its run.
    runtime.evict(&id).await;
    assert!(runtime.is_resident(&id));
    release.notify_one();
    let outcome = first.await??;
    assert_eq!(outcome.text.as_deref(), Some("done"));
    assert_eq!(runtime.runs(&id).await?.len(), 1);
    Ok(())
}
