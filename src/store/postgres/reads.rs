//! Grouped reads: every get and bounded scan of the store waits in one queue, and the reads
//! that queued while earlier statements ran go to the database together, as one statement
//! (one transaction, one round trip) however many sessions they are for. Under load a
//! session's activation, its conversation, a follower's stored chunks and a submit's lookups
//! of many sessions share a statement, where each was a transaction of its own (issue 30:
//! ~13 a cycle). Alone, a read goes at once; one that comes while a statement is in flight
//! waits for it and goes with the others that came meanwhile.
//!
//! A read sees every commit that was acknowledged before it was queued: its statement starts
//! after it was queued, and under PostgreSQL's read committed each statement reads what was
//! committed when it started.

use std::sync::Arc;

use deadpool_postgres::Pool;

use super::batch::Batcher;
use super::{db, Counts};
use crate::store::{Entry, Error};

/// How many grouped statements may be in flight at once. One groups the most (measured with
/// the simulator on PostgreSQL 15: 9 transactions a session instead of 11 with two in flight,
/// and no slower): a group is a single index scan per read, short beside its round trip.
const IN_FLIGHT: usize = 1;

/// The most reads one statement carries.
const MAX_READS: usize = 1024;

/// Every read of a group, as one statement: the reads are rows of parallel arrays, and each
/// is answered by one of two index scans (forward or backward), the other switched off by a
/// one-time filter. Each read's rows come tagged with its place in the group.
const GROUPED: &str = "SELECT r.q, kv.key, kv.value \
     FROM unnest($1::int2[], $2::bytea[], $3::bytea[], $4::int8[], $5::bool[]) \
          WITH ORDINALITY AS r(tree, lo, hi, lim, rev, q) \
     CROSS JOIN LATERAL ( \
         (SELECT key, value FROM dormant_kv \
          WHERE NOT r.rev AND tree = r.tree AND key >= r.lo AND key < r.hi \
          ORDER BY key LIMIT r.lim) \
         UNION ALL \
         (SELECT key, value FROM dormant_kv \
          WHERE r.rev AND tree = r.tree AND key >= r.lo AND key < r.hi \
          ORDER BY key DESC LIMIT r.lim) \
     ) AS kv";

/// One read: the keys of `tree` in `lo..hi`, at most `limit` of them, from the lowest (or from
/// the highest when `reverse`).
pub(super) struct Read {
    pub(super) tree: i16,
    pub(super) lo: Vec<u8>,
    pub(super) hi: Vec<u8>,
    pub(super) limit: i64,
    pub(super) reverse: bool,
}

impl Read {
    /// The read of one key: the keys from `key` up to, not including, the next key after it.
    pub(super) fn key(tree: i16, key: &[u8]) -> Self {
        let mut hi = Vec::with_capacity(key.len() + 1);
        hi.extend_from_slice(key);
        hi.push(0);
        Self {
            tree,
            lo: key.to_vec(),
            hi,
            limit: 1,
            reverse: false,
        }
    }
}

/// Where reads queue; the task that sends them ends when the store drops this.
#[derive(Debug)]
pub(super) struct Reads(Batcher<Read, Vec<Entry>>);

impl Reads {
    /// Starts the task that sends queued reads to the database over `pool`.
    pub(super) fn start(pool: Pool, counts: Arc<Counts>) -> Self {
        Self(Batcher::start(IN_FLIGHT, MAX_READS, move |reads| {
            let (pool, counts) = (pool.clone(), Arc::clone(&counts));
            async move {
                counts.transaction();
                Ok(read_group(&pool, &reads)
                    .await?
                    .into_iter()
                    .map(Ok)
                    .collect())
            }
        }))
    }

    /// Reads with the next group: its entries in key order (from the highest for a reverse
    /// read).
    pub(super) async fn read(&self, read: Read) -> Result<Vec<Entry>, Error> {
        self.0.call(read).await
    }
}

/// Runs `reads` as one statement: each read's entries, in the read's order.
async fn read_group(pool: &Pool, reads: &[Read]) -> Result<Vec<Vec<Entry>>, Error> {
    let client = pool.get().await.map_err(Error::backend)?;
    let statement = client.prepare_cached(GROUPED).await.map_err(db)?;
    let trees: Vec<i16> = reads.iter().map(|read| read.tree).collect();
    let lows: Vec<&[u8]> = reads.iter().map(|read| read.lo.as_slice()).collect();
    let highs: Vec<&[u8]> = reads.iter().map(|read| read.hi.as_slice()).collect();
    let limits: Vec<i64> = reads.iter().map(|read| read.limit).collect();
    let reverse: Vec<bool> = reads.iter().map(|read| read.reverse).collect();
    let rows = client
        .query(&statement, &[&trees, &lows, &highs, &limits, &reverse])
        .await
        .map_err(db)?;
    let mut found: Vec<Vec<Entry>> = reads.iter().map(|_| Vec::new()).collect();
    for row in rows {
        let place: i64 = row.try_get(0).map_err(db)?;
        let slot = usize::try_from(place)
            .ok()
            .and_then(|place| place.checked_sub(1))
            .and_then(|index| found.get_mut(index))
            .ok_or_else(|| Error::backend(format!("grouped read answered for read {place}")))?;
        slot.push((row.try_get(1).map_err(db)?, row.try_get(2).map_err(db)?));
    }
    // SQL promises no order across a join: each read's rows are put in its own.
    for (entries, read) in found.iter_mut().zip(reads) {
        if read.reverse {
            entries.sort_unstable_by(|a, b| b.0.cmp(&a.0));
        } else {
            entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        }
    }
    Ok(found)
}
