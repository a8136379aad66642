//! One generation: a child process that reopens the run's store, carries on with every tree it
//! finds unfinished, starts a batch of new ones, evicts now and then, and reports events on
//! stdout until its parent kills it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dormant::{SessionId, Status};
use tokio::task::JoinSet;

use super::client::{Behaviour, Client};
use super::journal::{Journal, ACCEPTED};
use super::rng::Rng;
use super::workload::{self, Process};

pub(crate) const DIR_ENV: &str = "DORMANT_TORTURE_CHILD_DIR";
pub(crate) const GEN_ENV: &str = "DORMANT_TORTURE_CHILD_GEN";
pub(crate) const SEED_ENV: &str = "DORMANT_TORTURE_CHILD_SEED";
pub(crate) const BATCH_ENV: &str = "DORMANT_TORTURE_CHILD_BATCH";
/// `safe_to_retry`: the broken variant (read by children and by the harness alike).
pub(crate) const BROKEN_ENV: &str = "DORMANT_TORTURE_BROKEN";

/// A child's orders, from its environment.
#[derive(Debug)]
pub(crate) struct Orders {
    pub(crate) dir: PathBuf,
    pub(crate) generation: u32,
    pub(crate) seed: u64,
    pub(crate) batch: usize,
    pub(crate) broken: bool,
}

impl Orders {
    /// `None` when this process is not a torture child (the ignored test run by hand).
    pub(crate) fn from_env() -> anyhow::Result<Option<Self>> {
        let Ok(dir) = std::env::var(DIR_ENV) else {
            return Ok(None);
        };
        Ok(Some(Self {
            dir: dir.into(),
            generation: std::env::var(GEN_ENV)?.parse()?,
            seed: std::env::var(SEED_ENV)?.parse()?,
            batch: std::env::var(BATCH_ENV)?.parse()?,
            broken: is_broken(),
        }))
    }
}

pub(crate) fn is_broken() -> bool {
    std::env::var(BROKEN_ENV).is_ok_and(|mode| mode == "safe_to_retry")
}

/// How the children's simulated client behaves: duplicates, evictions, latency, and answers
/// left for a later round so that resumes meet the barrier.
const BEHAVIOUR: Behaviour = Behaviour {
    duplicates: 20,
    evictions: 10,
    latency_ms: 40,
    answer_all: false,
    forks: 10,
};

/// How many times over a generation replaces its batch before it lets itself go idle.
const REPLACEMENTS: usize = 10;

pub(crate) async fn run(orders: Orders) -> anyhow::Result<()> {
    let name = format!("g{}", orders.generation);
    let process = Arc::new(Process::new(
        &orders.dir,
        name.clone(),
        orders.seed,
        orders.broken,
        true,
    )?);
    let accepted = Arc::new(Journal::open(&orders.dir.join(ACCEPTED))?);
    let mut rng = Rng::derived(orders.seed, &name);
    // Half the generations keep few actors resident, so LRU eviction races the work.
    let max_resident = rng
        .percent(50)
        .then(|| usize::try_from(rng.between(4, 33)))
        .transpose()?;
    // libtest has printed "test torture_child ... " without a newline: end that line, so
    // every event starts one of its own.
    process.say("");
    let runtime = workload::runtime(&orders.dir, &process, max_resident)?;

    let mut found = 0;
    let mut unfinished = Vec::new();
    for id in runtime.session_ids().await? {
        let record = runtime.session(&id).await?;
        if record.parent.is_none() {
            found += 1;
            if !matches!(record.status, Status::Completed | Status::Failed) {
                unfinished.push(id);
            }
        }
    }
    process.say(&format!(
        "ready roots={found} unfinished={} max_resident={max_resident:?}",
        unfinished.len()
    ));

    let client = |id: &SessionId| {
        let rng = Rng::derived(orders.seed, &format!("{name}/{id}"));
        Client::new(
            runtime.clone(),
            Arc::clone(&process),
            Arc::clone(&accepted),
            rng,
            BEHAVIOUR,
        )
    };
    let mut trees = JoinSet::new();
    for id in unfinished {
        let mut client = client(&id);
        trees.spawn(async move { client.drive(&id, usize::MAX).await });
    }
    // New sessions trickle in, so kills find them at every stage; each tree that ends is
    // replaced by a new one, so a generation is rarely idle when its kill comes.
    let mut started = 0;
    let mut start = |trees: &mut JoinSet<_>, start_after: Duration| -> anyhow::Result<()> {
        let id: SessionId = format!("{name}-s{started}").parse()?;
        started += 1;
        let mut client = client(&id);
        trees.spawn(async move {
            tokio::time::sleep(start_after).await;
            if let Err(error) = client.runtime.execute_on(&id, "root", "go").await {
                client.process.say(&format!("note {id}: execute: {error}"));
            }
            client.drive(&id, usize::MAX).await
        });
        Ok(())
    };
    for _ in 0..orders.batch {
        start(&mut trees, Duration::from_millis(rng.below(300)))?;
    }
    let mut replacements = orders.batch * REPLACEMENTS;
    let evictor = {
        let runtime = runtime.clone();
        let mut rng = Rng::derived(orders.seed, &format!("{name}/evictions"));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(rng.between(50, 400))).await;
                runtime.evict_all().await;
            }
        })
    };
    while let Some(tree) = trees.join_next().await {
        tree?;
        if replacements > 0 {
            replacements -= 1;
            start(&mut trees, Duration::ZERO)?;
        }
    }
    evictor.abort();
    process.say("idle");
    // Killed here at the latest: a clean shutdown would not be a crash.
    std::future::pending::<()>().await;
    Ok(())
}
