//! Sub-agents under failure: a child that keeps crashing, and recovery of children a restart
//! left marked as running (one that completed, one that never answers its inspection).

mod common;

use std::sync::Arc;

use dormant::llm::{LlmAdapter, LlmError, ModelRequest};
use dormant::store::{self, Batch, Op, Store};
use dormant::testkit::{self, Call, Delegate, DelegatingStore};
use dormant::types::{ChildState, ToolOutcome};
use dormant::{
    AgentDefinition, ManualClock, MemoryStore, ModelReply, Runtime, ScriptedLlm, SessionId,
    SledStore, Status, ToolCall, ToolDefinition,
};
use futures::future::BoxFuture;
use serde_json::json;

/// A lead that delegates to `good` and `other` in one reply, then says "done".
fn lead(other: &str) -> anyhow::Result<AgentDefinition> {
    Ok(AgentDefinition::builder("lead")
        .tool(ToolDefinition::sub_agent("ask_good", "good"))
        .tool(ToolDefinition::sub_agent("ask_other", other))
        .build()?)
}

fn lead_script() -> Vec<ModelReply> {
    vec![
        ModelReply::tool_calls(vec![
            ToolCall::new("g1", "ask_good", json!({ "message": "hi" })),
            ToolCall::new("o1", "ask_other", json!({ "message": "hi" })),
        ]),
        ModelReply::text("done"),
    ]
}

/// A store that panics on every commit that writes a key of one session after its first
/// `spare` (with `reads`, on every read of its keys but a range scan, too), so that session's
/// actor crashes each time it commits (or loads). (Hooks, tools and models are caught: a store
/// is the collaborator whose panic reaches the actor.)
#[derive(Debug)]
struct PanicFor {
    session: SessionId,
    commits: std::sync::atomic::AtomicUsize,
    spare: usize,
    reads: bool,
}

impl PanicFor {
    fn new(
        inner: Arc<dyn Store>,
        session: SessionId,
        spare: usize,
        reads: bool,
    ) -> DelegatingStore<Self> {
        let panics = Self {
            session,
            commits: Default::default(),
            spare,
            reads,
        };
        DelegatingStore::wrap(inner, panics)
    }

    fn read(&self, key: &[u8]) {
        assert!(
            !(self.reads && names(&self.session, key)),
            "read panics for {}",
            self.session
        );
    }
}

/// Whether `key` names `session`.
fn names(session: &SessionId, key: &[u8]) -> bool {
    let id = session.as_str().as_bytes();
    key.windows(id.len()).any(|window| window == id)
}

/// Whether `batch` writes a key of `session`.
fn writes_to(session: &SessionId, batch: &Batch) -> bool {
    batch.ops().iter().any(|op| {
        let (Op::Put { key, .. } | Op::Delete { key, .. }) = op;
        names(session, key)
    })
}

/// `work`, bounded: where a missing fix leaves someone waiting for good, the test fails
/// ("the `what` never happened") instead of hanging.
async fn bounded<T>(what: &str, work: impl std::future::Future<Output = T>) -> anyhow::Result<T> {
    tokio::time::timeout(std::time::Duration::from_secs(60), work)
        .await
        .map_err(|_| anyhow::anyhow!("{what} never happened"))
}

/// Runs `parent` (the lead of [`editing_child_runtime`]) until it waits on its child, and
/// answers the child's call `tc-1`.
async fn child_answered(runtime: &Runtime, parent: &SessionId) -> anyhow::Result<()> {
    let waiting = runtime.execute_on(parent, "lead", "go").await?;
    assert_eq!(waiting.status, Status::SuspendedAwaitingChildren);
    let answer = dormant::Submit::result(parent.as_str(), "tc-1", json!({ "applied": 1 }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        dormant::SubmitOutcome::Accepted
    );
    Ok(())
}

/// Resumes `parent`, bounded, and checks that its run completes with `answer` as its child's
/// result for `call`.
async fn resumed_with(
    runtime: &Runtime,
    parent: &SessionId,
    call: &str,
    answer: serde_json::Value,
) -> anyhow::Result<()> {
    let resumed = bounded("the parent's going on", runtime.resume(parent)).await??;
    assert_eq!(resumed.status, Status::Completed, "{resumed:?}");
    assert_eq!(
        common::tool_result(&runtime.messages(parent).await?, call),
        Some(&ToolOutcome::Result(answer))
    );
    Ok(())
}

#[async_trait::async_trait]
impl Delegate for PanicFor {
    async fn before(&self, call: Call<'_>) -> Result<(), store::Error> {
        match call {
            Call::Commit(batch) if writes_to(&self.session, batch) => {
                let earlier = self
                    .commits
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                assert!(earlier < self.spare, "commit panics for {}", self.session);
            }
            Call::Get { key, .. } => self.read(key),
            Call::ScanPrefix { prefix, .. } | Call::ScanPrefixRev { prefix, .. } => {
                self.read(prefix)
            }
            _ => {}
        }
        Ok(())
    }
}

/// The lead over `store`, its `o1` child of agent `crashy` (whose model would say "never"),
/// with a crash limit of 3 in a minute.
fn crashy_runtime(store: Arc<dyn Store>) -> anyhow::Result<Runtime> {
    let llm = ScriptedLlm::new()
        .script("lead", lead_script())
        .script("good", vec![ModelReply::text("fine")])
        .script("crashy", vec![ModelReply::text("never")]);
    Ok(Runtime::builder()
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(0)))
        .store(store)
        .crash_limit(3, 60_000)
        .agent(lead("crashy")?)
        .agent(AgentDefinition::builder("good").build()?)
        .agent(AgentDefinition::builder("crashy").build()?)
        .build()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_keeps_crashing_is_a_tool_error_and_its_sibling_is_unaffected(
) -> anyhow::Result<()> {
    let parent: SessionId = "p".parse()?;
    let runtime = crashy_runtime(Arc::new(PanicFor::new(
        Arc::new(MemoryStore::new()),
        parent.ephemeral_child("o1"),
        1,
        false,
    )))?;
    let outcome = runtime.execute_on(&parent, "lead", "go").await?;
    assert_eq!(outcome.status, Status::Completed);
    assert_eq!(outcome.text.as_deref(), Some("done"));
    let messages = runtime.messages(&parent).await?;
    assert_eq!(
        common::tool_result(&messages, "g1"),
        Some(&ToolOutcome::Result(json!("fine")))
    );
    match common::tool_result(&messages, "o1") {
        Some(ToolOutcome::Error(text)) => {
            assert!(text.starts_with("sub_agent_failed"), "{text}");
            // The child's own failure travels up with it.
            assert!(text.contains("commit panics for p-sub-o1"), "{text}");
        }
        other => panic!("o1 should be a tool error, got {other:?}"),
    }
    // The runtime goes on serving other sessions.
    let again = runtime.execute_on(&"q".parse()?, "good", "hi").await?;
    assert_eq!(again.status, Status::Completed);
    runtime.shutdown().await?;
    Ok(())
}

/// A store on which every commit of one session after its first panics, and on which, once
/// `limit` of them have panicked, its next `unreadable` reads of its log fail: the reads that
/// look for the parent to tell, once the session is marked failed.
#[derive(Debug)]
struct CrashesThenUnreadable {
    session: SessionId,
    panics: std::sync::atomic::AtomicUsize,
    limit: usize,
    unreadable: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl Delegate for CrashesThenUnreadable {
    async fn before(&self, call: Call<'_>) -> Result<(), store::Error> {
        use std::sync::atomic::Ordering::SeqCst;
        match call {
            Call::Commit(batch) if writes_to(&self.session, batch) => {
                let panics = self.panics.fetch_add(1, SeqCst);
                assert!(panics == 0, "commit panics for {}", self.session);
            }
            Call::ScanPrefixRev { prefix, .. }
                if names(&self.session, prefix) && self.panics.load(SeqCst) > self.limit =>
            {
                let left = self.unreadable.load(SeqCst);
                if left > 0 {
                    self.unreadable.store(left - 1, SeqCst);
                    return Err(store::Error::Backend("the log cannot be read, once".into()));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// A child that keeps crashing is told to its parent even when the first reads of its lineage
/// fail: the parent is read again, and does not wait for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_marked_failed_whose_lineage_cannot_be_read_at_first_is_still_told(
) -> anyhow::Result<()> {
    let parent: SessionId = "p".parse()?;
    let store = Arc::new(DelegatingStore::wrap(
        Arc::new(MemoryStore::new()),
        CrashesThenUnreadable {
            session: parent.ephemeral_child("o1"),
            panics: Default::default(),
            // The first panic is a step's commit; the second the reload's (it closes the run
            // the crash cut), which fails the child at once.
            limit: 2,
            unreadable: 2.into(),
        },
    ));
    let runtime = crashy_runtime(store.clone())?;
    let outcome = bounded(
        "the parent's settle",
        runtime.execute_on(&parent, "lead", "go"),
    )
    .await??;
    assert_eq!(outcome.status, Status::Completed);
    let messages = runtime.messages(&parent).await?;
    match common::tool_result(&messages, "o1") {
        Some(ToolOutcome::Error(text)) => assert!(text.starts_with("sub_agent_failed"), "{text}"),
        other => panic!("o1 should be a tool error, got {other:?}"),
    }
    let delegate = store.delegate();
    assert_eq!(
        (
            delegate.panics.load(std::sync::atomic::Ordering::SeqCst),
            delegate
                .unreadable
                .load(std::sync::atomic::Ordering::SeqCst)
        ),
        (3, 0),
        "two panics after a first commit, and both failing reads made"
    );
    runtime.shutdown().await?;
    Ok(())
}

/// Answers from a script, except that every model call of agent `stuck` never returns;
/// `started` is told each time such a call begins.
struct StuckFor {
    script: ScriptedLlm,
    started: tokio::sync::mpsc::UnboundedSender<SessionId>,
}

impl LlmAdapter for StuckFor {
    fn complete(&self, request: ModelRequest) -> BoxFuture<'static, Result<ModelReply, LlmError>> {
        if request.agent == "stuck" {
            let _ = self.started.send(request.session_id);
            return Box::pin(futures::future::pending());
        }
        self.script.complete(request)
    }
}

fn stuck_runtime(
    dir: &std::path::Path,
    started: tokio::sync::mpsc::UnboundedSender<SessionId>,
) -> anyhow::Result<Runtime> {
    stuck_runtime_on(Arc::new(SledStore::open(dir)?), started, 200)
}

/// As [`stuck_runtime`], on `store`, inspecting a child for at most `inspection_ms`.
fn stuck_runtime_on(
    store: Arc<dyn Store>,
    started: tokio::sync::mpsc::UnboundedSender<SessionId>,
    inspection_ms: u64,
) -> anyhow::Result<Runtime> {
    let script = ScriptedLlm::new()
        .script("lead", lead_script())
        .script("good", vec![ModelReply::text("fine")]);
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(StuckFor { script, started }))
        .clock(Arc::new(ManualClock::new(0)))
        .child_inspection_timeout_ms(inspection_ms)
        .agent(lead("stuck")?)
        .agent(AgentDefinition::builder("good").build()?)
        .agent(AgentDefinition::builder("stuck").build()?)
        .build()?)
}

/// A first process over the sled store in `dir`: the lead's step waits on `o1`, whose model
/// never answers, and on `g1`, which answers; once `g1` has settled the process goes away
/// with the step (and `o1`'s run) in flight. Returns the status `g1` settled at.
async fn cut_with_o1_in_flight(
    dir: &std::path::Path,
    parent: &SessionId,
) -> anyhow::Result<Status> {
    let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
    let runtime = stuck_runtime(dir, started)?;
    let running = {
        let runtime = runtime.clone();
        let parent = parent.clone();
        tokio::spawn(async move { runtime.execute_on(&parent, "lead", "go").await })
    };
    assert_eq!(starts.recv().await, Some(parent.ephemeral_child("o1")));
    let good = parent.ephemeral_child("g1");
    runtime.wait_settled(&good).await;
    let settled = runtime.status(&good).await?;
    runtime.shutdown().await?;
    running.abort();
    Ok(settled)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_reconciles_children_in_the_background_within_its_bound_and_only_once(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let parent: SessionId = "p".parse()?;
    let stuck = parent.ephemeral_child("o1");

    assert_eq!(
        cut_with_o1_in_flight(dir.path(), &parent).await?,
        Status::Completed
    );

    // Second process: the stuck child is busy again (someone resumed it), so its inspection
    // cannot finish; the good one can.
    let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
    let runtime = stuck_runtime(dir.path(), started)?;
    // The good child's report may or may not have reached the parent before the end; the
    // stuck one's cannot have.
    let stale = runtime.children(&parent).await?;
    let running = |call: &str| {
        stale
            .iter()
            .any(|entry| entry.tool_call_id == call && entry.state == ChildState::Running)
    };
    assert!(running("o1"));
    let expected = if running("g1") { 2 } else { 1 };
    let resuming = {
        let runtime = runtime.clone();
        let stuck = stuck.clone();
        tokio::spawn(async move { runtime.resume(&stuck).await })
    };
    assert_eq!(starts.recv().await, Some(stuck.clone()));
    // Waking the parent: it answers at once, while its children are reconciled behind it.
    runtime.interrupt(&parent).await?;
    assert_eq!(runtime.status(&parent).await?, Status::Interrupted);
    runtime.wait_settled(&parent).await;
    assert_eq!(runtime.stats().reconciled_children, expected);
    let reconciled = runtime.children(&parent).await?;
    let state_of = |call: &str| {
        reconciled
            .iter()
            .find(|entry| entry.tool_call_id == call)
            .map(|entry| entry.state.clone())
    };
    assert_eq!(
        state_of("g1"),
        Some(ChildState::Finished(ToolOutcome::Result(json!("fine"))))
    );
    match state_of("o1") {
        Some(ChildState::Interrupted { reason }) => {
            assert!(reason.starts_with("inspection_timed_out"), "{reason}");
        }
        other => panic!("the stuck child should be written off, got {other:?}"),
    }

    // The next wake finds nothing to reconcile.
    runtime.evict(&parent).await;
    assert!(!runtime.is_resident(&parent));
    runtime.interrupt(&parent).await?;
    runtime.wait_settled(&parent).await;
    assert_eq!(runtime.stats().reconciled_children, expected);
    resuming.abort();
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_whose_inspection_panics_is_written_off_and_its_parent_settles(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let parent: SessionId = "p".parse()?;
    let stuck = parent.ephemeral_child("o1");

    cut_with_o1_in_flight(dir.path(), &parent).await?;

    // Second process: every read of the stuck child's keys panics (a damaged store that sled
    // cannot read panics the same way), so its inspection does too.
    let (started, _starts) = tokio::sync::mpsc::unbounded_channel();
    let store = PanicFor::new(
        Arc::new(SledStore::open(dir.path())?),
        stuck.clone(),
        usize::MAX,
        true,
    );
    // A bound far beyond the panic, so that the inspection panics before it times out (the
    // child's own activation panics first, as many times as its crash limit allows).
    let runtime = stuck_runtime_on(Arc::new(store), started, 30_000)?;
    runtime.interrupt(&parent).await?;
    // Unguarded, the reconciliation died with the panic and the parent stayed at work for
    // good: bounded here so that the test fails instead of hanging.
    bounded("the parent's settling", runtime.wait_settled(&parent)).await?;
    let reconciled = runtime.children(&parent).await?;
    match reconciled
        .iter()
        .find(|entry| entry.tool_call_id == "o1")
        .map(|entry| entry.state.clone())
    {
        Some(ChildState::Interrupted { reason }) => {
            assert!(reason.starts_with("child_unreadable"), "{reason}");
            assert!(reason.contains("its inspection panicked"), "{reason}");
            assert!(reason.contains("read panics for p-sub-o1"), "{reason}");
        }
        other => panic!("the child should be written off, got {other:?}"),
    }
    runtime.shutdown().await?;
    Ok(())
}

/// A store whose scans of one session's log fail once armed (a database that cannot be
/// reached, say), so that session cannot be read back.
#[derive(Debug)]
struct LogUnreadable {
    session: SessionId,
    armed: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Delegate for LogUnreadable {
    async fn before(&self, call: Call<'_>) -> Result<(), store::Error> {
        match call {
            Call::ScanPrefix {
                tree: store::Tree::Log,
                prefix,
            }
            | Call::ScanPrefixRev {
                tree: store::Tree::Log,
                prefix,
                ..
            } if self.armed.load(std::sync::atomic::Ordering::SeqCst)
                && names(&self.session, prefix) =>
            {
                Err(store::Error::backend("the log cannot be read"))
            }
            _ => Ok(()),
        }
    }
}

/// Lead `p`'s agent `lead` asks sub-agent `helper` (call `c1`), whose client tool `edit` (call
/// `tc-1`) it waits on; then the child says "edited" and the lead "done".
fn editing_child_runtime(store: Arc<dyn Store>) -> anyhow::Result<Runtime> {
    editing_child_runtime_with(store, |builder| builder)
}

/// [`editing_child_runtime`], its builder changed by `with`.
fn editing_child_runtime_with(
    store: Arc<dyn Store>,
    with: impl FnOnce(dormant::RuntimeBuilder) -> dormant::RuntimeBuilder,
) -> anyhow::Result<Runtime> {
    let helper = AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("edit"))
        .build()?;
    let script = vec![
        ModelReply::tool_calls(vec![ToolCall::new("tc-1", "edit", json!({}))]),
        ModelReply::text("edited"),
    ];
    lead_and_helper_runtime(store, (helper, script), with)
}

/// Lead `p`'s agent `lead` asks sub-agent `helper` (call `c1`) and says "done" once it has
/// its answer; the helper is the agent given, with its script. The builder is changed by
/// `with`.
fn lead_and_helper_runtime(
    store: Arc<dyn Store>,
    (helper, script): (AgentDefinition, Vec<ModelReply>),
    with: impl FnOnce(dormant::RuntimeBuilder) -> dormant::RuntimeBuilder,
) -> anyhow::Result<Runtime> {
    let llm = ScriptedLlm::new()
        .script(
            "lead",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new(
                    "c1",
                    "ask",
                    json!({ "message": "help" }),
                )]),
                ModelReply::text("done"),
            ],
        )
        .script("helper", script);
    let builder = Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(0)))
        .agent(
            AgentDefinition::builder("lead")
                .tool(ToolDefinition::sub_agent("ask", "helper"))
                .build()?,
        )
        .agent(helper);
    Ok(with(builder).build()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_cannot_be_read_when_its_parent_goes_on_is_a_tool_error() -> anyhow::Result<()>
{
    let parent: SessionId = "p".parse()?;
    let child = parent.ephemeral_child("c1");
    let store = Arc::new(DelegatingStore::wrap(
        Arc::new(MemoryStore::new()),
        LogUnreadable {
            session: child.clone(),
            armed: Default::default(),
        },
    ));
    let runtime = editing_child_runtime(Arc::clone(&store) as Arc<dyn Store>)?;
    child_answered(&runtime, &parent).await?;
    // The child leaves memory (the answer's commit hands its effects back to the child one
    // message later, and a busy actor refuses to leave: asked until it has left); from now on
    // its log cannot be read back.
    bounded("the child's leaving memory", async {
        while runtime.is_resident(&child) {
            runtime.evict(&child).await;
            tokio::task::yield_now().await;
        }
    })
    .await?;
    store
        .delegate()
        .armed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    // The parent goes on and wakes its child. Unguarded, the wake was dropped and the parent
    // waited for the child's report for good: bounded here so that the test fails instead.
    let resumed = bounded("the parent's going on", runtime.resume(&parent)).await??;
    assert_eq!(resumed.status, Status::Completed);
    assert_eq!(resumed.text.as_deref(), Some("done"));
    match common::tool_result(&runtime.messages(&parent).await?, "c1") {
        Some(ToolOutcome::Error(text)) => {
            assert!(text.starts_with("sub_agent_unavailable"), "{text}");
            assert!(text.contains("the log cannot be read"), "{text}");
        }
        other => panic!("c1 should be a tool error, got {other:?}"),
    }
    runtime.shutdown().await?;
    Ok(())
}

/// A lead with a blocking companion `w` (session `p-agent-w`) on `store`: its first turn spawns
/// the companion, its second sends it a message (call `c2`).
fn companion_runtime(store: Arc<dyn Store>) -> anyhow::Result<Runtime> {
    let call =
        |id: &str, tool: &str, input| ModelReply::tool_calls(vec![ToolCall::new(id, tool, input)]);
    let llm = ScriptedLlm::new()
        .script(
            "lead",
            vec![
                call(
                    "c1",
                    "companion__spawnAgent",
                    json!({ "agentType": "watcher", "name": "w", "message": "watch" }),
                ),
                ModelReply::text("spawned"),
                call(
                    "c2",
                    "companion__sendMessage",
                    json!({ "name": "w", "message": "again" }),
                ),
                ModelReply::text("went on"),
            ],
        )
        .script(
            "watcher",
            vec![
                ModelReply::text("watched"),
                ModelReply::text("watched again"),
            ],
        );
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(0)))
        .agent(
            AgentDefinition::builder("lead")
                .persistent_agent("watcher", dormant::definition::CompanionMode::Blocking)
                .build()?,
        )
        .agent(AgentDefinition::builder("watcher").build()?)
        .build()?)
}

/// Runs the lead's first turn on `runtime` (from [`companion_runtime`]), then `arm`, then its
/// second turn, which must end, and end completed; returns the tool error its call `c2` got.
async fn second_turn_error(runtime: &Runtime, arm: impl FnOnce()) -> anyhow::Result<String> {
    let parent: SessionId = "p".parse()?;
    let first = runtime.execute_on(&parent, "lead", "go").await?;
    assert_eq!(first.text.as_deref(), Some("spawned"));
    arm();
    let second = bounded(
        "the parent's going on",
        runtime.execute_on(&parent, "lead", "once more"),
    )
    .await??;
    assert_eq!(second.status, Status::Completed);
    assert_eq!(second.text.as_deref(), Some("went on"));
    match common::tool_result(&runtime.messages(&parent).await?, "c2") {
        Some(ToolOutcome::Error(text)) => Ok(text.clone()),
        other => panic!("c2 should be a tool error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_companion_that_cannot_be_read_for_its_next_turn_is_a_tool_error() -> anyhow::Result<()> {
    let store = Arc::new(DelegatingStore::wrap(
        Arc::new(MemoryStore::new()),
        LogUnreadable {
            session: "p-agent-w".parse()?,
            armed: Default::default(),
        },
    ));
    let runtime = companion_runtime(Arc::clone(&store) as Arc<dyn Store>)?;
    // Once the companion is idle (its conversation back on disk), its log cannot be read, so
    // its next turn cannot begin. Unguarded, the turn was dropped and the parent waited for
    // the companion's reply for good.
    let arm = || {
        store
            .delegate()
            .armed
            .store(true, std::sync::atomic::Ordering::SeqCst);
    };
    let text = second_turn_error(&runtime, arm).await?;
    assert!(text.starts_with("sub_agent_unavailable"), "{text}");
    assert!(text.contains("the log cannot be read"), "{text}");
    runtime.shutdown().await?;
    Ok(())
}

/// A store whose next commit that writes a key of one session (of one kind, if given)
/// panics, once armed.
#[derive(Debug)]
struct CommitPanicsOnce {
    session: SessionId,
    kind: Option<store::CommitKind>,
    armed: std::sync::atomic::AtomicBool,
    fired: std::sync::atomic::AtomicBool,
}

impl CommitPanicsOnce {
    fn new(session: SessionId, kind: Option<store::CommitKind>, armed: bool) -> Self {
        Self {
            session,
            kind,
            armed: std::sync::atomic::AtomicBool::new(armed),
            fired: Default::default(),
        }
    }
}

#[async_trait::async_trait]
impl Delegate for CommitPanicsOnce {
    async fn before(&self, call: Call<'_>) -> Result<(), store::Error> {
        if let Call::Commit(batch) = call {
            if writes_to(&self.session, batch)
                && self.kind.is_none_or(|kind| batch.kind() == kind)
                && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                self.fired.store(true, std::sync::atomic::Ordering::SeqCst);
                panic!("a run's first commit panics for {}", self.session);
            }
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_companion_whose_next_turn_panics_before_it_lands_is_a_tool_error() -> anyhow::Result<()>
{
    let store = Arc::new(DelegatingStore::wrap(
        Arc::new(MemoryStore::new()),
        CommitPanicsOnce::new("p-agent-w".parse()?, None, false),
    ));
    let runtime = companion_runtime(Arc::clone(&store) as Arc<dyn Store>)?;
    // The companion's next turn panics in its first commit, which never lands: its restart
    // finds it at its last turn, with nothing cut to tell. Unguarded, the parent waited for
    // the turn's reply for good.
    let arm = || {
        store
            .delegate()
            .armed
            .store(true, std::sync::atomic::Ordering::SeqCst);
    };
    let text = second_turn_error(&runtime, arm).await?;
    assert!(text.starts_with("sub_agent_failed"), "{text}");
    assert!(
        text.contains("crashed before the first commit of its run"),
        "{text}"
    );
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_attach_to_a_cut_child_that_panics_once_goes_on_after_the_childs_restart(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let parent: SessionId = "p".parse()?;
    let stuck = parent.ephemeral_child("o1");

    // Both runs are cut.
    cut_with_o1_in_flight(dir.path(), &parent).await?;

    // Second process: the child's model answers now, but the first commit of its run going on
    // panics once. Its restart finds the run the crash cut and tells the parent, which wakes it
    // again: the call ends with the child's answer, not with a failure.
    let store = Arc::new(DelegatingStore::wrap(
        Arc::new(SledStore::open(dir.path())?),
        CommitPanicsOnce::new(stuck.clone(), Some(store::CommitKind::RunStart), true),
    ));
    let llm = ScriptedLlm::new()
        .script("lead", lead_script())
        .script("good", vec![ModelReply::text("fine")])
        .script("stuck", vec![ModelReply::text("recovered")]);
    let runtime = Runtime::builder()
        .store(Arc::clone(&store) as Arc<dyn Store>)
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(0)))
        .agent(lead("stuck")?)
        .agent(AgentDefinition::builder("good").build()?)
        .agent(AgentDefinition::builder("stuck").build()?)
        .build()?;
    resumed_with(&runtime, &parent, "o1", json!("recovered")).await?;
    assert!(
        store
            .delegate()
            .fired
            .load(std::sync::atomic::Ordering::SeqCst),
        "the child's run never went on through the panicking commit"
    );
    runtime.shutdown().await?;
    Ok(())
}

#[test]
fn a_sub_agent_tool_advertises_the_message_it_requires() -> anyhow::Result<()> {
    let lead = AgentDefinition::builder("lead")
        .tool(ToolDefinition::sub_agent("ask", "helper"))
        .tool(ToolDefinition::remote_sub_agent(
            "ask_far",
            "http://127.0.0.1:1",
            "helper",
        ))
        .build()?;
    let expected = json!({
        "type": "object",
        "required": ["message"],
        "properties": {
            "message": {
                "type": "string",
                "description": "The task for the sub-agent: its first message."
            }
        }
    });
    for spec in lead.tool_specs().iter() {
        assert_eq!(spec.input_schema, expected, "{}", spec.name);
    }
    assert_eq!(dormant::definition::sub_agent_input_schema(), expected);
    Ok(())
}

#[tokio::test]
async fn a_sub_agent_call_without_its_message_is_invalid_input() -> anyhow::Result<()> {
    let llm = ScriptedLlm::new().script(
        "lead",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new("a1", "ask", json!({ "task": "x" }))]),
            ModelReply::text("done"),
        ],
    );
    let runtime = Runtime::builder()
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(0)))
        .agent(
            AgentDefinition::builder("lead")
                .tool(ToolDefinition::sub_agent("ask", "helper"))
                .build()?,
        )
        .agent(AgentDefinition::builder("helper").build()?)
        .build()?;
    let parent: SessionId = "p".parse()?;
    let outcome = runtime.execute_on(&parent, "lead", "go").await?;
    assert_eq!(outcome.status, Status::Completed);
    match common::tool_result(&runtime.messages(&parent).await?, "a1") {
        Some(ToolOutcome::Error(text)) => {
            assert!(text.starts_with("invalid_input"), "{text}");
            assert!(text.contains("message"), "{text}");
        }
        other => panic!("a1 should be invalid_input, got {other:?}"),
    }
    runtime.shutdown().await?;
    Ok(())
}

/// Runs the lead over a store that panics for the child `o1` as `store` says, and checks that
/// the parent records the child's failure as the call's tool error and completes.
async fn child_that_cannot_come_up(
    store: DelegatingStore<PanicFor>,
    why: &str,
) -> anyhow::Result<()> {
    let parent: SessionId = "p".parse()?;
    let runtime = crashy_runtime(Arc::new(store))?;
    // Bounded so that a parent left waiting forever fails the test instead of hanging it.
    let running = runtime.execute_on(&parent, "lead", "go");
    let outcome = tokio::time::timeout(std::time::Duration::from_secs(60), running)
        .await
        .map_err(|_| anyhow::anyhow!("the parent still waits on its child after 60 s"))??;
    assert_eq!(outcome.status, Status::Completed);
    assert_eq!(outcome.text.as_deref(), Some("done"));
    let messages = runtime.messages(&parent).await?;
    assert_eq!(
        common::tool_result(&messages, "g1"),
        Some(&ToolOutcome::Result(json!("fine")))
    );
    match common::tool_result(&messages, "o1") {
        Some(ToolOutcome::Error(text)) => {
            assert!(text.starts_with("sub_agent_failed"), "{text}");
            assert!(text.contains("p-sub-o1"), "{text}");
            assert!(text.contains(why), "{text}");
        }
        other => panic!("o1 should be a tool error, got {other:?}"),
    }
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_whose_first_commit_panics_is_a_tool_error_not_a_parent_waiting_forever(
) -> anyhow::Result<()> {
    let store = PanicFor::new(
        Arc::new(MemoryStore::new()),
        "p".parse::<SessionId>()?.ephemeral_child("o1"),
        0,
        false,
    );
    child_that_cannot_come_up(store, "commit panics for p-sub-o1").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_whose_activation_panics_is_a_tool_error() -> anyhow::Result<()> {
    let store = PanicFor::new(
        Arc::new(MemoryStore::new()),
        "p".parse::<SessionId>()?.ephemeral_child("o1"),
        0,
        true,
    );
    child_that_cannot_come_up(store, "read panics for p-sub-o1").await
}

/// Answers from a script, and arms `fault` on `store` when the lead's first model call is
/// made: the next commit of that kind is then its child's.
struct ArmsAfterLead {
    script: ScriptedLlm,
    store: Arc<testkit::FaultyStore>,
    fault: testkit::Fault,
}

impl LlmAdapter for ArmsAfterLead {
    fn complete(&self, request: ModelRequest) -> BoxFuture<'static, Result<ModelReply, LlmError>> {
        if request.agent == "lead" && request.messages.len() == 1 {
            self.store.arm(self.fault);
        }
        self.script.complete(request)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_whose_first_commit_fails_is_a_tool_error() -> anyhow::Result<()> {
    let faulty = Arc::new(testkit::FaultyStore::new(Arc::new(MemoryStore::new())));
    let llm = ArmsAfterLead {
        script: ScriptedLlm::new()
            .script(
                "lead",
                vec![
                    ModelReply::tool_calls(vec![ToolCall::new(
                        "g1",
                        "ask_good",
                        json!({ "message": "hi" }),
                    )]),
                    ModelReply::text("done"),
                ],
            )
            .script("good", vec![ModelReply::text("fine")]),
        store: Arc::clone(&faulty),
        fault: testkit::Fault::NextCommitOf(store::CommitKind::RunStart),
    };
    let parent: SessionId = "p".parse()?;
    let runtime = Runtime::builder()
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(0)))
        .store(faulty.clone())
        .agent(
            AgentDefinition::builder("lead")
                .tool(ToolDefinition::sub_agent("ask_good", "good"))
                .build()?,
        )
        .agent(AgentDefinition::builder("good").build()?)
        .build()?;
    let running = runtime.execute_on(&parent, "lead", "go");
    let outcome = tokio::time::timeout(std::time::Duration::from_secs(60), running)
        .await
        .map_err(|_| anyhow::anyhow!("the parent still waits on its child after 60 s"))??;
    assert_eq!(faulty.failed_commits(), 1);
    assert_eq!(outcome.status, Status::Completed);
    match common::tool_result(&runtime.messages(&parent).await?, "g1") {
        Some(ToolOutcome::Error(text)) => {
            assert!(text.starts_with("sub_agent_failed"), "{text}");
            assert!(text.contains("injected fault"), "{text}");
        }
        other => panic!("g1 should be a tool error, got {other:?}"),
    }
    runtime.shutdown().await?;
    Ok(())
}

/// A child woken by its parent's resume panics in the first commit of its run going on, which
/// never lands: its restart finds it suspended as before, with no cut run to tell its parent
/// of. The wake is sent again, and the parent goes on with the child's answer, instead of
/// waiting for its report for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_child_whose_run_panics_before_it_lands_is_woken_again() -> anyhow::Result<()> {
    woken_child_panicking_once_in(store::CommitKind::RunStart).await
}

/// The lead's child answered, then woken by the lead's resume: the child's first commit of
/// `kind` once woken panics. The parent's resume completes, with the child's answer.
async fn woken_child_panicking_once_in(kind: store::CommitKind) -> anyhow::Result<()> {
    let parent: SessionId = "p".parse()?;
    let child = parent.ephemeral_child("c1");
    let store = Arc::new(DelegatingStore::wrap(
        Arc::new(MemoryStore::new()),
        CommitPanicsOnce::new(child, Some(kind), false),
    ));
    let runtime = editing_child_runtime(Arc::clone(&store) as Arc<dyn Store>)?;
    child_answered(&runtime, &parent).await?;
    store
        .delegate()
        .armed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    resumed_with(&runtime, &parent, "c1", json!("edited")).await?;
    assert!(store
        .delegate()
        .fired
        .load(std::sync::atomic::Ordering::SeqCst));
    runtime.shutdown().await?;
    Ok(())
}

/// A suspended child's commit that fails (here its timeout's) cuts no run: the child reloads
/// as it was, suspended, and its parent is not told that the call failed. Its calls go on:
/// the timeout fires at the next sweep, the other call's answer reaches the parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_childs_failed_commit_does_not_fail_its_parents_call() -> anyhow::Result<()> {
    use dormant::testkit::{Fault, FaultyStore};
    let store = Arc::new(FaultyStore::new(Arc::new(MemoryStore::new())));
    let helper = AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("quick").timeout_ms(100))
        .tool(ToolDefinition::client("slow").timeout_ms(10_000))
        .build()?;
    let script = vec![
        ModelReply::tool_calls(vec![
            ToolCall::new("a1", "quick", json!({})),
            ToolCall::new("b1", "slow", json!({})),
        ]),
        ModelReply::text("picked"),
    ];
    let clock = ManualClock::new(0);
    let runtime = lead_and_helper_runtime(
        Arc::clone(&store) as Arc<dyn Store>,
        (helper, script),
        |builder| {
            builder
                .clock(Arc::new(clock.clone()))
                .background_deadlines(false)
        },
    )?;
    let parent: SessionId = "p".parse()?;
    let waiting = runtime.execute_on(&parent, "lead", "go").await?;
    assert_eq!(waiting.status, Status::SuspendedAwaitingChildren);
    clock.advance(200);
    store.arm(Fault::NextCommitOf(store::CommitKind::Other));
    let _ = runtime.sweep_deadlines().await;
    assert_eq!(runtime.sweep_deadlines().await?.fired, 1, "fired again");
    let answer = dormant::Submit::result("p", "b1", json!("b"));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        dormant::SubmitOutcome::Accepted
    );
    resumed_with(&runtime, &parent, "c1", json!("picked")).await?;
    runtime.shutdown().await?;
    Ok(())
}

/// An interrupt of the root whose walk is cut short (the child's stop panics) leaves the
/// child waiting, its call open, while the root has forgotten it. The interrupt said so
/// (an error); sent again, it finds the child by the call it still owns under the root, and
/// stops it: the call is closed, and a late answer for it is `unknown_tool_call`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_sent_again_stops_a_child_the_first_walk_left_waiting() -> anyhow::Result<()> {
    let parent: SessionId = "p".parse()?;
    let child = parent.ephemeral_child("c1");
    let store = Arc::new(DelegatingStore::wrap(
        Arc::new(MemoryStore::new()),
        CommitPanicsOnce::new(child.clone(), None, false),
    ));
    let runtime = editing_child_runtime(Arc::clone(&store) as Arc<dyn Store>)?;
    let waiting = runtime.execute_on(&parent, "lead", "go").await?;
    assert_eq!(waiting.status, Status::SuspendedAwaitingChildren);
    store
        .delegate()
        .armed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(
        runtime.interrupt(&parent).await.is_err(),
        "the walk was cut"
    );
    assert!(store
        .delegate()
        .fired
        .load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(runtime.status(&child).await?, Status::SuspendedClientTool);

    runtime.interrupt(&parent).await?;
    assert_eq!(runtime.status(&child).await?, Status::Interrupted);
    let late = dormant::Submit::result("p", "tc-1", json!({ "applied": 1 }));
    assert_eq!(
        runtime.submit_tool_result(late).await?,
        dormant::SubmitOutcome::UnknownToolCall
    );
    runtime.shutdown().await?;
    Ok(())
}

/// A store whose next commit (once armed) that writes a child entry of session `p` fails.
#[derive(Debug, Default)]
struct ParentsReportFails {
    armed: std::sync::atomic::AtomicBool,
    fired: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Delegate for ParentsReportFails {
    async fn before(&self, call: Call<'_>) -> Result<(), store::Error> {
        if let Call::Commit(batch) = call {
            // Keys of session `p` begin with its id's length (a u16) and its id.
            let of_p = batch.ops().iter().any(|op| {
                let (Op::Put { tree, key, .. } | Op::Delete { tree, key, .. }) = op;
                *tree == store::Tree::Children && key.starts_with(&[0, 1, b'p'])
            });
            if of_p && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
                self.fired.store(true, std::sync::atomic::Ordering::SeqCst);
                return Err(store::Error::backend("the disk said no, once"));
            }
        }
        Ok(())
    }
}

/// The commit that records a child's report in its parent fails once: the report is not lost
/// with it (it was taken from the queue already), but delivered again, and the parent, which
/// resumes by itself once its child finished, completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_report_whose_commit_in_the_parent_fails_is_delivered_again() -> anyhow::Result<()>
{
    use futures::StreamExt;
    let parent: SessionId = "p".parse()?;
    let store = Arc::new(DelegatingStore::wrap(
        Arc::new(MemoryStore::new()),
        ParentsReportFails::default(),
    ));
    let runtime = editing_child_runtime_with(Arc::clone(&store) as Arc<dyn Store>, |builder| {
        builder.auto_resume(true)
    })?;
    let waiting = runtime.execute_on(&parent, "lead", "go").await?;
    assert_eq!(waiting.status, Status::SuspendedAwaitingChildren);
    let from = runtime.chunks(&parent, 0).await?.len() as u64;
    store
        .delegate()
        .armed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let answer = dormant::Submit::result("p", "tc-1", json!({ "applied": 1 }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        dormant::SubmitOutcome::Accepted
    );
    let mut chunks = std::pin::pin!(runtime.follow(&parent, from));
    let ended = bounded("the parent's completion", async {
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk?;
            if let dormant::types::ChunkKind::RunEnd { status, .. } = chunk.kind {
                if !chunk.kind.is_forwarded() {
                    return Ok::<_, anyhow::Error>(Some(status));
                }
            }
        }
        Ok(None)
    })
    .await??;
    assert!(store
        .delegate()
        .fired
        .load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(ended, Some(Status::Completed));
    runtime.shutdown().await?;
    Ok(())
}

/// A woken child whose run goes on, then is cut by its actor's crash, tells its parent so and
/// is woken again: the crash is no answer to the wake. The parent's resume waits for the
/// run that goes on after the crash, and completes with the child's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_childs_crash_is_no_answer_to_the_wake() -> anyhow::Result<()> {
    woken_child_panicking_once_in(store::CommitKind::RunEnd).await
}
