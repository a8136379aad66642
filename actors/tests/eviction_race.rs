//! Messages that race evictions are delivered exactly once, never dropped.

mod common;

use std::collections::HashMap;

use common::{apply, Counter};
use dormant_actors::{Host, HostConfig};

const KEYS: u64 = 16;
const MESSAGES_PER_ROUND: u64 = 8_000;
/// Whether a stop request wins against a busy actor depends on scheduling; on a loaded machine
/// one round can go by without a single passivation, so rounds repeat until one happened.
const MAX_ROUNDS: u64 = 20;

/// Sends the ids `ids` round-robin over the keys while another task keeps evicting them.
async fn race(host: &Host<Counter>, ids: std::ops::Range<u64>) -> anyhow::Result<()> {
    let evictor = {
        let host = host.clone();
        tokio::spawn(async move {
            for round in 0..2_000u64 {
                host.evict(&format!("k{}", round % KEYS));
                if round % 7 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    let mut answers = Vec::with_capacity(MESSAGES_PER_ROUND as usize);
    for id in ids {
        answers.push(apply(host, &format!("k{}", id % KEYS), id));
        if id % 64 == 0 {
            tokio::task::yield_now().await;
        }
    }
    evictor.await?;
    for answer in answers {
        answer.await??;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_sends_interleaved_with_evictions_arrive_exactly_once() -> anyhow::Result<()> {
    let config = HostConfig {
        max_resident: Some(8),
        ..HostConfig::default()
    };
    let host = Host::new(Counter::default(), config);
    let mut sent = 0;
    for _ in 0..MAX_ROUNDS {
        race(&host, sent..sent + MESSAGES_PER_ROUND).await?;
        sent += MESSAGES_PER_ROUND;
        let stats = host.stats();
        if stats.passivations > 0 && stats.activations > KEYS {
            break;
        }
    }
    let durable = host.behaviour().durable.lock().clone();
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for (key, ids) in &durable {
        for id in ids {
            assert_eq!(
                format!("k{}", id % KEYS),
                *key,
                "id {id} went to the wrong key"
            );
            *seen.entry(*id).or_default() += 1;
        }
    }
    for id in 0..sent {
        assert_eq!(
            seen.get(&id),
            Some(&1),
            "message {id} was not applied exactly once"
        );
    }
    let stats = host.stats();
    assert!(
        stats.passivations > 0,
        "the test must actually evict: {stats:?}"
    );
    assert!(
        stats.activations > KEYS,
        "evicted keys must re-activate: {stats:?}"
    );
    Ok(())
}
