//! Sessions' places in their trees, remembered: on a store several nodes share, every call is
//! routed by its tree's root (whose lease says who serves it), and a session's actor takes
//! that lease before it loads; every answer is checked against its root's lineage (a
//! sub-agent's id is refused) before it is routed to the call's owner. A session's lineage is
//! written with its first commit and never changes, so once read it is kept: a node routes a
//! session's calls and checks its answers after the first without reading it again.

use std::sync::Arc;

use dashmap::DashMap;

use crate::store::schema::{self, Lineage};
use crate::store::Store;
use crate::types::ids::SessionId;

/// How many lineages are kept before the cache starts over: enough for the trees a node
/// serves at once, bounded so that a node that sees millions of sessions does not keep them
/// all.
const MAX_KEPT: usize = 100_000;

/// Lineages of sessions read from the store.
#[derive(Debug, Default)]
pub(crate) struct Lineages {
    read: DashMap<SessionId, Arc<Lineage>>,
}

impl Lineages {
    /// The root of `session`'s tree: remembered, or read from its stored lineage. A session
    /// not written yet is a new root (or a child its start moves to its root's lease).
    pub(crate) async fn root(
        &self,
        store: &dyn Store,
        session: &SessionId,
    ) -> Result<SessionId, schema::Error> {
        Ok(self
            .known_root(store, session)
            .await?
            .unwrap_or_else(|| session.clone()))
    }

    /// The root of `session`'s tree if the session is written.
    pub(crate) async fn known_root(
        &self,
        store: &dyn Store,
        session: &SessionId,
    ) -> Result<Option<SessionId>, schema::Error> {
        Ok(self
            .of(store, session)
            .await?
            .map(|lineage| lineage.root.clone()))
    }

    /// `session`'s lineage if the session is written: remembered, or read from the store. One
    /// not written yet is not remembered: it may be written as another tree's child still.
    pub(crate) async fn of(
        &self,
        store: &dyn Store,
        session: &SessionId,
    ) -> Result<Option<Arc<Lineage>>, schema::Error> {
        if let Some(lineage) = self.read.get(session) {
            return Ok(Some(Arc::clone(lineage.value())));
        }
        let Some(lineage) = schema::load_lineage(store, session).await? else {
            return Ok(None);
        };
        let lineage = Arc::new(lineage);
        if self.read.len() >= MAX_KEPT {
            // Starting over costs one read per tree served; an order to evict by would cost
            // every lookup.
            self.read.clear();
        }
        self.read.insert(session.clone(), Arc::clone(&lineage));
        Ok(Some(lineage))
    }
}
