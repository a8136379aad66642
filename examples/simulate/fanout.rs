//! `--fanout ROOTSxCHILDREN`: trees of sub-agents with nested suspension.
//!
//! Each root's single model reply delegates to CHILDREN children (the sub-agent tool
//! `delegate`); each child suspends on the client tool `confirm` (call ids unique within the
//! tree, since submits are routed by root and call id), so the root ends
//! `suspended_awaiting_children`. The simulated client answers every child's call against the
//! ROOT after a random delay (a share twice: the second must be `already_completed`), while
//! the resident limit and explicit evictions (a share of the trees, root and children, right
//! after they suspend) push sessions out of memory; then `resume(root)` cascades into the
//! children and completes the tree. The end check: every root and child completed, every
//! child's result in its root's messages exactly once, every accepted answer in its child's
//! messages exactly once with its value, nothing left pending.
//!
//! Deadlines are not exercised in this mode (every call is answered; the client-tool timeout
//! is ten minutes), so the check can be exact. It checks this run's trees only: the runtime's
//! global timeout, abort and abandon counters include the sessions an earlier process left in
//! the store (`--store DIR`; their expired deadlines fire at boot), so a timeout or any other
//! tool error is looked for in this run's stored conversations instead.
//!
//! A store error stops the run at once (see halt.rs): the trees in flight are cancelled and
//! the process exits with the error.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dormant::types::ToolOutcome;
use dormant::{
    AgentDefinition, Message, ModelReply, Runtime, ScriptedLlm, SessionId, Status, ToolCall,
    ToolDefinition,
};
use dormant::{Submit, SubmitOutcome};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::halt::{fatal, Halt};
use crate::plan::{confirm_result, confirm_schema, Rng, CONFIRM, TIMEOUT_CODE};
use crate::report::Memory;
use crate::Args;

const LEAD: &str = "fanout-lead";
const WORKER: &str = "fanout-worker";
const DELEGATE: &str = "delegate";
/// The client-tool timeout of this mode: long enough that no answer is late.
const TIMEOUT_MS: u64 = 600_000;

/// Roots × children per root, parsed from `ROOTSxCHILDREN` (e.g. `20x50`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fanout {
    pub(crate) roots: usize,
    pub(crate) children: usize,
}

impl std::str::FromStr for Fanout {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (roots, children) = text
            .split_once(['x', 'X', '×'])
            .ok_or_else(|| format!("expected ROOTSxCHILDREN (e.g. 20x50), got {text:?}"))?;
        let parse = |part: &str, what: &str| -> Result<usize, String> {
            match part.trim().parse::<usize>() {
                Ok(0) | Err(_) => Err(format!("{what} must be a positive integer, got {part:?}")),
                Ok(n) => Ok(n),
            }
        };
        Ok(Self {
            roots: parse(roots, "ROOTS")?,
            children: parse(children, "CHILDREN")?,
        })
    }
}

/// The root's delegation call `child`.
fn delegate_id(child: usize) -> String {
    format!("d{child}")
}

/// The client call of the child of delegation `child` (unique within the tree).
fn confirm_id(child: usize) -> String {
    format!("c{child}")
}

/// The final text of child `child`: its root's tool result for the delegation.
fn child_text(child: usize) -> String {
    format!("part {child} confirmed")
}

/// What the simulated client does for one child.
#[derive(Clone, Copy, Debug)]
struct Behaviour {
    delay_ms: u64,
    token: u64,
    duplicate: bool,
}

fn behaviour(args: &Args, tree: usize, child: usize) -> Behaviour {
    let mut rng = Rng::new(args.seed ^ 0xfa_0007, count(tree), count(child));
    Behaviour {
        delay_ms: rng.below(args.answer_delay_ms.saturating_add(1)),
        token: rng.below(1 << 48),
        duplicate: rng.chance(args.duplicates),
    }
}

/// Whether tree `tree` is evicted (root and children) right after it suspends.
fn evicted(args: &Args, tree: usize) -> bool {
    Rng::new(args.seed ^ 0xe71c7, count(tree), 0).chance(args.evict_waiting)
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

#[derive(Debug, Default)]
struct Counters {
    trees: AtomicU64,
    accepted: AtomicU64,
    duplicates: AtomicU64,
    duplicates_already_completed: AtomicU64,
    explicit_evictions: AtomicU64,
    submits_to_evicted: AtomicU64,
    resumes_of_evicted: AtomicU64,
}

fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

#[derive(Debug)]
struct Histograms {
    /// execute_on of a root until it reports `suspended_awaiting_children`.
    suspend: Histogram<u64>,
    /// Each accepted submit (durable when it returns), against the root.
    submit: Histogram<u64>,
    /// resume of a root: the cascade into its children to the completed tree.
    resume: Histogram<u64>,
    /// A whole tree: execute, answers, resume.
    tree: Histogram<u64>,
}

impl Histograms {
    fn new() -> anyhow::Result<Self> {
        let new = || Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3);
        Ok(Self {
            suspend: new()?,
            submit: new()?,
            resume: new()?,
            tree: new()?,
        })
    }
}

#[derive(Debug)]
struct Sim {
    runtime: Runtime,
    args: Args,
    fanout: Fanout,
    roots: Vec<SessionId>,
    slots: Arc<Semaphore>,
    counters: Counters,
    histograms: Mutex<Histograms>,
    /// Per tree, the result each child's client submitted (by child index).
    answers: Vec<Mutex<HashMap<usize, Value>>>,
    /// Raised by the first store error.
    halt: Halt,
}

/// Error results in this run's trees: none is expected.
#[derive(Clone, Copy, Debug, Default)]
struct ToolErrors {
    /// `client_tool_timeout` errors.
    timeouts: u64,
    /// Any other error (abandoned, aborted, interrupted, a failed call).
    other: u64,
}

impl ToolErrors {
    fn count(&mut self, results: &HashMap<String, Vec<&ToolOutcome>>) {
        for outcome in results.values().flatten() {
            match outcome {
                ToolOutcome::Error(error) if error.starts_with(TIMEOUT_CODE) => self.timeouts += 1,
                ToolOutcome::Error(_) => self.other += 1,
                ToolOutcome::Result(_) => {}
            }
        }
    }
}

/// Runs the fan-out mode and prints its report; returns how many problems the check found.
pub(crate) async fn simulate(args: Args, fanout: Fanout) -> anyhow::Result<usize> {
    // sled, or fjall or the journal with `--engine` (not PostgreSQL: main refuses it here).
    let backend = crate::backend::Backend::open(&args).await?;
    let store = backend.store();

    let roots: Vec<SessionId> = (0..fanout.roots).map(|_| SessionId::generate()).collect();
    // ScriptedLlm scripts per agent or per session: the root's script is the agent's; each
    // child needs its own call id, so each child session gets its own script.
    let llm = ScriptedLlm::new().script(
        LEAD,
        vec![
            ModelReply::tool_calls(
                (0..fanout.children)
                    .map(|child| {
                        ToolCall::new(
                            delegate_id(child),
                            DELEGATE,
                            json!({ "message": format!("confirm part {child}") }),
                        )
                    })
                    .collect(),
            ),
            ModelReply::text("every part is confirmed"),
        ],
    );
    for root in &roots {
        for child in 0..fanout.children {
            llm.set_session_script(
                root.ephemeral_child(&delegate_id(child)),
                vec![
                    ModelReply::tool_calls(vec![ToolCall::new(
                        confirm_id(child),
                        CONFIRM,
                        json!({ "question": "proceed?", "part": child }),
                    )]),
                    ModelReply::text(child_text(child)),
                ],
            );
        }
    }
    let mut builder = Runtime::builder()
        .store(Arc::clone(&store))
        .llm(Arc::new(llm))
        .client_tool_timeout_ms(TIMEOUT_MS)
        .agent(
            AgentDefinition::builder(WORKER)
                .system_prompt("Ask the user to confirm, then report.")
                .tool(ToolDefinition::client(CONFIRM).output_schema(confirm_schema()))
                .build()?,
        )
        .agent(
            AgentDefinition::builder(LEAD)
                .system_prompt("Delegate every part, then summarise.")
                .tool(ToolDefinition::sub_agent(DELEGATE, WORKER))
                .build()?,
        );
    if args.max_resident > 0 {
        builder = builder.max_resident(args.max_resident);
    }
    let runtime = builder.build()?;

    let rss_before = Memory::read()?;
    let sim = Arc::new(Sim {
        runtime: runtime.clone(),
        slots: Arc::new(Semaphore::new(args.concurrency)),
        counters: Counters::default(),
        histograms: Mutex::new(Histograms::new()?),
        answers: (0..fanout.roots).map(|_| Mutex::default()).collect(),
        halt: Halt::default(),
        roots,
        fanout,
        args,
    });
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for tree in 0..fanout.roots {
        let sim = Arc::clone(&sim);
        tasks.spawn(async move { sim.tree(tree).await });
    }
    let mut problems = Vec::new();
    loop {
        let joined = tokio::select! {
            biased;
            () = sim.halt.raised() => break,
            joined = tasks.join_next() => joined,
        };
        match joined {
            Some(joined) => {
                if let Err(problem) = joined? {
                    problems.push(problem);
                }
            }
            None => break,
        }
    }
    if let Some(failure) = sim.halt.take() {
        // Cancel the trees in flight rather than let them run on against a failed store.
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        return Err(failure.into());
    }
    let elapsed = started.elapsed();
    let rss_after = Memory::read()?;
    let stats = runtime.stats();
    let client = runtime.client_tool_stats();
    let verify_start = Instant::now();
    let errors = sim.verify(&mut problems).await?;
    let expected_answers = count(fanout.roots * fanout.children);
    // Global, yet this run's: only a submit is counted here, and this process submits only
    // to its own trees.
    if client.answered != get(&sim.counters.accepted) || client.answered != expected_answers {
        problems.push(format!(
            "the runtime counted {} answers, the clients {} accepted, expected {expected_answers}",
            client.answered,
            get(&sim.counters.accepted)
        ));
    }
    if errors.timeouts + errors.other > 0 {
        problems.push(format!(
            "calls in this run's trees timed out {}, other tool errors (abandoned, aborted, failed) {}: expected none",
            errors.timeouts, errors.other
        ));
    }
    let verify_elapsed = verify_start.elapsed();
    runtime
        .shutdown()
        .await
        .map_err(|error| fatal("shutting the runtime down", error))?;
    let store_bytes = backend.sled_totals()?.map_or(0, |(bytes, _)| bytes);

    let sim = Arc::try_unwrap(sim).map_err(|_| anyhow::anyhow!("a tree task outlived the run"))?;
    let histograms = sim.histograms.into_inner();
    let c = &sim.counters;
    let args = &sim.args;
    let sessions = fanout.roots * (fanout.children + 1);
    let secs = elapsed.as_secs_f64().max(1e-9);
    let rate = |n: u64| as_f64(n) / secs;
    let q = |h: &Histogram<u64>| {
        json!({ "count": h.len(), "p50": h.value_at_quantile(0.5),
                "p99": h.value_at_quantile(0.99), "max": h.max() })
    };
    let report = json!({
        "mode": "fanout",
        "roots": fanout.roots,
        "children_per_root": fanout.children,
        "sessions": sessions,
        "concurrency": args.concurrency,
        "max_resident": (args.max_resident > 0).then_some(args.max_resident),
        "elapsed_s": secs,
        "trees": get(&c.trees),
        "trees_per_s": rate(get(&c.trees)),
        "children_per_s": rate(get(&c.trees) * count(fanout.children)),
        "suspend_latency_us": q(&histograms.suspend),
        "submit_latency_us": q(&histograms.submit),
        "resume_latency_us": q(&histograms.resume),
        "tree_latency_us": q(&histograms.tree),
        "accepted": get(&c.accepted),
        "duplicates": { "sent": get(&c.duplicates),
                        "already_completed": get(&c.duplicates_already_completed) },
        "evicted_while_waiting": {
            "explicit_tree_evictions": get(&c.explicit_evictions),
            "submits_to_evicted_children": get(&c.submits_to_evicted),
            "resumes_of_evicted_roots": get(&c.resumes_of_evicted),
        },
        "commits": stats.commit_latency.count,
        "commit_latency_us": { "p50": stats.commit_latency.p50_us,
                               "p99": stats.commit_latency.p99_us },
        "activations": stats.host.activations,
        "rehydrations": stats.host.activations.saturating_sub(count(sessions)),
        "passivations": stats.host.passivations,
        "peak_resident": stats.host.peak_resident,
        "rss_before_bytes": rss_before.rss(),
        "rss_after_bytes": rss_after.rss(),
        "rss_peak_bytes": rss_after.hwm(),
        "engine": format!("{:?}", args.engine),
        "store_bytes": store_bytes,
        "verify_s": verify_elapsed.as_secs_f64(),
        "verified": problems.is_empty(),
        "problems": problems.iter().take(20).collect::<Vec<_>>(),
        "problem_count": problems.len(),
    });
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        let text = |h: &Histogram<u64>| {
            format!(
                "p50 {} µs, p99 {} µs, max {} µs ({})",
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.99),
                h.max(),
                h.len()
            )
        };
        let mib = |bytes: u64| as_f64(bytes) / (1024.0 * 1024.0);
        println!("dormant simulate --fanout");
        println!(
            "config:              {} roots × {} children ({sessions} sessions), concurrency {}, max resident {}, answer delay ≤ {} ms, store {:?}",
            fanout.roots,
            fanout.children,
            args.concurrency,
            if args.max_resident > 0 { args.max_resident.to_string() } else { "unlimited".into() },
            args.answer_delay_ms,
            args.engine
        );
        println!("elapsed:             {secs:.2} s");
        println!(
            "trees/s:             {:.1} ({} trees; {:.0} children/s)",
            rate(get(&c.trees)),
            get(&c.trees),
            rate(get(&c.trees) * count(fanout.children))
        );
        println!(
            "root suspends:       {} (execute → suspended_awaiting_children)",
            text(&histograms.suspend)
        );
        println!(
            "submit latency:      {} (accepted, against the root)",
            text(&histograms.submit)
        );
        println!(
            "resume latency:      {} (cascade into the children → completed tree)",
            text(&histograms.resume)
        );
        println!("tree latency:        {}", text(&histograms.tree));
        println!(
            "duplicates:          {} sent, {} already_completed",
            get(&c.duplicates),
            get(&c.duplicates_already_completed)
        );
        println!(
            "evicted waiting:     {} trees evicted on suspending; {} answers reached an evicted child, {} resumes an evicted root",
            get(&c.explicit_evictions),
            get(&c.submits_to_evicted),
            get(&c.resumes_of_evicted)
        );
        println!(
            "commits:             {} (p50 {} µs, p99 {} µs)",
            stats.commit_latency.count, stats.commit_latency.p50_us, stats.commit_latency.p99_us
        );
        println!(
            "actors:              peak resident {}, activations {}, rehydrations {}, passivations {}",
            stats.host.peak_resident,
            stats.host.activations,
            stats.host.activations.saturating_sub(count(sessions)),
            stats.host.passivations
        );
        println!(
            "rss:                 {:.1} MiB before, {:.1} MiB after, {:.1} MiB peak; store {:.1} MiB",
            mib(rss_before.rss()),
            mib(rss_after.rss()),
            mib(rss_after.hwm()),
            mib(store_bytes)
        );
        println!(
            "verified:            {} ({} problems, checked in {:.2} s)",
            if problems.is_empty() { "ok" } else { "FAILED" },
            problems.len(),
            verify_elapsed.as_secs_f64()
        );
        if problems.is_empty() {
            println!("                     every tree completed; every child's result in its root's messages exactly once; every answer applied once with its value");
        }
        for problem in problems.iter().take(20) {
            println!("  {problem}");
        }
    }
    drop(runtime);
    drop(store);
    drop(backend);
    Ok(problems.len())
}

impl Sim {
    /// One tree: execute the root until it suspends on its children, answer every child's
    /// call against the root, resume the root (the cascade) until the tree completes.
    async fn tree(&self, tree: usize) -> Result<(), String> {
        let root = &self.roots[tree];
        let here = |what: String| format!("tree {tree} (root {root}): {what}");
        let children = self.fanout.children;
        let began = Instant::now();

        let permit = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(|error| error.to_string())?;
        let run_began = Instant::now();
        let run = self
            .runtime
            .execute_on(root, LEAD, "confirm every part")
            .await
            .map_err(|error| self.halt.check(here("execute".into()), error))?;
        self.histograms
            .lock()
            .suspend
            .saturating_record(micros(run_began.elapsed()));
        drop(permit);
        let mut pending = run.pending.clone();
        pending.sort();
        let mut want: Vec<String> = (0..children).map(confirm_id).collect();
        want.sort();
        if run.status != Status::SuspendedAwaitingChildren || pending != want {
            return Err(here(format!(
                "expected suspended_awaiting_children on {children} calls, got {:?} with {} pending ({:?})",
                run.status,
                run.pending.len(),
                run.error
            )));
        }

        if evicted(&self.args, tree) {
            for child in 0..children {
                self.runtime
                    .evict(&root.ephemeral_child(&delegate_id(child)))
                    .await;
            }
            self.runtime.evict(root).await;
            add(&self.counters.explicit_evictions);
        }

        // The client answers every child's call, each after its own delay, against the root.
        let answers = (0..children).map(|child| async move {
            let behaviour = behaviour(&self.args, tree, child);
            tokio::time::sleep(Duration::from_millis(behaviour.delay_ms)).await;
            if !self
                .runtime
                .is_resident(&root.ephemeral_child(&delegate_id(child)))
            {
                add(&self.counters.submits_to_evicted);
            }
            let result = confirm_result(behaviour.token);
            let submit = || Submit::result(root.as_str(), confirm_id(child), result.clone());
            let began = Instant::now();
            let outcome = self
                .runtime
                .submit_tool_result(submit())
                .await
                .map_err(|error| {
                    self.halt
                        .check(here(format!("submit {}", confirm_id(child))), error)
                })?;
            if outcome != SubmitOutcome::Accepted {
                return Err(format!(
                    "the answer for {} got {}",
                    confirm_id(child),
                    outcome.code()
                ));
            }
            self.histograms
                .lock()
                .submit
                .saturating_record(micros(began.elapsed()));
            add(&self.counters.accepted);
            self.answers[tree].lock().insert(child, result.clone());
            if behaviour.duplicate {
                add(&self.counters.duplicates);
                let again = self
                    .runtime
                    .submit_tool_result(submit())
                    .await
                    .map_err(|error| {
                        self.halt
                            .check(here(format!("duplicate {}", confirm_id(child))), error)
                    })?;
                if again != SubmitOutcome::AlreadyCompleted {
                    return Err(format!(
                        "a duplicate answer for {} got {}, expected already_completed",
                        confirm_id(child),
                        again.code()
                    ));
                }
                add(&self.counters.duplicates_already_completed);
            }
            Ok::<(), String>(())
        });
        for answered in futures::future::join_all(answers).await {
            answered.map_err(&here)?;
        }

        let permit = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(|error| error.to_string())?;
        if !self.runtime.is_resident(root) {
            add(&self.counters.resumes_of_evicted);
        }
        let resume_began = Instant::now();
        let done = self
            .runtime
            .resume(root)
            .await
            .map_err(|error| self.halt.check(here("resume".into()), error))?;
        drop(permit);
        {
            let mut histograms = self.histograms.lock();
            histograms
                .resume
                .saturating_record(micros(resume_began.elapsed()));
            histograms.tree.saturating_record(micros(began.elapsed()));
        }
        if done.status != Status::Completed {
            return Err(here(format!(
                "resume ended {:?}, pending {:?}, error {:?}",
                done.status, done.pending, done.error
            )));
        }
        add(&self.counters.trees);
        Ok(())
    }

    /// The end check of every tree; adds the problems it finds to `problems` and returns the
    /// error results it found in the trees' conversations.
    ///
    /// # Errors
    /// A store error reading a session is a [`crate::halt::StoreFailure`].
    async fn verify(&self, problems: &mut Vec<String>) -> anyhow::Result<ToolErrors> {
        let mut errors = ToolErrors::default();
        for (tree, root) in self.roots.iter().enumerate() {
            let answers = self.answers[tree].lock().clone();
            self.check_tree(tree, root, &answers, problems, &mut errors)
                .await?;
        }
        Ok(errors)
    }

    async fn check_tree(
        &self,
        tree: usize,
        root: &SessionId,
        answers: &HashMap<usize, Value>,
        problems: &mut Vec<String>,
        errors: &mut ToolErrors,
    ) -> anyhow::Result<()> {
        let children = self.fanout.children;
        let here = |what: String| format!("tree {tree} (root {root}): {what}");
        let unreadable = |id: &SessionId, error| fatal(here(format!("reading {id}")), error);
        match self.runtime.status(root).await {
            Ok(Status::Completed) => {}
            Ok(status) => problems.push(here(format!("root status {status:?}"))),
            Err(error @ dormant::ReadError::Store(_)) => return Err(unreadable(root, error)),
            Err(error) => {
                problems.push(here(error.to_string()));
                return Ok(());
            }
        }
        let left = self
            .runtime
            .children(root)
            .await
            .map_err(|error| unreadable(root, error))?
            .len()
            + self
                .runtime
                .pending(root)
                .await
                .map_err(|error| unreadable(root, error))?
                .len();
        if left > 0 {
            problems.push(here(format!("{left} child or pending entries left")));
        }
        // The root: every child's final text, exactly once, and nothing else.
        let messages = self
            .runtime
            .messages(root)
            .await
            .map_err(|error| unreadable(root, error))?;
        let results = tool_results(&messages);
        errors.count(&results);
        let total: usize = results.values().map(Vec::len).sum();
        if total != children {
            problems.push(here(format!(
                "{total} tool results in the root, expected {children}"
            )));
        }
        for child in 0..children {
            let want = ToolOutcome::Result(Value::String(child_text(child)));
            match results.get(&delegate_id(child)).map(Vec::as_slice) {
                Some([got]) if **got == want => {}
                Some([got]) => problems.push(here(format!(
                    "{} returned {got:?}, expected {want:?}",
                    delegate_id(child)
                ))),
                Some(many) => problems.push(here(format!(
                    "{} results for {}, expected exactly one",
                    many.len(),
                    delegate_id(child)
                ))),
                None => problems.push(here(format!("no result for {}", delegate_id(child)))),
            }
        }
        // Each child: completed, its client's answer applied exactly once with its value.
        for child in 0..children {
            let id = root.ephemeral_child(&delegate_id(child));
            match self.runtime.status(&id).await {
                Ok(Status::Completed) => {}
                Ok(status) => problems.push(here(format!("child {id} status {status:?}"))),
                Err(error @ dormant::ReadError::Store(_)) => return Err(unreadable(&id, error)),
                Err(error) => {
                    problems.push(here(format!("child {id}: {error}")));
                    continue;
                }
            }
            let messages = self
                .runtime
                .messages(&id)
                .await
                .map_err(|error| unreadable(&id, error))?;
            let results = tool_results(&messages);
            errors.count(&results);
            let want = answers.get(&child).cloned().map(ToolOutcome::Result);
            match (results.get(&confirm_id(child)).map(Vec::as_slice), want) {
                (Some([got]), Some(want)) if **got == want => {}
                (got, want) => problems.push(here(format!(
                    "child {id}: {} has {got:?}, expected exactly {want:?}",
                    confirm_id(child)
                ))),
            }
        }
        Ok(())
    }
}

/// A conversation's tool results by call id.
fn tool_results(messages: &[Message]) -> HashMap<String, Vec<&ToolOutcome>> {
    let mut results: HashMap<String, Vec<&ToolOutcome>> = HashMap::new();
    for message in messages {
        if let Message::Tool {
            tool_call_id,
            outcome,
            ..
        } = message
        {
            results
                .entry(tool_call_id.clone())
                .or_default()
                .push(outcome);
        }
    }
    results
}

#[allow(clippy::cast_precision_loss)]
fn as_f64(n: u64) -> f64 {
    n as f64
}

#[cfg(test)]
mod tests {
    use super::Fanout;

    #[test]
    fn parses_roots_by_children() {
        assert_eq!(
            "20x50".parse::<Fanout>(),
            Ok(Fanout {
                roots: 20,
                children: 50
            })
        );
        assert_eq!(
            "3×4".parse::<Fanout>(),
            Ok(Fanout {
                roots: 3,
                children: 4
            })
        );
        assert!("20".parse::<Fanout>().is_err());
        assert!("0x5".parse::<Fanout>().is_err());
    }
}
