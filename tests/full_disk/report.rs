//! The parent's side of `tests/full_disk/main.rs`: runs the child in a mount namespace with a small
//! tmpfs and reads what it reports.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use dormant::Message;

use crate::child::MARK;

/// Where the child mounts its tmpfs; set, it makes the child test run.
pub(crate) const MOUNT_ENV: &str = "DORMANT_FULL_DISK_MOUNT";
/// How long the parent waits for any line of the child's report before calling it hung.
const LINE_TIMEOUT: Duration = Duration::from_secs(60);

/// What the child reported.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) mounted: bool,
    /// (session, call) → how many times the deploy ran.
    pub(crate) deploys: BTreeMap<(String, String), usize>,
    /// (session, call) → every answer submitted, and those acknowledged `accepted`.
    pub(crate) attempts: BTreeMap<(String, String), Vec<String>>,
    pub(crate) accepted: BTreeMap<(String, String), Vec<String>>,
    /// (session, what it tried) of every `StorageFull`.
    pub(crate) storage_full: Vec<(String, String)>,
    pub(crate) filled_by: Option<String>,
    /// Answers accepted and deploys run between the disk filling and its being freed.
    pub(crate) landed_while_full: usize,
    pub(crate) freed: bool,
    /// Session → its status, pending calls and messages, from a fresh open of the store.
    pub(crate) finals: BTreeMap<String, (String, usize, Vec<Message>)>,
    pub(crate) done: bool,
}

impl Report {
    fn read(&mut self, line: &str) -> anyhow::Result<()> {
        // libtest may print the test's name on the same line, before the report.
        let Some(at) = line.find(MARK) else {
            return Ok(());
        };
        let line = &line[at + MARK.len()..];
        let mut words = line.splitn(4, ' ');
        let (kind, a, b, rest) = (
            words.next().unwrap_or_default(),
            words.next().unwrap_or_default().to_string(),
            words.next().unwrap_or_default().to_string(),
            words.next().unwrap_or_default(),
        );
        if matches!(kind, "accepted" | "deploy") && self.filled_by.is_some() && !self.freed {
            self.landed_while_full += 1;
        }
        match kind {
            "mounted" => self.mounted = true,
            "deploy" => *self.deploys.entry((a, b)).or_default() += 1,
            "attempt" => self.attempts.entry((a, b)).or_default().push(rest.into()),
            "accepted" => self.accepted.entry((a, b)).or_default().push(rest.into()),
            "storage_full" => self.storage_full.push((a, format!("{b} {rest}"))),
            // A retried submit found the answer of a failed one on disk.
            "already" => {}
            "filled" => self.filled_by = Some(a),
            "freed" => self.freed = true,
            "final" => {
                // `final ID STATUS PENDING MESSAGES`: the JSON may hold spaces.
                let (pending, messages) = rest.split_once(' ').unwrap_or_default();
                let messages = serde_json::from_str(messages)?;
                self.finals.insert(a, (b, pending.parse()?, messages));
            }
            "done" => self.done = true,
            other => anyhow::bail!("unknown report line {other}: {line}"),
        }
        Ok(())
    }
}

/// Whether this process runs as root (the effective id on the `Uid:` line of
/// `/proc/self/status`).
fn runs_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// Runs the child in a mount namespace of its own with a 4 MiB tmpfs on `mount`, and reads its
/// report (every line within [`LINE_TIMEOUT`], or the child is killed as hung).
pub(crate) fn run_child(mount: &std::path::Path) -> anyhow::Result<Report> {
    let mut unshare = Command::new("unshare");
    if !runs_as_root() {
        // An unprivileged user may mount a tmpfs in a user namespace of its own.
        unshare.arg("--map-root-user");
    }
    let script = format!(
        "mount -t tmpfs -o size=4m tmpfs \"$1\" && echo '{MARK}mounted' && \
         exec \"$2\" --ignored --exact full_disk_child --nocapture --test-threads=1"
    );
    let mut process = unshare
        .args(["--mount", "sh", "-c", &script, "sh"])
        .arg(mount)
        .arg(std::env::current_exe()?)
        .env(MOUNT_ENV, mount)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            anyhow::anyhow!(
                "this test runs util-linux `unshare` to mount a small tmpfs, and cannot run it: {e}"
            )
        })?;
    let (stdout, mut stderr) = match (process.stdout.take(), process.stderr.take()) {
        (Some(stdout), Some(stderr)) => (stdout, stderr),
        _ => anyhow::bail!("the child has no stdout or stderr"),
    };
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let (lines, receive) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut report = Report::default();
    let mut tail = Vec::new();
    let read = loop {
        match receive.recv_timeout(LINE_TIMEOUT) {
            Ok(line) => {
                let line = line?;
                let read = report.read(&line);
                tail.push(line);
                if let Err(error) = read {
                    break Err(error);
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break Ok(()),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                break Err(anyhow::anyhow!(
                    "the child wrote nothing for {LINE_TIMEOUT:?}"
                ))
            }
        }
    };
    if read.is_err() {
        process.kill()?;
    }
    let status = process.wait()?;
    let stderr = errors.join().unwrap_or_default();
    let tail = tail[tail.len().saturating_sub(20)..].join("\n");
    anyhow::ensure!(
        report.mounted,
        "this test mounts a small tmpfs in a mount namespace of its own, which needs root (or \
         unprivileged user namespaces) and util-linux `unshare`; that failed ({status}):\n{stderr}"
    );
    read?;
    anyhow::ensure!(
        status.success() && report.done,
        "the full-disk child failed ({status}); the end of its report:\n{tail}\n{stderr}"
    );
    Ok(report)
}
