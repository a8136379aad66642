//! What the virtual-actor host costs beside a bare ractor actor (the host's actors were ractor
//! actors until each became one tokio task and a mailbox of the host's own).
//!
//! `round_trip/{current_thread,multi_thread}/…`: sequential request/reply round trips from a
//! task on a tokio runtime of that flavor (one element = one round trip):
//!
//! * `bare_ractor_oneshot`: `send_message` to a ractor actor with a tokio oneshot in the
//!   message, then await the reply.
//! * `bare_ractor_call`: the same through `ractor::call!` (ractor's RPC port).
//! * `host_send`: `dormant_actors::Host::send` to a key whose actor is already active, with a
//!   tokio oneshot in the message, then await the reply. The ratio to `bare_ractor_oneshot` is
//!   the host's routing (key lookup, LRU touch, envelope) and its mailbox against ractor's. On
//!   `current_thread` it is pure CPU cost; on `multi_thread` cross-thread wake-ups dominate.
//!
//! Before the criterion benches, memory per idle actor is printed to stderr: 20,000 idle bare
//! ractor actors, then 20,000 idle host actors (each activated by a message and left
//! resident), each measured in a fresh child process as the VmRSS delta divided by the count.
//! Run with `cargo bench --bench host`.

#[path = "support/rss.rs"]
mod rss;
use rss::rss_bytes;

use std::convert::Infallible;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::Criterion;
use dormant_actors::{ActorContext, Host, HostConfig, HostError, VirtualActor};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::oneshot;

/// Set in the child processes that measure memory; its value names what to measure.
const CHILD_ENV: &str = "DORMANT_HOST_BENCH_MEMORY";
/// Idle actors spawned per memory measurement.
const IDLE_ACTORS: usize = 20_000;

/// A host behaviour that counts the pings it answers.
#[derive(Debug)]
struct Echo;

/// A ping for [`Echo`].
#[derive(Debug)]
struct Ping {
    reply: oneshot::Sender<u64>,
}

impl VirtualActor for Echo {
    type Key = u64;
    type Msg = Ping;
    type State = u64;
    type Error = Infallible;

    async fn activate(&self, _key: &u64) -> Result<u64, Infallible> {
        Ok(0)
    }

    async fn handle(&self, _ctx: &ActorContext<Self>, msg: Ping, count: &mut u64) {
        *count += 1;
        let _ = msg.reply.send(*count);
    }

    fn reject(&self, _host: &Host<Self>, msg: Ping, _error: HostError<Self>) {
        drop(msg);
    }
}

/// A bare ractor actor that answers the same pings.
struct Bare;

/// Messages of [`Bare`].
enum BareMsg {
    /// Reply through a tokio oneshot, as the host benchmark does.
    Ping(oneshot::Sender<u64>),
    /// Reply through ractor's RPC port (`ractor::call!`).
    Call(RpcReplyPort<u64>),
}

impl Actor for Bare {
    type Msg = BareMsg;
    type State = u64;
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ActorRef<BareMsg>,
        _args: (),
    ) -> Result<u64, ActorProcessingErr> {
        Ok(0)
    }

    async fn handle(
        &self,
        _myself: ActorRef<BareMsg>,
        msg: BareMsg,
        count: &mut u64,
    ) -> Result<(), ActorProcessingErr> {
        *count += 1;
        match msg {
            BareMsg::Ping(reply) => {
                let _ = reply.send(*count);
            }
            BareMsg::Call(reply) => {
                let _ = reply.send(*count);
            }
        }
        Ok(())
    }
}

fn tokio_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

async fn host_ping(host: &Host<Echo>, key: u64) -> anyhow::Result<u64> {
    let (reply, answer) = oneshot::channel();
    host.send(key, Ping { reply });
    Ok(answer.await?)
}

async fn bare_ping(actor: &ActorRef<BareMsg>) -> anyhow::Result<u64> {
    let (reply, answer) = oneshot::channel();
    actor
        .send_message(BareMsg::Ping(reply))
        .map_err(|_| anyhow::anyhow!("bare actor is gone"))?;
    Ok(answer.await?)
}

async fn bare_call(actor: &ActorRef<BareMsg>) -> anyhow::Result<u64> {
    ractor::call!(actor, BareMsg::Call).map_err(|e| anyhow::anyhow!("ractor::call! failed: {e}"))
}

/// Times `iters` sequential round trips from a task spawned on `rt` (so that on the
/// multi-thread runtime the caller is a worker thread, as in a real program).
fn time_round_trips<F, Fut>(rt: &tokio::runtime::Runtime, iters: u64, trip: F) -> Duration
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<u64>> + Send,
{
    let task = rt.spawn(async move {
        let start = Instant::now();
        for _ in 0..iters {
            if let Err(e) = trip().await {
                panic!("round trip failed: {e}");
            }
        }
        start.elapsed()
    });
    match rt.block_on(task) {
        Ok(elapsed) => elapsed,
        Err(e) => panic!("round-trip task failed: {e}"),
    }
}

fn round_trip(c: &mut Criterion) -> anyhow::Result<()> {
    let flavors = [
        (
            "current_thread",
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
        ),
        ("multi_thread", tokio_runtime()?),
    ];
    let mut group = c.benchmark_group("round_trip");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (flavor, rt) in &flavors {
        let (actor, host) = rt.block_on(async {
            let (actor, _join) = Actor::spawn(None, Bare, ()).await?;
            let host = Host::new(Echo, HostConfig::default());
            // Activate the key before measuring: the bench is the steady-state round trip.
            host_ping(&host, 7).await?;
            anyhow::Ok((actor, host))
        })?;
        group.bench_function(format!("{flavor}/bare_ractor_oneshot"), |b| {
            b.iter_custom(|iters| {
                let actor = actor.clone();
                time_round_trips(rt, iters, move || {
                    let actor = actor.clone();
                    async move { bare_ping(&actor).await }
                })
            });
        });
        group.bench_function(format!("{flavor}/bare_ractor_call"), |b| {
            b.iter_custom(|iters| {
                let actor = actor.clone();
                time_round_trips(rt, iters, move || {
                    let actor = actor.clone();
                    async move { bare_call(&actor).await }
                })
            });
        });
        group.bench_function(format!("{flavor}/host_send"), |b| {
            b.iter_custom(|iters| {
                let host = host.clone();
                time_round_trips(rt, iters, move || {
                    let host = host.clone();
                    async move { host_ping(&host, 7).await }
                })
            });
        });
        rt.block_on(async {
            host.shutdown().await;
            actor.stop(None);
        });
    }
    group.finish();
    Ok(())
}

/// In a child process: spawns `count` idle actors of the kind named, prints
/// `<rss before> <rss after>` on stdout.
fn memory_child(kind: &str, count: usize) -> anyhow::Result<()> {
    let rt = tokio_runtime()?;
    rt.block_on(async {
        // Warm up the runtime, ractor's globals and the allocator before the baseline.
        let host = Host::new(Echo, HostConfig::default());
        for key in 0..100 {
            host_ping(&host, 1_000_000 + key).await?;
            let (actor, join) = Actor::spawn(None, Bare, ()).await?;
            actor.stop(None);
            join.await?;
        }
        host.evict_all().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before = rss_bytes()?;
        let mut bare = Vec::new();
        match kind {
            "bare" => {
                bare.reserve(count);
                for _ in 0..count {
                    let (actor, join) = Actor::spawn(None, Bare, ()).await?;
                    bare.push((actor, join));
                }
            }
            "host" => {
                for key in 0..u64::try_from(count)? {
                    host_ping(&host, key).await?;
                }
                anyhow::ensure!(host.stats().resident == count, "host actors were evicted");
            }
            other => anyhow::bail!("unknown memory measurement {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let after = rss_bytes()?;
        println!("{before} {after}");
        host.shutdown().await;
        for (actor, _) in &bare {
            actor.stop(None);
        }
        Ok(())
    })
}

/// Runs one memory measurement in a fresh process, so neither kind inherits the other's heap.
fn measure_in_child(kind: &str, count: usize) -> anyhow::Result<(u64, u64)> {
    let output = Command::new(std::env::current_exe()?)
        .env(CHILD_ENV, format!("{kind}:{count}"))
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "memory child {kind} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout)?;
    let mut numbers = text.split_whitespace().map(str::parse::<u64>);
    match (numbers.next(), numbers.next()) {
        (Some(Ok(before)), Some(Ok(after))) => Ok((before, after)),
        _ => anyhow::bail!("memory child {kind} printed {text:?}"),
    }
}

#[allow(clippy::cast_precision_loss)]
fn per_actor(before: u64, after: u64, count: usize) -> f64 {
    after.saturating_sub(before) as f64 / count as f64
}

fn memory_report(count: usize) -> anyhow::Result<()> {
    eprintln!("memory per idle actor ({count} actors each, VmRSS delta in a fresh process):");
    let (before, after) = measure_in_child("bare", count)?;
    let bare = per_actor(before, after, count);
    eprintln!(
        "  bare ractor actor: {:.0} bytes ({:.1} KiB) per actor  [rss {} -> {} KiB]",
        bare,
        bare / 1024.0,
        before / 1024,
        after / 1024
    );
    let (before, after) = measure_in_child("host", count)?;
    let host = per_actor(before, after, count);
    eprintln!(
        "  host actor:        {:.0} bytes ({:.1} KiB) per actor  [rss {} -> {} KiB]",
        host,
        host / 1024.0,
        before / 1024,
        after / 1024
    );
    if bare > 0.0 {
        eprintln!("  host / bare:       {:.2}", host / bare);
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (kind, count) = spec
            .split_once(':')
            .ok_or_else(|| anyhow::anyhow!("bad {CHILD_ENV}={spec:?}"))?;
        return memory_child(kind, count.parse()?);
    }
    let args: Vec<String> = std::env::args().collect();
    let listing = args.iter().any(|arg| arg == "--list");
    // `cargo bench` passes `--bench`; without it (`cargo test --benches`) criterion runs each
    // bench once as a test, so keep the measurements before it small too.
    let testing = !args.iter().any(|arg| arg == "--bench");
    if !listing {
        memory_report(if testing { 1_000 } else { IDLE_ACTORS })?;
    }
    let mut criterion = Criterion::default().configure_from_args();
    round_trip(&mut criterion)?;
    criterion.final_summary();
    Ok(())
}
