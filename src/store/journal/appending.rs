//! The appending end of a [`JournalStore`](super::JournalStore)'s journal: the file records go
//! to, the last commit, the mark, and what decides when a compaction is due. The writer thread
//! (`writer.rs`) holds it under the engine's lock while it writes a group; a compaction
//! (`compactor.rs`) tells it when it ended.

use std::fs::File;
use std::sync::Arc;

use super::spare::Spare;
use crate::store::mark::Mark;

/// The journal file records are appended to.
pub(super) struct Appending {
    pub(super) file: Arc<File>,
    pub(super) id: u32,
    /// Where the next record goes: the end of the last whole record.
    pub(super) len: u64,
}

/// The appending end of the journal.
pub(super) struct Writer {
    pub(super) at: Appending,
    /// The file's length: zeros from `at.len` up to it.
    pub(super) size: u64,
    /// The last commit written.
    pub(super) seq: u64,
    pub(super) mark: Mark,
    /// How large a journal file is made.
    pub(super) file_bytes: u64,
    /// The bytes of the records the store's files hold: what a compaction would shrink.
    pub(super) record_bytes: u64,
    /// The compaction under way: the bytes of records it replaces (those written before it
    /// began).
    pub(super) compacting: Option<u64>,
    /// No compaction begins before the files hold this many bytes of records (after one
    /// failed, a file's worth more).
    compaction_after: u64,
    /// A failed group could not be cut off the file: nothing more is written.
    pub(super) broken: Option<String>,
    /// The group's records, reused from group to group.
    pub(super) bytes: Vec<u8>,
    /// The next journal file, being begun ahead of its turn (`spare.rs`).
    pub(super) spare: Option<Spare>,
    /// The journal file a spare was last asked for: asked once a file.
    spare_asked: u32,
}

impl Writer {
    pub(super) fn new(
        at: Appending,
        seq: u64,
        mark: Mark,
        file_bytes: u64,
        record_bytes: u64,
    ) -> std::io::Result<Self> {
        Ok(Self {
            size: at.file.metadata()?.len(),
            at,
            seq,
            mark,
            file_bytes,
            record_bytes,
            compacting: None,
            compaction_after: 0,
            broken: None,
            bytes: Vec::new(),
            spare: None,
            spare_asked: 0,
        })
    }

    /// Whether the next journal file should be begun ahead now: the file being written is
    /// half full, and it was not asked for yet.
    pub(super) fn wants_spare(&mut self) -> bool {
        let next = self.at.id + 1;
        let due =
            self.spare.is_none() && self.spare_asked != next && self.at.len > self.file_bytes / 2;
        if due {
            self.spare_asked = next;
        }
        due
    }

    /// Whether the files hold so much more than the live entries that a compaction is due:
    /// more than twice as much, and a whole file's worth more.
    pub(super) fn compaction_due(&self, live: u64) -> bool {
        self.compacting.is_none()
            && self.record_bytes >= self.compaction_after
            && self.record_bytes > live.saturating_mul(2).saturating_add(self.file_bytes)
    }

    /// The compaction ended: its base holds `base` bytes of records, or it did not finish.
    pub(super) fn compaction_ended(&mut self, base: Option<u64>) {
        let replaced = self.compacting.take().unwrap_or(0);
        match base {
            Some(base) => self.record_bytes = self.record_bytes - replaced + base,
            None => self.compaction_after = self.record_bytes + self.file_bytes,
        }
    }
}
