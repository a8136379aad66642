//! Activation on first message, passivation, LRU eviction and rehydration of a keyed actor.

mod common;

use std::sync::Arc;

use common::{activations, apply, ask, Counter, CounterMsg};
use dormant_actors::{Error, Host, HostConfig, HostError, ManualClock};
use tokio::sync::oneshot;

/// Dropping the host without a shutdown stops its actors: a mailbox their background work
/// holds refuses messages from then on, where the actor used to wait for them forever.
#[tokio::test]
async fn a_host_dropped_without_a_shutdown_stops_its_actors() -> anyhow::Result<()> {
    let host = Host::new(Counter::default(), HostConfig::default());
    let (open, gate) = oneshot::channel();
    let (mailbox_to, mailbox) = oneshot::channel();
    let _ = open.send(());
    host.send("left".to_string(), CounterMsg::Hold { mailbox_to, gate });
    let mailbox = mailbox.await?;
    drop(host);
    let (reply, _answer) = oneshot::channel();
    assert!(
        mailbox.send(CounterMsg::Apply { id: 1, reply }).is_err(),
        "an actor of a dropped host still takes messages"
    );
    Ok(())
}

/// A message the actor's background work sends back after the actor took its stop (behind
/// the stop in its mailbox) is handled by the key's next actor, not dropped with the mailbox.
#[tokio::test]
async fn a_message_left_behind_a_stop_goes_to_the_next_actor() -> anyhow::Result<()> {
    let host = Host::new(Counter::default(), HostConfig::default());
    let key = "held".to_string();
    let (open, gate) = oneshot::channel();
    let (mailbox_to, mailbox) = oneshot::channel();
    host.send(key.clone(), CounterMsg::Hold { mailbox_to, gate });
    // The actor is in its handler now, waiting for the gate.
    let mailbox = mailbox.await?;
    host.evict(&key);
    let (reply, answer) = oneshot::channel();
    mailbox
        .send(CounterMsg::Apply { id: 7, reply })
        .map_err(|_| anyhow::anyhow!("the actor's mailbox refused a message before its stop"))?;
    let _ = open.send(());
    assert_eq!(answer.await?.ok(), Some(1));
    assert_eq!(
        activations(host.behaviour()),
        2,
        "the next actor handled it"
    );
    host.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn first_message_activates_and_loads_durable_state() -> anyhow::Result<()> {
    let counter = Counter::default();
    counter.durable.lock().insert("a".into(), vec![7, 8]);
    let host = Host::new(counter, HostConfig::default());
    assert!(!host.is_resident(&"a".to_string()));
    assert_eq!(apply(&host, "a", 9).await??, 3);
    assert!(host.is_resident(&"a".to_string()));
    assert_eq!(host.stats().activations, 1);
    Ok(())
}

#[tokio::test]
async fn evicted_actor_rehydrates_from_durable_state() -> anyhow::Result<()> {
    let host = Host::new(Counter::default(), HostConfig::default());
    apply(&host, "a", 1).await??;
    host.evict_and_wait(&"a".to_string()).await;
    assert!(!host.is_resident(&"a".to_string()));
    assert_eq!(apply(&host, "a", 2).await??, 2);
    let stats = host.stats();
    assert_eq!((stats.activations, stats.passivations), (2, 1));
    Ok(())
}

#[tokio::test]
async fn busy_actor_refuses_eviction_and_keeps_its_messages() -> anyhow::Result<()> {
    let host = Host::new(Counter::default(), HostConfig::default());
    ask(&host, "a", |reply| CounterMsg::SetBusy {
        busy: true,
        reply,
    })
    .await??;
    host.evict_and_wait(&"a".to_string()).await;
    assert!(host.is_resident(&"a".to_string()));
    assert_eq!(apply(&host, "a", 1).await??, 1);
    assert_eq!(host.stats().activations, 1);
    ask(&host, "a", |reply| CounterMsg::SetBusy {
        busy: false,
        reply,
    })
    .await??;
    host.evict_and_wait(&"a".to_string()).await;
    assert!(!host.is_resident(&"a".to_string()));
    Ok(())
}

#[tokio::test]
async fn least_recently_used_actors_are_evicted_past_the_limit() -> anyhow::Result<()> {
    let config = HostConfig {
        max_resident: Some(10),
        ..HostConfig::default()
    };
    let host = Host::new(Counter::default(), config);
    for key in 0..10 {
        apply(&host, &format!("k{key}"), 0).await??;
    }
    // Touch k0 so that k1 becomes the least recently used.
    apply(&host, "k0", 1).await??;
    apply(&host, "k10", 0).await??;
    // The eleventh activation evicts down to nine tenths of the limit: the two oldest.
    host.evict_and_wait(&"k1".to_string()).await;
    host.evict_and_wait(&"k2".to_string()).await;
    assert!(host.is_resident(&"k0".to_string()));
    assert!(!host.is_resident(&"k1".to_string()));
    assert!(!host.is_resident(&"k2".to_string()));
    assert!(host.stats().resident <= 10);
    assert_eq!(host.stats().peak_resident, 11);
    // An evicted key comes back with its state.
    assert_eq!(apply(&host, "k1", 5).await??, 2);
    Ok(())
}

#[tokio::test]
async fn idle_actors_are_passivated_by_the_clock() -> anyhow::Result<()> {
    let clock = ManualClock::new(0);
    let config = HostConfig {
        idle_after_ms: Some(1_000),
        ..HostConfig::default()
    };
    let host = Host::with_clock(Counter::default(), config, Arc::new(clock.clone()));
    apply(&host, "old", 0).await??;
    clock.advance(600);
    apply(&host, "new", 0).await??;
    clock.advance(500);
    assert_eq!(host.passivate_idle(), 1);
    host.evict_and_wait(&"old".to_string()).await;
    assert!(!host.is_resident(&"old".to_string()));
    assert!(host.is_resident(&"new".to_string()));
    Ok(())
}

#[tokio::test]
async fn failed_activation_answers_a_typed_error_and_can_be_retried() -> anyhow::Result<()> {
    let counter = Counter {
        fail_activation_of: Some("bad".into()),
        ..Counter::default()
    };
    let host = Host::new(counter, HostConfig::default());
    let first = apply(&host, "bad", 1);
    let second = apply(&host, "bad", 2);
    for answer in [first.await?, second.await?] {
        match answer {
            // The behaviour's own error, as it typed it: no text to read it back from.
            Err(Error::ActivationFailed { key, error }) => {
                assert_eq!(key, "bad");
                assert_eq!(error.kind(), std::io::ErrorKind::Other);
                assert_eq!(error.to_string(), "snapshot is corrupt");
            }
            other => anyhow::bail!("expected an activation failure, got {other:?}"),
        }
    }
    assert!(!host.is_resident(&"bad".to_string()));
    assert_eq!(apply(&host, "good", 1).await??, 1);
    Ok(())
}

#[tokio::test]
async fn shutdown_stops_everything_and_rejects_later_messages() -> anyhow::Result<()> {
    let host = Host::new(Counter::default(), HostConfig::default());
    apply(&host, "a", 1).await??;
    ask(&host, "b", |reply| CounterMsg::SetBusy {
        busy: true,
        reply,
    })
    .await??;
    host.shutdown().await;
    assert_eq!(host.stats().resident, 0);
    assert!(matches!(apply(&host, "a", 2).await?, Err(Error::ShutDown)));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_right_after_the_first_send_returns() -> anyhow::Result<()> {
    // The first send spawns an activation; shutdown must not wait for a wake-up that the
    // activation never sends.
    for _ in 0..50 {
        let host = Host::new(Counter::default(), HostConfig::default());
        let (reply, _answer) = tokio::sync::oneshot::channel();
        host.send("a".into(), CounterMsg::SetBusy { busy: false, reply });
        tokio::time::timeout(std::time::Duration::from_secs(10), host.shutdown()).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn an_actor_busy_past_the_limit_is_evicted_once_it_goes_idle() -> anyhow::Result<()> {
    let config = HostConfig {
        max_resident: Some(1),
        ..HostConfig::default()
    };
    let host = Host::new(Counter::default(), config);
    // Two busy actors: the second activation asks the first to stop, and it refuses.
    for key in ["a", "b"] {
        ask(&host, key, |reply| CounterMsg::SetBusy {
            busy: true,
            reply,
        })
        .await??;
    }
    host.evict_and_wait(&"a".to_string()).await;
    assert_eq!(host.stats().resident, 2, "both busy, both resident");
    ask(&host, "a", |reply| CounterMsg::SetBusy {
        busy: false,
        reply,
    })
    .await??;
    // No clock and no other message: only going idle past the limit can stop it. Its stop
    // runs on this thread's tasks, so yield until it has (bounded, so a missing stop fails).
    for _ in 0..1_000 {
        if !host.is_resident(&"a".to_string()) {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(!host.is_resident(&"a".to_string()), "{:?}", host.stats());
    assert!(host.is_resident(&"b".to_string()), "b is still busy");
    Ok(())
}

/// A fan-out of busy actors past the limit: a scan for actors to evict stops none of them, so
/// the table is not scanned again at every activation, only once per tenth of the limit.
#[tokio::test]
async fn busy_actors_past_the_limit_are_not_scanned_for_at_every_activation() -> anyhow::Result<()>
{
    let config = HostConfig {
        max_resident: Some(100),
        ..HostConfig::default()
    };
    let host = Host::new(Counter::default(), config);
    for key in 0..1_000 {
        ask(&host, &format!("k{key}"), |reply| CounterMsg::SetBusy {
            busy: true,
            reply,
        })
        .await??;
    }
    let stats = host.stats();
    assert_eq!(
        stats.resident, 1_000,
        "every actor is busy: none is evicted"
    );
    // 900 activations over the limit: one scan per 10 of them (before: one each).
    assert!((1..=100).contains(&stats.eviction_scans), "{stats:?}");
    Ok(())
}

/// An actor with a long queue of messages its handler answers at once still lets the other
/// tasks of its worker run now and then: each message takes a unit of its task's budget.
#[tokio::test(flavor = "current_thread")]
async fn a_long_queue_lets_the_workers_other_tasks_run() -> anyhow::Result<()> {
    let host = Host::new(Counter::default(), HostConfig::default());
    let answers: Vec<_> = (0..1_000).map(|id| apply(&host, "long", id)).collect();
    let durable = Arc::clone(&host.behaviour().durable);
    // Queued behind the actor's task on this one thread: it runs when the actor yields.
    let handled_before =
        tokio::spawn(async move { durable.lock().get("long").map_or(0, Vec::len) });
    let handled_before = handled_before.await?;
    assert!(
        handled_before < 1_000,
        "the other task ran only after all {handled_before} messages"
    );
    assert!(handled_before > 0, "the other task ran before the actor");
    for answer in answers {
        assert!(answer.await?.is_ok());
    }
    host.shutdown().await;
    Ok(())
}

/// A state that says when it is dropped.
#[derive(Debug)]
struct Tracked(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A behaviour that records, when its actor is reported passivated, whether the actor's state
/// was already gone (a session's state cancels the work it holds when dropped, and its
/// passivation hands the session on).
#[derive(Debug, Default)]
struct DropsFirst {
    dropped: Arc<std::sync::atomic::AtomicBool>,
    dropped_before_passivated: Arc<parking_lot::Mutex<Option<bool>>>,
}

impl dormant_actors::VirtualActor for DropsFirst {
    type Key = String;
    type Msg = oneshot::Sender<()>;
    type State = Tracked;
    type Error = std::convert::Infallible;

    async fn activate(&self, _key: &String) -> Result<Tracked, Self::Error> {
        Ok(Tracked(Arc::clone(&self.dropped)))
    }

    async fn handle(
        &self,
        _ctx: &dormant_actors::ActorContext<Self>,
        reply: oneshot::Sender<()>,
        _state: &mut Tracked,
    ) {
        let _ = reply.send(());
    }

    fn passivated(&self, _key: &String) {
        let dropped = self.dropped.load(std::sync::atomic::Ordering::SeqCst);
        *self.dropped_before_passivated.lock() = Some(dropped);
    }

    fn reject(&self, _host: &Host<Self>, _msg: oneshot::Sender<()>, _error: HostError<Self>) {}
}

#[tokio::test]
async fn an_actors_state_is_dropped_before_its_stop_is_reported() -> anyhow::Result<()> {
    let host = Host::new(DropsFirst::default(), HostConfig::default());
    let (reply, answer) = oneshot::channel();
    host.send("a".to_string(), reply);
    answer.await?;
    host.evict_and_wait(&"a".to_string()).await;
    assert_eq!(
        *host.behaviour().dropped_before_passivated.lock(),
        Some(true)
    );
    Ok(())
}
