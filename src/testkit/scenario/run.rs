//! Executing a scenario's steps in order against its runtime. Each op returns only once the
//! work it caused has settled, so the next step sees a quiet runtime; an op (or the final
//! shutdown) that does not settle within [`SETTLE_TIMEOUT`] fails instead of hanging the run.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::checkpoints;
use super::envelope;
use super::error::Error;
use super::expect::{self, Observed};
use super::format::CommitSpec;
use super::parse::Scenario;
use super::remote::RemoteHost;
use super::report::{FileReport, StepFailure};
use super::step::{EvictTarget, Op};
use super::world::World;
use crate::store::CommitKind;
use crate::types::ids::SessionId;
use crate::types::ForkOptions;

/// How long one op, or the final shutdown, may take. Scenario ops are tiny, so anything near
/// this is a runtime that never settles.
pub(crate) const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the rest of a file cannot run.
struct Stop(String);

/// Runs every step of `scenario` on a fresh runtime (and a second one, served by `host`, for
/// its remote agents).
pub(crate) async fn run(
    scenario: &Scenario,
    host: Option<Arc<dyn RemoteHost>>,
) -> Result<FileReport, Error> {
    let mut world = World::open(scenario, host).await?;
    let mut failures = Vec::new();
    let mut steps = scenario.steps.iter().enumerate();
    while let Some((index, step)) = steps.next() {
        let op = step.op.name();
        let performed = tokio::time::timeout(SETTLE_TIMEOUT, async {
            let observed = perform(&mut world, &step.op).await?;
            let settled = settle(&world, &step.op).await;
            Ok((observed, settled))
        })
        .await
        .unwrap_or_else(|_| {
            Err(Stop(format!(
                "op {op} did not settle within {} s",
                SETTLE_TIMEOUT.as_secs()
            )))
        });
        match performed {
            Ok((observed, settled)) => {
                let mut mismatches = Vec::new();
                if let Err(error) = settled {
                    mismatches.push(format!(
                        "the runtime failed to settle after the op: {} ({error})",
                        error.code()
                    ));
                }
                mismatches.extend(expect::check(&world, step, &observed).await);
                if !mismatches.is_empty() {
                    failures.push(StepFailure::new(
                        scenario.file(),
                        Some(index),
                        op,
                        mismatches.join("; "),
                    ));
                }
            }
            Err(Stop(mut message)) => {
                let skipped = steps.len();
                if skipped > 0 {
                    message.push_str(&format!(" ({skipped} later steps not run)"));
                }
                failures.push(StepFailure::new(scenario.file(), Some(index), op, message));
                break;
            }
        }
    }
    if tokio::time::timeout(SETTLE_TIMEOUT, world.close())
        .await
        .is_err()
    {
        let message = format!(
            "the runtime did not shut down within {} s",
            SETTLE_TIMEOUT.as_secs()
        );
        failures.push(StepFailure::new(scenario.file(), None, "shutdown", message));
    }
    Ok(FileReport::new(
        scenario.file(),
        scenario.name(),
        scenario.step_count(),
        failures,
    ))
}

async fn perform(world: &mut World, op: &Op) -> Result<Observed, Stop> {
    match op {
        Op::Define(agent) => Ok(Observed::Done(world.define(agent))),
        Op::Execute {
            agent,
            session,
            message,
        } => {
            let outcome = match world.runtime_of_agent(agent) {
                Ok(runtime) => runtime.execute_on(session, agent, message.as_str()).await,
                Err(error) => Err(error),
            };
            Ok(Observed::Run(outcome))
        }
        Op::Submit { submit, .. } => {
            let session = submit
                .session
                .as_deref()
                .and_then(|session| session.parse::<SessionId>().ok());
            let runtime = match &session {
                Some(session) => world.runtime_for(session).await,
                None => world.runtime(),
            };
            let outcome = match runtime {
                Ok(runtime) => {
                    let envelope = envelope::build(submit, runtime).await;
                    runtime.submit_json(&envelope).await
                }
                Err(error) => Err(error),
            };
            Ok(Observed::Submit(outcome))
        }
        Op::Resume(session) => {
            let outcome = match world.runtime_for(session).await {
                Ok(runtime) => runtime.resume(session).await,
                Err(error) => Err(error),
            };
            Ok(Observed::Run(outcome))
        }
        Op::Interrupt(session) => {
            let done = match world.runtime_for(session).await {
                Ok(runtime) => runtime.interrupt(session).await,
                Err(error) => Err(error),
            };
            Ok(Observed::Done(done))
        }
        Op::Abort(session) => {
            let done = match world.runtime_for(session).await {
                Ok(runtime) => runtime.abort(session).await,
                Err(error) => Err(error),
            };
            Ok(Observed::Done(done))
        }
        Op::AdvanceClock { ms } => {
            world.advance_clock(*ms);
            let mut done = world.runtime().map(|_| ());
            // The remotes first, as in `settle`: a deadline there settles a remote child,
            // which its parent here then finds settled when it looks.
            for runtime in world.runtimes().into_iter().rev() {
                if let Err(error) = runtime.sweep_deadlines().await {
                    done = Err(error);
                }
            }
            Ok(Observed::Done(done))
        }
        Op::Evict(target) => {
            world.runtime().map_err(|error| Stop(error.to_string()))?;
            for runtime in world.runtimes() {
                match target {
                    EvictTarget::Session(session) => runtime.evict(session).await,
                    EvictTarget::All => runtime.evict_all().await,
                }
            }
            Ok(Observed::Done(Ok(())))
        }
        Op::Restart => match world.restart().await {
            Ok(()) => Ok(Observed::Done(Ok(()))),
            Err(report) => Err(Stop(format!(
                "restart failed, the runtime is gone: {report}"
            ))),
        },
        Op::Check(_) => Ok(Observed::Done(Ok(()))),
        Op::Checkpoints(session) => match world.runtime_for(session).await {
            Ok(runtime) => Ok(checkpoints::list(runtime, session).await),
            Err(error) => Ok(Observed::Checkpoints(Err(error))),
        },
        Op::StateAt {
            session,
            checkpoint,
        } => match world.runtime_for(session).await {
            Ok(runtime) => Ok(checkpoints::state_at(runtime, session, checkpoint).await),
            Err(error) => Ok(Observed::Past(Err(error))),
        },
        Op::Fork {
            source,
            checkpoint,
            fork,
            message,
            edit_message,
            answers,
        } => match world.runtime_for(source).await {
            Ok(runtime) => {
                let mut options = ForkOptions::new().id(fork.clone());
                if let Some(message) = message {
                    options = options.message(message.as_str());
                }
                if let Some(text) = edit_message {
                    options = options.edit_last_message(text.as_str());
                }
                for (call, answer) in answers {
                    options = options.answer(call.as_str(), answer.clone());
                }
                Ok(checkpoints::fork(runtime, source, checkpoint, options).await)
            }
            Err(error) => Ok(Observed::Done(Err(error))),
        },
        Op::CrashBefore { commit } => {
            let kind = match commit {
                CommitSpec::ToolCalls => CommitKind::ToolCalls,
                CommitSpec::ToolResults => CommitKind::ToolResults,
            };
            Ok(Observed::Done(world.crash_before(kind)))
        }
    }
}

/// Lets the work `op` caused settle: fires every deadline that has passed by the manual clock
/// (a timeout of 0 expires as soon as its call is recorded), then waits until no run is in
/// progress in any session (automatic resumes included). Children are waited for before their
/// parents (a child's id extends its parent's, so it sorts after it). Resident sessions are
/// waited for too: a companion started without waiting has an actor before it has a record.
/// `define`, `evict`, `crash_before` and `check` cause no work.
async fn settle(world: &World, op: &Op) -> Result<(), crate::Error> {
    if matches!(
        op,
        Op::Define(_)
            | Op::Evict(_)
            | Op::CrashBefore { .. }
            | Op::Check(_)
            | Op::Checkpoints(_)
            | Op::StateAt { .. }
    ) {
        return Ok(());
    }
    // After a failed restart there is nothing left to settle; the next op says so.
    if world.runtime().is_err() {
        return Ok(());
    }
    // The remote first: a remote child settles before the parent that waits on it.
    for runtime in world.runtimes().into_iter().rev() {
        settle_runtime(runtime).await?;
    }
    Ok(())
}

async fn settle_runtime(runtime: &crate::Runtime) -> Result<(), crate::Error> {
    runtime.sweep_deadlines().await?;
    // A pass can start sessions a later pass must see (a parent's automatic resume may start
    // companions): go on until a pass finds no session the previous one did not wait for.
    let mut waited: Option<BTreeSet<SessionId>> = None;
    loop {
        let mut sessions: BTreeSet<SessionId> = runtime.session_ids().await?.into_iter().collect();
        sessions.extend(runtime.resident_sessions());
        if waited
            .as_ref()
            .is_some_and(|waited| sessions.is_subset(waited))
        {
            return Ok(());
        }
        for session in sessions.iter().rev() {
            runtime.wait_settled(session).await;
        }
        waited.get_or_insert_with(BTreeSet::new).extend(sessions);
    }
}
