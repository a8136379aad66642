//! A session's log read as its history: its checkpoints, the session as it was at one, and the
//! copy of that history a fork starts from.
//!
//! A checkpoint is a log entry: every commit that appends to a session writes one, with the
//! session's record as of the commit, and nothing ever rewrites or removes it. So a checkpoint
//! costs no write of its own, and reading one is a scan of the session's log up to it.

use std::collections::BTreeMap;

use super::{
    decode_messages, decode_section, encode, encode_log, log_key, prefix, session_key, Error,
    Section,
};
use crate::store::{Batch, CommitKind, Store, Tree};
use crate::types::checkpoint::{Checkpoint, CheckpointId, ForkOrigin, PastState};
use crate::types::ids::SessionId;
use crate::types::message::{Message, ToolCall};
use crate::types::record::{ErrorCode, RunError, RunRecord, SessionRecord, Status};
use crate::types::stream::Chunk;

/// One log entry of a session, decoded.
#[derive(Debug)]
pub(crate) struct LogEntry {
    /// Its sequence number: the checkpoint's id.
    pub(crate) seq: u64,
    pub(crate) messages: Vec<(u64, Message)>,
    pub(crate) runs: Vec<RunRecord>,
    pub(crate) chunks: Vec<Chunk>,
    /// The session's record after the commit (`None` only in entries of the first format).
    pub(crate) record: Option<SessionRecord>,
}

/// The log sequence number in a log entry's key (`prefix · chunk end · log seq`).
fn log_seq_of(prefix_len: usize, key: &[u8]) -> Option<u64> {
    let seq = key.get(prefix_len + 8..prefix_len + 16)?;
    Some(u64::from_be_bytes(seq.try_into().ok()?))
}

/// The session's log entries in commit order, up to and including `through` if given.
pub(crate) async fn load_history(
    store: &dyn Store,
    session: &SessionId,
    through: Option<CheckpointId>,
) -> Result<Vec<LogEntry>, Error> {
    let prefix = prefix(session);
    let mut entries = Vec::new();
    for (key, bytes) in store.scan_prefix(Tree::Log, &prefix).await? {
        let seq = log_seq_of(prefix.len(), &key).ok_or_else(|| Error::Corrupt {
            session: session.clone(),
            tree: Tree::Log.name(),
            reason: "a log key without its sequence number".into(),
        })?;
        // Entries are in commit order (neither part of the key ever decreases), so the
        // first past `through` ends the history.
        if through.is_some_and(|through| seq > through.0) {
            break;
        }
        entries.push(LogEntry {
            seq,
            messages: decode_messages(session, &bytes)?,
            runs: decode_section(session, &bytes, Section::Runs)?,
            chunks: decode_section(session, &bytes, Section::Chunks)?,
            record: decode_section::<SessionRecord>(session, &bytes, Section::Record)?
                .into_iter()
                .next_back(),
        });
    }
    Ok(entries)
}

/// The calls of the model's last reply that have no result yet, kept up to date message by
/// message.
#[derive(Default)]
struct OpenCalls(Vec<ToolCall>);

impl OpenCalls {
    fn see(&mut self, message: &Message) {
        match message {
            Message::User { .. } => self.0.clear(),
            Message::Assistant { tool_calls, .. } => self.0.clone_from(tool_calls),
            Message::Tool { tool_call_id, .. } => self.0.retain(|call| &call.id != tool_call_id),
        }
    }
}

/// The session's checkpoints, oldest first, from its history.
pub(crate) fn checkpoints(session: &SessionId, history: &[LogEntry]) -> Vec<Checkpoint> {
    let mut open = OpenCalls::default();
    let mut checkpoints = Vec::with_capacity(history.len());
    for entry in history {
        for (_, message) in &entry.messages {
            open.see(message);
        }
        if let Some(record) = &entry.record {
            checkpoints.push(checkpoint(session, entry, record, &open));
        }
    }
    checkpoints
}

fn checkpoint(
    session: &SessionId,
    entry: &LogEntry,
    record: &SessionRecord,
    open: &OpenCalls,
) -> Checkpoint {
    Checkpoint {
        id: CheckpointId(entry.seq),
        session: session.clone(),
        run_id: record.current_run,
        turn: record.run_count,
        step: record.steps_in_run,
        stream_seq: record.chunk_count,
        at_ms: record.updated_at_ms,
        status: record.status,
        messages: entry
            .messages
            .iter()
            .map(|(_, message)| message.clone())
            .collect(),
        open_calls: open.0.clone(),
    }
}

/// The session as it was at `checkpoint`, from its history up to there; `None` if no entry
/// of the history is that checkpoint.
pub(crate) fn state_at(
    session: &SessionId,
    history: &[LogEntry],
    at: CheckpointId,
) -> Option<PastState> {
    let last = history.last().filter(|entry| entry.seq == at.0)?;
    let record = last.record.clone()?;
    let mut open = OpenCalls::default();
    let mut messages = Vec::new();
    let mut runs = BTreeMap::new();
    for entry in history {
        for (_, message) in &entry.messages {
            open.see(message);
            messages.push(message.clone());
        }
        for run in &entry.runs {
            runs.insert(run.turn, run.clone());
        }
    }
    Some(PastState {
        checkpoint: checkpoint(session, last, &record, &open),
        record,
        messages,
        runs: runs.into_values().collect(),
    })
}

/// Where a forked session sits in the fork's tree.
#[derive(Clone, Debug)]
pub(crate) struct Placement {
    /// The forked session's id.
    pub(crate) id: SessionId,
    /// The fork's root (`id` itself for the root).
    pub(crate) root: SessionId,
    /// For a sub-agent: its (forked) parent and the parent's call.
    pub(crate) parent: Option<(SessionId, String)>,
}

/// A record of the source as the fork's, placed in the fork's tree, made from `origin`.
fn rebased(record: &SessionRecord, place: &Placement, origin: &ForkOrigin) -> SessionRecord {
    SessionRecord {
        id: place.id.clone(),
        root: place.root.clone(),
        parent: place.parent.as_ref().map(|(parent, _)| parent.clone()),
        parent_call: place.parent.as_ref().map(|(_, call)| call.clone()),
        remote_parent: None,
        forked_from: Some(origin.clone()),
        ..record.clone()
    }
}

/// The record of a session that has not run yet, as a fork cut before its first message
/// starts: the source's agent and custom state at creation, nothing recorded.
pub(crate) fn before_first_message(first: &SessionRecord) -> SessionRecord {
    SessionRecord {
        status: Status::Completed,
        message_count: 0,
        chunk_count: 0,
        run_count: 0,
        current_run: None,
        steps_in_run: 0,
        interrupt_requested: false,
        aborted: false,
        suspension: None,
        history_start: 0,
        log_count: 0,
        ..first.clone()
    }
}

/// The writes that make `place.id` a session whose history is `copied` (the source's log up
/// to a checkpoint), followed by one entry of its own that records the fork: its record as of
/// the checkpoint (`at`), with `forked_from` set, and a run that was in progress or suspended
/// there closed as [`ErrorCode::ForkPoint`], for `resume` to go on from. The source's entries
/// keep their sequence numbers, so the fork's checkpoints up to the fork point have the
/// source's ids.
pub(crate) fn write_fork(
    batch: &mut Batch,
    copied: &[LogEntry],
    at: &SessionRecord,
    current_run: Option<&RunRecord>,
    place: &Placement,
    origin: &ForkOrigin,
    now: u64,
) -> Result<(), Error> {
    let fork = &place.id;
    for entry in copied {
        let Some(record) = &entry.record else {
            continue;
        };
        let record = rebased(record, place, origin);
        if entry.seq == 0 {
            batch.put(
                Tree::Sessions,
                session_key(fork),
                encode(Tree::Sessions, &record)?,
            );
        }
        batch.put(
            Tree::Log,
            log_key(fork, record.chunk_count, entry.seq),
            encode_log(&entry.messages, &entry.runs, &entry.chunks, &record)?,
        );
    }
    let seq = copied.last().map_or(0, |entry| entry.seq + 1);
    let mut record = rebased(at, place, origin);
    record.log_count = seq + 1;
    record.updated_at_ms = now;
    let mut runs = Vec::new();
    if matches!(
        record.status,
        Status::Running | Status::SuspendedClientTool | Status::SuspendedAwaitingChildren
    ) {
        record.status = Status::Interrupted;
        record.suspension = None;
        record.interrupt_requested = false;
        if let Some(run) = current_run {
            runs.push(RunRecord {
                status: Status::Interrupted,
                ended_at_ms: Some(now),
                error: Some(RunError {
                    code: ErrorCode::ForkPoint,
                    message: format!(
                        "forked from checkpoint {} of session {} while this run was {}; resume goes on from there",
                        origin.checkpoint,
                        origin.session,
                        at.status
                    ),
                }),
                ..run.clone()
            });
        }
    }
    if seq == 0 {
        batch.put(
            Tree::Sessions,
            session_key(fork),
            encode(Tree::Sessions, &record)?,
        );
    }
    batch.put(
        Tree::Log,
        log_key(fork, record.chunk_count, seq),
        encode_log(&[], &runs, &[], &record)?,
    );
    Ok(())
}

/// An empty batch of a fork's writes, made under the lease of the fork's tree `root`.
pub(crate) fn fork_batch(root: &SessionId) -> Batch {
    Batch::new(CommitKind::Other)
        .for_session(root.shared())
        .written_by(root.shared())
}

/// The current run at the end of `history` (as last written), if the session has one.
pub(crate) fn current_run(history: &[LogEntry], record: &SessionRecord) -> Option<RunRecord> {
    record.current_run?;
    history
        .iter()
        .rev()
        .flat_map(|entry| entry.runs.iter().rev())
        .find(|run| run.turn == record.run_count)
        .cloned()
}
