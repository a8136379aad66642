//! Leases: which node owns a tree of sessions, on a store several nodes share.
//!
//! A [`Store`](crate::store::Store) only stores. Who may write a tree is a question for the nodes
//! that share the store, answered by a [`Leases`]: a process alone on its store
//! ([`SledStore`](crate::SledStore), [`MemoryStore`](crate::MemoryStore)) owns everything
//! ([`SingleNode`], the default); [`PgStore`](crate::PgStore) keeps a lease table beside its
//! data and fences every commit with it. The runtime takes a tree's lease before a session
//! of it loads, routes a call to the node that holds it ([`crate::cluster::peer`]), and gives it up
//! when the tree's last session stops here.

use std::fmt;

use dashmap::DashMap;
use serde::{Deserialize, Serialize};

use crate::store::Error;

/// A node's key for calls from its peers ([`crate::cluster::peer`]). Its `Debug` does not show it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PeerKey(String);

impl PeerKey {
    /// A fresh random key (244 random bits).
    pub fn random() -> Self {
        Self(format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        ))
    }

    /// A key as stored.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key, to send with a call.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this key, in time that does not depend on where they differ.
    pub fn matches(&self, presented: &str) -> bool {
        let (ours, theirs) = (self.0.as_bytes(), presented.as_bytes());
        ours.len() == theirs.len()
            && ours
                .iter()
                .zip(theirs)
                .fold(0u8, |differ, (a, b)| differ | (a ^ b))
                == 0
    }
}

impl fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PeerKey(..)")
    }
}

/// Another node that owns a tree of sessions ([`Leases::owner`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseOwner {
    /// Its name.
    pub node: String,
    /// Where it takes calls (`http://host:port`), if it advertised an address.
    pub address: Option<String>,
    /// The key its peers call it with ([`crate::cluster::peer`]), if it has one.
    pub key: Option<PeerKey>,
}

/// Who owns which tree of sessions among the nodes that share a store.
///
/// A lease is named by a tree's root: every session of the tree holds it, so a parent and its
/// sub-agents always live on one node and talk in process.
#[async_trait::async_trait]
pub trait Leases: Send + Sync + fmt::Debug + 'static {
    /// Whether other nodes share the store: only then can another node own a tree, and the
    /// runtime takes, looks up and gives back leases. `false` for a process alone on its
    /// store, whose other methods are then never called on a request's path.
    fn is_shared(&self) -> bool;

    /// Makes this process the owner of `session` before its actor loads it, through the lease
    /// named `lease` (its tree's root). Sessions that hold one lease share it; it is given up
    /// when the last of them is released. Calling it again with another `lease` moves the
    /// session to that lease (a new child joins its tree's).
    ///
    /// # Errors
    /// [`Error::LeaseHeld`] while another live node owns the lease, or a backend failure.
    async fn acquire(&self, session: &str, lease: &str) -> Result<(), Error>;

    /// Gives up the ownership [`Leases::acquire`] took for `session` (its actor stopped), at
    /// once; its lease goes with the last session that held it.
    fn release_session(&self, session: &str);

    /// Whether what this process loaded of `session` under its lease is still current: it
    /// still holds the lease at the epoch the session took it at. `false` after the lease was
    /// lost, or lost and taken again since (another node may have written meanwhile): the
    /// runtime then reads the session again as its owner before it acts on it. In memory, no
    /// round trip.
    fn holds_current(&self, session: &str) -> bool;

    /// Whether this process holds `lease` now, by its own reckoning (in memory, no round
    /// trip): a call for its tree is served here without asking anyone.
    fn holds(&self, lease: &str) -> bool;

    /// The live node other than this one that holds `lease`, with the address it advertised
    /// and its key for calls from peers. `None` when no other live node holds it.
    ///
    /// # Errors
    /// A backend failure.
    async fn owner(&self, lease: &str) -> Result<Option<LeaseOwner>, Error>;

    /// This node's key for calls from its peers, kept where the others read it with
    /// [`Leases::owner`]. `None`: nobody calls this node as a peer.
    fn peer_key(&self) -> Option<PeerKey>;
}

/// The leases of a process alone on its store: it owns every tree, and nothing is taken or
/// given back. The runtime's default.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleNode;

#[async_trait::async_trait]
impl Leases for SingleNode {
    fn is_shared(&self) -> bool {
        false
    }

    async fn acquire(&self, _session: &str, _lease: &str) -> Result<(), Error> {
        Ok(())
    }

    fn release_session(&self, _session: &str) {}

    fn holds_current(&self, _session: &str) -> bool {
        true
    }

    fn holds(&self, _lease: &str) -> bool {
        true
    }

    async fn owner(&self, _lease: &str) -> Result<Option<LeaseOwner>, Error> {
        Ok(None)
    }

    fn peer_key(&self) -> Option<PeerKey> {
        None
    }
}

/// How long a node sends a tree's calls to the owner it last looked up, without looking
/// again: long enough for the calls of one request (a submit and its resume, the stream that
/// follows), short enough that a tree that moved is found again soon. A call sent to an owner
/// that no longer holds the tree is refused there, and routed again after a fresh look.
const OWNER_FRESH_MS: u64 = 1_000;

/// How many owners are remembered at most before the memory starts over.
const OWNERS_KEPT: usize = 100_000;

/// The owners of other nodes' trees this node looked up lately, by lease, with when (the
/// runtime's clock, in ms: a test moves it by hand).
#[derive(Debug, Default)]
pub(crate) struct Owners {
    seen: DashMap<String, (LeaseOwner, u64)>,
}

impl Owners {
    /// The owner of `lease` looked up less than [`OWNER_FRESH_MS`] before `now_ms`.
    pub(crate) fn fresh(&self, lease: &str, now_ms: u64) -> Option<LeaseOwner> {
        let seen = self.seen.get(lease)?;
        let (owner, at) = seen.value();
        (now_ms.saturating_sub(*at) < OWNER_FRESH_MS).then(|| owner.clone())
    }

    /// Remembers that `owner` holds `lease` at `now_ms`.
    pub(crate) fn remember(&self, lease: &str, owner: &LeaseOwner, now_ms: u64) {
        if self.seen.len() >= OWNERS_KEPT {
            self.seen.clear();
        }
        self.seen.insert(lease.to_string(), (owner.clone(), now_ms));
    }

    /// Forgets the owner of `lease`: a call sent there was refused, or not answered.
    pub(crate) fn forget(&self, lease: &str) {
        self.seen.remove(lease);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_matches_itself_only() {
        let key = PeerKey::random();
        assert!(key.matches(key.as_str()));
        assert!(!key.matches(PeerKey::random().as_str()));
        assert!(!key.matches(""));
        assert_eq!(format!("{key:?}"), "PeerKey(..)");
    }
}
