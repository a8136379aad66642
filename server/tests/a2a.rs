//! The A2A server (issue 33, item 1) against the official A2A SDK as its client (the Python
//! `a2a-sdk`, pinned, from PyPI; `.ci/run` installs it into a virtual environment and sets
//! `DORMANT_A2A_PYTHON` to its interpreter): the agent card read, a task that needs input,
//! the server restarted in the middle, the task read again and answered through follow-up
//! messages (a duplicate answer refused with a typed error), completed with its result, and
//! another task cancelled. Without the SDK it says it was skipped and how to install it,
//! unless `DORMANT_REQUIRE_A2A` is set.

mod common;

use std::process::Command;

use common::a2a_peer::python;
use common::binary::Binary;
use serde_json::Value;

/// Runs `tests/a2a/drive.py` with `args`; answers the JSON it prints.
fn drive(python: &std::ffi::OsStr, args: &[&str]) -> anyhow::Result<Value> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/a2a/drive.py");
    let output = Command::new(python).arg(script).args(args).output()?;
    anyhow::ensure!(
        output.status.success(),
        "the A2A client failed ({args:?}):\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(serde_json::from_slice(&output.stdout)?)
}

fn state(task: &Value) -> &str {
    task["status"]["state"].as_str().unwrap_or_default()
}

#[test]
fn the_official_sdk_runs_a_task_through_input_required_across_a_restart() -> anyhow::Result<()> {
    let Some(python) = python()? else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let store = dir.path().join("store");
    let server = Binary::start(&store, "127.0.0.1:0", &[])?;
    let listen = format!("127.0.0.1:{}", server.port()?);
    let base = server.base.clone();

    // A first message: the demo's run waits on its client tool ask_user.
    let started = drive(&python, &["start", &base])?;
    let task = &started["task"];
    assert_eq!(state(task), "TASK_STATE_INPUT_REQUIRED", "{started}");
    let pending = &task["status"]["message"]["parts"][1]["data"]["pending"][0];
    assert_eq!(pending["tool_call_id"], "ask_user-1", "{started}");
    let id = task["id"].as_str().unwrap_or_default().to_string();
    let token = started["token"].as_str().unwrap_or_default().to_string();
    assert!(token.starts_with("dst1."), "{started}");

    // The server restarts; the task is where it was, and goes on.
    server.terminate()?;
    let server = Binary::start(&store, &listen, &[])?;
    let answered = drive(&python, &["answer", &base, &token, &id])?;
    assert_eq!(
        state(&answered["read"]),
        "TASK_STATE_INPUT_REQUIRED",
        "{answered}"
    );
    // The answer is accepted and the run goes on to the approval gate.
    assert_eq!(
        state(&answered["answered"]),
        "TASK_STATE_INPUT_REQUIRED",
        "{answered}"
    );
    let gate = &answered["answered"]["status"]["message"]["parts"][1]["data"]["pending"][0];
    assert_eq!(gate["tool_call_id"], "publish-1", "{answered}");
    let duplicate = answered["duplicate_error"].as_str().unwrap_or_default();
    assert!(duplicate.contains("already has an answer"), "{answered}");
    let done = &answered["approved"];
    assert_eq!(state(done), "TASK_STATE_COMPLETED", "{answered}");
    let result = done["artifacts"][0]["parts"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        result.starts_with("Published \"Porto in the sun\""),
        "{answered}"
    );

    let cancelled = drive(&python, &["cancel", &base])?;
    assert_eq!(
        cancelled["new_task_while_waiting"], "UnsupportedOperationError",
        "a new task would abandon what waits: {cancelled}"
    );
    assert_eq!(
        state(&cancelled["cancelled"]),
        "TASK_STATE_CANCELED",
        "{cancelled}"
    );
    assert_eq!(
        cancelled["cancel_again"], "TaskNotCancelableError",
        "{cancelled}"
    );
    server.terminate()?;
    Ok(())
}

#[test]
fn the_official_sdk_streams_a_task_to_its_end_and_cannot_subscribe_to_a_finished_one(
) -> anyhow::Result<()> {
    let Some(python) = python()? else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    let server = Binary::start(&dir.path().join("store"), "127.0.0.1:0", &[])?;
    let walked = drive(&python, &["stream", &server.base])?;
    let kinds = |step: &str| -> Vec<(String, String)> {
        walked[step]
            .as_array()
            .map(|events| {
                events
                    .iter()
                    .filter_map(|event| {
                        let (kind, body) = event.as_object()?.iter().next()?;
                        let state = body["status"]["state"].as_str().unwrap_or("");
                        Some((kind.clone(), state.to_string()))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let last_state = |step: &str| {
        kinds(step)
            .iter()
            .rev()
            .find(|(_, state)| !state.is_empty())
            .map(|(_, state)| state.clone())
    };
    assert_eq!(kinds("started")[0].0, "task", "{walked}");
    assert_eq!(
        last_state("started").as_deref(),
        Some("TASK_STATE_INPUT_REQUIRED"),
        "{walked}"
    );
    assert_eq!(
        last_state("answered").as_deref(),
        Some("TASK_STATE_INPUT_REQUIRED"),
        "{walked}"
    );
    assert_eq!(
        last_state("approved").as_deref(),
        Some("TASK_STATE_COMPLETED"),
        "{walked}"
    );
    assert!(
        kinds("approved")
            .iter()
            .any(|(kind, _)| kind == "artifactUpdate"),
        "the result comes as an artifact: {walked}"
    );
    let refused = walked["subscribe_error"].as_str().unwrap_or_default();
    assert!(refused.contains("terminal state"), "{walked}");
    server.terminate()?;
    Ok(())
}
