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

/// A message opened by a step's text deltas.
#[derive(Debug)]
struct OpenText {
    /// The run and step whose deltas these are.
    step: String,
    id: String,
    /// The text streamed so far: a prefix of the step's text, which its `text` chunk completes.
    streamed: String,
    /// The index the next delta must have; after a gap nothing more is streamed (the chunk
    /// sends the rest).
    next: u32,
    gapped: bool,
}

/// Translates one run's chunks and deltas.
#[derive(Debug, Default)]
pub(crate) struct Translator {
    /// The message open for a step's streamed text.
    open_text: Option<OpenText>,
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
                if self.open_text.as_ref().is_none_or(|open| open.step != step) {
                    // A step's first delta missed (its index is not 0): nothing streams, the
                    // step's text chunk sends it whole.
                    if delta.index != 0 {
                        return events;
                    }
                    let id = format!("msg-{step}");
                    events.push(json!({ "type": "TEXT_MESSAGE_START", "messageId": id, "role": "assistant" }));
                    self.open_text = Some(OpenText {
                        step,
                        id,
                        streamed: String::new(),
                        next: 0,
                        gapped: false,
                    });
                }
                let Some(open) = self.open_text.as_mut() else {
                    return events;
                };
                // A delta missed: what is streamed stays a prefix of the text; the chunk sends
                // the rest.
                open.gapped |= delta.index != open.next;
                open.next = delta.index.saturating_add(1);
                if !open.gapped {
                    open.streamed.push_str(text);
                    events.push(json!({ "type": "TEXT_MESSAGE_CONTENT", "messageId": open.id, "delta": text }));
                }
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
        if let Some(open) = self.open_text.take() {
            events.push(json!({ "type": "TEXT_MESSAGE_END", "messageId": open.id }));
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
                    Some(open) => {
                        // What the deltas did not bring (one missed, or the last ones).
                        let rest = text
                            .strip_prefix(open.streamed.as_str())
                            .unwrap_or_default();
                        if !rest.is_empty() {
                            events.push(json!({ "type": "TEXT_MESSAGE_CONTENT", "messageId": open.id, "delta": rest }));
                        }
                        events.push(json!({ "type": "TEXT_MESSAGE_END", "messageId": open.id }));
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

/// A thread's conversation as AG-UI's `MESSAGES_SNAPSHOT`: what a client needs to go on from
/// an interrupt (AG-UI: state and messages are snapshotted before the interrupt). Ids are the
/// messages' positions in the session's conversation, stable across runs.
pub(crate) fn messages_snapshot(messages: &[dormant::Message]) -> Value {
    let messages: Vec<Value> = messages
        .iter()
        .enumerate()
        .map(|(index, message)| {
            let id = format!("m{index}");
            match message {
                dormant::Message::User { text } => {
                    json!({ "id": id, "role": "user", "content": text })
                }
                dormant::Message::Assistant { text, tool_calls } => {
                    let mut out = json!({ "id": id, "role": "assistant" });
                    if let Some(text) = text {
                        out["content"] = Value::from(text.clone());
                    }
                    if !tool_calls.is_empty() {
                        let calls: Vec<Value> = tool_calls
                            .iter()
                            .map(|call| {
                                json!({ "id": call.id, "type": "function", "function": {
                                    "name": call.name, "arguments": call.input.to_string() } })
                            })
                            .collect();
                        out["toolCalls"] = Value::from(calls);
                    }
                    out
                }
                dormant::Message::Tool {
                    tool_call_id,
                    outcome,
                    ..
                } => {
                    let mut out = json!({ "id": id, "role": "tool", "toolCallId": tool_call_id });
                    match outcome {
                        ToolOutcome::Result(value) => {
                            out["content"] = Value::from(value.to_string())
                        }
                        ToolOutcome::Error(error) => {
                            out["content"] = json!({ "error": error }).to_string().into();
                            out["error"] = Value::from(error.clone());
                        }
                    }
                    out
                }
            }
        })
        .collect();
    json!({ "type": "MESSAGES_SNAPSHOT", "messages": messages })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dormant::RunId;

    fn delta(index: u32, text: &str) -> Delta {
        Delta {
            run_id: RunId::NONE,
            step: 1,
            index,
            after_seq: 0,
            kind: DeltaKind::TextDelta { text: text.into() },
        }
    }

    fn text_chunk(text: &str) -> Chunk {
        Chunk {
            seq: 3,
            run_id: RunId::NONE,
            at_ms: 0,
            kind: ChunkKind::Text { text: text.into() },
        }
    }

    fn streamed(events: &[Value]) -> String {
        events
            .iter()
            .filter(|event| event["type"] == "TEXT_MESSAGE_CONTENT")
            .filter_map(|event| event["delta"].as_str())
            .collect()
    }

    #[test]
    fn a_missed_delta_stops_the_stream_and_the_text_chunk_sends_the_rest() {
        let mut translator = Translator::default();
        let mut events = translator.delta(&delta(0, "Hel"));
        events.extend(translator.delta(&delta(2, "world")));
        events.extend(translator.chunk(&text_chunk("Hello world")).0);
        assert_eq!(streamed(&events), "Hello world");
        let types: Vec<&str> = events
            .iter()
            .filter_map(|event| event["type"].as_str())
            .collect();
        assert_eq!(types.first(), Some(&"TEXT_MESSAGE_START"));
        assert_eq!(types.last(), Some(&"TEXT_MESSAGE_END"));
    }

    #[test]
    fn deltas_that_arrive_whole_are_the_text_once() {
        let mut translator = Translator::default();
        let mut events = translator.delta(&delta(0, "Hello "));
        events.extend(translator.delta(&delta(1, "world")));
        events.extend(translator.chunk(&text_chunk("Hello world")).0);
        assert_eq!(streamed(&events), "Hello world");
    }
}
