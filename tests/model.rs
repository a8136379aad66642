//! A model-based property test: random interleavings of submit, duplicate submit, resume,
//! interrupt, a new message, evict, restart and clock advances. Invariants:
//! - an accepted answer is applied exactly once, whatever comes after it (an interrupt
//!   included);
//! - no tool call ever reaches the model without its result, or with two;
//! - every unanswered pending entry has exactly one deadline index entry (answered: none);
//! - nothing panics, and no operation fails with a store or internal error.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use dormant::store::Store;
use dormant::types::{Clock, ToolOutcome};
use dormant::{
    AgentDefinition, ManualClock, MemoryStore, Message, ModelReply, Runtime, ScriptedLlm,
    SessionId, Status, ToolCall, ToolDefinition,
};
use dormant::{Submit, SubmitOutcome};
use parking_lot::Mutex;
use proptest::prelude::*;
use serde_json::{json, Value};

#[derive(Clone, Debug)]
enum Op {
    Submit { call: usize, error: bool },
    Duplicate,
    Resume,
    Interrupt,
    Execute,
    Evict,
    Restart,
    Advance { ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, any::<bool>()).prop_map(|(call, error)| Op::Submit { call, error }),
        1 => Just(Op::Duplicate),
        3 => Just(Op::Resume),
        1 => Just(Op::Interrupt),
        1 => Just(Op::Execute),
        1 => Just(Op::Evict),
        1 => Just(Op::Restart),
        1 => (0..25_000u64).prop_map(|ms| Op::Advance { ms }),
    ]
}

const TIMEOUT_MS: u64 = 10_000;

fn script() -> Vec<ModelReply> {
    (0..40)
        .map(|k| {
            ModelReply::tool_calls(vec![
                ToolCall::new(format!("c{k}a"), "edit", json!({})),
                ToolCall::new(format!("c{k}b"), "edit", json!({})),
            ])
        })
        .collect()
}

struct World {
    store: Arc<dyn Store>,
    clock: ManualClock,
    violations: Arc<Mutex<Vec<String>>>,
    runtime: Runtime,
    id: SessionId,
    /// Accepted answers: call id → value submitted.
    accepted: HashMap<String, Value>,
    last_accepted: Option<Submit>,
    counter: u64,
}

impl World {
    fn start(
        store: Arc<dyn Store>,
        clock: ManualClock,
        violations: Arc<Mutex<Vec<String>>>,
    ) -> anyhow::Result<Runtime> {
        let agent = AgentDefinition::builder("agent")
            .tool(ToolDefinition::client("edit"))
            .client_tool_timeout_ms(TIMEOUT_MS)
            .max_steps(100)
            .build()?;
        let llm = common::CheckedLlm {
            inner: ScriptedLlm::new().script("agent", script()),
            violations,
        };
        Ok(Runtime::builder()
            .store(store)
            .llm(Arc::new(llm))
            .clock(Arc::new(clock))
            .background_deadlines(false)
            .agent(agent)
            .build()?)
    }

    async fn calls_waiting(&self) -> anyhow::Result<Vec<String>> {
        let now = self.clock.now_ms();
        Ok(self
            .runtime
            .pending(&self.id)
            .await?
            .into_iter()
            .filter(|call| call.is_waiting(now))
            .map(|call| call.tool_call_id)
            .collect())
    }

    async fn apply(&mut self, op: Op) -> anyhow::Result<()> {
        match op {
            Op::Submit { call, error } => {
                let pending = self.runtime.pending(&self.id).await?;
                let Some(entry) = pending.get(call) else {
                    return Ok(());
                };
                self.counter += 1;
                let waiting = entry.is_waiting(self.clock.now_ms());
                let submit = if error {
                    Submit::error(
                        self.id.as_str(),
                        &entry.tool_call_id,
                        format!("e{}", self.counter),
                    )
                } else {
                    Submit::result(
                        self.id.as_str(),
                        &entry.tool_call_id,
                        json!({ "v": self.counter }),
                    )
                };
                let outcome = self.runtime.submit_tool_result(submit.clone()).await?;
                if waiting {
                    anyhow::ensure!(outcome == SubmitOutcome::Accepted, "{outcome:?}");
                    let value = match &submit.answer {
                        dormant::session::SubmitAnswer::Result(value) => value.clone(),
                        dormant::session::SubmitAnswer::Error(error) => json!(error),
                        // This test submits only results and errors (an approval, or a kind
                        // of answer added later, has no value to compare).
                        _ => Value::Null,
                    };
                    self.accepted.insert(entry.tool_call_id.clone(), value);
                    self.last_accepted = Some(submit);
                } else {
                    anyhow::ensure!(outcome == SubmitOutcome::AlreadyCompleted, "{outcome:?}");
                }
            }
            Op::Duplicate => {
                if let Some(submit) = self.last_accepted.clone() {
                    let outcome = self.runtime.submit_tool_result(submit).await?;
                    anyhow::ensure!(
                        matches!(
                            outcome,
                            SubmitOutcome::AlreadyCompleted | SubmitOutcome::UnknownToolCall
                        ),
                        "a duplicate was {outcome:?}"
                    );
                }
            }
            Op::Resume => match self.runtime.resume(&self.id).await {
                Ok(_) | Err(dormant::Error::NotResumable { .. }) => {}
                Err(error) => anyhow::bail!("resume: {error}"),
            },
            Op::Interrupt => self.runtime.interrupt(&self.id).await?,
            Op::Execute => {
                self.runtime.execute_on(&self.id, "agent", "more").await?;
            }
            Op::Evict => self.runtime.evict(&self.id).await,
            Op::Restart => {
                self.runtime.shutdown().await?;
                self.runtime = Self::start(
                    Arc::clone(&self.store),
                    self.clock.clone(),
                    Arc::clone(&self.violations),
                )?;
            }
            Op::Advance { ms } => {
                self.clock.advance(ms);
                self.runtime.sweep_deadlines().await?;
            }
        }
        Ok(())
    }

    async fn check(&self, finished: bool) -> anyhow::Result<()> {
        let messages = self.runtime.messages(&self.id).await?;
        let mut seen: HashMap<&str, &ToolOutcome> = HashMap::new();
        for message in &messages {
            if let Message::Tool {
                tool_call_id,
                outcome,
                ..
            } = message
            {
                anyhow::ensure!(
                    seen.insert(tool_call_id, outcome).is_none(),
                    "call {tool_call_id} has two results"
                );
            }
        }
        for (call, value) in &self.accepted {
            match seen.get(call.as_str()) {
                Some(ToolOutcome::Result(result)) => {
                    anyhow::ensure!(result == value, "{call}: {result} != {value}")
                }
                Some(ToolOutcome::Error(error)) => anyhow::ensure!(
                    json!(error) == *value,
                    "{call}: accepted {value} but recorded {error}"
                ),
                None => anyhow::ensure!(!finished, "accepted answer for {call} was never applied"),
            }
        }
        // Deadline index: one entry per unanswered pending call, none for answered ones.
        let armed: Vec<String> = self
            .runtime
            .find_expired_pending(u64::MAX - 1)
            .await?
            .into_iter()
            .filter(|expired| expired.session == self.id)
            .map(|expired| expired.tool_call_id)
            .collect();
        let mut expected: Vec<String> = self
            .runtime
            .pending(&self.id)
            .await?
            .into_iter()
            .filter(|call| call.answer.is_none())
            .map(|call| call.tool_call_id)
            .collect();
        let mut armed_sorted = armed;
        armed_sorted.sort();
        expected.sort();
        anyhow::ensure!(
            armed_sorted == expected,
            "deadlines {armed_sorted:?} vs unanswered {expected:?}"
        );
        let violations = self.violations.lock();
        anyhow::ensure!(violations.is_empty(), "{violations:?}");
        Ok(())
    }

    /// Drives the session to a point where every accepted answer must have been drained.
    async fn drain(&mut self) -> anyhow::Result<()> {
        match self.runtime.status(&self.id).await? {
            Status::SuspendedClientTool | Status::Interrupted => {
                // Let every waiting call expire so the barrier opens, then go on once.
                if !self.calls_waiting().await?.is_empty() {
                    self.clock.advance(TIMEOUT_MS);
                    self.runtime.sweep_deadlines().await?;
                }
                match self.runtime.resume(&self.id).await {
                    Ok(_) | Err(dormant::Error::NotResumable { .. }) => {}
                    Err(error) => anyhow::bail!("final resume: {error}"),
                }
            }
            // A failed run keeps its answered calls; a new message drains them.
            Status::Failed => {
                self.runtime.execute_on(&self.id, "agent", "drain").await?;
            }
            _ => {}
        }
        Ok(())
    }
}

fn run_case(ops: Vec<Op>) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let clock = ManualClock::new(0);
        let violations = Arc::new(Mutex::new(Vec::new()));
        let runtime = World::start(Arc::clone(&store), clock.clone(), Arc::clone(&violations))?;
        let mut world = World {
            store,
            clock,
            violations,
            runtime,
            id: "s".parse()?,
            accepted: HashMap::new(),
            last_accepted: None,
            counter: 0,
        };
        world.runtime.execute_on(&world.id, "agent", "go").await?;
        for op in ops {
            world
                .apply(op.clone())
                .await
                .map_err(|e| anyhow::anyhow!("{op:?}: {e}"))?;
            world
                .check(false)
                .await
                .map_err(|e| anyhow::anyhow!("after {op:?}: {e}"))?;
        }
        world.drain().await?;
        world.check(true).await?;
        world.runtime.shutdown().await?;
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn answers_apply_exactly_once_under_any_interleaving(ops in proptest::collection::vec(op(), 1..30)) {
        if let Err(error) = run_case(ops) {
            return Err(TestCaseError::fail(format!("{error:#}")));
        }
    }
}
