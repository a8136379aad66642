//! The side files: one JSON object per line, appended and synced (`sync_data`) before the
//! event it records is reported, so a line that is in the file happened, whatever the kill
//! cut afterwards.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The executions file, in the store's directory.
pub(crate) const EXECUTIONS: &str = "executions.jsonl";
/// The acknowledged-answers file, in the store's directory.
pub(crate) const ACCEPTED: &str = "accepted.jsonl";

/// One execution of a server tool, written before the tool returns.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Execution {
    /// The process that ran it: `g3` for generation 3, `check` for the checker.
    pub(crate) process: String,
    pub(crate) session: String,
    pub(crate) call: String,
    pub(crate) tool: String,
    /// Whether running it twice is harmless (then a repeat is no violation). A tool wrongly
    /// marked `safe_to_retry` (the broken variant) is still logged `false`: this is the truth
    /// about the side effect, not the definition.
    pub(crate) retryable: bool,
    /// The call's idempotency key (what a reconciliation looks the effect up by).
    #[serde(default)]
    pub(crate) key: String,
}

/// The execution of the call with idempotency key `key`, if its effect happened: it is in the
/// executions file then (each is synced before its tool goes on, so a kill after it leaves it
/// there, and one before it leaves nothing: no effect).
pub(crate) fn executed(dir: &Path, key: &str) -> anyhow::Result<Option<Execution>> {
    let (executions, _) = read::<Execution>(&dir.join(EXECUTIONS))?;
    Ok(executions
        .into_iter()
        .find(|execution| execution.key == key))
}

/// What a submit carried.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Sent {
    Result(Value),
    Error(String),
    Approval {
        approved: bool,
    },
    /// A reconciliation: whether the cut call's effect happened (as the executions file says).
    Reconcile {
        happened: bool,
    },
}

/// A submit that answered `accepted`, written right after the answer came back.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Acknowledged {
    pub(crate) process: String,
    /// The root session the submit named.
    pub(crate) root: String,
    pub(crate) call: String,
    pub(crate) sent: Sent,
}

/// An append-only file of JSON lines, shared by the tasks of one process.
#[derive(Debug)]
pub(crate) struct Journal {
    file: Mutex<File>,
}

impl Journal {
    /// Opens (or creates) the file. A line a kill cut short is closed with a newline first,
    /// so that it stays one unreadable line instead of swallowing the next record.
    pub(crate) fn open(path: &Path) -> anyhow::Result<Self> {
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)?;
        if file.metadata()?.len() > 0 {
            let mut last = [0u8; 1];
            file.seek(SeekFrom::End(-1))?;
            file.read_exact(&mut last)?;
            if last[0] != b'\n' {
                file.write_all(b"\n")?;
                file.sync_data()?;
            }
        }
        Ok(Self {
            file: Mutex::new(file),
        })
    }

    /// Appends one record and syncs it: when this returns, the line survives a kill.
    pub(crate) fn append(&self, record: &impl Serialize) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        let mut file = self.file.lock();
        // One write per line: concurrent appenders never interleave inside a line.
        file.write_all(&line)?;
        file.sync_data()?;
        Ok(())
    }
}

/// The complete records of a journal, and how many lines a kill cut (unreadable, skipped).
pub(crate) fn read<T: DeserializeOwned>(path: &Path) -> anyhow::Result<(Vec<T>, usize)> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(error) => return Err(error.into()),
    };
    let mut records = Vec::new();
    let mut torn = 0;
    let mut lines = bytes.split(|byte| *byte == b'\n').peekable();
    while let Some(line) = lines.next() {
        // The piece after the last newline is a line still being written when the process
        // died (or nothing): never a record.
        if lines.peek().is_none() {
            torn += usize::from(!line.is_empty());
            break;
        }
        match serde_json::from_slice(line) {
            Ok(record) => records.push(record),
            Err(_) => torn += 1,
        }
    }
    Ok((records, torn))
}
