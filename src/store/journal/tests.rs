//! The journal's own tests: records read back across reopens and files, a torn tail cut off,
//! damage told, the files its owner's alone.

use std::path::Path;

use super::files::{journal_files, journal_path, spare_path};
use super::record;
use super::JournalStore;
use crate::store::{Batch, CommitKind, Damage, Error, Store, Tree};

/// Small files, so that a few commits span several.
const SMALL: u64 = 4096;

fn open(dir: &Path) -> Result<JournalStore, Error> {
    JournalStore::builder(dir).file_bytes(SMALL).open()
}

async fn put(store: &JournalStore, key: &str, value: &[u8]) -> Result<(), Error> {
    let mut batch = Batch::new(CommitKind::Other);
    batch.put(Tree::Log, key.as_bytes().to_vec(), value.to_vec());
    batch.put(Tree::Pending, key.as_bytes().to_vec(), b"p".to_vec());
    store.commit(batch).await
}

/// Commits `n` entries `k000`, `k001`, … of 300 bytes each, then closes the store.
async fn written(dir: &Path, n: usize) -> Result<(), Error> {
    let store = open(dir)?;
    for i in 0..n {
        put(&store, &format!("k{i:03}"), &[i as u8; 300]).await?;
    }
    store.close().await
}

/// Where the whole records of journal file `id` end.
fn records_end(dir: &Path, id: u32) -> Result<usize, Error> {
    let bytes = std::fs::read(journal_path(dir, id)).map_err(Error::backend)?;
    let mut at = 0;
    while let Ok(Some(record)) = record::decode(&bytes[at..]) {
        at += record.len;
    }
    Ok(at)
}

fn flip(dir: &Path, id: u32, at: usize) -> Result<(), Error> {
    let path = journal_path(dir, id);
    let mut bytes = std::fs::read(&path).map_err(Error::backend)?;
    bytes[at] = !bytes[at];
    std::fs::write(&path, bytes).map_err(Error::backend)
}

fn files(dir: &Path) -> Result<Vec<u32>, Error> {
    journal_files(dir).map_err(Error::backend)
}

#[tokio::test]
async fn commits_across_several_files_are_read_back_after_a_reopen() -> Result<(), Error> {
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    written(dir.path(), 40).await?;
    assert!(files(dir.path())?.len() > 3, "{:?}", files(dir.path())?);

    let store = open(dir.path())?;
    assert_eq!(store.get(Tree::Log, b"k007").await?, Some(vec![7; 300]));
    assert_eq!(store.get(Tree::Log, b"k040").await?, None);
    let all = store.scan_prefix(Tree::Log, b"k").await?;
    assert_eq!(all.len(), 40);
    assert_eq!(store.scan_prefix(Tree::Pending, b"k").await?.len(), 40);
    let newest = store.scan_prefix_rev(Tree::Log, b"k0", 2).await?;
    let keys: Vec<&[u8]> = newest.iter().map(|(key, _)| key.as_slice()).collect();
    assert_eq!(keys, [b"k039".as_slice(), b"k038".as_slice()]);
    let range = store.scan_range(Tree::Log, b"k010", b"k013", 10).await?;
    assert_eq!(range.len(), 3);

    // A delete, and more commits after the reopen, survive the next one.
    let mut batch = Batch::new(CommitKind::Other);
    batch.delete(Tree::Log, b"k000".to_vec());
    store.commit(batch).await?;
    put(&store, "k100", b"later").await?;
    store.close().await?;
    let again = open(dir.path())?;
    assert_eq!(again.get(Tree::Log, b"k000").await?, None);
    assert_eq!(
        again.get(Tree::Log, b"k100").await?,
        Some(b"later".to_vec())
    );
    assert_eq!(again.scan_prefix(Tree::Log, b"k").await?.len(), 40);
    Ok(())
}

#[tokio::test]
async fn a_write_cut_short_at_the_end_is_dropped_and_writing_goes_on() -> Result<(), Error> {
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    written(dir.path(), 5).await?;
    let last = *files(dir.path())?.last().ok_or(Error::Closed)?;
    let end = records_end(dir.path(), last)?;
    // The start of a record whose write a crash cut short: a length, no matching body.
    let path = journal_path(dir.path(), last);
    let mut bytes = std::fs::read(&path).map_err(Error::backend)?;
    bytes[end..end + 6].copy_from_slice(&[200, 0, 0, 0, 7, 7]);
    std::fs::write(&path, bytes).map_err(Error::backend)?;

    let store = open(dir.path())?;
    assert_eq!(store.scan_prefix(Tree::Log, b"k").await?.len(), 5);
    put(&store, "k005", b"after").await?;
    store.close().await?;
    let again = open(dir.path())?;
    assert_eq!(again.scan_prefix(Tree::Log, b"k").await?.len(), 6);
    assert_eq!(
        again.get(Tree::Log, b"k005").await?,
        Some(b"after".to_vec())
    );
    Ok(())
}

#[tokio::test]
async fn a_damaged_acknowledged_last_record_is_told_and_salvaged_read_only() -> Result<(), Error> {
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    written(dir.path(), 5).await?;
    let last = *files(dir.path())?.last().ok_or(Error::Closed)?;
    flip(dir.path(), last, records_end(dir.path(), last)? - 3)?;

    let refused = open(dir.path());
    assert!(
        matches!(
            &refused,
            Err(Error::Damaged {
                damage: Damage::LostTail {
                    acknowledged: 5,
                    recovered: 4
                },
                ..
            })
        ),
        "{refused:?}"
    );
    let left = JournalStore::salvage(dir.path())?;
    assert!(left.is_read_only());
    assert!(matches!(left.damage(), Some(Damage::LostTail { .. })));
    assert_eq!(left.scan_prefix(Tree::Log, b"k").await?.len(), 4);
    let refused = put(&left, "k9", b"no").await;
    assert!(
        matches!(refused, Err(Error::ReadOnly { .. })),
        "{refused:?}"
    );
    Ok(())
}

#[tokio::test]
async fn damage_in_an_earlier_file_or_a_lost_file_is_told() -> Result<(), Error> {
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    written(dir.path(), 40).await?;
    let ids = files(dir.path())?;
    let damaged = tempfile::tempdir().map_err(Error::backend)?;
    for id in &ids {
        let name = journal_path(dir.path(), *id);
        let to = journal_path(damaged.path(), *id);
        std::fs::copy(name, to).map_err(Error::backend)?;
    }
    std::fs::copy(
        dir.path().join(crate::store::mark::FILE),
        damaged.path().join(crate::store::mark::FILE),
    )
    .map_err(Error::backend)?;

    // A flipped byte in the first file: later files hold newer commits, so the mark alone
    // would not tell.
    flip(dir.path(), ids[0], 20)?;
    let refused = open(dir.path());
    assert!(
        matches!(
            &refused,
            Err(Error::Damaged {
                damage: Damage::Unreadable { .. },
                ..
            })
        ),
        "{refused:?}"
    );
    let left = JournalStore::salvage(dir.path())?;
    let kept = left.scan_prefix(Tree::Log, b"k").await?.len();
    assert!(kept > 0 && kept < 40, "{kept}");

    // A file gone from the middle: the commits jump.
    std::fs::remove_file(journal_path(damaged.path(), ids[1])).map_err(Error::backend)?;
    let refused = open(damaged.path());
    let told = format!("{refused:?}");
    assert!(told.contains("are lost"), "{told}");
    Ok(())
}

#[cfg(unix)]
#[tokio::test]
async fn the_directory_and_its_files_are_their_owners_alone() -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    let path = dir.path().join("store");
    written(&path, 3).await?;
    let mode = |path: &Path| -> Result<u32, Error> {
        let meta = std::fs::metadata(path).map_err(Error::backend)?;
        Ok(meta.permissions().mode() & 0o777)
    };
    assert_eq!(mode(&path)?, 0o700);
    for entry in std::fs::read_dir(&path).map_err(Error::backend)? {
        let entry = entry.map_err(Error::backend)?;
        assert_eq!(mode(&entry.path())?, 0o600, "{}", entry.path().display());
    }
    Ok(())
}

#[tokio::test]
async fn a_second_open_is_refused_while_the_first_holds_the_directory() -> Result<(), Error> {
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    let first = open(dir.path())?;
    assert!(matches!(open(dir.path()), Err(Error::Locked { .. })));
    first.release();
    assert!(matches!(
        first.get(Tree::Log, b"k").await,
        Err(Error::Closed)
    ));
    open(dir.path())?;
    Ok(())
}

/// Commits `rounds` rounds of the same 20 keys (300 bytes each), so that most of what the
/// files hold is replaced; returns the last round's values.
async fn overwritten(store: &JournalStore, rounds: usize) -> Result<(), Error> {
    for round in 0..rounds {
        for key in 0..20 {
            put(store, &format!("k{key:03}"), &[round as u8; 300]).await?;
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_compaction_keeps_every_live_entry_and_lets_the_rest_go() -> Result<(), Error> {
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    let store = open(dir.path())?;
    put(&store, "gone", b"deleted before the compaction").await?;
    let mut batch = Batch::new(CommitKind::Other);
    batch.delete(Tree::Log, b"gone".to_vec());
    store.commit(batch).await?;
    overwritten(&store, 40).await?;
    // 40 rounds of 20 entries: ~280 KiB written for ~7 KiB live, in 4 KiB files; compactions
    // ran meanwhile, and one more now.
    super::writer::compact_now(&store.engine);
    let bases = super::files::base_files(dir.path()).map_err(Error::backend)?;
    let kept = files(dir.path())?;
    assert_eq!(bases.len(), 1, "{bases:?}");
    assert_eq!(
        kept, bases,
        "only the file begun for the compaction is left"
    );
    assert!(store.size_on_disk().await? < 32 * 1024);
    assert_eq!(store.get(Tree::Log, b"k007").await?, Some(vec![39; 300]));
    assert_eq!(store.scan_prefix(Tree::Log, b"k").await?.len(), 20);
    assert_eq!(store.get(Tree::Log, b"gone").await?, None);
    store.close().await?;

    let again = open(dir.path())?;
    assert_eq!(again.scan_prefix(Tree::Log, b"k").await?.len(), 20);
    assert_eq!(again.scan_prefix(Tree::Pending, b"k").await?.len(), 20);
    assert_eq!(again.get(Tree::Log, b"k019").await?, Some(vec![39; 300]));
    assert_eq!(again.get(Tree::Log, b"gone").await?, None);
    // Commits go on after the base, and across the next reopen.
    overwritten(&again, 3).await?;
    again.close().await?;
    let last = open(dir.path())?;
    assert_eq!(last.get(Tree::Log, b"k000").await?, Some(vec![2; 300]));
    Ok(())
}

/// Overwrites 20 keys, one at a time, while the failure armed for the next compaction is
/// still to come (`armed`): until a compaction begins on its own, and fails. (No more after
/// it: another file's worth would begin the next one.) Then no base is left.
async fn a_compaction_fails(store: &JournalStore, armed: impl Fn() -> bool) -> Result<(), Error> {
    let mut puts = 0;
    while armed() {
        assert!(puts < 10_000, "no compaction began");
        put(store, &format!("k{:03}", puts % 20), &[1; 300]).await?;
        puts += 1;
    }
    wait_for_compaction(store);
    assert!(super::files::base_files(store.engine.path())
        .map_err(Error::backend)?
        .is_empty());
    Ok(())
}

#[tokio::test]
async fn a_compaction_that_panics_is_tried_again_later() -> Result<(), Error> {
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    let store = open(dir.path())?;
    super::compactor::tests::panic_next_compaction_in(dir.path());
    // It panics.
    a_compaction_fails(&store, || super::compactor::tests::armed_for(dir.path())).await?;
    // The store goes on, and compacts again once it holds another file's worth more.
    overwritten(&store, 40).await?;
    wait_for_compaction(&store);
    let bases = super::files::base_files(dir.path()).map_err(Error::backend)?;
    assert!(
        !bases.is_empty(),
        "no compaction after the one that panicked"
    );
    assert_eq!(store.scan_prefix(Tree::Log, b"k").await?.len(), 20);
    assert_eq!(store.get(Tree::Log, b"k007").await?, Some(vec![39; 300]));
    store.close().await?;
    let again = open(dir.path())?;
    assert_eq!(again.get(Tree::Log, b"k019").await?, Some(vec![39; 300]));
    Ok(())
}

/// A base whose sync fails is never read: the entries it copied still read from the files it
/// was to replace (its pages may never reach the disk, and a later compaction would copy
/// whatever they then read as), and those files stay until a compaction succeeds.
#[tokio::test]
async fn a_compaction_whose_base_is_not_made_durable_leaves_every_entry_where_it_was(
) -> Result<(), Error> {
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    let store = open(dir.path())?;
    super::compactor::tests::fail_next_base_sync_in(dir.path());
    a_compaction_fails(&store, || {
        super::compactor::tests::sync_fails_in(dir.path())
    })
    .await?;
    let in_bases = store.engine.read(|index| {
        (0..64)
            .map(|id| index.entries_in(super::index::FileId::Base(id)))
            .sum::<usize>()
    })?;
    assert_eq!(in_bases, 0, "entries point into a base that was removed");
    assert_eq!(store.get(Tree::Log, b"k003").await?, Some(vec![1; 300]));
    overwritten(&store, 40).await?;
    wait_for_compaction(&store);
    assert!(!super::files::base_files(dir.path())
        .map_err(Error::backend)?
        .is_empty());
    assert_eq!(store.get(Tree::Log, b"k007").await?, Some(vec![39; 300]));
    store.close().await?;
    let again = open(dir.path())?;
    assert_eq!(again.get(Tree::Log, b"k019").await?, Some(vec![39; 300]));
    Ok(())
}

/// Waits for the compaction under way, if one is.
fn wait_for_compaction(store: &JournalStore) {
    let running = store.engine.compaction.lock().take();
    if let Some(running) = running {
        let _ = running.join();
    }
}

#[tokio::test]
async fn files_a_crash_left_behind_a_base_are_removed_at_open() -> Result<(), Error> {
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    let store = open(dir.path())?;
    put(&store, "old", b"first").await?;
    let first = std::fs::read(journal_path(dir.path(), 1)).map_err(Error::backend)?;
    let mut batch = Batch::new(CommitKind::Other);
    batch.delete(Tree::Log, b"old".to_vec());
    store.commit(batch).await?;
    overwritten(&store, 40).await?;
    super::writer::compact_now(&store.engine);
    store.close().await?;
    // A crash between the base's rename and the removal of what it replaced: the first
    // journal file is back, with the entry deleted since, and an unfinished base.
    std::fs::write(journal_path(dir.path(), 1), first).map_err(Error::backend)?;
    std::fs::write(super::files::unfinished_base_path(dir.path(), 999), b"half")
        .map_err(Error::backend)?;

    let again = open(dir.path())?;
    assert_eq!(again.get(Tree::Log, b"old").await?, None);
    assert_eq!(again.scan_prefix(Tree::Log, b"k").await?.len(), 20);
    assert!(!files(dir.path())?.contains(&1));
    assert!(!super::files::unfinished_base_path(dir.path(), 999).exists());
    Ok(())
}

#[tokio::test]
async fn a_lost_base_is_told() -> Result<(), Error> {
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    let store = open(dir.path())?;
    overwritten(&store, 10).await?;
    super::writer::compact_now(&store.engine);
    // Commits after the base, so that the journal file after it goes on from the base's.
    put(&store, "after", b"the base").await?;
    store.close().await?;
    let bases = super::files::base_files(dir.path()).map_err(Error::backend)?;
    let [base] = bases.as_slice() else {
        return Err(Error::backend(format!("bases: {bases:?}")));
    };
    std::fs::remove_file(super::files::base_path(dir.path(), *base)).map_err(Error::backend)?;

    let refused = open(dir.path());
    let told = format!("{refused:?}");
    assert!(told.contains("goes on at commit"), "{told}");
    Ok(())
}

/// A base cut short at a record's boundary (every record whole, its end gone) is damage, told
/// at open, not a store that silently lost the entries the cut took.
#[tokio::test]
async fn a_base_cut_at_a_records_boundary_is_told() -> Result<(), Error> {
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    let store = open(dir.path())?;
    overwritten(&store, 10).await?;
    super::writer::compact_now(&store.engine);
    store.close().await?;
    let bases = super::files::base_files(dir.path()).map_err(Error::backend)?;
    let [base] = bases.as_slice() else {
        return Err(Error::backend(format!("bases: {bases:?}")));
    };
    let path = super::files::base_path(dir.path(), *base);
    let whole = std::fs::read(&path).map_err(Error::backend)?;
    // Where each record ends: after its first (no entry), and before its last (the end).
    let mut ends = Vec::new();
    let mut at = 0;
    while let Ok(Some(found)) = record::decode(&whole[at..]) {
        at += found.len;
        ends.push(at);
    }
    assert!(ends.len() >= 3, "a first record, entries, an end: {ends:?}");
    for cut in [ends[0], ends[ends.len() - 2]] {
        std::fs::write(&path, &whole[..cut]).map_err(Error::backend)?;
        let refused = open(dir.path());
        let told = format!("{refused:?}");
        assert!(
            told.contains("ends before its last record"),
            "cut at {cut}: {told}"
        );
    }
    std::fs::write(&path, &whole).map_err(Error::backend)?;
    let again = open(dir.path())?;
    assert_eq!(again.scan_prefix(Tree::Log, b"k").await?.len(), 20);
    Ok(())
}

/// A group far larger than the usual lets its buffer go once written: one large commit does
/// not hold its size in memory for as long as the store is open.
#[tokio::test]
async fn a_large_group_does_not_keep_its_buffer() -> Result<(), Error> {
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    let store = open(dir.path())?;
    put(&store, "large", &vec![7; 16 * 1024 * 1024]).await?;
    put(&store, "small", b"after").await?;
    let kept = store
        .engine
        .writer
        .lock()
        .as_ref()
        .map_or(0, |writer| writer.bytes.capacity());
    assert!(kept <= 8 * 1024 * 1024, "the buffer kept {kept} bytes");
    assert_eq!(
        store
            .get(Tree::Log, b"large")
            .await?
            .map(|value| value.len()),
        Some(16 * 1024 * 1024)
    );
    Ok(())
}

/// Replay reads a file a window at a time: records that straddle the windows' edges, in a
/// journal file and in a base, a torn write after them, all read back as written.
#[tokio::test]
async fn records_larger_than_the_replays_window_and_across_its_edges_are_read_back(
) -> Result<(), Error> {
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    let value = |i: usize| vec![i as u8; 1_500_001 + i];
    // One file of 64 MiB: ~12 MiB of records in it, across three of replay's 4 MiB windows.
    let store = JournalStore::builder(dir.path()).open()?;
    for i in 0..8 {
        put(&store, &format!("k{i}"), &value(i)).await?;
    }
    store.close().await?;
    let again = JournalStore::builder(dir.path()).open()?;
    for i in 0..8 {
        assert_eq!(
            again.get(Tree::Log, format!("k{i}").as_bytes()).await?,
            Some(value(i))
        );
    }
    // Into a base, and after it, a write a crash cut short past the end of a window.
    super::writer::compact_now(&again.engine);
    put(&again, "after", b"the base").await?;
    again.close().await?;
    let files = journal_files(dir.path()).map_err(Error::backend)?;
    let last = journal_path(dir.path(), *files.last().unwrap_or(&1));
    let torn = std::fs::OpenOptions::new()
        .write(true)
        .open(&last)
        .map_err(Error::backend)?;
    std::os::unix::fs::FileExt::write_all_at(&torn, &[9; 100], 9 * 1024 * 1024)
        .map_err(Error::backend)?;
    drop(torn);
    let last_open = JournalStore::builder(dir.path()).open()?;
    for i in 0..8 {
        assert_eq!(
            last_open.get(Tree::Log, format!("k{i}").as_bytes()).await?,
            Some(value(i))
        );
    }
    assert_eq!(
        last_open.get(Tree::Log, b"after").await?,
        Some(b"the base".to_vec())
    );
    Ok(())
}

/// A record longer than replay's window is read back (its checksum checked a window at a
/// time first), and a flipped byte in a record's length, which makes it run far into the file,
/// is told as damage.
#[tokio::test]
async fn a_record_longer_than_a_window_is_read_back_and_a_damaged_length_is_told(
) -> Result<(), Error> {
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    let long = vec![7u8; 5 * 1024 * 1024];
    let store = JournalStore::builder(dir.path()).open()?;
    put(&store, "small", b"first").await?;
    put(&store, "long", &long).await?;
    store.close().await?;
    let again = JournalStore::builder(dir.path()).open()?;
    assert_eq!(again.get(Tree::Log, b"long").await?, Some(long));
    again.close().await?;
    // The first record's length (little-endian): its third byte flipped, it runs some
    // 16 MiB into the file, whose checksum cannot hold.
    let first = *files(dir.path())?.first().unwrap_or(&1);
    flip(dir.path(), first, 2)?;
    match JournalStore::builder(dir.path()).open() {
        Err(Error::Damaged { .. }) => Ok(()),
        other => Err(Error::backend(format!("expected damage, got {other:?}"))),
    }
}

#[tokio::test]
async fn the_next_file_is_begun_ahead_and_put_in_place() -> Result<(), Error> {
    // A spare alone: made whole, then renamed into place as a journal file of zeros.
    let bare = tempfile::tempdir().map_err(Error::backend)?;
    let spare = super::spare::Spare::begin(bare.path(), 5, SMALL)
        .ok_or_else(|| Error::backend("no spare begun: is the disk nearly full?"))?;
    let file = spare.into_journal(bare.path()).ok_or(Error::Closed)?;
    assert_eq!(file.metadata().map_err(Error::backend)?.len(), SMALL);
    assert!(!spare_path(bare.path(), 5).exists());
    let bytes = std::fs::read(journal_path(bare.path(), 5)).map_err(Error::backend)?;
    assert!(bytes.len() == SMALL as usize && bytes.iter().all(|byte| *byte == 0));

    let dir = tempfile::tempdir().map_err(Error::backend)?;
    let store = open(dir.path())?;
    let (first, _, spare) = writing(&store).ok_or(Error::Closed)?;
    assert_eq!(spare, None, "nothing is begun ahead of an empty file");
    let mut i = 0;
    put_while(&store, &mut i, |(_, len, _)| len <= SMALL / 2).await?;
    assert_eq!(
        writing(&store).and_then(|(.., spare)| spare),
        Some(first + 1)
    );
    put_while(&store, &mut i, |(id, ..)| id == first).await?;
    // The spare became the next file: renamed into place, no longer held.
    assert_eq!(
        writing(&store).map(|(id, _, spare)| (id, spare)),
        Some((first + 1, None))
    );
    assert!(!spare_path(dir.path(), first + 1).exists());
    // Half way through that one, the next is begun; closing lets it go.
    put_while(&store, &mut i, |(_, len, _)| len <= SMALL / 2).await?;
    assert_eq!(
        writing(&store).and_then(|(.., spare)| spare),
        Some(first + 2)
    );
    store.close().await?;
    assert!(!spare_path(dir.path(), first + 2).exists());
    let again = open(dir.path())?;
    assert_eq!(again.scan_prefix(Tree::Log, b"k").await?.len(), i);
    Ok(())
}

#[tokio::test]
async fn a_spare_or_a_renamed_file_of_zeros_a_crash_left_is_no_part_of_the_store(
) -> Result<(), Error> {
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    written(dir.path(), 40).await?;
    let last = files(dir.path())?.last().copied().ok_or(Error::Closed)?;
    // A crash while the next file was being begun ahead (a torn spare), and one after its
    // rename, before any record reached it (a last file of zeros).
    std::fs::write(spare_path(dir.path(), last + 2), b"torn").map_err(Error::backend)?;
    std::fs::write(journal_path(dir.path(), last + 1), vec![0; SMALL as usize])
        .map_err(Error::backend)?;
    let store = open(dir.path())?;
    assert!(!spare_path(dir.path(), last + 2).exists());
    assert_eq!(store.scan_prefix(Tree::Log, b"k").await?.len(), 40);
    put(&store, "k100", &[2; 300]).await?;
    store.close().await?;
    let again = open(dir.path())?;
    assert_eq!(again.get(Tree::Log, b"k100").await?, Some(vec![2; 300]));
    assert_eq!(again.scan_prefix(Tree::Log, b"k").await?.len(), 41);
    Ok(())
}

/// Where the writer is: the file it writes, how far, and the file it began ahead, if any.
fn writing(store: &JournalStore) -> Option<(u32, u64, Option<u32>)> {
    let guard = store.engine.writer.lock();
    guard.as_ref().map(|writer| {
        let spare = writer.spare.as_ref().map(super::spare::Spare::id);
        (writer.at.id, writer.at.len, spare)
    })
}

/// Commits `k{i}`, `k{i+1}`, … (300 bytes each) while `go_on` holds of where the writer is.
async fn put_while(
    store: &JournalStore,
    i: &mut usize,
    go_on: impl Fn((u32, u64, Option<u32>)) -> bool,
) -> Result<(), Error> {
    while writing(store).is_some_and(&go_on) {
        put(store, &format!("k{i:03}"), &[1; 300]).await?;
        *i += 1;
    }
    Ok(())
}

/// Commits past the mark were never acknowledged (the mark is made durable before any
/// committer hears): a group whose sync failed and that could not be cut off the file again
/// leaves such commits, and their committers were told they failed. The next open lets them
/// go, and the commits after that take their place; a mark with a slot it cannot read may be
/// one advance behind, so there every commit is kept.
#[tokio::test]
async fn commits_past_the_mark_were_never_acknowledged_and_are_let_go() -> Result<(), Error> {
    use crate::store::mark;
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    written(dir.path(), 3).await?;
    // The third commit's group reached the disk, its mark did not.
    mark::rewrite(dir.path(), [Some(2), Some(1)]).map_err(Error::backend)?;
    let store = open(dir.path())?;
    assert!(store.get(Tree::Log, b"k001").await?.is_some());
    assert_eq!(store.get(Tree::Log, b"k002").await?, None, "told it failed");
    put(&store, "k003", b"after").await?;
    store.close().await?;
    let store = open(dir.path())?;
    assert_eq!(store.get(Tree::Log, b"k002").await?, None);
    assert_eq!(
        store.get(Tree::Log, b"k003").await?,
        Some(b"after".to_vec())
    );
    store.close().await?;

    // One slot unreadable: the other may be one advance behind the last acknowledged commit.
    let dir = tempfile::tempdir().map_err(Error::backend)?;
    written(dir.path(), 3).await?;
    mark::rewrite(dir.path(), [None, Some(2)]).map_err(Error::backend)?;
    let store = open(dir.path())?;
    assert!(store.get(Tree::Log, b"k002").await?.is_some());
    // Served now, so the mark names it.
    assert_eq!(mark::certain(dir.path()).map_err(Error::backend)?, Some(3));
    store.close().await
}
