//! Group commit for [`FjallStore`](super::FjallStore) on `store::group_thread`: the persister
//! thread applies every batch queued so far, syncs fjall's journal once for all of them, and
//! answers their committers.

use std::sync::Arc;

use super::engine::{Engine, Open};
use super::files;
use crate::store::group_thread::{GroupThread, Pending};
use crate::store::keyspace::{meta_key, stored_key};
use crate::store::{Batch, Error, Op};

/// fjall's longest key (its keys carry a 16-bit length); the tag byte comes on top of the
/// caller's key.
const MAX_KEY: usize = u16::MAX as usize;

/// The persister thread and its queue; stops the thread when dropped.
pub(super) type Persister = GroupThread<Batch>;

/// Starts the persister thread of `engine`.
pub(super) fn start(engine: Arc<Engine>) -> Result<Persister, Error> {
    GroupThread::start("dormant-fjall-persister", move |group| {
        serve(&engine, group)
    })
    .map_err(Error::backend)
}

/// The key every batch also writes, so that the newest batch always leaves a live entry:
/// fjall counts the sequence numbers it recovered from the entries it holds, and a batch of
/// deletes alone could otherwise vanish from that count once compaction drops its tombstones,
/// and the store look short of its mark.
const LAST_BATCH: &[u8] = b"fjall-last-batch";

/// Applies the group's batches, syncs once, and answers every committer. A batch fjall cannot
/// hold (a key or value too long) is refused alone; a group the disk has no room for, or
/// whose write or sync fails, fails whole.
fn serve(engine: &Engine, group: Vec<Pending<Batch>>) {
    let bytes: usize = group
        .iter()
        .filter_map(|pending| pending.batch.as_ref())
        .map(Batch::byte_len)
        .sum();
    // A group of bare syncs writes nothing (a shutdown's last flush on a full disk succeeds).
    let room = match bytes {
        0 => Ok(()),
        bytes => files::ensure_room(engine.path(), bytes as u64),
    };
    if let Err(full) = room {
        engine.refused(&full);
        for Pending { done, .. } in group {
            let _ = done.send(Err(full.duplicate()));
        }
        return;
    }
    let mut refused: Vec<Option<Error>> = Vec::with_capacity(group.len());
    let written = engine.write(|open| {
        for pending in &group {
            let outcome = match &pending.batch {
                Some(batch) => apply(open, batch)?,
                None => None,
            };
            refused.push(outcome);
        }
        open.keyspace
            .persist(fjall::PersistMode::SyncData)
            .map_err(|e| files::error(e, open.path()))?;
        engine.advance_mark(open)
    });
    if let Err(error) = &written {
        tracing::error!(%error, "store group commit failed; every commit of the group failed");
    }
    let mut refused = refused.into_iter();
    for Pending { done, .. } in group {
        let outcome = match (&written, refused.next().flatten()) {
            (_, Some(refusal)) => Err(refusal),
            (Ok(()), None) => Ok(()),
            (Err(error), None) => Err(error.duplicate()),
        };
        // The committer may have given up (its future was dropped); nothing to do then.
        let _ = done.send(outcome);
    }
}

/// Applies one batch as one fjall batch: `Ok(Some(refusal))` for a batch fjall cannot hold,
/// which writes nothing; `Err` when fjall fails.
fn apply(open: &Open, batch: &Batch) -> Result<Option<Error>, Error> {
    if let Some(refusal) = batch.ops().iter().find_map(too_long) {
        return Ok(Some(refusal));
    }
    let mut writes = open.keyspace.batch();
    writes.insert(&open.records, meta_key(LAST_BATCH), b"".as_slice());
    for op in batch.ops() {
        match op {
            Op::Put { tree, key, value } => {
                writes.insert(&open.records, stored_key(*tree, key), value.as_slice());
            }
            Op::Delete { tree, key } => writes.remove(&open.records, stored_key(*tree, key)),
        }
    }
    writes.commit().map_err(|e| files::error(e, open.path()))?;
    Ok(None)
}

/// Why fjall cannot hold `op`, if it cannot: its keys carry a 16-bit length, its values a
/// 32-bit one (and it panics past them).
fn too_long(op: &Op) -> Option<Error> {
    let (Op::Put { tree, key, .. } | Op::Delete { tree, key }) = op;
    if key.len() + 1 > MAX_KEY {
        return Some(Error::backend(format!(
            "a key of {} bytes in tree {} is longer than the store can hold ({} bytes)",
            key.len(),
            tree.name(),
            MAX_KEY - 1
        )));
    }
    match op {
        Op::Put { tree, value, .. } if u32::try_from(value.len()).is_err() => {
            Some(Error::backend(format!(
                "a value of {} bytes in tree {} is longer than the store can hold ({} bytes)",
                value.len(),
                tree.name(),
                u32::MAX
            )))
        }
        _ => None,
    }
}
