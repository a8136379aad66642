//! What the journal holds, in memory: every live key, in order, with where its value lies in
//! the journal's files. Values are read from the files when asked for (the kernel's page cache
//! keeps the recent ones), so memory grows with the keys, not with what they hold.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::ops::Bound;
use std::sync::Arc;

use super::record::Write;

/// Where a value lies: in which file, from which byte, how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Loc {
    pub(super) file: u32,
    pub(super) at: u64,
    pub(super) len: u32,
}

/// A value to read: its file and where in it.
pub(super) type Found = (Arc<File>, Loc);

#[derive(Default)]
pub(super) struct Index {
    keys: BTreeMap<Vec<u8>, Loc>,
    files: HashMap<u32, Arc<File>>,
}

impl Index {
    /// Adds file `id`, whose values writes will name.
    pub(super) fn add_file(&mut self, id: u32, file: Arc<File>) {
        self.files.insert(id, file);
    }

    /// Applies the writes of a record that starts at byte `at` of file `file`.
    pub(super) fn apply(&mut self, file: u32, at: u64, writes: Vec<Write>) {
        for Write { key, value } in writes {
            match value {
                Some((offset, len)) => {
                    let loc = Loc {
                        file,
                        at: at + offset,
                        len,
                    };
                    self.keys.insert(key, loc);
                }
                None => {
                    self.keys.remove(&key);
                }
            }
        }
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
    ) -> Vec<(Vec<u8>, Found)> {
        let range = self.keys.range::<[u8], _>((from, to));
        let found = |(key, loc): (&Vec<u8>, &Loc)| Some((key.clone(), self.found(*loc)?));
        if rev {
            range.rev().filter_map(found).take(limit).collect()
        } else {
            range.filter_map(found).take(limit).collect()
        }
    }

    /// Drops every file handle (the store is closing).
    pub(super) fn clear(&mut self) {
        self.keys.clear();
        self.files.clear();
    }
}

/// Reads the value at `loc` of `file`.
pub(super) fn read(file: &File, loc: Loc) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut value = vec![0; loc.len as usize];
    file.read_exact_at(&mut value, loc.at)?;
    Ok(value)
}
