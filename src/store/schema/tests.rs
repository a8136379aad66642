//! The log layout: what one commit appends is one entry, read back by section and by range.

use serde_json::Map;

use super::*;
use crate::session::Status;
use crate::store::wait::Wait;
use crate::types::ids::RunId;
use crate::types::stream::ChunkKind;
use crate::MemoryStore;

fn record(id: &SessionId) -> SessionRecord {
    SessionRecord {
        remote_parent: None,
        forked_from: None,
        id: id.clone(),
        agent: "a".into(),
        status: Status::Running,
        root: id.clone(),
        parent: None,
        created_at_ms: 0,
        updated_at_ms: 0,
        message_count: 0,
        chunk_count: 0,
        run_count: 0,
        current_run: None,
        steps_in_run: 0,
        custom_state: Map::new(),
        interrupt_requested: false,
        aborted: false,
        suspension: None,
        parent_call: None,
        depth: 0,
        history_start: 0,
        log_count: 0,
    }
}

fn run(turn: u32, steps: u32) -> RunRecord {
    RunRecord {
        run_id: RunId::generate(),
        turn,
        previous_run_id: None,
        status: Status::Running,
        started_at_ms: 0,
        ended_at_ms: None,
        steps,
        text: None,
        output: None,
        error: None,
        usage: Default::default(),
    }
}

/// Commits `batch` to `store`.
fn commit_batch(store: &MemoryStore, batch: Batch) {
    futures::executor::block_on(store.commit(batch)).expect("commits");
}

/// Writes raw bytes under `key`, bypassing the encoders (damaged, old or future values).
fn put_raw(store: &MemoryStore, tree: Tree, key: Vec<u8>, value: Vec<u8>) {
    let mut batch = Batch::new(CommitKind::Other);
    batch.put(tree, key, value);
    commit_batch(store, batch);
}

/// Appends `count` log-entry sections that each hold an empty MessagePack array.
fn push_empty_sections(entry: &mut Vec<u8>, count: usize) {
    for _ in 0..count {
        entry.extend_from_slice(&1u32.to_be_bytes());
        entry.push(0x90);
    }
}

/// A session whose commits are built the way the session core builds them: each appends the
/// given messages, chunks and run, and the record counts them.
struct Writer {
    store: MemoryStore,
    record: SessionRecord,
}

impl Writer {
    fn new(id: &str) -> Self {
        Self {
            store: MemoryStore::new(),
            record: record(&id.parse().expect("valid id")),
        }
    }

    fn commit(&mut self, messages: usize, chunks: usize, run: Option<RunRecord>) {
        let messages: Vec<(u64, Message)> = (0..messages)
            .map(|_| {
                let seq = self.record.message_count;
                self.record.message_count += 1;
                (
                    seq,
                    Message::User {
                        text: format!("m{seq}"),
                    },
                )
            })
            .collect();
        let chunks: Vec<Chunk> = (0..chunks)
            .map(|_| {
                let seq = self.record.chunk_count;
                self.record.chunk_count += 1;
                Chunk {
                    seq,
                    run_id: RunId::generate(),
                    at_ms: seq,
                    kind: ChunkKind::Text {
                        text: format!("c{seq}"),
                    },
                }
            })
            .collect();
        let runs: Vec<RunRecord> = run.into_iter().collect();
        let log_seq = self.record.log_count;
        self.record.log_count += 1;
        let commit = Commit {
            kind: CommitKind::Other,
            session: self.record.id.clone(),
            tree: self.record.root.clone(),
            record: Some(self.record.clone()),
            log_seq,
            messages,
            runs,
            chunks,
            index: Vec::new(),
        };
        let batch = commit.encode().expect("encodes");
        commit_batch(&self.store, batch);
    }

    fn chunk_seqs(&self, from: u64) -> Vec<u64> {
        load_chunks(&self.store, &self.record.id, from)
            .wait()
            .expect("reads")
            .iter()
            .map(|chunk| chunk.seq)
            .collect()
    }
}

#[test]
fn a_commit_appends_one_log_entry_whatever_it_carries() {
    let mut writer = Writer::new("s1");
    writer.commit(2, 3, Some(run(1, 0)));
    assert_eq!(writer.store.len(Tree::Log), 1);
    let messages = load_messages(&writer.store, &writer.record.id)
        .wait()
        .expect("reads");
    assert_eq!(
        messages,
        vec![
            Message::User { text: "m0".into() },
            Message::User { text: "m1".into() }
        ]
    );
    assert_eq!(writer.chunk_seqs(0), vec![0, 1, 2]);
    assert_eq!(
        load_runs(&writer.store, &writer.record.id)
            .wait()
            .expect("reads")
            .len(),
        1
    );
}

#[test]
fn chunks_from_any_offset_are_exactly_those_at_or_after_it() {
    let mut writer = Writer::new("s1");
    writer.commit(1, 2, Some(run(1, 0))); // chunks 0, 1
    writer.commit(0, 0, Some(run(1, 1))); // a run change alone
    writer.commit(1, 3, None); // chunks 2, 3, 4
    writer.commit(0, 1, None); // chunk 5
    let all: Vec<u64> = (0..6).collect();
    for from in 0..8 {
        let expected: Vec<u64> = all.iter().copied().filter(|seq| *seq >= from).collect();
        assert_eq!(writer.chunk_seqs(from), expected, "from {from}");
    }
}

#[test]
fn a_history_read_a_page_at_a_time_gives_every_chunk_once_past_entries_without_chunks() {
    let mut writer = Writer::new("s1");
    let mut written = 0;
    for entry in 0..3 * CHUNK_PAGE {
        // Whole pages of entries with no chunk between those with some.
        let chunks = if (CHUNK_PAGE..2 * CHUNK_PAGE).contains(&entry) {
            0
        } else {
            2
        };
        writer.commit(0, chunks, None);
        written += chunks as u64;
    }
    assert_eq!(writer.chunk_seqs(0), (0..written).collect::<Vec<_>>());
    assert_eq!(writer.chunk_seqs(5), (5..written).collect::<Vec<_>>());
    let id = writer.record.id.clone();
    let (first, next) = load_chunk_page(&writer.store, &id, &ChunkPage::First(0))
        .wait()
        .expect("reads");
    assert_eq!(first.len(), 2 * CHUNK_PAGE, "a page is a page of entries");
    assert!(next.is_some(), "more follow");
    let some = load_chunks_at_most(&writer.store, &id, 3, 7)
        .wait()
        .expect("reads");
    assert_eq!(
        some.iter().map(|chunk| chunk.seq).collect::<Vec<_>>(),
        (3..10).collect::<Vec<_>>()
    );
}

#[test]
fn a_run_rewritten_by_later_commits_reads_as_last_written() {
    let mut writer = Writer::new("s1");
    writer.commit(1, 1, Some(run(1, 0)));
    writer.commit(1, 1, Some(run(1, 1)));
    writer.commit(1, 1, Some(run(2, 0)));
    let runs = load_runs(&writer.store, &writer.record.id)
        .wait()
        .expect("reads");
    assert_eq!(
        runs.iter()
            .map(|run| (run.turn, run.steps))
            .collect::<Vec<_>>(),
        vec![(1, 1), (2, 0)]
    );
    let first = load_run(&writer.store, &writer.record.id, 1)
        .wait()
        .expect("reads");
    assert_eq!(first.map(|run| run.steps), Some(1));
    assert_eq!(
        load_run(&writer.store, &writer.record.id, 3)
            .wait()
            .expect("reads"),
        None
    );
}

#[test]
fn a_run_older_than_the_recent_entries_is_still_found() {
    let mut writer = Writer::new("s1");
    writer.commit(1, 0, Some(run(1, 7)));
    for _ in 0..RECENT_LOG_ENTRIES + 3 {
        writer.commit(0, 1, None);
    }
    let found = load_run(&writer.store, &writer.record.id, 1)
        .wait()
        .expect("reads");
    assert_eq!(found.map(|run| run.steps), Some(7));
}

#[test]
fn the_conversation_starts_at_history_start() {
    let mut writer = Writer::new("s1");
    writer.commit(3, 0, None);
    writer.commit(2, 0, None);
    writer.record.history_start = 3;
    let conversation = load_conversation(&writer.store, &writer.record)
        .wait()
        .expect("reads");
    assert_eq!(
        conversation,
        vec![
            Message::User { text: "m3".into() },
            Message::User { text: "m4".into() }
        ]
    );
}

#[test]
fn sessions_whose_ids_share_a_prefix_do_not_see_each_others_entries() {
    let mut short = Writer::new("s1");
    short.commit(1, 1, None);
    let mut long = Writer {
        store: short.store,
        record: record(&"s10".parse().expect("valid id")),
    };
    long.commit(2, 2, None);
    short.store = long.store;
    assert_eq!(
        load_messages(&short.store, &short.record.id)
            .wait()
            .expect("reads")
            .len(),
        1
    );
    assert_eq!(short.chunk_seqs(0), vec![0]);
}

#[test]
fn a_damaged_log_entry_is_a_corrupt_error_naming_the_tree() {
    let writer = Writer::new("s1");
    let id = writer.record.id.clone();
    for bytes in [
        vec![],
        vec![FORMAT_VERSION],
        vec![FORMAT_VERSION, 0, 0, 0, 9, 1],
        vec![FORMAT_VERSION, 0, 0, 0, 1, 0xc1, 0, 0, 0, 0],
    ] {
        put_raw(&writer.store, Tree::Log, log_key(&id, 0, 0), bytes.clone());
        match load_messages(&writer.store, &id).wait() {
            Err(Error::Corrupt { tree, .. }) => assert_eq!(tree, "log", "{bytes:?}"),
            other => panic!("{bytes:?}: expected a corrupt log entry, got {other:?}"),
        }
    }
    put_raw(
        &writer.store,
        Tree::Log,
        log_key(&id, 0, 0),
        vec![FORMAT_VERSION + 1],
    );
    assert!(matches!(
        load_messages(&writer.store, &id).wait(),
        Err(Error::UnsupportedVersion { .. })
    ));
}

#[test]
fn only_the_first_commit_writes_the_snapshot_and_the_record_reads_from_the_newest_entry() {
    let mut writer = Writer::new("s1");
    writer.commit(1, 1, Some(run(1, 0)));
    writer.record.steps_in_run = 1;
    writer.commit(0, 0, None);
    writer.record.steps_in_run = 2;
    writer.record.status = Status::SuspendedClientTool;
    writer.commit(1, 0, None);
    let id = writer.record.id.clone();

    assert_eq!(writer.store.len(Tree::Sessions), 1);
    assert_eq!(
        writer.store.len(Tree::Log),
        3,
        "a commit with nothing to append still appends its record"
    );
    let loaded = load_record(&writer.store, &id)
        .wait()
        .expect("reads")
        .expect("exists");
    assert_eq!(loaded, writer.record);
    let snapshot: SessionRecord = decode(
        &id,
        Tree::Sessions,
        &writer
            .store
            .get(Tree::Sessions, &session_key(&id))
            .wait()
            .expect("reads")
            .expect("exists"),
    )
    .expect("decodes");
    assert_eq!(
        (snapshot.steps_in_run, snapshot.log_count),
        (0, 1),
        "the snapshot is the first commit's"
    );

    let lineage = load_lineage(&writer.store, &id)
        .wait()
        .expect("reads")
        .expect("exists");
    assert_eq!((lineage.root, lineage.parent), (id, None));
    let absent: SessionId = "nobody".parse().expect("valid id");
    assert!(load_record(&writer.store, &absent)
        .wait()
        .expect("reads")
        .is_none());
    assert!(load_lineage(&writer.store, &absent)
        .wait()
        .expect("reads")
        .is_none());
}

#[test]
fn a_log_entry_without_a_record_section_falls_back_to_the_snapshot() {
    let mut writer = Writer::new("s1");
    writer.commit(1, 0, None);
    let id = writer.record.id.clone();
    // The three sections of an entry that carries no record: empty messages, runs, chunks.
    let mut entry = vec![FORMAT_VERSION];
    push_empty_sections(&mut entry, 3);
    put_raw(&writer.store, Tree::Log, log_key(&id, 0, 1), entry);
    let loaded = load_record(&writer.store, &id)
        .wait()
        .expect("reads")
        .expect("exists");
    assert_eq!(loaded.log_count, 1, "the snapshot of the first commit");
    assert_eq!(
        load_messages(&writer.store, &id)
            .wait()
            .expect("reads")
            .len(),
        1
    );
}

#[test]
fn messages_are_stored_externally_tagged_and_format_1_entries_still_read() {
    let mut writer = Writer::new("s1");
    writer.commit(1, 0, None);
    let id = writer.record.id.clone();
    let stored = writer
        .store
        .scan_prefix(Tree::Log, &prefix(&id))
        .wait()
        .expect("reads");
    let (version, body) = find_section(&id, &stored[0].1, Section::Messages).expect("finds");
    assert_eq!(version, FORMAT_VERSION);
    let as_value: serde_json::Value =
        rmp_serde::from_slice(body.expect("present")).expect("decodes");
    assert_eq!(
        as_value,
        serde_json::json!([[0, {"user": {"text": "m0"}}]]),
        "the variant names the message, not a role field inside it"
    );

    // A version-1 entry: the messages in their public, internally tagged form.
    let old = vec![
        (
            1u64,
            Message::Assistant {
                text: None,
                tool_calls: vec![crate::types::message::ToolCall::new(
                    "c1",
                    "lookup",
                    serde_json::json!({"q": [1, 2]}),
                )],
            },
        ),
        (
            2,
            Message::Tool {
                tool_call_id: "c1".into(),
                tool_name: "lookup".into(),
                outcome: crate::types::message::ToolOutcome::Result(serde_json::json!("found")),
            },
        ),
    ];
    let mut entry = vec![1];
    encode_section(&mut entry, &old).expect("encodes");
    push_empty_sections(&mut entry, 2);
    put_raw(&writer.store, Tree::Log, log_key(&id, 0, 1), entry);

    let mut expected = vec![Message::User { text: "m0".into() }];
    expected.extend(old.into_iter().map(|(_, message)| message));
    assert_eq!(
        load_messages(&writer.store, &id).wait().expect("reads"),
        expected
    );
}

#[test]
fn the_reaper_walks_the_tombstones_in_stretches_and_deletes_only_expired_ones() {
    let store = MemoryStore::new();
    let root: SessionId = "root".parse().expect("valid id");
    let mut batch = Batch::new(CommitKind::Other);
    // Calls c0..c4 completed at 0, 10, 20, 30, 40; a leftover expiry entry of the old layout.
    for i in 0..5u64 {
        batch.put(
            Tree::Tombstones,
            call_key(&root, &format!("c{i}")),
            encode(Tree::Tombstones, &(i * 10)).expect("encodes"),
        );
    }
    batch.put(Tree::TombstoneExpiry, timed_key(0, &root, "c0"), Vec::new());
    commit_batch(&store, batch);
    let remaining = |store: &MemoryStore| -> Vec<String> {
        store
            .scan_prefix(Tree::Tombstones, &[])
            .wait()
            .expect("reads")
            .iter()
            .filter_map(|(key, _)| split_call_key(key).map(|(_, call)| call))
            .collect()
    };

    // At 35 with a retention of 10, c0..c2 have expired (at + 10 <= 35); two are read a pass.
    let first = reap_tombstones(&store, None, 35, 10, 2)
        .wait()
        .expect("reaps");
    assert_eq!(first.reaped, 2);
    assert_eq!(
        first.resume_at,
        Some(successor(&call_key(&root, "c1"))),
        "a full stretch: the next pass goes on after it"
    );
    commit_batch(&store, first.batch);
    assert_eq!(remaining(&store), ["c2", "c3", "c4"]);
    assert_eq!(store.len(Tree::TombstoneExpiry), 0, "old index entries go");

    let second = reap_tombstones(&store, first.resume_at.as_deref(), 35, 10, 2)
        .wait()
        .expect("reaps");
    assert_eq!(second.reaped, 1, "c2 expired, c3 did not");
    commit_batch(&store, second.batch);
    let third = reap_tombstones(&store, second.resume_at.as_deref(), 35, 10, 2)
        .wait()
        .expect("reaps");
    assert_eq!(
        (third.reaped, third.resume_at),
        (0, None),
        "the end: wrap round"
    );
    assert_eq!(remaining(&store), ["c3", "c4"]);

    // Later, a pass from the beginning finds the rest expired.
    let later = reap_tombstones(&store, None, 50, 10, 10)
        .wait()
        .expect("reaps");
    assert_eq!((later.reaped, later.resume_at.is_none()), (2, true));
}

#[test]
fn the_reaper_deletes_a_damaged_tombstone_but_keeps_one_of_a_newer_format() {
    let store = MemoryStore::new();
    let root: SessionId = "root".parse().expect("valid id");
    let mut batch = Batch::new(CommitKind::Other);
    batch.put(
        Tree::Tombstones,
        call_key(&root, "damaged"),
        vec![FORMAT_VERSION, 0xc1],
    );
    batch.put(
        Tree::Tombstones,
        call_key(&root, "newer"),
        vec![FORMAT_VERSION + 1, 0],
    );
    commit_batch(&store, batch);
    let reap = reap_tombstones(&store, None, 0, 10, 10)
        .wait()
        .expect("reaps");
    assert_eq!(reap.reaped, 1);
    commit_batch(&store, reap.batch);
    assert!(store
        .get(Tree::Tombstones, &call_key(&root, "newer"))
        .wait()
        .expect("reads")
        .is_some());
    assert!(store
        .get(Tree::Tombstones, &call_key(&root, "damaged"))
        .wait()
        .expect("reads")
        .is_none());
}

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A commit of `owner` that writes (or, with `delete`, clears) its ownership entry of `call`
/// under `root`, encoded.
fn ownership(
    root: &SessionId,
    owner: &SessionId,
    call: &str,
    delete: bool,
) -> Result<Batch, Error> {
    let write = if delete {
        IndexWrite::DeleteOwnership {
            root: root.clone(),
            call: call.into(),
            owner: owner.clone(),
        }
    } else {
        IndexWrite::PutOwnership {
            root: root.clone(),
            call: call.into(),
        }
    };
    Commit {
        kind: CommitKind::Other,
        session: owner.clone(),
        tree: root.clone(),
        record: None,
        log_seq: 0,
        messages: Vec::new(),
        runs: Vec::new(),
        chunks: Vec::new(),
        index: vec![write],
    }
    .encode()
}

fn owner_ids(owners: Vec<Owner>) -> Vec<String> {
    owners
        .into_iter()
        .map(|owner| match owner {
            Owner::Local(session) => session.to_string(),
            Owner::Remote(remote) => remote.remote_root.to_string(),
        })
        .collect()
}

#[test]
fn two_owners_of_one_call_id_each_keep_their_entry() -> TestResult {
    let store = MemoryStore::new();
    let root: SessionId = "r".parse()?;
    let (w1, w2) = (root.ephemeral_child("w1"), root.ephemeral_child("w2"));
    for owner in [&w2, &w1] {
        commit_batch(&store, ownership(&root, owner, "tc-1", false)?);
    }
    // A call whose id extends the other's is a different call.
    commit_batch(&store, ownership(&root, &w1, "tc-10", false)?);
    let read = |call: &str| futures::executor::block_on(owners(&store, &root, call));
    assert_eq!(owner_ids(read("tc-1")?), ["r-sub-w1", "r-sub-w2"]);
    assert_eq!(owner_ids(read("tc-10")?), ["r-sub-w1"]);
    commit_batch(&store, ownership(&root, &w1, "tc-1", true)?);
    assert_eq!(owner_ids(read("tc-1")?), ["r-sub-w2"]);
    Ok(())
}

#[test]
fn ownership_entries_of_the_earlier_layout_are_read_and_moved() -> TestResult {
    use futures::executor::block_on;
    let store = MemoryStore::new();
    let root: SessionId = "r".parse()?;
    let child = root.ephemeral_child("w1");
    // As an earlier version wrote it: root · call → the owner.
    let value = encode(Tree::Ownership, &child)?;
    put_raw(&store, Tree::Ownership, call_key(&root, "tc-1"), value);
    let legacy = block_on(legacy_owner(&store, &root, "tc-1"))?;
    assert_eq!(legacy, Some(Owner::Local(child.clone())));
    assert!(block_on(owners(&store, &root, "tc-1"))?.is_empty());
    assert_eq!(block_on(migrate_ownership(&store))?, 1);
    assert_eq!(
        owner_ids(block_on(owners(&store, &root, "tc-1"))?),
        ["r-sub-w1"]
    );
    assert_eq!(block_on(legacy_owner(&store, &root, "tc-1"))?, None);
    // Nothing is left to move, and the owner's own delete clears the moved entry.
    assert_eq!(block_on(migrate_ownership(&store))?, 0);
    commit_batch(&store, ownership(&root, &child, "tc-1", true)?);
    assert_eq!(store.len(Tree::Ownership), 0);
    Ok(())
}

/// What a sled scan that straddles a compaction can see: entries before the merge and the
/// merged entry after them. Readers give each message and chunk once; a history read refuses
/// such a mix (and reads again: here the mix stays, so it gives up with a typed error).
#[test]
fn a_read_that_meets_a_compaction_gives_each_message_once() {
    let mut writer = Writer::new("s1");
    for _ in 0..4 {
        writer.commit(1, 1, Some(run(1, 0)));
    }
    let id = writer.record.id.clone();
    let history = history::load_history(&writer.store, &id, None)
        .wait()
        .expect("reads");
    assert_eq!(history.len(), 4);
    // The merge of the first three into the third, written beside them (as a scan that read
    // the old ones before the merge's delete would see it).
    let (batch, oldest, removed) = history::compact_batch(&id, &id, &history, 2)
        .expect("encodes")
        .expect("something to merge");
    assert_eq!((oldest.0, removed), (2, 2));
    let merged: Vec<crate::store::Op> = batch
        .ops()
        .iter()
        .filter(|op| matches!(op, crate::store::Op::Put { .. }))
        .cloned()
        .collect();
    for op in merged {
        if let crate::store::Op::Put { tree, key, value } = op {
            // Under a key between the old entries and the fourth, as if the third's.
            put_raw(&writer.store, tree, key, value);
        }
    }
    let messages = load_messages(&writer.store, &id).wait().expect("reads");
    let texts: Vec<String> = messages
        .iter()
        .map(|message| match message {
            Message::User { text } => text.clone(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(texts, ["m0", "m1", "m2", "m3"]);
    assert_eq!(writer.chunk_seqs(0), vec![0, 1, 2, 3]);
    assert!(matches!(
        history::load_history(&writer.store, &id, None).wait(),
        Err(Error::Corrupt { .. })
    ));
    // Applied whole (the old entries deleted), the log reads the same.
    let (batch, _, _) = history::compact_batch(&id, &id, &history, 2)
        .expect("encodes")
        .expect("something to merge");
    commit_batch(&writer.store, batch);
    assert_eq!(
        load_messages(&writer.store, &id).wait().expect("reads"),
        messages
    );
    let after = history::load_history(&writer.store, &id, None)
        .wait()
        .expect("reads");
    assert_eq!(
        after.iter().map(|entry| entry.seq).collect::<Vec<_>>(),
        [2, 3]
    );
}

#[test]
fn an_input_calls_question_and_answers_survive_their_stored_form() -> Result<(), Error> {
    use crate::definition::{InputAnswer, InputRequest};
    use crate::types::record::{Answer, PendingCall, PendingKind};
    let session: SessionId = "s".parse().map_err(|_| Error::Encode {
        tree: "pending",
        reason: "id".into(),
    })?;
    let call = PendingCall {
        tool_call_id: "t1".into(),
        tool_name: "book".into(),
        input: serde_json::json!({ "flight": "LH1" }),
        kind: PendingKind::Input,
        run_id: RunId::generate(),
        position: 0,
        requested_at_ms: 1,
        deadline_at_ms: 2,
        answer: Some(Answer::Input(InputAnswer::Declined { reason: None })),
        answered_at_ms: Some(2),
        original_input: None,
        binding: None,
        idempotency_key: None,
        request: Some(InputRequest::new("Go on?").schema(serde_json::json!({ "type": "object" }))),
        answers: vec![
            InputAnswer::Accepted {
                content: serde_json::json!({ "seat": "12A", "n": [1, 2.5, null] }),
            },
            InputAnswer::Declined {
                reason: Some("no".into()),
            },
        ],
    };
    let bytes = encode(Tree::Pending, &call)?;
    let back: PendingCall = decode(&session, Tree::Pending, &bytes)?;
    assert_eq!(back, call);
    assert_eq!(back.question(), Some(3));
    Ok(())
}
