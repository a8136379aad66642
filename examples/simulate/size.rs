//! `--dormant N --sample M`, the size mode: many dormant sessions in one store, then a sample
//! answered cold.
//!
//! N sessions each start and suspend on the client tool `confirm` (`--concurrency` runs in
//! flight, the resident limit `--max-resident` evicting idle ones as it goes), then every
//! session still resident is evicted (`evict_all`), so all N are only in the store. Then M of
//! them, picked at random (`--seed`), are answered one after another: each answer is a submit
//! that rehydrates the session from the store, and a resume that completes its run. The end
//! check: every sampled session was cold when answered, completed, and holds the submitted
//! answer exactly once, with nothing left pending.
//!
//! The report: the time to create and suspend all N (sessions/s), the store's bytes on disk
//! per session, RSS before, after the creation, after the eviction and at the end, the peak,
//! the resident count after the eviction, and the cold answers' latency (submit alone, and
//! submit + resume to the completed run), rehydration included.
//!
//! With `--max-resident 0` (no limit) or ≥ N, nothing is evicted while the sessions are
//! created, so the RSS growth of the creation divided by the resident count is what a resident
//! suspended session costs: its actor, its loaded state and host slot, plus what the store
//! keeps in memory of what was written (sled's page cache) and what the allocator holds. The
//! RSS the eviction gives back, per evicted session, is the actors' share alone (as far as the
//! allocator returns freed memory to the system).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use dormant::types::ToolOutcome;
use dormant::{
    AgentDefinition, Message, ModelReply, Runtime, ScriptedLlm, SessionId, Status, ToolCall,
    ToolDefinition,
};
use dormant::{Submit, SubmitOutcome};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde_json::{json, Value};

use crate::halt::{fatal, Halt};
use crate::plan::{confirm_result, confirm_schema, Rng, CONFIRM};
use crate::report::Memory;
use crate::Args;

const AGENT: &str = "dormant";
/// The one client call of every session (submits are routed by session and call id).
const CALL: &str = "c0";
/// The final text of every session's run, once answered.
const DONE: &str = "confirmed, done";
/// The client-tool timeout of this mode: a day, so that no call times out during a run
/// (a million sessions take minutes to create).
const TIMEOUT_MS: u64 = 86_400_000;
/// A progress line on stderr every this many sessions created (text mode).
const PROGRESS_EVERY: usize = 100_000;

/// Session `index`'s id: the run's prefix and the index, so no list of a million ids is held.
fn session_id(prefix: &str, index: usize) -> anyhow::Result<SessionId> {
    format!("{prefix}-{index:08}")
        .parse()
        .with_context(|| format!("session id {index}"))
}

/// The distinct session indexes answered cold: `sample` of `0..sessions`, picked with `seed`,
/// in the order they are answered.
fn pick_sample(seed: u64, sessions: usize, sample: usize) -> Vec<usize> {
    let sample = sample.min(sessions);
    let mut rng = Rng::new(seed ^ 0xd0_47a7, 0, 0);
    let mut picked = HashSet::with_capacity(sample);
    let mut order = Vec::with_capacity(sample);
    let bound = u64::try_from(sessions).unwrap_or(u64::MAX);
    while order.len() < sample {
        let index = usize::try_from(rng.below(bound)).unwrap_or(0);
        if picked.insert(index) {
            order.push(index);
        }
    }
    order
}

/// The answer the client submits for session `index` (distinct per session).
fn answer(seed: u64, index: usize) -> Value {
    let token = Rng::new(seed ^ 0xa75, u64::try_from(index).unwrap_or(u64::MAX), 0).below(1 << 48);
    confirm_result(token)
}

fn micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?)
}

/// What the creation phase measured.
struct Created {
    elapsed: Duration,
    /// execute_on of one session until it reports `suspended_client_tool`.
    latency: Histogram<u64>,
    problems: Vec<String>,
}

/// Starts sessions `0..count` with `concurrency` workers, each taking the next index.
async fn create_all(
    runtime: &Runtime,
    prefix: &str,
    count: usize,
    concurrency: usize,
    progress: bool,
) -> anyhow::Result<Created> {
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let latency = Arc::new(Mutex::new(histogram()?));
    let problems = Arc::new(Mutex::new(Vec::new()));
    let halt = Arc::new(Halt::default());
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency.min(count) {
        let (runtime, prefix) = (runtime.clone(), prefix.to_string());
        let (next, done, latency) = (Arc::clone(&next), Arc::clone(&done), Arc::clone(&latency));
        let (problems, halt) = (Arc::clone(&problems), Arc::clone(&halt));
        workers.spawn(async move {
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= count {
                    return Ok::<(), anyhow::Error>(());
                }
                let id = session_id(&prefix, index)?;
                let began = Instant::now();
                match runtime.execute_on(&id, AGENT, "confirm, then finish").await {
                    Ok(run)
                        if run.status == Status::SuspendedClientTool
                            && run.pending == [CALL.to_string()] =>
                    {
                        latency.lock().saturating_record(micros(began.elapsed()));
                    }
                    Ok(run) => problems.lock().push(format!(
                        "session {index} ({id}): expected suspended_client_tool on {CALL}, got {:?} pending {:?} ({:?})",
                        run.status, run.pending, run.error
                    )),
                    Err(error) => {
                        let problem = halt.check(format!("execute {index} ({id})"), error);
                        problems.lock().push(problem);
                        if let Some(failure) = halt.take() {
                            return Err(failure.into());
                        }
                    }
                }
                let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
                if progress && finished % PROGRESS_EVERY as u64 == 0 {
                    let secs = started.elapsed().as_secs_f64();
                    eprintln!(
                        "simulate --dormant: {finished} of {count} suspended in {secs:.1} s ({:.0}/s)",
                        as_f64(finished) / secs.max(1e-9)
                    );
                }
            }
        });
    }
    while let Some(joined) = workers.join_next().await {
        if let Err(error) = joined? {
            // A store error: stop the other workers rather than let them run on.
            workers.abort_all();
            while workers.join_next().await.is_some() {}
            return Err(error);
        }
    }
    let elapsed = started.elapsed();
    let latency = Arc::try_unwrap(latency)
        .map_err(|_| anyhow::anyhow!("a worker outlived the creation"))?
        .into_inner();
    let problems = Arc::try_unwrap(problems)
        .map_err(|_| anyhow::anyhow!("a worker outlived the creation"))?
        .into_inner();
    Ok(Created {
        elapsed,
        latency,
        problems,
    })
}

/// What answering the sample measured.
struct Answered {
    /// The submit that rehydrates the session (durable when it returns).
    submit: Histogram<u64>,
    /// Submit + resume until the run completed.
    answer: Histogram<u64>,
    /// Sampled sessions that were resident when answered (none expected).
    warm: usize,
}

/// Answers the sampled sessions one after another, each cold: the submit, then the resume.
async fn answer_sample(
    runtime: &Runtime,
    prefix: &str,
    sample: &[usize],
    seed: u64,
    problems: &mut Vec<String>,
) -> anyhow::Result<Answered> {
    let mut answered = Answered {
        submit: histogram()?,
        answer: histogram()?,
        warm: 0,
    };
    for &index in sample {
        let id = session_id(prefix, index)?;
        let here = |what: &str| format!("sampled session {index} ({id}): {what}");
        if runtime.is_resident(&id) {
            answered.warm += 1;
        }
        let began = Instant::now();
        let outcome = runtime
            .submit_tool_result(Submit::result(id.as_str(), CALL, answer(seed, index)))
            .await
            .map_err(|error| fatal(here("submit"), error))?;
        let submitted = began.elapsed();
        if outcome != SubmitOutcome::Accepted {
            problems.push(here(&format!("the answer got {}", outcome.code())));
            continue;
        }
        let run = runtime
            .resume(&id)
            .await
            .map_err(|error| fatal(here("resume"), error))?;
        let whole = began.elapsed();
        if run.status != Status::Completed {
            problems.push(here(&format!(
                "resume ended {:?}, pending {:?}, error {:?}",
                run.status, run.pending, run.error
            )));
            continue;
        }
        answered.submit.saturating_record(micros(submitted));
        answered.answer.saturating_record(micros(whole));
    }
    if answered.warm > 0 {
        problems.push(format!(
            "{} sampled sessions were resident when answered: the eviction left them in memory",
            answered.warm
        ));
    }
    Ok(answered)
}

/// The end check of one sampled session: completed, the submitted answer exactly once, the
/// final text, nothing pending.
async fn check_sampled(
    runtime: &Runtime,
    id: &SessionId,
    want: &Value,
    problems: &mut Vec<String>,
) -> anyhow::Result<()> {
    let here = |what: String| format!("sampled session {id}: {what}");
    let unreadable = |error| fatal(here("reading it".into()), error);
    let status = runtime.status(id).await.map_err(unreadable)?;
    if status != Status::Completed {
        problems.push(here(format!("status {status:?}, expected completed")));
    }
    let pending = runtime.pending(id).await.map_err(unreadable)?;
    if !pending.is_empty() {
        problems.push(here(format!("{} calls still pending", pending.len())));
    }
    let messages = runtime.messages(id).await.map_err(unreadable)?;
    let answers: Vec<&ToolOutcome> = messages
        .iter()
        .filter_map(|message| match message {
            Message::Tool {
                tool_call_id,
                outcome,
                ..
            } if tool_call_id == CALL => Some(outcome),
            _ => None,
        })
        .collect();
    let want = ToolOutcome::Result(want.clone());
    match answers.as_slice() {
        [got] if **got == want => {}
        got => problems.push(here(format!(
            "{CALL} has {got:?}, expected exactly {want:?}"
        ))),
    }
    let finished = messages.iter().any(|message| {
        matches!(message, Message::Assistant { text, .. } if text.as_deref() == Some(DONE))
    });
    if !finished {
        problems.push(here(format!("no final text {DONE:?}")));
    }
    Ok(())
}

/// Runs the dormant mode and prints its report; returns how many problems the check found.
pub(crate) async fn simulate(args: Args, sessions: usize) -> anyhow::Result<usize> {
    let backend = crate::backend::Backend::open(&args).await?;
    let store = backend.store();
    let store_bytes_before = embedded_bytes(&backend)?;
    let llm = ScriptedLlm::new().script(
        AGENT,
        vec![
            ModelReply::tool_calls(vec![ToolCall::new(
                CALL,
                CONFIRM,
                json!({ "question": "proceed?" }),
            )]),
            ModelReply::text(DONE),
        ],
    );
    let mut builder = Runtime::builder()
        .store(Arc::clone(&store))
        .llm(Arc::new(llm))
        .client_tool_timeout_ms(TIMEOUT_MS)
        .agent(
            AgentDefinition::builder(AGENT)
                .system_prompt("Ask the user to confirm, then finish.")
                .tool(
                    ToolDefinition::client(CONFIRM)
                        .description("Asks the user to confirm")
                        .output_schema(confirm_schema()),
                )
                .build()?,
        );
    if args.max_resident > 0 {
        builder = builder.max_resident(args.max_resident);
    }
    let runtime = builder.build()?;
    // This run's ids: a fresh prefix, so a reused store's earlier sessions are never touched.
    let prefix = format!("dormant-{}", SessionId::generate().as_str());

    let rss_before = Memory::read()?;
    let created = create_all(&runtime, &prefix, sessions, args.concurrency, !args.json).await?;
    let rss_created = Memory::read()?;
    let created_stats = runtime.stats().host;
    let resident_created = created_stats.resident;
    // RSS per resident session means something only if every session stayed resident.
    let all_resident = created_stats.passivations == 0 && resident_created == sessions;

    let evict_began = Instant::now();
    // An actor still busy with its suspension's last effects refuses to stop (the host keeps
    // it): ask again once it is done, a few times at most.
    for _ in 0..50 {
        runtime.evict_all().await;
        if runtime.stats().host.resident == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let evict_elapsed = evict_began.elapsed();
    let rss_evicted = Memory::read()?;
    let resident_evicted = runtime.stats().host.resident;

    let sample = pick_sample(args.seed, sessions, args.sample);
    let mut problems = created.problems;
    let answered = answer_sample(&runtime, &prefix, &sample, args.seed, &mut problems).await?;
    let rss_after = Memory::read()?;

    let verify_start = Instant::now();
    for &index in &sample {
        let id = session_id(&prefix, index)?;
        check_sampled(&runtime, &id, &answer(args.seed, index), &mut problems).await?;
    }
    let verify_elapsed = verify_start.elapsed();
    let stats = runtime.stats();
    runtime
        .shutdown()
        .await
        .map_err(|error| fatal("shutting the runtime down", error))?;
    drop(runtime);
    drop(store);
    let store_bytes = embedded_bytes(&backend)?.saturating_sub(store_bytes_before);

    let n = count(sessions);
    let secs = created.elapsed.as_secs_f64().max(1e-9);
    let per = |bytes: u64, of: u64| as_f64(bytes) / as_f64(of.max(1));
    let growth = rss_created.rss().saturating_sub(rss_before.rss());
    let released = rss_created.rss().saturating_sub(rss_evicted.rss());
    let evicted = count(resident_created.saturating_sub(resident_evicted));
    let q = |h: &Histogram<u64>| {
        json!({ "count": h.len(), "p50": h.value_at_quantile(0.5),
                "p99": h.value_at_quantile(0.99), "max": h.max() })
    };
    let report = json!({
        "mode": "dormant",
        "sessions": sessions,
        "sample": sample.len(),
        "concurrency": args.concurrency,
        "max_resident": (args.max_resident > 0).then_some(args.max_resident),
        "engine": format!("{:?}", args.engine),
        "durability": format!("{:?}", dormant::store::Durability::from(args.durability)),
        "allocator": crate::allocator::NAME,
        "create_s": secs,
        "sessions_per_s": as_f64(n) / secs,
        "create_latency_us": q(&created.latency),
        "resident_after_create": resident_created,
        "evict_all_s": evict_elapsed.as_secs_f64(),
        "resident_after_evict": resident_evicted,
        "cold_submit_latency_us": q(&answered.submit),
        "cold_answer_latency_us": q(&answered.answer),
        "warm_sampled": answered.warm,
        "commits": stats.commit_latency.count,
        "activations": stats.host.activations,
        "passivations": stats.host.passivations,
        "peak_resident": stats.host.peak_resident,
        "store_bytes": store_bytes,
        "store_bytes_per_session": per(store_bytes, n),
        "rss_before_bytes": rss_before.rss(),
        "rss_created_bytes": rss_created.rss(),
        "rss_evicted_bytes": rss_evicted.rss(),
        "rss_after_bytes": rss_after.rss(),
        "rss_peak_bytes": rss_after.hwm(),
        "rss_growth_per_session_bytes": per(growth, n),
        "rss_growth_per_resident_bytes": all_resident.then(|| per(growth, n)),
        "rss_released_per_evicted_bytes": per(released, evicted),
        "verify_s": verify_elapsed.as_secs_f64(),
        "verified": problems.is_empty(),
        "problems": problems.iter().take(20).collect::<Vec<_>>(),
        "problem_count": problems.len(),
    });
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print(&report, &problems);
    }
    drop(backend);
    Ok(problems.len())
}

/// The text report, from the JSON one.
fn print(report: &Value, problems: &[String]) {
    let mib = |key: &str| report[key].as_f64().unwrap_or(0.0) / (1024.0 * 1024.0);
    let f = |key: &str| report[key].as_f64().unwrap_or(0.0);
    let latency = |key: &str| {
        let h = &report[key];
        format!(
            "p50 {} µs, p99 {} µs, max {} µs ({})",
            h["p50"], h["p99"], h["max"], h["count"]
        )
    };
    println!("dormant simulate --dormant");
    println!(
        "config:              {} sessions, sample {}, concurrency {}, max resident {}, {} store, {}",
        report["sessions"],
        report["sample"],
        report["concurrency"],
        match report["max_resident"].as_u64() {
            Some(limit) => limit.to_string(),
            None => "unlimited".into(),
        },
        report["engine"].as_str().unwrap_or_default(),
        report["durability"].as_str().unwrap_or_default()
    );
    println!(
        "created:             {:.2} s, {:.0} sessions/s (execute → suspended_client_tool: {})",
        f("create_s"),
        f("sessions_per_s"),
        latency("create_latency_us")
    );
    println!(
        "evicted:             resident {} after the creation, {} after evict_all ({:.2} s)",
        report["resident_after_create"],
        report["resident_after_evict"],
        f("evict_all_s")
    );
    println!(
        "store on disk:       {:.1} MiB, {:.0} bytes per session",
        mib("store_bytes"),
        f("store_bytes_per_session")
    );
    println!(
        "rss:                 {:.1} MiB before, {:.1} MiB created, {:.1} MiB evicted, {:.1} MiB after the sample, {:.1} MiB peak",
        mib("rss_before_bytes"),
        mib("rss_created_bytes"),
        mib("rss_evicted_bytes"),
        mib("rss_after_bytes"),
        mib("rss_peak_bytes")
    );
    println!(
        "rss per session:     {:.0} bytes of growth per session created ({}); {:.0} released per evicted one",
        f("rss_growth_per_session_bytes"),
        if report["rss_growth_per_resident_bytes"].is_null() {
            "some were evicted as they were created"
        } else {
            "all resident: the actor, its state, the store's cache"
        },
        f("rss_released_per_evicted_bytes")
    );
    println!(
        "cold submit:         {} (rehydrates the session)",
        latency("cold_submit_latency_us")
    );
    println!(
        "cold answer:         {} (submit + resume → completed)",
        latency("cold_answer_latency_us")
    );
    println!(
        "verified:            {} ({} problems, checked in {:.2} s)",
        if problems.is_empty() { "ok" } else { "FAILED" },
        problems.len(),
        f("verify_s")
    );
    if problems.is_empty() {
        println!("                     every sampled session was answered cold, completed, and holds its answer exactly once");
    }
    for problem in problems.iter().take(20) {
        println!("  {problem}");
    }
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[allow(clippy::cast_precision_loss)]
fn as_f64(n: u64) -> f64 {
    n as f64
}

#[cfg(test)]
mod tests {
    use super::pick_sample;

    #[test]
    fn the_sample_is_distinct_seeded_and_within_range() {
        let sample = pick_sample(7, 50, 20);
        assert_eq!(sample.len(), 20);
        assert!(sample.iter().all(|&index| index < 50));
        let distinct: std::collections::HashSet<_> = sample.iter().collect();
        assert_eq!(distinct.len(), 20);
        assert_eq!(sample, pick_sample(7, 50, 20));
        assert_eq!(
            pick_sample(7, 5, 20).len(),
            5,
            "never more than the sessions"
        );
    }
}

/// The bytes the embedded store of `backend` takes on disk (main refuses PostgreSQL here).
fn embedded_bytes(backend: &crate::backend::Backend) -> anyhow::Result<u64> {
    Ok(backend.sled_totals()?.map_or(0, |(bytes, _)| bytes))
}
