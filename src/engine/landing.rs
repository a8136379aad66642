//! The accepted answers' commits on their way to the store, which a session's loading waits
//! for (`actor/submit.rs` commits an answer beside the session's mailbox).

use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::{OwnedRwLockReadGuard, RwLock};

use crate::types::ids::SessionId;

/// The accepted answers' commits still on their way to the store, for each session: each
/// holds a read side while it commits, and an activation takes the write side before it
/// loads the session. A session reloaded after a panic in its actor (its state, with its
/// commits in flight, dropped) would otherwise read the store before an answer already being
/// committed lands, forget it, and take a second answer for the call, or time it out.
#[derive(Debug, Default)]
pub(crate) struct Landing {
    sessions: DashMap<SessionId, Arc<RwLock<()>>>,
}

impl Landing {
    /// Holds `session` against loading until the guard goes (see [`Landing::let_go`]).
    pub(crate) fn hold(&self, session: &SessionId) -> Option<OwnedRwLockReadGuard<()>> {
        let lock = Arc::clone(&self.sessions.entry(session.clone()).or_default());
        // Only an activation takes the write side, and none runs while the actor commits.
        lock.try_read_owned().ok()
    }

    /// A commit landed (or failed): its hold goes, and the session's entry with the last.
    pub(crate) fn let_go(&self, session: &SessionId, hold: Option<OwnedRwLockReadGuard<()>>) {
        drop(hold);
        self.sessions
            .remove_if(session, |_, lock| Arc::strong_count(lock) == 1);
    }

    /// Waits until no answer's commit of `session` is on its way.
    pub(crate) async fn settled(&self, session: &SessionId) {
        let lock = self.sessions.get(session).map(|lock| Arc::clone(&lock));
        if let Some(lock) = lock {
            drop(lock.write().await);
        }
    }
}
