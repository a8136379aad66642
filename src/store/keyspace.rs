//! How the logical [`Tree`]s share one key space (one sled tree, one fjall partition).
//!
//! Every key is stored as its tree's tag byte followed by the key itself, so a logical tree is
//! one contiguous key range and its order is the order of its keys. Why one sled tree: a
//! commit that touches several logical trees is then one `sled::Batch` (atomic on its own)
//! instead of a multi-tree transaction, which reads every key's old value back and stages
//! every write in a hash map before applying it. See `SledStore`'s documentation.

use crate::store::Tree;

/// The sled tree that holds every record.
pub(crate) const RECORDS: &str = "records";

/// The tag byte of a logical tree. Fixed forever: it is part of every stored key.
pub(crate) fn tag(tree: Tree) -> u8 {
    match tree {
        Tree::Sessions => 1,
        Tree::Log => 2,
        Tree::Pending => 3,
        Tree::Deadlines => 4,
        Tree::Ownership => 5,
        Tree::Tombstones => 6,
        Tree::TombstoneExpiry => 7,
        Tree::Children => 8,
        Tree::Companions => 9,
        Tree::RemoteOrphans => 10,
    }
}

/// The tag byte of the store's own bookkeeping keys (the values' layout, the record of what
/// the store holds): apart from every logical tree's tag and the pieces'.
pub(crate) const META_TAG: u8 = 0xF1;

/// The stored key of the bookkeeping entry `name`.
pub(crate) fn meta_key(name: &[u8]) -> Vec<u8> {
    let mut key = vec![META_TAG];
    key.extend_from_slice(name);
    key
}

/// The stored form of `key` in `tree`.
pub(crate) fn stored_key(tree: Tree, key: &[u8]) -> Vec<u8> {
    let mut stored = Vec::with_capacity(key.len() + 1);
    stored.push(tag(tree));
    stored.extend_from_slice(key);
    stored
}

/// The key a stored key stands for (its tag byte removed).
pub(crate) fn logical_key(stored: &[u8]) -> Vec<u8> {
    stored.get(1..).unwrap_or_default().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tree_has_its_own_tag() {
        let mut tags: Vec<u8> = Tree::ALL.iter().map(|tree| tag(*tree)).collect();
        tags.sort_unstable();
        tags.dedup();
        assert_eq!(tags.len(), Tree::ALL.len());
    }

    #[test]
    fn a_stored_key_round_trips_and_keeps_its_tree_apart() {
        let stored = stored_key(Tree::Pending, b"root\0call");
        assert_eq!(logical_key(&stored), b"root\0call");
        // The same key in two trees never collides, and an empty key stays distinct.
        assert_ne!(stored, stored_key(Tree::Deadlines, b"root\0call"));
        assert_eq!(logical_key(&stored_key(Tree::Log, b"")), b"");
        // Every key of a tree sorts before every key of the next tag.
        assert!(stored_key(Tree::Sessions, &[0xff; 40]) < stored_key(Tree::Log, b""));
    }
}
