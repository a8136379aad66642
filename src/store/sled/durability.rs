//! How much of a crash an acknowledged commit survives: [`Durability`].

/// How much of a crash an acknowledged commit survives.
///
/// sled 0.34's own `flush()` writes its log with `pwrite` followed by `sync_file_range`
/// (on Linux). That hands the bytes to the kernel and waits for the device to accept them, so
/// the data survives the process being killed at any point; but it does not flush the disk's
/// write-back cache nor the file's metadata, so a power cut or kernel crash can still lose it.
/// sled only calls a real `fsync` from its background thread, every 500 ms.
///
/// * [`Durability::ProcessCrash`]: a commit returns after sled's `flush()`.
/// * [`Durability::PowerLoss`] (the default): a commit returns after sled's `flush()` **and**
///   an `fdatasync` of sled's data file (the file named `db` in the store directory), and of
///   any new large-value files in its `blobs/` directory (sled writes values over about
///   128 KiB there and never syncs them itself). On open, the directory entries are synced too.
///
/// Under group commit the extra `fdatasync` is shared by every commit of a group, so
/// power-loss safety costs little throughput with many concurrent writers. Stores made with
/// [`SledStore::temporary`] are deleted when dropped, so they skip the `fdatasync` (and sled
/// itself skips `sync_file_range` for them) whatever the level.
///
/// [`SledStore::temporary`]: super::SledStore::temporary
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Durability {
    /// Survives the process being killed (`flush()` only); not a power cut.
    ProcessCrash,
    /// Survives a power cut (`flush()`, then `fdatasync` of the data file). The default.
    #[default]
    PowerLoss,
}
