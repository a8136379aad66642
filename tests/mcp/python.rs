//! The official Python SDK's MCP server (`tests/mcp/server.py`) over stdio, for the MCP tests.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use dormant::mcp::{McpServer, McpTools};

/// The interpreter with the `mcp` package, or `None` (said loudly).
fn python() -> anyhow::Result<Option<std::ffi::OsString>> {
    if let Some(python) = std::env::var_os("DORMANT_MCP_PYTHON").filter(|path| !path.is_empty()) {
        return Ok(Some(python));
    }
    let _ = writeln!(
        std::io::stderr(),
        "\n\n*** SKIPPED: the MCP test needs the official Python SDK: python3 -m venv DIR && \
         DIR/bin/pip install mcp==2.3.0, then DORMANT_MCP_PYTHON=DIR/bin/python ***\n\n"
    );
    anyhow::ensure!(
        std::env::var("DORMANT_REQUIRE_MCP").map_or(true, |value| value.is_empty() || value == "0"),
        "DORMANT_REQUIRE_MCP is set and DORMANT_MCP_PYTHON is not"
    );
    Ok(None)
}

/// `tests/mcp/server.py` over stdio, connected, logging what it runs into a temporary
/// directory (where a test may keep its store too).
pub(crate) struct PythonServer {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) log: PathBuf,
    pub(crate) tools: McpTools,
}

impl PythonServer {
    /// The server, or `None` where the Python SDK is missing (said loudly by [`python`]).
    pub(crate) async fn start() -> anyhow::Result<Option<Self>> {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("log");
        Self::start_in(dir, log).await
    }

    /// Another server that appends to `log` (as one started again after dormant restarted).
    #[allow(dead_code)] // Not every test binary that includes the server starts another.
    pub(crate) async fn start_logging_to(log: &Path) -> anyhow::Result<Option<Self>> {
        Self::start_in(tempfile::tempdir()?, log.to_path_buf()).await
    }

    async fn start_in(dir: tempfile::TempDir, log: PathBuf) -> anyhow::Result<Option<Self>> {
        let Some(python) = python()? else {
            return Ok(None);
        };
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/server.py");
        let server = McpServer::stdio("python", python)
            .arg(script)
            .env("MCP_LOG", &log)
            .connect_timeout(Duration::from_secs(30));
        let tools = McpTools::connect(server).await?;
        Ok(Some(Self { dir, log, tools }))
    }

    /// The lines of its log: each call that reached it.
    pub(crate) fn logged(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}
