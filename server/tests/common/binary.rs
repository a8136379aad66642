//! The `dormant-server` binary as a child process, for the tests that restart or kill it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::Context;

/// A running `dormant-server`, killed when dropped.
pub struct Binary {
    pub child: Child,
    pub base: String,
}

impl Binary {
    /// Starts the demo server on `listen` (e.g. `127.0.0.1:0`) and the store in `store`, and
    /// waits for the line that says where it listens.
    pub fn start(store: &Path, listen: &str, extra: &[&str]) -> anyhow::Result<Self> {
        Self::start_with_env(store, listen, extra, &[])
    }

    /// As [`Binary::start`], with these environment variables set.
    pub fn start_with_env(
        store: &Path,
        listen: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        Self::spawn(
            Command::new(env!("CARGO_BIN_EXE_dormant-server")),
            store,
            listen,
            extra,
            env,
            Stdio::inherit(),
        )
    }

    /// As [`Binary::start_with_env`], its log (stderr) written to `log`.
    pub fn start_logging_to(
        store: &Path,
        listen: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        log: &Path,
    ) -> anyhow::Result<Self> {
        Self::spawn(
            Command::new(env!("CARGO_BIN_EXE_dormant-server")),
            store,
            listen,
            extra,
            env,
            std::fs::File::create(log)?.into(),
        )
    }

    /// The binary as [`Binary::start_with_env`] runs it, for a test that waits for its exit.
    pub fn command(store: &Path, listen: &str, extra: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_dormant-server"));
        command
            .args([
                "--listen",
                listen,
                "--demo",
                "--allow-unauthenticated",
                "--store",
            ])
            .arg(store)
            .args(extra)
            .env("RUST_LOG", "warn");
        command
    }

    /// As [`Binary::start`], started by a shell that first lowers its soft limit on open files
    /// to `soft` (as a system whose default is 256 would).
    pub fn start_with_soft_fd_limit(
        store: &Path,
        listen: &str,
        extra: &[&str],
        soft: u64,
    ) -> anyhow::Result<Self> {
        let mut shell = Command::new("sh");
        shell
            .arg("-c")
            .arg(format!("ulimit -Sn {soft} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_dormant-server"));
        Self::spawn(shell, store, listen, extra, &[], Stdio::inherit())
    }

    fn spawn(
        mut command: Command,
        store: &Path,
        listen: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        stderr: Stdio,
    ) -> anyhow::Result<Self> {
        let mut child = command
            .args([
                "--listen",
                listen,
                "--demo",
                "--allow-unauthenticated",
                "--store",
            ])
            .arg(store)
            .args(extra)
            .env("RUST_LOG", "warn")
            // The keyword-driven demo model, whatever the shell running the tests has set.
            .env_remove("OPENAI_BASE_URL")
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_MODEL")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let base = line
            .trim()
            .strip_prefix("dormant-server listening on ")
            .with_context(|| format!("unexpected first line {line:?}"))?
            .to_string();
        Ok(Self { child, base })
    }

    /// The port it listens on.
    pub fn port(&self) -> anyhow::Result<&str> {
        self.base.rsplit(':').next().context("no port")
    }

    /// SIGKILL, and wait.
    pub fn kill(mut self) -> anyhow::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// SIGTERM (a graceful shutdown), and wait for the exit status.
    pub fn terminate(mut self) -> anyhow::Result<std::process::ExitStatus> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill -TERM failed");
        Ok(self.child.wait()?)
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
