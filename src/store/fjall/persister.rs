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
pub(super) const MAX_KEY: usize = u16::MAX as usize;

/// Whether fjall can hold `key` of a tree (behind its tag byte); it panics on a longer one.
pub(super) fn holds(key: &[u8]) -> bool {
    key.len() < MAX_KEY
}

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
    // A batch fjall cannot hold is refused alone, before anything is written or counted.
    let refused: Vec<Option<Error>> = group
        .iter()
        .map(|pending| pending.batch.as_ref().and_then(refusal))
        .collect();
    let bytes: usize = group
        .iter()
        .zip(&refused)
        .filter(|(_, refusal)| refusal.is_none())
        .filter_map(|(pending, _)| pending.batch.as_ref())
        .map(Batch::byte_len)
        .sum();
    // A group of bare syncs writes nothing (a shutdown's last flush on a full disk succeeds).
    let room = match bytes {
        0 => Ok(()),
        bytes => files::ensure_room(engine.path(), bytes as u64),
    };
    if let Err(full) = room {
        engine.refused(&full);
        for (Pending { done, .. }, refused) in group.into_iter().zip(refused) {
            let _ = done.send(Err(refused.unwrap_or_else(|| full.duplicate())));
        }
        return;
    }
    // fjall's sequence number once the group is applied (`None`: nothing was).
    let mut applied = None;
    let mut written = engine.write(|open| {
        engine.mark_caught_up(open)?;
        let accepted = group
            .iter()
            .zip(&refused)
            .filter(|(_, refusal)| refusal.is_none())
            .filter_map(|(pending, _)| pending.batch.as_ref());
        if apply(open, accepted)? {
            applied = Some(open.keyspace.instant());
        }
        open.keyspace
            .persist(fjall::PersistMode::SyncData)
            .map_err(|e| files::error(e, open.path()))?;
        engine.advance_mark(open)
    });
    if let (Err(error), Some(at)) = (&written, applied) {
        // fjall writes its journal as it lets a keyspace go: a group whose sync failed is
        // often there after all, and told failed it would still be served.
        if engine.landed_after_reopen(at) {
            tracing::warn!(%error, "store: a group whose write failed was found whole in the keyspace opened again; made durable there, it is acknowledged");
            written = Ok(());
        }
    }
    if let Err(error) = &written {
        tracing::error!(%error, "store group commit failed; every commit of the group failed");
    }
    for (Pending { done, .. }, refused) in group.into_iter().zip(refused) {
        let outcome = match (&written, refused) {
            (_, Some(refusal)) => Err(refusal),
            (Ok(()), None) => Ok(()),
            (Err(error), None) => Err(error.duplicate()),
        };
        // The committer may have given up (its future was dropped); nothing to do then.
        let _ = done.send(outcome);
    }
}

/// Applies the group's batches as one fjall batch: one journal write and one sequence
/// number for the group (each batch stays atomic, the group with it).
///
/// Returns whether there was anything to write.
fn apply<'a>(open: &Open, batches: impl Iterator<Item = &'a Batch>) -> Result<bool, Error> {
    let mut batches = batches.peekable();
    if batches.peek().is_none() {
        // Nothing to write: bare syncs, or only refused batches.
        return Ok(false);
    }
    let mut writes = open.keyspace.batch();
    writes.insert(&open.records, meta_key(LAST_BATCH), b"".as_slice());
    for op in batches.flat_map(Batch::ops) {
        match op {
            Op::Put { tree, key, value } => {
                writes.insert(&open.records, stored_key(*tree, key), value.as_slice());
            }
            Op::Delete { tree, key } => writes.remove(&open.records, stored_key(*tree, key)),
        }
    }
    writes.commit().map_err(|e| files::error(e, open.path()))?;
    Ok(true)
}

/// Why fjall cannot hold `batch`, if it cannot.
fn refusal(batch: &Batch) -> Option<Error> {
    batch.ops().iter().find_map(too_long)
}

/// Why fjall cannot hold `op`, if it cannot: its keys carry a 16-bit length, its values a
/// 32-bit one (and it panics past them).
fn too_long(op: &Op) -> Option<Error> {
    let (Op::Put { tree, key, .. } | Op::Delete { tree, key }) = op;
    if !holds(key) {
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

#[cfg(test)]
mod tests {
    use super::{Engine, Pending};
    use crate::store::fjall::FjallStore;
    use crate::store::{Batch, CommitKind, Error, Store, Tree};

    fn put(key: &[u8]) -> Batch {
        let mut batch = Batch::new(CommitKind::Other);
        batch.put(Tree::Log, key.to_vec(), b"v".to_vec());
        batch
    }

    /// Serves `batches` (`None`: a bare sync) as one group, as the thread does, and returns
    /// what each committer heard.
    fn serve_group(engine: &Engine, batches: Vec<Option<Batch>>) -> Vec<Result<(), Error>> {
        let (group, answers): (Vec<_>, Vec<_>) = batches
            .into_iter()
            .map(|batch| {
                let (done, answer) = tokio::sync::oneshot::channel();
                (Pending { batch, done }, answer)
            })
            .unzip();
        super::serve(engine, group);
        answers
            .into_iter()
            .map(|mut answer| answer.try_recv().unwrap_or(Err(Error::Closed)))
            .collect()
    }

    #[test]
    fn a_batch_fjall_cannot_hold_is_refused_alone_and_its_group_is_written() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let engine = Engine::open(dir.path(), false)?;
        let long = vec![b'k'; super::MAX_KEY];
        let heard = serve_group(&engine, vec![Some(put(&long)), Some(put(b"short")), None]);
        let refused = heard[0].as_ref().err().map(ToString::to_string);
        assert!(
            refused
                .as_deref()
                .is_some_and(|refused| refused.contains("longer than the store can hold")),
            "{refused:?}"
        );
        assert!(heard[1].is_ok() && heard[2].is_ok(), "{heard:?}");
        assert!(engine.has(b"short")?);
        // Nothing is damaged: the next group goes through.
        assert!(serve_group(&engine, vec![Some(put(b"next"))])[0].is_ok());
        Ok(())
    }

    #[test]
    fn commits_of_one_group_apply_in_order_and_are_recovered_so() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let mut deleted = Batch::new(CommitKind::Other);
        deleted.delete(Tree::Log, b"gone".to_vec());
        {
            let engine = Engine::open(dir.path(), false)?;
            // One group: a key put then deleted, another deleted then put, by later commits.
            let mut put_again = Batch::new(CommitKind::Other);
            put_again.put(Tree::Log, b"back".to_vec(), b"2".to_vec());
            let mut gone_first = Batch::new(CommitKind::Other);
            gone_first.delete(Tree::Log, b"back".to_vec());
            let heard = serve_group(
                &engine,
                vec![
                    Some(put(b"gone")),
                    Some(deleted),
                    Some(gone_first),
                    Some(put_again),
                ],
            );
            assert!(heard.iter().all(Result::is_ok), "{heard:?}");
            assert!(!engine.has(b"gone")? && engine.has(b"back")?);
            engine.close();
        }
        // Replayed from the journal, the group comes back the same.
        let engine = Engine::open(dir.path(), false)?;
        assert!(!engine.has(b"gone")? && engine.has(b"back")?);
        Ok(())
    }

    #[tokio::test]
    async fn reads_of_keys_fjall_cannot_hold_find_nothing_instead_of_panicking(
    ) -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let store = FjallStore::open(dir.path())?;
        let edge = vec![b'k'; super::MAX_KEY - 1];
        store.commit(put(&edge)).await?;
        store.commit(put(b"a")).await?;
        let long = vec![b'k'; super::MAX_KEY + 10];
        assert_eq!(store.get(Tree::Log, &long).await?, None);
        assert!(store.scan_prefix(Tree::Log, &long).await?.is_empty());
        assert!(store
            .scan_prefix_rev(Tree::Log, &long, 10)
            .await?
            .is_empty());
        // A cut upper bound still includes the longest key there is; a cut lower bound
        // excludes it.
        let found = store.scan_range(Tree::Log, b"a", &long, 10).await?;
        assert_eq!(found.len(), 2);
        let mut beyond = long.clone();
        beyond.push(b'z');
        assert!(store
            .scan_range(Tree::Log, &long, &beyond, 10)
            .await?
            .is_empty());
        assert_eq!(
            store
                .scan_range(Tree::Log, &edge[..1], &beyond, 10)
                .await?
                .len(),
            1
        );
        Ok(())
    }
}
