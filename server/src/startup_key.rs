//! The binary's token key at start (a module of `main.rs`, not of the library): read from its
//! file, created only where no tokens can have been issued under another key, and, on a
//! shared PostgreSQL store, the same key every other node signs with.

use std::path::Path;

use dormant_server::TokenKey;

/// The name the key's fingerprint is recorded under in a shared store.
#[cfg(feature = "postgres")]
const FINGERPRINT: &str = "token_key_fingerprint";

/// The key in `path`. A missing file is created, unless the store existed before this start
/// (`store_existed`): its sessions' tokens were signed with the key that was in the file, and a
/// new one would make every one of them invalid, so that takes `--new-token-key`.
pub(crate) fn load(
    path: &Path,
    store: &str,
    store_existed: bool,
    new_key: bool,
) -> Result<TokenKey, String> {
    let file = path.display();
    match TokenKey::load(path) {
        Ok(Some(key)) => {
            if new_key {
                // Said, not ignored: an operator who meant to rotate the key must delete the
                // file (on PostgreSQL the flag still makes this key the one in force).
                tracing::warn!(file = %file, "server.token_key_kept: --new-token-key, but the key file exists: its key is kept (delete the file to make a new one)");
            }
            Ok(key)
        }
        Ok(None) if store_existed && !new_key => Err(format!(
            "token key {file} is missing, but the store {store} already exists: the tokens of its sessions were signed with the key that file held. Restore it (or point --token-key-file at it), or pass --new-token-key to start with a new key (every token issued so far is then refused)"
        )),
        Ok(None) => {
            let key =
                TokenKey::load_or_create(path).map_err(|error| format!("token key {file}: {error}"))?;
            if store_existed {
                tracing::warn!(file = %file, "server.token_key_replaced: --new-token-key: a new token key; every token issued before is refused");
            }
            Ok(key)
        }
        Err(error) => Err(format!("token key {file}: {error}")),
    }
}

/// Whether a shared store existed before this node: a key fingerprint is recorded in it, or
/// it holds a session.
#[cfg(feature = "postgres")]
pub(crate) async fn existed(store: &dormant::PgStore) -> Result<bool, String> {
    use dormant::store::{Store as _, Tree};
    let recorded = store
        .setting(FINGERPRINT)
        .await
        .map_err(|error| format!("PostgreSQL store: {error}"))?;
    if recorded.is_some() {
        return Ok(true);
    }
    // Session ids are UTF-8, which never holds the byte 0xff.
    let sessions = store
        .scan_range(Tree::Sessions, &[], &[0xff], 1)
        .await
        .map_err(|error| format!("PostgreSQL store: {error}"))?;
    Ok(!sessions.is_empty())
}

/// Makes sure every node on a shared store signs with the same key: the first records its
/// key's fingerprint (never the key), and a node whose key has another one is refused, naming
/// both key files and nodes, unless `--new-token-key` says this key replaces the recorded one.
#[cfg(feature = "postgres")]
pub(crate) async fn agree(
    store: &dormant::PgStore,
    key: &TokenKey,
    path: &Path,
    new_key: bool,
) -> Result<(), String> {
    let ours = key.fingerprint();
    let note = format!("node {}, key file {}", store.node(), path.display());
    let failed = |error: dormant::store::Error| format!("PostgreSQL store: {error}");
    let in_force = store
        .claim_setting(FINGERPRINT, &ours, &note)
        .await
        .map_err(failed)?;
    if in_force.value == ours {
        return Ok(());
    }
    if new_key {
        store
            .replace_setting(FINGERPRINT, &ours, &note)
            .await
            .map_err(failed)?;
        tracing::warn!(fingerprint = %ours, replaced = %in_force.value, "server.token_key_replaced: --new-token-key: this node's key replaces the one the nodes signed with; restart every other node with this key file");
        return Ok(());
    }
    Err(format!(
        "token key {} (fingerprint {ours}, {note}) is not the key the nodes sharing this database sign with (fingerprint {}, recorded by {}): with another key, a token works only on the node that issued it. Give every node the same key file (copy theirs here), or pass --new-token-key to make this key the one every node must use (tokens issued under the old one are then refused)",
        path.display(),
        in_force.value,
        in_force.note,
    ))
}
