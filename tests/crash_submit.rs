//! A process killed with SIGKILL right after `submit_tool_result` answered `accepted`: after
//! reopening the store the answer is there, and the resume applies it once.
//!
//! The child is this same test binary, re-run with `--ignored --exact submit_child`.

mod common;

use std::sync::Arc;

use common::{calls_then_text, editor_runtime, tool_result};
use dormant::types::ToolOutcome;
use dormant::{ManualClock, Message, SessionId, SledStore, Status};
use dormant::{Submit, SubmitOutcome};
use serde_json::json;

const STORE_ENV: &str = "DORMANT_SUBMIT_CHILD_STORE";
const SESSIONS: usize = 16;

fn script() -> Vec<dormant::ModelReply> {
    calls_then_text(&[("tc-1", "edit")], "applied")
}

/// The child: suspends sessions on a client tool, submits their answers and prints
/// `accepted ID` for each `accepted`; then waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of an_accepted_answer_survives_sigkill_and_applies_once"]
async fn submit_child() -> anyhow::Result<()> {
    let Ok(path) = std::env::var(STORE_ENV) else {
        return Ok(());
    };
    let store = Arc::new(SledStore::open(path)?);
    let runtime = editor_runtime(store, ManualClock::new(0), script(), Arc::default(), |b| b)?;
    for i in 0..SESSIONS {
        let id: SessionId = format!("s{i}").parse()?;
        runtime.execute_on(&id, "editor", "go").await?;
    }
    for i in 0..SESSIONS {
        let submit = Submit::result(format!("s{i}"), "tc-1", json!({ "applied": i }));
        anyhow::ensure!(runtime.submit_tool_result(submit).await? == SubmitOutcome::Accepted);
        println!("accepted s{i}");
    }
    std::future::pending::<()>().await;
    Ok(())
}

#[test]
fn an_accepted_answer_survives_sigkill_and_applies_once() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut child, lines) = common::spawn_child("submit_child", STORE_ENV, dir.path())?;
    let mut accepted = Vec::new();
    for line in lines {
        if let Some(id) = line?.strip_prefix("accepted ") {
            accepted.push(id.to_string());
            // Kill as soon as the first answers are acknowledged, with later submits in flight.
            if accepted.len() == SESSIONS / 2 {
                break;
            }
        }
    }
    child.kill()?;
    child.wait()?;
    anyhow::ensure!(accepted.len() == SESSIONS / 2, "the child died early");

    tokio::runtime::Runtime::new()?.block_on(async {
        let store = Arc::new(SledStore::open(dir.path())?);
        let runtime = editor_runtime(store, ManualClock::new(0), script(), Arc::default(), |b| b)?;
        for id in &accepted {
            let id: SessionId = id.parse()?;
            let index: i64 = id.as_str()[1..].parse()?;
            let pending = runtime.pending(&id).await?;
            assert_eq!(
                pending[0].answer,
                Some(dormant::types::Answer::Result(json!({ "applied": index }))),
                "the acknowledged answer of {id} is durable"
            );
            let outcome = runtime.resume(&id).await?;
            assert_eq!(outcome.status, Status::Completed);
            let messages = runtime.messages(&id).await?;
            let results = messages
                .iter()
                .filter(|m| matches!(m, Message::Tool { .. }))
                .count();
            assert_eq!(results, 1, "applied exactly once");
            assert_eq!(
                tool_result(&messages, "tc-1"),
                Some(&ToolOutcome::Result(json!({ "applied": index })))
            );
            let again = runtime.resume(&id).await;
            assert!(
                matches!(again, Err(dormant::Error::NotResumable { .. })),
                "{again:?}"
            );
        }
        runtime.shutdown().await?;
        anyhow::Ok(())
    })
}
