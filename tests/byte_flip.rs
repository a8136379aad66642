//! Damage is told, never served (issue 30, goal 5): a stopped store of 30 sessions gets one
//! byte inverted at a random offset of one of its files, many times over, each on a fresh
//! copy. Opened again, the store either refuses with the typed `Damaged` (which
//! `SledStoreBuilder::salvage` then opens read-only) or serves every session whole, exactly as
//! it was acknowledged: never fewer sessions, nor shorter ones, without a word.
//!
//! Two pristine stores are flipped: one stopped right after its writes (sled replays its log
//! to open it) and one opened again first (its pages come from a snapshot). The offsets come
//! from fixed seeds, so every run flips the same bytes. With the `fjall` feature, the same
//! holds on `FjallStore` (`FjallStore::salvage` opens what is left), and with `journal` on
//! `JournalStore` (in files of 16 KiB, so that the sessions span several).

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use dormant::store::{Batch, CommitKind, Damage, Durability, Error as StoreError, Store, Tree};
use dormant::types::RunRecord;
use dormant::{Message, SessionId, SledStore};

const SESSIONS: usize = 30;
const TRIALS: usize = 60;
const SEED: u64 = 0x005e_ed0f_f11b;

/// What a session shows: its messages and its runs.
type Shown = Vec<(SessionId, Vec<Message>, Vec<RunRecord>)>;

async fn shown(store: Arc<dyn Store>) -> anyhow::Result<Shown> {
    let runtime = common::worker_runtime(
        store,
        2,
        Arc::new(AtomicUsize::new(0)),
        dormant::ManualClock::new(0),
    )?;
    let all = show(&runtime).await?;
    runtime.shutdown().await?;
    Ok(all)
}

/// What `runtime` serves of every session it stores.
async fn show(runtime: &dormant::Runtime) -> anyhow::Result<Shown> {
    let mut ids = runtime.session_ids().await?;
    ids.sort();
    let mut all = Vec::with_capacity(ids.len());
    for id in ids {
        all.push((
            id.clone(),
            runtime.messages(&id).await?,
            runtime.runs(&id).await?,
        ));
    }
    Ok(all)
}

/// Every file under `dir`, with its size, in a fixed order.
fn files(dir: &Path) -> std::io::Result<Vec<(PathBuf, u64)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_dir() {
            found.extend(files(&entry.path())?);
        } else {
            found.push((entry.path(), meta.len()));
        }
    }
    found.sort();
    Ok(found)
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.metadata()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// xorshift64*: the same offsets on every run, no dependency.
struct Offsets(u64);

impl Offsets {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % below
    }
}

/// The store a trial flips bytes of.
#[derive(Clone, Copy, Debug)]
enum Backend {
    Sled(Durability),
    #[cfg(feature = "fjall")]
    Fjall,
    #[cfg(all(unix, feature = "journal"))]
    Journal,
}

/// The journal's files in this test: small, so that 30 sessions span several.
#[cfg(all(unix, feature = "journal"))]
const JOURNAL_FILE_BYTES: u64 = 16 * 1024;

impl Backend {
    /// A new store in `dir`.
    fn create(self, dir: &Path) -> Result<Arc<dyn Store>, StoreError> {
        Ok(match self {
            Backend::Sled(durability) => {
                Arc::new(SledStore::builder(dir).durability(durability).open()?)
            }
            #[cfg(feature = "fjall")]
            Backend::Fjall => Arc::new(dormant::FjallStore::open(dir)?),
            #[cfg(all(unix, feature = "journal"))]
            Backend::Journal => Arc::new(
                dormant::JournalStore::builder(dir)
                    .file_bytes(JOURNAL_FILE_BYTES)
                    .open()?,
            ),
        })
    }

    /// The store in `dir` opened as a user would.
    fn open(self, dir: &Path) -> Result<Arc<dyn Store>, StoreError> {
        Ok(match self {
            Backend::Sled(_) => Arc::new(SledStore::open(dir)?),
            #[cfg(feature = "fjall")]
            Backend::Fjall => Arc::new(dormant::FjallStore::open(dir)?),
            #[cfg(all(unix, feature = "journal"))]
            Backend::Journal => Arc::new(dormant::JournalStore::open(dir)?),
        })
    }

    /// The store in `dir` opened read-only to salvage it, with what it lost.
    fn salvage(self, dir: &Path) -> Result<(Arc<dyn Store>, Option<Damage>), StoreError> {
        Ok(match self {
            Backend::Sled(_) => {
                let left = SledStore::builder(dir).salvage().open()?;
                let damage = left.damage();
                (Arc::new(left), damage)
            }
            #[cfg(feature = "fjall")]
            Backend::Fjall => {
                let left = dormant::FjallStore::salvage(dir)?;
                let damage = left.damage();
                (Arc::new(left), damage)
            }
            #[cfg(all(unix, feature = "journal"))]
            Backend::Journal => {
                let left = dormant::JournalStore::salvage(dir)?;
                let damage = left.damage();
                (Arc::new(left), damage)
            }
        })
    }
}

/// Writes the pristine store: 30 sessions, each two tool steps and a text, then stopped;
/// `reopened`, it is opened and stopped once more, which folds sled's log into a snapshot.
async fn pristine(dir: &Path, reopened: bool, backend: Backend) -> anyhow::Result<Shown> {
    let store = backend.create(dir)?;
    let runtime = common::worker_runtime(
        Arc::clone(&store),
        2,
        Arc::new(AtomicUsize::new(0)),
        dormant::ManualClock::new(0),
    )?;
    for index in 0..SESSIONS {
        let id: SessionId = format!("s{index:02}").parse()?;
        runtime.execute_on(&id, "worker", "go").await?;
    }
    let all = show(&runtime).await?;
    runtime.shutdown().await?;
    if reopened {
        let again = shown(backend.open(dir)?).await?;
        anyhow::ensure!(again == all, "the pristine store changed when opened again");
    }
    Ok(all)
}

/// A store stopped right after its writes: sled must replay its log to open it, and stops
/// at the first bad checksum, as it would at a torn tail (what lost sessions silently).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_a_log_to_replay_is_told_never_served_silently() -> anyhow::Result<()> {
    flip_bytes(false, Backend::Sled(Durability::PowerLoss), SEED).await
}

/// The same at `ProcessCrash`, whose mark lags a second behind while the store runs (a power
/// cut may lose that much): a graceful stop brings it up to everything flushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_a_store_that_survives_only_process_crashes_is_told() -> anyhow::Result<()>
{
    flip_bytes(
        false,
        Backend::Sled(Durability::ProcessCrash),
        SEED ^ 0x5a5a,
    )
    .await
}

/// A store opened once more before it was stopped: its pages are read from a snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_a_snapshotted_store_is_told_or_harmless() -> anyhow::Result<()> {
    flip_bytes(true, Backend::Sled(Durability::PowerLoss), SEED ^ 0xa5a5).await
}

/// A fjall store stopped right after its writes: fjall replays its journal to open it.
#[cfg(feature = "fjall")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_a_fjall_journal_is_told_never_served_silently() -> anyhow::Result<()> {
    flip_bytes(false, Backend::Fjall, SEED ^ 0xf1a1).await
}

/// A fjall store opened once more before it was stopped: its first journal is sealed then.
#[cfg(feature = "fjall")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_a_reopened_fjall_store_is_told_or_harmless() -> anyhow::Result<()> {
    flip_bytes(true, Backend::Fjall, SEED ^ 0x0f1a).await
}

/// A journal store stopped right after its writes.
#[cfg(all(unix, feature = "journal"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_the_journal_is_told_never_served_silently() -> anyhow::Result<()> {
    flip_bytes(false, Backend::Journal, SEED ^ 0x10c1).await
}

/// A journal store opened once more before it was stopped: it replays its files and goes on
/// writing after the last record.
#[cfg(all(unix, feature = "journal"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_a_reopened_journal_is_told_or_harmless() -> anyhow::Result<()> {
    flip_bytes(true, Backend::Journal, SEED ^ 0x01c1).await
}

/// Flips one byte in each of `TRIALS` copies of a pristine store and opens each copy.
async fn flip_bytes(reopened: bool, backend: Backend, seed: u64) -> anyhow::Result<()> {
    let root = tempfile::tempdir()?;
    let clean = root.path().join("clean");
    let before = pristine(&clean, reopened, backend).await?;
    assert_eq!(before.len(), SESSIONS);
    let mut files = files(&clean)?;
    let zero_filled = match backend {
        Backend::Sled(_) => false,
        #[cfg(feature = "fjall")]
        Backend::Fjall => true,
        #[cfg(all(unix, feature = "journal"))]
        Backend::Journal => true,
    };
    if zero_filled {
        // fjall makes its journal 32 MiB at once, and the journal store its files, and fill
        // them from the start: a byte flipped in the zeros past what they wrote is never
        // read, so the flips go where they wrote.
        for (path, len) in &mut files {
            let bytes = std::fs::read(&*path)?;
            *len = bytes
                .iter()
                .rposition(|byte| *byte != 0)
                .map_or(0, |last| last as u64 + 1);
        }
    }
    let total: u64 = files.iter().map(|(_, len)| len).sum();
    let mut offsets = Offsets(seed);
    let (mut told, mut harmless) = (Vec::new(), 0);
    for trial in 0..TRIALS {
        let dir = root.path().join(format!("trial-{trial}"));
        copy_dir(&clean, &dir)?;
        let mut at = offsets.next(total);
        let (file, offset) = files
            .iter()
            .find_map(|(path, len)| {
                if at < *len {
                    Some((path, at))
                } else {
                    at -= len;
                    None
                }
            })
            .ok_or_else(|| anyhow::anyhow!("an offset past the files"))?;
        let target = dir.join(file.strip_prefix(&clean)?);
        let mut bytes = std::fs::read(&target)?;
        let index = usize::try_from(offset)?;
        bytes[index] = !bytes[index];
        std::fs::write(&target, &bytes)?;
        let whence = format!("trial {trial}: byte {offset} of {}", target.display());

        match backend.open(&dir) {
            Err(StoreError::Damaged { damage, .. }) => {
                told.push(damage.clone());
                // What is left opens read-only, unless the engine cannot open the files at all.
                match backend.salvage(&dir) {
                    Ok((left, left_damage)) => {
                        assert_eq!(left_damage, Some(damage), "{whence}");
                        let mut batch = Batch::new(CommitKind::Other);
                        batch.put(Tree::Sessions, b"x".to_vec(), b"y".to_vec());
                        assert!(
                            matches!(left.commit(batch).await, Err(StoreError::ReadOnly { .. })),
                            "{whence}: a salvaged store takes no commit"
                        );
                        left.close().await?;
                    }
                    Err(StoreError::Damaged {
                        damage: Damage::Unreadable { .. },
                        ..
                    }) if matches!(damage, Damage::Unreadable { .. }) => {}
                    Err(other) => anyhow::bail!("{whence}: salvage failed: {other}"),
                }
            }
            Err(other) => anyhow::bail!("{whence}: an untyped error: {other}"),
            Ok(store) => {
                // Shutting the runtime down closes the store.
                let after = shown(store).await?;
                assert_eq!(
                    after.len(),
                    before.len(),
                    "{whence}: sessions lost without a word"
                );
                assert!(after == before, "{whence}: sessions changed without a word");
                harmless += 1;
            }
        }
        std::fs::remove_dir_all(&dir)?;
    }
    eprintln!(
        "{TRIALS} flipped bytes: {} told ({told:?}), {harmless} harmless",
        told.len()
    );
    Ok(())
}
