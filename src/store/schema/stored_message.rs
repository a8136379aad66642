//! How a log entry stores a message: externally tagged.
//!
//! [`Message`]'s public serde form is internally tagged (`{"role": "user", "text": …}`), the
//! shape clients and scenario files read. Deserializing an internally tagged enum buffers the
//! whole value into serde's generic content tree before it can look at the tag, which made
//! decoding the messages most of the cost of rehydrating a session. The stored form names the
//! variant first (a one-entry map, MessagePack's external tagging), so it decodes in one pass.
//! Format version 1 stored the public form; [`decode_entries`] still reads it.

use serde::{Deserialize, Serialize, Serializer};

use crate::types::message::{Message, ToolCall, ToolOutcome};

/// The stored shape of [`Message`]: the same variants and fields, externally tagged.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Message", rename_all = "snake_case")]
enum StoredMessage {
    User {
        text: String,
    },
    Assistant {
        text: Option<String>,
        tool_calls: Vec<ToolCall>,
    },
    Tool {
        tool_call_id: String,
        tool_name: String,
        outcome: ToolOutcome,
    },
}

/// A message and its sequence number, as written.
#[derive(Serialize)]
struct EntryRef<'a>(u64, #[serde(with = "StoredMessage")] &'a Message);

/// A message and its sequence number, as read.
#[derive(Deserialize)]
struct Entry(u64, #[serde(with = "StoredMessage")] Message);

/// Serializes a commit's messages in the stored form.
pub(super) struct Entries<'a>(pub(super) &'a [(u64, Message)]);

impl Serialize for Entries<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|(seq, message)| EntryRef(*seq, message)))
    }
}

/// Decodes a messages section written by format `version`.
pub(super) fn decode_entries(
    version: u8,
    body: &[u8],
) -> Result<Vec<(u64, Message)>, rmp_serde::decode::Error> {
    if version == 1 {
        return rmp_serde::from_slice(body);
    }
    let entries: Vec<Entry> = rmp_serde::from_slice(body)?;
    Ok(entries
        .into_iter()
        .map(|Entry(seq, message)| (seq, message))
        .collect())
}
