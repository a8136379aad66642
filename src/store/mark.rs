//! The mark: the number of the last batch the store acknowledged (sled's batch count, fjall's
//! sequence number), kept in a file of its own beside the engine's (`acknowledged` in the
//! store directory), outside the log it vouches for.
//!
//! An engine recovering a shorter log than it wrote (sled and fjall both stop replaying at a
//! bad checksum) looks, from inside, like a crash before the
//! last commits: only a record kept elsewhere tells the two apart. The flusher advances the
//! mark after each flush that made new batches durable and before their committers hear of
//! it, with an `fdatasync` at [`Durability::PowerLoss`] (one per group, shared by its
//! commits); so the mark never names a batch the log may not hold, and every acknowledged
//! batch is at or below it.
//!
//! The file has two slots, written in turn, each `DMK1 seq:u64 crc32:u32` (big-endian): a
//! write torn in the middle, or a flipped byte, leaves the other slot, one batch behind.
//!
//! [`Durability::PowerLoss`]: crate::store::Durability::PowerLoss

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::store::Damage;

/// The mark's file name in the store directory.
pub(crate) const FILE: &str = "acknowledged";

/// A new mark's name until it is written whole (a crash may leave one: the next open writes
/// it again).
const UNFINISHED: &str = "acknowledged.new";

/// How far the mark may lag at [`Durability::ProcessCrash`], where it moves only after an
/// `fdatasync` of its own, so at most once per this long.
///
/// [`Durability::ProcessCrash`]: crate::store::Durability::ProcessCrash
pub(crate) const LAG: Duration = Duration::from_secs(1);

const MAGIC: &[u8; 4] = b"DMK1";
const SLOT: usize = 16;

fn encode(seq: u64) -> [u8; SLOT] {
    let mut slot = [0; SLOT];
    slot[..4].copy_from_slice(MAGIC);
    slot[4..12].copy_from_slice(&seq.to_be_bytes());
    let crc = crc32fast::hash(&slot[..12]);
    slot[12..].copy_from_slice(&crc.to_be_bytes());
    slot
}

fn decode(slot: &[u8]) -> Option<u64> {
    let crc = u32::from_be_bytes(slot.get(12..16)?.try_into().ok()?);
    if slot.get(..4)? != MAGIC || crc32fast::hash(slot.get(..12)?) != crc {
        return None;
    }
    Some(u64::from_be_bytes(slot.get(4..12)?.try_into().ok()?))
}

/// What the mark's file says: the higher of its valid slots, and which slot that is.
fn read_slots(bytes: &[u8]) -> Option<(u64, usize)> {
    (0..2)
        .filter_map(|slot| Some((decode(bytes.get(slot * SLOT..(slot + 1) * SLOT)?)?, slot)))
        .max()
}

/// The last batch the store in `dir` acknowledged: `None` when it has no mark (a new store, or
/// one written before marks were kept).
///
/// # Errors
/// [`Damage::Unreadable`] when the file is there and neither of its slots can be read.
pub(crate) fn read(dir: &Path) -> io::Result<Result<Option<u64>, Damage>> {
    let bytes = match std::fs::read(dir.join(FILE)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Ok(None)),
        Err(e) => return Err(e),
    };
    Ok(match read_slots(&bytes) {
        Some((seq, _)) => Ok(Some(seq)),
        None => Err(Damage::Unreadable {
            reason: format!("its mark of acknowledged commits, {FILE}, is unreadable"),
        }),
    })
}

/// The last batch the store in `dir` may have acknowledged, when its mark says so for
/// certain: both slots read, so the newer one is the last advance. Every advance is made
/// durable before its batches are answered (at [`Durability::PowerLoss`]), so a batch past it
/// was never acknowledged: a crash came between its sync and the mark's, or its group failed
/// and could not be taken back. `None` when a slot cannot be read (the mark may be one advance
/// behind, and a batch past it acknowledged) or there is no mark.
///
/// [`Durability::PowerLoss`]: crate::store::Durability::PowerLoss
#[cfg(all(unix, feature = "journal"))]
pub(crate) fn certain(dir: &Path) -> io::Result<Option<u64>> {
    let bytes = match std::fs::read(dir.join(FILE)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let slot = |n: usize| decode(bytes.get(n * SLOT..(n + 1) * SLOT)?);
    Ok(slot(0).zip(slot(1)).map(|(a, b)| a.max(b)))
}

/// What the mark read at open (`acknowledged`, from [`read`]) says of a store that recovered
/// the batches up to `recovered`: the damage if it recovered less than it acknowledged, if the
/// mark is unreadable, or if the store holds commits but its mark is gone (a mark is written
/// when a store is first opened, before any commit).
pub(crate) fn check(acknowledged: Result<Option<u64>, Damage>, recovered: u64) -> Option<Damage> {
    match acknowledged {
        Err(damage) => Some(damage),
        Ok(Some(acknowledged)) => short(acknowledged, recovered),
        Ok(None) if recovered > 0 => Some(Damage::Unreadable {
            reason: format!("it holds commits but its mark of them, {FILE}, is gone"),
        }),
        Ok(None) => None,
    }
}

/// The damage when a store recovered the batches only up to `recovered` of the
/// `acknowledged` ones.
pub(crate) fn short(acknowledged: u64, recovered: u64) -> Option<Damage> {
    (recovered < acknowledged).then_some(Damage::LostTail {
        acknowledged,
        recovered,
    })
}

/// The open mark file.
pub(crate) struct Mark {
    file: File,
    sync: bool,
    state: Mutex<Slots>,
    /// The next sync fails (a test's fault).
    #[cfg(test)]
    fail_next_sync: std::sync::atomic::AtomicBool,
}

struct Slots {
    /// The number the file holds.
    written: u64,
    /// The slot the next write goes to (not the one that holds `written`).
    next: usize,
    /// When it was last written (`None`: not since it was opened).
    at: Option<Instant>,
}

impl Mark {
    /// Opens the mark of the store in `dir`, creating it (owner-only) at `seq`, what the store
    /// recovered, if it has none; `sync` makes every advance durable (`fdatasync`).
    pub(crate) fn open(dir: &Path, seq: u64, sync: bool) -> io::Result<Self> {
        let path = dir.join(FILE);
        if !path.exists() {
            create(dir, seq)?;
        }
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        let file = options.open(&path)?;
        let bytes = std::fs::read(&path)?;
        let mark = Self {
            file,
            sync,
            state: Mutex::new(Slots {
                written: 0,
                next: 0,
                at: None,
            }),
            #[cfg(test)]
            fail_next_sync: Default::default(),
        };
        match read_slots(&bytes) {
            Some((written, slot)) => {
                *mark.state.lock() = Slots {
                    written,
                    next: 1 - slot,
                    at: None,
                };
            }
            None => {
                // Unreadable, which opening to salvage accepted (a new one was created whole
                // above): both slots at `seq`.
                write_at(&mark.file, 0, &[encode(seq), encode(seq)].concat())?;
                mark.file.sync_all()?;
                if let Some(parent) = path.parent() {
                    sync_dir(parent)?;
                }
                *mark.state.lock() = Slots {
                    written: seq,
                    next: 0,
                    at: None,
                };
            }
        }
        Ok(mark)
    }

    /// Records that every batch up to `seq` is durable, if that is more than it says.
    pub(crate) fn advance(&self, seq: u64) -> io::Result<()> {
        let mut state = self.state.lock();
        if seq <= state.written {
            return Ok(());
        }
        let slot = (state.next * SLOT) as u64;
        let advanced = write_at(&self.file, slot, &encode(seq)).and_then(|()| self.synced());
        if let Err(error) = advanced {
            // Taken back, as the store takes back the group it vouched for: left in the page
            // cache (or on the disk, if the failed sync wrote it after all), the new number
            // would name commits the store then refuses, and read as their loss at the next
            // open. The slot says again what the other one does.
            let _ = write_at(&self.file, slot, &encode(state.written)).and_then(|()| self.synced());
            return Err(error);
        }
        state.written = seq;
        state.next = 1 - state.next;
        state.at = Some(Instant::now());
        Ok(())
    }

    /// Makes the next sync of an advance fail (a test's fault).
    #[cfg(test)]
    pub(crate) fn fail_next_sync(&self) {
        self.fail_next_sync
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes the last write durable, at `PowerLoss`.
    fn synced(&self) -> io::Result<()> {
        #[cfg(test)]
        if self
            .fail_next_sync
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Err(io::Error::other("a sync that fails, for a test"));
        }
        if self.sync {
            self.file.sync_data()?;
        }
        Ok(())
    }

    /// The number the file holds: every batch up to it was acknowledged.
    pub(crate) fn written(&self) -> u64 {
        self.state.lock().written
    }

    /// Whether a lagging mark is due to move: not written for [`LAG`].
    pub(crate) fn due(&self) -> bool {
        self.state.lock().at.is_none_or(|at| at.elapsed() >= LAG)
    }
}

/// Creates the mark of a store in `dir` at `seq`, whole or not at all: both slots written
/// into a file of another name, made durable, then renamed into place. A mark created in
/// place and cut short (a full disk, a crash between its creation and its write) would be a
/// mark that cannot be read, which every later open takes for damage.
fn create(dir: &Path, seq: u64) -> io::Result<()> {
    let unfinished = dir.join(UNFINISHED);
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options.open(&unfinished)?;
    write_at(&file, 0, &[encode(seq), encode(seq)].concat())?;
    file.sync_all()?;
    std::fs::rename(&unfinished, dir.join(FILE))?;
    sync_dir(dir)
}

/// Writes the mark of the store in `dir` over: each slot the number given, or bytes that
/// cannot be read (`None`). A test's way to a mark behind its store, or half damaged.
#[cfg(test)]
pub(crate) fn rewrite(dir: &Path, slots: [Option<u64>; 2]) -> io::Result<()> {
    let slot = |seq: Option<u64>| seq.map_or([0xAB; SLOT], encode);
    std::fs::write(dir.join(FILE), [slot(slots[0]), slot(slots[1])].concat())
}

fn write_at(mut file: &File, offset: u64, bytes: &[u8]) -> io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    // The mark's lock (or its opening) keeps every other write out meanwhile.
    file.seek(SeekFrom::Start(offset))?;
    file.write_all(bytes)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_advances_in_turns_and_survives_one_bad_slot() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        assert_eq!(read(dir.path())?, Ok(None));
        let mark = Mark::open(dir.path(), 4, false)?;
        assert_eq!(read(dir.path())?, Ok(Some(4)));
        mark.advance(5)?;
        mark.advance(5)?;
        mark.advance(3)?;
        mark.advance(6)?;
        assert_eq!(read(dir.path())?, Ok(Some(6)));
        drop(mark);

        // A flipped byte in the newer slot leaves the older one.
        let path = dir.path().join(FILE);
        let mut bytes = std::fs::read(&path)?;
        let newer = read_slots(&bytes).map(|(_, slot)| slot).unwrap_or(0);
        bytes[newer * SLOT + 6] ^= 0xFF;
        std::fs::write(&path, &bytes)?;
        assert_eq!(read(dir.path())?, Ok(Some(5)));
        // Reopened, it goes on from there, writing over the bad slot first.
        let mark = Mark::open(dir.path(), 0, false)?;
        mark.advance(7)?;
        assert_eq!(read(dir.path())?, Ok(Some(7)));
        let bytes = std::fs::read(&path)?;
        assert_eq!(decode(&bytes[..SLOT]).max(decode(&bytes[SLOT..])), Some(7));
        assert!(decode(&bytes[..SLOT]).is_some() && decode(&bytes[SLOT..]).is_some());

        std::fs::write(&path, [0u8; 2 * SLOT])?;
        assert!(matches!(read(dir.path())?, Err(Damage::Unreadable { .. })));
        Ok(())
    }

    #[test]
    fn an_advance_whose_sync_fails_is_taken_back() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let mark = Mark::open(dir.path(), 4, true)?;
        mark.advance(5)?;
        mark.fail_next_sync
            .store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(mark.advance(6).is_err());
        assert_eq!(
            read(dir.path())?,
            Ok(Some(5)),
            "the failed advance is not kept"
        );
        // The next one goes on from there.
        mark.advance(6)?;
        assert_eq!(read(dir.path())?, Ok(Some(6)));
        Ok(())
    }

    #[test]
    fn a_mark_is_created_whole_or_not_at_all() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        // A creation a crash (or a full disk) cut short left its unfinished file, empty.
        std::fs::write(dir.path().join(UNFINISHED), b"")?;
        assert_eq!(read(dir.path())?, Ok(None), "no mark until it is whole");
        Mark::open(dir.path(), 3, true)?;
        assert_eq!(read(dir.path())?, Ok(Some(3)));
        assert!(!dir.path().join(UNFINISHED).exists());
        Ok(())
    }

    #[cfg(unix)]
    #[test]
    fn the_mark_is_the_owners_alone() -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir()?;
        Mark::open(dir.path(), 0, true)?;
        let mode = std::fs::metadata(dir.path().join(FILE))?
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        Ok(())
    }
}
