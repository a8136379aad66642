//! The ids of a model's tool calls, made unique before anything is recorded.
//!
//! Everything the runtime keeps about a call of a step is keyed by its id within the
//! session: its pending entry, its child entry and the child's session id
//! (`{parent}-sub-{id}`), its approval id, its tool result. A model may leave an id empty, or
//! use one twice in a reply; then two calls of the step would share those keys, and one would
//! lose its result or be unanswerable. So when a reply arrives, before commit #1, each such
//! call gets an id of the runtime's own, and from then on that is the call's id everywhere:
//! the stored assistant message (so the model's next request), the stream, pending, child
//! ids, approvals and tool results.
//!
//! An id reused from an earlier step keeps its meaning: the earlier call is done by then (a
//! step goes on only once every call of the one before has its result), so its keys are free
//! again, except a sub-agent call's child, which the new call re-attaches to (its result is
//! reported again, nothing runs twice; ARCHITECTURE.md, "Re-attach"), and its tombstone, which
//! the router consults only when no call waits under the id.
//!
//! A call keeps the model's id whenever that is free, which is the usual case. The new id is
//! `call-{seq}-{index}` (the assistant message's sequence number in the session and the call's
//! position in the reply), with `-2`, `-3`, … appended while it is taken: valid inside a
//! session id, unique in the conversation, and the same when the same reply is replayed
//! (after a crash before commit #1 the step asks the model again, and the sequence number is
//! the same).

use std::collections::HashSet;

use super::apply_cx::ApplyCx;
use super::core::Session;
use super::{Effect, Observation};
use crate::types::message::{Message, ToolCall};

/// The longest id a model's call keeps, in bytes. Every index entry of a call is keyed by
/// it (pending, deadline, ownership, tombstone): a longer one could pass a store's own limit
/// on a key (PostgreSQL's index rows hold about 2.7 KB), and fail with its commit every other
/// session's commit grouped with it. Providers' ids are a few dozen bytes.
pub(crate) const MAX_CALL_ID_BYTES: usize = 256;

impl Session {
    /// Gives each call of `calls` whose id is empty, or is used by an earlier call of the same
    /// reply, an id of the runtime's own (see the module's documentation), and reports each
    /// change as an observation (the actor logs it).
    pub(super) fn assign_call_ids(&self, cx: &mut ApplyCx, calls: &mut [ToolCall]) {
        // An assigned id must be new to the conversation too (a later reply could not tell it
        // from an earlier call's otherwise).
        let conversation: HashSet<String> = self
            .messages
            .iter()
            .flat_map(|messages| messages.iter())
            .filter_map(|message| match message {
                Message::Assistant { tool_calls, .. } => Some(tool_calls),
                _ => None,
            })
            .flatten()
            .map(|call| call.id.clone())
            .collect();
        let mut used: HashSet<String> = HashSet::new();
        // The model's own ids in this reply: a new id must not take one a later call keeps.
        let given: HashSet<String> = calls.iter().map(|call| call.id.clone()).collect();
        let seq = self.record.message_count;
        for (index, call) in calls.iter_mut().enumerate() {
            let reason = if call.id.is_empty() {
                Some("empty")
            } else if used.contains(&call.id) {
                Some("repeated")
            } else if call.id.len() > MAX_CALL_ID_BYTES {
                Some("too long")
            } else if crate::store::schema::is_runtime_entry(&call.id) {
                // The deadline index's names for the runtime's own entries (a resume the
                // runtime owes the session, a look at a remote sub-agent).
                Some("reserved")
            } else {
                None
            };
            if let Some(reason) = reason {
                let base = format!("call-{seq}-{index}");
                let mut assigned = base.clone();
                let mut n = 1u32;
                while used.contains(&assigned)
                    || given.contains(&assigned)
                    || conversation.contains(&assigned)
                {
                    n += 1;
                    assigned = format!("{base}-{n}");
                }
                let original = std::mem::replace(&mut call.id, assigned.clone());
                cx.push(Effect::Observe(Observation::CallIdAssigned {
                    original,
                    assigned,
                    reason,
                }));
            }
            used.insert(call.id.clone());
        }
    }
}
