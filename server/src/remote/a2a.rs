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
//! - **status**: `GetTask`, waiting a while for a task at work (`SubscribeToTask` when the
//!   agent streams). `INPUT_REQUIRED` and `AUTH_REQUIRED` are suspended on the calls its
//!   status message lists (`task.rs`).
//! - **chunks**: none (an A2A stream is not dormant's chunks): a stream that ends once the task
//!   is no longer at work.
//! - **submit**: the follow-up message (`taskId`), its part the answer (`answer.rs`). A
//!   dormant server's submit contract judges its own calls; an agent's own request is
//!   answered once.
//! - **resume**: a dormant server's run that the next message resumes (a crash cut it, or its
//!   answers are all in) gets one; any other task goes on by itself. **stop**: `CancelTask`.
//!
//! The card, the JSON-RPC calls and the agent's errors are `wire.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dormant::remote::{RemoteChunks, RemoteError, RemoteParent, RemoteStart, RemoteStatus};
use dormant::types::{ErrorCode, RunError};
use dormant::{SessionId, Status};
use futures::StreamExt;
use parking_lot::Mutex;
use serde_json::{json, Value};

use self::task::Waiting;
use self::wire::{protocol, Interface};
use crate::client::HttpClient;

mod answer;
mod task;
mod wire;

/// How long an A2A agent's own request for input waits for an answer at the root by default
/// (an agent says no deadline of its own): a day.
pub const DEFAULT_A2A_INPUT_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest wait between two looks at a task at work.
const MAX_POLL: Duration = Duration::from_secs(1);

/// The longest one `SubscribeToTask` is followed before the task is asked for again.
const SUBSCRIPTION_AT_MOST: Duration = Duration::from_secs(60);

/// How long a status waits for a task at work to stop working before it says it works.
const SETTLE_WAIT: Duration = Duration::from_secs(5);

/// How long past its deadline a request answered from here may wait for the agent to take the
/// answer up (an answer just before the deadline is not cancelled under the agent).
const ANSWER_GRACE_MS: u64 = 5 * 60 * 1000;

/// How long an answer an agent gave at once, with no task, is kept for its parent to read.
const DIRECT_KEPT_MS: u64 = 60 * 60 * 1000;

/// Speaks A2A to remote children: one per [`HttpRemoteAgents`](crate::HttpRemoteAgents).
pub(super) struct A2aClient {
    client: HttpClient,
    credential: Option<String>,
    input_timeout: Duration,
    known: Mutex<Known>,
}

/// What this process learned of the agents it speaks to. Only a cache, pruned when a child's
/// task ends: after a restart each is asked again (the agent card, `ListTasks`, the task's
/// history).
#[derive(Default)]
struct Known {
    /// Each agent's JSON-RPC interface (by its base URL), from its card.
    interfaces: HashMap<String, Interface>,
    /// The task of each child: `{base} {context}` → task id.
    tasks: HashMap<String, String>,
    /// A child whose agent answered its first message with a message, not a task: its text,
    /// and when it came (ms since the epoch). Kept [`DIRECT_KEPT_MS`]: its parent reads it at
    /// once (the status that follows the start), and again only if that reading's commit
    /// failed.
    direct: HashMap<String, (Option<String>, u64)>,
    /// When each of an agent's own requests for input was first seen (ms since the epoch), by
    /// `{base} {context} {call}`.
    asked: HashMap<String, u64>,
    /// The requests answered from here, by `{base} {context} {call}`.
    answered: HashSet<String>,
    /// One answer (or expiry) at a time per child: each reads where the task stands first.
    locks: HashMap<String, Arc<tokio::sync::Mutex<()>>>,
}

fn child_key(base: &str, context: &str) -> String {
    format!("{base} {context}")
}

impl A2aClient {
    pub(super) fn new(client: HttpClient, credential: Option<String>) -> Self {
        Self {
            client,
            credential,
            input_timeout: DEFAULT_A2A_INPUT_TIMEOUT,
            known: Mutex::new(Known::default()),
        }
    }

    pub(super) fn with_input_timeout(mut self, timeout: Duration) -> Self {
        self.input_timeout = timeout;
        self
    }

    fn input_timeout_ms(&self) -> u64 {
        u64::try_from(self.input_timeout.as_millis()).unwrap_or(u64::MAX)
    }

    fn context_lock(&self, base: &str, context: &str) -> Arc<tokio::sync::Mutex<()>> {
        Arc::clone(
            self.known
                .lock()
                .locks
                .entry(child_key(base, context))
                .or_default(),
        )
    }

    /// When the request `call` was first seen here (now, if it was not).
    fn asked_at(&self, base: &str, context: &str, call: &str, now: u64) -> u64 {
        *self
            .known
            .lock()
            .asked
            .entry(answer::call_key(base, context, call))
            .or_insert(now)
    }

    /// Forgets what this process kept of a child whose task is over.
    fn forget(&self, base: &str, context: &str) {
        let key = child_key(base, context);
        let calls = format!("{key} ");
        let mut known = self.known.lock();
        known.tasks.remove(&key);
        known.direct.remove(&key);
        known.locks.remove(&key);
        known.asked.retain(|call, _| !call.starts_with(&calls));
        known.answered.retain(|call| !call.starts_with(&calls));
    }

    /// The task of the child `context`: known here, else the agent's `ListTasks`. `None`: the
    /// agent has none (or cannot list them).
    async fn task_of(&self, base: &str, context: &str) -> Result<Option<String>, RemoteError> {
        let key = child_key(base, context);
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
        // The calling run's trace context, as dormant's own protocol carries it: an agent that
        // records spans links its task's to the run that started it.
        let answer = self
            .rpc_sent(base, "SendMessage", params, parent.traceparent.as_deref())
            .await
            .map_err(|failed| failed.error)?;
        let key = child_key(base, session.as_str());
        if let Some(task) = answer["task"]["id"].as_str() {
            self.known.lock().tasks.insert(key, task.to_string());
        } else if let Some(message) = answer.get("message") {
            // Answered at once, with no task: the child's result.
            let text = task::text_of(message);
            let now = now_ms();
            let mut known = self.known.lock();
            // Those kept past their time go first: a long-lived process starts many.
            known
                .direct
                .retain(|_, (_, at)| now.saturating_sub(*at) < DIRECT_KEPT_MS);
            known.direct.insert(key, (text, now));
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
        let interface = self.interface(base).await?;
        let Some(id) = self.task_of(base, context).await? else {
            let direct = self
                .known
                .lock()
                .direct
                .get(&child_key(base, context))
                .map(|(text, _)| text.clone());
            return match direct {
                Some(text) => Ok(status(Status::Completed, text, None)),
                None => Err(unknown_task(base, context)),
            };
        };
        // As a dormant server's status does, it waits a while for the task to stop working.
        let task = self
            .settle(base, context, &id, &interface, Some(SETTLE_WAIT))
            .await?;
        let state = task::state(&task);
        if self.at_work(base, context, &task, &interface) {
            return Ok(status(Status::Running, None, None));
        }
        if state == "TASK_STATE_COMPLETED" {
            self.forget(base, context);
            let (text, output) = task::result(&task);
            return Ok(status(Status::Completed, text, output));
        }
        if !task::waits(&state) {
            self.forget(base, context);
            let (run_status, aborted, error) = task::ended(&task, &state);
            let mut ended = status(run_status, None, None);
            ended.aborted = aborted;
            ended.error = Some(error);
            return Ok(ended);
        }
        let calls = match task::waiting(&task, &state, interface.dormant) {
            Waiting::Listed(calls) => calls,
            // Nothing to answer: its parent's resume sends the message that goes on.
            Waiting::Resumable => Vec::new(),
            Waiting::Interrupted(code) => {
                let mut interrupted = status(Status::Interrupted, None, None);
                interrupted.error = Some(RunError {
                    code,
                    message: "the remote run was interrupted".into(),
                });
                return Ok(interrupted);
            }
            Waiting::Asked(request) => {
                let call_id = task::input_call_id(&request.message_id);
                let now = now_ms();
                let asked = self.asked_at(base, context, &call_id, now);
                let call =
                    task::input_call(context, base, &request, asked, self.input_timeout_ms());
                if now >= call.deadline_at_ms {
                    return self.expire(base, context, &id, &call_id).await;
                }
                vec![call]
            }
        };
        let mut waiting = status(Status::SuspendedClientTool, None, None);
        waiting.pending = calls;
        Ok(waiting)
    }

    /// Whether the task is at work: its state says so, or it still shows a request this
    /// process answered (the agent has not taken the answer up yet), for at most
    /// [`ANSWER_GRACE_MS`] past the request's deadline.
    fn at_work(&self, base: &str, context: &str, task: &Value, interface: &Interface) -> bool {
        let state = task::state(task);
        if task::working(&state) {
            return true;
        }
        if interface.dormant || !task::waits(&state) {
            return false;
        }
        match task::waiting(task, &state, false) {
            Waiting::Asked(request) => {
                let call = task::input_call_id(&request.message_id);
                let key = answer::call_key(base, context, &call);
                let known = self.known.lock();
                let due = known.asked.get(&key).map_or(u64::MAX, |asked| {
                    asked
                        .saturating_add(self.input_timeout_ms())
                        .saturating_add(ANSWER_GRACE_MS)
                });
                known.answered.contains(&key) && now_ms() < due
            }
            _ => false,
        }
    }

    /// Nobody answered an agent's request for input by its deadline (or an answer sent from
    /// here was not taken up within [`ANSWER_GRACE_MS`] after it): unless the task moved on
    /// meanwhile, it is cancelled there and the child failed here.
    async fn expire(
        &self,
        base: &str,
        context: &str,
        id: &str,
        call: &str,
    ) -> Result<RemoteStatus, RemoteError> {
        let lock = self.context_lock(base, context);
        let _one_at_a_time = lock.lock().await;
        let task = self.get_task(base, id).await?;
        let state = task::state(&task);
        let still = matches!(
            task::waiting(&task, &state, false),
            Waiting::Asked(request) if task::waits(&state) && task::input_call_id(&request.message_id) == call
        );
        if !still {
            // It moved on: the parent follows it to where it stands.
            return Ok(status(Status::Running, None, None));
        }
        tracing::info!(endpoint = base, task = id, "a2a.input_timed_out");
        match self.rpc(base, "CancelTask", json!({ "id": id })).await {
            Ok(_) => {}
            Err(error) if error.is_retryable() => return Err(error),
            // Not cancelable (it ended meanwhile): the child fails all the same.
            Err(_) => {}
        }
        self.forget(base, context);
        let mut failed = status(Status::Failed, None, None);
        failed.error = Some(RunError {
            code: ErrorCode::ModelError,
            message: format!(
                "nobody answered the A2A agent's request for input within {} s",
                self.input_timeout.as_secs()
            ),
        });
        Ok(failed)
    }

    /// Resumes a dormant server's run that the next message resumes (a crash cut it, or its
    /// answers are all in) with a follow-up message, as its parent's resume asks; any other
    /// task goes on by itself.
    pub(super) async fn resume(&self, base: &str, session: &SessionId) -> Result<(), RemoteError> {
        let context = session.as_str();
        let interface = self.interface(base).await?;
        let Some(id) = self.task_of(base, context).await? else {
            return Err(unknown_task(base, context));
        };
        let task = self.get_task(base, &id).await?;
        let state = task::state(&task);
        if !(task::waits(&state) && task::waiting(&task, &state, interface.dormant).resumes()) {
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

    /// A stream of no chunks that ends once the child's task is no longer at work.
    pub(super) fn chunks(self: Arc<Self>, base: String, session: SessionId) -> RemoteChunks {
        futures::stream::once(async move {
            let interface = self.interface(&base).await?;
            if let Some(id) = self.task_of(&base, session.as_str()).await? {
                self.settle(&base, session.as_str(), &id, &interface, None)
                    .await?;
            }
            Ok(())
        })
        .filter_map(|done: Result<(), RemoteError>| async move { done.err().map(Err) })
        .boxed()
    }

    /// Task `id` once it is no longer at work, or as it stands after `bound`: followed over
    /// `SubscribeToTask` when the agent streams, else asked with `GetTask` at growing
    /// intervals.
    async fn settle(
        &self,
        base: &str,
        context: &str,
        id: &str,
        interface: &Interface,
        bound: Option<Duration>,
    ) -> Result<Value, RemoteError> {
        let started = tokio::time::Instant::now();
        let mut wait = Duration::from_millis(10);
        loop {
            let task = self.get_task(base, id).await?;
            let over = bound.is_some_and(|bound| started.elapsed() >= bound);
            if over || !self.at_work(base, context, &task, interface) {
                return Ok(task);
            }
            let left = bound.map(|bound| bound.saturating_sub(started.elapsed()));
            // Only a task the agent says works is followed over a stream (one that still
            // shows an answered request is asked again).
            let streams = interface.streaming && task::working(&task::state(&task));
            let followed = match (streams, left) {
                (false, _) => false,
                // At most a while: an agent that keeps the stream open and sends nothing (a
                // process stopped, a VM paused) is asked with `GetTask` then, whose own
                // timeout tells a frozen agent from a slow task.
                (true, None) => tokio::time::timeout(
                    SUBSCRIPTION_AT_MOST,
                    self.subscribe(base, &interface.url, id),
                )
                .await
                .unwrap_or(Ok(false))?,
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
            if status.is_object() && !task::working(&task::state(&json!({ "status": status }))) {
                return Ok(true);
            }
            if answer.get("error").is_some() {
                return Ok(false);
            }
        }
        Ok(false)
    }

    pub(super) async fn stop(&self, base: &str, session: &SessionId) -> Result<(), RemoteError> {
        let context = session.as_str();
        let Some(id) = self.task_of(base, context).await? else {
            return Err(unknown_task(base, context));
        };
        let stopped = match self.rpc(base, "CancelTask", json!({ "id": id })).await {
            // Over already: nothing to stop.
            Err(RemoteError::Refused { code, .. }) if code == "a2a_-32002" => Ok(()),
            other => other.map(drop),
        };
        if stopped.is_ok() {
            self.forget(base, context);
        }
        stopped
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

fn unknown_task(base: &str, context: &str) -> RemoteError {
    RemoteError::Refused {
        endpoint: base.to_string(),
        status: 404,
        code: "unknown_task".into(),
        message: format!("the agent has no task in context {context}"),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}
