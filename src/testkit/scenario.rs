//! The conformance scenario runner: JSON files that describe agents with a scripted model and
//! a sequence of operations against one [`Runtime`](crate::Runtime), each with the outcome it
//! expects (the format is `docs/scenario-format.md`).
//!
//! Each file runs on a fresh sled store in a temporary directory with a manual clock from
//! 0 ms; `restart` reopens the same directory. Parsing is strict: an unknown field, op, agent
//! or tool is an [`Error`] naming the file and the JSON path. A step whose op or expectations
//! fail is a [`StepFailure`], `FILE: step N (op): expected X, got Y`, and a run over several
//! files ends with the [`Summary`] line `N passed, M failed`.
//!
//! Test tooling: this module exists only with the `test-util` feature.
//!
//! The store is a [`FaultyStore`](crate::testkit::FaultyStore) over sled: `crash_before` arms
//! [`Fault::CrashBefore`](crate::testkit::Fault::CrashBefore) with the commit kind it names
//! (`tool_calls`, `tool_results`), so that commit and every one after it fail as if the
//! process had died there, and the op that hits it answers the runtime's store error. `restart`
//! opens the directory again behind a new wrapper with no fault: only what was committed
//! before the crash survives it.
//!
//! The runtime is built with `background_deadlines(false)`: the runner owns time. After
//! each op that can cause work it fires every deadline the manual clock has passed
//! ([`Runtime::sweep_deadlines`](crate::Runtime::sweep_deadlines), so a timeout of 0 fires
//! as soon as its call is recorded) and waits until no session has a run in progress
//! (automatic resumes included), so the next step sees a quiet runtime.
//!
//! A `submit` step becomes a JSON envelope (its `raw` value, or one built from its fields) sent
//! through [`Runtime::submit_json`](crate::Runtime::submit_json), the same parsing a client's
//! submit gets; `approval_id: "auto"` is the call's real `{runId}::{toolCallId}`.
//!
//! - `format.rs`: the serde shape of a file; `parse.rs`: [`Scenario`], reading and checking it;
//!   `step.rs`: the validated ops.
//! - `build.rs`: agents, counting server handlers and scripts; `world.rs`: the runtime under
//!   test and what survives its restarts.
//! - `run.rs`: executing steps and settling after them; `envelope.rs`: a submit's envelope;
//!   `tree.rs`: the sessions of a tree; `expect.rs`: checking expectations; `report.rs`: the
//!   results.
//!
//! ```
//! use dormant::testkit::scenario::{self, Scenario};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), dormant::testkit::scenario::Error> {
//! let scenario = Scenario::from_json("lookup.json", r#"{
//!     "agents": [ { "name": "clerk",
//!         "tools": [ { "name": "lookup", "result": { "stock": 3 } } ],
//!         "script": [ { "tool_calls": [ { "id": "c1", "name": "lookup", "input": {} } ] },
//!                     { "text": "3 in stock." } ] } ],
//!     "steps": [
//!         { "op": "execute", "agent": "clerk", "session": "s1", "message": "any tea?",
//!           "expect": { "status": "completed", "text": "3 in stock.",
//!                       "tool_results": { "c1": { "result": { "stock": 3 } } },
//!                       "invocations": { "lookup": 1 } } },
//!         { "op": "check", "session": "s1", "expect": { "runs": 2 } }
//!     ]
//! }"#)?;
//! let report = scenario::run(&scenario).await?;
//! let failures: Vec<String> = report.failures().iter().map(ToString::to_string).collect();
//! assert_eq!(failures, ["lookup.json: step 1 (check): expected runs 2, got 1"]);
//! # Ok(()) }
//! ```

mod build;
mod checkpoints;
mod envelope;
mod error;
mod expect;
mod format;
mod parse;
mod prompts;
mod remote;
mod report;
mod run;
mod step;
mod tree;
mod unique_keys;
mod world;

use std::path::{Path, PathBuf};

pub use error::Error;
pub use parse::Scenario;
pub use remote::{RemoteHost, Served};
pub use report::{FileReport, StepFailure, Summary};

/// Runs `scenario` on a fresh runtime and reports each failing step.
///
/// # Errors
/// The file's agents were refused ([`Error::Agent`]) or its store could not be opened
/// ([`Error::TempDir`], [`Error::Runtime`]). A failing step is not an error: it is in the
/// report.
pub async fn run(scenario: &Scenario) -> Result<FileReport, Error> {
    run::run(scenario, None).await
}

/// As [`run()`], with `host` serving the file's agents marked `"remote": true` over HTTP.
///
/// # Errors
/// As [`run()`], and [`Error::Remote`] if the remote runtime cannot be served.
pub async fn run_with(
    scenario: &Scenario,
    host: std::sync::Arc<dyn RemoteHost>,
) -> Result<FileReport, Error> {
    run::run(scenario, Some(host)).await
}

/// Reads, parses and runs the file at `path`.
///
/// # Errors
/// As [`Scenario::load`] and [`run()`].
pub async fn run_file(path: impl AsRef<Path>) -> Result<FileReport, Error> {
    let scenario = Scenario::load(path)?;
    run(&scenario).await
}

/// Runs each path in order: a file as is, a directory as every `*.json` file in it, sorted by
/// name. A file that cannot be read, parsed or set up counts as failed, with its error.
pub async fn run_paths<P: AsRef<Path>>(paths: &[P]) -> Summary {
    run_paths_on(paths, None).await
}

/// As [`run_paths`], with `host` serving the agents marked `"remote": true`.
pub async fn run_paths_with<P: AsRef<Path>>(
    paths: &[P],
    host: std::sync::Arc<dyn RemoteHost>,
) -> Summary {
    run_paths_on(paths, Some(host)).await
}

async fn run_paths_on<P: AsRef<Path>>(
    paths: &[P],
    host: Option<std::sync::Arc<dyn RemoteHost>>,
) -> Summary {
    let mut summary = Summary::default();
    for path in paths {
        match files(path.as_ref()) {
            Ok(files) => {
                for file in files {
                    let report = match Scenario::load(&file) {
                        Ok(scenario) => run::run(&scenario, host.clone()).await,
                        Err(error) => Err(error),
                    };
                    summary.push(report);
                }
            }
            Err(error) => summary.push(Err(error)),
        }
    }
    summary
}

/// The scenario files `path` stands for: itself, or the sorted `*.json` files of a directory.
///
/// # Errors
/// [`Error::Read`] if `path` is a directory that cannot be listed, [`Error::NoScenarios`] if
/// it holds no `*.json` file.
pub fn files(path: &Path) -> Result<Vec<PathBuf>, Error> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let read = |source| Error::Read {
        file: path.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(read)? {
        let file = entry.map_err(read)?.path();
        if file.is_file() && file.extension().is_some_and(|ext| ext == "json") {
            files.push(file);
        }
    }
    if files.is_empty() {
        return Err(Error::NoScenarios {
            file: path.to_path_buf(),
        });
    }
    files.sort();
    Ok(files)
}
