//! An answer given at the parent's root for a call an A2A child waits on, sent as the task's
//! follow-up message. A dormant server's call goes as a data part of the submit envelope and
//! its submit contract judges it; another agent's request for input is answered once.

use dormant::session::SubmitAnswer;
use dormant::{Submit, SubmitOutcome};
use serde_json::{json, Value};

use super::task::{self, Waiting};
use super::wire::Failed;
use super::{now_ms, A2aClient};
use dormant::remote::RemoteError;

impl A2aClient {
    pub(in crate::remote) async fn submit(
        &self,
        base: &str,
        submit: &Submit,
    ) -> Result<SubmitOutcome, RemoteError> {
        let interface = self.interface(base).await?;
        let context = submit.session_id.as_str();
        let lock = self.context_lock(base, context);
        let _one_at_a_time = lock.lock().await;
        let Some(id) = self.task_of(base, context).await? else {
            return Ok(SubmitOutcome::UnknownToolCall);
        };
        let call = submit.tool_call_id.as_str();
        let message_id = format!("{context}-{call}-answer");
        let part = if interface.dormant {
            // Its submit contract judges the answer (the envelope's fields, without the
            // session this side names): duplicates, kinds, schemas, a sub-agent's calls.
            let mut envelope = submit.to_json();
            if let Some(fields) = envelope.as_object_mut() {
                fields.remove("session_id");
                fields.remove("via_root");
            }
            json!({ "data": envelope })
        } else {
            match self
                .judge(base, context, &id, call, &message_id, &submit.answer)
                .await?
            {
                Ok(part) => part,
                Err(outcome) => return Ok(outcome),
            }
        };
        let params = json!({
            "message": {
                "messageId": message_id, "contextId": context, "taskId": id,
                "role": "ROLE_USER", "parts": [part],
            },
            "configuration": { "returnImmediately": true },
        });
        let key = call_key(base, context, call);
        match self.rpc_sent(base, "SendMessage", params, None).await {
            Ok(_) => Ok(SubmitOutcome::Accepted),
            Err(Failed {
                error: RemoteError::Refused { code, message, .. },
                ..
            }) if outcome(&code, &message).is_some() => {
                self.known.lock().answered.remove(&key);
                Ok(outcome(&code, &message).unwrap_or(SubmitOutcome::UnknownToolCall))
            }
            Err(Failed { error, maybe_sent }) => {
                // A request that may have arrived stays answered (at most once): a retry is
                // `already_completed`, and the task's next state says whether it went on.
                if !maybe_sent {
                    self.known.lock().answered.remove(&key);
                }
                Err(error)
            }
        }
    }

    /// Another agent's request for input, answered: the part that answers it (marking it
    /// answered), or what the submit contract says of an answer it does not take.
    async fn judge(
        &self,
        base: &str,
        context: &str,
        id: &str,
        call: &str,
        message_id: &str,
        answer: &SubmitAnswer,
    ) -> Result<Result<Value, SubmitOutcome>, RemoteError> {
        let key = call_key(base, context, call);
        if self.known.lock().answered.contains(&key) {
            return Ok(Err(SubmitOutcome::AlreadyCompleted));
        }
        let task = self.get_task(base, id).await?;
        let state = task::state(&task);
        // Answered by a process before a restart, or asked before and passed over since.
        if task::in_history(&task, message_id, call) {
            return Ok(Err(SubmitOutcome::AlreadyCompleted));
        }
        let asks = match task::waiting(&task, &state, false) {
            Waiting::Asked(request) if task::waits(&state) => {
                task::input_call_id(&request.message_id) == call
            }
            _ => false,
        };
        if !asks {
            return Ok(Err(SubmitOutcome::UnknownToolCall));
        }
        let asked = self.asked_at(base, context, call, now_ms());
        if now_ms() >= asked.saturating_add(self.input_timeout_ms()) {
            // Its deadline passed: the next look cancels the task.
            return Ok(Err(SubmitOutcome::AlreadyCompleted));
        }
        let part = match answer {
            SubmitAnswer::Result(Value::String(text)) => json!({ "text": text }),
            SubmitAnswer::Result(value) => json!({ "data": value }),
            SubmitAnswer::Error(text) => json!({
                "text": text, "metadata": { "dormant": { "error": true } },
            }),
            _ => {
                return Ok(Err(SubmitOutcome::InvalidRequest {
                    reason: format!(
                        "{call} is an A2A agent's request for input: answer it with a result or an error"
                    ),
                }))
            }
        };
        self.known.lock().answered.insert(key);
        Ok(Ok(part))
    }
}

/// The key of one call of one child, in the client's memory.
pub(super) fn call_key(base: &str, context: &str, call: &str) -> String {
    format!("{base} {context} {call}")
}

/// A submit outcome a dormant server's refusal names.
fn outcome(code: &str, message: &str) -> Option<SubmitOutcome> {
    Some(match code {
        "already_completed" => SubmitOutcome::AlreadyCompleted,
        "unknown_tool_call" => SubmitOutcome::UnknownToolCall,
        "invalid_request" => SubmitOutcome::InvalidRequest {
            reason: message.to_string(),
        },
        "invalid_result" => SubmitOutcome::InvalidResult {
            reason: message.to_string(),
            errors: Vec::new(),
        },
        "stale_approval" => SubmitOutcome::StaleApproval {
            reason: message.to_string(),
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dormant_servers_refusals_are_its_submit_outcomes() {
        assert_eq!(
            outcome("already_completed", ""),
            Some(SubmitOutcome::AlreadyCompleted)
        );
        assert!(matches!(
            outcome("stale_approval", "changed"),
            Some(SubmitOutcome::StaleApproval { .. })
        ));
        assert_eq!(outcome("a2a_-32603", "boom"), None);
    }
}
