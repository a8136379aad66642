//! The simulated client: it answers what a tree of sessions waits on (against the ROOT, as a
//! browser would), sometimes twice, and resumes the root until the tree ends. Children and the
//! checker drive sessions with it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dormant::definition::Reconciled;
use dormant::types::PendingCall;
use dormant::{PendingKind, Runtime, SessionId, Status};
use dormant::{Submit, SubmitOutcome};
use serde_json::json;

use super::journal::{executed, Acknowledged, Journal, Sent};
use super::rng::Rng;
use super::workload::{tool_output, Process};

/// A runtime call that takes longer than this is hung: reported, not waited for forever.
const HUNG: Duration = Duration::from_secs(20);

/// How one client behaves.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Behaviour {
    /// Percent of answers submitted a second time, with another value.
    pub(crate) duplicates: u64,
    /// Percent of rounds that evict the root before resuming it.
    pub(crate) evictions: u64,
    /// Upper bound of the pause between rounds, in ms (0: none).
    pub(crate) latency_ms: u64,
    /// Answer every waiting call each round, or leave some for later (a resume then meets the
    /// barrier).
    pub(crate) answer_all: bool,
    /// Percent of rounds on a waiting tree that fork it at its latest checkpoint first (once
    /// a tree, as `{root}.f`; forks are not forked again). A fork is a root of its own, driven
    /// by the next generation and the checker.
    pub(crate) forks: u64,
}

#[derive(Debug)]
pub(crate) struct Client {
    pub(crate) runtime: Runtime,
    pub(crate) process: Arc<Process>,
    pub(crate) accepted: Arc<Journal>,
    pub(crate) rng: Rng,
    pub(crate) behaviour: Behaviour,
    /// What went wrong or was unexpected, for the report.
    pub(crate) notes: Vec<String>,
    /// Makes every submitted value distinct, so the checker can tell which one was applied.
    sent: u64,
    /// A runtime call hung: the drive stops, so a hung tree costs one timeout, not one per
    /// round.
    hung: bool,
}

impl Client {
    pub(crate) fn new(
        runtime: Runtime,
        process: Arc<Process>,
        accepted: Arc<Journal>,
        rng: Rng,
        behaviour: Behaviour,
    ) -> Self {
        Self {
            runtime,
            process,
            accepted,
            rng,
            behaviour,
            notes: Vec::new(),
            sent: 0,
            hung: false,
        }
    }

    /// Drives the tree of `root` for at most `rounds` rounds; returns the root's last status.
    pub(crate) async fn drive(&mut self, root: &SessionId, rounds: usize) -> Option<Status> {
        let mut status = None;
        for _ in 0..rounds {
            if self.hung {
                break;
            }
            status = match self.runtime.status(root).await {
                Ok(status) => Some(status),
                // Never created (a kill came first): nothing to drive.
                Err(dormant::ReadError::UnknownSession(_)) => return None,
                Err(error) => {
                    self.note(format!("{root}: status: {error}"));
                    None
                }
            };
            match status {
                Some(Status::Completed | Status::Failed) => return status,
                // Stored as running with no run here: a kill cut it, and activating the
                // session records it interrupted.
                Some(Status::Running) => {
                    let runtime = self.runtime.clone();
                    self.bounded(root, "wait_settled", async move {
                        runtime.wait_settled(root).await;
                        Ok(())
                    })
                    .await;
                }
                Some(Status::Interrupted) => self.resume(root).await,
                Some(Status::SuspendedClientTool | Status::SuspendedAwaitingChildren) => {
                    if self.rng.percent(self.behaviour.forks) {
                        self.fork(root).await;
                    }
                    if let Err(error) = self.answer_tree(root).await {
                        self.note(format!("{root}: answering: {error}"));
                    }
                    if self.rng.percent(self.behaviour.evictions) {
                        self.runtime.evict(root).await;
                    }
                    self.resume(root).await;
                }
                None => {}
            }
            self.pause().await;
        }
        status
    }

    /// Forks the tree at its latest checkpoint, once.
    async fn fork(&mut self, root: &SessionId) {
        if root.as_str().ends_with(".f") {
            return;
        }
        let Ok(fork) = format!("{root}.f").parse::<SessionId>() else {
            return;
        };
        let runtime = self.runtime.clone();
        let forked = tokio::time::timeout(HUNG, async move {
            let checkpoints = runtime.checkpoints(root).await?;
            let Some(last) = checkpoints.last() else {
                return Ok(());
            };
            let options = dormant::types::ForkOptions::new().id(fork.clone());
            runtime.fork(root, last.id, options).await.map(drop)
        })
        .await;
        match forked {
            Ok(Ok(())) => self.process.say(&format!("forked {root}")),
            // Forked already, or the tree moved on meanwhile (another round answered it).
            Ok(Err(dormant::Error::Fork(_))) => {}
            Ok(Err(error)) => self.note(format!("{root}: fork: {error}")),
            Err(_) => {
                self.hung = true;
                self.note(format!("{root}: fork hung for {HUNG:?}"));
            }
        }
    }

    async fn resume(&mut self, root: &SessionId) {
        let runtime = self.runtime.clone();
        self.bounded(root, "resume", async move {
            runtime.resume(root).await.map(drop)
        })
        .await;
    }

    /// Awaits a runtime call, noting an error or a hang instead of failing the drive.
    async fn bounded(
        &mut self,
        root: &SessionId,
        what: &str,
        call: impl Future<Output = Result<(), dormant::Error>>,
    ) {
        match tokio::time::timeout(HUNG, call).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => self.note(format!("{root}: {what}: {error}")),
            Err(_) => {
                self.hung = true;
                self.note(format!("{root}: {what} hung for {HUNG:?}"));
            }
        }
    }

    async fn pause(&mut self) {
        if self.behaviour.latency_ms > 0 {
            let ms = self.rng.below(self.behaviour.latency_ms);
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }

    /// Answers the calls the tree waits on: the root's, and its sub-agents' (still against the
    /// root: the router finds the owner).
    async fn answer_tree(&mut self, root: &SessionId) -> anyhow::Result<()> {
        let mut sessions = vec![root.clone()];
        let mut next = 0;
        while let Some(session) = sessions.get(next).cloned() {
            sessions.extend(
                self.runtime
                    .children(&session)
                    .await?
                    .into_iter()
                    .map(|call| call.child),
            );
            next += 1;
        }
        for session in &sessions {
            for call in self.runtime.pending(session).await? {
                let leave_for_later = !self.behaviour.answer_all && self.rng.percent(30);
                if call.answer.is_none() && !leave_for_later {
                    self.answer(root, &call).await?;
                }
            }
        }
        Ok(())
    }

    async fn answer(&mut self, root: &SessionId, call: &PendingCall) -> anyhow::Result<()> {
        let sent = self.choose(call);
        match self.submit(root, call, &sent).await? {
            SubmitOutcome::Accepted => self.acknowledge(root, call, sent)?,
            other => self.note(format!(
                "{root}: first answer for {} ({}) answered {}",
                call.tool_call_id,
                call.tool_name,
                other.code()
            )),
        }
        if self.rng.percent(self.behaviour.duplicates) {
            let again = self.choose(call);
            match self.submit(root, call, &again).await? {
                SubmitOutcome::AlreadyCompleted => {}
                SubmitOutcome::Accepted => {
                    // Logged like any acknowledged answer: the checker reports the call as
                    // answered twice.
                    self.acknowledge(root, call, again)?;
                    self.note(format!(
                        "{root}: duplicate for {} accepted",
                        call.tool_call_id
                    ));
                }
                other => self.note(format!(
                    "{root}: duplicate for {} answered {}",
                    call.tool_call_id,
                    other.code()
                )),
            }
        }
        Ok(())
    }

    fn choose(&mut self, call: &PendingCall) -> Sent {
        self.sent += 1;
        let roll = self.rng.below(100);
        match call.kind {
            PendingKind::Client if roll < 5 => Sent::Error(format!(
                "client could not {} (#{})",
                call.tool_name, self.sent
            )),
            PendingKind::Client | PendingKind::Input => Sent::Result(json!({
                "answer": call.tool_call_id, "by": self.process.name, "n": self.sent
            })),
            PendingKind::Approval if roll < 5 => Sent::Error(format!(
                "no decision on {} (#{})",
                call.tool_name, self.sent
            )),
            PendingKind::Approval => Sent::Approval {
                approved: roll >= 25,
            },
            // What a person would do: look the effect up by the call's idempotency key.
            PendingKind::Reconcile => {
                let key = call.idempotency_key.as_deref().unwrap_or_default();
                let happened =
                    !key.is_empty() && matches!(executed(&self.process.dir, key), Ok(Some(_)));
                Sent::Reconcile { happened }
            }
        }
    }

    async fn submit(
        &mut self,
        root: &SessionId,
        call: &PendingCall,
        sent: &Sent,
    ) -> anyhow::Result<SubmitOutcome> {
        let (root_id, id) = (root.as_str(), call.tool_call_id.as_str());
        let submit = match sent {
            Sent::Result(value) => Submit::result(root_id, id, value.clone()),
            Sent::Error(text) => Submit::error(root_id, id, text.clone()),
            Sent::Approval { approved } => {
                Submit::approval(root_id, id, call.approval_id(), *approved, None)
            }
            Sent::Reconcile { happened: true } => Submit::reconcile(
                root_id,
                id,
                Reconciled::Happened(tool_output(&call.tool_name, id)),
            ),
            Sent::Reconcile { happened: false } => {
                Submit::reconcile(root_id, id, Reconciled::DidNotHappen)
            }
        };
        match tokio::time::timeout(HUNG, self.runtime.submit_tool_result(submit)).await {
            Ok(outcome) => Ok(outcome?),
            Err(_) => {
                self.hung = true;
                anyhow::bail!("submit of {id} hung for {HUNG:?}")
            }
        }
    }

    /// Journals an acknowledged answer (synced) before telling the parent about it: a line in
    /// the file is an `accepted` that really came back.
    fn acknowledge(
        &mut self,
        root: &SessionId,
        call: &PendingCall,
        sent: Sent,
    ) -> anyhow::Result<()> {
        self.accepted.append(&Acknowledged {
            process: self.process.name.clone(),
            root: root.to_string(),
            call: call.tool_call_id.clone(),
            sent,
        })?;
        self.process
            .say(&format!("accepted {root} {}", call.tool_call_id));
        Ok(())
    }

    /// Keeps the first notes of a tree: one that is wedged would otherwise repeat its note
    /// every round until the kill.
    fn note(&mut self, text: String) {
        if self.notes.len() < 20 {
            self.process.say(&format!("note {text}"));
            self.notes.push(text);
        }
    }
}
