//! Group commit for [`JournalStore`](super::JournalStore) on `store::group_thread`: the
//! writer thread appends the records of every commit queued so far in one write, makes them
//! durable with one `fdatasync`, moves the mark, and only then shows them to reads and answers
//! their committers. A group that fails is cut off the file again, so nothing it wrote is
//! ever read back.

use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::appending::{Appending, Writer};
use super::compactor;
use super::engine::Engine;
use super::files::{begin_journal, io_error};
use super::index::FileId;
use super::record::{self, Encoded, Write};
use super::spare::Spare;
use crate::store::group_thread::{GroupThread, Pending};
use crate::store::{Batch, Error};

/// The writer thread and its queue; stops the thread when dropped.
pub(super) type WriterThread = GroupThread<Encoded>;

/// Starts the writer thread of `engine`.
pub(super) fn start(engine: Arc<Engine>) -> Result<WriterThread, Error> {
    GroupThread::start("dormant-journal-writer", move |group| serve(&engine, group))
        .map_err(Error::backend)
}

/// Writes the group's commits, syncs once, and answers every committer; a group whose write
/// or sync fails, fails whole.
fn serve(engine: &Arc<Engine>, group: Vec<Pending<Encoded>>) {
    let mut group = group;
    let written = write(
        engine,
        group
            .iter_mut()
            .filter_map(|pending| pending.batch.as_mut()),
    );
    match &written {
        // Only a write that reached the disk says it is healthy again (not a bare sync).
        Ok(true) => {
            engine.degraded.lock().take();
        }
        Ok(false) | Err(Error::Closed) => {}
        Err(error) => {
            tracing::error!(%error, "store group commit failed; every commit of the group failed");
            *engine.degraded.lock() = Some(error.to_string());
        }
    }
    for Pending { done, .. } in group {
        let outcome = match &written {
            Ok(_) => Ok(()),
            Err(error) => Err(error.duplicate()),
        };
        // The committer may have given up (its future was dropped); nothing to do then.
        let _ = done.send(outcome);
    }
}

/// The most bytes the group's buffer keeps from one group to the next: a group larger than
/// this (a commit of hundreds of MiB, say) lets its buffer go once written, rather than
/// holding that much for as long as the store is open.
const GROUP_BUFFER_KEPT: usize = 8 * 1024 * 1024;

/// Writes the group; `Ok(false)`: it held no record (bare syncs).
fn write<'a>(
    engine: &Arc<Engine>,
    records: impl Iterator<Item = &'a mut Encoded>,
) -> Result<bool, Error> {
    let mut guard = engine.writer.lock();
    let writer = guard.as_mut().ok_or(Error::Closed)?;
    let written = write_group(engine, writer, records);
    if writer.bytes.capacity() > GROUP_BUFFER_KEPT {
        writer.bytes = Vec::new();
    }
    written
}

fn write_group<'a>(
    engine: &Arc<Engine>,
    writer: &mut Writer,
    records: impl Iterator<Item = &'a mut Encoded>,
) -> Result<bool, Error> {
    if let Some(why) = &writer.broken {
        return Err(Error::backend(format!(
            "the journal could not take back a failed write ({why}); open the store again"
        )));
    }
    writer.bytes.clear();
    // Each record's writes, and where the record starts in the group.
    let mut placed: Vec<(u64, Vec<Write>)> = Vec::new();
    let mut seq = writer.seq;
    for record in records {
        seq += 1;
        let start = writer.bytes.len();
        writer.bytes.extend_from_slice(&record.bytes);
        record::renumber(&mut writer.bytes[start..], seq);
        placed.push((start as u64, std::mem::take(&mut record.writes)));
    }
    if writer.bytes.is_empty() {
        // Bare syncs: every group before was made durable before it was answered.
        return Ok(false);
    }
    let path = engine.path();
    let group = writer.bytes.len() as u64;
    if writer.at.len > 0 && writer.at.len + group > writer.file_bytes {
        // The group does not fit in what is left of this file: the next one takes it (a group
        // larger than a whole file makes its file longer).
        begin_next_file(engine, writer).map_err(|e| io_error(e, path))?;
    }
    let Appending { file, len, id } = &writer.at;
    let durable = file
        .write_all_at(&writer.bytes, *len)
        .and_then(|()| file.sync_data())
        .and_then(|()| writer.mark.advance(seq));
    if let Err(error) = durable {
        // Take the group back, so that the next group's records follow the last acknowledged
        // one and no reader, now or after a restart, sees it: the file cut back to its length
        // (a write past it ran out of room part-way), zeros over the group, made durable (the
        // group may be on disk already, if only the mark failed). Zeros written over the
        // file's own blocks keep them (later syncs then write no allocation); where they
        // cannot be written (a copy-on-write filesystem, btrfs or ZFS, allocates for every
        // overwrite, so on a full disk it has no room for them), the file is cut at its last
        // acknowledged record and grown back to its length: a hole, which reads as zeros and
        // takes no room anywhere.
        let end = (len + group).min(writer.size);
        let zeros = vec![0; end.saturating_sub(*len) as usize];
        let zeroed = file
            .set_len(writer.size)
            .and_then(|()| file.write_all_at(&zeros, *len))
            .and_then(|()| file.sync_data());
        let undone = zeroed.or_else(|_| {
            file.set_len(*len)
                .and_then(|()| file.set_len(writer.size))
                .and_then(|()| file.sync_data())
        });
        if let Err(undo) = undone {
            writer.broken = Some(undo.to_string());
        }
        return Err(io_error(error, path));
    }
    engine.syncs.fetch_add(1, Ordering::Relaxed);
    let live = {
        let mut index = engine.index.write();
        for (start, writes) in placed {
            index.apply(FileId::Journal(*id), len + start, writes);
        }
        index.live_bytes()
    };
    writer.seq = seq;
    writer.at.len += group;
    writer.size = writer.size.max(writer.at.len);
    writer.record_bytes += group;
    if writer.compaction_due(live) {
        begin_compaction(engine, writer);
    }
    if writer.wants_spare() {
        writer.spare = Spare::begin(path, writer.at.id + 1, writer.file_bytes);
    }
    Ok(true)
}

/// Begins the next journal file, or puts the one begun ahead in place, and writes there from
/// now on.
fn begin_next_file(engine: &Engine, writer: &mut Writer) -> std::io::Result<()> {
    let id = writer.at.id + 1;
    // A spare for another file (none should be) is let go: its drop removes it.
    let spare = writer.spare.take().filter(|spare| spare.id() == id);
    let file = match spare.and_then(|spare| spare.into_journal(engine.path())) {
        Some(file) => file,
        None => begin_journal(engine.path(), id, writer.file_bytes)?,
    };
    let file = Arc::new(file);
    let size = file.metadata()?.len();
    engine
        .index
        .write()
        .add_file(FileId::Journal(id), Arc::clone(&file));
    writer.size = size;
    writer.at = Appending { file, id, len: 0 };
    Ok(())
}

/// Begins a compaction of every journal file so far: the writer moves on to a new file, and a
/// thread of its own writes the live entries of the files before it into a base.
fn begin_compaction(engine: &Arc<Engine>, writer: &mut Writer) {
    if engine.is_closed() {
        // Closing: `close` takes the writer (under whose lock a compaction begins) before it
        // joins the compaction under way, so none could begin after it; nor need one.
        return;
    }
    if let Err(error) = begin_next_file(engine, writer) {
        tracing::warn!(%error, "store: could not begin a journal file for a compaction");
        return;
    }
    writer.compacting = Some(writer.record_bytes);
    let (first_kept, seq) = (writer.at.id, writer.seq);
    let compacting = Arc::clone(engine);
    let started = std::thread::Builder::new()
        .name("dormant-journal-compactor".into())
        .spawn(move || compactor::run(&compacting, first_kept, seq));
    match started {
        Ok(thread) => {
            let finished = engine.compaction.lock().replace(thread);
            if let Some(finished) = finished {
                // Only one runs at a time: the one before has ended.
                let _ = finished.join();
            }
        }
        Err(error) => {
            tracing::warn!(%error, "store: could not start a compaction");
            writer.compacting = None;
        }
    }
}

/// Runs a compaction now, and waits for it (and for one already under way).
#[cfg(test)]
pub(super) fn compact_now(engine: &Arc<Engine>) {
    let join = || {
        let running = engine.compaction.lock().take();
        if let Some(running) = running {
            let _ = running.join();
        }
    };
    join();
    if let Some(writer) = engine.writer.lock().as_mut() {
        begin_compaction(engine, writer);
    }
    join();
}

/// Why a record cannot hold `batch`, if it cannot: its length is a `u32`.
pub(super) fn refusal(batch: &Batch) -> Option<Error> {
    let len = record::body_len(batch);
    (!record::fits(len)).then(|| {
        Error::backend(format!(
            "a commit of {len} bytes is longer than the journal holds in one record ({} bytes)",
            u32::MAX
        ))
    })
}
