//! The parent: runs generation after generation of the child process on one store directory
//! and kills each with SIGKILL, at a random time or right after an event that opens a
//! dangerous window (a non-retryable tool started, an answer was acknowledged).

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::child::{BATCH_ENV, BROKEN_ENV, DIR_ENV, GEN_ENV, SEED_ENV};
use super::rng::Rng;

/// How many kills (one per child generation).
pub(crate) const KILLS_ENV: &str = "DORMANT_TORTURE_KILLS";
/// The run's seed, to replay one (printed at the start of every run).
pub(crate) const RUN_SEED_ENV: &str = "DORMANT_TORTURE_SEED";
/// `fjall` or `journal`: the run's store is a `FjallStore` or a `JournalStore` instead of a
/// `SledStore`.
pub(crate) const STORE_ENV: &str = "DORMANT_TORTURE_STORE";
/// How many new trees each generation keeps in flight (each one that ends is replaced).
pub(crate) const BATCH_SIZE_ENV: &str = "DORMANT_TORTURE_BATCH";

/// A child that neither reached its trigger nor went idle by then is killed anyway.
const CAP: Duration = Duration::from_secs(10);

/// What one run does.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    pub(crate) kills: usize,
    pub(crate) seed: u64,
    pub(crate) batch: usize,
    pub(crate) broken: bool,
    /// The store's engine when it is not sled: `fjall` or `journal` (see
    /// `workload::ENGINE_FILE`).
    pub(crate) engine: Option<String>,
}

impl Options {
    /// From the environment, with `kills` and `seed` as defaults when unset (a random seed
    /// when `seed` is `None`).
    pub(crate) fn from_env(kills: usize, seed: Option<u64>, broken: bool) -> anyhow::Result<Self> {
        let number = |name: &str| -> anyhow::Result<Option<u64>> {
            match std::env::var(name) {
                Ok(text) => Ok(Some(text.trim().parse()?)),
                Err(_) => Ok(None),
            }
        };
        Ok(Self {
            kills: number(KILLS_ENV)?.map_or(Ok(kills), usize::try_from)?,
            seed: number(RUN_SEED_ENV)?.or(seed).unwrap_or_else(random_seed),
            batch: number(BATCH_SIZE_ENV)?.map_or(Ok(16), usize::try_from)?,
            broken,
            engine: std::env::var(STORE_ENV)
                .ok()
                .filter(|store| store != "sled"),
        })
    }
}

fn random_seed() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    now.as_secs()
        .wrapping_mul(1_000_000_007)
        .wrapping_add(u64::from(now.subsec_nanos()))
        ^ (u64::from(std::process::id()) << 40)
}

/// When a generation is killed.
#[derive(Clone, Copy, Debug)]
enum KillAfter {
    /// This long after the spawn: anywhere, boot and recovery included.
    Ms(u64),
    /// Right after the nth start of a non-retryable tool (of `tool`, or of any).
    ToolStart {
        nth: usize,
        tool: Option<&'static str>,
    },
    /// Right after the nth acknowledged answer.
    Answer { nth: usize },
}

impl KillAfter {
    fn choose(rng: &mut Rng, broken: bool) -> Self {
        // The broken variant must be caught every time: kill while `charge` lingers.
        if broken {
            return KillAfter::ToolStart {
                nth: 1,
                tool: Some("charge"),
            };
        }
        match rng.below(100) {
            0..=34 => KillAfter::Ms(rng.between(30, 1500)),
            35..=79 => KillAfter::ToolStart {
                nth: usize::try_from(rng.between(1, 11)).unwrap_or(1),
                tool: None,
            },
            _ => KillAfter::Answer {
                nth: usize::try_from(rng.between(1, 21)).unwrap_or(1),
            },
        }
    }
}

/// What the kills did.
#[derive(Debug, Default)]
pub(crate) struct Kills {
    pub(crate) total: usize,
    /// How many kills each trigger fired ("exec deploy", "time", "idle", …).
    pub(crate) by_trigger: BTreeMap<String, usize>,
    /// Non-retryable tool starts and acknowledged answers the children reported.
    pub(crate) exec_lines: usize,
    pub(crate) accepted_lines: usize,
    /// What the children noted (errors, unexpected submit outcomes), with their generation.
    pub(crate) notes: Vec<String>,
    /// Children that exited before they were killed: a crash of their own, or a failed boot.
    pub(crate) exits: Vec<String>,
}

/// Runs `options.kills` generations on `dir`, each ended by SIGKILL.
pub(crate) fn run(dir: &Path, options: &Options) -> anyhow::Result<Kills> {
    let mut rng = Rng::derived(options.seed, "kills");
    let mut kills = Kills::default();
    if let Some(engine) = &options.engine {
        std::fs::write(dir.join(super::workload::ENGINE_FILE), engine)?;
    }
    for generation in 0..options.kills {
        let trigger = KillAfter::choose(&mut rng, options.broken);
        generation_run(dir, options, generation, trigger, &mut kills)?;
    }
    Ok(kills)
}

fn generation_run(
    dir: &Path,
    options: &Options,
    generation: usize,
    trigger: KillAfter,
    kills: &mut Kills,
) -> anyhow::Result<()> {
    let stderr_path = dir.join(format!("stderr-g{generation}.log"));
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "--ignored",
            "--exact",
            "torture_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DIR_ENV, dir)
        .env(GEN_ENV, generation.to_string())
        .env(SEED_ENV, options.seed.to_string())
        .env(BATCH_ENV, options.batch.to_string())
        .env(
            BROKEN_ENV,
            if options.broken { "safe_to_retry" } else { "" },
        )
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path)?)
        .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("the child has no stdout"))?;
    // A thread reads the lines so that the parent can wait for one with a deadline.
    let (lines, received) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });

    let started = Instant::now();
    let deadline = match trigger {
        KillAfter::Ms(ms) => started + Duration::from_millis(ms),
        _ => started + CAP,
    };
    let mut seen = Seen::default();
    let mut ready = String::new();
    let fired = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match received.recv_timeout(left) {
            Ok(line) => {
                if let Some(rest) = line.strip_prefix("ready ") {
                    ready = rest.to_string();
                }
                if let Some(fired) = seen.line(&line, trigger, generation, kills) {
                    break Some(fired);
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                break Some(match trigger {
                    KillAfter::Ms(_) => "time".to_string(),
                    _ => "cap".to_string(),
                })
            }
            Err(RecvTimeoutError::Disconnected) => break None,
        }
    };
    // `Child::kill` is SIGKILL on Unix: no destructor, no flush, no shutdown runs.
    if fired.is_some() {
        child.kill()?;
    }
    let status = child.wait()?;
    // Lines the child wrote before it died still count (notes, events).
    for line in received.iter() {
        seen.line(&line, KillAfter::Ms(0), generation, kills);
    }
    let _ = reader.join();
    match fired {
        Some(fired) => {
            println!(
                "torture: g{generation} killed: {fired} after {} ms ({ready})",
                started.elapsed().as_millis()
            );
            kills.total += 1;
            // "exec deploy g1-s2 deploy-0-1" counts as "exec deploy", "accepted g1-s2 ask-0-0"
            // as "accepted".
            let words: Vec<&str> = fired.split_whitespace().collect();
            let key = match words.as_slice() {
                ["exec", tool, ..] => format!("exec {tool}"),
                [first, ..] => (*first).to_string(),
                [] => fired.clone(),
            };
            *kills.by_trigger.entry(key).or_default() += 1;
        }
        None => {
            let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            kills.exits.push(format!(
                "g{generation} exited on its own ({status}) before its kill; stderr tail:\n      {}",
                tail.join("\n      ")
            ));
        }
    }
    Ok(())
}

/// Counts a generation's event lines and says when its trigger fires.
#[derive(Debug, Default)]
struct Seen {
    execs: usize,
    matching_execs: usize,
    accepted: usize,
}

impl Seen {
    fn line(
        &mut self,
        line: &str,
        trigger: KillAfter,
        generation: usize,
        kills: &mut Kills,
    ) -> Option<String> {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("exec") => {
                self.execs += 1;
                kills.exec_lines += 1;
                let tool = words.next().unwrap_or("?");
                if let KillAfter::ToolStart { nth, tool: wanted } = trigger {
                    if wanted.is_none_or(|wanted| wanted == tool) {
                        self.matching_execs += 1;
                        if self.matching_execs == nth {
                            return Some(line.to_string());
                        }
                    }
                }
                None
            }
            Some("accepted") => {
                self.accepted += 1;
                kills.accepted_lines += 1;
                match trigger {
                    KillAfter::Answer { nth } if self.accepted == nth => Some(line.to_string()),
                    _ => None,
                }
            }
            Some("note") => {
                let note = line.strip_prefix("note ").unwrap_or(line);
                kills.notes.push(format!("g{generation}: {note}"));
                None
            }
            Some("idle") => Some("idle".to_string()),
            _ => None,
        }
    }
}
