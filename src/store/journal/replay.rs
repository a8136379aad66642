//! Replaying the store's files into an index at open: the newest base a compaction wrote, if
//! any, then every journal file it does not cover, in order, each record checked.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

use super::files::{base_files, base_path, io_error, journal_files, journal_path};
use super::index::{FileId, Index};
use super::record::{self, Unreadable};
use super::window::{Window, CHUNK};
use crate::store::{Damage, Error};

/// What replaying the store's files found.
pub(super) struct Replayed {
    pub(super) index: Index,
    /// The last commit recovered.
    pub(super) seq: u64,
    /// The last journal file, where its whole records end, and where the bytes of a torn
    /// record that may follow them end.
    pub(super) last: Option<(u32, u64, u64)>,
    /// A record that cannot be read, anywhere but at the end of the last journal file; or
    /// commits missing between two files.
    pub(super) damage: Option<Damage>,
    /// The first journal file the newest base does not cover (1 without a base).
    pub(super) first_kept: u32,
    /// The bytes of the records replayed: what the files hold, less their zeros.
    pub(super) record_bytes: u64,
    /// The last commit the mark says for certain may have been acknowledged
    /// (`mark::certain`): records past it are not replayed.
    acknowledged_end: Option<u64>,
    /// The journal file whose replay stopped at a record past `acknowledged_end`, and where.
    pub(super) past_the_mark: Option<(u32, u64)>,
}

/// Replays the store in `path`. A record that cannot be read ends its file's replay: at the
/// end of the last journal file it is a write a crash cut short (the mark tells whether it
/// was acknowledged); anywhere else it is damage, told, and to `salvage` the next files are
/// replayed still.
///
/// Records past `acknowledged_end` end the replay too: never acknowledged, they are as good
/// as a write cut short. Their committers may have been told that they failed (a group whose
/// sync failed and that could not be cut off the file again), and must not find them there
/// after a restart. They can only be the last file's last group: anywhere else, damage.
pub(super) fn replay(
    path: &Path,
    salvage: bool,
    acknowledged_end: Option<u64>,
) -> Result<Replayed, Error> {
    let io = |e| io_error(e, path);
    let base = base_files(path).map_err(io)?.last().copied();
    let mut replayed = Replayed {
        index: Index::default(),
        seq: 0,
        last: None,
        damage: None,
        first_kept: base.unwrap_or(1),
        record_bytes: 0,
        acknowledged_end,
        past_the_mark: None,
    };
    if let Some(first_kept) = base {
        let file_path = base_path(path, first_kept);
        let file = File::open(&file_path).map_err(io)?;
        let mut window = Window::new(&file).map_err(io)?;
        let mut marks = BaseMarks::default();
        let (end, unreadable) = replay_file(
            &mut replayed,
            FileId::Base(first_kept),
            &mut window,
            &mut marks,
        )
        .map_err(io)?;
        // A base is renamed into place only once it was written whole and made durable: it
        // holds no zeros after its records, nothing it cannot read, and, if it began by saying
        // so, its end last.
        let unreadable = unreadable
            .or_else(|| {
                (end < window.size()).then_some(Unreadable::Bad("zeros where a record should be"))
            })
            .or_else(|| {
                (marks.begins && !marks.ended)
                    .then_some(Unreadable::Bad("the base ends before its last record"))
            });
        if let Some(why) = unreadable {
            replayed
                .damage
                .get_or_insert_with(|| cannot_read(&file_path, end, &why));
        }
        replayed
            .index
            .add_file(FileId::Base(first_kept), Arc::new(file));
        if replayed.damage.is_some() && !salvage {
            return Ok(replayed);
        }
    }
    let ids: Vec<u32> = journal_files(path)
        .map_err(io)?
        .into_iter()
        .filter(|id| *id >= replayed.first_kept)
        .collect();
    for (n, &id) in ids.iter().enumerate() {
        let file_path = journal_path(path, id);
        let file = File::open(&file_path).map_err(io)?;
        let mut window = Window::new(&file).map_err(io)?;
        let (end, unreadable) = replay_file(
            &mut replayed,
            FileId::Journal(id),
            &mut window,
            &mut BaseMarks::default(),
        )
        .map_err(io)?;
        let is_last = n + 1 == ids.len();
        let past_the_mark = (!is_last && replayed.past_the_mark.is_some())
            .then_some(Unreadable::Bad(
            "a commit past the mark of acknowledged ones, in a journal file that is not the last",
        ));
        if let (Some(why), false) = (unreadable.or(past_the_mark), is_last) {
            replayed
                .damage
                .get_or_insert_with(|| cannot_read(&file_path, end, &why));
        }
        if replayed.damage.is_some() && !salvage {
            break;
        }
        // Past the last whole record: zeros, or the remains of a write a crash cut short.
        let torn_end = window.last_nonzero_end(end).map_err(io)?;
        replayed.index.add_file(FileId::Journal(id), Arc::new(file));
        replayed.last = Some((id, end, torn_end));
    }
    Ok(replayed)
}

/// The marks a base's records held: its first said it ends with a mark, and that mark was
/// its last record.
#[derive(Default)]
struct BaseMarks {
    begins: bool,
    ended: bool,
}

/// Whether the checksum in the header of the `len`-byte record at `at` is its body's, read a
/// window at a time.
fn checksum_holds(window: &mut Window<'_>, at: u64, len: u64) -> io::Result<bool> {
    let header = window.at(at, record::HEADER)?;
    let Some(crc) = header.get(4..8).and_then(|crc| crc.try_into().ok()) else {
        return Ok(false);
    };
    let header_len = record::HEADER as u64;
    Ok(window.crc32(at + header_len, len - header_len)? == u32::from_le_bytes(crc))
}

/// Replays the records of one file; returns where its whole records end, and why the next
/// one could not be read, if there is one. A base's marks are noted in `marks`, not applied.
fn replay_file(
    replayed: &mut Replayed,
    file: FileId,
    window: &mut Window<'_>,
    marks: &mut BaseMarks,
) -> io::Result<(u64, Option<Unreadable>)> {
    let mut at = 0;
    loop {
        let decoded = match record::stored_len(window.at(at, record::HEADER)?) {
            // Read only if the file holds it all: a damaged length reads nothing more. A long
            // one is held only once its checksum holds (a damaged length within the file
            // would otherwise hold the rest of it).
            Some(len) if len <= window.size() - at => {
                if len > CHUNK as u64 && !checksum_holds(window, at, len)? {
                    Err(Unreadable::Bad("its checksum does not match"))
                } else {
                    record::decode(window.at(at, len as usize)?)
                }
            }
            Some(_) => Err(Unreadable::Cut),
            None => record::decode(window.at(at, record::HEADER)?),
        };
        match decoded {
            Ok(None) => return Ok((at, None)),
            Ok(Some(_)) if marks.ended => {
                return Ok((at, Some(Unreadable::Bad("a record after the base's end"))));
            }
            Ok(Some(mut record)) => {
                if let FileId::Base(_) = file {
                    if at == 0 && record::is_mark(&record, record::BASE_BEGINS) {
                        marks.begins = true;
                        record.writes.clear();
                    } else if marks.begins && record::is_mark(&record, record::BASE_END) {
                        marks.ended = true;
                        record.writes.clear();
                    }
                }
                if let FileId::Journal(id) = file {
                    if replayed
                        .acknowledged_end
                        .is_some_and(|end| record.seq > end)
                    {
                        replayed.past_the_mark = Some((id, at));
                        return Ok((at, None));
                    }
                    // Commits are numbered one after another from 1, across files and from
                    // the commit a base stands at: a gap is commits lost (the end of an
                    // earlier file, a whole file, the base).
                    if replayed.seq.checked_add(1) != Some(record.seq) {
                        replayed.damage.get_or_insert_with(|| Damage::Unreadable {
                            reason: format!(
                                "journal file {id:08} goes on at commit {} after commit {}: the commits between are lost",
                                record.seq, replayed.seq
                            ),
                        });
                    }
                }
                replayed.seq = replayed.seq.max(record.seq);
                replayed.index.apply(file, at, record.writes);
                replayed.record_bytes += record.len as u64;
                at += record.len as u64;
            }
            Err(why) => return Ok((at, Some(why))),
        }
    }
}

fn cannot_read(file: &Path, at: u64, why: &Unreadable) -> Damage {
    let why = match why {
        Unreadable::Cut => "it ends in the middle of a record",
        Unreadable::Bad(why) => why,
    };
    Damage::Unreadable {
        reason: format!(
            "{} has a record it cannot read at byte {at} ({why})",
            file.display()
        ),
    }
}
