//! The client side of A2A 1.0: the remote children of
//! [`ToolDefinition::a2a_agent`](dormant::ToolDefinition::a2a_agent), reached by
//! [`HttpRemoteAgents`](crate::HttpRemoteAgents) for every endpoint written `a2a+…`, over the
//! agent's JSON-RPC binding (the URL its agent card names).
//!
//! dormant's remote-child protocol, in A2A's terms:
//! - **start**: `SendMessage` (`returnImmediately`) whose `contextId` and `messageId` are the
//!   child's session id, which the parent chose and recorded in the commit that dispatched the
//!   call. A start replayed after a crash first asks `ListTasks` for that context and
//!   re-attaches to the task it finds: a child is never started twice.
//! - **status**: `GetTask`. `INPUT_REQUIRED` and `AUTH_REQUIRED` are suspended on the calls
//!   its status message lists (`a2a_task.rs`).
//! - **chunks**: none (an A2A stream is not dormant's chunks): a stream that ends once the task
//!   is no longer at work, found by asking `GetTask` at growing intervals.
//! - **submit**: the follow-up message (`taskId`), its part the answer. A dormant server's
//!   submit contract judges its own calls; an agent's own request is answered once.
//! - **resume**: nothing to do (the follow-up message goes on). **stop**: `CancelTask`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dormant::remote::{RemoteChunks, RemoteError, RemoteParent, RemoteStart, RemoteStatus};
use dormant::session::SubmitAnswer;
use dormant::{SessionId, Status, Submit, SubmitOutcome};
use futures::StreamExt;
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::a2a_task::{self, Waiting};
use crate::client::HttpClient;

/// How long an A2A agent's own request for input waits for an answer at the root by default
/// (an agent says no deadline of its own): a day.
pub const DEFAULT_A2A_INPUT_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest wait between two looks at a task at work.
const MAX_POLL: Duration = Duration::from_secs(1);

/// How long a status waits for a task at work to stop working before it says it works.
const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// Speaks A2A to remote children: one per [`HttpRemoteAgents`](crate::HttpRemoteAgents).
pub(super) struct A2aClient {
    client: HttpClient,
    credential: Option<String>,
    input_timeout: Duration,
    known: Mutex<Known>,
    /// One answer at a time: an answer reads where the task stands before it sends.
    answering: tokio::sync::Mutex<()>,
}

/// Where an agent takes JSON-RPC requests, and whether it can stream a task's updates
/// (`SubscribeToTask`), as its card says.
#[derive(Clone)]
struct Interface {
    url: String,
    streaming: bool,
}

/// What this process learned of the agents it speaks to. Only a cache: after a restart each
/// is asked again (the agent card, `ListTasks`).
#[derive(Default)]
struct Known {
    /// Each agent's JSON-RPC URL (by its base URL), and whether it streams, from its card.
    rpc_urls: HashMap<String, Interface>,
    /// The task of each child: `{base} {context}` → task id.
    tasks: HashMap<String, String>,
    /// A child whose agent answered its first message with a message, not a task: its text.
    direct: HashMap<String, Option<String>>,
    /// When each of an agent's own requests for input was first seen (ms since the epoch).
    asked: HashMap<String, u64>,
    /// The requests answered from here.
    answered: HashSet<String>,
}

impl A2aClient {
    pub(super) fn new(client: HttpClient, credential: Option<String>) -> Self {
        Self {
            client,
            credential,
            input_timeout: DEFAULT_A2A_INPUT_TIMEOUT,
            known: Mutex::new(Known::default()),
            answering: tokio::sync::Mutex::new(()),
        }
    }

    pub(super) fn with_input_timeout(mut self, timeout: Duration) -> Self {
        self.input_timeout = timeout;
        self
    }

    /// The agent's JSON-RPC interface, from its card (asked once).
    async fn interface(&self, base: &str) -> Result<Interface, RemoteError> {
        if let Some(url) = self.known.lock().rpc_urls.get(base) {
            return Ok(url.clone());
        }
        let card_url = format!("{base}/.well-known/agent-card.json");
        let response = self
            .authorized(self.client.reqwest().get(&card_url))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|error| super::unreachable(base, &error))?;
        if !response.status().is_success() {
            return Err(RemoteError::Refused {
                endpoint: base.to_string(),
                status: response.status().as_u16(),
                code: "agent_card".into(),
                message: format!("GET {card_url} answered {}", response.status()),
            });
        }
        let card: Value = response
            .json()
            .await
            .map_err(|error| protocol(base, format!("its agent card: {error}")))?;
        let url = card["supportedInterfaces"]
            .as_array()
            .and_then(|interfaces| {
                interfaces
                    .iter()
                    .find(|interface| interface["protocolBinding"] == "JSONRPC")
            })
            .and_then(|interface| interface["url"].as_str())
            .or_else(|| card["url"].as_str())
            .ok_or_else(|| protocol(base, "its agent card names no JSON-RPC interface".into()))?
            .to_string();
        let interface = Interface {
            url,
            streaming: card["capabilities"]["streaming"] == true,
        };
        self.known
            .lock()
            .rpc_urls
            .insert(base.to_string(), interface.clone());
        Ok(interface)
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.credential {
            Some(credential) => request.header("x-api-key", credential),
            None => request,
        }
    }

    /// One JSON-RPC call: its result, or the agent's error as a typed refusal (dormant's own
    /// code when the agent is a dormant server that gave one).
    async fn rpc(&self, base: &str, method: &str, params: Value) -> Result<Value, RemoteError> {
        let url = self.interface(base).await?.url;
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
        let response = self
            .authorized(self.client.reqwest().post(&url))
            .header("A2A-Version", "1.0")
            .json(&body)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .map_err(|error| super::unreachable(base, &error))?;
        let status = response.status();
        let answer: Value = match response.json().await {
            Ok(answer) => answer,
            Err(error) if status.is_success() => {
                return Err(protocol(base, format!("{method}: {error}")))
            }
            Err(_) => Value::Null,
        };
        if let Some(error) = answer.get("error") {
            return Err(rpc_refusal(base, error));
        }
        if !status.is_success() {
            return Err(RemoteError::Refused {
                endpoint: base.to_string(),
                status: status.as_u16(),
                code: "http_error".into(),
                message: format!("{method} answered {status}"),
            });
        }
        answer
            .get("result")
            .cloned()
            .ok_or_else(|| protocol(base, format!("{method}: no result")))
    }

    /// The task of the child `context`: known here, else the agent's `ListTasks`. `None`: the
    /// agent has none (or cannot list them).
    async fn task_of(&self, base: &str, context: &str) -> Result<Option<String>, RemoteError> {
        let key = format!("{base} {context}");
        if let Some(task) = self.known.lock().tasks.get(&key) {
            return Ok(Some(task.clone()));
        }
        let listed = match self
            .rpc(
                base,
                "ListTasks",
                json!({ "contextId": context, "pageSize": 10 }),
            )
            .await
        {
            Ok(listed) => listed,
            // An agent that cannot list tasks: nothing found (a start sends its message).
            Err(RemoteError::Refused { code, .. }) if code == "a2a_-32601" => {
                tracing::warn!(endpoint = base, "a2a.list_tasks_unsupported");
                return Ok(None);
            }
            Err(error) => return Err(error),
        };
        // The context's latest task: the one whose status changed last, else the first
        // listed (A2A lists the latest first).
        let stamp = |task: &Value| {
            task["status"]["timestamp"]
                .as_str()
                .unwrap_or("")
                .to_string()
        };
        let task = listed["tasks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|task| task["contextId"] == context)
            .fold(None::<&Value>, |best, task| match best {
                Some(best) if stamp(task) <= stamp(best) => Some(best),
                _ => Some(task),
            })
            .and_then(|task| task["id"].as_str())
            .map(str::to_string);
        if let Some(task) = &task {
            self.known.lock().tasks.insert(key, task.clone());
        }
        Ok(task)
    }

    async fn get_task(&self, base: &str, task: &str) -> Result<Value, RemoteError> {
        self.rpc(base, "GetTask", json!({ "id": task, "historyLength": 50 }))
            .await
    }

    pub(super) async fn start(
        &self,
        base: &str,
        session: &SessionId,
        message: &str,
        parent: &RemoteParent,
    ) -> Result<RemoteStart, RemoteError> {
        if self.task_of(base, session.as_str()).await?.is_some() {
            return Ok(RemoteStart::Existed);
        }
        let params = json!({
            "message": {
                "messageId": session, "contextId": session, "role": "ROLE_USER",
                "parts": [{ "text": message }],
                "metadata": { "dormant": {
                    "parent_session_id": parent.parent, "root_session_id": parent.root,
                } },
            },
            "configuration": { "returnImmediately": true },
        });
        let answer = self.rpc(base, "SendMessage", params).await?;
        let key = format!("{base} {session}");
        if let Some(task) = answer["task"]["id"].as_str() {
            self.known.lock().tasks.insert(key, task.to_string());
        } else if let Some(message) = answer.get("message") {
            // Answered at once, with no task: the child's result.
            let text = a2a_task::text_of(message);
            self.known.lock().direct.insert(key, text);
        } else {
            return Err(protocol(
                base,
                "SendMessage: neither a task nor a message".into(),
            ));
        }
        Ok(RemoteStart::Started)
    }

    pub(super) async fn status(
        &self,
        base: &str,
        session: &SessionId,
    ) -> Result<RemoteStatus, RemoteError> {
        let context = session.as_str();
        let Some(id) = self.task_of(base, context).await? else {
            let direct = self
                .known
                .lock()
                .direct
                .get(&format!("{base} {context}"))
                .cloned();
            return match direct {
                Some(text) => Ok(status(Status::Completed, text, None)),
                None => Err(unknown_task(base, context)),
            };
        };
        // As a dormant server's status does, it waits a while for the task to stop working.
        let task = self.settle(base, &id, Some(SETTLE_WAIT)).await?;
        let state = a2a_task::state(&task);
        if a2a_task::working(&state) {
            return Ok(status(Status::Running, None, None));
        }
        if state == "TASK_STATE_COMPLETED" {
            let (text, output) = a2a_task::result(&task);
            return Ok(status(Status::Completed, text, output));
        }
        if !a2a_task::waits(&state) {
            let (run_status, aborted, error) = a2a_task::ended(&task, &state);
            let mut ended = status(run_status, None, None);
            ended.aborted = aborted;
            ended.error = Some(error);
            return Ok(ended);
        }
        let calls = match a2a_task::waiting(&task, &state) {
            Waiting::Listed(calls) => calls,
            Waiting::Interrupted(code) => {
                let mut interrupted = status(Status::Interrupted, None, None);
                interrupted.error = Some(dormant::types::RunError {
                    code,
                    message: "the remote run was interrupted".into(),
                });
                return Ok(interrupted);
            }
            Waiting::Asked(request) => {
                let call_id = a2a_task::input_call_id(&request.message_id);
                let now = now_ms();
                let asked = *self.known.lock().asked.entry(call_id).or_insert(now);
                let timeout = u64::try_from(self.input_timeout.as_millis()).unwrap_or(u64::MAX);
                let call = a2a_task::input_call(context, base, &request, asked, timeout);
                if now >= call.deadline_at_ms {
                    return self.expire(base, &id).await;
                }
                vec![call]
            }
        };
        let mut waiting = status(Status::SuspendedClientTool, None, None);
        waiting.pending = calls;
        Ok(waiting)
    }

    /// Nobody answered an agent's request for input by its deadline: the task is cancelled
    /// there, and the child failed here.
    async fn expire(&self, base: &str, task: &str) -> Result<RemoteStatus, RemoteError> {
        tracing::info!(endpoint = base, task, "a2a.input_timed_out");
        match self.rpc(base, "CancelTask", json!({ "id": task })).await {
            Ok(_) => {}
            Err(error) if error.is_retryable() => return Err(error),
            // Not cancelable (it ended meanwhile): the child fails all the same.
            Err(_) => {}
        }
        let mut failed = status(Status::Failed, None, None);
        failed.error = Some(dormant::types::RunError {
            code: dormant::types::ErrorCode::ModelError,
            message: format!(
                "nobody answered the A2A agent's request for input within {} s",
                self.input_timeout.as_secs()
            ),
        });
        Ok(failed)
    }

    /// Resumes a dormant server's run that was interrupted (a crash cut it) with a follow-up
    /// message, as its parent's resume asks; any other task goes on by itself.
    pub(super) async fn resume(&self, base: &str, session: &SessionId) -> Result<(), RemoteError> {
        let context = session.as_str();
        let Some(id) = self.task_of(base, context).await? else {
            return Err(unknown_task(base, context));
        };
        let task = self.get_task(base, &id).await?;
        let state = a2a_task::state(&task);
        if !matches!(a2a_task::waiting(&task, &state), Waiting::Interrupted(_)) {
            return Ok(());
        }
        let params = json!({
            "message": {
                "messageId": format!("{context}-resume-{}", now_ms()),
                "contextId": context, "taskId": id, "role": "ROLE_USER",
                "parts": [{ "text": "Go on." }],
            },
            "configuration": { "returnImmediately": true },
        });
        self.rpc(base, "SendMessage", params).await.map(drop)
    }

    /// A stream of no chunks that ends once the child's task is no longer at work: followed
    /// over `SubscribeToTask` when the agent streams, else asked with `GetTask` at growing
    /// intervals.
    pub(super) fn chunks(self: Arc<Self>, base: String, session: SessionId) -> RemoteChunks {
        futures::stream::once(async move {
            if let Some(id) = self.task_of(&base, session.as_str()).await? {
                self.settle(&base, &id, None).await?;
            }
            Ok(())
        })
        .filter_map(|done: Result<(), RemoteError>| async move { done.err().map(Err) })
        .boxed()
    }

    /// Task `id` once it no longer works, or as it stands after `bound`: followed over
    /// `SubscribeToTask` when the agent streams, else asked with `GetTask` at growing
    /// intervals.
    async fn settle(
        &self,
        base: &str,
        id: &str,
        bound: Option<Duration>,
    ) -> Result<Value, RemoteError> {
        let started = tokio::time::Instant::now();
        let mut wait = Duration::from_millis(10);
        loop {
            let task = self.get_task(base, id).await?;
            let over = bound.is_some_and(|bound| started.elapsed() >= bound);
            if over || !a2a_task::working(&a2a_task::state(&task)) {
                return Ok(task);
            }
            let interface = self.interface(base).await?;
            let left = bound.map(|bound| bound.saturating_sub(started.elapsed()));
            let followed = match (interface.streaming, left) {
                (false, _) => false,
                (true, None) => self.subscribe(base, &interface.url, id).await?,
                (true, Some(left)) => {
                    tokio::time::timeout(left, self.subscribe(base, &interface.url, id))
                        .await
                        .unwrap_or(Ok(true))?
                }
            };
            // A subscription that ended with the task still at work (the agent closed it) is
            // asked again after the same growing wait as a poll.
            if !followed {
                tokio::time::sleep(left.map_or(wait, |left| wait.min(left))).await;
                wait = (wait * 2).min(MAX_POLL);
            }
        }
    }

    /// Follows task `id` over `SubscribeToTask` until an update says it no longer works:
    /// `true` then, `false` if the stream ended (or was refused) before.
    async fn subscribe(&self, base: &str, url: &str, id: &str) -> Result<bool, RemoteError> {
        let body = json!({
            "jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": { "id": id },
        });
        let response = self
            .authorized(self.client.reqwest().post(url))
            .header("A2A-Version", "1.0")
            .header("accept", "text/event-stream")
            .json(&body)
            .send()
            .await
            .map_err(|error| super::unreachable(base, &error))?;
        if !response.status().is_success() {
            return Ok(false);
        }
        let events = super::sse::events(base.to_string(), response.bytes_stream());
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            let answer: Value = serde_json::from_str(&event?.data).unwrap_or_default();
            let result = &answer["result"];
            let status = if result["task"].is_object() {
                &result["task"]["status"]
            } else {
                &result["statusUpdate"]["status"]
            };
            if status.is_object()
                && !a2a_task::working(&a2a_task::state(&json!({ "status": status })))
            {
                return Ok(true);
            }
            if answer.get("error").is_some() {
                return Ok(false);
            }
        }
        Ok(false)
    }

    pub(super) async fn submit(
        &self,
        base: &str,
        submit: &Submit,
    ) -> Result<SubmitOutcome, RemoteError> {
        let _one_at_a_time = self.answering.lock().await;
        let context = submit.session_id.as_str();
        let Some(id) = self.task_of(base, context).await? else {
            return Ok(SubmitOutcome::UnknownToolCall);
        };
        let call = submit.tool_call_id.as_str();
        let part = if call.starts_with(a2a_task::INPUT_CALL) {
            let task = self.get_task(base, &id).await?;
            let state = a2a_task::state(&task);
            let asks = match a2a_task::waiting(&task, &state) {
                Waiting::Asked(request) if a2a_task::waits(&state) => {
                    a2a_task::input_call_id(&request.message_id) == call
                }
                _ => false,
            };
            if !asks {
                let before = self.known.lock().answered.contains(call)
                    || a2a_task::asked_before(&task).iter().any(|id| id == call);
                return Ok(if before {
                    SubmitOutcome::AlreadyCompleted
                } else {
                    SubmitOutcome::UnknownToolCall
                });
            }
            match &submit.answer {
                SubmitAnswer::Result(Value::String(text)) => json!({ "text": text }),
                SubmitAnswer::Result(value) => json!({ "data": value }),
                SubmitAnswer::Error(text) => json!({
                    "text": text, "metadata": { "dormant": { "error": true } },
                }),
                _ => {
                    return Ok(SubmitOutcome::InvalidRequest {
                        reason: format!(
                            "{call} is an A2A agent's request for input: answer it with a result or an error"
                        ),
                    })
                }
            }
        } else {
            // A dormant server's call: its submit contract judges the answer (the envelope's
            // fields, without the session this side names).
            let mut envelope = submit.to_json();
            if let Some(fields) = envelope.as_object_mut() {
                fields.remove("session_id");
                fields.remove("via_root");
            }
            json!({ "data": envelope })
        };
        let params = json!({
            "message": {
                "messageId": format!("{context}-{call}-answer"),
                "contextId": context, "taskId": id, "role": "ROLE_USER",
                "parts": [part],
            },
            "configuration": { "returnImmediately": true },
        });
        match self.rpc(base, "SendMessage", params).await {
            Ok(_) => {
                self.known.lock().answered.insert(call.to_string());
                Ok(SubmitOutcome::Accepted)
            }
            Err(RemoteError::Refused { code, message, .. })
                if outcome(&code, &message).is_some() =>
            {
                Ok(outcome(&code, &message).unwrap_or(SubmitOutcome::UnknownToolCall))
            }
            Err(error) => Err(error),
        }
    }

    pub(super) async fn stop(&self, base: &str, session: &SessionId) -> Result<(), RemoteError> {
        let Some(id) = self.task_of(base, session.as_str()).await? else {
            return Err(unknown_task(base, session.as_str()));
        };
        match self.rpc(base, "CancelTask", json!({ "id": id })).await {
            // Over already: nothing to stop.
            Err(RemoteError::Refused { code, .. }) if code == "a2a_-32002" => Ok(()),
            other => other.map(drop),
        }
    }
}

/// A status of no run in progress but `status`'s (no chunks: A2A has none of dormant's).
fn status(status: Status, text: Option<String>, output: Option<Value>) -> RemoteStatus {
    RemoteStatus {
        status,
        run_id: None,
        aborted: false,
        chunk_count: 0,
        text,
        output,
        error: None,
        pending: Vec::new(),
        settled: true,
        chunks: Vec::new(),
    }
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

/// A JSON-RPC error as a typed refusal: dormant's code from its `ErrorInfo` when it gave one,
/// else `a2a_{code}`; a task the agent does not know is a 404 (the child is lost).
fn rpc_refusal(base: &str, error: &Value) -> RemoteError {
    let number = error["code"].as_i64().unwrap_or_default();
    let dormant_code = error["data"].as_array().and_then(|details| {
        details
            .iter()
            .find_map(|detail| detail["metadata"]["code"].as_str())
    });
    let status = match number {
        -32001 => 404,
        -32700 | -32600 | -32602 => 400,
        -32601 | -32004 | -32003 | -32005 | -32009 => 501,
        -32002 => 409,
        _ => 502,
    };
    RemoteError::Refused {
        endpoint: base.to_string(),
        status,
        code: dormant_code.map_or_else(|| format!("a2a_{number}"), str::to_string),
        message: error["message"].as_str().unwrap_or_default().to_string(),
    }
}

fn unknown_task(base: &str, context: &str) -> RemoteError {
    RemoteError::Refused {
        endpoint: base.to_string(),
        status: 404,
        code: "unknown_task".into(),
        message: format!("the agent has no task in context {context}"),
    }
}

fn protocol(base: &str, reason: String) -> RemoteError {
    RemoteError::Protocol {
        endpoint: base.to_string(),
        reason,
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_errors_are_typed_refusals_with_dormants_code_when_given() {
        let plain = rpc_refusal("http://a", &json!({"code": -32001, "message": "no task"}));
        assert!(plain.is_not_found(), "{plain}");
        let dormant = rpc_refusal(
            "http://a",
            &json!({"code": -32004, "message": "answered", "data": [
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "ALREADY_COMPLETED",
                 "metadata": {"code": "already_completed"}}
            ]}),
        );
        let RemoteError::Refused { code, message, .. } = &dormant else {
            panic!("{dormant}");
        };
        assert_eq!(
            outcome(code, message),
            Some(SubmitOutcome::AlreadyCompleted)
        );
        let other = rpc_refusal("http://a", &json!({"code": -32601, "message": "no"}));
        assert!(matches!(other, RemoteError::Refused { ref code, .. } if code == "a2a_-32601"));
    }
}
