//! The store's record of what it holds, kept beside what it holds: with every sled batch, a
//! bookkeeping entry with the batch's number and a digest of every entry of the store (how
//! many, and the sum of a checksum of each). Both change in the batch that changes the
//! entries, so after any crash they agree with what sled recovered — unless sled lost part of
//! its log, which it does without a word: it stops replaying at the first bad checksum, as it
//! would at a torn tail, and skips the rest of a damaged segment. Opening the store then finds:
//!
//! * a number below the one its [mark](super::mark) says was acknowledged: the end of the log
//!   is lost ([`Damage::LostTail`]);
//! * entries whose digest is not the recorded one: some of the middle is
//!   ([`Damage::LostEntries`]).
//!
//! Keeping the digest costs a read of each written key's old value, on the flusher thread
//! (the value is almost always in sled's cache); checking it costs a scan of the whole store
//! when it is opened.

use std::collections::HashMap;

use ::sled::IVec;

use crate::store::keyspace::{meta_key, META_TAG};
use crate::store::{Damage, Error};

/// The name of the bookkeeping entry that holds the record.
const RECORD: &[u8] = b"check";

/// The checksum of one stored entry. Two CRC-32s over the entry in two orders, so that the
/// digest's sum is 64 bits wide; the key's length keeps `("ab", "c")` apart from `("a", "bc")`.
pub(super) fn entry_hash(key: &[u8], value: &[u8]) -> u64 {
    let len = (key.len() as u32).to_be_bytes();
    let mut high = crc32fast::Hasher::new();
    high.update(&len);
    high.update(key);
    high.update(value);
    let mut low = crc32fast::Hasher::new();
    low.update(value);
    low.update(key);
    low.update(&len);
    (u64::from(high.finalize()) << 32) | u64::from(low.finalize())
}

/// How many entries there are and the sum of their checksums: the same for the same entries
/// in any order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Digest {
    pub(super) entries: u64,
    sum: u64,
}

impl Digest {
    fn add(&mut self, hash: u64) {
        self.entries = self.entries.wrapping_add(1);
        self.sum = self.sum.wrapping_add(hash);
    }

    fn remove(&mut self, hash: u64) {
        self.entries = self.entries.wrapping_sub(1);
        self.sum = self.sum.wrapping_sub(hash);
    }
}

/// The record: the number of the last sled batch applied, and the digest after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Check {
    pub(super) seq: u64,
    pub(super) digest: Digest,
}

impl Check {
    /// The stored key of the record.
    pub(super) fn key() -> Vec<u8> {
        meta_key(RECORD)
    }

    pub(super) fn encode(&self) -> [u8; 24] {
        let mut bytes = [0; 24];
        bytes[..8].copy_from_slice(&self.seq.to_be_bytes());
        bytes[8..16].copy_from_slice(&self.digest.entries.to_be_bytes());
        bytes[16..].copy_from_slice(&self.digest.sum.to_be_bytes());
        bytes
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let word = |at: usize| -> Option<u64> {
            Some(u64::from_be_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        (bytes.len() == 24).then_some(())?;
        Some(Self {
            seq: word(0)?,
            digest: Digest {
                entries: word(8)?,
                sum: word(16)?,
            },
        })
    }

    /// The record after the next batch, which writes `touched` in order: each stored key with
    /// the checksum of its new value (`None`: removed). A key's value before the batch is read
    /// from `records`, or from an earlier write of the same batch.
    pub(super) fn after(
        &self,
        touched: &[(IVec, Option<u64>)],
        records: &::sled::Tree,
    ) -> Result<Self, Error> {
        let mut digest = self.digest;
        let mut written: HashMap<&[u8], Option<u64>> = HashMap::with_capacity(touched.len());
        for (key, new) in touched {
            let old = match written.get(&key[..]) {
                Some(old) => *old,
                None => records.get(key)?.map(|old| entry_hash(key, &old)),
            };
            if let Some(old) = old {
                digest.remove(old);
            }
            if let Some(new) = new {
                digest.add(*new);
            }
            written.insert(&key[..], *new);
        }
        Ok(Self {
            seq: self.seq + 1,
            digest,
        })
    }
}

/// The digest of every entry of `records` but the bookkeeping ones: a scan of the whole store.
pub(super) fn tally(records: &::sled::Tree) -> Result<Digest, Error> {
    let mut digest = Digest::default();
    for entry in records.iter() {
        let (key, value) = entry?;
        if key.first() == Some(&META_TAG) {
            continue;
        }
        digest.add(entry_hash(&key, &value));
    }
    Ok(digest)
}

/// How much of the record an opening checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Depth {
    /// The number against the mark, and every entry against the digest (a scan of the store):
    /// when the store is opened.
    Full,
    /// The number against the mark only: when a database is opened again in the same process
    /// after a failed write, whose entries were checked when the store was opened.
    Tail,
}

/// What an opening found: the record to go on from, and the damage, if any.
pub(super) struct Verified {
    pub(super) check: Check,
    pub(super) damage: Option<Damage>,
}

/// Checks `records` against its record and against `acknowledged`, the last batch the store's
/// mark says was acknowledged. A store without a record (new, or written before records were
/// kept) gets one, written unless `read_only`.
pub(super) fn verify(
    records: &::sled::Tree,
    acknowledged: u64,
    depth: Depth,
    read_only: bool,
) -> Result<Verified, Error> {
    let key = Check::key();
    let stored = records.get(&key)?;
    let Some(check) = stored.as_deref().and_then(Check::decode) else {
        let check = Check {
            seq: 0,
            digest: tally(records)?,
        };
        if acknowledged > 0 {
            return Ok(Verified {
                check,
                damage: Some(Damage::LostRecord { acknowledged }),
            });
        }
        if !read_only {
            records.insert(key, &check.encode()[..])?;
            records.flush()?;
        }
        return Ok(Verified {
            check,
            damage: None,
        });
    };
    if check.seq < acknowledged {
        return Ok(Verified {
            check,
            damage: Some(Damage::LostTail {
                acknowledged,
                recovered: check.seq,
            }),
        });
    }
    if depth == Depth::Full {
        let found = tally(records)?;
        if found != check.digest {
            return Ok(Verified {
                check,
                damage: Some(Damage::LostEntries {
                    committed: check.digest.entries,
                    found: found.entries,
                }),
            });
        }
    }
    Ok(Verified {
        check,
        damage: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

    fn records() -> Result<::sled::Tree> {
        let db = ::sled::Config::new().temporary(true).open()?;
        Ok(db.open_tree("records")?)
    }

    fn apply(
        records: &::sled::Tree,
        check: &Check,
        writes: &[(&[u8], Option<&[u8]>)],
    ) -> Result<Check> {
        let touched: Vec<(IVec, Option<u64>)> = writes
            .iter()
            .map(|(key, value)| (IVec::from(*key), value.map(|v| entry_hash(key, v))))
            .collect();
        let next = check.after(&touched, records)?;
        for (key, value) in writes {
            match value {
                Some(value) => records.insert(key, *value).map(drop),
                None => records.remove(key).map(drop),
            }?;
        }
        Ok(next)
    }

    #[test]
    fn the_digest_follows_inserts_overwrites_and_removals_in_one_batch_and_across_them() -> Result {
        let records = records()?;
        let mut check = Check::default();
        check = apply(
            &records,
            &check,
            &[(b"\x01a", Some(b"1")), (b"\x01b", Some(b"2"))],
        )?;
        // The same key twice in one batch, and a removal of a key written earlier in it.
        check = apply(
            &records,
            &check,
            &[
                (b"\x01a", Some(b"3")),
                (b"\x01a", Some(b"4")),
                (b"\x01c", Some(b"5")),
                (b"\x01c", None),
                (b"\x01z", None),
            ],
        )?;
        assert_eq!(check.seq, 2);
        assert_eq!(check.digest, tally(&records)?);
        assert_eq!(check.digest.entries, 2);
        Ok(())
    }

    #[test]
    fn a_lost_entry_a_reverted_value_and_a_lost_tail_are_each_told() -> Result {
        let records = records()?;
        let check = apply(
            &records,
            &Check::default(),
            &[(b"\x01a", Some(b"1")), (b"\x01b", Some(b"2"))],
        )?;
        records.insert(Check::key(), &check.encode()[..])?;
        let fine = verify(&records, 1, Depth::Full, false)?;
        assert_eq!(fine.damage, None);
        assert_eq!(fine.check, check);

        let tail = verify(&records, 2, Depth::Tail, false)?;
        assert_eq!(
            tail.damage,
            Some(Damage::LostTail {
                acknowledged: 2,
                recovered: 1
            })
        );

        records.insert(b"\x01b", b"old".as_slice())?;
        let reverted = verify(&records, 1, Depth::Full, false)?;
        assert_eq!(
            reverted.damage,
            Some(Damage::LostEntries {
                committed: 2,
                found: 2
            })
        );
        records.remove(b"\x01b")?;
        let lost = verify(&records, 1, Depth::Full, false)?;
        assert_eq!(
            lost.damage,
            Some(Damage::LostEntries {
                committed: 2,
                found: 1
            })
        );
        // Checking the number only does not scan.
        assert_eq!(verify(&records, 1, Depth::Tail, false)?.damage, None);
        Ok(())
    }

    #[test]
    fn a_store_without_a_record_gets_one_unless_it_acknowledged_commits() -> Result {
        let records = records()?;
        records.insert(b"\x01a", b"1".as_slice())?;
        let lost = verify(&records, 3, Depth::Full, false)?;
        assert_eq!(lost.damage, Some(Damage::LostRecord { acknowledged: 3 }));
        assert!(records.get(Check::key())?.is_none());

        let new = verify(&records, 0, Depth::Full, false)?;
        assert_eq!(new.damage, None);
        assert_eq!(new.check.digest.entries, 1);
        assert_eq!(
            records.get(Check::key())?.as_deref(),
            Some(&new.check.encode()[..])
        );
        Ok(())
    }
}
