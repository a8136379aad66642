//! A store directory made its owner's alone (`0700`): sessions hold what people typed.
//! With fjall or the journal, the lock an embedded store of ours takes on it.

use std::io;
use std::path::Path;

#[cfg(any(feature = "fjall", all(unix, feature = "journal")))]
pub(crate) use self::lock::{io_error, lock_directory, LOCK_FILE};

/// Creates the store directory `dir` for its owner alone (`0700`). An existing directory is
/// narrowed to that if it is a store already (it holds the file `marker`), or empty; one that
/// holds other things is left as it is (with a warning): it is not the store's to change.
pub(crate) fn owner_only_directory(dir: &Path, marker: &str) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let mode = std::fs::metadata(dir)?.permissions().mode();
        if mode & 0o077 == 0 {
            return Ok(());
        }
        let ours = dir.join(marker).is_file() || std::fs::read_dir(dir)?.next().is_none();
        if ours {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o700))?;
            tracing::info!(dir = %dir.display(), "store: directory narrowed to its owner (0700)");
        } else {
            tracing::warn!(dir = %dir.display(), "store: the directory holds other files and others may read it; a directory of its own would be the owner's alone");
        }
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(dir)?;
    Ok(())
}

/// The lock of an embedded store's directory (fjall's and the journal's; sled locks its own),
/// and I/O errors in the store's words.
#[cfg(any(feature = "fjall", all(unix, feature = "journal")))]
mod lock {
    use std::fs::{File, OpenOptions};
    use std::io;
    use std::path::Path;
    use std::time::{Duration, Instant};

    use crate::store::Error;

    /// The lock file in the store directory: held while a store has the directory open.
    pub(crate) const LOCK_FILE: &str = "dormant.lock";

    /// How long an open waits for another store to let the directory go.
    const LOCK_WAIT: Duration = Duration::from_millis(500);

    /// Takes the directory's lock file (made for its owner alone), waiting [`LOCK_WAIT`] for
    /// another holder at most.
    pub(crate) fn lock_directory(path: &Path) -> Result<File, Error> {
        let mut options = OpenOptions::new();
        options.create(true).truncate(false).write(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options
            .open(path.join(LOCK_FILE))
            .map_err(|e| io_error(e, path))?;
        let started = Instant::now();
        loop {
            match fs2::FileExt::try_lock_exclusive(&file) {
                Ok(()) => return Ok(file),
                Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(io_error(e, path)),
                Err(_) if started.elapsed() < LOCK_WAIT => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(_) => {
                    return Err(Error::Locked {
                        path: path.to_path_buf(),
                    })
                }
            }
        }
    }

    /// A full disk is [`Error::StorageFull`]; any other failure is the I/O error itself.
    pub(crate) fn io_error(error: io::Error, path: &Path) -> Error {
        match error.kind() {
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => Error::StorageFull {
                path: Some(path.to_path_buf()),
                kind: error.kind(),
            },
            _ => Error::backend(error),
        }
    }
}
