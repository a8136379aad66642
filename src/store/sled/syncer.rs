//! The `fdatasync`s of [`Durability::PowerLoss`]: sled's data file, the large-value files sled
//! never syncs itself, and the directory entries.
//!
//! [`Durability::PowerLoss`]: crate::store::Durability::PowerLoss

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

/// The `fdatasync` half of [`Durability::PowerLoss`](crate::store::Durability::PowerLoss), at
/// every flush, and before the mark moves at `ProcessCrash`.
pub(super) struct Syncer {
    /// A second handle on sled's data file `<dir>/db` (sled's own handle is private).
    data: File,
    blobs_dir: PathBuf,
    /// Blob files already synced (sled never rewrites a blob file; it writes new ones).
    synced_blobs: Mutex<HashSet<OsString>>,
}

impl Syncer {
    /// Opens sled's data file and makes the directory entries sled just created durable.
    pub(super) fn open(dir: &Path) -> io::Result<Self> {
        // `write(true)` without create or truncate: some platforms need write access to sync.
        let data = OpenOptions::new().write(true).open(dir.join("db"))?;
        data.sync_data()?;
        let conf = dir.join("conf");
        if conf.exists() {
            File::open(&conf)?.sync_all()?;
        }
        let blobs_dir = dir.join("blobs");
        sync_dir(&blobs_dir)?;
        sync_dir(dir)?;
        if let Some(parent) = dir.parent() {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            sync_dir(parent)?;
        }
        Ok(Self {
            data,
            blobs_dir,
            synced_blobs: Mutex::new(HashSet::new()),
        })
    }

    pub(super) fn sync(&self) -> io::Result<()> {
        self.sync_blobs()?;
        self.data.sync_data()?;
        Ok(())
    }

    /// Syncs every blob file not synced yet, then the blob directory if any was new.
    fn sync_blobs(&self) -> io::Result<()> {
        let mut synced = self.synced_blobs.lock();
        let mut present = HashSet::with_capacity(synced.len());
        let mut any_new = false;
        for entry in std::fs::read_dir(&self.blobs_dir)? {
            let name = entry?.file_name();
            if !synced.contains(&name) {
                match File::open(self.blobs_dir.join(&name)) {
                    Ok(file) => file.sync_data()?,
                    // Garbage-collected by sled in the meantime.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
                any_new = true;
            }
            present.insert(name);
        }
        if any_new {
            sync_dir(&self.blobs_dir)?;
        }
        // Forget blobs sled has removed.
        *synced = present;
        Ok(())
    }
}

/// Makes a directory's entries durable (a no-op where directories cannot be opened).
fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}
