//! The README's curl walk-through, run as written against the binary: start → the stream
//! shows the client call → submit → resume → approve → resume → completed.

mod common;

use std::process::Command;

use anyhow::Context;
use common::binary::Binary;

#[test]
fn the_readme_curl_walkthrough_runs_as_written() -> anyhow::Result<()> {
    if Command::new("curl").arg("--version").output().is_err() {
        // CI installs curl; say loudly what is missing rather than pass in silence.
        eprintln!("SKIPPED: the README walk-through needs curl (apt-get install curl)");
        anyhow::ensure!(
            std::env::var_os("DORMANT_REQUIRE_CURL").is_none(),
            "curl is required here"
        );
        return Ok(());
    }
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))?;
    let block = readme
        .split("<!-- walkthrough:start -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- walkthrough:end -->").next())
        .context("README has no walk-through block")?;
    let script = block
        .trim()
        .strip_prefix("```sh")
        .and_then(|rest| rest.strip_suffix("```"))
        .context("the walk-through is not one sh block")?;

    let dir = tempfile::tempdir()?;
    let server = Binary::start(&dir.path().join("store"), "127.0.0.1:0", &[])?;
    let output = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .env("DORMANT", &server.base)
        .output()?;
    let stdout = String::from_utf8(output.stdout)?;
    let stderr = String::from_utf8(output.stderr)?;
    assert!(
        output.status.success(),
        "the walk-through failed:\n{stdout}\n{stderr}"
    );
    // The first stream stops at the client call, the answers are accepted, the last stream
    // ends the run completed.
    assert!(
        stdout.contains("event: tool_start\nevent: run_suspended\nevent: end"),
        "{stdout}"
    );
    assert_eq!(
        stdout.matches(r#"{"code":"accepted"}"#).count(),
        2,
        "{stdout}"
    );
    assert!(stdout.contains("event: tool_approval_request"), "{stdout}");
    let end = stdout
        .lines()
        .skip_while(|line| *line != "event: run_end")
        .nth(1)
        .with_context(|| format!("no run_end in\n{stdout}"))?;
    assert!(end.contains(r#""status":"completed""#), "{end}");
    Ok(())
}
