//! How a logical value is kept in sled: behind a header byte, and past [`PIECE`] bytes in
//! pieces under keys of their own, with a manifest at the value's own key.
//!
//! Why pieces: sled 0.34 writes any log message larger than about a quarter of its 512 KiB
//! segment to a separate "blob" file, and a tree node is such a message whenever sled
//! rewrites it whole. A leaf holds up to 17 entries, so a few values of 16 KiB already make a
//! node a blob. And a blob write that fails (a full disk) leaves its log buffer with a writer
//! that never leaves: every later flush of that database, and its drop, waits forever (issue
//! 30: the server hung on a full disk with 16 KiB messages). With no value over 4 KiB, a node
//! stays under ~70 KiB and sled never writes a blob; a larger value costs one key per 4 KiB.
//!
//! A stored value is `[INLINE] value` or `[PIECED] len:u64 pieces:u32`; piece `i` of the value
//! at stored key `k` is at `[PIECES] len(k):u16 k i:u32` (big-endian), so the pieces of one
//! value are one contiguous range that no other value's pieces interleave with.

use ::sled::IVec;

use crate::store::Error;

/// The largest value stored whole; larger ones are cut into pieces of this size.
pub(super) const PIECE: usize = 4 * 1024;

/// Header of a value stored whole.
const INLINE: u8 = 0;
/// Header of a manifest: the value is in pieces.
const PIECED: u8 = 1;

/// The tag byte of the piece keys (apart from every logical tree's tag).
pub(super) const PIECES_TAG: u8 = 0xF0;

/// A logical value in sled's terms: what goes at its own key, and its pieces, if any.
pub(super) struct Encoded {
    pub(super) head: IVec,
    /// `(piece key, piece)`, in order.
    pub(super) pieces: Vec<(IVec, IVec)>,
}

/// Encodes `value`, stored at `key`.
pub(super) fn encode(key: &[u8], value: &[u8]) -> Encoded {
    if value.len() <= PIECE {
        let mut head = Vec::with_capacity(value.len() + 1);
        head.push(INLINE);
        head.extend_from_slice(value);
        return Encoded {
            head: head.into(),
            pieces: Vec::new(),
        };
    }
    let pieces: Vec<(IVec, IVec)> = value
        .chunks(PIECE)
        .enumerate()
        .map(|(index, piece)| (piece_key(key, index as u32), IVec::from(piece)))
        .collect();
    let mut head = Vec::with_capacity(13);
    head.push(PIECED);
    head.extend_from_slice(&(value.len() as u64).to_be_bytes());
    head.extend_from_slice(&(pieces.len() as u32).to_be_bytes());
    Encoded {
        head: head.into(),
        pieces,
    }
}

/// How many pieces the stored value `head` has (0 for a value stored whole).
pub(super) fn pieces_of(head: &[u8]) -> u32 {
    match head {
        [PIECED, rest @ ..] if rest.len() >= 12 => {
            u32::from_be_bytes([rest[8], rest[9], rest[10], rest[11]])
        }
        _ => 0,
    }
}

/// The key of piece `index` of the value at stored key `key`.
pub(super) fn piece_key(key: &[u8], index: u32) -> IVec {
    let mut piece = Vec::with_capacity(key.len() + 7);
    piece.push(PIECES_TAG);
    piece.extend_from_slice(&(key.len() as u16).to_be_bytes());
    piece.extend_from_slice(key);
    piece.extend_from_slice(&index.to_be_bytes());
    piece.into()
}

/// The stored key whose value a piece key belongs to.
pub(super) fn owner_of_piece(piece: &[u8]) -> Option<&[u8]> {
    let rest = piece.strip_prefix(&[PIECES_TAG])?;
    let len = usize::from(u16::from_be_bytes([*rest.first()?, *rest.get(1)?]));
    rest.get(2..2 + len)
}

/// The logical value of the stored value `head` at stored key `key`, reading its pieces from
/// `records` if it has any.
pub(super) fn decode(records: &::sled::Tree, key: &[u8], head: &[u8]) -> Result<Vec<u8>, Error> {
    match head {
        [INLINE, value @ ..] => Ok(value.to_vec()),
        [PIECED, rest @ ..] if rest.len() >= 12 => {
            let len = u64::from_be_bytes(rest[..8].try_into().unwrap_or_default());
            let count = pieces_of(head);
            let mut value = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
            let range = piece_key(key, 0)..piece_key(key, count);
            let mut seen = 0;
            for piece in records.range(range) {
                let (_, piece) = piece?;
                value.extend_from_slice(&piece);
                seen += 1;
            }
            if seen != count || value.len() as u64 != len {
                return Err(damaged(key, "a value's pieces are missing"));
            }
            Ok(value)
        }
        _ => Err(damaged(key, "a stored value has no header")),
    }
}

fn damaged(key: &[u8], what: &str) -> Error {
    Error::backend(format!(
        "{what} (stored key {:?}): the store is damaged",
        String::from_utf8_lossy(key)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_value_is_stored_whole_and_a_large_one_in_pieces_of_its_own_range() {
        let small = encode(b"\x02k", b"hello");
        assert_eq!(&small.head[..], b"\x00hello");
        assert!(small.pieces.is_empty());
        assert_eq!(pieces_of(&small.head), 0);

        let big = vec![7u8; 3 * PIECE + 1];
        let encoded = encode(b"\x02k", &big);
        assert_eq!(encoded.pieces.len(), 4);
        assert_eq!(pieces_of(&encoded.head), 4);
        // The pieces of `k` are not among those of `k2`, and sort in order.
        for (index, (key, _)) in encoded.pieces.iter().enumerate() {
            assert_eq!(owner_of_piece(key), Some(&b"\x02k"[..]));
            assert_eq!(key, &piece_key(b"\x02k", index as u32));
        }
        assert!(piece_key(b"\x02k", u32::MAX) < piece_key(b"\x02k2", 0));
    }
}
