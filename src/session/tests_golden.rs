//! The stored format is pinned: the commits of the recorded life (`tests_replay.rs`), encoded,
//! are kept in `tests/golden/commits-v{FORMAT_VERSION}.hex`, and a build whose encoding of them
//! differs fails here. A change of the stored encoding needs a `schema::FORMAT_VERSION` bump
//! (and a reader that still reads the old version); a change of the rules that only changes
//! what is written needs none. Either way the golden file is then written again with
//! `DORMANT_BLESS=1 cargo test --lib -p dormant session::tests_golden`. The files of earlier
//! versions stay: this build must still read each of them.

use std::path::{Path, PathBuf};

use super::tests_replay::{encoded, replay, Replayed, CHILD, CUT, ROOT};
use crate::store::schema::{self, FORMAT_VERSION};
use crate::store::{Batch, CommitKind, Op, Store, Tree};
use crate::MemoryStore;

/// Where the golden files live.
fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

fn golden_file(version: u8) -> PathBuf {
    golden_dir().join(format!("commits-v{version}.hex"))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(text, "{byte:02x}");
    }
    text
}

fn unhex(text: &str) -> Result<Vec<u8>, String> {
    if text == "-" {
        return Ok(Vec::new());
    }
    (0..text.len())
        .step_by(2)
        .map(|at| {
            text.get(at..at + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(|| format!("not hex: {text:?}"))
        })
        .collect()
}

/// The golden text of encoded commits: a header, then per commit a `commit` line and one line
/// per write (`put tree key value` or `del tree key`, bytes in hex, `-` for none).
fn golden_text(batches: &[Batch]) -> String {
    let mut text = format!(
        "# The encoded commits of the recorded life in src/session/tests_replay.rs.\n\
         # Written by DORMANT_BLESS=1 cargo test --lib -p dormant session::tests_golden\n\
         format_version {FORMAT_VERSION}\n"
    );
    for batch in batches {
        let session = batch.writer().unwrap_or("-");
        text.push_str(&format!("commit {session} {:?}\n", batch.kind()));
        for op in batch.ops() {
            let line = match op {
                Op::Put { tree, key, value } => {
                    let value = if value.is_empty() {
                        "-".to_string()
                    } else {
                        hex(value)
                    };
                    format!("put {} {} {value}\n", tree.name(), hex(key))
                }
                Op::Delete { tree, key } => format!("del {} {}\n", tree.name(), hex(key)),
            };
            text.push_str(&line);
        }
    }
    text
}

/// A golden file read back: its format version and its commits as store batches.
fn parse(text: &str) -> Result<(u8, Vec<Batch>), String> {
    let mut version = None;
    let mut batches: Vec<Batch> = Vec::new();
    let tree = |name: &str| {
        Tree::ALL
            .into_iter()
            .find(|tree| tree.name() == name)
            .ok_or_else(|| format!("no tree {name}"))
    };
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        let words: Vec<&str> = line.split(' ').collect();
        match words.as_slice() {
            ["format_version", found] => {
                version = Some(found.parse::<u8>().map_err(|error| error.to_string())?);
            }
            ["commit", session, _kind] => {
                batches.push(Batch::new(CommitKind::Other).for_session(*session));
            }
            ["put", name, key, value] => batches
                .last_mut()
                .ok_or("a write before any commit")?
                .put(tree(name)?, unhex(key)?, unhex(value)?),
            ["del", name, key] => batches
                .last_mut()
                .ok_or("a write before any commit")?
                .delete(tree(name)?, unhex(key)?),
            _ => return Err(format!("unreadable line: {line:?}")),
        }
    }
    Ok((version.ok_or("no format_version line")?, batches))
}

/// Where two texts first differ (line, and the neighbourhood of the first differing
/// character), for the failure message.
fn first_difference(expected: &str, actual: &str) -> String {
    for (number, (want, got)) in expected.lines().zip(actual.lines()).enumerate() {
        if want != got {
            let at = want
                .bytes()
                .zip(got.bytes())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| want.len().min(got.len()));
            let near = |line: &str| {
                let from = at.saturating_sub(40);
                line.get(from..line.len().min(at + 40))
                    .unwrap_or("")
                    .to_string()
            };
            return format!(
                "line {}, column {at}:\n  golden: …{}…\n  now:    …{}…",
                number + 1,
                near(want),
                near(got)
            );
        }
    }
    format!(
        "the golden file has {} lines, the commits now {}",
        expected.lines().count(),
        actual.lines().count()
    )
}

#[test]
fn the_encoded_commits_of_the_recorded_life_match_the_golden_file() -> Result<(), String> {
    let now = golden_text(&encoded(&replay()?.commits)?);
    let path = golden_file(FORMAT_VERSION);
    if std::env::var_os("DORMANT_BLESS").is_some_and(|value| value == "1") {
        std::fs::create_dir_all(golden_dir()).map_err(|error| error.to_string())?;
        std::fs::write(&path, &now).map_err(|error| error.to_string())?;
        eprintln!("blessed {}", path.display());
        return Ok(());
    }
    let golden = std::fs::read_to_string(&path).map_err(|error| {
        format!(
            "{}: {error}. A new FORMAT_VERSION needs its golden file: \
             DORMANT_BLESS=1 cargo test --lib -p dormant session::tests_golden",
            path.display()
        )
    })?;
    if golden != now {
        return Err(format!(
            "the encoded commits of the recorded life differ from {} ({}).\n\
             If the stored encoding changed, bump schema::FORMAT_VERSION (keeping a reader of \
             version {FORMAT_VERSION}) and write the new version's golden file; if only the \
             rules changed what is written, write this one again. Either way: \
             DORMANT_BLESS=1 cargo test --lib -p dormant session::tests_golden",
            path.display(),
            first_difference(&golden, &now)
        ));
    }
    Ok(())
}

/// What the store holds of one session, read back as a restarted runtime reads it.
type ReadBack = (
    Option<super::SessionRecord>,
    Option<super::RunRecord>,
    Vec<super::PendingCall>,
    Vec<super::ChildCall>,
    Vec<super::Companion>,
);

async fn read_back(store: &dyn Store, id: &str) -> Result<ReadBack, String> {
    let id: crate::types::ids::SessionId = id.parse().map_err(|error| format!("{error}"))?;
    let error = |error: schema::Error| error.to_string();
    let record = schema::load_record(store, &id).await.map_err(error)?;
    let run = match &record {
        Some(record) => schema::load_run(store, &id, record.run_count)
            .await
            .map_err(error)?,
        None => None,
    };
    if let Some(record) = &record {
        schema::load_conversation(store, record)
            .await
            .map_err(error)?;
        let chunks = schema::load_chunks(store, &id, 0).await.map_err(error)?;
        if u64::try_from(chunks.len()).ok() != Some(record.chunk_count) {
            return Err(format!(
                "{id}: {} chunks read back, the record counts {}",
                chunks.len(),
                record.chunk_count
            ));
        }
    }
    Ok((
        record,
        run,
        schema::load_pending(store, &id).await.map_err(error)?,
        schema::load_children(store, &id).await.map_err(error)?,
        schema::load_companions(store, &id).await.map_err(error)?,
    ))
}

/// What the replayed session holds in memory, in the order the store reads it back.
fn in_memory(replayed: &Replayed, id: &str) -> Option<ReadBack> {
    let session = replayed.session(id)?;
    let mut pending = session.pending.in_order();
    pending.sort_by(|a, b| a.tool_call_id.cmp(&b.tool_call_id));
    let mut children = session.children.entries();
    children.sort_by(|a, b| a.tool_call_id.cmp(&b.tool_call_id));
    let companions = session.companions.in_order().into_iter().cloned().collect();
    Some((
        Some(session.record.clone()),
        session.run.clone(),
        pending,
        children,
        companions,
    ))
}

#[tokio::test]
async fn every_golden_file_still_reads_back_and_the_current_one_as_the_sessions_ended(
) -> Result<(), String> {
    let replayed = replay()?;
    let mut read = 0;
    for version in 1..=FORMAT_VERSION {
        let Ok(text) = std::fs::read_to_string(golden_file(version)) else {
            continue;
        };
        let (found, batches) = parse(&text)?;
        assert_eq!(
            found,
            version,
            "the header of {}",
            golden_file(version).display()
        );
        let store = MemoryStore::new();
        for batch in batches {
            store
                .commit(batch)
                .await
                .map_err(|error| error.to_string())?;
        }
        for id in [ROOT, CHILD, CUT] {
            let stored = read_back(&store, id).await?;
            if version == FORMAT_VERSION {
                assert_eq!(Some(stored), in_memory(&replayed, id), "{id}");
            }
        }
        read += 1;
    }
    assert!(read > 0, "no golden file in {}", golden_dir().display());
    Ok(())
}
