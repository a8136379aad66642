//! The `ownership` tree: which session of a root's tree (or which remote child's tree) owns a
//! call made under that root, so that a submit against the root reaches it.
//!
//! One entry per **(root, call, owner)**: two sessions of one tree may both wait on a call
//! with the same id (scripted models number their calls per conversation, so a child's
//! `tc-1` and its sibling's `tc-1` are different calls), and each writes its own entry without
//! reading anyone's: no write needs a read, and none overwrites another owner's. The router
//! reads every entry of (root, call) with one prefix scan and chooses among them
//! (`router.rs`).
//!
//! The key is `prefix(root) · 0xff · call length (u32 BE) · call · owner`: the call's length
//! makes `prefix(root) · 0xff · length · call` the prefix of exactly that call's entries, and
//! the `0xff` byte tells this layout from the one before it, `prefix(root) · call` with a
//! single owner per call, since a call id (UTF-8) never holds that byte. The owner is the
//! owning session's id, or for a remote child's tree the remote child's id (its root there).
//! The value is unchanged: the owner as [`Owner`] (a session id, or where a remote call lives).
//!
//! Entries of the earlier layout are still read (a call found nowhere else), and a runtime
//! moves them to this layout when it starts ([`migrate`]).

use super::{decode, prefix, split_call_key, Error};
use crate::remote::Owner;
use crate::store::{Batch, CommitKind, Store, Tree};
use crate::types::ids::SessionId;

/// The byte after the root's prefix in every key of this layout; never in a UTF-8 call id.
const MARK: u8 = 0xff;

/// The prefix of every entry of call `call` under `root`, whoever owns it.
pub(crate) fn call_prefix(root: &SessionId, call: &str) -> Vec<u8> {
    let mut key = prefix(root);
    key.push(MARK);
    // A call id longer than 4 GiB cannot reach here: a model reply of that size is refused.
    key.extend_from_slice(&u32::try_from(call.len()).unwrap_or(u32::MAX).to_be_bytes());
    key.extend_from_slice(call.as_bytes());
    key
}

/// The key of `owner`'s entry for call `call` under `root`.
pub(crate) fn key(root: &SessionId, call: &str, owner: &SessionId) -> Vec<u8> {
    let mut key = call_prefix(root, call);
    key.extend_from_slice(owner.as_str().as_bytes());
    key
}

/// The owner a stored entry names: a local session, or the remote child whose tree owns it.
fn owner_id(owner: &Owner) -> &SessionId {
    match owner {
        Owner::Local(session) => session,
        Owner::Remote(remote) => &remote.remote_root,
    }
}

/// Every owner of call `call` under `root`, in key order (by owner id).
pub(crate) async fn owners(
    store: &dyn Store,
    root: &SessionId,
    call: &str,
) -> Result<Vec<Owner>, Error> {
    store
        .scan_prefix(Tree::Ownership, &call_prefix(root, call))
        .await?
        .iter()
        .map(|(_, bytes)| decode(root, Tree::Ownership, bytes))
        .collect()
}

/// Every session of this process that owns a call under `root` (for a remote child's tree,
/// the local session whose call runs it), each once, in key order.
pub(crate) async fn sessions_under(
    store: &dyn Store,
    root: &SessionId,
) -> Result<Vec<SessionId>, Error> {
    let mut seen = std::collections::HashSet::new();
    let mut sessions = Vec::new();
    for (_, bytes) in store.scan_prefix(Tree::Ownership, &prefix(root)).await? {
        let session = match decode(root, Tree::Ownership, &bytes)? {
            Owner::Local(session) => session,
            Owner::Remote(remote) => remote.via,
        };
        if seen.insert(session.clone()) {
            sessions.push(session);
        }
    }
    Ok(sessions)
}

/// The owner an entry of the earlier layout names for call `call` under `root`, if one is
/// left (written before this layout, and not yet moved by [`migrate`]).
pub(crate) async fn legacy_owner(
    store: &dyn Store,
    root: &SessionId,
    call: &str,
) -> Result<Option<Owner>, Error> {
    store
        .get(Tree::Ownership, &super::call_key(root, call))
        .await?
        .map(|bytes| decode(root, Tree::Ownership, &bytes))
        .transpose()
}

/// Moves every entry of the earlier layout (root · call → owner) to this one, in one batch:
/// each is written under its (root, call, owner) key, with the same value, and deleted.
/// Returns how many moved. An entry that cannot be read is left where it is, and logged.
pub(crate) async fn migrate(store: &dyn Store) -> Result<usize, Error> {
    let mut batch = Batch::new(CommitKind::Other);
    let mut moved = 0;
    for (stored, value) in store.scan_prefix(Tree::Ownership, &[]).await? {
        // A key of this layout is no (root, UTF-8 call) pair: its call part starts with 0xff.
        let Some((root, call)) = split_call_key(&stored) else {
            continue;
        };
        let owner: Owner = match decode(&root, Tree::Ownership, &value) {
            Ok(owner) => owner,
            Err(error) => {
                tracing::warn!(%root, %error, "schema.ownership_unmigrated");
                continue;
            }
        };
        batch.put(Tree::Ownership, key(&root, &call, owner_id(&owner)), value);
        batch.delete(Tree::Ownership, stored);
        moved += 1;
    }
    if moved > 0 {
        store.commit(batch).await?;
    }
    Ok(moved)
}
