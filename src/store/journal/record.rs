//! The journal's record: one commit, framed so that a reader tells a whole record from a torn
//! or damaged one.
//!
//! `len:u32 · crc32(body):u32 · body` (little-endian), where the body is `seq:u64` followed by
//! the commit's writes, each `kind:u8 · key_len:u32 · key` and, for a put,
//! `value_len:u32 · value`. Keys are stored keys (`store::keyspace`: the tree's tag byte, then
//! the key). A record is appended whole or not at all as far as a reader can tell: a write cut
//! short leaves a record whose length runs past the end of the file, or whose checksum fails.

use crate::store::keyspace::tag;
use crate::store::{Batch, Op};

/// The bytes before a record's body: its length and its checksum.
pub(super) const HEADER: usize = 8;

const PUT: u8 = 1;
const DELETE: u8 = 2;

/// One write of a record: its stored key, and for a put where its value lies (from the start of
/// the record) and how long it is.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Write {
    pub(super) key: Vec<u8>,
    pub(super) value: Option<(u64, u32)>,
}

/// A record read back: its sequence number, its writes, and its length in the file.
#[derive(Debug)]
pub(super) struct Record {
    pub(super) seq: u64,
    pub(super) writes: Vec<Write>,
    pub(super) len: usize,
}

/// Why no record could be read where one was expected.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Unreadable {
    /// The bytes end before the record does: a write cut short (or a file cut short).
    Cut,
    /// The record is all there but does not check out: damaged, or torn by a crash.
    Bad(&'static str),
}

/// Whether a record whose body is `len` bytes can be written (its length is a `u32`).
pub(super) fn fits(len: usize) -> bool {
    u32::try_from(len).is_ok()
}

/// The length of the body of `batch`'s record.
pub(super) fn body_len(batch: &Batch) -> usize {
    batch.ops().iter().fold(8, |len, op| {
        let (Op::Put { key, .. } | Op::Delete { key, .. }) = op;
        let value = match op {
            Op::Put { value, .. } => 4 + value.len(),
            Op::Delete { .. } => 0,
        };
        len.saturating_add(1 + 4 + 1 + key.len())
            .saturating_add(value)
    })
}

/// A commit's record, encoded by its committer (so that the batch is dropped on the thread that
/// made it), numbered by the writer ([`renumber`]).
pub(super) struct Encoded {
    pub(super) bytes: Vec<u8>,
    /// Its writes, each value placed from the start of the record.
    pub(super) writes: Vec<Write>,
}

/// The record of `batch`, numbered 0 until the writer numbers it. Its [body](body_len) must
/// [fit](fits).
pub(super) fn encode(batch: &Batch) -> Encoded {
    let mut encoded = Encoded {
        bytes: Vec::with_capacity(batch.byte_len() + 64),
        writes: Vec::with_capacity(batch.ops().len()),
    };
    let start = begin(0, &mut encoded.bytes);
    for op in batch.ops() {
        let (Op::Put { tree, key, .. } | Op::Delete { tree, key }) = op;
        let value = match op {
            Op::Put { value, .. } => Some(value.as_slice()),
            Op::Delete { .. } => None,
        };
        push_write(
            &mut encoded.bytes,
            &mut encoded.writes,
            &[tag(*tree)],
            key,
            value,
        );
    }
    seal(start, &mut encoded.bytes);
    encoded
}

/// Gives the record at the start of `record` the sequence number `seq` (and its checksum again).
pub(super) fn renumber(record: &mut [u8], seq: u64) {
    record[HEADER..HEADER + 8].copy_from_slice(&seq.to_le_bytes());
    seal(0, record);
}

/// Appends one record of puts of stored keys (a compaction's copies of live entries), as of
/// commit `seq`, and where each value lies from the start of `out`. Its body must [fit](fits).
pub(super) fn encode_puts(
    seq: u64,
    entries: &[(Vec<u8>, Vec<u8>)],
    out: &mut Vec<u8>,
    placed: &mut Vec<Write>,
) {
    let start = begin(seq, out);
    for (key, value) in entries {
        push_write(out, placed, &[], key, Some(value));
    }
    seal(start, out);
}

/// The one write of a base's first record (a delete of a key no tree has): "this base ends
/// with [`BASE_END`]". A base written before there were ends has a first record without writes.
pub(super) const BASE_BEGINS: &[u8] = b"\xF1journal:base-begins";

/// The one write of a base's last record: without it, a base that announced it was cut short
/// at a record's boundary, which no record's checksum can tell.
pub(super) const BASE_END: &[u8] = b"\xF1journal:base-end";

/// Appends a record as of commit `seq` whose one write is a delete of the stored key `mark`
/// ([`BASE_BEGINS`], [`BASE_END`]): a mark read by replay, never applied.
pub(super) fn encode_mark(seq: u64, mark: &[u8], out: &mut Vec<u8>) {
    let start = begin(seq, out);
    push_write(out, &mut Vec::new(), &[], mark, None);
    seal(start, out);
}

/// Whether `record` is the mark `mark` and nothing else.
pub(super) fn is_mark(record: &Record, mark: &[u8]) -> bool {
    matches!(record.writes.as_slice(), [Write { key, value: None }] if key.as_slice() == mark)
}

/// Begins a record: room for its header, then its sequence number. Returns where it starts.
fn begin(seq: u64, out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    out.extend_from_slice(&seq.to_le_bytes());
    start
}

/// Appends a write of the stored key `prefix · key` (a put when it has a `value`).
fn push_write(
    out: &mut Vec<u8>,
    placed: &mut Vec<Write>,
    prefix: &[u8],
    key: &[u8],
    value: Option<&[u8]>,
) {
    out.push(if value.is_some() { PUT } else { DELETE });
    out.extend_from_slice(&len32(prefix.len() + key.len()).to_le_bytes());
    let mut stored = Vec::with_capacity(prefix.len() + key.len());
    stored.extend_from_slice(prefix);
    stored.extend_from_slice(key);
    out.extend_from_slice(&stored);
    let value = value.map(|value| {
        out.extend_from_slice(&len32(value.len()).to_le_bytes());
        let at = out.len() as u64;
        out.extend_from_slice(value);
        (at, len32(value.len()))
    });
    placed.push(Write { key: stored, value });
}

/// Writes the header of the record that starts at `start` (and ends where `out` does): its
/// body's length and checksum.
fn seal(start: usize, out: &mut [u8]) {
    let body = &out[start + HEADER..];
    let (len, crc) = (len32(body.len()), crc32fast::hash(body));
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
}

fn len32(len: usize) -> u32 {
    // Checked by the writer before encoding (`fits`).
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// The length in the file of the record whose header starts `bytes` (`None`: no header, or
/// one of zeros, past the last record). Read before the record, so that a window holds it all.
pub(super) fn stored_len(bytes: &[u8]) -> Option<u64> {
    let header = bytes.get(..HEADER)?;
    if header.iter().all(|&byte| byte == 0) {
        return None;
    }
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    Some(HEADER as u64 + u64::from(len))
}

/// Reads the record at the start of `bytes`; `Ok(None)` at the end of the records: `bytes` is
/// empty, or starts with a header of zeros (a record's length is never 0: its body holds its
/// sequence number).
pub(super) fn decode(bytes: &[u8]) -> Result<Option<Record>, Unreadable> {
    if bytes.iter().take(HEADER).all(|&byte| byte == 0) {
        // The zeros a journal file is made of, past its last record.
        return Ok(None);
    }
    let header = bytes.get(..HEADER).ok_or(Unreadable::Cut)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let body = bytes
        .get(HEADER..HEADER.saturating_add(len))
        .ok_or(Unreadable::Cut)?;
    if crc32fast::hash(body) != crc {
        return Err(Unreadable::Bad("its checksum does not match"));
    }
    let mut reader = Reader { body, at: 0 };
    let seq = reader.u64()?;
    let mut writes = Vec::new();
    while reader.at < body.len() {
        let kind = reader.u8()?;
        let key_len = reader.u32()? as usize;
        let key = reader.take(key_len)?.to_vec();
        let value = match kind {
            PUT => {
                let value_len = reader.u32()?;
                let at = (HEADER + reader.at) as u64;
                reader.take(value_len as usize)?;
                Some((at, value_len))
            }
            DELETE => None,
            _ => return Err(Unreadable::Bad("a write of an unknown kind")),
        };
        writes.push(Write { key, value });
    }
    Ok(Some(Record {
        seq,
        writes,
        len: HEADER + len,
    }))
}

struct Reader<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], Unreadable> {
        let end = self.at.checked_add(len);
        let bytes = end.and_then(|end| self.body.get(self.at..end));
        let bytes = bytes.ok_or(Unreadable::Bad("a write runs past the end of its record"))?;
        self.at += len;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, Unreadable> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, Unreadable> {
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn u64(&mut self) -> Result<u64, Unreadable> {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(bytes))
    }
}
