//! Shared fixtures: a counting server tool, a recording hook, and runtime builders.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use std::collections::HashMap;

use dormant::llm::{LlmAdapter, LlmError, ModelRequest};
use dormant::store::Store;
use dormant::types::HookEvent;
use dormant::{
    AgentDefinition, Hooks, ManualClock, Message, ModelReply, Runtime, ScriptedLlm, SledStore,
    ToolCall, ToolDefinition, ToolError,
};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::{json, Value};

/// A server tool that counts its invocations and answers `{ "echo": input }`.
pub fn counting_tool(name: &str, calls: Arc<AtomicUsize>) -> ToolDefinition {
    ToolDefinition::server(name, move |input: Value, _ctx| {
        let calls = Arc::clone(&calls);
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ToolError>(json!({ "echo": input }))
        }
    })
}

/// Records every hook that fires: its name, and the event itself.
#[derive(Debug, Default)]
pub struct RecordingHooks {
    pub names: Mutex<Vec<&'static str>>,
    pub events: Mutex<Vec<HookEvent>>,
}

impl Hooks for RecordingHooks {
    fn on_event(&self, event: &HookEvent) {
        self.names.lock().push(event.name());
        self.events.lock().push(event.clone());
    }
}

impl RecordingHooks {
    /// The names of the tool hooks (`on_state_change`, `on_message` of a tool message,
    /// `after_tool`) that fired for call `id`, in order.
    pub fn tool_hooks_of(&self, id: &str) -> Vec<&'static str> {
        self.events
            .lock()
            .iter()
            .filter(|event| match event {
                HookEvent::OnStateChange { tool_call_id, .. }
                | HookEvent::AfterTool { tool_call_id, .. } => tool_call_id == id,
                HookEvent::OnMessage {
                    message: dormant::Message::Tool { tool_call_id, .. },
                    ..
                } => tool_call_id == id,
                _ => false,
            })
            .map(HookEvent::name)
            .collect()
    }
}

/// A script of `steps` tool-calling replies (one call of `tool` each) and a final text.
pub fn tool_script(tool: &str, steps: usize) -> Vec<ModelReply> {
    let mut script: Vec<ModelReply> = (0..steps)
        .map(|step| {
            ModelReply::tool_calls(vec![ToolCall::new(
                format!("call-{step}"),
                tool,
                json!({ "step": step }),
            )])
        })
        .collect();
    script.push(ModelReply::text("done"));
    script
}

/// A runtime over `store` with one agent `worker` (tool `work`) scripted for `steps` steps.
pub fn worker_runtime(
    store: Arc<dyn Store>,
    steps: usize,
    calls: Arc<AtomicUsize>,
    clock: ManualClock,
) -> anyhow::Result<Runtime> {
    let agent = AgentDefinition::builder("worker")
        .tool(counting_tool("work", calls))
        .max_steps(20)
        .build()?;
    let llm = ScriptedLlm::new().script("worker", tool_script("work", steps));
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .clock(Arc::new(clock))
        .agent(agent)
        .build()?)
}

/// A temporary sled store.
pub fn temp_store() -> anyhow::Result<Arc<dyn Store>> {
    Ok(Arc::new(SledStore::temporary()?))
}

/// An agent `editor` with a client tool `edit` (output schema `{applied: integer}`), an
/// approval-gated server tool `deploy` (counted in `deploys`), and a server tool `lookup`;
/// scripted with `script`. Deadlines are fired by `sweep_deadlines` (no background timer).
pub fn editor_runtime(
    store: Arc<dyn Store>,
    clock: ManualClock,
    script: Vec<ModelReply>,
    deploys: Arc<AtomicUsize>,
    configure: impl FnOnce(dormant::RuntimeBuilder) -> dormant::RuntimeBuilder,
) -> anyhow::Result<Runtime> {
    let agent = AgentDefinition::builder("editor")
        .tool(
            ToolDefinition::client("edit")
                .timeout_ms(30_000)
                .output_schema(json!({ "type": "object", "required": ["applied"],
                    "properties": { "applied": { "type": "integer", "minimum": 0 } } })),
        )
        .tool(counting_tool("deploy", deploys).require_approval(dormant::Approval::Always))
        .tool(counting_tool("lookup", Arc::new(AtomicUsize::new(0))))
        .build()?;
    let llm = ScriptedLlm::new().script("editor", script);
    let builder = Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .clock(Arc::new(clock))
        .background_deadlines(false)
        .agent(agent);
    Ok(configure(builder).build()?)
}

/// One reply calling `calls` (id, tool) with empty input, then `text`.
pub fn calls_then_text(calls: &[(&str, &str)], text: &str) -> Vec<ModelReply> {
    vec![
        ModelReply::tool_calls(
            calls
                .iter()
                .map(|(id, tool)| ToolCall::new(*id, *tool, json!({})))
                .collect(),
        ),
        ModelReply::text(text),
    ]
}

/// The tool message of call `id` in `messages`.
pub fn tool_result<'m>(
    messages: &'m [dormant::Message],
    id: &str,
) -> Option<&'m dormant::types::ToolOutcome> {
    messages.iter().find_map(|message| match message {
        dormant::Message::Tool {
            tool_call_id,
            outcome,
            ..
        } if tool_call_id == id => Some(outcome),
        _ => None,
    })
}

/// Re-runs this test binary as a child process that runs only the ignored test `test`, with
/// `env` set to `dir`; returns the child and the lines of its stdout, as the test printed them
/// (see [`ChildLines`]). The caller kills it.
pub fn spawn_child(
    test: &str,
    env: &str,
    dir: &std::path::Path,
) -> anyhow::Result<(std::process::Child, ChildLines)> {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args([
            "--ignored",
            "--exact",
            test,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(env, dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("the child has no stdout"))?;
    Ok((
        child,
        ChildLines {
            lines: std::io::BufReader::new(stdout).lines(),
            harness: format!("test {test} ... "),
        },
    ))
}

/// The lines a child test printed. The test harness writes `test NAME ... ` before the test's
/// own output, on the same line as its first one: that is taken off, so that no line of the
/// test's is missed by a reader that matches its start.
pub struct ChildLines {
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    harness: String,
}

impl Iterator for ChildLines {
    type Item = std::io::Result<String>;

    fn next(&mut self) -> Option<Self::Item> {
        self.lines.next().map(|line| {
            line.map(|line| match line.strip_prefix(self.harness.as_str()) {
                Some(own) => own.to_string(),
                None => line,
            })
        })
    }
}

/// A scripted model that checks every request before it answers: a tool call that reaches the
/// model without exactly one result is written to `violations`.
#[derive(Debug)]
pub struct CheckedLlm {
    pub inner: ScriptedLlm,
    pub violations: Arc<Mutex<Vec<String>>>,
}

impl LlmAdapter for CheckedLlm {
    fn complete(&self, request: ModelRequest) -> BoxFuture<'static, Result<ModelReply, LlmError>> {
        let mut results: HashMap<&str, usize> = HashMap::new();
        for message in request.messages.iter() {
            if let Message::Tool { tool_call_id, .. } = message {
                *results.entry(tool_call_id.as_str()).or_default() += 1;
            }
        }
        for message in request.messages.iter() {
            if let Message::Assistant { tool_calls, .. } = message {
                for call in tool_calls {
                    let count = results.get(call.id.as_str()).copied().unwrap_or(0);
                    if count != 1 {
                        self.violations.lock().push(format!(
                            "call {} reached the model with {count} results",
                            call.id
                        ));
                    }
                }
            }
        }
        self.inner.complete(request)
    }
}

/// A store delegate that holds the next commit of kind `Other` (an answer's) once armed,
/// until the test lets it go: `reached` says it is held.
#[derive(Debug, Default)]
pub struct HoldsOne {
    pub armed: std::sync::atomic::AtomicBool,
    pub reached: tokio::sync::Notify,
    pub let_go: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl dormant::testkit::Delegate for HoldsOne {
    async fn before(&self, call: dormant::testkit::Call<'_>) -> Result<(), dormant::store::Error> {
        if let dormant::testkit::Call::Commit(batch) = call {
            let answer = batch.kind() == dormant::store::CommitKind::Other;
            if answer && self.armed.swap(false, Ordering::SeqCst) {
                self.reached.notify_one();
                self.let_go.notified().await;
            }
        }
        Ok(())
    }
}

/// The status of the first run end on `id`'s stream from chunk `from` on; 60 s at most (a
/// hang is a failure, not a wait).
pub async fn run_ended(
    runtime: &Runtime,
    id: &dormant::SessionId,
    from: u64,
) -> anyhow::Result<dormant::Status> {
    use futures::StreamExt;
    let mut chunks = std::pin::pin!(runtime.follow(id, from));
    let ended = async {
        while let Some(chunk) = chunks.next().await {
            if let dormant::types::ChunkKind::RunEnd { status, .. } = chunk?.kind {
                return Ok::<_, anyhow::Error>(status);
            }
        }
        anyhow::bail!("the stream ended without the run's end")
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), ended)
        .await
        .map_err(|_| anyhow::anyhow!("{id} never ended its run"))?
}

/// Resumes `id` on `runtime` in the background, waits (30 s at most) until `started` says a
/// tool of the resumed run is running, then shuts the runtime down while it runs: the process
/// stops mid-tool, and the session's next activation closes the run as cut, as after a kill.
pub async fn stop_while_a_resumed_tool_runs(
    runtime: &Runtime,
    id: &dormant::SessionId,
    started: &tokio::sync::Notify,
) -> anyhow::Result<()> {
    let resuming = tokio::spawn({
        let (runtime, id) = (runtime.clone(), id.clone());
        async move { runtime.resume(&id).await }
    });
    let bounded = std::time::Duration::from_secs(30);
    tokio::time::timeout(bounded, started.notified())
        .await
        .map_err(|_| anyhow::anyhow!("the resumed run's tool never started"))?;
    tokio::time::timeout(bounded, runtime.shutdown())
        .await
        .map_err(|_| anyhow::anyhow!("the shutdown never ended"))??;
    let _ = resuming.await?;
    Ok(())
}
