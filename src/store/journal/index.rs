//! What the journal holds, in memory: every live key, in order, with where its value lies in
//! the store's files. Values are read from the files when asked for (the kernel's page cache
//! keeps the recent ones), so memory grows with the keys, not with what they hold.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::ops::Bound;
use std::sync::Arc;

use super::record::Write;

/// A file values are read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum FileId {
    /// Journal file `n`.
    Journal(u32),
    /// The base a compaction wrote: every live entry of the journal files before `n`.
    Base(u32),
}

impl FileId {
    /// Whether a compaction that keeps the journal files from `first_kept` on replaces it.
    pub(super) fn is_before(self, first_kept: u32) -> bool {
        match self {
            FileId::Journal(id) => id < first_kept,
            FileId::Base(_) => true,
        }
    }
}

/// Where a value lies: in which file, from which byte, how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Loc {
    pub(super) file: FileId,
    pub(super) at: u64,
    pub(super) len: u32,
}

/// A value to read: its file and where in it.
pub(super) type Found = (Arc<File>, Loc);

/// Entries to read: each key and where its value lies.
pub(super) type Located = Vec<(Vec<u8>, Found)>;

#[derive(Default)]
pub(super) struct Index {
    keys: BTreeMap<Vec<u8>, Loc>,
    files: HashMap<FileId, Arc<File>>,
    /// The bytes of the live entries' keys and values: what a compaction would keep.
    live: u64,
}

impl Index {
    /// Adds a file whose values entries will name.
    pub(super) fn add_file(&mut self, id: FileId, file: Arc<File>) {
        self.files.insert(id, file);
    }

    /// Applies the writes of a record that starts at byte `at` of `file`.
    pub(super) fn apply(&mut self, file: FileId, at: u64, writes: Vec<Write>) {
        for Write { key, value } in writes {
            let key_len = key.len() as u64;
            let old = match value {
                Some((offset, len)) => {
                    self.live += key_len + u64::from(len);
                    let loc = Loc {
                        file,
                        at: at + offset,
                        len,
                    };
                    self.keys.insert(key, loc)
                }
                None => self.keys.remove(&key),
            };
            if let Some(old) = old {
                self.live -= key_len + u64::from(old.len);
            }
        }
    }

    /// The bytes of the live entries' keys and values.
    pub(super) fn live_bytes(&self) -> u64 {
        self.live
    }

    fn found(&self, loc: Loc) -> Option<Found> {
        Some((Arc::clone(self.files.get(&loc.file)?), loc))
    }

    pub(super) fn get(&self, key: &[u8]) -> Option<Found> {
        self.keys.get(key).and_then(|loc| self.found(*loc))
    }

    /// The entries from `from` up to `to`, forwards or backwards, `limit` at most.
    pub(super) fn range(
        &self,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        rev: bool,
        limit: usize,
    ) -> Located {
        let range = self.keys.range::<[u8], _>((from, to));
        let found = |(key, loc): (&Vec<u8>, &Loc)| Some((key.clone(), self.found(*loc)?));
        if rev {
            range.rev().filter_map(found).take(limit).collect()
        } else {
            range.filter_map(found).take(limit).collect()
        }
    }

    /// For a compaction that keeps the journal files from `first_kept` on: the live entries
    /// after key `after` whose values lie in files it replaces, among the next `examined` keys;
    /// and the last key examined (`None`: every key was).
    pub(super) fn to_copy(
        &self,
        after: Option<&[u8]>,
        first_kept: u32,
        examined: usize,
    ) -> (Located, Option<Vec<u8>>) {
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let (mut last, mut seen) = (None, 0);
        let mut copy = Vec::new();
        for (key, loc) in self
            .keys
            .range::<[u8], _>((from, Bound::Unbounded))
            .take(examined)
        {
            (last, seen) = (Some(key), seen + 1);
            if loc.file.is_before(first_kept) {
                copy.extend(self.found(*loc).map(|found| (key.clone(), found)));
            }
        }
        // Fewer keys than asked for: that was the last of them.
        (copy, last.filter(|_| seen == examined).cloned())
    }

    /// Points entries at their copies in a compaction's base (each copy's `file`), unless a
    /// commit replaced or deleted them since they were copied: an entry whose value still lies
    /// in a file the compaction replaces was not (those files take no more writes).
    pub(super) fn point_at_copies(&mut self, copies: Vec<(Vec<u8>, Loc)>, first_kept: u32) {
        for (key, copy) in copies {
            if let Some(loc) = self.keys.get_mut(&key) {
                if loc.file != copy.file && loc.file.is_before(first_kept) {
                    *loc = copy;
                }
            }
        }
    }

    /// Forgets the files a compaction that kept the journal files from `first_kept` on
    /// replaced, but for its own `base` (reads under way keep theirs open).
    pub(super) fn forget_replaced(&mut self, first_kept: u32, base: FileId) {
        self.files
            .retain(|id, _| *id == base || !id.is_before(first_kept));
    }

    /// How many entries' values lie in `file`.
    #[cfg(test)]
    pub(super) fn entries_in(&self, file: FileId) -> usize {
        self.keys.values().filter(|loc| loc.file == file).count()
    }

    /// Drops every file handle (the store is closing).
    pub(super) fn clear(&mut self) {
        self.keys.clear();
        self.files.clear();
        self.live = 0;
    }
}

/// Reads the value at `loc` of `file`.
pub(super) fn read(file: &File, loc: Loc) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut value = vec![0; loc.len as usize];
    file.read_exact_at(&mut value, loc.at)?;
    Ok(value)
}
