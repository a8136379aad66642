//! A batch in sled's own terms, made by the thread that commits it.
//!
//! Under group commit one flusher thread applies every commit of the process, and sled runs
//! one batch at a time (its batches take a process-wide write lock), so the flusher is the
//! serial part of a commit. Turning a batch's writes into sled keys and values (the tag byte
//! in front of each key, the copy of each value into sled's `IVec`) needs nothing but the
//! batch, so the committing thread does it before queueing, in parallel with the others; the
//! flusher is left with handing ready writes to sled.

use ::sled::IVec;

use super::keyspace::stored_key;
use crate::store::{Batch, Op};

/// One commit's writes, ready for a `sled::Batch`: a key, and its new value (`None` deletes).
pub(super) struct SledWrites(Vec<(IVec, Option<IVec>)>);

impl SledWrites {
    /// Converts `batch`, consuming it so that its values move rather than copy where sled
    /// lets them.
    pub(super) fn new(batch: Batch) -> Self {
        Self(
            batch
                .ops
                .into_iter()
                .map(|op| match op {
                    Op::Put { tree, key, value } => {
                        (IVec::from(stored_key(tree, &key)), Some(IVec::from(value)))
                    }
                    Op::Delete { tree, key } => (IVec::from(stored_key(tree, &key)), None),
                })
                .collect(),
        )
    }

    /// How many keys it writes.
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// Adds the writes to `batch`, after any already there (a key written twice ends with the
    /// later write). Cloning an `IVec` copies at most a short inline key; longer values are
    /// shared.
    pub(super) fn add_to(&self, batch: &mut ::sled::Batch) {
        for (key, value) in &self.0 {
            match value {
                Some(value) => batch.insert(key.clone(), value.clone()),
                None => batch.remove(key.clone()),
            }
        }
    }
}
