//! A model-based test of long random runs: many sessions at once, a seeded stream of submits
//! (right, unknown, duplicate, wrong kind, wrong approval id, refused by the schema, late),
//! resumes, new messages, interrupts, evictions, clock moves with deadline sweeps, restarts and
//! injected store faults, each compared with a reference model of the contract after it runs.
//!
//! `cargo test --test model_long` runs a short count on `MemoryStore` and on sled. The long
//! mode: `DORMANT_MODEL_OPS=1000000 cargo test --release --test model_long -- random_runs`
//! (that many on memory, a tenth of it on sled; BENCHMARKS.md, "Issue 30, goal 6"). A failure prints its seed: `DORMANT_MODEL_SEED=…`
//! replays it. `DORMANT_MODEL_PLANT=lost-answer` (or `kept-deadline`) makes the test's own
//! store drop one write of an acknowledged commit; the planted tests below check that the
//! model reports it.

mod common;
// An inline module of the crate root finds its files in `model_long/`; the files share
// `common` with this crate's other tests.
mod model_long {
    pub(crate) mod plant;
    pub(crate) mod reference;
    pub(crate) mod rng;
    pub(crate) mod world;
}

use model_long::{plant, reference, rng, world};

use plant::Plant;
use world::{Backend, Config, World};

/// The seed unless `DORMANT_MODEL_SEED` names one.
const SEED: u64 = 0x5EED_0030_0006;

fn env_u64(name: &str) -> anyhow::Result<Option<u64>> {
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(text) => {
            let text = text.trim();
            let value = match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16)?,
                None => text.parse()?,
            };
            Ok(Some(value))
        }
    }
}

fn run(config: Config) -> anyhow::Result<world::Report> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let world = World::new(config)?;
        world.run().await
    })
}

fn config(backend: Backend, default_ops: u64, plant: Plant) -> anyhow::Result<Config> {
    Ok(Config {
        seed: env_u64("DORMANT_MODEL_SEED")?.unwrap_or(SEED),
        ops: env_u64("DORMANT_MODEL_OPS")?.unwrap_or(default_ops),
        sessions: 16,
        backend,
        plant,
    })
}

fn run_reported(config: Config) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let label = format!("{:?} seed {:#x}", config.backend, config.seed);
    let report = run(config)?;
    let mut counts: Vec<_> = report.counts.iter().collect();
    counts.sort();
    println!(
        "{label}: {} ops, {} sessions retired, {:.1?}; {counts:?}",
        report.ops,
        report.retired,
        started.elapsed()
    );
    Ok(())
}

#[test]
fn random_runs_on_memory_match_the_model() -> anyhow::Result<()> {
    run_reported(config(Backend::Memory, 10_000, Plant::from_env()?)?)
}

#[test]
fn random_runs_on_sled_with_real_reopens_match_the_model() -> anyhow::Result<()> {
    // A tenth of the memory run's count: sled's reopen on each restart is what costs.
    let mut config = config(Backend::Sled, 2_000, Plant::from_env()?)?;
    if std::env::var("DORMANT_MODEL_OPS").is_ok() {
        config.ops = config.ops.div_ceil(10).max(1);
    }
    config.seed ^= 0x51ED;
    run_reported(config)
}

/// The plant must be reported: a test that cannot fail would pass here too. The same seed
/// without a plant runs clean (the memory run above draws the same first operations: the
/// count does not change the stream), so what is reported is the plant.
fn planted(plant: Plant) -> anyhow::Result<()> {
    let config = Config {
        seed: SEED,
        ops: 3_000,
        sessions: 16,
        backend: Backend::Memory,
        plant,
    };
    match run(config) {
        Ok(report) => anyhow::bail!(
            "the model did not notice the planted {plant:?} in {} ops",
            report.ops
        ),
        Err(error) => {
            println!("planted {plant:?} reported: {error:#}");
            Ok(())
        }
    }
}

#[test]
fn an_acknowledged_answer_the_store_lost_is_reported() -> anyhow::Result<()> {
    planted(Plant::LostAnswer)
}

#[test]
fn a_deadline_entry_the_store_kept_is_reported() -> anyhow::Result<()> {
    planted(Plant::KeptDeadline)
}
