//! The driver: one runtime over many sessions, a seeded stream of operations, and after each
//! one a comparison of what the runtime answers with what the reference model predicts.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dormant::store::Store;
use dormant::store::{CommitKind, Durability};
use dormant::testkit::{Fault, FaultyStore, InjectedFault};
use dormant::types::Clock;
use dormant::{
    AgentDefinition, Approval, Error, ManualClock, MemoryStore, Message, ModelReply, PendingKind,
    Runtime, ScriptedLlm, SessionId, SledStore, Status, ToolCall, ToolDefinition, ToolError,
};
use dormant::{Submit, SubmitOutcome};
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::plant::{plant_store, Plant, Trigger};
use crate::reference::{
    reply, Answer, Kind, ResumeCode, Session, SubmitCode, View, RETIRE_AFTER, SCRIPT_LEN,
    TIMEOUT_MS,
};
use crate::rng::Rng;

/// Which store the world runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    Memory,
    /// sled in a temporary directory, reopened on every restart.
    Sled,
}

/// One run of the model.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) seed: u64,
    pub(crate) ops: u64,
    pub(crate) sessions: usize,
    pub(crate) backend: Backend,
    pub(crate) plant: Plant,
}

/// What a run did.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) ops: u64,
    pub(crate) retired: u64,
    pub(crate) counts: HashMap<&'static str, u64>,
}

/// The script every session follows: [`reply`] as model replies.
fn script() -> Vec<ModelReply> {
    (0..SCRIPT_LEN)
        .map(|k| {
            let calls = reply(k);
            if calls.is_empty() {
                return ModelReply::text(format!("done {k}"));
            }
            ModelReply::tool_calls(
                calls
                    .into_iter()
                    .map(|(id, kind)| {
                        let tool = match kind {
                            Kind::Client => "edit",
                            Kind::Approval => "deploy",
                        };
                        ToolCall::new(id, tool, json!({}))
                    })
                    .collect(),
            )
        })
        .collect()
}

struct Slot {
    id: SessionId,
    model: Session,
    last_submit: Option<(Submit, Answer, bool)>,
}

/// The world: a runtime, its store, the model of every session.
pub(crate) struct World {
    config: Config,
    rng: Rng,
    clock: ManualClock,
    base: Arc<dyn Store>,
    dir: Option<tempfile::TempDir>,
    faulty: Arc<FaultyStore>,
    trigger: Arc<Trigger>,
    runtime: Runtime,
    violations: Arc<Mutex<Vec<String>>>,
    deploys: Arc<AtomicUsize>,
    /// Approved `deploy` calls that ran in retired sessions.
    retired_deploys: u64,
    slots: Vec<Slot>,
    generation: u64,
    counter: u64,
    trace: VecDeque<String>,
    report: Report,
}

impl World {
    /// A world at time 0 with `config.sessions` fresh session slots.
    pub(crate) fn new(config: Config) -> anyhow::Result<Self> {
        let (base, dir) = match config.backend {
            Backend::Memory => (Arc::new(MemoryStore::new()) as Arc<dyn Store>, None),
            Backend::Sled => {
                let dir = tempfile::tempdir()?;
                (open_sled(&dir.path().join("store"))?, Some(dir))
            }
        };
        // The plant fires at its third chance: after the model has seen the store work.
        let trigger = Trigger::new(config.plant, 3);
        let faulty = Arc::new(FaultyStore::new(Arc::new(plant_store(
            Arc::clone(&base),
            Arc::clone(&trigger),
        ))));
        let clock = ManualClock::new(1_000);
        let violations = Arc::new(Mutex::new(Vec::new()));
        let deploys = Arc::new(AtomicUsize::new(0));
        let runtime = build_runtime(
            Arc::clone(&faulty) as Arc<dyn Store>,
            &clock,
            &violations,
            &deploys,
        )?;
        let slots = Vec::new();
        let mut world = Self {
            rng: Rng::new(config.seed),
            config,
            clock,
            base,
            dir,
            faulty,
            trigger,
            runtime,
            violations,
            deploys,
            retired_deploys: 0,
            slots,
            generation: 0,
            counter: 0,
            trace: VecDeque::new(),
            report: Report::default(),
        };
        for _ in 0..world.config.sessions {
            let slot = world.fresh_slot()?;
            world.slots.push(slot);
        }
        Ok(world)
    }

    fn fresh_slot(&mut self) -> anyhow::Result<Slot> {
        self.generation += 1;
        Ok(Slot {
            id: format!("s{}", self.generation).parse()?,
            model: Session::default(),
            last_submit: None,
        })
    }

    /// Runs every operation, then checks every session in full.
    pub(crate) async fn run(mut self) -> anyhow::Result<Report> {
        for op in 0..self.config.ops {
            self.report.ops = op;
            let step = self.step().await;
            if let Err(error) = step {
                let trace: Vec<String> = self.trace.iter().cloned().collect();
                anyhow::bail!(
                    "divergence at op {op} ({}; reproduce with DORMANT_MODEL_SEED={} \
                     DORMANT_MODEL_OPS={}): {error:#}\nlast ops:\n  {}",
                    self.describe(),
                    self.config.seed,
                    self.config.ops,
                    trace.join("\n  ")
                );
            }
        }
        self.report.ops = self.config.ops;
        let finish = self.finish().await;
        if let Err(error) = finish {
            let trace: Vec<String> = self.trace.iter().cloned().collect();
            anyhow::bail!(
                "divergence at the end ({}; reproduce with DORMANT_MODEL_SEED={} \
                 DORMANT_MODEL_OPS={}): {error:#}\nlast ops:\n  {}",
                self.describe(),
                self.config.seed,
                self.config.ops,
                trace.join("\n  ")
            );
        }
        self.runtime.shutdown().await?;
        drop(self.dir.take());
        Ok(self.report)
    }

    fn describe(&self) -> String {
        format!(
            "{:?} store, plant {:?}, now {}",
            self.config.backend,
            self.config.plant,
            self.clock.now_ms()
        )
    }

    fn note(&mut self, text: String) {
        if self.trace.len() == 40 {
            self.trace.pop_front();
        }
        self.trace.push_back(text);
    }

    fn count(&mut self, name: &'static str) {
        *self.report.counts.entry(name).or_default() += 1;
    }

    /// One random operation on a random session, then the comparison.
    async fn step(&mut self) -> anyhow::Result<()> {
        let mut slot = self.rng.index(self.slots.len());
        let sled = self.config.backend == Backend::Sled;
        // submit, resume, execute, interrupt, evict, advance, restart, fault, fault mid-run
        let weights = [40, 16, 6, 3, 5, 7, if sled { 1 } else { 2 }, 3, 2];
        let op = self.rng.weighted(&weights);
        if op == 0 && !self.rng.one_in(5) {
            // Mostly a session with calls to answer: an unknown call is one sort among seven.
            let with_calls: Vec<usize> = (0..self.slots.len())
                .filter(|index| !self.slots[*index].model.pending.is_empty())
                .collect();
            if !with_calls.is_empty() {
                slot = with_calls[self.rng.index(with_calls.len())];
            }
        }
        let touched_all = match op {
            0 => {
                self.submit(slot).await?;
                false
            }
            1 => {
                self.resume(slot).await?;
                false
            }
            2 => {
                self.execute(slot).await?;
                false
            }
            3 => {
                self.interrupt(slot).await?;
                false
            }
            4 => {
                self.count("evict");
                self.note(format!("evict {}", self.slots[slot].id));
                self.runtime.evict(&self.slots[slot].id).await;
                false
            }
            5 => {
                self.advance().await?;
                true
            }
            6 => {
                self.restart().await?;
                true
            }
            7 => {
                self.fault(slot).await?;
                false
            }
            _ => {
                self.fault_mid_run(slot).await?;
                false
            }
        };
        if touched_all {
            for index in 0..self.slots.len() {
                self.compare(index).await?;
            }
        } else {
            self.compare(slot).await?;
        }
        self.compare_index().await?;
        let violations = std::mem::take(&mut *self.violations.lock());
        anyhow::ensure!(violations.is_empty(), "the model was sent {violations:?}");
        self.retire(slot).await
    }

    /// A submit of one of seven sorts: the right answer, an unknown call, a duplicate, the
    /// wrong kind, a wrong approval id, a result the schema refuses, a late one.
    async fn submit(&mut self, slot: usize) -> anyhow::Result<()> {
        self.counter += 1;
        let n = self.counter;
        let now = self.clock.now_ms();
        let sort = self.rng.weighted(&[12, 1, 3, 1, 1, 1, 2]);
        let pending: Vec<(String, Kind)> = self.slots[slot]
            .model
            .pending
            .iter()
            .map(|(id, call)| (id.clone(), call.kind))
            .collect();
        let picked = if pending.is_empty() {
            None
        } else {
            Some(pending[self.rng.index(pending.len())].clone())
        };
        let id = self.slots[slot].id.clone();
        let (submit, answer, approval_ok, name) = match (sort, picked) {
            (2, _) if self.slots[slot].last_submit.is_some() => {
                let Some((submit, answer, ok)) = self.slots[slot].last_submit.clone() else {
                    return Ok(());
                };
                (submit, answer, ok, "submit_duplicate")
            }
            (6, _) => {
                let model = &self.slots[slot].model;
                let mut late: Vec<&String> =
                    model.settled.iter().chain(model.dropped.iter()).collect();
                late.sort();
                let call = if late.is_empty() {
                    format!("nope{n}")
                } else {
                    late[self.rng.index(late.len())].clone()
                };
                (
                    Submit::error(id.as_str(), &call, format!("late{n}")),
                    Answer::Error(format!("late{n}")),
                    true,
                    "submit_late",
                )
            }
            (_, None) | (1, _) => {
                let call = format!("nope{n}");
                (
                    Submit::result(id.as_str(), &call, json!({ "v": n })),
                    Answer::Result(json!({ "v": n })),
                    true,
                    "submit_unknown",
                )
            }
            (_, Some((call, kind))) => {
                let approval_id = self.approval_id(&id, &call).await?;
                match (sort, kind) {
                    (3, Kind::Client) => (
                        Submit::approval(id.as_str(), &call, &approval_id, true, None),
                        Answer::Decision {
                            approved: true,
                            reason: None,
                        },
                        true,
                        "submit_wrong_kind",
                    ),
                    (3, Kind::Approval) => (
                        Submit::result(id.as_str(), &call, json!({ "v": n })),
                        Answer::Result(json!({ "v": n })),
                        true,
                        "submit_wrong_kind",
                    ),
                    (4, Kind::Approval) => (
                        Submit::approval(id.as_str(), &call, format!("run-x::{call}"), true, None),
                        Answer::Decision {
                            approved: true,
                            reason: None,
                        },
                        false,
                        "submit_wrong_approval_id",
                    ),
                    (5, Kind::Client) => (
                        Submit::result(id.as_str(), &call, json!({ "w": n })),
                        Answer::Result(json!({ "w": n })),
                        // The schema refuses it, as a wrong approval id would be refused.
                        false,
                        "submit_schema_refused",
                    ),
                    (_, Kind::Client) => {
                        if self.rng.one_in(4) {
                            (
                                Submit::error(id.as_str(), &call, format!("e{n}")),
                                Answer::Error(format!("e{n}")),
                                true,
                                "submit_error",
                            )
                        } else {
                            (
                                Submit::result(id.as_str(), &call, json!({ "v": n })),
                                Answer::Result(json!({ "v": n })),
                                true,
                                "submit_result",
                            )
                        }
                    }
                    (_, Kind::Approval) => match self.rng.below(4) {
                        0 => (
                            Submit::error(id.as_str(), &call, format!("e{n}")),
                            Answer::Error(format!("e{n}")),
                            true,
                            "submit_error",
                        ),
                        1 => (
                            Submit::approval(
                                id.as_str(),
                                &call,
                                &approval_id,
                                false,
                                Some(format!("r{n}")),
                            ),
                            Answer::Decision {
                                approved: false,
                                reason: Some(format!("r{n}")),
                            },
                            true,
                            "submit_deny",
                        ),
                        2 => (
                            Submit::approval(id.as_str(), &call, &approval_id, false, None),
                            Answer::Decision {
                                approved: false,
                                reason: None,
                            },
                            true,
                            "submit_deny",
                        ),
                        _ => (
                            Submit::approval(id.as_str(), &call, &approval_id, true, None),
                            Answer::Decision {
                                approved: true,
                                reason: None,
                            },
                            true,
                            "submit_approve",
                        ),
                    },
                }
            }
        };
        self.count(name);
        self.note(format!(
            "{name} {} {} {:?}",
            submit.session_id, submit.tool_call_id, submit.answer
        ));
        let expected = if self.slots[slot].model.status.is_none() {
            SubmitCode::UnknownToolCall
        } else {
            self.slots[slot]
                .model
                .submit(&submit.tool_call_id, answer.clone(), approval_ok, now)
        };
        let got = self.runtime.submit_tool_result(submit.clone()).await?;
        let got = match got {
            SubmitOutcome::Accepted => SubmitCode::Accepted,
            SubmitOutcome::AlreadyCompleted => SubmitCode::AlreadyCompleted,
            SubmitOutcome::UnknownToolCall => SubmitCode::UnknownToolCall,
            SubmitOutcome::InvalidResult { .. } => SubmitCode::InvalidResult,
            other => anyhow::bail!("{name} answered {other:?}, the model says {expected:?}"),
        };
        anyhow::ensure!(
            got == expected,
            "{name} of {} answered {got:?}, the model says {expected:?}",
            submit.tool_call_id
        );
        if expected == SubmitCode::Accepted {
            self.slots[slot].last_submit = Some((submit, answer, approval_ok));
        }
        Ok(())
    }

    /// The approval id of a pending call, as the runtime lists it (the run id is the
    /// runtime's to choose).
    async fn approval_id(&self, id: &SessionId, call: &str) -> anyhow::Result<String> {
        Ok(self
            .runtime
            .pending(id)
            .await?
            .into_iter()
            .find(|pending| pending.tool_call_id == call)
            .map_or_else(
                || format!("missing::{call}"),
                |pending| pending.approval_id(),
            ))
    }

    async fn resume(&mut self, slot: usize) -> anyhow::Result<()> {
        self.count("resume");
        let id = self.slots[slot].id.clone();
        self.note(format!("resume {id}"));
        let now = self.clock.now_ms();
        let model = &mut self.slots[slot].model;
        let got = self.runtime.resume(&id).await;
        if model.status.is_none() {
            anyhow::ensure!(
                matches!(got, Err(Error::UnknownSession(_))),
                "resume of a session never started: {got:?}"
            );
            return Ok(());
        }
        let expected = model.resume(now);
        let got = match got {
            Ok(outcome) => ResumeCode::Ran(outcome.status),
            Err(Error::NotResumable { .. }) => ResumeCode::NotResumable,
            Err(error) => anyhow::bail!("resume: {error}"),
        };
        anyhow::ensure!(
            got == expected,
            "resume answered {got:?}, the model says {expected:?}"
        );
        Ok(())
    }

    async fn execute(&mut self, slot: usize) -> anyhow::Result<()> {
        self.count("execute");
        let id = self.slots[slot].id.clone();
        self.note(format!("execute {id}"));
        let now = self.clock.now_ms();
        let outcome = self.runtime.execute_on(&id, "agent", "go").await?;
        let model = &mut self.slots[slot].model;
        model.execute(now);
        anyhow::ensure!(
            Some(outcome.status) == model.status,
            "execute ended {:?}, the model says {:?}",
            outcome.status,
            model.status
        );
        Ok(())
    }

    async fn interrupt(&mut self, slot: usize) -> anyhow::Result<()> {
        self.count("interrupt");
        let id = self.slots[slot].id.clone();
        self.note(format!("interrupt {id}"));
        let now = self.clock.now_ms();
        let got = self.runtime.interrupt(&id).await;
        let model = &mut self.slots[slot].model;
        if model.status.is_none() {
            anyhow::ensure!(
                matches!(got, Err(Error::UnknownSession(_))),
                "interrupt of a session never started: {got:?}"
            );
            return Ok(());
        }
        got?;
        model.interrupt(now);
        Ok(())
    }

    /// Moves the clock: to a random point, or just before or at the next deadline; then
    /// sweeps (mostly: an expired call left unswept must be found by submit and resume).
    async fn advance(&mut self) -> anyhow::Result<()> {
        self.count("advance");
        let now = self.clock.now_ms();
        let next = self
            .slots
            .iter()
            .flat_map(|slot| slot.model.pending.values())
            .filter(|call| call.view(now) == View::Waiting)
            .map(|call| call.deadline)
            .min();
        let to = match (self.rng.below(4), next) {
            (0, Some(deadline)) => deadline,
            (1, Some(deadline)) => deadline - 1,
            _ => now + self.rng.below(TIMEOUT_MS),
        };
        let to = to.max(now);
        self.clock.set(to);
        let sweep = !self.rng.one_in(4);
        self.note(format!("advance to {to}, sweep {sweep}"));
        if sweep {
            let report = self.runtime.sweep_deadlines().await?;
            // Of one node, on a store that keeps what it is told: never an entry left after
            // the commit that removed it.
            anyhow::ensure!(
                report.cleared == 0,
                "the sweep cleared {} deadline entries no call waits on: {report:?}",
                report.cleared
            );
            for slot in &mut self.slots {
                slot.model.sweep(to);
            }
        }
        Ok(())
    }

    /// Shuts the runtime down and builds a new one on the same store (sled: reopened).
    async fn restart(&mut self) -> anyhow::Result<()> {
        self.count("restart");
        self.note("restart".to_string());
        self.runtime.shutdown().await?;
        if let Some(dir) = &self.dir {
            self.base = open_sled(&dir.path().join("store"))?;
        }
        self.faulty = Arc::new(FaultyStore::new(Arc::new(plant_store(
            Arc::clone(&self.base),
            Arc::clone(&self.trigger),
        ))));
        self.runtime = build_runtime(
            Arc::clone(&self.faulty) as Arc<dyn Store>,
            &self.clock,
            &self.violations,
            &self.deploys,
        )?;
        Ok(())
    }

    /// An operation whose first commit fails: it must fail with the injected error and change
    /// nothing (the model keeps its state as before).
    async fn fault(&mut self, slot: usize) -> anyhow::Result<()> {
        let id = self.slots[slot].id.clone();
        let now = self.clock.now_ms();
        let model = &self.slots[slot].model;
        let waiting = model
            .pending
            .iter()
            .find(|(_, call)| call.view(now) == View::Waiting && call.kind == Kind::Client)
            .map(|(id, _)| id.clone());
        let drains = model.status == Some(Status::SuspendedClientTool)
            && model
                .pending
                .values()
                .all(|call| call.view(now) != View::Waiting);
        self.faulty.arm(Fault::NextCommit);
        let (name, result) = if let Some(call) = waiting {
            self.note(format!("fault: submit {id} {call}"));
            let submit = Submit::result(id.as_str(), &call, json!({ "v": 0 }));
            (
                "fault_submit",
                self.runtime.submit_tool_result(submit).await.map(|_| ()),
            )
        } else if drains {
            self.note(format!("fault: resume {id}"));
            ("fault_resume", self.runtime.resume(&id).await.map(|_| ()))
        } else {
            self.note(format!("fault: execute {id}"));
            (
                "fault_execute",
                self.runtime
                    .execute_on(&id, "agent", "go")
                    .await
                    .map(|_| ()),
            )
        };
        self.faulty.clear();
        self.count(name);
        match result {
            Err(Error::Store(error)) if error.downcast_ref::<InjectedFault>().is_some() => Ok(()),
            other => {
                let state = self.compare(slot).await;
                anyhow::bail!(
                    "{name} with its commit failed answered {other:?} (then: {state:?}; model {:?})",
                    self.slots[slot].model
                )
            }
        }
    }

    /// A run whose model reply cannot be stored: the commit that starts the run (a resume's
    /// drain, a new message) lands, the one of the reply (commit #1 of its step) fails. The
    /// run must end `interrupted` with everything before the failed commit kept, and go on
    /// with the same reply on the next resume.
    async fn fault_mid_run(&mut self, slot: usize) -> anyhow::Result<()> {
        let id = self.slots[slot].id.clone();
        let now = self.clock.now_ms();
        let model = &self.slots[slot].model;
        let drains = model.status == Some(Status::SuspendedClientTool)
            && model
                .pending
                .values()
                .all(|call| call.view(now) != View::Waiting);
        // The reply is a final text (no commit #1 to fail): an ordinary operation.
        if reply(model.replies).is_empty() {
            return if drains {
                self.resume(slot).await
            } else {
                self.execute(slot).await
            };
        }
        self.faulty.arm(Fault::NextCommitOf(CommitKind::ToolCalls));
        let (name, result) = if drains {
            self.note(format!("fault mid-run: resume {id}"));
            ("fault_mid_resume", self.runtime.resume(&id).await)
        } else {
            self.note(format!("fault mid-run: execute {id}"));
            (
                "fault_mid_execute",
                self.runtime.execute_on(&id, "agent", "go").await,
            )
        };
        self.faulty.clear();
        self.count(name);
        // The cut run is stored as running until the session is activated again, which
        // records it as interrupted (a crash's code).
        self.runtime.wait_settled(&id).await;
        let model = &mut self.slots[slot].model;
        if drains {
            model.fault_mid_resume(now);
        } else {
            model.fault_mid_execute(now);
        }
        match result {
            Err(Error::Store(error)) if error.downcast_ref::<InjectedFault>().is_some() => Ok(()),
            other => {
                let state = self.compare(slot).await;
                anyhow::bail!(
                    "{name} with its reply's commit failed answered {other:?} (then: {state:?}; model {:?})",
                    self.slots[slot].model
                )
            }
        }
    }

    /// The session's status and pending calls against the model's.
    async fn compare(&self, slot: usize) -> anyhow::Result<()> {
        let Slot { id, model, .. } = &self.slots[slot];
        let Some(status) = model.status else {
            return Ok(());
        };
        let now = self.clock.now_ms();
        let got = self.runtime.status(id).await?;
        anyhow::ensure!(got == status, "{id} is {got:?}, the model says {status:?}");
        let mut pending: Vec<(String, Kind, View)> = self
            .runtime
            .pending(id)
            .await?
            .into_iter()
            .map(|call| {
                let kind = match call.kind {
                    PendingKind::Client => Kind::Client,
                    _ => Kind::Approval,
                };
                let view = match &call.answer {
                    None if now < call.deadline_at_ms => View::Waiting,
                    None | Some(dormant::types::Answer::TimedOut) => View::Expired,
                    Some(dormant::types::Answer::Approved) => View::Approved,
                    Some(_) => View::Answered,
                };
                (call.tool_call_id, kind, view)
            })
            .collect();
        pending.sort();
        let expected = model.pending_view(now);
        anyhow::ensure!(
            pending == expected,
            "{id} has pending {pending:?}, the model says {expected:?}"
        );
        Ok(())
    }

    /// The deadline index holds exactly the calls still unanswered, across sessions.
    async fn compare_index(&self) -> anyhow::Result<()> {
        let mut armed: Vec<(String, String)> = self
            .runtime
            .find_expired_pending(u64::MAX - 1)
            .await?
            .into_iter()
            .map(|expired| (expired.session.to_string(), expired.tool_call_id))
            .collect();
        armed.sort();
        let mut expected: Vec<(String, String)> = self
            .slots
            .iter()
            .flat_map(|slot| {
                slot.model
                    .armed()
                    .into_iter()
                    .map(|call| (slot.id.to_string(), call))
            })
            .collect();
        expected.sort();
        anyhow::ensure!(
            armed == expected,
            "the deadline index holds {armed:?}, the model says {expected:?}"
        );
        Ok(())
    }

    /// A completed session far enough along is checked in full and replaced by a new one.
    async fn retire(&mut self, slot: usize) -> anyhow::Result<()> {
        let model = &self.slots[slot].model;
        if model.replies < RETIRE_AFTER || model.status != Some(Status::Completed) {
            return Ok(());
        }
        self.check_history(slot).await?;
        self.retired_deploys += self.slots[slot].model.deploys;
        self.report.retired += 1;
        self.slots[slot] = self.fresh_slot()?;
        Ok(())
    }

    /// The whole conversation: every tool call followed by exactly one result, the one the
    /// model predicts, and as many model replies as the model asked for.
    async fn check_history(&self, slot: usize) -> anyhow::Result<()> {
        let Slot { id, model, .. } = &self.slots[slot];
        if model.status.is_none() {
            return Ok(());
        }
        let messages = self.runtime.messages(id).await?;
        let mut replies = 0;
        let mut called: Vec<String> = Vec::new();
        let mut results: HashMap<String, usize> = HashMap::new();
        for message in &messages {
            match message {
                Message::Assistant { tool_calls, .. } => {
                    replies += 1;
                    called.extend(tool_calls.iter().map(|call| call.id.clone()));
                }
                Message::Tool {
                    tool_call_id,
                    outcome,
                    ..
                } => {
                    *results.entry(tool_call_id.clone()).or_default() += 1;
                    let expect = model.results.get(tool_call_id).ok_or_else(|| {
                        anyhow::anyhow!("{id}: {tool_call_id} has a result the model does not know: {outcome:?}")
                    })?;
                    anyhow::ensure!(
                        expect.matches(outcome),
                        "{id}: {tool_call_id} ended {outcome:?}, the model says {expect:?}"
                    );
                }
                _ => {}
            }
        }
        anyhow::ensure!(
            replies == model.replies,
            "{id}: {replies} model replies, the model says {}",
            model.replies
        );
        for call in &called {
            let count = results.get(call).copied().unwrap_or(0);
            let want = usize::from(model.results.contains_key(call));
            anyhow::ensure!(
                count == want,
                "{id}: {call} has {count} results, the model says {want}"
            );
        }
        Ok(())
    }

    /// Every live session checked in full; every approved tool ran once.
    async fn finish(&mut self) -> anyhow::Result<()> {
        for slot in 0..self.slots.len() {
            self.compare(slot).await?;
            self.check_history(slot).await?;
        }
        self.compare_index().await?;
        let ran = self.deploys.load(Ordering::SeqCst) as u64;
        let expected = self.retired_deploys
            + self
                .slots
                .iter()
                .map(|slot| slot.model.deploys)
                .sum::<u64>();
        anyhow::ensure!(
            ran == expected,
            "the approved tool ran {ran} times, the model says {expected}"
        );
        Ok(())
    }
}

fn open_sled(path: &Path) -> anyhow::Result<Arc<dyn Store>> {
    // Process-crash durability: the model checks semantics, not the disk's cache, and a
    // restart here is a graceful one.
    Ok(Arc::new(
        SledStore::builder(path)
            .durability(Durability::ProcessCrash)
            .open()?,
    ))
}

fn build_runtime(
    store: Arc<dyn Store>,
    clock: &ManualClock,
    violations: &Arc<Mutex<Vec<String>>>,
    deploys: &Arc<AtomicUsize>,
) -> anyhow::Result<Runtime> {
    let counter = Arc::clone(deploys);
    let deploy = ToolDefinition::server("deploy", move |input: Value, _ctx| {
        let counter = Arc::clone(&counter);
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ToolError>(json!({ "echo": input }))
        }
    })
    .require_approval(Approval::Always);
    let agent = AgentDefinition::builder("agent")
        .tool(ToolDefinition::client("edit").output_schema(json!({
            "type": "object", "required": ["v"]
        })))
        .tool(deploy)
        .client_tool_timeout_ms(TIMEOUT_MS)
        .max_steps(100)
        .build()?;
    let llm = crate::common::CheckedLlm {
        inner: ScriptedLlm::new().script("agent", script()),
        violations: Arc::clone(violations),
    };
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .clock(Arc::new(clock.clone()))
        .background_deadlines(false)
        // Fewer resident sessions than slots: least-recently-used eviction happens as well.
        .max_resident(6)
        .agent(agent)
        .build()?)
}
