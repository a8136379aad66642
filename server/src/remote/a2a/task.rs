//! What an A2A 1.0 task (its JSON as `GetTask` answers it) means to the parent of the remote
//! child it stands for: its state as a dormant status, the calls it waits on, its result.
//!
//! A task in `INPUT_REQUIRED` or `AUTH_REQUIRED` waits on calls, read from its status message.
//! A dormant server (its card declares dormant's extension) lists them itself (a data part
//! `{"pending": [...]}`, each entry a call of its tree with its kind, approval id and schemas),
//! and those are routed call by call; its message's `metadata.dormant` says when the next
//! message resumes the run instead (`interrupted`, `resumable`). Any other agent's request
//! for input is one client call, `a2a-input-{messageId}`, whose input is what the agent said
//! (its text and data parts).

use dormant::remote::RemoteCall;
use dormant::types::{ErrorCode, RunError};
use dormant::{PendingKind, Status};
use serde_json::{json, Value};

/// The id prefix of a call that stands for an A2A agent's own request for input.
pub(super) const INPUT_CALL: &str = "a2a-input-";

/// A task's state, in A2A 1.0's names (`TASK_STATE_WORKING`); older spellings
/// (`input-required`) are read too.
pub(super) fn state(task: &Value) -> String {
    let raw = task["status"]["state"].as_str().unwrap_or_default();
    let upper = raw.to_ascii_uppercase().replace('-', "_");
    if upper.starts_with("TASK_STATE_") {
        upper
    } else {
        format!("TASK_STATE_{upper}")
    }
}

/// Whether the task is still at work (nothing for its parent to act on yet).
pub(super) fn working(state: &str) -> bool {
    matches!(
        state,
        "TASK_STATE_SUBMITTED" | "TASK_STATE_WORKING" | "TASK_STATE_UNSPECIFIED"
    )
}

/// Whether the task waits for its client (input or credentials).
pub(super) fn waits(state: &str) -> bool {
    matches!(
        state,
        "TASK_STATE_INPUT_REQUIRED" | "TASK_STATE_AUTH_REQUIRED"
    )
}

/// A call of an A2A agent's own request for input: its id and what its input says. `asked_ms`
/// is when this side first saw it; its deadline runs from there.
pub(super) struct InputRequest {
    pub(super) message_id: String,
    pub(super) input: Value,
}

/// What a waiting task waits on: the calls a dormant server lists, the one request for input
/// any other agent makes, or, from a dormant server, a run the next message resumes: one a
/// crash (or an interrupt) cut, or one whose every answer is in.
pub(super) enum Waiting {
    Listed(Vec<RemoteCall>),
    Asked(InputRequest),
    Interrupted(ErrorCode),
    Resumable,
}

impl Waiting {
    /// Whether the next message resumes the run (nothing to answer first).
    pub(super) fn resumes(&self) -> bool {
        matches!(self, Waiting::Interrupted(_) | Waiting::Resumable)
    }
}

/// What `task`, in `state`, waits on; `dormant`: the agent is a dormant server.
pub(super) fn waiting(task: &Value, state: &str, dormant: bool) -> Waiting {
    let message = &task["status"]["message"];
    if dormant {
        let marker = &message["metadata"]["dormant"];
        if let Some(code) = marker.get("interrupted") {
            return Waiting::Interrupted(
                serde_json::from_value(code.clone()).unwrap_or(ErrorCode::Interrupted),
            );
        }
        if marker["resumable"] == true {
            return Waiting::Resumable;
        }
        return Waiting::Listed(listed_calls(message).unwrap_or_default());
    }
    let message_id = message["messageId"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("{}-{}", task["id"].as_str().unwrap_or("task"), state));
    Waiting::Asked(InputRequest {
        message_id,
        input: json!({
            "task_id": task["id"],
            "state": state,
            "text": text_of(message),
            "data": data_of(message),
        }),
    })
}

/// A dormant server's list of the calls its task waits on: a data part `{"pending": [...]}`
/// whose every entry reads as a call.
fn listed_calls(message: &Value) -> Option<Vec<RemoteCall>> {
    message["parts"].as_array()?.iter().find_map(|part| {
        let pending = part["data"]["pending"].as_array()?;
        let calls: Vec<RemoteCall> = pending
            .iter()
            .map(|entry| serde_json::from_value(entry.clone()))
            .collect::<Result<_, _>>()
            .ok()?;
        (!calls.is_empty()).then_some(calls)
    })
}

/// The call that stands for an agent's own request for input, first seen at `asked_ms`, due
/// `timeout_ms` later.
pub(super) fn input_call(
    context: &str,
    agent: &str,
    request: &InputRequest,
    asked_ms: u64,
    timeout_ms: u64,
) -> RemoteCall {
    RemoteCall {
        owner: context.to_string(),
        tool_call_id: input_call_id(&request.message_id),
        tool_name: "a2a_input".to_string(),
        kind: PendingKind::Client,
        approval_id: None,
        input: request.input.clone(),
        requested_at_ms: asked_ms,
        deadline_at_ms: asked_ms.saturating_add(timeout_ms),
        waiting: true,
        answered: false,
        timed_out: false,
        idempotency_key: None,
        binding: None,
        description: Some(format!("The A2A agent {agent} asks for input.")),
        input_schema: None,
        output_schema: None,
        editable: false,
        request: None,
        question: None,
    }
}

/// `a2a-input-` and the message's id, kept to characters a call id may hold.
pub(super) fn input_call_id(message_id: &str) -> String {
    let safe: String = message_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(96)
        .collect();
    format!("{INPUT_CALL}{safe}")
}

/// Whether the task's history holds the message `message_id` (an answer sent before), or an
/// agent message whose request is `call` (asked before, so answered or passed over since).
pub(super) fn in_history(task: &Value, message_id: &str, call: &str) -> bool {
    task["history"].as_array().is_some_and(|history| {
        history.iter().any(|message| {
            let id = message["messageId"].as_str().unwrap_or_default();
            id == message_id
                || ((message["role"] == "ROLE_AGENT" || message["role"] == "agent")
                    && input_call_id(id) == call)
        })
    })
}

/// The text parts of a message or artifact, joined by lines (`None` without any).
pub(super) fn text_of(holder: &Value) -> Option<String> {
    let texts: Vec<&str> = holder["parts"]
        .as_array()?
        .iter()
        .filter_map(|part| part["text"].as_str())
        .collect();
    (!texts.is_empty()).then(|| texts.join("\n"))
}

fn data_of(holder: &Value) -> Vec<Value> {
    holder["parts"]
        .as_array()
        .map(|parts| {
            parts
                .iter()
                .filter_map(|part| part.get("data").cloned())
                .collect()
        })
        .unwrap_or_default()
}

/// A completed task's result: the text of its artifacts (else of its status message), and the
/// first data part among them as its value.
pub(super) fn result(task: &Value) -> (Option<String>, Option<Value>) {
    let artifacts = task["artifacts"].as_array().cloned().unwrap_or_default();
    let texts: Vec<String> = artifacts.iter().filter_map(text_of).collect();
    let output = artifacts
        .iter()
        .flat_map(data_of)
        .next()
        .or_else(|| data_of(&task["status"]["message"]).into_iter().next());
    let text = if texts.is_empty() {
        text_of(&task["status"]["message"])
    } else {
        Some(texts.join("\n"))
    };
    (text, output)
}

/// A task that ended other than completed, as the run error its parent reports.
pub(super) fn ended(task: &Value, state: &str) -> (Status, bool, RunError) {
    let said = text_of(&task["status"]["message"]).unwrap_or_default();
    if state == "TASK_STATE_CANCELED" {
        let error = RunError {
            code: ErrorCode::Aborted,
            message: format!("the A2A task was canceled {said}")
                .trim_end()
                .to_string(),
        };
        return (Status::Interrupted, true, error);
    }
    let error = RunError {
        code: ErrorCode::ModelError,
        message: format!("the A2A task ended {state}: {said}"),
    };
    (Status::Failed, false, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_read_in_either_spelling() {
        assert_eq!(
            state(&json!({"status": {"state": "input-required"}})),
            "TASK_STATE_INPUT_REQUIRED"
        );
        assert_eq!(
            state(&json!({"status": {"state": "TASK_STATE_WORKING"}})),
            "TASK_STATE_WORKING"
        );
        assert!(working("TASK_STATE_SUBMITTED"));
        assert!(waits("TASK_STATE_AUTH_REQUIRED"));
    }

    #[test]
    fn an_agents_own_request_is_one_client_call_named_by_its_message() {
        let task = json!({
            "id": "t-1",
            "status": {"state": "TASK_STATE_INPUT_REQUIRED", "message": {
                "messageId": "m/1 x", "role": "ROLE_AGENT",
                "parts": [{"text": "Which account?"}, {"data": {"choices": [1, 2]}}]
            }}
        });
        let Waiting::Asked(request) = waiting(&task, "TASK_STATE_INPUT_REQUIRED", false) else {
            panic!("an agent's own request is asked");
        };
        let call = input_call("ctx", "billing", &request, 1_000, 500);
        assert_eq!(call.tool_call_id, "a2a-input-m1x");
        assert_eq!(call.input["text"], "Which account?");
        assert_eq!(call.input["data"], json!([{"choices": [1, 2]}]));
        assert_eq!(call.deadline_at_ms, 1_500);
        assert_eq!(call.kind, PendingKind::Client);
    }

    #[test]
    fn a_dormant_servers_list_is_read_call_by_call() {
        let task = json!({"status": {"state": "TASK_STATE_INPUT_REQUIRED", "message": {
        "messageId": "s", "parts": [{"text": "waits"}, {"data": {"pending": [
            {"session_id": "c", "tool_call_id": "a-1", "tool_name": "ask", "kind": "client"},
            {"session_id": "c", "tool_call_id": "p-1", "tool_name": "pay", "kind": "approval",
             "approval_id": "r::p-1"}
        ]}}]}}});
        let Waiting::Listed(calls) = waiting(&task, "TASK_STATE_INPUT_REQUIRED", true) else {
            panic!("a dormant server's list is read");
        };
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].kind, PendingKind::Approval);
        assert_eq!(calls[1].approval_id.as_deref(), Some("r::p-1"));
    }

    #[test]
    fn a_dormant_servers_markers_are_read_from_its_metadata_only() {
        let task = |marker: Value| {
            json!({"status": {"state": "TASK_STATE_INPUT_REQUIRED", "message": {
                "messageId": "s", "parts": [{"text": "go on?"}, {"data": {"interrupted": "x"}}],
                "metadata": {"dormant": marker}}}})
        };
        let state = "TASK_STATE_INPUT_REQUIRED";
        let crashed = task(json!({"interrupted": "crashed"}));
        assert!(matches!(
            waiting(&crashed, state, true),
            Waiting::Interrupted(ErrorCode::Crashed)
        ));
        assert!(waiting(&task(json!({"resumable": true})), state, true).resumes());
        // Another agent's data part that happens to say "interrupted" is what it said.
        assert!(matches!(waiting(&crashed, state, false), Waiting::Asked(_)));
    }

    #[test]
    fn history_shows_an_answer_sent_and_a_request_asked() {
        let task = json!({"history": [
            {"messageId": "q-1", "role": "ROLE_AGENT"},
            {"messageId": "ctx-a2a-input-q-1-answer", "role": "ROLE_USER"},
        ]});
        assert!(in_history(
            &task,
            "ctx-a2a-input-q-1-answer",
            "a2a-input-none"
        ));
        assert!(in_history(&task, "none", "a2a-input-q-1"));
        assert!(!in_history(&task, "none", "a2a-input-q-2"));
    }

    #[test]
    fn a_result_is_the_artifacts_text_and_first_value() {
        let task = json!({"artifacts": [{"parts": [{"text": "done"}, {"data": {"n": 1}}]}]});
        assert_eq!(result(&task), (Some("done".into()), Some(json!({"n": 1}))));
        let bare = json!({"status": {"message": {"parts": [{"text": "ok"}]}}});
        assert_eq!(result(&bare), (Some("ok".into()), None));
    }
}
