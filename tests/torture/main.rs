//! A kill test: a child process drives a mixed workload of durable sessions on one sled
//! directory and is killed with SIGKILL, again and again, at random times and right after a
//! non-retryable tool started or an answer was acknowledged; each new child reopens the store
//! and carries on. After the last kill the checker drives every session to its end and proves
//! that every acknowledged answer was applied exactly once, that no non-retryable tool ran
//! twice for one call, and that no session is left wedged.
//!
//! The workload (`torture/workload.rs`): client tools answered by a simulated client (some
//! answers twice), approval-gated non-retryable tools (approved, sometimes denied), plain
//! non-retryable tools, two non-retryable tools whose cut calls are reconciled (`settle`, in
//! roots and sub-agents, by a check that looks its idempotency key up in the executions file;
//! `refund`, approval-gated, by the client, which looks it up the same way, as a person
//! would), a `safe_to_retry` tool, sub-agents that wait on a client tool answered
//! against the root, evictions (`evict_all`, a small `max_resident`), tens to hundreds of
//! sessions per generation on a multi-thread runtime, and forks of waiting trees at their latest
//! checkpoint (each then a tree of its own, driven to its end like the others; no fork may run
//! a call its source had run or started by its checkpoint). Every cut call of `settle` and
//! `refund` ends with the tool's output (reconciled as happened, or run once more) or a
//! durability error (in a fork), and one reconciled as happened really ran. Everything goes
//! through the public API.
//!
//! `cargo test` runs 8 kills (2 to 8 s in a debug build). The full count, which prints the
//! report:
//!
//! ```sh
//! DORMANT_TORTURE_KILLS=50 cargo test --release --test torture -- --nocapture
//! ```
//!
//! Knobs: `DORMANT_TORTURE_SEED` replays a run (the seed is printed first),
//! `DORMANT_TORTURE_BATCH` sets how many new trees each generation keeps in flight (16),
//! `DORMANT_TORTURE_BROKEN=safe_to_retry` runs the broken variant (`charge`, which must run at
//! most once, declared `safe_to_retry`), which the last test here shows is caught,
//! `DORMANT_TORTURE_STORE=fjall` runs on a `FjallStore`, `DORMANT_TORTURE_STORE=journal` on a
//! `JournalStore` (a test here does each, at 8 kills).
//!
//! The children are this test binary, re-run with `--ignored --exact torture_child`.

mod check;
mod child;
mod client;
mod journal;
mod parent;
mod report;
mod rng;
mod verify;
mod workload;

use parent::Options;
use report::Report;

/// Kills in CI: enough to hit each kind of window, few enough for well under a minute in a
/// debug build.
const CI_KILLS: usize = 8;

/// One generation of the workload; see `torture/child.rs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of the torture tests, run by them"]
async fn torture_child() -> anyhow::Result<()> {
    match child::Orders::from_env()? {
        Some(orders) => child::run(orders).await,
        None => Ok(()),
    }
}

/// Kills generation after generation, then checks the store.
fn torture(options: Options) -> anyhow::Result<Report> {
    println!(
        "torture: seed {} ({} kills{}, {} store); replay with DORMANT_TORTURE_SEED={}",
        options.seed,
        options.kills,
        if options.broken {
            ", broken variant"
        } else {
            ""
        },
        options.engine.as_deref().unwrap_or("sled"),
        options.seed
    );
    let dir = tempfile::tempdir()?;
    let kills = parent::run(dir.path(), &options)?;
    let findings = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(check::run(dir.path(), options.seed, options.broken))?;
    let report = Report {
        options,
        kills,
        findings,
    };
    println!("{report}");
    Ok(report)
}

#[test]
fn sigkill_loses_no_acknowledged_answer_and_runs_no_tool_twice() -> anyhow::Result<()> {
    let report = torture(Options::from_env(CI_KILLS, None, child::is_broken())?)?;
    // The report is on stdout, which the test harness shows with the failure.
    anyhow::ensure!(
        report.problems() == 0,
        "{} problem(s) under SIGKILL, named in the report above",
        report.problems()
    );
    Ok(())
}

/// The same on `FjallStore`.
#[cfg(feature = "fjall")]
#[test]
fn sigkill_loses_no_acknowledged_answer_and_runs_no_tool_twice_on_fjall() -> anyhow::Result<()> {
    let mut options = Options::from_env(CI_KILLS, None, child::is_broken())?;
    options.engine = Some("fjall".into());
    let report = torture(options)?;
    anyhow::ensure!(
        report.problems() == 0,
        "{} problem(s) under SIGKILL on fjall, named in the report above",
        report.problems()
    );
    Ok(())
}

/// The same on `JournalStore`.
#[cfg(all(unix, feature = "journal"))]
#[test]
fn sigkill_loses_no_acknowledged_answer_and_runs_no_tool_twice_on_the_journal() -> anyhow::Result<()>
{
    let mut options = Options::from_env(CI_KILLS, None, child::is_broken())?;
    options.engine = Some("journal".into());
    let report = torture(options)?;
    anyhow::ensure!(
        report.problems() == 0,
        "{} problem(s) under SIGKILL on the journal, named in the report above",
        report.problems()
    );
    Ok(())
}

/// The harness is only worth something if it fails a runtime that breaks the guarantee: here
/// the non-retryable `charge` is declared `safe_to_retry`, and a kill while it runs must show
/// up as a double execution of `charge`.
#[test]
fn the_harness_catches_a_non_retryable_tool_marked_safe_to_retry() -> anyhow::Result<()> {
    // A fixed seed unless one is given: the check must not depend on luck.
    let mut options = Options::from_env(3, Some(13), true)?;
    options.kills = options.kills.min(3);
    let report = torture(options)?;
    let charged_twice: Vec<&check::Double> = report
        .findings
        .doubles
        .iter()
        .filter(|double| double.tool == "charge")
        .collect();
    anyhow::ensure!(
        !charged_twice.is_empty(),
        "the broken variant went unnoticed (report above)"
    );
    anyhow::ensure!(
        report.kills.exits.is_empty(),
        "children died on their own (report above)"
    );
    Ok(())
}
