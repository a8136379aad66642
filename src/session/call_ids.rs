//! The ids of a model's tool calls, made unique before anything is recorded.
//!
//! Everything the runtime keeps about a call is keyed by its id within the session: its
//! pending entry, its child entry and the child's session id (`{parent}-sub-{id}`), its
//! approval id, its tool result. A model may leave an id empty, use one twice in a reply, or
//! reuse one from an earlier step (a scripted model that numbers its calls per reply); then
//! two calls would share those keys, and one would lose its result or be unanswerable. So
//! when a reply arrives, before commit #1, each such call gets an id of the runtime's own,
//! and from then on that is the call's id everywhere: the stored assistant message (so the
//! model's next request), the stream, pending, child ids, approvals and tool results.
//!
//! A call keeps the model's id whenever that is free, which is the usual case. The new id is
//! `call-{seq}-{index}` (the assistant message's sequence number in the session and the call's
//! position in the reply), with `-2`, `-3`, … appended while it is taken: valid inside a
//! session id, unique in the conversation, and the same when the same reply is replayed
//! (after a crash before commit #1 the step asks the model again, and the sequence number is
//! the same).

use std::collections::HashSet;

use super::core::Session;
use super::{Effect, Observation};
use crate::message::{Message, ToolCall};

impl Session {
    /// Gives each call of `calls` whose id is empty, or is used by an earlier call of the same
    /// reply or by any call in the conversation the model was sent, an id of the runtime's
    /// own (see the module's documentation), and reports each change as an observation (the
    /// actor logs it).
    pub(super) fn assign_call_ids(&self, calls: &mut [ToolCall], effects: &mut Vec<Effect>) {
        let mut used: HashSet<String> = self
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
        // The model's own ids in this reply: a new id must not take one a later call keeps.
        let given: HashSet<String> = calls.iter().map(|call| call.id.clone()).collect();
        let seq = self.record.message_count;
        for (index, call) in calls.iter_mut().enumerate() {
            let reason = if call.id.is_empty() {
                Some("empty")
            } else if used.contains(&call.id) {
                Some("repeated")
            } else {
                None
            };
            if let Some(reason) = reason {
                let base = format!("call-{seq}-{index}");
                let mut assigned = base.clone();
                let mut n = 1u32;
                while used.contains(&assigned) || given.contains(&assigned) {
                    n += 1;
                    assigned = format!("{base}-{n}");
                }
                let original = std::mem::replace(&mut call.id, assigned.clone());
                effects.push(Effect::Observe(Observation::CallIdAssigned {
                    original,
                    assigned,
                    reason,
                }));
            }
            used.insert(call.id.clone());
        }
    }
}
