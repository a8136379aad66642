//! A full disk with large values never hangs (issue 30, goal 4): on a real full file system (a
//! small tmpfs, in a mount namespace of its own), sessions whose messages are 16 KiB or 1 MiB
//! are run until the disk refuses them. Every commit must answer within a bound, a full disk
//! must be the typed, retryable `StorageFull`, reads of what was acknowledged must go on being
//! answered while the disk is full, and once space is freed the same runtime and store must
//! commit again, with nothing acknowledged lost. Repeated, since where sled's write fails
//! decides whether it can hang.
//!
//! The same runs on `FjallStore` (feature `fjall`) and `JournalStore` (feature `journal`; the
//! child opens them when the parent names them in `DORMANT_FULL_DISK_LARGE_ENGINE`), on larger
//! tmpfs: see the tests.
//!
//! The child is this test binary, re-run with `--ignored --exact full_disk_large_child` under
//! `unshare --mount` (with `--map-root-user` when not root), the tmpfs mounted at the path the
//! parent gives. It reports each step on stdout; a step that takes longer than [`STEP_BOUND`]
//! fails the child (the parent also kills a child that stays silent).

use std::io::{BufRead, Write};

use anyhow::Context;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use dormant::{AgentDefinition, ModelReply, Runtime, ScriptedLlm, SessionId, SledStore, Status};

const MOUNT_ENV: &str = "DORMANT_FULL_DISK_LARGE_MOUNT";
/// `fjall` or `journal`: the child's store is a `FjallStore` or a `JournalStore`.
const ENGINE_ENV: &str = "DORMANT_FULL_DISK_LARGE_ENGINE";
const MARK: &str = "@@full-disk-large ";
/// A commit or a read that takes longer than this is a hang (a healthy one takes
/// milliseconds, even on a loaded machine).
const STEP_BOUND: Duration = Duration::from_secs(20);
/// The tmpfs: large enough for a few 1 MiB messages beside sled's own files.
const TMPFS: &str = "24m";
/// fjall's: `FjallStore` keeps 80 MiB free for fjall's own writing (a segment of up to one
/// 64 MiB memtable, its journal; a commit that would leave less is `StorageFull`), and the
/// 80 MiB left to fill are more than a memtable holds, so that fjall writes one out while the
/// disk fills.
#[cfg(feature = "fjall")]
const TMPFS_FJALL: &str = "160m";
/// The journal's: its first file takes 64 MiB of zeros at once, and the 32 MiB left are more
/// than the next file's 64 MiB can have, so the disk fills while the store goes on in a file
/// that grows as it is written.
#[cfg(all(unix, feature = "journal"))]
const TMPFS_JOURNAL: &str = "96m";
/// Rounds per value size, each on a fresh store.
const ROUNDS: usize = 3;

fn report(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{MARK}{line}");
    let _ = out.flush();
}

/// Runs `step`, failing (and reporting) if it takes longer than [`STEP_BOUND`].
async fn bounded<T>(what: &str, step: impl std::future::Future<Output = T>) -> anyhow::Result<T> {
    match tokio::time::timeout(STEP_BOUND, step).await {
        Ok(value) => Ok(value),
        Err(_) => {
            report(&format!("hang {what}"));
            anyhow::bail!("{what} did not answer within {STEP_BOUND:?}: the store hangs")
        }
    }
}

fn runtime_on(dir: &Path) -> anyhow::Result<Runtime> {
    let llm = ScriptedLlm::new().script("echo", vec![ModelReply::text("noted")]);
    let store: Arc<dyn dormant::store::Store> = match std::env::var(ENGINE_ENV).as_deref() {
        #[cfg(feature = "fjall")]
        Ok("fjall") => Arc::new(dormant::FjallStore::open(dir)?),
        #[cfg(all(unix, feature = "journal"))]
        Ok("journal") => Arc::new(dormant::JournalStore::open(dir)?),
        _ => Arc::new(SledStore::open(dir)?),
    };
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .agent(AgentDefinition::builder("echo").build()?)
        .background_deadlines(false)
        .build()?)
}

/// One round: fill the disk with sessions whose first message is `size` bytes, check the
/// full disk answers (typed, retryable, reads go on), free space, commit again.
async fn round(mount: &Path, size: usize, round: usize) -> anyhow::Result<()> {
    let dir = mount.join(format!("store-{size}-{round}"));
    // Room to free later: a ballast that the full disk is made of too.
    let ballast = mount.join("ballast");
    std::fs::write(&ballast, vec![0u8; 4 * 1024 * 1024])?;
    let runtime = runtime_on(&dir)?;
    let message = "m".repeat(size);
    let mut acknowledged: Vec<SessionId> = Vec::new();
    let mut full = 0;
    for index in 0..10_000 {
        let id: SessionId = format!("s{index}").parse()?;
        let ran = bounded(
            "an execute",
            runtime.execute_on(&id, "echo", message.clone()),
        )
        .await?;
        match ran {
            Ok(run) if run.status == Status::Completed => acknowledged.push(id),
            Ok(run) => anyhow::bail!("{id} ended {:?}", run.status),
            Err(error) if is_storage_full(&error) => {
                full += 1;
                anyhow::ensure!(
                    runtime.store_degraded().is_some(),
                    "a full disk, and the store does not say it is degraded"
                );
                // Reads of what was acknowledged go on, on the full disk.
                if let Some(first) = acknowledged.first() {
                    let status = bounded("a read on the full disk", runtime.status(first)).await;
                    match status?.map_err(dormant::Error::from) {
                        Ok(Status::Completed) => {}
                        Ok(other) => anyhow::bail!("{first} reads {other:?} on a full disk"),
                        // A read can meet the full disk too (sled writes as it reads); typed.
                        Err(error) if is_storage_full(&error) => {}
                        Err(error) => anyhow::bail!("a read on the full disk: {error}"),
                    }
                }
                if full >= 3 {
                    break;
                }
            }
            Err(error) => anyhow::bail!("{id}: {error}"),
        }
    }
    anyhow::ensure!(full > 0, "the disk never filled");
    report(&format!(
        "full size={size} round={round} acknowledged={}",
        acknowledged.len()
    ));

    // Space again: the same runtime commits again (once the store has let the failed database
    // go and opened it again, off the committers' path: a client retries meanwhile), and
    // nothing acknowledged was lost.
    std::fs::remove_file(&ballast)?;
    let again: SessionId = "after".parse()?;
    let retried = async {
        loop {
            match runtime.execute_on(&again, "echo", "small").await {
                Ok(run) if run.status == Status::Completed => return Ok(()),
                Ok(run) => anyhow::bail!("after space returned: {:?}", run.status),
                Err(error) if is_storage_full(&error) || is_reopening(&error) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(error) => anyhow::bail!("after space returned: {error}"),
            }
        }
    };
    bounded("committing again after space returned", retried).await??;
    anyhow::ensure!(
        runtime.store_degraded().is_none(),
        "still degraded once space returned"
    );
    for id in &acknowledged {
        let status = bounded("a read after space returned", runtime.status(id))
            .await?
            .context("a read after space returned")?;
        anyhow::ensure!(status == Status::Completed, "{id}: {status:?}");
    }
    bounded("the shutdown", runtime.shutdown())
        .await?
        .context("the shutdown after space returned")?;
    std::fs::remove_dir_all(&dir)?;
    report(&format!("recovered size={size} round={round}"));
    Ok(())
}

/// The store says it is opening its database again after a failed write.
fn is_reopening(error: &dormant::Error) -> bool {
    error
        .to_string()
        .contains("opened again after a failed write")
}

fn is_storage_full(error: &dormant::Error) -> bool {
    matches!(
        error,
        dormant::Error::Store(dormant::store::Error::StorageFull { .. })
    ) || error.to_string().contains("no space left")
        || error.to_string().to_lowercase().contains("storage full")
}

/// The child: runs only with `MOUNT_ENV` set, inside the namespace the parent made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the child process of a_full_disk_with_large_values_never_hangs_and_recovers"]
async fn full_disk_large_child() -> anyhow::Result<()> {
    let Some(mount) = std::env::var_os(MOUNT_ENV) else {
        return Ok(());
    };
    let mount = Path::new(&mount);
    for size in [16 * 1024, 1024 * 1024] {
        for index in 0..ROUNDS {
            round(mount, size, index).await?;
        }
    }
    report("done");
    Ok(())
}

fn runs_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

#[cfg(target_os = "linux")]
#[test]
fn a_full_disk_with_large_values_never_hangs_and_recovers() -> anyhow::Result<()> {
    full_disk_on("sled", TMPFS)
}

/// The same on fjall, on a disk 40 MiB larger: `FjallStore` keeps 32 MiB free for fjall's own
/// writing (ARCHITECTURE.md, "fjall: a second embedded engine").
#[cfg(feature = "fjall")]
#[test]
fn a_full_disk_with_large_values_never_hangs_and_recovers_on_fjall() -> anyhow::Result<()> {
    full_disk_on("fjall", TMPFS_FJALL)
}

/// The same on the journal, on a disk of 96 MiB (see [`TMPFS_JOURNAL`]).
#[cfg(all(unix, feature = "journal"))]
#[test]
fn a_full_disk_with_large_values_never_hangs_and_recovers_on_the_journal() -> anyhow::Result<()> {
    full_disk_on("journal", TMPFS_JOURNAL)
}

/// Runs the child on store `engine` in a tmpfs of its own and checks its report.
fn full_disk_on(engine: &str, tmpfs: &str) -> anyhow::Result<()> {
    if std::env::var_os(MOUNT_ENV).is_some() {
        return Ok(());
    }
    let mount = tempfile::tempdir()?;
    let mut unshare = Command::new("unshare");
    if !runs_as_root() {
        unshare.arg("--map-root-user");
    }
    let script = format!(
        "mount -t tmpfs -o size={tmpfs} tmpfs \"$1\" && echo '{MARK}mounted' && \
         exec \"$2\" --ignored --exact full_disk_large_child --nocapture --test-threads=1"
    );
    let mut child = unshare
        .args(["--mount", "sh", "-c", &script, "sh"])
        .arg(mount.path())
        .arg(std::env::current_exe()?)
        .env(MOUNT_ENV, mount.path())
        .env(ENGINE_ENV, engine)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            anyhow::anyhow!("this test runs util-linux `unshare` to mount a tmpfs: {e}")
        })?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut stderr = child
        .stderr
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stderr"))?;
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
    let mut seen = Vec::new();
    let silent = loop {
        match receive.recv_timeout(STEP_BOUND * 3) {
            Ok(Ok(line)) => seen.push(line),
            Ok(Err(_)) | Err(mpsc::RecvTimeoutError::Disconnected) => break false,
            Err(mpsc::RecvTimeoutError::Timeout) => break true,
        }
    };
    if silent {
        child.kill()?;
    }
    let status = child.wait()?;
    let stderr = errors.join().unwrap_or_default();
    let marked: Vec<&str> = seen
        .iter()
        .filter_map(|line| line.find(MARK).map(|at| &line[at + MARK.len()..]))
        .collect();
    if !marked.contains(&"mounted") {
        if std::env::var_os("DORMANT_REQUIRE_TMPFS").is_some() {
            anyhow::bail!("cannot mount a tmpfs in a mount namespace ({status}):\n{stderr}");
        }
        eprintln!(
            "SKIPPED: this test mounts a tmpfs in a mount namespace of its own (root, or \
             unprivileged user namespaces, and util-linux `unshare`); that failed: {stderr}"
        );
        return Ok(());
    }
    // The child's own error first: its backtrace would push it out of the last lines.
    let error: Vec<&str> = stderr
        .lines()
        .filter(|line| line.starts_with("Error:"))
        .collect();
    anyhow::ensure!(
        !silent && status.success() && marked.contains(&"done"),
        "the child failed or hung ({status}, silent: {silent}); its report: {marked:?}\n{}\n{}",
        error.join("\n"),
        stderr.lines().rev().take(30).collect::<Vec<_>>().join("\n")
    );
    let recovered = marked
        .iter()
        .filter(|line| line.starts_with("recovered"))
        .count();
    anyhow::ensure!(recovered == 2 * ROUNDS, "{marked:?}");
    Ok(())
}
