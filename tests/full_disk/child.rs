//! The child's side of `tests/full_disk/main.rs`: one runtime on a `SledStore` in a small tmpfs,
//! sessions driven through execute → suspend → submit → resume while the disk fills, stays
//! full for a while, and is freed; then what the runtime shows is compared with a fresh open
//! of the store. Every line it reports starts with [`MARK`]; the parent checks them.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::Context;
use dormant::{
    AgentDefinition, Approval, ManualClock, Message, ModelReply, Runtime, ScriptedLlm, SledStore,
    ToolCall, ToolDefinition, ToolError,
};
use serde_json::{json, Value};

use crate::driver::{play_round, Driven};

/// Starts every line of the report (libtest may print the test's name before it).
pub(crate) const MARK: &str = "@@full-disk ";
/// The sessions driven, `s0` to `s23`.
pub(crate) const SESSIONS: usize = 24;
/// Bytes of a deploy's receipt: its result needs several new pages of the tmpfs, so a full disk
/// cannot hold the commit of that result in what is left of a page sled already wrote.
const RECEIPT_BYTES: usize = 16 * 1024;
/// The deploy that fills the disk while it runs, so that the commit of its own result (and of
/// whatever commits near it) fails after the tool has run: the case of issue 13.
const FILL_AT_DEPLOY: usize = 6;
/// Rounds played against the full disk before it is freed.
const FULL_ROUNDS: usize = 6;
/// Bytes of ballast freed after the first round on the full disk, doubled after each next one.
const FIRST_BREATH: u64 = 16 * 1024;
/// Generous bounds on the rounds of each phase, so a wedged session fails the test.
const MAX_ROUNDS: usize = 80;

/// One report line, flushed at once: a deploy is on the parent's side before its tool returns.
pub(crate) fn report(line: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{MARK}{line}")?;
    out.flush()
}

/// The receipt the deploy of session `session` returns.
pub(crate) fn receipt(session: &str) -> Value {
    json!({ "deployed": session, "receipt": "r".repeat(RECEIPT_BYTES) })
}

/// The ballast that fills the tmpfs, and the deploy counter that decides when.
struct Disk {
    ballast: PathBuf,
    deploys: AtomicUsize,
    full: AtomicBool,
}

impl Disk {
    /// Writes the ballast until the file system refuses: the disk is full to its last page.
    fn fill(&self) -> anyhow::Result<()> {
        let mut ballast = File::create(&self.ballast)?;
        let chunk = vec![0xb5; 64 * 1024];
        loop {
            match ballast.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => return Err(e.into()),
            }
        }
        self.full.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Frees `bytes` of the ballast: a disk that hovers at full, with room for some commits at
    /// a time, so that commits of every kind fail, not only reads.
    fn breathe(&self, bytes: u64) -> std::io::Result<()> {
        let ballast = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.ballast)?;
        let len = ballast.metadata()?.len();
        ballast.set_len(len.saturating_sub(bytes))
    }

    fn free(&self) -> std::io::Result<()> {
        std::fs::remove_file(&self.ballast)
    }
}

/// The approval-gated `deploy`: not safe to retry, reports each execution before returning,
/// and the [`FILL_AT_DEPLOY`]th one fills the disk.
fn deploy_tool(disk: Option<Arc<Disk>>) -> ToolDefinition {
    ToolDefinition::server(
        "deploy",
        move |_input: Value, ctx: dormant::definition::ToolContext| {
            let disk = disk.clone();
            async move {
                let session = ctx.session_id().to_string();
                let fail = |e: &dyn std::fmt::Display| ToolError::new(e.to_string());
                report(&format!("deploy {session} {}", ctx.tool_call_id()))
                    .map_err(|e| fail(&e))?;
                if let Some(disk) = disk {
                    if disk.deploys.fetch_add(1, Ordering::SeqCst) + 1 == FILL_AT_DEPLOY {
                        disk.fill().map_err(|e| fail(&e))?;
                        report(&format!("filled {session}")).map_err(|e| fail(&e))?;
                    }
                }
                Ok::<_, ToolError>(receipt(&session))
            }
        },
    )
    .require_approval(Approval::Always)
}

/// A runtime over the store in `dir` with agent `editor`: one reply calling the client tool
/// `edit` (`e1`) and `deploy` (`d1`), then the text `done`. Deadlines never fire (the clock
/// stands still), and nothing resumes by itself: the driver makes every move.
fn build_runtime(dir: &Path, disk: Option<Arc<Disk>>) -> anyhow::Result<Runtime> {
    let agent = AgentDefinition::builder("editor")
        .tool(ToolDefinition::client("edit"))
        .tool(deploy_tool(disk))
        .build()?;
    let script = vec![
        ModelReply::tool_calls(vec![
            ToolCall::new("e1", "edit", json!({})),
            ToolCall::new("d1", "deploy", json!({})),
        ]),
        ModelReply::text("done"),
    ];
    Ok(Runtime::builder()
        .store(Arc::new(SledStore::open(dir)?))
        .llm(Arc::new(ScriptedLlm::new().script("editor", script)))
        .clock(Arc::new(ManualClock::new(0)))
        .background_deadlines(false)
        .agent(agent)
        .build()?)
}

/// The whole child: fill, keep going on the full disk, free, finish, check, reopen.
pub(crate) async fn run(mount: &Path) -> anyhow::Result<()> {
    let dir = mount.join("store");
    let disk = Arc::new(Disk {
        ballast: mount.join("ballast"),
        deploys: AtomicUsize::new(0),
        full: AtomicBool::new(false),
    });
    let runtime = build_runtime(&dir, Some(Arc::clone(&disk)))?;
    let mut sessions = (0..SESSIONS)
        .map(Driven::new)
        .collect::<anyhow::Result<Vec<_>>>()?;

    let mut round = 0;
    let mut full_rounds = 0;
    while full_rounds < FULL_ROUNDS {
        anyhow::ensure!(round < MAX_ROUNDS, "the disk never filled");
        play_round(&runtime, &mut sessions, round, &dir, true).await?;
        round += 1;
        if disk.full.load(Ordering::SeqCst) {
            full_rounds += 1;
            // More room each time: from too little for sled to open its database again to
            // room for many commits (and for reads that fail in a database that just failed).
            disk.breathe(FIRST_BREATH << full_rounds)?;
        }
    }
    disk.free()?;
    report("freed")?;
    // From here on nothing may fail: the same runtime and store go on, not reopened.
    let last = round + MAX_ROUNDS;
    while sessions.iter().any(|s| !s.done) {
        if round == last {
            let mut stuck = Vec::new();
            for s in sessions.iter().filter(|s| !s.done) {
                stuck.push(format!("{} {:?}", s.id, runtime.status(&s.id).await));
            }
            anyhow::bail!("sessions wedged after the disk was freed: {stuck:?}");
        }
        play_round(&runtime, &mut sessions, round, &dir, false).await?;
        round += 1;
    }

    let mut shown = Vec::with_capacity(SESSIONS);
    for s in &sessions {
        // Returns at once unless a run is still going (a wedged one would hang the child,
        // which the parent reports).
        runtime.wait_settled(&s.id).await;
        let status = runtime.status(&s.id).await?;
        let pending = runtime.pending(&s.id).await?;
        anyhow::ensure!(
            status == dormant::Status::Completed && pending.is_empty(),
            "{}: {status} with calls pending: {pending:?}",
            s.id
        );
        shown.push(runtime.messages(&s.id).await?);
    }
    runtime.shutdown().await?;
    drop(runtime);

    // A fresh open of the directory: what the runtime showed is what is on disk.
    let reopened = build_runtime(&dir, None)?;
    anyhow::ensure!(
        reopened.session_ids().await?.len() == SESSIONS,
        "sessions on disk: {:?}",
        reopened.session_ids().await?
    );
    for (s, before) in sessions.iter().zip(&shown) {
        let messages: Vec<Message> = reopened.messages(&s.id).await?;
        anyhow::ensure!(
            &messages == before,
            "{}: the reopened store shows other messages",
            s.id
        );
        let status = reopened.status(&s.id).await?;
        let pending = reopened.pending(&s.id).await?.len();
        let messages = serde_json::to_string(&messages).context("messages as JSON")?;
        report(&format!("final {} {status} {pending} {messages}", s.id))?;
    }
    reopened.shutdown().await?;
    report("done")?;
    Ok(())
}
