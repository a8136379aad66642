//! The conformance scenarios of `tests/scenarios/*.json` all pass, and the runner reports a
//! failing or unsupported step the way the spec says.

use std::path::Path;

use dormant::scenario::{self, Scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_file_passes() -> anyhow::Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let summary = scenario::run_paths(&[dir]).await;
    for line in summary.failure_lines() {
        println!("{line}");
    }
    println!("{summary}");
    assert!(
        summary.all_passed(),
        "{}",
        summary.failure_lines().join("\n")
    );
    assert!(summary.passed() >= 24, "the suite lost files: {summary}");
    Ok(())
}

#[tokio::test]
async fn a_wrong_expectation_fails_its_step_with_expected_and_got() -> anyhow::Result<()> {
    let scenario = Scenario::from_json(
        "wrong.json",
        r#"{ "agents": [ { "name": "a", "script": [ { "text": "hi" } ] } ],
             "steps": [
               { "op": "execute", "agent": "a", "session": "s1", "message": "m",
                 "expect": { "status": "failed", "text": "bye" } },
               { "op": "check", "session": "s1", "expect": { "status": "completed" } } ] }"#,
    )?;
    let report = scenario::run(&scenario).await?;
    let lines: Vec<String> = report.failures().iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            r#"wrong.json: step 0 (execute): expected status failed, got completed; expected text "bye", got "hi""#
        ]
    );
    assert!(!report.passed());
    Ok(())
}

#[tokio::test]
async fn an_unsupported_op_fails_its_step_and_stops_the_file() -> anyhow::Result<()> {
    let scenario = Scenario::from_json(
        "later.json",
        r#"{ "agents": [ { "name": "a", "script": [ { "text": "hi" } ] } ],
             "steps": [
               { "op": "execute", "agent": "a", "session": "s1", "message": "m" },
               { "op": "advance_clock", "ms": 1000 },
               { "op": "check", "session": "s1" } ] }"#,
    )?;
    let report = scenario::run(&scenario).await?;
    let lines: Vec<String> = report.failures().iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        ["later.json: step 1 (advance_clock): op advance_clock is not supported by this version of the runtime (1 later steps not run)"]
    );
    Ok(())
}

#[tokio::test]
async fn an_unsupported_expectation_fails_its_step() -> anyhow::Result<()> {
    let scenario = Scenario::from_json(
        "pending.json",
        r#"{ "agents": [ { "name": "a", "script": [ { "text": "hi" } ] } ],
             "steps": [ { "op": "execute", "agent": "a", "session": "s1", "message": "m",
                          "expect": { "status": "completed", "pending": [] } } ] }"#,
    )?;
    let report = scenario::run(&scenario).await?;
    assert_eq!(report.failures().len(), 1);
    assert_eq!(
        report.failures()[0].message(),
        "expectation pending is not supported by this version of the runtime"
    );
    Ok(())
}

#[tokio::test]
async fn files_that_cannot_run_count_as_failed_with_their_error() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let broken = dir.path().join("broken.json");
    std::fs::write(
        &broken,
        r#"{ "steps": [ { "op": "check", "session": "s1", "expect": { "stauts": "completed" } } ] }"#,
    )?;
    let refused = dir.path().join("refused.json");
    std::fs::write(
        &refused,
        r#"{ "agents": [ { "name": "a", "tools": [ { "name": "__finish__" } ] } ], "steps": [] }"#,
    )?;
    std::fs::write(dir.path().join("notes.txt"), "not a scenario")?;
    let summary = scenario::run_paths(&[dir.path()]).await;
    assert_eq!(summary.to_string(), "0 passed, 2 failed");
    let lines = summary.failure_lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with(&format!(
            "{}: steps[0].expect.stauts: unknown field",
            broken.display()
        )),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].starts_with(&format!(
            "{}: agents[0]: the runtime refused the agent",
            refused.display()
        )),
        "{}",
        lines[1]
    );
    Ok(())
}
