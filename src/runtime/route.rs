//! Routing: every call that acts on a session is routed once, before anything is activated,
//! by its tree's lease: [`Route::Here`] when this process is alone on its store, holds the
//! tree's lease, or no other live node holds it; else [`Route::Owner`], where the call is sent
//! through the [`Peers`](crate::cluster::peer::Peers) transport. A call routed here whose activation
//! finds that another node took the tree meanwhile (the store's `LeaseHeld`, kept typed
//! through the host) is routed once more. See [`crate::cluster::peer`].

use crate::cluster::leases::LeaseOwner;
use crate::engine::shared::Shared;
use crate::error::Error;
use crate::store;
use crate::types::ids::SessionId;

/// Where a call is served.
#[derive(Clone, Debug)]
pub(crate) enum Route {
    /// On this node.
    Here,
    /// On the node that owns the session's tree.
    Owner(Owned),
}

/// The node a call is sent to, and how it was found.
#[derive(Clone, Debug)]
pub(crate) struct Owned {
    pub(crate) owner: LeaseOwner,
    /// The tree's lease.
    pub(crate) root: SessionId,
    /// Found among the owners looked up lately, not in the lease table now: the tree may have
    /// moved since, and a refusal there is worth a fresh look.
    pub(crate) remembered: bool,
}

/// Whether calls may be sent to other nodes: the store is shared and a transport is set.
pub(crate) fn may_route(shared: &Shared) -> bool {
    shared.leases.is_shared() && shared.peers.is_some()
}

/// Where calls for `session`'s tree are served now. Here without a round trip when calls are
/// never sent on or this node holds the tree's lease; else by the lease table: the live node
/// that holds it, or here if none does (the activation takes it). The tree's root is read
/// once per session and remembered, and so, for a second (the calls of one request), is an
/// owner looked up, unless `look_again`. A session not written yet is served here, unless
/// `look_again` (its start found another node holds its lease).
///
/// # Errors
/// A store failure while reading the session's lineage or the lease.
pub(crate) async fn route(
    shared: &Shared,
    session: &SessionId,
    look_again: bool,
) -> Result<Route, Error> {
    // A root whose lease this node holds (the usual call on its owner) needs no read.
    if !may_route(shared) || shared.leases.holds(session.as_str()) {
        return Ok(Route::Here);
    }
    let root = match shared
        .lineages
        .known_root(shared.store.as_ref(), session)
        .await?
    {
        Some(root) => root,
        // Not written yet: a new session, whose start takes its lease here. If another node
        // took it first (it starts the session at the same moment), the second look finds
        // that node.
        None if !look_again => return Ok(Route::Here),
        None => session.clone(),
    };
    if shared.leases.holds(root.as_str()) {
        return Ok(Route::Here);
    }
    if !look_again {
        if let Some(owner) = shared.owners.fresh(root.as_str(), shared.clock.now_ms()) {
            return Ok(Route::Owner(Owned {
                owner,
                root,
                remembered: true,
            }));
        }
    }
    Ok(match shared.leases.owner(root.as_str()).await? {
        Some(owner) => {
            shared
                .owners
                .remember(root.as_str(), &owner, shared.clock.now_ms());
            Route::Owner(Owned {
                owner,
                root,
                remembered: false,
            })
        }
        None => {
            shared.owners.forget(root.as_str());
            Route::Here
        }
    })
}

/// Whether a call served here failed because another node owns the tree: its activation was
/// refused the lease, or a commit found the lease lost (nothing of either was written).
pub(crate) fn owned_elsewhere(error: &Error) -> bool {
    matches!(
        error,
        Error::Store(store::Error::LeaseHeld { .. } | store::Error::LeaseLost { .. })
    )
}

/// Whether the owner a call was sent to refused it as not the tree's owner (any more), or did
/// not answer: nothing was done there.
pub(crate) fn refused_there(error: &Error) -> bool {
    matches!(
        error,
        Error::SessionUnavailable { .. } | Error::OwnerUnreachable { .. }
    )
}

/// What a call answers when its tree is owned by another node that it cannot be sent to: the
/// session is unavailable here (an activation refused the lease says by whom).
pub(crate) fn unavailable(session: &SessionId, error: Error) -> Error {
    match error {
        Error::Store(held @ store::Error::LeaseHeld { .. }) => Error::SessionUnavailable {
            session: session.clone(),
            reason: held.to_string(),
        },
        other => other,
    }
}
