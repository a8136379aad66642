//! What renewing leases costs a node that holds many: `cargo run --release --features postgres
//! --example lease_renewal -- URL [SESSIONS]` takes SESSIONS leases (100,000 by default, one
//! tree each) on the database at URL, then keeps the node live five times, as the background
//! renewal does every third of a lease's time to live, and reports each renewal's time
//! against that period (the share of the node's time renewal takes, one connection busy).
//! A node renews its own liveness, not each lease, so the time does not grow with SESSIONS:
//! run it with 1 and with 100,000 to compare.

use std::time::{Duration, Instant};

use dormant::cluster::leases::Leases;
use dormant::store::Store;
use dormant::store::DEFAULT_LEASE_TTL;
use dormant::PgStore;
use futures::StreamExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .ok_or("usage: lease_renewal URL [SESSIONS] (a PostgreSQL URL on this machine)")?;
    let sessions: usize = args.next().map_or(Ok(100_000), |n| n.parse())?;
    let node = format!("renewal-{}", std::process::id());
    let store = PgStore::builder(&url).node(node).connect().await?;

    let started = Instant::now();
    let taken = futures::stream::iter(0..sessions)
        .map(|index| {
            let store = &store;
            async move {
                let id = format!("renewal-{}-{index}", std::process::id());
                store.acquire(&id, &id).await
            }
        })
        .buffer_unordered(16)
        .filter(|taken| futures::future::ready(taken.is_ok()))
        .count()
        .await;
    println!(
        "took {taken} leases in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // A node renews four times in a time to live.
    let period = DEFAULT_LEASE_TTL / 4;
    let mut times = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let held = store.renew_leases().await?;
        let took = started.elapsed();
        println!(
            "renewed {held} leases in {:.3} ms: {:.3} % of the {} ms renewal period",
            took.as_secs_f64() * 1e3,
            100.0 * took.as_secs_f64() / period.as_secs_f64(),
            period.as_millis()
        );
        times.push(took);
    }
    times.sort();
    let median = times
        .get(times.len() / 2)
        .copied()
        .unwrap_or(Duration::ZERO);
    println!(
        "median renewal of {taken} leases: {:.3} ms, {:.3} % of the period; {:.4} µs a lease",
        median.as_secs_f64() * 1e3,
        100.0 * median.as_secs_f64() / period.as_secs_f64(),
        median.as_secs_f64() * 1e6 / taken.max(1) as f64
    );
    store.close().await?;
    Ok(())
}
