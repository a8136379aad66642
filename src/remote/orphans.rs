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

/// Orphans tried per pass.
const PASS_LIMIT: usize = 256;

/// Records `orphan` to be stopped, and wakes the background task.
pub(crate) async fn record(shared: &Shared, orphan: RemoteOrphan) -> Result<(), Error> {
    tracing::warn!(child = %orphan.child, endpoint = %orphan.endpoint, abort = orphan.abort, "remote_subagent.orphaned");
    let mut batch = Batch::new(CommitKind::Other);
    schema::put_orphan(&mut batch, &orphan)?;
    shared.store.commit(batch).await?;
    shared.orphans_recorded.notify_one();
    Ok(())
}

/// Tries to stop every recorded orphan once (one request each: a server that is still away
/// costs one refused connection per orphan); forgets those stopped, or unknown to their
/// server. Returns how many are left.
///
/// # Errors
/// A store failure reading or forgetting them.
pub(crate) async fn pass(shared: &Shared) -> Result<usize, Error> {
    let Some(transport) = shared.remote.clone() else {
        return Ok(0);
    };
    let orphans = schema::remote_orphans(shared.store.as_ref(), PASS_LIMIT).await?;
    let mut left = 0;
    let mut stopped = Batch::new(CommitKind::Other);
    for orphan in orphans {
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
                schema::delete_orphan(&mut stopped, &orphan.child);
            }
            Err(error) => {
                tracing::debug!(child = %orphan.child, endpoint = %orphan.endpoint, error = %crate::types::Untrusted(&error), "remote_subagent.orphan_unreachable");
                left += 1;
            }
        }
    }
    if !stopped.is_empty() {
        shared.store.commit(stopped).await?;
    }
    Ok(left)
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
