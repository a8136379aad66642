//! The run's report: what was done to the store and what the checker found, with every
//! violation named by session and call.

use std::fmt;

use super::check::Findings;
use super::parent::{Kills, Options};

/// Lines of notes shown; the rest are counted.
const NOTES_SHOWN: usize = 12;

#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) options: Options,
    pub(crate) kills: Kills,
    pub(crate) findings: Findings,
}

impl Report {
    /// Violations, double executions, and children that died before their kill (a harness run that proves
    /// nothing, or a crash of the runtime itself).
    pub(crate) fn problems(&self) -> usize {
        self.findings.violations.len() + self.findings.doubles.len() + self.kills.exits.len()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (options, kills, found) = (&self.options, &self.kills, &self.findings);
        writeln!(
            f,
            "torture report (seed {}, replay with DORMANT_TORTURE_SEED={}{})",
            options.seed,
            options.seed,
            if options.broken {
                ", broken variant: charge marked safe_to_retry"
            } else {
                ""
            }
        )?;
        writeln!(
            f,
            "  kills: {} {:?}; the children reported {} non-retryable tool starts and {} acknowledged answers",
            kills.total, kills.by_trigger, kills.exec_lines, kills.accepted_lines
        )?;
        writeln!(
            f,
            "  sessions: {} roots ({} completed, {} failed), {} sub-agents; {} made by forks",
            found.roots, found.completed, found.failed, found.sub_agents, found.forks
        )?;
        let acknowledged: usize = found.acknowledged.values().sum();
        writeln!(
            f,
            "  acknowledged answers: {acknowledged} {:?} ({} by the checker)",
            found.acknowledged, found.acknowledged_by_checker
        )?;
        let executions: usize = found.executions.values().sum();
        writeln!(
            f,
            "  non-retryable executions: {executions} {:?}; retry-safe runs: {} ({} repeats)",
            found.executions, found.retry_safe_runs, found.retry_safe_repeats
        )?;
        writeln!(f, "  double executions: {}", found.doubles.len())?;
        let mut by_tool = std::collections::BTreeMap::<&str, usize>::new();
        for double in &found.doubles {
            *by_tool.entry(double.tool.as_str()).or_default() += 1;
        }
        if !by_tool.is_empty() {
            writeln!(f, "    by tool: {by_tool:?}")?;
        }
        for double in &found.doubles {
            writeln!(
                f,
                "    DOUBLE EXECUTION {} ran {} times for session {} call {} (in {})",
                double.tool,
                double.processes.len(),
                double.session,
                double.call,
                double.processes.join(", ")
            )?;
        }
        writeln!(f, "  torn journal lines (ignored): {}", found.torn_lines)?;
        let notes = kills.notes.iter().chain(&found.notes);
        let count = kills.notes.len() + found.notes.len();
        writeln!(f, "  notes (children, then checker): {count}")?;
        for note in notes.take(NOTES_SHOWN) {
            writeln!(f, "    {note}")?;
        }
        for exit in &kills.exits {
            writeln!(f, "  CHILD DIED: {exit}")?;
        }
        writeln!(f, "  violations: {}", found.violations.len())?;
        for violation in &found.violations {
            writeln!(f, "    VIOLATION {violation}")?;
        }
        Ok(())
    }
}
