//! The next journal file, begun ahead of its turn on a thread of its own.
//!
//! A journal file is filled with zeros when it is begun (`files.rs` says why): 64 MiB written
//! and synced, a tenth to a quarter of a second on the disks measured. Begun by the writer
//! when a group no longer fits, that was a stall of every commit at each new file. So once
//! the file being written is half full, a thread begins the next one as
//! `NNNNNNNN.journal.spare`, and the writer only renames it into place when its turn comes.
//! Until that rename the spare is not part of the store: an open removes any it finds (and only
//! an open: a compaction's clean-up leaves them to the writer), so a crash while one is being
//! made, or before it is used, leaves nothing to replay.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use super::files::{journal_path, spare_path, sync_dir, zeroed};

/// A journal file being begun, or begun, ahead of its turn.
pub(super) struct Spare {
    /// The journal file it is to become.
    id: u32,
    path: PathBuf,
    /// The thread making it; taken when the spare is used or let go.
    making: Option<JoinHandle<io::Result<File>>>,
}

impl Spare {
    /// Starts making journal file `id` of `bytes` zeros in `dir`, unless the disk has too
    /// little room for it and a file's worth of records besides (a spare must not be what
    /// fills the disk under the commits) or no thread can be started.
    pub(super) fn begin(dir: &Path, id: u32, bytes: u64) -> Option<Self> {
        let room = fs2::available_space(dir).ok()?;
        if room < bytes.saturating_mul(2) {
            return None;
        }
        let path = spare_path(dir, id);
        let making = {
            let path = path.clone();
            std::thread::Builder::new()
                .name("dormant-journal-spare".into())
                .spawn(move || zeroed(&path, bytes))
        };
        match making {
            Ok(making) => Some(Self {
                id,
                path,
                making: Some(making),
            }),
            Err(error) => {
                tracing::debug!(%error, "store: could not start a thread to begin the next journal file");
                None
            }
        }
    }

    /// The journal file this spare is to become.
    pub(super) fn id(&self) -> u32 {
        self.id
    }

    /// Waits for the spare (if it is still being made) and renames it into place as journal
    /// file `id` in `dir`; `None` if it could not be made or moved, when the caller begins the
    /// file itself.
    pub(super) fn into_journal(mut self, dir: &Path) -> Option<File> {
        let file = match self.making.take()?.join() {
            Ok(Ok(file)) => file,
            Ok(Err(error)) => {
                tracing::debug!(%error, "store: the next journal file could not be begun ahead");
                return None;
            }
            Err(_) => {
                let _ = std::fs::remove_file(&self.path);
                return None;
            }
        };
        let journal = journal_path(dir, self.id);
        match std::fs::rename(&self.path, &journal).and_then(|()| sync_dir(dir)) {
            Ok(()) => Some(file),
            Err(error) => {
                tracing::debug!(%error, "store: the next journal file could not be put in place");
                // A rename that happened before the directory's sync failed leaves a file of
                // zeros in the journal's place: the caller begins it again, the same.
                let _ = std::fs::remove_file(&self.path);
                None
            }
        }
    }
}

impl Drop for Spare {
    /// A spare let go unused (the store closed, or its turn never came) is waited for, so
    /// that no thread writes in the directory after the store let it go, and removed.
    fn drop(&mut self) {
        if let Some(making) = self.making.take() {
            let _ = making.join();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
