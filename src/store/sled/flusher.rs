//! Group commit: the flusher thread (`store::group_thread`) applies every batch queued so far
//! as one group, does one flush for all of them, and wakes their committers.

use std::sync::Arc;

use super::database::Shared;
use super::error::io_error;
use super::writes::SledWrites;
use crate::store::group_thread::{GroupThread, Pending};
use crate::store::Error;

/// The flusher thread and its queue; stops the thread when dropped.
pub(super) type GroupFlusher = GroupThread<SledWrites>;

/// Starts the flusher thread of the database `shared`.
pub(super) fn start(shared: Arc<Shared>) -> Result<GroupFlusher, Error> {
    GroupThread::start("dormant-store-flusher", move |group| serve(&shared, group))
        .map_err(io_error)
}

/// Applies the group's batches, flushes once, and answers every committer.
fn serve(shared: &Arc<Shared>, group: Vec<Pending<SledWrites>>) {
    let mut batches = Vec::with_capacity(group.len());
    let mut waiters = Vec::with_capacity(group.len());
    for Pending { batch, done } in group {
        batches.extend(batch);
        waiters.push(done);
    }
    // The flush starts after every batch of the group is applied, so it covers them all.
    // A failed group has had its database replaced before its committers hear of it.
    let result = shared.commit(&batches);
    drop(batches);
    for waiter in waiters {
        let outcome = match &result {
            Ok(()) => Ok(()),
            Err(e) => Err(e.duplicate()),
        };
        // The committer may have given up (its future was dropped); nothing to do then.
        let _ = waiter.send(outcome);
    }
    if let Err(e) = &result {
        tracing::error!(error = %e, "store group commit failed; every commit of the group failed");
    }
}
