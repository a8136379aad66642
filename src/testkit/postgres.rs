//! A throwaway PostgreSQL cluster for a test: `initdb` and `pg_ctl` in a temporary directory,
//! on a free loopback port, stopped when dropped. No containers: Debian's `postgresql`
//! package (`.ci/run` installs it). Where PostgreSQL is absent the test says so loudly and is
//! skipped, unless `DORMANT_REQUIRE_POSTGRES=1` (CI) makes that a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Why a [`PgCluster`] did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// PostgreSQL is not installed, and `DORMANT_REQUIRE_POSTGRES` says it must be.
    #[error("PostgreSQL is not installed (no initdb on PATH or in /usr/lib/postgresql/*/bin), and DORMANT_REQUIRE_POSTGRES is set; install Debian's package: apt-get install postgresql")]
    NotInstalled,
    /// Making its directory, finding a port or running a tool failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// A PostgreSQL tool exited with an error.
    #[error("{command} failed: {status}\n{stderr}")]
    Tool {
        /// The command line.
        command: String,
        /// How it exited.
        status: std::process::ExitStatus,
        /// What it wrote to stderr.
        stderr: String,
    },
}

/// A running PostgreSQL server of its own, in a temporary directory; stopped (immediately,
/// without a checkpoint) and removed when dropped.
///
/// ```no_run
/// # fn main() -> Result<(), dormant::testkit::ClusterError> {
/// let Some(cluster) = dormant::testkit::PgCluster::start()? else {
///     return Ok(()); // PostgreSQL is not installed: skipped, loudly.
/// };
/// let url = cluster.url(); // for PgStore::connect
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PgCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
}

impl PgCluster {
    /// A running cluster, or `None` (after saying why on stderr) where PostgreSQL is not
    /// installed.
    ///
    /// # Errors
    /// [`ClusterError::NotInstalled`] where it is not installed and `DORMANT_REQUIRE_POSTGRES`
    /// is set; else a tool that failed.
    pub fn start() -> Result<Option<Self>, ClusterError> {
        let Some(bin) = bin_dir() else {
            if std::env::var_os("DORMANT_REQUIRE_POSTGRES").is_some() {
                return Err(ClusterError::NotInstalled);
            }
            eprintln!(
                "\n*** SKIPPED: PostgreSQL is not installed (no initdb on PATH or in \
                 /usr/lib/postgresql/*/bin). Install Debian's package: apt-get install \
                 postgresql ***\n"
            );
            return Ok(None);
        };
        // initdb refuses to run as root: run the server as the postgres user then.
        let as_postgres = Command::new("id")
            .arg("-u")
            .output()
            .map_err(io("running id -u"))?
            .stdout
            .starts_with(b"0\n");
        let dir = tempfile::Builder::new()
            .prefix("dormant-pg-")
            .tempdir()
            .map_err(io("making the cluster's directory"))?;
        if as_postgres {
            run(Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path()))?;
        }
        let mut cluster = Self {
            dir,
            bin,
            port: free_port()?,
            as_postgres,
        };
        let data = cluster.data();
        cluster.pg("initdb", |command| {
            command
                .args([
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--no-sync",
                    "-D",
                ])
                .arg(&data);
        })?;
        let log = cluster.log();
        // The port was free when asked for, not necessarily still: another process of the
        // test run may have taken it while initdb ran. The server then does not start; it is
        // started again on another port.
        const STARTS: usize = 3;
        for attempt in 1..=STARTS {
            let options = format!(
                "-p {} -c listen_addresses=127.0.0.1 -k {}",
                cluster.port,
                cluster.dir.path().display()
            );
            let started = cluster.pg("pg_ctl", |command| {
                command
                    .args(["-w", "-D"])
                    .arg(&data)
                    .arg("-l")
                    .arg(&log)
                    .args(["-o", &options, "start"]);
            });
            match started {
                Ok(()) => break,
                Err(error) if attempt == STARTS => return Err(error),
                Err(_) => cluster.port = free_port()?,
            }
        }
        Ok(Some(cluster))
    }

    /// `127.0.0.1:PORT/postgres`, for a `postgres://user@…` URL.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}/postgres", self.port)
    }

    /// The server's log.
    pub fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// The URL of database `postgres` as user `postgres` (trusted on loopback).
    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Runs PostgreSQL's `tool`, as the postgres user when this process is root.
    fn pg(&self, tool: &str, args: impl FnOnce(&mut Command)) -> Result<(), ClusterError> {
        let program = self.bin.join(tool);
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            Command::new(&program)
        };
        args(&mut command);
        run(&mut command)
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let data = self.data();
        // Best effort: a server that is already gone needs no stop.
        let _ = self.pg("pg_ctl", |command| {
            command
                .args(["-D"])
                .arg(&data)
                .args(["-m", "immediate", "stop"]);
        });
    }
}

/// An I/O failure while doing `what`.
fn io(what: &str) -> impl FnOnce(std::io::Error) -> ClusterError + '_ {
    move |source| ClusterError::Io {
        what: what.to_owned(),
        source,
    }
}

fn run(command: &mut Command) -> Result<(), ClusterError> {
    let shown = format!("{command:?}");
    let output = command.output().map_err(|source| ClusterError::Io {
        what: format!("running {shown}"),
        source,
    })?;
    if !output.status.success() {
        return Err(ClusterError::Tool {
            command: shown,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(())
}

/// A loopback port nothing listens on now.
fn free_port() -> Result<u16, ClusterError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map_err(io("finding a free port"))?
        .port())
}

/// Where `initdb` and `pg_ctl` are: beside an `initdb` on PATH, else Debian's newest
/// `/usr/lib/postgresql/<version>/bin`.
fn bin_dir() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("initdb"))
            .find(|initdb| initdb.is_file())
    });
    if let Some(initdb) = on_path {
        let real = std::fs::canonicalize(&initdb).unwrap_or(initdb);
        return real.parent().map(Path::to_path_buf);
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("bin"))
        .filter(|bin| bin.join("initdb").is_file())
        .collect();
    versions.sort();
    versions.pop()
}
