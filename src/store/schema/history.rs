//! A session's log read as its history: its checkpoints, the session as it was at one, and the
//! copy of that history a fork starts from.
//!
//! A checkpoint is a log entry: every commit that appends to a session writes one, with the
//! session's record as of the commit, and no commit rewrites or removes it (only retention
//! merges old entries, keeping everything they recorded). So a checkpoint costs no write of
//! its own, and reading one is a scan of the session's log up to it.

use std::collections::BTreeMap;

use super::{
    before_record, call_key, decode_messages, decode_section, encode, encode_log, encode_section,
    log_key, prefix, session_key, Error, Section,
};
use crate::store::{Batch, CommitKind, Store, Tree};
use crate::types::checkpoint::{Checkpoint, CheckpointId, ForkOrigin, PastState, Retention};
use crate::types::ids::SessionId;
use crate::types::message::{Message, ToolCall};
use crate::types::record::{
    Answer, ChildCall, ErrorCode, PendingCall, PendingKind, RunError, RunRecord, SessionRecord,
    Status,
};
use crate::types::stream::{Chunk, ChunkKind};

/// One log entry of a session: its messages and record decoded, the rest kept as stored (a
/// long run's record is rewritten by every commit, so decoding every entry's would cost the
/// square of the run's length; a fork copies the entries as they are).
#[derive(Debug)]
pub(crate) struct LogEntry {
    /// Its sequence number: the checkpoint's id.
    pub(crate) seq: u64,
    pub(crate) messages: Vec<(u64, Message)>,
    /// The session's record after the commit (`None` only in entries of the first format).
    pub(crate) record: Option<SessionRecord>,
    /// Its key, and the entry as stored.
    key: Vec<u8>,
    bytes: Vec<u8>,
}

impl LogEntry {
    /// The run records the commit wrote.
    fn runs(&self, session: &SessionId) -> Result<Vec<RunRecord>, Error> {
        decode_section(session, &self.bytes, Section::Runs)
    }

    /// The stream chunks the commit wrote.
    fn chunks(&self, session: &SessionId) -> Result<Vec<Chunk>, Error> {
        decode_section(session, &self.bytes, Section::Chunks)
    }
}

/// The log sequence number in a log entry's key (`prefix · chunk end · log seq`).
fn log_seq_of(prefix_len: usize, key: &[u8]) -> Option<u64> {
    let seq = key.get(prefix_len + 8..prefix_len + 16)?;
    Some(u64::from_be_bytes(seq.try_into().ok()?))
}

/// The session's log entries in commit order, up to and including `through` if given.
///
/// Retention merges old entries into one (`compact_batch`), and sled reads a range key by
/// key, so a read that meets a compaction may see entries before it and the merged entry
/// after it: it is read again, until it sees one log (sequence numbers consecutive, each
/// message once).
pub(crate) async fn load_history(
    store: &dyn Store,
    session: &SessionId,
    through: Option<CheckpointId>,
) -> Result<Vec<LogEntry>, Error> {
    const READS: usize = 4;
    for _ in 0..READS {
        let entries = read_history(store, session, through).await?;
        if one_log(&entries) {
            return Ok(entries);
        }
    }
    Err(Error::Corrupt {
        session: session.clone(),
        tree: Tree::Log.name(),
        reason: format!("the log changed under each of {READS} reads (compactions)"),
    })
}

/// Whether `entries` read as one state of the log: consecutive sequence numbers, and no
/// message twice.
fn one_log(entries: &[LogEntry]) -> bool {
    let mut next_message = 0;
    for (index, entry) in entries.iter().enumerate() {
        if index > 0 && entry.seq != entries[index - 1].seq + 1 {
            return false;
        }
        for (seq, _) in &entry.messages {
            if *seq < next_message {
                return false;
            }
            next_message = seq + 1;
        }
    }
    true
}

async fn read_history(
    store: &dyn Store,
    session: &SessionId,
    through: Option<CheckpointId>,
) -> Result<Vec<LogEntry>, Error> {
    let prefix = prefix(session);
    // Sequence numbers are consecutive from the oldest entry (0, or where a compaction left
    // it), so the entries up to `through` are at most its number plus one: a read of the log
    // up to a checkpoint stops there, not at the end.
    let end = log_key(session, u64::MAX, u64::MAX);
    let limit = through.map_or(usize::MAX, |through| {
        usize::try_from(through.0.saturating_add(1)).unwrap_or(usize::MAX)
    });
    let mut entries = Vec::new();
    for (key, bytes) in store.scan_range(Tree::Log, &prefix, &end, limit).await? {
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
            record: decode_section::<SessionRecord>(session, &bytes, Section::Record)?
                .into_iter()
                .next_back(),
            key,
            bytes,
        });
    }
    Ok(entries)
}

/// The calls of the model's last reply that have no result yet, kept up to date message by
/// message.
#[derive(Default)]
struct OpenCalls(Vec<(usize, ToolCall)>);

impl OpenCalls {
    fn see(&mut self, message: &Message) {
        match message {
            Message::User { .. } => self.0.clear(),
            Message::Assistant { tool_calls, .. } => {
                self.0 = tool_calls.iter().cloned().enumerate().collect();
            }
            Message::Tool { tool_call_id, .. } => {
                self.0.retain(|(_, call)| &call.id != tool_call_id);
            }
        }
    }

    fn calls(&self) -> Vec<ToolCall> {
        self.0.iter().map(|(_, call)| call.clone()).collect()
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
        open_calls: open.calls(),
    }
}

/// The session as it was at `checkpoint`, from its history up to there; `None` if no entry
/// of the history is that checkpoint.
pub(crate) fn state_at(
    session: &SessionId,
    history: &[LogEntry],
    at: CheckpointId,
) -> Result<Option<PastState>, Error> {
    let Some((last, record)) = history
        .last()
        .filter(|entry| entry.seq == at.0)
        .and_then(|entry| Some((entry, entry.record.clone()?)))
    else {
        return Ok(None);
    };
    let mut open = OpenCalls::default();
    let mut messages = Vec::new();
    for entry in history {
        for (_, message) in &entry.messages {
            open.see(message);
            messages.push(message.clone());
        }
    }
    // Each run as last written: the newest entries hold the latest runs, so the scan back
    // stops once every turn is found.
    let mut runs = BTreeMap::new();
    for entry in history.iter().rev() {
        if runs.len() >= record.run_count as usize {
            break;
        }
        for run in entry.runs(session)? {
            runs.entry(run.turn).or_insert(run);
        }
    }
    Ok(Some(PastState {
        checkpoint: checkpoint(session, last, &record, &open),
        record,
        messages,
        runs: runs.into_values().collect(),
        children: Vec::new(),
    }))
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
    let source_prefix = prefix(&origin.session).len();
    let mut snapshot = false;
    for entry in copied {
        let Some(record) = &entry.record else {
            // An entry of the first format, without a record: copied as it is.
            let mut key = prefix(fork);
            key.extend_from_slice(entry.key.get(source_prefix..).unwrap_or_default());
            batch.put(Tree::Log, key, entry.bytes.clone());
            continue;
        };
        let record = rebased(record, place, origin);
        if !snapshot {
            batch.put(
                Tree::Sessions,
                session_key(fork),
                encode(Tree::Sessions, &record)?,
            );
            snapshot = true;
        }
        // The entry as the source stored it, with the record placed in the fork's tree.
        let mut bytes = before_record(&origin.session, &entry.bytes)?.to_vec();
        encode_section(&mut bytes, std::slice::from_ref(&record))?;
        batch.put(
            Tree::Log,
            log_key(fork, record.chunk_count, entry.seq),
            bytes,
        );
    }
    for call in dispatched_approvals(&origin.session, copied, at, now)? {
        batch.put(
            Tree::Pending,
            call_key(fork, &call.tool_call_id),
            encode(Tree::Pending, &call)?,
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
        // A run whose finishing tool succeeded, suspended only for its children, keeps its
        // output: its resume completes with it, as the source's would.
        record.suspension = record
            .suspension
            .take()
            .filter(|suspension| suspension.finish.is_some());
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

/// The approved calls the history dispatched without a result: the resume that acted on an
/// approval records the decision on the stream before the tool runs, so an approved call with
/// no result at the checkpoint was running there. The fork keeps each as a pending entry
/// answered `approved`, which its resume treats as the source's would after a crash: a
/// `tool_durability_error` unless the tool is safe to retry, never a second approval and a
/// second run.
fn dispatched_approvals(
    session: &SessionId,
    copied: &[LogEntry],
    at: &SessionRecord,
    now: u64,
) -> Result<Vec<PendingCall>, Error> {
    let mut open = OpenCalls::default();
    for entry in copied {
        for (_, message) in &entry.messages {
            open.see(message);
        }
    }
    let approved = approved_calls(session, copied)?;
    let Some(run_id) = at.current_run else {
        return Ok(Vec::new());
    };
    Ok(open
        .0
        .iter()
        .filter_map(|(position, call)| Some((position, call, approved.get(&call.id)?)))
        .map(|(position, call, edited)| PendingCall {
            tool_call_id: call.id.clone(),
            tool_name: call.name.clone(),
            // The input the person approved, the model's own beside it, as the source's
            // entry held them: the call runs again with what was approved, if it runs again.
            input: edited.clone().unwrap_or_else(|| call.input.clone()),
            kind: PendingKind::Approval,
            run_id,
            position: u32::try_from(*position).unwrap_or(u32::MAX),
            requested_at_ms: now,
            deadline_at_ms: now,
            answer: Some(Answer::Approved),
            answered_at_ms: Some(now),
            original_input: edited.as_ref().map(|_| call.input.clone()),
            binding: None,
            idempotency_key: None,
            request: None,
            answers: Vec::new(),
        })
        .collect())
}

/// How many of the child's stream chunks `history` (its parent's, up to a checkpoint) had
/// copied into the parent's stream for `call`: a child's chunks are forwarded as it reports,
/// so the child stood where it had written that many when the parent's checkpoint was made.
pub(crate) fn forwarded_count(
    session: &SessionId,
    history: &[LogEntry],
    call: &str,
) -> Result<u64, Error> {
    let mut count = 0;
    for entry in history {
        for chunk in entry.chunks(session)? {
            if let ChunkKind::Forwarded {
                tool_call_id,
                chunk,
                ..
            } = chunk.kind
            {
                if tool_call_id == call {
                    count = count.max(chunk.seq + 1);
                }
            }
        }
    }
    Ok(count)
}

/// The id of the session's oldest checkpoint (`None` before its first commit), and when it
/// was committed: older ones were compacted away ([`compact_batch`]).
pub(crate) async fn oldest_checkpoint(
    store: &dyn Store,
    session: &SessionId,
) -> Result<Option<(CheckpointId, u64)>, Error> {
    let prefix = prefix(session);
    // No session's log reaches u64::MAX chunks: an exclusive end there loses nothing.
    let end = log_key(session, u64::MAX, u64::MAX);
    let first = store.scan_range(Tree::Log, &prefix, &end, 1).await?;
    let Some((key, bytes)) = first.first() else {
        return Ok(None);
    };
    let Some(seq) = log_seq_of(prefix.len(), key) else {
        return Ok(None);
    };
    let at = decode_section::<SessionRecord>(session, bytes, Section::Record)?
        .last()
        .map_or(0, |record| record.updated_at_ms);
    Ok(Some((CheckpointId(seq), at)))
}

/// The index in `history` (a session's whole log) of the oldest checkpoint `retention`
/// keeps at `now`: the entries before it are merged into it. `None`: nothing to merge.
pub(crate) fn compaction_target(
    history: &[LogEntry],
    retention: Retention,
    now: u64,
) -> Option<usize> {
    let newest = history.len().checked_sub(1)?;
    let by_count = retention
        .keep_last
        .map_or(0, |keep| history.len().saturating_sub(keep.max(1)));
    let by_age = retention.max_age_ms.map_or(0, |age| {
        let cutoff = now.saturating_sub(age);
        history
            .iter()
            .take_while(|entry| {
                entry
                    .record
                    .as_ref()
                    .is_some_and(|record| record.updated_at_ms < cutoff)
            })
            .count()
    });
    Some(by_count.max(by_age).min(newest)).filter(|&target| target > 0)
}

/// The writes that merge the entries of `history` (a session's whole log) before `target`
/// into the entry at `target` (the oldest kept): one entry, under that checkpoint's key, with
/// every message and stream chunk they recorded, each run as last written, and that
/// checkpoint's record, so the session reads as before. `None` if there is nothing to merge.
pub(crate) fn compact_batch(
    session: &SessionId,
    tree: &SessionId,
    history: &[LogEntry],
    target: usize,
) -> Result<Option<(Batch, CheckpointId, usize)>, Error> {
    if target == 0 || target >= history.len() {
        return Ok(None);
    }
    let merged = &history[..=target];
    let Some(record) = merged[target].record.clone() else {
        return Ok(None);
    };
    let mut messages = Vec::new();
    let mut chunks = Vec::new();
    let mut runs = BTreeMap::new();
    for entry in merged {
        messages.extend(entry.messages.iter().cloned());
        chunks.extend(entry.chunks(session)?);
        for run in entry.runs(session)? {
            runs.insert(run.turn, run);
        }
    }
    let runs: Vec<RunRecord> = runs.into_values().collect();
    let mut batch = Batch::new(CommitKind::Other)
        .for_session(tree.shared())
        .written_by(session.shared());
    for entry in &merged[..target] {
        batch.delete(Tree::Log, entry.key.clone());
    }
    batch.put(
        Tree::Log,
        merged[target].key.clone(),
        encode_log(&messages, &runs, &chunks, &record)?,
    );
    Ok(Some((batch, CheckpointId(merged[target].seq), target)))
}

/// The calls `copied` (a session's history) records as approved and not ended: the resume
/// that acted on an approval put the decision on the stream before the tool ran. A decision
/// holds for the request it answers only: a later request under the same id (a model that
/// gives a later step's call an earlier call's id, as some do), or the call's end, lets it go.
pub(crate) fn approved_calls(
    session: &SessionId,
    copied: &[LogEntry],
) -> Result<std::collections::HashMap<String, Option<serde_json::Value>>, Error> {
    let mut approved = std::collections::HashMap::new();
    for entry in copied {
        for chunk in entry.chunks(session)? {
            match chunk.kind {
                ChunkKind::ToolApprovalResponse {
                    tool_call_id,
                    approved: true,
                    edited_input,
                    ..
                } => {
                    approved.insert(tool_call_id, edited_input);
                }
                ChunkKind::ToolApprovalResponse { tool_call_id, .. }
                | ChunkKind::ToolApprovalRequest { tool_call_id, .. }
                | ChunkKind::ToolEnd { tool_call_id, .. } => {
                    approved.remove(&tool_call_id);
                }
                _ => {}
            }
        }
    }
    Ok(approved)
}

/// Adds the pending entry that gives a fork's call in flight at the checkpoint the result its
/// options chose: its resume records it as the call's result, as an accepted answer, instead
/// of a `tool_durability_error`.
pub(crate) fn put_given_result(
    batch: &mut Batch,
    fork: &SessionId,
    call: &ToolCall,
    position: usize,
    answer: Answer,
    at: &SessionRecord,
    now: u64,
) -> Result<(), Error> {
    let Some(run_id) = at.current_run else {
        return Ok(());
    };
    let entry = PendingCall {
        tool_call_id: call.id.clone(),
        tool_name: call.name.clone(),
        input: call.input.clone(),
        kind: PendingKind::Client,
        run_id,
        position: u32::try_from(position).unwrap_or(u32::MAX),
        requested_at_ms: now,
        deadline_at_ms: now,
        answer: Some(answer),
        answered_at_ms: Some(now),
        original_input: None,
        binding: None,
        idempotency_key: None,
        request: None,
        answers: Vec::new(),
    };
    batch.put(
        Tree::Pending,
        call_key(fork, &call.id),
        encode(Tree::Pending, &entry)?,
    );
    Ok(())
}

/// Adds a forked parent's entry for its forked child: started, with the child's chunks the
/// parent's copied stream holds already counted, so that the fork's resume re-attaches to the
/// child and copies only what the child writes from then on.
pub(crate) fn put_forked_child(
    batch: &mut Batch,
    parent: &SessionId,
    child: &ChildCall,
) -> Result<(), Error> {
    batch.put(
        Tree::Children,
        call_key(parent, &child.tool_call_id),
        encode(Tree::Children, child)?,
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
pub(crate) fn current_run(
    session: &SessionId,
    history: &[LogEntry],
    record: &SessionRecord,
) -> Result<Option<RunRecord>, Error> {
    if record.current_run.is_none() {
        return Ok(None);
    }
    for entry in history.iter().rev() {
        if let Some(run) = entry
            .runs(session)?
            .into_iter()
            .rev()
            .find(|run| run.turn == record.run_count)
        {
            return Ok(Some(run));
        }
    }
    Ok(None)
}
