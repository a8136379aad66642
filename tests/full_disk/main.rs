//! A real full disk, end to end through the public API (issue 13, item 4): a runtime on a
//! `SledStore` in a 4 MiB tmpfs drives sessions through execute → suspend → submit → resume
//! while a ballast file fills the disk (in the middle of a deploy), goes on against a disk that
//! stays full or nearly so (a little more of the ballast is freed after each round), then the
//! ballast is deleted and every session is finished by the same runtime on the same store.
//! Wherever the disk filled, an accepted answer is applied exactly once, the approval-gated
//! deploy (not safe to retry) runs at most once per call, no session is left wedged, and a
//! fresh open of the store shows what the runtime showed.
//!
//! The child is this test binary, re-run with `--ignored --exact full_disk_child` under
//! `unshare --mount` (plus `--map-root-user` when not root) with the tmpfs mounted in its own
//! mount namespace. It reports every deploy, submit and store failure on stdout (see
//! `full_disk/child.rs` and `full_disk/driver.rs`); the parent checks the report.

mod child;
mod driver;
mod report;

use std::collections::BTreeMap;

use child::SESSIONS;
use dormant::types::ToolOutcome;
use dormant::Message;
use report::{run_child, Report, MOUNT_ENV};

/// The child: runs only with `MOUNT_ENV` set, inside the namespace the parent made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of a_full_disk_never_runs_an_approved_tool_twice_nor_loses_an_answer"]
async fn full_disk_child() -> anyhow::Result<()> {
    let Some(mount) = std::env::var_os(MOUNT_ENV) else {
        return Ok(());
    };
    child::run(std::path::Path::new(&mount)).await
}

/// The one tool message of `call` in a session's messages (`None` if there are several).
fn only_result<'m>(messages: &'m [Message], call: &str) -> Option<&'m ToolOutcome> {
    let mut results = messages.iter().filter_map(|message| match message {
        Message::Tool {
            tool_call_id,
            outcome,
            ..
        } if tool_call_id == call => Some(outcome),
        _ => None,
    });
    let first = results.next();
    first.filter(|_| results.next().is_none())
}

/// How a session ended, as far as the checks below care.
#[derive(Debug, Default)]
struct Ended {
    /// `d1` ended `tool_durability_error`: the commit of its result failed after it ran.
    deploy_cut: bool,
    /// No submit of `e1` was acknowledged, yet one of them reached the disk.
    unacknowledged_answer: bool,
}

/// Checks one session as a fresh open of the store shows it against what the child reported:
/// completed with nothing pending, one result per call, the accepted answer of `e1` applied,
/// and `d1` run at most once, with a result only if it ran.
fn check_session(
    report: &Report,
    session: &str,
    (status, pending, messages): &(String, usize, Vec<Message>),
) -> anyhow::Result<Ended> {
    let mut ended = Ended::default();
    anyhow::ensure!(
        status == "completed" && *pending == 0,
        "{session} ended {status} with {pending} calls pending"
    );
    let tool_messages = messages
        .iter()
        .filter(|m| matches!(m, Message::Tool { .. }))
        .count();
    anyhow::ensure!(
        tool_messages == 2,
        "{session}: {tool_messages} tool messages: {messages:?}"
    );
    let key = |call: &str| (session.to_string(), call.to_string());

    let edit = only_result(messages, "e1");
    match report.accepted.get(&key("e1")).map(Vec::as_slice) {
        Some([value]) => {
            let value: serde_json::Value = serde_json::from_str(value)?;
            anyhow::ensure!(
                edit == Some(&ToolOutcome::Result(value.clone())),
                "{session}: accepted {value}, applied {edit:?}"
            );
        }
        None => {
            // Allowed: a submit that failed is not acknowledged, which does not mean undone.
            let tried = report.attempts.get(&key("e1")).cloned().unwrap_or_default();
            let landed = tried.iter().any(|value| {
                serde_json::from_str(value)
                    .is_ok_and(|value| edit == Some(&ToolOutcome::Result(value)))
            });
            anyhow::ensure!(landed, "{session}: e1 applied {edit:?}, tried {tried:?}");
            ended.unacknowledged_answer = true;
        }
        Some(many) => anyhow::bail!("{session}: e1 accepted {} times: {many:?}", many.len()),
    }

    let runs = report.deploys.get(&key("d1")).copied().unwrap_or(0);
    anyhow::ensure!(
        runs <= 1,
        "{session}: the approved deploy d1 ran {runs} times"
    );
    let approvals = report.accepted.get(&key("d1")).map_or(0, Vec::len);
    anyhow::ensure!(approvals <= 1, "{session}: d1 approved {approvals} times");
    match only_result(messages, "d1") {
        Some(ToolOutcome::Result(value)) if *value == child::receipt(session) => {
            anyhow::ensure!(runs == 1, "{session}: d1 has a result but ran {runs} times");
        }
        Some(ToolOutcome::Error(error)) if error.starts_with("tool_durability_error") => {
            anyhow::ensure!(runs == 1, "{session}: d1 cut, but ran {runs} times");
            ended.deploy_cut = true;
        }
        other => anyhow::bail!("{session}: d1 ended {other:?}"),
    }
    Ok(ended)
}

#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_never_runs_an_approved_tool_twice_nor_loses_an_answer() -> anyhow::Result<()> {
    if std::env::var_os(MOUNT_ENV).is_some() {
        return Ok(());
    }
    let mount = tempfile::tempdir()?;
    let report = run_child(mount.path())?;

    anyhow::ensure!(report.freed, "the child never freed the disk");
    anyhow::ensure!(
        !report.storage_full.is_empty(),
        "no commit failed with StorageFull: the disk never filled"
    );
    let filled_by = report
        .filled_by
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no deploy filled the disk"))?;
    anyhow::ensure!(
        report.finals.len() == SESSIONS,
        "{} sessions",
        report.finals.len()
    );
    let mut cut = Vec::new();
    let mut unacknowledged = Vec::new();
    for (session, shown) in &report.finals {
        let ended = check_session(&report, session, shown)?;
        if ended.deploy_cut {
            cut.push(session.as_str());
        }
        if ended.unacknowledged_answer {
            unacknowledged.push(session.as_str());
        }
    }
    // Not a check of the runtime but of the scenario: the case of issue 13 happened.
    anyhow::ensure!(
        cut.contains(&filled_by.as_str()),
        "the disk filled during the deploy of {filled_by}, yet the commit of its result did \
         not fail (sled found room for it): the case under test did not happen"
    );
    println!(
        "{} StorageFull failures ({:?}); {} answers and deploys landed on the nearly full disk; \
         tool_durability_error in {cut:?}; unacknowledged answers that landed: \
         {unacknowledged:?}",
        report.storage_full.len(),
        count_by_what(&report.storage_full),
        report.landed_while_full,
    );
    Ok(())
}

/// How many failures each kind of move had.
fn count_by_what(failures: &[(String, String)]) -> BTreeMap<&str, usize> {
    let mut counts = BTreeMap::new();
    for (_, what) in failures {
        *counts.entry(what.trim()).or_default() += 1;
    }
    counts
}
