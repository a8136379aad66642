//! The one change of how values are kept that a store written before needs: every value behind
//! a header byte, large ones in pieces (see [`values`](super::values)). A store written by an
//! earlier version is brought to it when it is opened, a stretch of keys at a time; each
//! stretch is one sled batch with the key it reached, so a migration a crash cut goes on where
//! it stopped, and no value is ever rewritten twice.

use ::sled::IVec;

use super::values::{encode, PIECES_TAG};
use crate::store::keyspace::meta_key;
use crate::store::Error;

/// The values' layout, once every value has its header.
const LAYOUT: &[u8] = b"values-2";
/// Keys rewritten per sled batch.
const STRETCH: usize = 1024;

/// Brings `records` to the current layout of values, if it is not there yet; returns how
/// many values were rewritten.
pub(super) fn migrate(records: &::sled::Tree) -> Result<u64, Error> {
    let layout = meta_key(b"layout");
    if records.get(&layout)?.as_deref() == Some(LAYOUT) {
        return Ok(0);
    }
    let progress = meta_key(b"migrating");
    // Every logical tree's tag is below the pieces' and the bookkeeping's.
    let mut from: Vec<u8> = match records.get(&progress)? {
        Some(last) => successor(&last),
        None => vec![0],
    };
    let mut rewritten = 0;
    loop {
        let stretch: Vec<(IVec, IVec)> = records
            .range(from.clone()..vec![PIECES_TAG])
            .take(STRETCH)
            .collect::<Result<_, _>>()?;
        let mut batch = ::sled::Batch::default();
        let Some((last, _)) = stretch.last() else {
            batch.insert(layout, LAYOUT);
            batch.remove(progress);
            records.apply_batch(batch)?;
            records.flush()?;
            if rewritten > 0 {
                tracing::info!(rewritten, "store.values_migrated");
            }
            return Ok(rewritten);
        };
        from = successor(last);
        batch.insert(progress.clone(), last.clone());
        for (key, value) in &stretch {
            let encoded = encode(key, value);
            for (piece, bytes) in encoded.pieces {
                batch.insert(piece, bytes);
            }
            batch.insert(key.clone(), encoded.head);
            rewritten += 1;
        }
        records.apply_batch(batch)?;
    }
}

/// The smallest key after `key`.
fn successor(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}
