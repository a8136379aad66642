//! What running scenario files found: a report per file, one failure per failing step, and
//! the closing count.

use std::fmt;
use std::path::{Path, PathBuf};

use super::error::Error;

/// A step whose op or expectations failed. Displays as
/// `FILE: step N (op): expected X, got Y`, where N is the step's index in `steps` (as in the
/// JSON path `steps[N]`); a runtime that does not shut down after the last step displays as
/// `FILE: after the last step (shutdown): …`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepFailure {
    file: PathBuf,
    index: Option<usize>,
    op: &'static str,
    message: String,
}

impl StepFailure {
    pub(crate) fn new(
        file: &Path,
        index: Option<usize>,
        op: &'static str,
        message: String,
    ) -> Self {
        Self {
            file: file.to_path_buf(),
            index,
            op,
            message,
        }
    }

    /// The step's index in the file's `steps`, from 0 (`None` for the shutdown after the
    /// last step).
    pub fn index(&self) -> Option<usize> {
        self.index
    }

    /// The step's op (`execute`, `check`, …).
    pub fn op(&self) -> &str {
        self.op
    }

    /// What went wrong: `expected X, got Y` (several joined by `; `), or why the op could not
    /// run.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for StepFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.file.display())?;
        match self.index {
            Some(index) => write!(f, "step {index}")?,
            None => f.write_str("after the last step")?,
        }
        write!(f, " ({}): {}", self.op, self.message)
    }
}

/// How one scenario file ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileReport {
    file: PathBuf,
    name: String,
    steps: usize,
    failures: Vec<StepFailure>,
}

impl FileReport {
    pub(crate) fn new(file: &Path, name: &str, steps: usize, failures: Vec<StepFailure>) -> Self {
        Self {
            file: file.to_path_buf(),
            name: name.to_string(),
            steps,
            failures,
        }
    }

    /// The file.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The scenario's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many steps the file has.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// The steps that failed, in order.
    pub fn failures(&self) -> &[StepFailure] {
        &self.failures
    }

    /// Whether every step passed.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// The outcome of a run over several files. Displays as the closing line
/// `N passed, M failed`, counting files.
#[derive(Debug, Default)]
pub struct Summary {
    results: Vec<Result<FileReport, Error>>,
}

impl Summary {
    pub(crate) fn push(&mut self, result: Result<FileReport, Error>) {
        self.results.push(result);
    }

    /// Each file's report, or why it could not run, in the order the files ran.
    pub fn results(&self) -> &[Result<FileReport, Error>] {
        &self.results
    }

    /// Files whose steps all passed.
    pub fn passed(&self) -> usize {
        self.results
            .iter()
            .filter(|result| result.as_ref().is_ok_and(FileReport::passed))
            .count()
    }

    /// Files with a failing step, or that could not run.
    pub fn failed(&self) -> usize {
        self.results.len() - self.passed()
    }

    /// Whether every file passed.
    pub fn all_passed(&self) -> bool {
        self.failed() == 0
    }

    /// One line per failing step, and one per file that could not run, in file order.
    pub fn failure_lines(&self) -> Vec<String> {
        self.results
            .iter()
            .flat_map(|result| match result {
                Ok(report) => report.failures.iter().map(ToString::to_string).collect(),
                Err(error) => vec![error.to_string()],
            })
            .collect()
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} passed, {} failed", self.passed(), self.failed())
    }
}
