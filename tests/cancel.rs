//! Interrupt, abort and shutdown stop the work in flight: a model call or a server tool that
//! is still running is cancelled (its future dropped), the run ends at once, and nothing the
//! cancelled work would have produced is applied.
//!
//! The slow model and the slow tool here never finish by themselves: without cancellation a
//! run on them would never end, so every wait below is bounded and fails loudly.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{temp_store, tool_result};
use dormant::llm::{LlmAdapter, LlmError, ModelRequest};
use dormant::types::{ErrorCode, ToolOutcome};
use dormant::{
    AgentDefinition, ModelReply, Runtime, SessionId, Status, ToolCall, ToolDefinition, ToolError,
};
use futures::future::BoxFuture;
use serde_json::json;
use tokio::sync::Notify;

/// How long a test waits for something that happens at once if the runtime is right.
const BOUND: Duration = Duration::from_secs(10);

/// Signals when work starts and when its future is dropped before it finished.
#[derive(Default)]
struct Probe {
    started: Notify,
    dropped: Notify,
    drops: AtomicUsize,
}

/// Notifies its probe when dropped: the future that holds it was cancelled.
struct DropSignal(Arc<Probe>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        self.0.drops.fetch_add(1, Ordering::SeqCst);
        self.0.dropped.notify_one();
    }
}

/// A model whose first call never answers (until cancelled); later calls answer "recovered".
struct SlowFirstModel {
    probe: Arc<Probe>,
    calls: AtomicUsize,
}

impl LlmAdapter for SlowFirstModel {
    fn complete(&self, _request: ModelRequest) -> BoxFuture<'static, Result<ModelReply, LlmError>> {
        let first = self.calls.fetch_add(1, Ordering::SeqCst) == 0;
        let probe = Arc::clone(&self.probe);
        Box::pin(async move {
            if first {
                let _signal = DropSignal(Arc::clone(&probe));
                probe.started.notify_one();
                std::future::pending::<()>().await;
            }
            Ok(ModelReply::text("recovered"))
        })
    }
}

fn slow_model_runtime(probe: &Arc<Probe>) -> anyhow::Result<Runtime> {
    let llm = SlowFirstModel {
        probe: Arc::clone(probe),
        calls: AtomicUsize::new(0),
    };
    Ok(Runtime::builder()
        .store(temp_store()?)
        .llm(Arc::new(llm))
        .agent(AgentDefinition::builder("thinker").build()?)
        .build()?)
}

/// A runtime whose agent calls `hang`, a server tool that never returns until cancelled.
fn slow_tool_runtime(probe: &Arc<Probe>) -> anyhow::Result<Runtime> {
    let tool_probe = Arc::clone(probe);
    let hang = ToolDefinition::server("hang", move |_input, _ctx| {
        let probe = Arc::clone(&tool_probe);
        async move {
            let _signal = DropSignal(Arc::clone(&probe));
            probe.started.notify_one();
            std::future::pending::<()>().await;
            Ok::<_, ToolError>(json!("never"))
        }
    });
    let script = vec![
        ModelReply::tool_calls(vec![ToolCall::new("h1", "hang", json!({}))]),
        ModelReply::text("went on"),
    ];
    Ok(Runtime::builder()
        .store(temp_store()?)
        .llm(Arc::new(
            dormant::ScriptedLlm::new().script("worker", script),
        ))
        .agent(AgentDefinition::builder("worker").tool(hang).build()?)
        .build()?)
}

type Run = tokio::task::JoinHandle<Result<dormant::RunOutcome, dormant::Error>>;

/// Starts a run of `agent` on session `id` in the background and waits until its slow work
/// (the model call or the tool behind `probe`) has started.
async fn start_slow_run(
    runtime: &Runtime,
    id: &SessionId,
    agent: &'static str,
    probe: &Probe,
) -> anyhow::Result<Run> {
    let run = tokio::spawn({
        let (runtime, id) = (runtime.clone(), id.clone());
        async move { runtime.execute_on(&id, agent, "go").await }
    });
    within("the slow work's start", probe.started.notified()).await?;
    Ok(run)
}

async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> anyhow::Result<T> {
    tokio::time::timeout(BOUND, future)
        .await
        .map_err(|_| anyhow::anyhow!("{what} did not happen within {BOUND:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_cancels_a_model_call_in_flight_and_resume_asks_again() -> anyhow::Result<()> {
    let probe = Arc::new(Probe::default());
    let runtime = slow_model_runtime(&probe)?;
    let id: SessionId = "s1".parse()?;
    let run = start_slow_run(&runtime, &id, "thinker", &probe).await?;
    runtime.interrupt(&id).await?;
    let outcome = within("the run's end", run).await???;
    assert_eq!(outcome.status, Status::Interrupted);
    assert_eq!(
        outcome.error.map(|error| error.code),
        Some(ErrorCode::Interrupted)
    );
    within("the model future's drop", probe.dropped.notified()).await?;
    assert_eq!(
        runtime.messages(&id).await?.len(),
        1,
        "only the user's message"
    );
    let resumed = runtime.resume(&id).await?;
    assert_eq!(resumed.status, Status::Completed);
    assert_eq!(resumed.text.as_deref(), Some("recovered"));
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_cancels_a_running_tool_and_fails_the_run_at_once() -> anyhow::Result<()> {
    let probe = Arc::new(Probe::default());
    let runtime = slow_tool_runtime(&probe)?;
    let id: SessionId = "s1".parse()?;
    let run = start_slow_run(&runtime, &id, "worker", &probe).await?;
    runtime.abort(&id).await?;
    let outcome = within("the run's end", run).await???;
    assert_eq!(outcome.status, Status::Failed);
    assert_eq!(
        outcome.error.map(|error| error.code),
        Some(ErrorCode::Aborted)
    );
    within("the tool future's drop", probe.dropped.notified()).await?;
    match tool_result(&runtime.messages(&id).await?, "h1") {
        Some(ToolOutcome::Error(error)) => {
            assert!(error.starts_with("interrupted"), "{error}");
            assert!(
                error.contains("may or may not have taken effect"),
                "{error}"
            );
        }
        other => anyhow::bail!("the cancelled call gets its result at once, got {other:?}"),
    }
    assert!(matches!(
        runtime.resume(&id).await,
        Err(dormant::Error::Aborted(_))
    ));
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_of_a_running_tool_closes_its_call_and_resume_goes_on() -> anyhow::Result<()> {
    let probe = Arc::new(Probe::default());
    let runtime = slow_tool_runtime(&probe)?;
    let id: SessionId = "s1".parse()?;
    let run = start_slow_run(&runtime, &id, "worker", &probe).await?;
    runtime.interrupt(&id).await?;
    assert_eq!(
        within("the run's end", run).await???.status,
        Status::Interrupted
    );
    within("the tool future's drop", probe.dropped.notified()).await?;
    let resumed = runtime.resume(&id).await?;
    assert_eq!(resumed.status, Status::Completed);
    assert_eq!(resumed.text.as_deref(), Some("went on"));
    assert_eq!(
        probe.drops.load(Ordering::SeqCst),
        1,
        "the tool was not run again"
    );
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_run_in_flight_answers_its_caller_shut_down() -> anyhow::Result<()> {
    let probe = Arc::new(Probe::default());
    let runtime = slow_model_runtime(&probe)?;
    let id: SessionId = "s1".parse()?;
    let run = start_slow_run(&runtime, &id, "thinker", &probe).await?;
    runtime.shutdown().await?;
    let answer = within("the caller's answer", run).await??;
    assert!(
        matches!(answer, Err(dormant::Error::ShutDown)),
        "a defined outcome, not Crashed: {answer:?}"
    );
    within("the model future's drop", probe.dropped.notified()).await?;
    Ok(())
}
