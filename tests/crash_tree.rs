//! A process killed with SIGKILL while a tree of sessions is in flight: roots waiting on
//! children, children waiting on a browser, answers being submitted and resumes cascading.
//! After reopening the store no acknowledged answer is lost and no non-retryable handler has
//! run twice: every handler appends its call id to a file, which both processes share.
//!
//! The child is this same test binary, re-run with `--ignored --exact tree_child`.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dormant::types::ToolOutcome;
use dormant::{
    AgentDefinition, ManualClock, ModelReply, Runtime, ScriptedLlm, SessionId, SledStore, Status,
    ToolCall, ToolDefinition, ToolError,
};
use dormant::{Submit, SubmitOutcome};
use serde_json::{json, Value};

const STORE_ENV: &str = "DORMANT_TREE_CHILD_STORE";
const ROOTS: usize = 8;
const CHILDREN: usize = 2;

/// A non-retryable server tool that appends its call id to `log`.
fn logged_tool(name: &str, log: PathBuf) -> ToolDefinition {
    ToolDefinition::server(name, move |_input: Value, ctx| {
        let log = log.clone();
        async move {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .map_err(|error| ToolError::new(error.to_string()))?;
            // One write per line: `writeln!` on a `File` may split it into two writes, and
            // two handlers appending at once would then interleave their lines.
            let line = format!("{}\n", ctx.tool_call_id());
            file.write_all(line.as_bytes())
                .map_err(|e| ToolError::new(e.to_string()))?;
            Ok::<_, ToolError>(json!({ "ok": true }))
        }
    })
}

fn root_id(root: usize) -> String {
    format!("r{root}")
}

fn child_call(root: usize, child: usize, what: &str) -> String {
    format!("{what}-r{root}-w{child}")
}

/// `top` delegates to `CHILDREN` workers; each worker charges and asks the browser to confirm
/// in one step, then charges again, then answers. Call ids are unique across the tree.
fn tree_runtime(dir: &Path) -> anyhow::Result<Runtime> {
    let log = dir.join("invocations.log");
    let llm = ScriptedLlm::new();
    for root in 0..ROOTS {
        let calls = (0..CHILDREN)
            .map(|child| {
                ToolCall::new(
                    format!("w{child}"),
                    "work",
                    json!({ "message": format!("job {child}") }),
                )
            })
            .collect();
        let root_session: SessionId = root_id(root).parse()?;
        llm.set_session_script(
            root_session.clone(),
            vec![ModelReply::tool_calls(calls), ModelReply::text("tree done")],
        );
        for child in 0..CHILDREN {
            llm.set_session_script(
                root_session.ephemeral_child(&format!("w{child}")),
                vec![
                    ModelReply::tool_calls(vec![
                        ToolCall::new(child_call(root, child, "c"), "charge", json!({})),
                        ToolCall::new(child_call(root, child, "q"), "confirm", json!({})),
                    ]),
                    ModelReply::tool_calls(vec![ToolCall::new(
                        child_call(root, child, "x"),
                        "charge",
                        json!({}),
                    )]),
                    ModelReply::text("worker done"),
                ],
            );
        }
    }
    Ok(Runtime::builder()
        .store(Arc::new(SledStore::open(dir.join("store"))?))
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(0)))
        .background_deadlines(false)
        .agent(
            AgentDefinition::builder("top")
                .tool(ToolDefinition::sub_agent("work", "worker"))
                .build()?,
        )
        .agent(
            AgentDefinition::builder("worker")
                .tool(logged_tool("charge", log))
                .tool(ToolDefinition::client("confirm"))
                .build()?,
        )
        .build()?)
}

/// The child: suspends every tree, then answers the browser calls against the roots (printing
/// `accepted CALL` once each is acknowledged) and resumes each tree as soon as its answers are
/// in; then waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of a_tree_in_flight_survives_sigkill"]
async fn tree_child() -> anyhow::Result<()> {
    let Ok(dir) = std::env::var(STORE_ENV) else {
        return Ok(());
    };
    let runtime = tree_runtime(Path::new(&dir))?;
    for root in 0..ROOTS {
        let outcome = runtime
            .execute_on(&root_id(root).parse()?, "top", "go")
            .await?;
        anyhow::ensure!(outcome.status == Status::SuspendedAwaitingChildren);
    }
    println!("suspended");
    let mut resumes = Vec::new();
    for root in 0..ROOTS {
        for child in 0..CHILDREN {
            let call = child_call(root, child, "q");
            let submit = Submit::result(root_id(root), &call, json!({ "confirmed": call }));
            anyhow::ensure!(runtime.submit_tool_result(submit).await? == SubmitOutcome::Accepted);
            println!("accepted {call}");
        }
        let runtime = runtime.clone();
        let id: SessionId = root_id(root).parse()?;
        resumes.push(tokio::spawn(async move { runtime.resume(&id).await }));
    }
    std::future::pending::<()>().await;
    Ok(())
}

#[test]
fn a_tree_in_flight_survives_sigkill() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut child, lines) = common::spawn_child("tree_child", STORE_ENV, dir.path())?;
    let mut accepted = Vec::new();
    for line in lines {
        if let Some(call) = line?.strip_prefix("accepted ") {
            accepted.push(call.to_string());
            // Kill with half the answers in and the first trees resuming.
            if accepted.len() == ROOTS * CHILDREN / 2 {
                break;
            }
        }
    }
    child.kill()?;
    child.wait()?;
    anyhow::ensure!(
        accepted.len() == ROOTS * CHILDREN / 2,
        "the child died early"
    );

    tokio::runtime::Runtime::new()?.block_on(async {
        let runtime = tree_runtime(dir.path())?;
        // Answer what the killed process never acknowledged (a repeat of an answer that did
        // land is `already_completed`), then resume every tree.
        for root in 0..ROOTS {
            for child in 0..CHILDREN {
                let call = child_call(root, child, "q");
                let submit = Submit::result(root_id(root), &call, json!({ "confirmed": call }));
                let outcome = runtime.submit_tool_result(submit).await?;
                if accepted.contains(&call) {
                    assert_eq!(
                        outcome,
                        SubmitOutcome::AlreadyCompleted,
                        "{call} was acknowledged"
                    );
                } else {
                    assert!(
                        matches!(
                            outcome,
                            SubmitOutcome::Accepted | SubmitOutcome::AlreadyCompleted
                        ),
                        "{call}: {outcome:?}"
                    );
                }
            }
            let root_session: SessionId = root_id(root).parse()?;
            // A tree the killed process finished stays finished; any other goes on.
            if runtime.status(&root_session).await? != Status::Completed {
                let outcome = runtime.resume(&root_session).await?;
                assert_eq!(outcome.status, Status::Completed, "{root_session}");
                assert_eq!(outcome.text.as_deref(), Some("tree done"));
            }
            let runs = runtime.runs(&root_session).await?;
            assert_eq!(
                runs.last().and_then(|run| run.text.as_deref()),
                Some("tree done")
            );
            for child in 0..CHILDREN {
                let child_session = root_session.ephemeral_child(&format!("w{child}"));
                let messages = runtime.messages(&child_session).await?;
                let call = child_call(root, child, "q");
                let results: Vec<&ToolOutcome> = messages
                    .iter()
                    .filter_map(|message| match message {
                        dormant::Message::Tool {
                            tool_call_id,
                            outcome,
                            ..
                        } if *tool_call_id == call => Some(outcome),
                        _ => None,
                    })
                    .collect();
                assert_eq!(
                    results,
                    vec![&ToolOutcome::Result(json!({ "confirmed": call }))],
                    "{call}: the answer is applied exactly once"
                );
                let messages = runtime.messages(&root_session).await?;
                assert_eq!(
                    common::tool_result(&messages, &format!("w{child}")),
                    Some(&ToolOutcome::Result(json!("worker done")))
                );
            }
        }
        runtime.shutdown().await?;
        anyhow::Ok(())
    })?;

    // No non-retryable handler ran twice, across both processes.
    let log = std::fs::read_to_string(dir.path().join("invocations.log"))?;
    let mut runs: HashMap<&str, usize> = HashMap::new();
    for call in log.lines() {
        *runs.entry(call).or_default() += 1;
    }
    for (call, count) in &runs {
        assert_eq!(*count, 1, "{call} ran {count} times");
    }
    for root in 0..ROOTS {
        for child in 0..CHILDREN {
            let first = child_call(root, child, "c");
            assert!(
                runs.contains_key(first.as_str()),
                "{first} ran before the tree suspended"
            );
        }
    }
    Ok(())
}
