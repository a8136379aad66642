//! Executing a scenario's steps in order against its runtime. Each op returns only once the
//! work it caused has settled, so the next step sees a quiet runtime; an op (or the final
//! shutdown) that does not settle within [`SETTLE_TIMEOUT`] fails instead of hanging the run.

use std::time::Duration;

use super::error::Error;
use super::expect::{self, Observed};
use super::parse::Scenario;
use super::report::{FileReport, StepFailure};
use super::step::{EvictTarget, Op};
use super::world::World;

/// How long one op, or the final shutdown, may take. Scenario ops are tiny, so anything near
/// this is a runtime that never settles.
pub(crate) const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the rest of a file cannot run.
struct Stop(String);

/// Runs every step of `scenario` on a fresh runtime.
pub(crate) async fn run(scenario: &Scenario) -> Result<FileReport, Error> {
    let mut world = World::open(scenario)?;
    let mut failures = Vec::new();
    let mut steps = scenario.steps.iter().enumerate();
    while let Some((index, step)) = steps.next() {
        let op = step.op.name();
        let performed = tokio::time::timeout(SETTLE_TIMEOUT, perform(&mut world, &step.op))
            .await
            .unwrap_or_else(|_| {
                Err(Stop(format!(
                    "op {op} did not settle within {} s",
                    SETTLE_TIMEOUT.as_secs()
                )))
            });
        match performed {
            Ok(observed) => {
                let mismatches = expect::check(&world, step, &observed);
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
            let outcome = match world.runtime() {
                Ok(runtime) => runtime.execute_on(session, agent, message.as_str()).await,
                Err(error) => Err(error),
            };
            Ok(Observed::Run(outcome))
        }
        Op::Evict(target) => {
            let runtime = world.runtime().map_err(|error| Stop(error.to_string()))?;
            match target {
                EvictTarget::Session(session) => runtime.evict(session).await,
                EvictTarget::All => runtime.evict_all().await,
            }
            Ok(Observed::Done(Ok(())))
        }
        Op::Restart => match world.restart().await {
            Ok(()) => Ok(Observed::Done(Ok(()))),
            Err(error) => Err(Stop(format!(
                "restart failed, the runtime is gone: {} ({error})",
                error.code()
            ))),
        },
        Op::Check(_) => Ok(Observed::Done(Ok(()))),
        Op::Submit { .. }
        | Op::Resume(_)
        | Op::Interrupt(_)
        | Op::Abort(_)
        | Op::AdvanceClock { .. }
        | Op::CrashBefore { .. } => Err(Stop(format!(
            "op {} is not supported by this version of the runtime",
            op.name()
        ))),
    }
}
