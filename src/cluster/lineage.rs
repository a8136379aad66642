//! The root of a session's tree, remembered: on a store several nodes share, every call is
//! routed by its tree's root (whose lease says who serves it), and a session's actor takes
//! that lease before it loads. A session's place in its tree is written with its first commit
//! and never changes, so once read it is kept, and a node routes a session's calls after the
//! first without reading it again.

use dashmap::DashMap;

use crate::store::schema;
use crate::store::Store;
use crate::types::ids::SessionId;

/// How many roots are kept before the cache starts over: enough for the trees a node serves
/// at once, bounded so that a node that sees millions of sessions does not keep them all.
const MAX_KEPT: usize = 100_000;

/// Roots of sessions read from the store.
#[derive(Debug, Default)]
pub(crate) struct Roots {
    read: DashMap<SessionId, SessionId>,
}

impl Roots {
    /// The root of `session`'s tree: remembered, or read from its stored lineage. A session
    /// not written yet is a new root (or a child its start moves to its root's lease).
    pub(crate) async fn of(
        &self,
        store: &dyn Store,
        session: &SessionId,
    ) -> Result<SessionId, schema::Error> {
        Ok(self
            .known(store, session)
            .await?
            .unwrap_or_else(|| session.clone()))
    }

    /// The root of `session`'s tree if the session is written: remembered, or read from its
    /// stored lineage. One not written yet is not remembered: it may be written as another
    /// tree's child still.
    pub(crate) async fn known(
        &self,
        store: &dyn Store,
        session: &SessionId,
    ) -> Result<Option<SessionId>, schema::Error> {
        if let Some(root) = self.read.get(session) {
            return Ok(Some(root.value().clone()));
        }
        let Some(lineage) = schema::load_lineage(store, session).await? else {
            return Ok(None);
        };
        if self.read.len() >= MAX_KEPT {
            // Starting over costs one read per tree served; an order to evict by would cost
            // every lookup.
            self.read.clear();
        }
        self.read.insert(session.clone(), lineage.root.clone());
        Ok(Some(lineage.root))
    }
}
