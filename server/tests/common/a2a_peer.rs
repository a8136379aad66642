//! The official A2A SDK (the Python `a2a-sdk`, pinned, from PyPI) that the A2A tests talk to:
//! `.ci/run` installs it into a virtual environment and sets `DORMANT_A2A_PYTHON` to its
//! interpreter. `tests/a2a/agent.py` is an agent built with its server side, run on uvicorn.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::Context;
use serde_json::Value;

/// The interpreter with `a2a-sdk`, or `None` (said loudly).
pub fn python() -> anyhow::Result<Option<std::ffi::OsString>> {
    if let Some(python) = std::env::var_os("DORMANT_A2A_PYTHON").filter(|path| !path.is_empty()) {
        return Ok(Some(python));
    }
    let _ = writeln!(
        std::io::stderr(),
        "\n\n*** SKIPPED: the A2A test needs the official SDK: python3 -m venv DIR && \
         DIR/bin/pip install 'a2a-sdk[http-server]==1.3.0' uvicorn==0.38.0, then DORMANT_A2A_PYTHON=DIR/bin/python ***\n\n"
    );
    anyhow::ensure!(
        std::env::var("DORMANT_REQUIRE_A2A").map_or(true, |value| value.is_empty() || value == "0"),
        "DORMANT_REQUIRE_A2A is set and DORMANT_A2A_PYTHON is not"
    );
    Ok(None)
}

/// `tests/a2a/agent.py` on a free loopback port, killed when dropped; what it did is in its log.
pub struct Agent {
    child: Child,
    pub base: String,
    pub log: PathBuf,
}

impl Agent {
    /// Starts the agent with `python`, logging to `log`, and waits for the line that says
    /// where it listens.
    pub fn start(python: &std::ffi::OsStr, log: &Path) -> anyhow::Result<Self> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/a2a/agent.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(log)
            .stdout(Stdio::piped())
            .spawn()
            .context("starting tests/a2a/agent.py")?;
        let stdout = child.stdout.take().context("the agent's stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        // Killed when dropped, also if it did not say where it listens.
        let mut agent = Self {
            child,
            base: String::new(),
            log: log.to_path_buf(),
        };
        let port = line
            .trim()
            .strip_prefix("listening ")
            .with_context(|| format!("tests/a2a/agent.py said {line:?}, not where it listens"))?;
        agent.base = format!("http://127.0.0.1:{port}");
        Ok(agent)
    }

    /// The events of its log (`started`, `answered`, `canceled`), in order.
    pub fn events(&self) -> anyhow::Result<Vec<Value>> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .map(|line| Ok(serde_json::from_str(line)?))
            .collect()
    }

    /// How many events of `kind` its log holds.
    pub fn count(&self, kind: &str) -> anyhow::Result<usize> {
        Ok(self
            .events()?
            .iter()
            .filter(|event| event["event"] == kind)
            .count())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
