//! The stored form: which key holds what, and how values are encoded.
//!
//! Every value that holds data starts with a one-byte format version followed by MessagePack
//! (with named fields, for records), so fields can be added (with serde defaults) without a
//! migration, and a value written by a newer version is refused with a typed error rather than
//! misread. The deadline index's values are empty (its key is the entry), and keys carry no
//! version: their byte layouts are fixed.
//!
//! Keys of per-session entries start with `len (u16 BE) · session id`, so a session's entries
//! are one contiguous, ordered prefix.
//!
//! What a commit appends to a session (its messages, its run record when the run changed, its
//! stream chunks, and the session's record after the commit) is **one** entry of the `log`
//! tree, not one entry each: sled applies a batch key by key, so the number of keys, not their
//! bytes, is what a commit costs (a suspension cycle went from 28 key writes to 15 with this
//! layout, then to 12 once the record moved into the entry, and to 11 once tombstones lost
//! their expiry index). The entry's key is
//! `prefix · chunk end (u64 BE) · log seq (u64 BE)`: the log seq orders entries in commit
//! order, and the chunk end (the session's chunk count after the commit) comes first so that
//! the entries holding chunks from `n` on are a range scan starting at `n + 1`; since neither
//! ever decreases, the last entry of the prefix is the newest. The value is four
//! length-prefixed MessagePack sections (messages, runs, chunks, record), so a reader that
//! wants only one skips the rest without decoding it.
//!
//! The `sessions` tree holds the record as of the session's first commit and is not rewritten:
//! it says the session exists and where it sits in its tree (root, parent), which never
//! change. The current record is read from the newest log entry.

pub(crate) mod history;
mod ownership;
mod stored_message;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::remote::{Owner, RemoteOwner};
use crate::store::{Batch, CommitKind, Entry, Store, Tree};
use crate::types::ids::SessionId;
use crate::types::message::Message;
use crate::types::record::{ChildCall, Companion, PendingCall, RunRecord, SessionRecord};
use crate::types::stream::Chunk;

/// The format version written at the start of every stored value that holds data (the
/// deadline index's values are empty). Version 2 stores a log entry's
/// messages externally tagged (see `stored_message`); every other value is unchanged since
/// version 1.
pub const FORMAT_VERSION: u8 = 2;

/// The oldest format version this build reads.
const OLDEST_FORMAT_VERSION: u8 = 1;

/// Why a stored value could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    Store(crate::store::Error),
}

// Part of the message, so not also its `source` (a reporter would print it twice).
impl From<crate::store::Error> for Error {
    fn from(error: crate::store::Error) -> Self {
        Error::Store(error)
    }
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
        Some((&found, body)) if (OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&found) => {
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

/// The key of the log entry `log_seq` of `session`, whose chunks end (exclusive) at
/// `chunk_end`.
pub(crate) fn log_key(session: &SessionId, chunk_end: u64, log_seq: u64) -> Vec<u8> {
    let mut key = prefix(session);
    key.extend_from_slice(&chunk_end.to_be_bytes());
    key.extend_from_slice(&log_seq.to_be_bytes());
    key
}

fn session_key(session: &SessionId) -> Vec<u8> {
    session.as_str().as_bytes().to_vec()
}

/// The key of pending call `call` of `session` (and of ownership and tombstone entries, with
/// the root as `session`).
pub(crate) fn call_key(session: &SessionId, call: &str) -> Vec<u8> {
    let mut key = prefix(session);
    key.extend_from_slice(call.as_bytes());
    key
}

/// `at` (u64 BE) followed by [`call_key`]: ordered by time.
pub(crate) fn timed_key(at: u64, session: &SessionId, call: &str) -> Vec<u8> {
    let mut key = at.to_be_bytes().to_vec();
    key.extend_from_slice(&call_key(session, call));
    key
}

/// The key of the deadline-index entry of `call` of `session`, armed for `at` (ms): the
/// deadline (u64 BE) first, so the index is ordered by time. Public for tools and benches that
/// build or inspect the index directly.
pub fn deadline_key(at: u64, session: &SessionId, call: &str) -> Vec<u8> {
    timed_key(at, session, call)
}

/// Splits a [`call_key`] back into its session and call.
fn split_call_key(key: &[u8]) -> Option<(SessionId, String)> {
    let (len, rest) = key.split_first_chunk::<2>()?;
    let len = usize::from(u16::from_be_bytes(*len));
    let id = std::str::from_utf8(rest.get(..len)?).ok()?.parse().ok()?;
    let call = String::from_utf8(rest.get(len..)?.to_vec()).ok()?;
    Some((id, call))
}

/// Splits a timed key back into its time, session and call.
fn split_timed_key(key: &[u8]) -> Option<(u64, SessionId, String)> {
    let (at, rest) = key.split_first_chunk::<8>()?;
    let (session, call) = split_call_key(rest)?;
    Some((u64::from_be_bytes(*at), session, call))
}

/// A write to one of the per-call indexes, beside the session's own entries.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum IndexWrite {
    /// Store a pending call of this session.
    PutPending(PendingCall),
    /// Remove a pending call of this session.
    DeletePending(String),
    /// Arm a deadline for a call of this session.
    PutDeadline { at: u64, call: String },
    /// Disarm a deadline.
    DeleteDeadline { at: u64, call: String },
    /// Record on the root that this session owns the call (only for a call of a sub-agent:
    /// a root's own pending entry stands for its ownership).
    PutOwnership { root: SessionId, call: String },
    /// Clear `owner`'s ownership entry of the call on the root (`owner`: this session, or
    /// the remote child whose tree owned it).
    DeleteOwnership {
        root: SessionId,
        call: String,
        owner: SessionId,
    },
    /// Record on the root that a remote child's tree owns the call (written by the session
    /// that holds the remote child).
    PutRemoteOwnership {
        root: SessionId,
        owner: Box<crate::remote::RemoteOwner>,
    },
    /// Leave a tombstone on the root for a completed call.
    PutTombstone {
        root: SessionId,
        call: String,
        at: u64,
    },
    /// Store a sub-agent call's child entry of this session.
    PutChild(ChildCall),
    /// Remove a sub-agent call's child entry of this session.
    DeleteChild(String),
    /// Store a persistent sub-agent of this session.
    PutCompanion(Companion),
    /// Record a remote child to stop once its server answers.
    PutOrphan(crate::remote::RemoteOrphan),
}

/// The writes of one step of a session, before encoding.
#[derive(Clone, Debug)]
pub(crate) struct Commit {
    pub(crate) kind: CommitKind,
    pub(crate) session: SessionId,
    /// The root of the session's tree: on a store several nodes share, the commit is written
    /// only while this node holds the tree's lease.
    pub(crate) tree: SessionId,
    /// The new snapshot; `None` for commits that touch only per-call entries (a submit), so
    /// they never race the session's own writes.
    pub(crate) record: Option<SessionRecord>,
    /// The sequence number of this commit's log entry (used only if it appends anything).
    pub(crate) log_seq: u64,
    pub(crate) messages: Vec<(u64, Message)>,
    pub(crate) runs: Vec<RunRecord>,
    pub(crate) chunks: Vec<Chunk>,
    pub(crate) index: Vec<IndexWrite>,
}

impl Commit {
    /// Encodes the commit as one store batch.
    pub(crate) fn encode(&self) -> Result<Batch, Error> {
        let id = &self.session;
        let mut batch = Batch::new(self.kind)
            .for_session(self.tree.shared())
            .written_by(id.shared());
        match &self.record {
            Some(record) => {
                // Every commit's log entry carries the whole record; the session's first
                // commit also writes the snapshot, read later only for its lineage.
                if self.log_seq == 0 {
                    batch.put(
                        Tree::Sessions,
                        session_key(id),
                        encode(Tree::Sessions, record)?,
                    );
                }
                batch.put(
                    Tree::Log,
                    log_key(id, record.chunk_count, self.log_seq),
                    encode_log(&self.messages, &self.runs, &self.chunks, record)?,
                );
            }
            None if !(self.messages.is_empty()
                && self.runs.is_empty()
                && self.chunks.is_empty()) =>
            {
                return Err(Error::Encode {
                    tree: Tree::Log.name(),
                    reason: "a commit that appends to the log must carry the snapshot".into(),
                });
            }
            None => {}
        }
        for write in &self.index {
            match write {
                IndexWrite::PutPending(call) => batch.put(
                    Tree::Pending,
                    call_key(id, &call.tool_call_id),
                    encode(Tree::Pending, call)?,
                ),
                IndexWrite::DeletePending(call) => batch.delete(Tree::Pending, call_key(id, call)),
                IndexWrite::PutChild(child) => batch.put(
                    Tree::Children,
                    call_key(id, &child.tool_call_id),
                    encode(Tree::Children, child)?,
                ),
                IndexWrite::DeleteChild(call) => {
                    batch.delete(Tree::Children, call_key(id, call));
                }
                IndexWrite::PutCompanion(companion) => batch.put(
                    Tree::Companions,
                    call_key(id, &companion.name),
                    encode(Tree::Companions, companion)?,
                ),
                IndexWrite::PutDeadline { at, call } => {
                    batch.put(Tree::Deadlines, timed_key(*at, id, call), Vec::new());
                }
                IndexWrite::DeleteDeadline { at, call } => {
                    batch.delete(Tree::Deadlines, timed_key(*at, id, call));
                }
                IndexWrite::PutOwnership { root, call } => batch.put(
                    Tree::Ownership,
                    ownership::key(root, call, id),
                    encode(Tree::Ownership, id)?,
                ),
                IndexWrite::DeleteOwnership { root, call, owner } => {
                    batch.delete(Tree::Ownership, ownership::key(root, call, owner));
                }
                IndexWrite::PutRemoteOwnership { root, owner } => batch.put(
                    Tree::Ownership,
                    ownership::key(root, &owner.call.tool_call_id, &owner.remote_root),
                    encode(Tree::Ownership, &Owner::Remote(owner.clone()))?,
                ),
                IndexWrite::PutTombstone { root, call, at } => batch.put(
                    Tree::Tombstones,
                    call_key(root, call),
                    encode(Tree::Tombstones, at)?,
                ),
                IndexWrite::PutOrphan(orphan) => put_orphan(&mut batch, orphan)?,
            }
        }
        Ok(batch)
    }
}

/// Reads a session's record: the one carried by its newest log entry, or the snapshot of its
/// first commit if no log entry carries one. The log is read first: the first commit writes
/// the snapshot and a log entry together, so a session with an entry exists, and the usual
/// load costs one read.
pub(crate) async fn load_record(
    store: &dyn Store,
    session: &SessionId,
) -> Result<Option<SessionRecord>, Error> {
    for (_, bytes) in store
        .scan_prefix_rev(Tree::Log, &prefix(session), 1)
        .await?
    {
        let records: Vec<SessionRecord> = decode_section(session, &bytes, Section::Record)?;
        if let Some(record) = records.into_iter().next_back() {
            return Ok(Some(record));
        }
    }
    store
        .get(Tree::Sessions, &session_key(session))
        .await?
        .map(|bytes| decode(session, Tree::Sessions, &bytes))
        .transpose()
}

/// Where a session sits in its tree. Never changes after the session's first commit, so it
/// is read from the snapshot alone (one key, no log scan).
#[derive(Debug, serde::Deserialize)]
pub(crate) struct Lineage {
    /// The root of its tree (itself for a root).
    pub(crate) root: SessionId,
    /// Its parent, for a sub-agent.
    pub(crate) parent: Option<SessionId>,
    /// For a remote sub-agent: its parent and root on the server that started it.
    #[serde(default)]
    pub(crate) remote_parent: Option<crate::remote::RemoteParent>,
    /// The agent it runs.
    #[serde(default)]
    pub(crate) agent: String,
}

/// Reads a session's [`Lineage`], if the session exists.
pub(crate) async fn load_lineage(
    store: &dyn Store,
    session: &SessionId,
) -> Result<Option<Lineage>, Error> {
    store
        .get(Tree::Sessions, &session_key(session))
        .await?
        .map(|bytes| decode(session, Tree::Sessions, &bytes))
        .transpose()
}

/// The root of `session`'s tree (the name of the lease that owns it): itself for a root or a
/// session not written yet.
pub(crate) async fn tree_root(store: &dyn Store, session: &SessionId) -> Result<SessionId, Error> {
    Ok(load_lineage(store, session)
        .await?
        .map_or_else(|| session.clone(), |lineage| lineage.root))
}

async fn load_all<T: DeserializeOwned>(
    store: &dyn Store,
    session: &SessionId,
    tree: Tree,
) -> Result<Vec<T>, Error> {
    store
        .scan_prefix(tree, &prefix(session))
        .await?
        .iter()
        .map(|(_, bytes)| decode(session, tree, bytes))
        .collect()
}

/// Every stored session id, in key order.
pub(crate) async fn list_sessions(store: &dyn Store) -> Result<Vec<SessionId>, Error> {
    store
        .scan_prefix(Tree::Sessions, &[])
        .await?
        .into_iter()
        .map(|(key, _)| {
            let text = String::from_utf8_lossy(&key).into_owned();
            text.parse()
                .map_err(|error: crate::types::ids::InvalidId| Error::Corrupt {
                    session: SessionId::generate(),
                    tree: Tree::Sessions.name(),
                    reason: format!("stored key {text:?} is not a session id: {error}"),
                })
        })
        .collect()
}

/// Encodes a log entry: the format version, then the messages, runs, chunks and record
/// sections, each a u32 (BE) length followed by MessagePack.
fn encode_log(
    messages: &[(u64, Message)],
    runs: &[RunRecord],
    chunks: &[Chunk],
    record: &SessionRecord,
) -> Result<Vec<u8>, Error> {
    let mut bytes = Vec::with_capacity(512);
    bytes.push(FORMAT_VERSION);
    encode_section(&mut bytes, &stored_message::Entries(messages))?;
    encode_section(&mut bytes, runs)?;
    encode_section(&mut bytes, chunks)?;
    encode_section(&mut bytes, std::slice::from_ref(record))?;
    Ok(bytes)
}

fn encode_section<T: Serialize + ?Sized>(bytes: &mut Vec<u8>, items: &T) -> Result<(), Error> {
    let at = bytes.len();
    bytes.extend_from_slice(&[0; 4]);
    rmp_serde::encode::write_named(bytes, items).map_err(|error| Error::Encode {
        tree: Tree::Log.name(),
        reason: error.to_string(),
    })?;
    let len = u32::try_from(bytes.len() - at - 4).map_err(|_| Error::Encode {
        tree: Tree::Log.name(),
        reason: "a log section over 4 GiB".into(),
    })?;
    bytes[at..at + 4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

/// Which section of a log entry to read.
#[derive(Clone, Copy)]
enum Section {
    Messages = 0,
    Runs = 1,
    Chunks = 2,
    /// The session's record as of the commit (one item).
    Record = 3,
}

/// Finds one section of a log entry without decoding any: the entry's format version and the
/// section's MessagePack body, `None` if the entry predates the section (only the record
/// section may be absent; the first three may not).
fn find_section<'b>(
    session: &SessionId,
    bytes: &'b [u8],
    section: Section,
) -> Result<(u8, Option<&'b [u8]>), Error> {
    let corrupt = |reason: String| Error::Corrupt {
        session: session.clone(),
        tree: Tree::Log.name(),
        reason,
    };
    let (version, mut rest) = match bytes.split_first() {
        Some((&found, rest)) if (OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&found) => {
            (found, rest)
        }
        Some((&found, _)) if found > FORMAT_VERSION => {
            return Err(Error::UnsupportedVersion {
                session: session.clone(),
                tree: Tree::Log.name(),
                found,
            })
        }
        Some((&found, _)) => return Err(corrupt(format!("unknown format version {found}"))),
        None => return Err(corrupt("empty value".into())),
    };
    for index in 0..=section as usize {
        if rest.is_empty() && index > Section::Chunks as usize {
            return Ok((version, None));
        }
        let (len, after) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| corrupt(format!("section {index} has no length")))?;
        let len = usize::try_from(u32::from_be_bytes(*len)).unwrap_or(usize::MAX);
        let body = after
            .get(..len)
            .ok_or_else(|| corrupt(format!("section {index} is cut short")))?;
        if index == section as usize {
            return Ok((version, Some(body)));
        }
        rest = &after[len..];
    }
    Ok((version, None))
}

/// A log entry up to its record section (its version byte and its first three sections), to
/// which a copy appends a record of its own.
fn before_record<'b>(session: &SessionId, bytes: &'b [u8]) -> Result<&'b [u8], Error> {
    let mut at = 1;
    for index in 0..Section::Record as usize {
        let len = bytes
            .get(at..at + 4)
            .and_then(|len| <[u8; 4]>::try_from(len).ok())
            .ok_or_else(|| Error::Corrupt {
                session: session.clone(),
                tree: Tree::Log.name(),
                reason: format!("section {index} has no length"),
            })?;
        at += 4 + usize::try_from(u32::from_be_bytes(len)).unwrap_or(usize::MAX);
    }
    bytes.get(..at).ok_or_else(|| Error::Corrupt {
        session: session.clone(),
        tree: Tree::Log.name(),
        reason: "a section is cut short".into(),
    })
}

/// Decodes one section of a log entry without decoding the others; an absent section is
/// empty.
fn decode_section<T: DeserializeOwned>(
    session: &SessionId,
    bytes: &[u8],
    section: Section,
) -> Result<Vec<T>, Error> {
    match find_section(session, bytes, section)? {
        (_, Some(body)) => rmp_serde::from_slice(body).map_err(|error| corrupt_log(session, error)),
        (_, None) => Ok(Vec::new()),
    }
}

/// Decodes the messages section of a log entry, in the stored form of the entry's version.
fn decode_messages(session: &SessionId, bytes: &[u8]) -> Result<Vec<(u64, Message)>, Error> {
    match find_section(session, bytes, Section::Messages)? {
        (version, Some(body)) => stored_message::decode_entries(version, body)
            .map_err(|error| corrupt_log(session, error)),
        (_, None) => Ok(Vec::new()),
    }
}

fn corrupt_log(session: &SessionId, error: rmp_serde::decode::Error) -> Error {
    Error::Corrupt {
        session: session.clone(),
        tree: Tree::Log.name(),
        reason: error.to_string(),
    }
}

/// Every message of `session`, with its sequence number, in commit order.
async fn load_log_messages(
    store: &dyn Store,
    session: &SessionId,
) -> Result<Vec<(u64, Message)>, Error> {
    let mut messages: Vec<(u64, Message)> = Vec::new();
    for (_, bytes) in store.scan_prefix(Tree::Log, &prefix(session)).await? {
        // A scan that met a compaction may read merged messages twice (sled iterates key by
        // key): each message once, by its sequence number.
        let next = messages.last().map_or(0, |(seq, _)| seq + 1);
        messages.extend(
            decode_messages(session, &bytes)?
                .into_iter()
                .filter(|(seq, _)| *seq >= next),
        );
    }
    Ok(messages)
}

/// Reads a session's messages in order.
pub(crate) async fn load_messages(
    store: &dyn Store,
    session: &SessionId,
) -> Result<Vec<Message>, Error> {
    let messages = load_log_messages(store, session).await?;
    Ok(messages.into_iter().map(|(_, message)| message).collect())
}

/// Reads a session's run records in turn order (each as last written).
pub(crate) async fn load_runs(
    store: &dyn Store,
    session: &SessionId,
) -> Result<Vec<RunRecord>, Error> {
    let mut runs = std::collections::BTreeMap::new();
    for (_, bytes) in store.scan_prefix(Tree::Log, &prefix(session)).await? {
        for run in decode_section::<RunRecord>(session, &bytes, Section::Runs)? {
            runs.insert(run.turn, run);
        }
    }
    Ok(runs.into_values().collect())
}

/// How many of a session's newest log entries [`load_run`] reads before it reads them all: a
/// run record is rewritten by every commit that changes the run, so the current run is almost
/// always in the newest entry.
const RECENT_LOG_ENTRIES: usize = 8;

/// Reads one run record (as last written).
pub(crate) async fn load_run(
    store: &dyn Store,
    session: &SessionId,
    turn: u32,
) -> Result<Option<RunRecord>, Error> {
    let recent = store
        .scan_prefix_rev(Tree::Log, &prefix(session), RECENT_LOG_ENTRIES)
        .await?;
    match run_in(session, &recent, turn)? {
        Some(run) => Ok(Some(run)),
        None => Ok(load_runs(store, session)
            .await?
            .into_iter()
            .find(|run| run.turn == turn)),
    }
}

/// Run record `turn` as the newest of `entries` (log entries, newest first) that has it
/// wrote it.
fn run_in(session: &SessionId, entries: &[Entry], turn: u32) -> Result<Option<RunRecord>, Error> {
    for (_, bytes) in entries {
        let runs: Vec<RunRecord> = decode_section(session, bytes, Section::Runs)?;
        if let Some(run) = runs.into_iter().rev().find(|run| run.turn == turn) {
            return Ok(Some(run));
        }
    }
    Ok(None)
}

/// What a session's activation reads of it.
#[derive(Debug)]
pub(crate) struct SessionParts {
    pub(crate) record: SessionRecord,
    /// The current run, if the session has one.
    pub(crate) run: Option<RunRecord>,
    pub(crate) pending: Vec<PendingCall>,
    pub(crate) children: Vec<ChildCall>,
    pub(crate) companions: Vec<Companion>,
}

/// Reads what an activation needs of `session` (`None` if it does not exist): its record as
/// [`load_record`] reads it, its current run as [`load_run`] does, and its pending calls,
/// sub-agent calls and persistent sub-agents, all asked for at once, so that a store that
/// groups the reads queued together ([`PgStore`](crate::PgStore)) answers them in one
/// statement instead of six.
pub(crate) async fn load_session(
    store: &dyn Store,
    session: &SessionId,
) -> Result<Option<SessionParts>, Error> {
    let (log, key) = (prefix(session), session_key(session));
    let (recent, snapshot, pending, children, companions) = futures::try_join!(
        async {
            Ok::<_, Error>(
                store
                    .scan_prefix_rev(Tree::Log, &log, RECENT_LOG_ENTRIES)
                    .await?,
            )
        },
        async { Ok::<_, Error>(store.get(Tree::Sessions, &key).await?) },
        load_pending(store, session),
        load_children(store, session),
        load_companions(store, session),
    )?;
    // The newest log entry's record, as `load_record` reads it; else the first commit's.
    let newest = match recent.first() {
        Some((_, bytes)) => decode_section::<SessionRecord>(session, bytes, Section::Record)?
            .into_iter()
            .next_back(),
        None => None,
    };
    let record = match (newest, snapshot) {
        (Some(record), _) => record,
        (None, Some(bytes)) => decode(session, Tree::Sessions, &bytes)?,
        (None, None) => return Ok(None),
    };
    let run = match record.current_run {
        Some(_) => match run_in(session, &recent, record.run_count)? {
            Some(run) => Some(run),
            None => load_runs(store, session)
                .await?
                .into_iter()
                .find(|run| run.turn == record.run_count),
        },
        None => None,
    };
    Ok(Some(SessionParts {
        record,
        run,
        pending,
        children,
        companions,
    }))
}

/// Reads a session's stream chunks from sequence number `from` on: a range scan from the
/// first log entry whose chunks end after `from`, [`CHUNK_PAGE`] entries at a time.
pub(crate) async fn load_chunks(
    store: &dyn Store,
    session: &SessionId,
    from: u64,
) -> Result<Vec<Chunk>, Error> {
    load_chunks_at_most(store, session, from, usize::MAX).await
}

/// As [`load_chunks`], `most` chunks at most: the log is read a page at a time until it has
/// them, so a long history costs a page of memory beyond what is kept, not all of it.
pub(crate) async fn load_chunks_at_most(
    store: &dyn Store,
    session: &SessionId,
    from: u64,
    most: usize,
) -> Result<Vec<Chunk>, Error> {
    let mut chunks = Vec::new();
    let mut page = ChunkPage::First(from);
    while chunks.len() < most {
        let (read, next) = load_chunk_page(store, session, &page).await?;
        chunks.extend(read);
        match next {
            Some(next) => page = next,
            None => break,
        }
    }
    chunks.truncate(most);
    Ok(chunks)
}

/// The log entries one read of a session's chunks takes: an entry is one commit's, messages
/// and all (a tool's result of a megabyte, say), so a page is bounded by what a few dozen
/// commits hold rather than by a session's whole history.
pub(crate) const CHUNK_PAGE: usize = 32;

/// Where a page of a session's chunks begins.
#[derive(Clone, Debug)]
pub(crate) enum ChunkPage {
    /// At the log entry that holds chunk `from`.
    First(u64),
    /// After the log entry of this key (the last an earlier page read), chunks from `from`
    /// on.
    After { key: Vec<u8>, from: u64 },
}

/// The chunks of the next [`CHUNK_PAGE`] log entries of `session`, and where the page after
/// them begins if entries may follow (by key, not by chunk: entries that hold no chunk are
/// passed, not read again).
pub(crate) async fn load_chunk_page(
    store: &dyn Store,
    session: &SessionId,
    page: &ChunkPage,
) -> Result<(Vec<Chunk>, Option<ChunkPage>), Error> {
    let (start, from) = match page {
        ChunkPage::First(from) => (log_key(session, from.saturating_add(1), 0), *from),
        ChunkPage::After { key, from } => (successor(key), *from),
    };
    // A stream never reaches u64::MAX chunks, so an exclusive end there loses nothing.
    let end = log_key(session, u64::MAX, u64::MAX);
    let entries = store
        .scan_range(Tree::Log, &start, &end, CHUNK_PAGE)
        .await?;
    let last_key = (entries.len() == CHUNK_PAGE)
        .then(|| entries.last().map(|(key, _)| key.clone()))
        .flatten();
    let mut chunks = Vec::new();
    for (_, bytes) in entries {
        let entry: Vec<Chunk> = decode_section(session, &bytes, Section::Chunks)?;
        // Each chunk once, as for messages (a scan that met a compaction).
        let next = chunks.last().map_or(from, |chunk: &Chunk| chunk.seq + 1);
        chunks.extend(entry.into_iter().filter(|chunk| chunk.seq >= next));
    }
    let next = last_key.map(|key| ChunkPage::After {
        key,
        from: chunks.last().map_or(from, |chunk| chunk.seq + 1),
    });
    Ok((chunks, next))
}

/// Reads a session's pending calls.
pub(crate) async fn load_pending(
    store: &dyn Store,
    session: &SessionId,
) -> Result<Vec<PendingCall>, Error> {
    load_all(store, session, Tree::Pending).await
}

/// A session's sub-agent call entries.
pub(crate) async fn load_children(
    store: &dyn Store,
    session: &SessionId,
) -> Result<Vec<ChildCall>, Error> {
    load_all(store, session, Tree::Children).await
}

/// A session's persistent sub-agents, by name.
pub(crate) async fn load_companions(
    store: &dyn Store,
    session: &SessionId,
) -> Result<Vec<Companion>, Error> {
    load_all(store, session, Tree::Companions).await
}

/// The conversation the model sees: the messages from the record's `history_start` on (a
/// companion spawned fresh starts over; its earlier messages stay stored).
pub(crate) async fn load_conversation(
    store: &dyn Store,
    record: &SessionRecord,
) -> Result<Vec<Message>, Error> {
    let messages = load_log_messages(store, &record.id).await?;
    Ok(messages
        .into_iter()
        .filter(|(seq, _)| *seq >= record.history_start)
        .map(|(_, message)| message)
        .collect())
}

pub(crate) use ownership::{legacy_owner, migrate as migrate_ownership, owners, sessions_under};

/// The calls under `root` that remote children's trees own, in call id order.
pub(crate) async fn remote_owned(
    store: &dyn Store,
    root: &SessionId,
) -> Result<Vec<RemoteOwner>, Error> {
    let owners: Vec<Owner> = load_all(store, root, Tree::Ownership).await?;
    Ok(owners
        .into_iter()
        .filter_map(|owner| match owner {
            Owner::Remote(remote) => Some(*remote),
            Owner::Local(_) => None,
        })
        .collect())
}

/// Stages the record of a remote child to stop once its server answers.
pub(crate) fn put_orphan(
    batch: &mut Batch,
    orphan: &crate::remote::RemoteOrphan,
) -> Result<(), Error> {
    batch.put(
        Tree::RemoteOrphans,
        session_key(&orphan.child),
        encode(Tree::RemoteOrphans, orphan)?,
    );
    Ok(())
}

/// Stages the removal of a remote orphan's record (it was stopped).
pub(crate) fn delete_orphan(batch: &mut Batch, child: &SessionId) {
    batch.delete(Tree::RemoteOrphans, session_key(child));
}

/// Whether remote child `child` is recorded to be stopped.
pub(crate) async fn orphan_recorded(store: &dyn Store, child: &SessionId) -> Result<bool, Error> {
    Ok(store
        .get(Tree::RemoteOrphans, &session_key(child))
        .await?
        .is_some())
}

/// The record of remote child `child` waiting to be stopped, if there is one (an unreadable
/// one is an error).
pub(crate) async fn orphan(
    store: &dyn Store,
    child: &SessionId,
) -> Result<Option<crate::remote::RemoteOrphan>, Error> {
    let key = session_key(child);
    store
        .get(Tree::RemoteOrphans, &key)
        .await?
        .map(|bytes| decode(child, Tree::RemoteOrphans, &bytes))
        .transpose()
}

/// Up to `limit` remote children waiting to be stopped, in key order from `from` on, and
/// where the next page starts (`None`: this was the last). An unreadable record is skipped
/// (logged): it must not keep the others from being stopped.
pub(crate) async fn remote_orphans(
    store: &dyn Store,
    from: &[u8],
    limit: usize,
) -> Result<(Vec<crate::remote::RemoteOrphan>, Option<Vec<u8>>), Error> {
    let entries = store
        .scan_range(Tree::RemoteOrphans, from, &[0xff; 2], limit)
        .await?;
    // The key just after the last one read: the next page's first.
    let next = (entries.len() >= limit)
        .then(|| {
            entries
                .last()
                .map(|(key, _)| [key.as_slice(), &[0]].concat())
        })
        .flatten();
    let orphans = entries
        .into_iter()
        .filter_map(|(key, bytes)| {
            let id: SessionId = String::from_utf8(key).ok()?.parse().ok()?;
            match decode(&id, Tree::RemoteOrphans, &bytes) {
                Ok(orphan) => Some(orphan),
                Err(error) => {
                    tracing::warn!(child = %id, %error, "remote_subagent.orphan_unreadable");
                    None
                }
            }
        })
        .collect();
    Ok((orphans, next))
}

/// `session`'s pending entry for `call`, if it has one.
pub(crate) async fn pending_call(
    store: &dyn Store,
    session: &SessionId,
    call: &str,
) -> Result<Option<PendingCall>, Error> {
    store
        .get(Tree::Pending, &call_key(session, call))
        .await?
        .map(|bytes| decode(session, Tree::Pending, &bytes))
        .transpose()
}

/// How many pending calls still wait for an answer at `now` (not answered, deadline not
/// passed), every session's: a read of every pending entry, `page` at a time.
pub(crate) async fn count_waiting(store: &dyn Store, now: u64, page: usize) -> Result<u64, Error> {
    let page = page.max(1);
    let mut from = Vec::new();
    let mut waiting = 0;
    loop {
        let entries = store
            .scan_range(Tree::Pending, &from, &[0xff; 3], page)
            .await?;
        for (key, bytes) in &entries {
            // A key that does not split is no call of a session: nothing waits on it.
            let Some((session, _)) = split_call_key(key) else {
                continue;
            };
            let pending: PendingCall = decode(&session, Tree::Pending, bytes)?;
            waiting += u64::from(pending.is_waiting(now));
        }
        match entries.last() {
            Some((last, _)) if entries.len() == page => from = successor(last),
            _ => return Ok(waiting),
        }
    }
}

/// When call `call` under `root` completed, if a tombstone remains.
pub(crate) async fn tombstone(
    store: &dyn Store,
    root: &SessionId,
    call: &str,
) -> Result<Option<u64>, Error> {
    store
        .get(Tree::Tombstones, &call_key(root, call))
        .await?
        .map(|bytes| decode(root, Tree::Tombstones, &bytes))
        .transpose()
}

/// A pending call whose deadline has passed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiredCall {
    /// When it expired (clock ms).
    pub deadline_at_ms: u64,
    /// The session that owns it.
    pub session: SessionId,
    /// The call.
    pub tool_call_id: String,
}

impl ExpiredCall {
    /// The deadline index's key just after this entry's: where a scan that read it goes on.
    pub(crate) fn key_after(&self) -> Vec<u8> {
        let mut key = timed_key(self.deadline_at_ms, &self.session, &self.tool_call_id);
        key.push(0);
        key
    }
}

/// Up to `limit` calls whose deadline is at or before `now`, earliest first: a range scan of
/// the deadline index, O(log n + k).
pub(crate) async fn expired_calls(
    store: &dyn Store,
    now: u64,
    limit: usize,
) -> Result<Vec<ExpiredCall>, Error> {
    expired_calls_from(store, &[], now, limit).await
}

/// As [`expired_calls`], from the index's key `from` on (the key just after the last of an
/// earlier page, [`ExpiredCall::key_after`]).
pub(crate) async fn expired_calls_from(
    store: &dyn Store,
    from: &[u8],
    now: u64,
    limit: usize,
) -> Result<Vec<ExpiredCall>, Error> {
    let end = now.saturating_add(1).to_be_bytes();
    Ok(store
        .scan_range(Tree::Deadlines, from, &end, limit)
        .await?
        .into_iter()
        .filter_map(|(key, _)| split_timed_key(&key))
        .map(|(deadline_at_ms, session, tool_call_id)| ExpiredCall {
            deadline_at_ms,
            session,
            tool_call_id,
        })
        .collect())
}

/// Up to `limit` entries of the deadline index after `after` (a key it holds or held), in
/// deadline order: each key with its deadline, session and call.
pub(crate) async fn deadlines_after(
    store: &dyn Store,
    after: Option<&[u8]>,
    limit: usize,
) -> Result<Vec<(Vec<u8>, u64, SessionId, String)>, Error> {
    let start = after.map_or_else(Vec::new, successor);
    Ok(store
        .scan_range(Tree::Deadlines, &start, &[0xff; 9], limit)
        .await?
        .into_iter()
        .filter_map(|(key, _)| {
            let (at, session, call) = split_timed_key(&key)?;
            Some((key, at, session, call))
        })
        .collect())
}

/// The call name of a session's resume-due entry in the deadline index. A session that lets
/// the runtime resume it (`auto_resume`) writes it, in the same commit, with the answer,
/// timeout or child's report that leaves it nothing to wait for; the resume's commit removes
/// it. The resume itself is a message to the session's actor, which a crash loses: after a
/// restart the scheduler finds the entry and the session resumes then. A control character
/// keeps it apart from a model's call ids (a call the model gives this id gets one of the
/// runtime's own).
pub(crate) const RESUME_DUE: &str = "\u{1}resume";

/// The deadline index's name for a parent's look at its remote sub-agent of `call` (when it
/// asks the child where it stands by itself): the control character keeps it apart from the
/// entries of calls, so that [`expired_calls`]' callers can tell them (`find_expired_pending`
/// lists calls only). An entry armed before looks had a name of their own is the bare call id;
/// it still fires as a look (the session has no pending call of that id).
pub(crate) fn remote_look_entry(call: &str) -> String {
    format!("{LOOK_PREFIX}{call}")
}

const LOOK_PREFIX: &str = "\u{1}look ";

/// The sub-agent call a deadline entry named `entry` looks at, if it is a look.
pub(crate) fn remote_look_call(entry: &str) -> Option<&str> {
    entry.strip_prefix(LOOK_PREFIX)
}

/// Whether a deadline entry named `entry` is the runtime's own (a resume owed, a look at a
/// remote sub-agent), not a call's. A model's call ids never start so (one that does gets an
/// id of the runtime's own).
pub(crate) fn is_runtime_entry(entry: &str) -> bool {
    entry.starts_with('\u{1}')
}

/// The deadline of every resume-due entry: 0, due from the start and before every real
/// deadline, so the background timer arms past them ([`next_deadline`]) instead of firing at
/// once for each resume under way; it fires them at start, and any sweep fires those it meets.
pub(crate) const RESUME_DUE_AT: u64 = 0;

/// The write that arms (`put`) or removes a session's resume-due entry.
pub(crate) fn resume_due_write(put: bool) -> IndexWrite {
    let (at, call) = (RESUME_DUE_AT, RESUME_DUE.to_string());
    if put {
        IndexWrite::PutDeadline { at, call }
    } else {
        IndexWrite::DeleteDeadline { at, call }
    }
}

/// Whether the deadline index holds an entry armed at [`RESUME_DUE_AT`]: a resume a crash
/// (or a stop) left owed.
pub(crate) async fn any_resume_due(store: &dyn Store) -> Result<bool, Error> {
    let end = RESUME_DUE_AT.saturating_add(1).to_be_bytes();
    Ok(!store
        .scan_range(Tree::Deadlines, &[], &end, 1)
        .await?
        .is_empty())
}

/// The earliest armed deadline, past the resume-due entries ([`RESUME_DUE_AT`]).
pub(crate) async fn next_deadline(store: &dyn Store) -> Result<Option<u64>, Error> {
    let start = RESUME_DUE_AT.saturating_add(1).to_be_bytes();
    Ok(store
        .scan_range(Tree::Deadlines, &start, &[0xff; 9], 1)
        .await?
        .first()
        .and_then(|(key, _)| split_timed_key(key))
        .map(|(at, _, _)| at))
}

/// Where the tombstone reaper goes on from, and what one of its passes found.
#[derive(Debug)]
pub(crate) struct Reap {
    /// Deletes the expired tombstones the pass found.
    pub(crate) batch: Batch,
    /// How many tombstones `batch` deletes.
    pub(crate) reaped: usize,
    /// The first key of the next pass; `None` to start again from the beginning.
    pub(crate) resume_at: Option<Vec<u8>>,
}

/// One pass of the tombstone reaper: reads up to `limit` tombstones from `from` on (from the
/// beginning with `None`) and deletes those whose retention ended by `now`.
///
/// Tombstones have no expiry index: an index entry cost a key write when the call completed
/// and another when it was reaped, in the commits that finish a run, while this walk only
/// reads. Successive passes go round the tombstones in key order and wrap at the end, so each
/// tombstone is read about once per round, and an expired one is deleted at most a round
/// after it expired. Lookups never depend on reaping (they check the completion time), so a
/// late reap only keeps a dead key on disk for longer. Stores written before this also hold
/// `tombstone_expiry` entries; each pass deletes up to `limit` of those as well.
pub(crate) async fn reap_tombstones(
    store: &dyn Store,
    from: Option<&[u8]>,
    now: u64,
    retention_ms: u64,
    limit: usize,
) -> Result<Reap, Error> {
    let mut reap = Reap {
        batch: Batch::new(CommitKind::Other),
        reaped: 0,
        resume_at: None,
    };
    // A call key starts with its session id's length (u16 BE, at most 512): below 0xff.
    let start = from.unwrap_or_default();
    let seen = store
        .scan_range(Tree::Tombstones, start, &[0xff], limit)
        .await?;
    for (key, value) in &seen {
        // A damaged tombstone answers nothing useful: reap it rather than keep failing on it.
        // One written by a newer format is kept: this build cannot tell when it expires.
        let expired = match split_call_key(key) {
            Some((root, _)) => match decode::<u64>(&root, Tree::Tombstones, value) {
                Ok(at) => now >= at.saturating_add(retention_ms),
                Err(Error::UnsupportedVersion { .. }) => false,
                Err(_) => true,
            },
            None => true,
        };
        if expired {
            reap.batch.delete(Tree::Tombstones, key.clone());
            reap.reaped += 1;
        }
    }
    if seen.len() == limit {
        reap.resume_at = seen.last().map(|(key, _)| successor(key));
    }
    // Their keys start with a time (u64 BE).
    for (key, _) in store
        .scan_range(Tree::TombstoneExpiry, &[], &[0xff; 9], limit)
        .await?
    {
        reap.batch.delete(Tree::TombstoneExpiry, key);
    }
    Ok(reap)
}

/// The smallest key after `key`.
fn successor(key: &[u8]) -> Vec<u8> {
    let mut next = Vec::with_capacity(key.len() + 1);
    next.extend_from_slice(key);
    next.push(0);
    next
}

#[cfg(test)]
mod tests;
