//! The JSON envelope a `submit` step sends: built from the step's fields, or its `raw` value
//! whole. Both go through [`Runtime::submit_json`], so the runtime parses every submit the
//! way it parses a client's.

use serde_json::{Map, Value};

use super::format::SubmitStep;
use super::tree;
use crate::runtime::Runtime;
use crate::types::ids::SessionId;
use crate::types::stream::ChunkKind;

/// The `approval_id` that stands for the correct `{runId}::{toolCallId}` of the call.
pub(crate) const AUTO_APPROVAL_ID: &str = "auto";

/// The envelope of `step`: `raw` as is, or `session_id`, `tool_call_id` and each answer field
/// the step gives (`kind` only when given: the runtime's default is part of what is tested).
/// `approval_id: "auto"` becomes the call's real approval id when the runtime knows the call,
/// and stays `"auto"` (a wrong id) when it does not.
pub(crate) async fn build(step: &SubmitStep, runtime: &Runtime) -> Value {
    if let Some(raw) = &step.raw {
        return raw.clone();
    }
    let session = step.session.clone().unwrap_or_default();
    let call = step.tool_call.clone().unwrap_or_default();
    let mut envelope = Map::new();
    if let Some(kind) = step.kind {
        envelope.insert("kind".into(), kind.as_str().into());
    }
    envelope.insert("session_id".into(), session.clone().into());
    envelope.insert("tool_call_id".into(), call.clone().into());
    if let Some(result) = &step.result {
        envelope.insert("result".into(), result.clone());
    }
    if let Some(error) = &step.error {
        envelope.insert("error".into(), error.clone().into());
    }
    if let Some(approved) = step.approved {
        envelope.insert("approved".into(), approved.into());
    }
    if let Some(reason) = &step.reason {
        envelope.insert("reason".into(), reason.clone().into());
    }
    if let Some(input) = &step.edited_input {
        envelope.insert("edited_input".into(), input.clone());
    }
    if let Some(binding) = &step.binding {
        envelope.insert("binding".into(), binding.clone().into());
    }
    if let Some(happened) = step.happened {
        envelope.insert("happened".into(), happened.into());
    }
    if let Some(approval_id) = &step.approval_id {
        let approval_id = if approval_id == AUTO_APPROVAL_ID {
            let found = match session.parse() {
                Ok(session) => approval_id_of(runtime, &session, &call).await,
                Err(_) => None,
            };
            found.unwrap_or_else(|| approval_id.clone())
        } else {
            approval_id.clone()
        };
        envelope.insert("approval_id".into(), approval_id.into());
    }
    Value::Object(envelope)
}

/// The approval id of call `call` in the tree of `session`: from its pending entry while it
/// has one, else from the last `tool_approval_request` chunk that announced it.
async fn approval_id_of(runtime: &Runtime, session: &SessionId, call: &str) -> Option<String> {
    // A call a remote child's tree waits on: the root records it with its approval id.
    if let Ok(remote) = runtime.pending_remote(session).await {
        if let Some((_, found)) = remote
            .into_iter()
            .find(|(_, found)| found.tool_call_id == call)
        {
            return found.approval_id;
        }
    }
    let members = tree::sessions(runtime, session).await.ok()?;
    for member in &members {
        let pending = runtime.pending(member).await.ok().unwrap_or_default();
        if let Some(found) = pending
            .into_iter()
            .find(|pending| pending.tool_call_id == call)
        {
            return Some(found.approval_id());
        }
    }
    for member in &members {
        let chunks = runtime.chunks(member, 0).await.ok().unwrap_or_default();
        let announced = chunks.into_iter().rev().find_map(|chunk| match chunk.kind {
            ChunkKind::ToolApprovalRequest {
                tool_call_id,
                approval_id,
                ..
            } if tool_call_id == call => Some(approval_id),
            _ => None,
        });
        if announced.is_some() {
            return announced;
        }
    }
    None
}
