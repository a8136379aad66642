//! Group commit for [`JournalStore`](super::JournalStore) on `store::group_thread`: the
//! writer thread appends the records of every commit queued so far in one write, makes them
//! durable with one `fdatasync`, moves the mark, and only then shows them to reads and answers
//! their committers. A group that fails is cut off the file again, so nothing it wrote is
//! ever read back.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::engine::Engine;
use super::files::{begin_journal, io_error};
use super::record::{self, Write};
use crate::store::group_thread::{GroupThread, Pending};
use crate::store::mark::Mark;
use crate::store::{Batch, Error, Op};

/// The writer thread and its queue; stops the thread when dropped.
pub(super) type WriterThread = GroupThread<Batch>;

/// Starts the writer thread of `engine`.
pub(super) fn start(engine: Arc<Engine>) -> Result<WriterThread, Error> {
    GroupThread::start("dormant-journal-writer", move |group| serve(&engine, group))
        .map_err(Error::backend)
}

/// The appending end of the journal.
pub(super) struct Writer {
    file: Arc<File>,
    id: u32,
    /// Where the next record goes: the end of the last whole record.
    len: u64,
    /// The file's length: zeros from `len` up to it.
    size: u64,
    /// The last commit written.
    seq: u64,
    mark: Mark,
    /// How large a journal file is made.
    file_bytes: u64,
    /// A failed group could not be cut off the file: nothing more is written.
    broken: Option<String>,
    bytes: Vec<u8>,
    placed: Vec<Write>,
}

impl Writer {
    pub(super) fn new(
        file: Arc<File>,
        id: u32,
        len: u64,
        seq: u64,
        mark: Mark,
        file_bytes: u64,
    ) -> std::io::Result<Self> {
        Ok(Self {
            size: file.metadata()?.len(),
            file_bytes,
            file,
            id,
            len,
            seq,
            mark,
            broken: None,
            bytes: Vec::new(),
            placed: Vec::new(),
        })
    }
}

/// Writes the group's commits, syncs once, and answers every committer. A commit with a key
/// or value too long for a record is refused alone; a group whose write or sync fails, fails
/// whole.
fn serve(engine: &Engine, group: Vec<Pending<Batch>>) {
    let refused: Vec<Option<Error>> = group
        .iter()
        .map(|pending| pending.batch.as_ref().and_then(refusal))
        .collect();
    let accepted = group
        .iter()
        .zip(&refused)
        .filter(|(_, refusal)| refusal.is_none())
        .filter_map(|(pending, _)| pending.batch.as_ref());
    let written = write(engine, accepted);
    match &written {
        Ok(()) => {
            engine.degraded.lock().take();
        }
        Err(error) => {
            tracing::error!(%error, "store group commit failed; every commit of the group failed");
            *engine.degraded.lock() = Some(error.to_string());
        }
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

fn write<'a>(engine: &Engine, batches: impl Iterator<Item = &'a Batch>) -> Result<(), Error> {
    let mut guard = engine.writer.lock();
    let writer = guard.as_mut().ok_or(Error::Closed)?;
    if let Some(why) = &writer.broken {
        return Err(Error::backend(format!(
            "the journal could not take back a failed write ({why}); open the store again"
        )));
    }
    writer.bytes.clear();
    writer.placed.clear();
    let mut seq = writer.seq;
    for batch in batches {
        seq += 1;
        record::encode(seq, batch, &mut writer.bytes, &mut writer.placed);
    }
    if writer.bytes.is_empty() {
        // Bare syncs: every group before was made durable before it was answered.
        return Ok(());
    }
    let path = engine.path();
    let group = writer.bytes.len() as u64;
    if writer.len > 0 && writer.len + group > writer.file_bytes {
        // The group does not fit in what is left of this file: the next one takes it (a group
        // larger than a whole file makes its file longer).
        begin_next_file(engine, writer).map_err(|e| io_error(e, path))?;
    }
    let durable = writer
        .file
        .write_all_at(&writer.bytes, writer.len)
        .and_then(|()| writer.file.sync_data())
        .and_then(|()| writer.mark.advance(seq));
    if let Err(error) = durable {
        // Take the group back, so that the next group's records follow the last acknowledged
        // one and no reader, now or after a restart, sees it: the file cut back to its length
        // (a write past it ran out of room part-way), zeros over the rest.
        let end = (writer.len + group).min(writer.size);
        let zeros = vec![0; end.saturating_sub(writer.len) as usize];
        let undone = writer
            .file
            .set_len(writer.size)
            .and_then(|()| writer.file.write_all_at(&zeros, writer.len));
        if let Err(undo) = undone {
            writer.broken = Some(undo.to_string());
        }
        return Err(io_error(error, path));
    }
    engine.syncs.fetch_add(1, Ordering::Relaxed);
    let placed = std::mem::take(&mut writer.placed);
    engine.index.write().apply(writer.id, writer.len, placed);
    writer.seq = seq;
    writer.len += group;
    writer.size = writer.size.max(writer.len);
    Ok(())
}

/// Begins the next journal file and writes there from now on.
fn begin_next_file(engine: &Engine, writer: &mut Writer) -> std::io::Result<()> {
    let id = writer.id + 1;
    let file = Arc::new(begin_journal(engine.path(), id, writer.file_bytes)?);
    let size = file.metadata()?.len();
    engine.index.write().add_file(id, Arc::clone(&file));
    writer.size = size;
    writer.file = file;
    writer.id = id;
    writer.len = 0;
    Ok(())
}

/// Why a record cannot hold `batch`, if it cannot: its keys and values carry 32-bit lengths.
fn refusal(batch: &Batch) -> Option<Error> {
    batch.ops().iter().find_map(|op| {
        let (Op::Put { tree, key, .. } | Op::Delete { tree, key }) = op;
        let value = match op {
            Op::Put { value, .. } => value.len(),
            Op::Delete { .. } => 0,
        };
        (!record::fits(key.len() + 1) || !record::fits(value)).then(|| {
            Error::backend(format!(
                "a write of tree {} is longer than the journal holds ({} bytes at most)",
                tree.name(),
                u32::MAX
            ))
        })
    })
}
