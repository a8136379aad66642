//! dormant's stream as AG-UI events (AG-UI 1.0: `RUN_STARTED`, `TEXT_MESSAGE_*`,
//! `TOOL_CALL_*`, `STATE_SNAPSHOT`, `RUN_FINISHED` with a success or an interrupt outcome,
//! `RUN_ERROR`): one translator per run, fed the stream's chunks and deltas in order.
//!
//! Text streamed as deltas opens a message that the step's `text` chunk closes; a step that
//! did not stream is one message of its whole text. A tool call streamed as deltas opens with
//! its id and name and gets its arguments in fragments; the step's `tool_start` chunk closes
//! it (or opens, fills and closes it at once). A sub-agent's chunks, copied into its parent's
//! stream, are not run events of this thread: they are left out (its waiting calls are in the
//! interrupt the run finishes with).

use std::collections::HashMap;

use dormant::types::{ChunkKind, Delta, DeltaKind, ToolOutcome};
use dormant::Chunk;
use serde_json::{json, Value};

/// What the run ended with, when its stream settles.
#[derive(Debug)]
pub(crate) enum Settled {
    /// It completed, with its finish value or final text.
    Completed(Option<Value>),
    /// It suspended: the calls of the tree that wait for a person.
    Suspended,
    /// It failed or was interrupted.
    Failed { code: String, message: String },
}

/// Translates one run's chunks and deltas.
#[derive(Debug, Default)]
pub(crate) struct Translator {
    /// The message open for a step's streamed text: (run, step) → message id.
    open_text: Option<(String, String)>,
    /// Tool calls opened by deltas: (run and step, position) → call id.
    open_calls: HashMap<(String, u32), String>,
    last_text: String,
}

impl Translator {
    /// The events of a live delta.
    pub(crate) fn delta(&mut self, delta: &Delta) -> Vec<Value> {
        let step = format!("{}-{}", delta.run_id, delta.step);
        match &delta.kind {
            DeltaKind::TextDelta { text } if !text.is_empty() => {
                let mut events = Vec::new();
                let id = match &self.open_text {
                    Some((open, id)) if *open == step => id.clone(),
                    _ => {
                        let id = format!("msg-{step}");
                        events.push(json!({ "type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant" }));
                        self.open_text = Some((step, id.clone()));
                        id
                    }
                };
                events.push(
                    json!({ "type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": text }),
                );
                events
            }
            DeltaKind::ToolCallDelta {
                position,
                id,
                name,
                arguments,
            } => {
                let key = (step, *position);
                let mut events = Vec::new();
                if !self.open_calls.contains_key(&key) {
                    let (Some(id), Some(name)) = (id, name) else {
                        return events; // arguments before the call is named: wait for it
                    };
                    events.push(json!({ "type": "TOOL_CALL_START", "toolCallId": id, "toolCallName": name }));
                    self.open_calls.insert(key.clone(), id.clone());
                }
                if let (Some(call), false) = (self.open_calls.get(&key), arguments.is_empty()) {
                    events.push(
                        json!({ "type": "TOOL_CALL_ARGS", "toolCallId": call, "delta": arguments }),
                    );
                }
                events
            }
            _ => Vec::new(),
        }
    }

    /// Closes what deltas opened and no chunk closed (a stream cut short, a model call that
    /// failed): no run ends with a message or a call still open.
    pub(crate) fn close_open(&mut self) -> Vec<Value> {
        let mut events = Vec::new();
        if let Some((_, id)) = self.open_text.take() {
            events.push(json!({ "type": "TEXT_MESSAGE_END", "messageId": id }));
        }
        let mut open: Vec<String> = self.open_calls.drain().map(|(_, id)| id).collect();
        open.sort();
        open.dedup();
        for id in open {
            events.push(json!({ "type": "TOOL_CALL_END", "toolCallId": id }));
        }
        events
    }

    /// The events of a stored chunk of this thread's own run, and whether it settles the run
    /// (with how).
    pub(crate) fn chunk(&mut self, chunk: &Chunk) -> (Vec<Value>, Option<Settled>) {
        let step = format!("{}-chunk{}", chunk.run_id, chunk.seq);
        match &chunk.kind {
            ChunkKind::Text { text } => {
                self.last_text = text.clone();
                let mut events = Vec::new();
                match self.open_text.take() {
                    Some((_, id)) => {
                        events.push(json!({ "type": "TEXT_MESSAGE_END", "messageId": id }));
                    }
                    None if !text.is_empty() => {
                        let id = format!("msg-{step}");
                        events.push(json!({ "type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant" }));
                        events.push(json!({ "type": "TEXT_MESSAGE_CONTENT", "messageId": id, "delta": text }));
                        events.push(json!({ "type": "TEXT_MESSAGE_END", "messageId": id }));
                    }
                    None => {}
                }
                (events, None)
            }
            ChunkKind::ToolStart {
                tool_call_id,
                tool_name,
                input,
            } => {
                let mut events = Vec::new();
                // Opened by its deltas: closed here; else opened, filled and closed at once.
                let streamed = self.open_calls.values().any(|id| id == tool_call_id);
                if !streamed {
                    events.push(json!({ "type": "TOOL_CALL_START", "toolCallId": tool_call_id, "toolCallName": tool_name }));
                    events.push(json!({ "type": "TOOL_CALL_ARGS", "toolCallId": tool_call_id, "delta": input.to_string() }));
                }
                events.push(json!({ "type": "TOOL_CALL_END", "toolCallId": tool_call_id }));
                self.open_calls.retain(|_, id| id != tool_call_id);
                (events, None)
            }
            ChunkKind::ToolEnd {
                tool_call_id,
                outcome,
                ..
            } => {
                let content = match outcome {
                    ToolOutcome::Result(value) => value.to_string(),
                    ToolOutcome::Error(error) => json!({ "error": error }).to_string(),
                };
                let event = json!({
                    "type": "TOOL_CALL_RESULT",
                    "messageId": format!("result-{}-{tool_call_id}", chunk.run_id),
                    "toolCallId": tool_call_id,
                    "content": content,
                    "role": "tool",
                });
                (vec![event], None)
            }
            ChunkKind::RunSuspended { .. } => (Vec::new(), Some(Settled::Suspended)),
            ChunkKind::RunEnd { error: None, .. } => {
                let text =
                    (!self.last_text.is_empty()).then(|| Value::from(self.last_text.clone()));
                (Vec::new(), Some(Settled::Completed(text)))
            }
            ChunkKind::RunEnd {
                error: Some(error), ..
            }
            | ChunkKind::RunInterrupted { error: Some(error) } => (
                Vec::new(),
                Some(Settled::Failed {
                    code: error.code.as_str().to_string(),
                    message: error.message.clone(),
                }),
            ),
            ChunkKind::RunInterrupted { error: None } => (
                Vec::new(),
                Some(Settled::Failed {
                    code: "interrupted".into(),
                    message: "the run was interrupted".into(),
                }),
            ),
            // Approval requests and decisions are in the interrupt; sub-agents' chunks are not
            // this run's events.
            _ => (Vec::new(), None),
        }
    }
}
