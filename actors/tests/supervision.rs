//! A panicking actor restarts from durable state; a crash loop marks the key failed.

mod common;

use std::sync::Arc;

use common::{activations, apply, ask, Counter, CounterMsg};
use dormant_actors::{Error, Host, HostConfig, ManualClock};

fn quiet_panics() {
    std::panic::set_hook(Box::new(|_| {}));
}

#[tokio::test]
async fn panic_restarts_from_durable_state_and_keeps_the_mailbox() -> anyhow::Result<()> {
    quiet_panics();
    let host = Host::new(Counter::default(), HostConfig::default());
    apply(&host, "a", 1).await??;
    // Queue a panic and two applies behind it without waiting: none of the applies is lost.
    let (panic_reply, panicked) = tokio::sync::oneshot::channel();
    host.send("a".into(), CounterMsg::Panic { reply: panic_reply });
    let second = apply(&host, "a", 2);
    let third = apply(&host, "a", 3);
    assert!(
        panicked.await.is_err(),
        "the panicking message's caller sees a dropped reply"
    );
    assert_eq!(second.await??, 2);
    assert_eq!(third.await??, 3);
    assert_eq!(host.stats().crashes, 1);
    assert_eq!(
        activations(host.behaviour()),
        2,
        "one activation and one restart"
    );
    Ok(())
}

#[tokio::test]
async fn crash_loop_marks_the_key_failed_with_a_typed_error() -> anyhow::Result<()> {
    quiet_panics();
    let clock = ManualClock::new(0);
    let config = HostConfig {
        max_crashes: 3,
        crash_window_ms: 10_000,
        ..HostConfig::default()
    };
    let host = Host::with_clock(Counter::default(), config, Arc::new(clock.clone()));
    for _ in 0..3 {
        let answer = ask(&host, "a", |reply| CounterMsg::Panic { reply }).await;
        assert!(answer.is_err(), "a panicking handler drops its reply");
    }
    match apply(&host, "a", 1).await? {
        Err(Error::Failed { key, crashes, .. }) => {
            assert_eq!(key, "a");
            assert_eq!(crashes, 3);
        }
        other => anyhow::bail!("expected Failed, got {other:?}"),
    }
    // Evicting does not clear the mark: the key keeps answering the error.
    host.evict_and_wait(&"a".to_string()).await;
    assert!(matches!(
        apply(&host, "a", 1).await?,
        Err(Error::Failed { .. })
    ));
    // Other keys are unaffected, and clearing the mark lets the key activate again.
    assert_eq!(apply(&host, "b", 1).await??, 1);
    host.clear_failure(&"a".to_string());
    assert_eq!(apply(&host, "a", 1).await??, 1);
    Ok(())
}

#[tokio::test]
async fn crashes_outside_the_window_do_not_add_up() -> anyhow::Result<()> {
    quiet_panics();
    let clock = ManualClock::new(0);
    let config = HostConfig {
        max_crashes: 2,
        crash_window_ms: 1_000,
        ..HostConfig::default()
    };
    let host = Host::with_clock(Counter::default(), config, Arc::new(clock.clone()));
    for _ in 0..4 {
        let _ = ask(&host, "a", |reply| CounterMsg::Panic { reply }).await;
        clock.advance(1_001);
    }
    assert_eq!(apply(&host, "a", 1).await??, 1);
    assert_eq!(host.stats().crashes, 4);
    Ok(())
}
