//! What a damaged store lost: the reason a store refuses to open ([`Error::Damaged`]).
//!
//! A store acknowledges a commit once it is durable. When its files are later damaged (a
//! flipped bit, a file cut short, a disk that lies), the storage engine may recover less than
//! it acknowledged without a word: sled, for one, stops replaying its log at the first bad
//! checksum, as it would at the torn tail of a crash. A store that can tell refuses to open
//! rather than serve what is left as if it were everything; opening it to salvage
//! ([`SledStoreBuilder::salvage`](crate::store::SledStoreBuilder::salvage)) shows what is
//! left, read-only.

use std::fmt;

#[cfg(doc)]
use super::Error;

/// What a damaged store lost, as far as it can tell.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Damage {
    /// The store recovered fewer groups of commits than it had acknowledged: the end of its
    /// log is gone (every commit after group `recovered`).
    LostTail {
        /// The last group the store acknowledged (from its mark, kept outside the log).
        acknowledged: u64,
        /// The last group it recovered.
        recovered: u64,
    },
    /// Entries the store holds are not those it committed: some are missing, or older than
    /// what was acknowledged (the middle of the log was lost).
    LostEntries {
        /// How many entries the store committed.
        committed: u64,
        /// How many it holds.
        found: u64,
    },
    /// The record of what the store committed is itself gone, although it had acknowledged
    /// commits.
    LostRecord {
        /// The last group the store acknowledged.
        acknowledged: u64,
    },
    /// The store's files cannot be read at all: the storage engine refused them.
    Unreadable {
        /// The engine's own words.
        reason: String,
    },
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Damage::LostTail {
                acknowledged,
                recovered,
            } => write!(
                f,
                "it acknowledged commits up to group {acknowledged} but recovered only up to group {recovered}: the end of its log is lost"
            ),
            Damage::LostEntries { committed, found } => {
                if committed == found {
                    write!(
                        f,
                        "{found} entries are there, as committed, but some of them are not what was committed: the middle of its log is lost"
                    )
                } else {
                    write!(
                        f,
                        "it committed {committed} entries and holds {found}: the middle of its log is lost"
                    )
                }
            }
            Damage::LostRecord { acknowledged } => write!(
                f,
                "it acknowledged commits up to group {acknowledged}, but the record of what it committed is gone"
            ),
            Damage::Unreadable { reason } => write!(f, "its files cannot be read ({reason})"),
        }
    }
}
