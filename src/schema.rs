//! The stored form: which key holds what, and how values are encoded.
//!
//! Every value starts with a one-byte format version followed by MessagePack with named
//! fields, so fields can be added (with serde defaults) without a migration, and a value
//! written by a newer version is refused with a typed error rather than misread.
//!
//! Keys of per-session entries are `len (u16 BE) · session id · seq (u64 BE)`, so a session's
//! entries are one contiguous, ordered prefix.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::ids::SessionId;
use crate::message::Message;
use crate::session::{RunRecord, SessionRecord};
use crate::store::{Batch, CommitKind, Store, Tree};
use crate::stream::Chunk;

/// The format version written into every stored value.
pub const FORMAT_VERSION: u8 = 1;

/// Why a stored value could not be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bytes do not decode.
    #[error("session {session}: corrupt {tree} entry: {reason}")]
    Corrupt {
        /// The session.
        session: SessionId,
        /// The tree.
        tree: &'static str,
        /// The decoder's complaint.
        reason: String,
    },
    /// The value was written by a newer format.
    #[error("session {session}: {tree} entry has format version {found}, this build reads up to {FORMAT_VERSION}")]
    UnsupportedVersion {
        /// The session.
        session: SessionId,
        /// The tree.
        tree: &'static str,
        /// The version found.
        found: u8,
    },
    /// A value could not be encoded (a bug: every stored type is serializable).
    #[error("encoding a {tree} entry failed: {reason}")]
    Encode {
        /// The tree.
        tree: &'static str,
        /// The encoder's complaint.
        reason: String,
    },
    /// The store failed while reading.
    #[error("store: {0}")]
    Store(#[from] crate::store::Error),
}

pub(crate) fn encode<T: Serialize>(tree: Tree, value: &T) -> Result<Vec<u8>, Error> {
    let mut bytes = vec![FORMAT_VERSION];
    rmp_serde::encode::write_named(&mut bytes, value).map_err(|error| Error::Encode {
        tree: tree.name(),
        reason: error.to_string(),
    })?;
    Ok(bytes)
}

pub(crate) fn decode<T: DeserializeOwned>(
    session: &SessionId,
    tree: Tree,
    bytes: &[u8],
) -> Result<T, Error> {
    match bytes.split_first() {
        Some((&FORMAT_VERSION, body)) => {
            rmp_serde::from_slice(body).map_err(|error| Error::Corrupt {
                session: session.clone(),
                tree: tree.name(),
                reason: error.to_string(),
            })
        }
        Some((&found, _)) if found > FORMAT_VERSION => Err(Error::UnsupportedVersion {
            session: session.clone(),
            tree: tree.name(),
            found,
        }),
        Some((&found, _)) => Err(Error::Corrupt {
            session: session.clone(),
            tree: tree.name(),
            reason: format!("unknown format version {found}"),
        }),
        None => Err(Error::Corrupt {
            session: session.clone(),
            tree: tree.name(),
            reason: "empty value".into(),
        }),
    }
}

/// The key prefix of every per-session entry of `session`.
pub(crate) fn prefix(session: &SessionId) -> Vec<u8> {
    let id = session.as_str().as_bytes();
    let mut key = Vec::with_capacity(2 + id.len() + 8);
    // Ids are at most MAX_SESSION_ID_LEN (512) bytes, so the length fits in a u16.
    key.extend_from_slice(&u16::try_from(id.len()).unwrap_or(u16::MAX).to_be_bytes());
    key.extend_from_slice(id);
    key
}

/// The key of entry `seq` of `session`.
pub(crate) fn seq_key(session: &SessionId, seq: u64) -> Vec<u8> {
    let mut key = prefix(session);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

fn session_key(session: &SessionId) -> Vec<u8> {
    session.as_str().as_bytes().to_vec()
}

/// The writes of one step of a session, before encoding.
#[derive(Clone, Debug)]
pub(crate) struct Commit {
    pub(crate) kind: CommitKind,
    pub(crate) record: SessionRecord,
    pub(crate) messages: Vec<(u64, Message)>,
    pub(crate) runs: Vec<RunRecord>,
    pub(crate) chunks: Vec<Chunk>,
}

impl Commit {
    /// Encodes the commit as one store batch.
    pub(crate) fn encode(&self) -> Result<Batch, Error> {
        let id = &self.record.id;
        let mut batch = Batch::new(self.kind);
        batch.put(
            Tree::Sessions,
            session_key(id),
            encode(Tree::Sessions, &self.record)?,
        );
        for (seq, message) in &self.messages {
            batch.put(
                Tree::Messages,
                seq_key(id, *seq),
                encode(Tree::Messages, message)?,
            );
        }
        for run in &self.runs {
            batch.put(
                Tree::Runs,
                seq_key(id, u64::from(run.turn)),
                encode(Tree::Runs, run)?,
            );
        }
        for chunk in &self.chunks {
            batch.put(
                Tree::Stream,
                seq_key(id, chunk.seq),
                encode(Tree::Stream, chunk)?,
            );
        }
        Ok(batch)
    }
}

/// Reads a session's snapshot.
pub(crate) fn load_record(
    store: &dyn Store,
    session: &SessionId,
) -> Result<Option<SessionRecord>, Error> {
    store
        .get(Tree::Sessions, &session_key(session))?
        .map(|bytes| decode(session, Tree::Sessions, &bytes))
        .transpose()
}

fn load_all<T: DeserializeOwned>(
    store: &dyn Store,
    session: &SessionId,
    tree: Tree,
) -> Result<Vec<T>, Error> {
    store
        .scan_prefix(tree, &prefix(session))?
        .iter()
        .map(|(_, bytes)| decode(session, tree, bytes))
        .collect()
}

/// Every stored session id, in key order.
pub(crate) fn list_sessions(store: &dyn Store) -> Result<Vec<SessionId>, Error> {
    store
        .scan_prefix(Tree::Sessions, &[])?
        .into_iter()
        .map(|(key, _)| {
            let text = String::from_utf8_lossy(&key).into_owned();
            text.parse().map_err(|error: crate::ids::InvalidId| Error::Corrupt {
                session: SessionId::generate(),
                tree: Tree::Sessions.name(),
                reason: format!("stored key {text:?} is not a session id: {error}"),
            })
        })
        .collect()
}

/// Reads a session's messages in order.
pub(crate) fn load_messages(store: &dyn Store, session: &SessionId) -> Result<Vec<Message>, Error> {
    load_all(store, session, Tree::Messages)
}

/// Reads a session's run records in turn order.
pub(crate) fn load_runs(store: &dyn Store, session: &SessionId) -> Result<Vec<RunRecord>, Error> {
    load_all(store, session, Tree::Runs)
}

/// Reads one run record.
pub(crate) fn load_run(
    store: &dyn Store,
    session: &SessionId,
    turn: u32,
) -> Result<Option<RunRecord>, Error> {
    store
        .get(Tree::Runs, &seq_key(session, u64::from(turn)))?
        .map(|bytes| decode(session, Tree::Runs, &bytes))
        .transpose()
}

/// Reads a session's stream chunks from sequence number `from` on.
pub(crate) fn load_chunks(
    store: &dyn Store,
    session: &SessionId,
    from: u64,
) -> Result<Vec<Chunk>, Error> {
    let start = seq_key(session, from);
    let end = seq_key(session, u64::MAX);
    // A stream never reaches u64::MAX chunks, so an exclusive end there loses nothing.
    store
        .scan_range(Tree::Stream, &start, &end, usize::MAX)?
        .iter()
        .map(|(_, bytes)| decode(session, Tree::Stream, bytes))
        .collect()
}
