//! Remote children a parent let go while their server did not answer (written off after the
//! parent's patience ran out, or aborted or interrupted with their tree) are recorded in the
//! store, and stopped there once the server answers again: a tree that gave up on a remote
//! leaves nothing running or waiting on it. A pass tries each once; a background task makes a
//! pass whenever one is recorded and then at intervals while any is left.

use std::sync::Arc;
use std::time::Duration;

use super::{RemoteError, RemoteOrphan};
use crate::engine::shared::Shared;
use crate::error::Error;
use crate::store::schema;
use crate::store::{Batch, CommitKind};

/// Orphans read at a time.
const PAGE: usize = 256;

/// Records `orphan` to be stopped, and wakes the background task.
pub(crate) async fn record(shared: &Shared, orphan: RemoteOrphan) -> Result<(), Error> {
    tracing::warn!(child = %orphan.child, endpoint = %orphan.endpoint, abort = orphan.abort, "remote_subagent.orphaned");
    let mut batch = Batch::new(CommitKind::Other);
    schema::put_orphan(&mut batch, &orphan)?;
    shared.store.commit(batch).await?;
    shared.orphans_recorded.notify_one();
    Ok(())
}

/// Forgets `child`, recorded to be stopped (by the commit that let it go): its stop got
/// through. A failure to forget it costs one stop more, by the next pass.
pub(crate) async fn forget(shared: &Shared, child: &crate::types::ids::SessionId) {
    let mut batch = Batch::new(CommitKind::Other);
    schema::delete_orphan(&mut batch, child);
    if let Err(error) = shared.store.commit(batch).await {
        tracing::warn!(%child, %error, "remote_subagent.orphan_not_forgotten");
    }
}

/// Forgets `child` if it is recorded to be stopped: its parent wakes it, and wants it going
/// (a stop recorded earlier, an interrupt that could not reach it, would cut the run now
/// resumed once its server answers the orphan pass). A read, and a commit only then.
pub(crate) async fn forget_if_recorded(shared: &Shared, child: &crate::types::ids::SessionId) {
    match schema::orphan_recorded(shared.store.as_ref(), child).await {
        Ok(true) => forget(shared, child).await,
        Ok(false) => {}
        Err(error) => tracing::warn!(%child, %error, "remote_subagent.orphan_unreadable"),
    }
}

/// Tries to stop every recorded orphan once, a page at a time; forgets those stopped, or
/// unknown to their server. A server that does not answer is asked once a pass: its other
/// orphans wait for the next, so that a server gone for good (each request a timeout) does not
/// keep the orphans of the others from being stopped. One whose server refuses its stop for
/// good (a 401, a 500) is left alone for longer after each refusal (2 s, doubled, an hour at
/// most), not asked every pass. Returns how many are left.
///
/// # Errors
/// A store failure reading or forgetting them.
pub(crate) async fn pass(shared: &Shared) -> Result<usize, Error> {
    let Some(transport) = shared.remote.clone() else {
        return Ok(0);
    };
    let mut away: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut left = 0;
    let mut from = Vec::new();
    loop {
        let (orphans, next) = schema::remote_orphans(shared.store.as_ref(), &from, PAGE).await?;
        let mut written = Batch::new(CommitKind::Other);
        let now = shared.clock.now_ms();
        for orphan in orphans {
            // Its own stop may still be under way: not raced (a second stop of the same
            // child, a second cancel at an A2A agent).
            let held = orphan.held_until_ms.is_some_and(|until| until > now);
            if held || away.contains(&orphan.endpoint) {
                left += 1;
                continue;
            }
            let outcome = transport
                .stop(&orphan.endpoint, &orphan.child, orphan.abort)
                .await;
            match outcome.or_else(|error| match error {
                // Never started there, or gone: nothing to stop.
                error if error.is_not_found() => Ok(()),
                error => Err::<(), RemoteError>(error),
            }) {
                Ok(()) => {
                    tracing::info!(child = %orphan.child, endpoint = %orphan.endpoint, "remote_subagent.orphan_stopped");
                    schema::delete_orphan(&mut written, &orphan.child);
                }
                Err(error) if error.is_retryable() => {
                    tracing::debug!(child = %orphan.child, endpoint = %orphan.endpoint, error = %crate::types::Untrusted(&error), "remote_subagent.orphan_unreachable");
                    away.insert(orphan.endpoint.clone());
                    left += 1;
                }
                Err(error) => {
                    let refusals = orphan.refusals.saturating_add(1);
                    let wait_ms = RemoteOrphan::wait_after_refusals(refusals);
                    tracing::warn!(child = %orphan.child, endpoint = %orphan.endpoint, refusals, wait_ms, error = %crate::types::Untrusted(&error), "remote_subagent.orphan_stop_refused");
                    // Only over the record this pass read: one forgotten meanwhile (its parent
                    // woke the child and wants it going) or recorded again (an abort now) is
                    // not put back as it was.
                    let now_recorded = schema::orphan(shared.store.as_ref(), &orphan.child).await;
                    if matches!(now_recorded, Ok(Some(ref recorded)) if *recorded == orphan) {
                        let again = RemoteOrphan {
                            refusals,
                            held_until_ms: Some(now.saturating_add(wait_ms)),
                            ..orphan
                        };
                        schema::put_orphan(&mut written, &again)?;
                    }
                    left += 1;
                }
            }
        }
        if !written.is_empty() {
            shared.store.commit(written).await?;
        }
        match next {
            Some(next) => from = next,
            None => return Ok(left),
        }
    }
}

/// Makes a pass at start, whenever an orphan is recorded, and every `wait` while any is left.
pub(crate) async fn run(shared: Arc<Shared>) {
    let wait = shared
        .remote_policy
        .max_retry_wait
        .max(Duration::from_secs(1));
    loop {
        let left = match pass(&shared).await {
            Ok(left) => left,
            Err(error) => {
                tracing::warn!(%error, "remote_subagent.orphan_pass_failed");
                1
            }
        };
        if left == 0 {
            shared.orphans_recorded.notified().await;
        } else {
            tokio::select! {
                () = shared.orphans_recorded.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
        if shared.store.is_closed() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parking_lot::Mutex;

    use crate::remote::{
        RemoteAgents, RemoteChunks, RemoteError, RemoteOrphan, RemoteParent, RemoteStart,
        RemoteStatus,
    };
    use crate::session::submit::{Submit, SubmitOutcome};
    use crate::store::{schema, Batch, CommitKind, Store};
    use crate::types::ids::SessionId;
    use crate::MemoryStore;

    /// A transport whose only call is a stop: `dead` never answers one, `refuses` refuses it
    /// for good, any other endpoint stops what it is asked to. With `meanwhile`, the store on
    /// which each stop forgets its child first (its parent woke it while the stop was out).
    #[derive(Debug, Default)]
    struct Stops {
        asked: Mutex<Vec<String>>,
        meanwhile: Mutex<Option<Arc<dyn Store>>>,
    }

    #[async_trait::async_trait]
    impl RemoteAgents for Stops {
        async fn start(
            &self,
            _: &str,
            _: &str,
            _: &SessionId,
            _: &str,
            _: &RemoteParent,
        ) -> Result<RemoteStart, RemoteError> {
            Err(RemoteError::NoTransport)
        }

        async fn status(
            &self,
            _: &str,
            _: &SessionId,
            _: u64,
        ) -> Result<RemoteStatus, RemoteError> {
            Err(RemoteError::NoTransport)
        }

        async fn chunks(
            &self,
            _: &str,
            _: &SessionId,
            _: u64,
        ) -> Result<RemoteChunks, RemoteError> {
            Err(RemoteError::NoTransport)
        }

        async fn resume(&self, _: &str, _: &SessionId) -> Result<(), RemoteError> {
            Err(RemoteError::NoTransport)
        }

        async fn submit(&self, _: &str, _: &Submit) -> Result<SubmitOutcome, RemoteError> {
            Err(RemoteError::NoTransport)
        }

        async fn stop(
            &self,
            endpoint: &str,
            child: &SessionId,
            _: bool,
        ) -> Result<(), RemoteError> {
            self.asked.lock().push(endpoint.to_string());
            let meanwhile = self.meanwhile.lock().clone();
            if let Some(store) = meanwhile {
                let mut batch = Batch::new(CommitKind::Other);
                schema::delete_orphan(&mut batch, child);
                let forgotten = store.commit(batch).await;
                assert!(forgotten.is_ok(), "{forgotten:?}");
            }
            if endpoint == "refuses" {
                return Err(RemoteError::Refused {
                    endpoint: endpoint.into(),
                    status: 401,
                    code: "unauthenticated".into(),
                    message: "no such key".into(),
                });
            }
            if endpoint == "dead" {
                return Err(RemoteError::Unreachable {
                    endpoint: endpoint.into(),
                    reason: "it timed out".into(),
                });
            }
            Ok(())
        }
    }

    /// A server gone for good is asked once a pass, however many orphans it has, and the
    /// orphans of the others (past the first page of them) are stopped all the same.
    #[tokio::test]
    async fn a_dead_server_is_asked_once_a_pass_and_keeps_no_other_orphan_waiting(
    ) -> anyhow::Result<()> {
        let store = Arc::new(MemoryStore::new());
        let mut batch = Batch::new(CommitKind::Other);
        let orphan = |child: &str, endpoint: &str| -> anyhow::Result<RemoteOrphan> {
            Ok(RemoteOrphan {
                child: child.parse()?,
                endpoint: endpoint.into(),
                abort: true,
                since_ms: 0,
                held_until_ms: None,
                refusals: 0,
            })
        };
        for n in 0..300 {
            schema::put_orphan(&mut batch, &orphan(&format!("a-{n:03}"), "dead")?)?;
        }
        schema::put_orphan(&mut batch, &orphan("z-alive", "alive")?)?;
        store.commit(batch).await?;
        let stops = Arc::new(Stops::default());
        let runtime = crate::Runtime::builder()
            .store(Arc::clone(&store) as Arc<dyn Store>)
            .remote_agents(Arc::clone(&stops) as Arc<dyn RemoteAgents>)
            .background_deadlines(false)
            .build()?;

        let left = runtime.retry_remote_stops().await?;

        assert_eq!(
            left, 300,
            "the dead server's orphans are left for the next pass"
        );
        let asked = stops.asked.lock().clone();
        assert_eq!(
            asked,
            vec!["dead".to_string(), "alive".to_string()],
            "one stop a server that does not answer, and every other orphan tried"
        );
        runtime.shutdown().await?;
        Ok(())
    }

    /// A runtime on a store that records one orphan, `child` on `endpoint`, held until
    /// `held_until_ms`; with the transport that counts its stops, and a manual clock at 0.
    async fn one_orphan(
        child: &str,
        endpoint: &str,
        held_until_ms: Option<u64>,
    ) -> anyhow::Result<(
        crate::Runtime,
        Arc<Stops>,
        crate::ManualClock,
        Arc<dyn Store>,
    )> {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let mut batch = Batch::new(CommitKind::Other);
        schema::put_orphan(
            &mut batch,
            &RemoteOrphan {
                child: child.parse()?,
                endpoint: endpoint.into(),
                abort: true,
                since_ms: 0,
                held_until_ms,
                refusals: 0,
            },
        )?;
        store.commit(batch).await?;
        let stops = Arc::new(Stops::default());
        let clock = crate::ManualClock::new(0);
        let runtime = crate::Runtime::builder()
            .store(Arc::clone(&store))
            .remote_agents(Arc::clone(&stops) as Arc<dyn RemoteAgents>)
            .clock(Arc::new(clock.clone()))
            .background_deadlines(false)
            .build()?;
        Ok((runtime, stops, clock, store))
    }

    /// An orphan whose server refuses its stop for good is not asked every pass: after each
    /// refusal it waits twice as long (2 s, 4 s, …), and it is still tried, rarely, after an
    /// hour of refusals.
    #[tokio::test]
    async fn an_orphan_whose_stop_is_refused_for_good_is_tried_again_ever_more_rarely(
    ) -> anyhow::Result<()> {
        let (runtime, stops, clock, _) = one_orphan("refused", "refuses", None).await?;
        let asked = || stops.asked.lock().len();

        assert_eq!(runtime.retry_remote_stops().await?, 1);
        assert_eq!(asked(), 1, "tried once");
        assert_eq!(runtime.retry_remote_stops().await?, 1);
        assert_eq!(asked(), 1, "not again at once");
        clock.advance(1_999);
        runtime.retry_remote_stops().await?;
        assert_eq!(asked(), 1, "nor before 2 s");
        clock.advance(1);
        runtime.retry_remote_stops().await?;
        assert_eq!(asked(), 2, "then again");
        clock.advance(3_999);
        runtime.retry_remote_stops().await?;
        assert_eq!(asked(), 2, "the next wait is 4 s");
        clock.advance(1);
        runtime.retry_remote_stops().await?;
        assert_eq!(asked(), 3);
        // A day of refusals: tried about once an hour at the end, never given up.
        for _ in 0..24 * 60 {
            clock.advance(60_000);
            runtime.retry_remote_stops().await?;
        }
        let after_a_day = asked();
        assert!(
            (24..=40).contains(&after_a_day),
            "{after_a_day} tries in a day"
        );
        runtime.shutdown().await?;
        Ok(())
    }

    /// An orphan its parent wakes (forgetting it) while the pass's refused stop is out is not
    /// put back by the pass: it would stop the run the parent just resumed.
    #[tokio::test]
    async fn a_refused_orphan_forgotten_meanwhile_is_not_recorded_again() -> anyhow::Result<()> {
        let (runtime, stops, _clock, store) = one_orphan("woken", "refuses", None).await?;
        *stops.meanwhile.lock() = Some(Arc::clone(&store));
        runtime.retry_remote_stops().await?;
        assert_eq!(stops.asked.lock().len(), 1);
        assert!(
            !schema::orphan_recorded(store.as_ref(), &"woken".parse()?).await?,
            "the orphan its parent forgot is recorded again"
        );
        runtime.shutdown().await?;
        Ok(())
    }

    /// An orphan recorded while its own stop is under way is left to that stop until its
    /// hold ends; then a pass stops it (that stop was cut: a crash, a caller gone).
    #[tokio::test]
    async fn an_orphan_whose_own_stop_may_be_under_way_is_left_to_it_until_its_hold_ends(
    ) -> anyhow::Result<()> {
        let (runtime, stops, clock, _) = one_orphan("held", "alive", Some(1_000)).await?;

        assert_eq!(runtime.retry_remote_stops().await?, 1, "held: left");
        assert!(stops.asked.lock().is_empty(), "and not asked");
        clock.advance(1_000);
        assert_eq!(
            runtime.retry_remote_stops().await?,
            0,
            "stopped once its hold ended"
        );
        assert_eq!(stops.asked.lock().clone(), vec!["alive".to_string()]);
        runtime.shutdown().await?;
        Ok(())
    }
}
