//! Where a fork came from: a session and one of its checkpoints. Apart from the rest of the
//! checkpoints' vocabulary (`checkpoint.rs`), which reads session records, because a session's
//! record names its origin.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::types::ids::SessionId;

/// A checkpoint of a session: the sequence number of its log entry. Stable for the life of the
/// session (no commit rewrites its log; retention removes old checkpoints, never renumbers),
/// and meaningful only with the session it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CheckpointId(pub u64);

impl fmt::Display for CheckpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for CheckpointId {
    type Err = std::num::ParseIntError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.trim().parse().map(CheckpointId)
    }
}

/// Where a fork came from: recorded in the fork's [`SessionRecord::forked_from`](crate::types::SessionRecord::forked_from).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkOrigin {
    /// The session forked.
    pub session: SessionId,
    /// Its checkpoint the fork's history ends at.
    pub checkpoint: CheckpointId,
}
