//! Compaction: once the journal files hold more than twice the live entries (and a file's worth
//! more), the writer moves on to a new file and this thread writes the live entries of every
//! file before it into a base (`NNNNNNNN.base`), made durable and renamed into place before
//! those files are removed. Commits go on meanwhile, into the new file: an entry a commit
//! replaces or deletes during the compaction is the commit's, whether or not it was copied.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;

use super::engine::Engine;
use super::files::{base_path, open_owned, remove_replaced, sync_dir, unfinished_base_path};
use super::index::{self, FileId, Loc};
use super::record;
use super::window::Window;

/// Keys looked at per step, under the index's read lock.
const EXAMINED: usize = 4096;

/// A base's record holds entries up to about this many bytes (or one larger entry alone): a
/// record's length is a `u32`, and the compactor holds one record's values at a time.
const RECORD_BYTES: usize = 16 * 1024 * 1024;

/// Compacts every journal file before `first_kept` into a base standing at commit `seq`, then
/// tells the writer how many bytes of records the store's files now hold.
pub(super) fn run(engine: &Arc<Engine>, first_kept: u32, seq: u64) {
    // A panic ends this compaction as an error would: the writer must hear that it ended, or
    // it would wait for it, and never compact again, for as long as the store is open.
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| compact(engine, first_kept, seq)))
        .unwrap_or_else(|panic| {
            let said = crate::types::panic::panic_text(panic.as_ref());
            // What it was writing is not read: it goes, as an error's would.
            let _ = std::fs::remove_file(unfinished_base_path(engine.path(), first_kept));
            Err(io::Error::other(format!("the compaction panicked: {said}")))
        });
    if let Err(error) = &outcome {
        tracing::warn!(%error, dir = %engine.path().display(), "store: a compaction of the journal failed; it is tried again later");
    }
    let mut writer = engine.writer.lock();
    if let Some(writer) = writer.as_mut() {
        writer.compaction_ended(outcome.ok().flatten());
    }
}

/// `Ok(None)`: the store was closed meanwhile.
fn compact(engine: &Engine, first_kept: u32, seq: u64) -> io::Result<Option<u64>> {
    let dir = engine.path();
    #[cfg(test)]
    tests::panic_if_armed(dir);
    let unfinished = unfinished_base_path(dir, first_kept);
    let written = write_base(engine, &unfinished, first_kept, seq);
    let (file, bytes) = match written {
        Ok(Some(written)) => written,
        other => {
            let _ = std::fs::remove_file(&unfinished);
            return other.map(|written| written.map(|(_, bytes)| bytes));
        }
    };
    std::fs::rename(&unfinished, base_path(dir, first_kept))?;
    sync_dir(dir)?;
    // The base is durable and in place: reads may go to it now, and only now (a base that
    // failed half-way is removed, and its pages, whose write-back may have failed, are
    // never read).
    point_at_copies(engine, &file, first_kept)?;
    // What it replaced is no longer read, now or after a restart.
    engine
        .index
        .write()
        .forget_replaced(first_kept, FileId::Base(first_kept));
    remove_replaced(dir, first_kept)?;
    tracing::debug!(dir = %dir.display(), first_kept, bytes, "store: journal compacted into a base");
    Ok(Some(bytes))
}

/// Writes the base to `path` and makes it durable; returns it and its length.
fn write_base(
    engine: &Engine,
    path: &Path,
    first_kept: u32,
    seq: u64,
) -> io::Result<Option<(Arc<File>, u64)>> {
    let file = Arc::new(open_owned(path)?);
    file.set_len(0)?;
    let mut copies = Copies {
        file: &file,
        seq,
        at: 0,
        entries: Vec::new(),
        bytes: 0,
    };
    // The first record holds no entry: it says which commit the base stands at, so that the
    // commits after it follow on, and that the base ends with a mark of its end.
    let mut begins = Vec::new();
    record::encode_mark(seq, record::BASE_BEGINS, &mut begins);
    file.write_all_at(&begins, 0)?;
    copies.at = begins.len() as u64;
    let mut after: Option<Vec<u8>> = None;
    loop {
        let Ok((found, next)) =
            engine.read(|index| index.to_copy(after.as_deref(), first_kept, EXAMINED))
        else {
            return Ok(None);
        };
        for (key, (from, loc)) in found {
            let value = index::read(&from, loc)?;
            if copies.bytes > 0 && copies.bytes + key.len() + value.len() > RECORD_BYTES {
                copies.write()?;
            }
            copies.bytes += key.len() + value.len();
            copies.entries.push((key, value));
        }
        if !copies.entries.is_empty() {
            copies.write()?;
        }
        match next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    // Its end, so that a base cut short at a record's boundary is told at open.
    let mut end = Vec::new();
    record::encode_mark(seq, record::BASE_END, &mut end);
    file.write_all_at(&end, copies.at)?;
    #[cfg(test)]
    tests::fail_sync_if_armed(engine.path())?;
    file.sync_all()?;
    let len = copies.at + end.len() as u64;
    Ok(Some((file, len)))
}

/// Points the index at the copies in the base `file` (durable, in place), reading it back a
/// record at a time rather than keeping every copied key in memory meanwhile. An entry is
/// pointed at its copy if its value still lies in a file the base replaces: no commit
/// replaced or deleted it since it was copied, as those files take no more writes.
fn point_at_copies(engine: &Engine, file: &Arc<File>, first_kept: u32) -> io::Result<()> {
    let base = FileId::Base(first_kept);
    // Only now does the index hold the file: a base that failed is let go with its last
    // handle, and its room on the disk with it.
    engine.index.write().add_file(base, Arc::clone(file));
    let mut window = Window::new(file)?;
    let mut at = 0;
    let mut copies = Vec::new();
    while let Some(len) = record::stored_len(window.at(at, record::HEADER)?) {
        let whole = usize::try_from(len).map_err(io::Error::other)?;
        let Ok(Some(read)) = record::decode(window.at(at, whole)?) else {
            return Err(io::Error::other(
                "the base just written does not read back whole",
            ));
        };
        copies.extend(read.writes.into_iter().filter_map(|write| {
            let (offset, len) = write.value?;
            Some((
                write.key,
                Loc {
                    file: base,
                    at: at + offset,
                    len,
                },
            ))
        }));
        at += read.len as u64;
        if copies.len() >= EXAMINED {
            engine
                .index
                .write()
                .point_at_copies(std::mem::take(&mut copies), first_kept);
        }
    }
    engine.index.write().point_at_copies(copies, first_kept);
    Ok(())
}

/// The entries read for the base's next record.
struct Copies<'a> {
    file: &'a File,
    seq: u64,
    /// Where the next record goes.
    at: u64,
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    bytes: usize,
}

impl Copies<'_> {
    /// Writes the entries read so far as one record (the index is pointed at them once the
    /// whole base is durable: [`point_at_copies`]).
    fn write(&mut self) -> io::Result<()> {
        let mut out = Vec::new();
        record::encode_puts(self.seq, &self.entries, &mut out, &mut Vec::new());
        self.file.write_all_at(&out, self.at)?;
        self.at += out.len() as u64;
        self.entries.clear();
        self.bytes = 0;
        Ok(())
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::path::{Path, PathBuf};

    /// The directory whose next compaction panics (one store's, so that the other tests'
    /// compactions, on threads of their own, go on).
    static PANICS_IN: parking_lot::Mutex<Option<PathBuf>> = parking_lot::Mutex::new(None);

    pub(in super::super) fn panic_next_compaction_in(dir: &Path) {
        *PANICS_IN.lock() = Some(dir.to_path_buf());
    }

    /// Whether the panic armed for `dir` is still to come.
    pub(in super::super) fn armed_for(dir: &Path) -> bool {
        PANICS_IN.lock().as_deref() == Some(dir)
    }

    /// The directory whose next compaction fails to make its base durable.
    static SYNC_FAILS_IN: parking_lot::Mutex<Option<PathBuf>> = parking_lot::Mutex::new(None);

    pub(in super::super) fn fail_next_base_sync_in(dir: &Path) {
        *SYNC_FAILS_IN.lock() = Some(dir.to_path_buf());
    }

    /// Whether the failure armed for `dir` is still to come.
    pub(in super::super) fn sync_fails_in(dir: &Path) -> bool {
        SYNC_FAILS_IN.lock().as_deref() == Some(dir)
    }

    pub(super) fn fail_sync_if_armed(dir: &Path) -> std::io::Result<()> {
        let mut armed = SYNC_FAILS_IN.lock();
        if armed.as_deref() == Some(dir) {
            *armed = None;
            return Err(std::io::Error::other("a base whose sync fails, for a test"));
        }
        Ok(())
    }

    pub(super) fn panic_if_armed(dir: &Path) {
        let mut armed = PANICS_IN.lock();
        if armed.as_deref() == Some(dir) {
            *armed = None;
            drop(armed);
            panic!("a compaction that panics, for a test");
        }
    }
}
