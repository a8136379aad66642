//! A store directory made its owner's alone (`0700`): sessions hold what people typed.

use std::io;
use std::path::Path;

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
