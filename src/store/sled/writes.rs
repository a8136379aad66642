//! A batch in sled's own terms, made by the thread that commits it.
//!
//! Under group commit one flusher thread applies every commit of the process, and sled runs
//! one batch at a time (its batches take a process-wide write lock), so the flusher is the
//! serial part of a commit. Turning a batch's writes into sled keys and values (the tag byte
//! in front of each key, the header and pieces of each value: see [`values`](super::values))
//! needs nothing but the batch, so the committing thread does it before queueing, in parallel
//! with the others; the flusher is left with handing ready writes to sled, and with removing
//! the pieces a value no longer needs, which only it knows of. The checksum of each new entry
//! (see [`check`](super::check)) is computed here too.

use ::sled::IVec;

use super::check::entry_hash;
use super::values::{encode, piece_key};
use crate::store::keyspace::stored_key;
use crate::store::{Batch, Op};

/// One key's new value (`None` deletes it), with the pieces of a large one; each stored entry
/// with its checksum.
struct Write {
    key: IVec,
    head: Option<(IVec, u64)>,
    pieces: Vec<(IVec, IVec, u64)>,
}

/// One commit's writes, ready for a `sled::Batch`.
pub(super) struct SledWrites(Vec<Write>);

impl SledWrites {
    /// Converts `batch`.
    pub(super) fn new(batch: Batch) -> Self {
        Self(
            batch
                .ops
                .into_iter()
                .map(|op| match op {
                    Op::Put { tree, key, value } => {
                        let key = stored_key(tree, &key);
                        let encoded = encode(&key, &value);
                        let head_hash = entry_hash(&key, &encoded.head);
                        Write {
                            key: key.into(),
                            head: Some((encoded.head, head_hash)),
                            pieces: encoded
                                .pieces
                                .into_iter()
                                .map(|(key, piece)| {
                                    let hash = entry_hash(&key, &piece);
                                    (key, piece, hash)
                                })
                                .collect(),
                        }
                    }
                    Op::Delete { tree, key } => Write {
                        key: stored_key(tree, &key).into(),
                        head: None,
                        pieces: Vec::new(),
                    },
                })
                .collect(),
        )
    }

    /// How many keys it writes (pieces included).
    pub(super) fn len(&self) -> usize {
        self.0.iter().map(|write| 1 + write.pieces.len()).sum()
    }

    /// Adds the writes to `batch`, after any already there (a key written twice ends with the
    /// later write), with the removal of the pieces each overwritten or deleted value had and
    /// its new value does not (`pieced` knows, by stored key, how many pieces each value kept
    /// in pieces has, and is brought up to date). Every stored key written is added to
    /// `touched`, in order, with the checksum of its new entry (`None`: removed). Cloning an
    /// `IVec` copies at most a short inline key; longer values are shared.
    pub(super) fn add_to(
        &self,
        batch: &mut ::sled::Batch,
        pieced: &mut std::collections::HashMap<IVec, u32>,
        touched: &mut Vec<(IVec, Option<u64>)>,
    ) {
        for write in &self.0 {
            let now = u32::try_from(write.pieces.len()).unwrap_or(u32::MAX);
            let before = pieced.get(&write.key).copied().unwrap_or(0);
            for stale in now..before {
                let key = piece_key(&write.key, stale);
                batch.remove(key.clone());
                touched.push((key, None));
            }
            for (key, piece, hash) in &write.pieces {
                batch.insert(key.clone(), piece.clone());
                touched.push((key.clone(), Some(*hash)));
            }
            match &write.head {
                Some((head, hash)) => {
                    batch.insert(write.key.clone(), head.clone());
                    touched.push((write.key.clone(), Some(*hash)));
                }
                None => {
                    batch.remove(write.key.clone());
                    touched.push((write.key.clone(), None));
                }
            }
            if now > 0 {
                pieced.insert(write.key.clone(), now);
            } else if before > 0 {
                pieced.remove(&write.key);
            }
        }
    }
}
