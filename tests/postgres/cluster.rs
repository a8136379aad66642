//! A throwaway PostgreSQL cluster for a test: `initdb` and `pg_ctl` in a temporary directory,
//! on a free loopback port, stopped when dropped. No containers: Debian's `postgresql`
//! package (`.ci/run` installs it). Where PostgreSQL is absent the test says so loudly and is
//! skipped, unless `DORMANT_REQUIRE_POSTGRES=1` (CI) makes that a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

pub(crate) struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
}

impl Cluster {
    /// A running cluster, or `None` (after saying why) where PostgreSQL is not installed.
    pub(crate) fn start() -> anyhow::Result<Option<Self>> {
        let Some(bin) = bin_dir() else {
            let message = "SKIPPED: PostgreSQL is not installed (no initdb on PATH or in \
                           /usr/lib/postgresql/*/bin). Install Debian's package: \
                           apt-get install postgresql";
            if std::env::var_os("DORMANT_REQUIRE_POSTGRES").is_some() {
                bail!("{message} (DORMANT_REQUIRE_POSTGRES is set)");
            }
            eprintln!("\n*** {message} ***\n");
            return Ok(None);
        };
        // initdb refuses to run as root: run the server as the postgres user then.
        let as_postgres = Command::new("id")
            .arg("-u")
            .output()?
            .stdout
            .starts_with(b"0\n");
        let dir = tempfile::Builder::new().prefix("dormant-pg-").tempdir()?;
        if as_postgres {
            run(Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path()))?;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let cluster = Self {
            dir,
            bin,
            port,
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
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {}",
            cluster.port,
            cluster.dir.path().display()
        );
        let log = cluster.dir.path().join("server.log");
        cluster.pg("pg_ctl", |command| {
            command
                .args(["-w", "-D"])
                .arg(&data)
                .arg("-l")
                .arg(&log)
                .args(["-o", &options, "start"]);
        })?;
        Ok(Some(cluster))
    }

    /// `127.0.0.1:PORT/postgres`, for a `postgres://user@…` URL.
    #[allow(dead_code)]
    pub(crate) fn address(&self) -> String {
        format!("127.0.0.1:{}/postgres", self.port)
    }

    /// The server's log.
    #[allow(dead_code)]
    pub(crate) fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// The URL of database `postgres` as user `postgres` (trusted on loopback).
    pub(crate) fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Runs PostgreSQL's `tool`, as the postgres user when this process is root.
    fn pg(&self, tool: &str, args: impl FnOnce(&mut Command)) -> anyhow::Result<()> {
        let program = self.bin.join(tool);
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&program);
            command
        } else {
            Command::new(&program)
        };
        args(&mut command);
        run(&mut command).with_context(|| format!("{tool} failed"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.data();
        let _ = self.pg("pg_ctl", |command| {
            command
                .args(["-D"])
                .arg(&data)
                .args(["-m", "immediate", "stop"]);
        });
    }
}

fn run(command: &mut Command) -> anyhow::Result<()> {
    let output = command.output().with_context(|| format!("{command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?}: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
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
