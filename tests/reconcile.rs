//! Crash-cut effects a person reconciles (issue 32, item 5): a call of a tool with
//! `OnCut::Reconcile` that a crash cut waits as a `reconcile` call — in the inbox, with the
//! idempotency key its tool saw — and is settled by a person or by the tool's check; the key
//! is the same every time the call runs, across a real reopen of the store.

use std::sync::{Arc, Mutex};

use dormant::definition::{OnCut, Reconciled};
use dormant::store::{CommitKind, Store};
use dormant::testkit::{Call, Delegate, DelegatingStore, Fault, FaultyStore};
use dormant::types::InboxFilter;
use dormant::{
    AgentDefinition, ManualClock, ModelReply, PendingKind, Runtime, ScriptedLlm, SessionId,
    SledStore, Status, Submit, SubmitOutcome, ToolCall, ToolDefinition, ToolError,
};
use serde_json::{json, Value};

/// The idempotency key of each run of `pay`, in order.
type Runs = Arc<Mutex<Vec<String>>>;

/// Agent `shop`: `pay` records the key it ran with; with `check`, cut calls are settled by it.
fn runtime(
    store: Arc<dyn Store>,
    runs: &Runs,
    check: Option<Reconciled>,
) -> anyhow::Result<Runtime> {
    let seen = Arc::clone(runs);
    let mut pay = ToolDefinition::server("pay", move |_input: Value, ctx| {
        let seen = Arc::clone(&seen);
        async move {
            seen.lock()
                .map_err(|_| ToolError::new("poisoned"))?
                .push(ctx.idempotency_key().to_string());
            Ok::<_, ToolError>(json!({ "paid": 10 }))
        }
    })
    .on_cut(OnCut::Reconcile);
    if let Some(answer) = check {
        let checked = Arc::clone(runs);
        pay = pay.reconcile_with(move |_input: Value, key: String| {
            let known = checked
                .lock()
                .map(|runs| runs.contains(&key))
                .unwrap_or(false);
            let answer = answer.clone();
            // The check is asked about the very call that ran.
            async move { known.then_some(answer) }
        });
    }
    with_pay(store, "shop", pay)
}

/// Runs `s1` until `pay` ran and its result's commit failed (a crash there), and shuts the
/// runtime down.
async fn cut_pay(store: Arc<dyn Store>, runs: &Runs) -> anyhow::Result<()> {
    let faulty = Arc::new(FaultyStore::new(store));
    faulty.arm(Fault::CrashBefore(CommitKind::ToolResults));
    let runtime = runtime(faulty.clone(), runs, None)?;
    let id: SessionId = "s1".parse()?;
    assert!(runtime.execute_on(&id, "shop", "pay it").await.is_err());
    faulty.clear();
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_cut_call_waits_in_the_inbox_and_runs_once_more_with_the_same_key_after_a_reopen(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let runs: Runs = Arc::default();
    cut_pay(Arc::new(SledStore::open(dir.path())?), &runs).await?;
    let first_key = runs.lock().map_err(|_| anyhow::anyhow!("poisoned"))?[0].clone();
    assert_eq!(first_key.len(), 32);

    // The process is gone; the store is opened again.
    let runtime = runtime(Arc::new(SledStore::open(dir.path())?), &runs, None)?;
    let id: SessionId = "s1".parse()?;
    // As the crash left it: running, until the session is activated.
    assert_eq!(runtime.status(&id).await?, Status::Running);
    let waiting = runtime.resume(&id).await?;
    assert_eq!(waiting.status, Status::SuspendedClientTool);
    let pending = runtime.pending(&id).await?;
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].kind, PendingKind::Reconcile);
    assert_eq!(
        pending[0].idempotency_key.as_deref(),
        Some(first_key.as_str())
    );
    assert_eq!(pending[0].input, json!({ "cents": 10 }));

    let inbox = runtime
        .inbox(&InboxFilter::all().kind(PendingKind::Reconcile), None, 10)
        .await?;
    assert_eq!(inbox.items.len(), 1);
    assert_eq!(inbox.items[0].tool_call_id, "p1");
    assert_eq!(
        inbox.items[0].idempotency_key.as_deref(),
        Some(first_key.as_str())
    );
    let approvals = runtime
        .inbox(&InboxFilter::all().kind(PendingKind::Approval), None, 10)
        .await?;
    assert!(approvals.items.is_empty());

    // Through the JSON envelope, as a front end sends it.
    let answer = Submit::reconcile("s1", "p1", Reconciled::DidNotHappen);
    assert_eq!(
        runtime.submit_json(&answer.to_json()).await?,
        SubmitOutcome::Accepted
    );
    let done = runtime.resume(&id).await?;
    assert_eq!(done.status, Status::Completed);
    let keys = runs
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    assert_eq!(
        keys,
        vec![first_key.clone(), first_key],
        "ran once more, with the same key"
    );
    assert!(runtime
        .inbox(&InboxFilter::all(), None, 10)
        .await?
        .items
        .is_empty());
    runtime.shutdown().await?;
    Ok(())
}

/// A store whose reads each yield once before they read.
#[derive(Debug)]
struct ReadsYield;

#[async_trait::async_trait]
impl Delegate for ReadsYield {
    async fn before(&self, call: Call<'_>) -> Result<(), dormant::store::Error> {
        if !matches!(call, Call::Commit(_)) {
            tokio::task::yield_now().await;
        }
        Ok(())
    }
}

/// A wait for a crash-cut session that gives up at once (as `GET /status?settle_ms=1` does
/// under load, before the store was even read) still has the cut run closed as interrupted:
/// the page that asked then offers to resume it, as it is told by the run's chunk.
#[tokio::test]
async fn a_wait_that_gives_up_at_once_still_has_a_cut_run_closed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let runs = Runs::default();
    cut_pay(Arc::new(SledStore::open(dir.path())?), &runs).await?;
    // Every read of the reopened store takes a turn of the scheduler, as a read of a store
    // whose answer comes from another thread or over the network does.
    let slow = DelegatingStore::wrap(Arc::new(SledStore::open(dir.path())?), ReadsYield);
    let runtime = runtime(Arc::new(slow), &runs, None)?;
    let id: SessionId = "s1".parse()?;
    assert_eq!(
        runtime.status(&id).await?,
        Status::Running,
        "as the crash left it"
    );
    // Polled once and dropped: the store read it began is still under way.
    let waited = futures::FutureExt::now_or_never(runtime.wait_settled(&id));
    assert!(
        waited.is_none(),
        "the wait gave up before the session settled"
    );
    // Reading the status does not activate the session: only the wait that gave up can have.
    let mut reads = 0;
    while runtime.status(&id).await? == Status::Running {
        reads += 1;
        assert!(reads < 100_000, "the cut run was never closed");
        tokio::task::yield_now().await;
    }
    assert_eq!(runtime.status(&id).await?, Status::Interrupted);
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_check_that_finds_the_effect_settles_the_call_without_a_person_or_a_second_run(
) -> anyhow::Result<()> {
    let store: Arc<dyn Store> = Arc::new(dormant::MemoryStore::new());
    let runs: Runs = Arc::default();
    cut_pay(Arc::clone(&store), &runs).await?;
    let found = Reconciled::Happened(json!({ "paid": 10, "found_by": "check" }));
    let runtime = runtime(store, &runs, Some(found))?;
    let id: SessionId = "s1".parse()?;
    let done = runtime.resume(&id).await?;
    assert_eq!(done.status, Status::Completed);
    assert_eq!(
        runs.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.len(),
        1
    );
    let messages = runtime.messages(&id).await?;
    let result = messages.iter().find_map(|message| match message {
        dormant::Message::Tool { outcome, .. } => Some(outcome.clone()),
        _ => None,
    });
    assert_eq!(
        result,
        Some(dormant::types::ToolOutcome::Result(
            json!({ "paid": 10, "found_by": "check" })
        ))
    );
    Ok(())
}

#[tokio::test]
async fn a_check_that_cannot_tell_leaves_the_call_to_a_person() -> anyhow::Result<()> {
    let store: Arc<dyn Store> = Arc::new(dormant::MemoryStore::new());
    let runs: Runs = Arc::default();
    cut_pay(Arc::clone(&store), &runs).await?;
    // The check knows only keys it was told of: none here, so it cannot tell.
    let forgetful: Runs = Arc::default();
    let runtime = runtime(store, &forgetful, Some(Reconciled::DidNotHappen))?;
    let id: SessionId = "s1".parse()?;
    assert_eq!(
        runtime.resume(&id).await?.status,
        Status::SuspendedClientTool
    );
    let pending = runtime.pending(&id).await?;
    assert_eq!(pending[0].kind, PendingKind::Reconcile);
    let failed = Submit::reconcile("s1", "p1", Reconciled::Failed("card declined".into()));
    assert_eq!(
        runtime.submit_tool_result(failed).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(runtime.resume(&id).await?.status, Status::Completed);
    assert!(forgetful
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .is_empty());
    Ok(())
}

#[test]
fn reconcile_envelopes_say_what_is_wrong() {
    let read = |body: Value| Submit::from_json(&body);
    let base = |extra: Value| {
        let mut body = json!({ "kind": "reconcile", "session_id": "s1", "tool_call_id": "p1" });
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        body
    };
    assert_eq!(
        read(base(json!({ "happened": false }))),
        Ok(Submit::reconcile("s1", "p1", Reconciled::DidNotHappen))
    );
    assert_eq!(
        read(base(json!({ "error": "declined" }))),
        Ok(Submit::reconcile(
            "s1",
            "p1",
            Reconciled::Failed("declined".into())
        ))
    );
    for (extra, why) in [
        (json!({}), "needs happened"),
        (json!({ "happened": true }), "needs the result"),
        (
            json!({ "happened": false, "result": 1 }),
            "carries no result",
        ),
        (json!({ "happened": "yes" }), "true or false"),
        (
            json!({ "happened": true, "result": 1, "error": "x" }),
            "not both",
        ),
        (json!({ "result": 1 }), "needs \"happened\": true"),
        (
            json!({ "happened": true, "result": 1, "approved": true }),
            "approval-response",
        ),
    ] {
        match read(base(extra.clone())) {
            Err(reason) => assert!(reason.contains(why), "{extra}: {reason}"),
            Ok(parsed) => panic!("{extra} was read as {parsed:?}"),
        }
    }
    assert!(read(
        json!({ "session_id": "s1", "tool_call_id": "p1", "result": 1, "happened": true })
    )
    .is_err_and(|reason| reason.contains("reconcile")));
}

/// Agent `desk`: `pay` needs an approval that may edit its input, records the input it ran
/// with, and asks for reconciliation when cut.
fn editable_runtime(
    store: Arc<dyn Store>,
    ran: &Arc<Mutex<Vec<Value>>>,
) -> anyhow::Result<Runtime> {
    let seen = Arc::clone(ran);
    let pay = ToolDefinition::server("pay", move |input: Value, _ctx| {
        let seen = Arc::clone(&seen);
        async move {
            seen.lock()
                .map_err(|_| ToolError::new("poisoned"))?
                .push(input);
            Ok::<_, ToolError>(json!({ "paid": true }))
        }
    })
    .input_schema(json!({ "type": "object", "properties": { "cents": { "type": "integer" } } }))
    .require_approval(dormant::Approval::Editable)
    .on_cut(OnCut::Reconcile);
    with_pay(store, "desk", pay)
}

#[tokio::test]
async fn a_call_approved_with_an_edit_is_reconciled_and_run_again_with_the_edit_only(
) -> anyhow::Result<()> {
    let memory: Arc<dyn Store> = Arc::new(dormant::MemoryStore::new());
    // A process each time: a runtime over its own faulty wrapper of the one store, shut down
    // before the next is built.
    let process = || Arc::new(FaultyStore::new(Arc::clone(&memory)));
    let ran: Arc<Mutex<Vec<Value>>> = Arc::default();
    let id: SessionId = "s1".parse()?;

    // Approved with an edit; the tool runs with it and a crash cuts its result.
    let faulty = process();
    let first = editable_runtime(faulty.clone(), &ran)?;
    let run = first.execute_on(&id, "desk", "pay").await?;
    let approve = Submit::approval("s1", "p1", format!("{}::p1", run.run_id), true, None)
        .with_edited_input(json!({ "cents": 5 }));
    assert_eq!(
        first.submit_tool_result(approve).await?,
        SubmitOutcome::Accepted
    );
    faulty.arm(Fault::CrashBefore(CommitKind::ToolResults));
    assert!(first.resume(&id).await.is_err());
    faulty.clear();
    first.shutdown().await?;

    // Reconciled: it did not happen, so it runs again, and a crash cuts that run too.
    for _ in 0..2 {
        let faulty = process();
        let runtime = editable_runtime(faulty.clone(), &ran)?;
        assert_eq!(
            runtime.resume(&id).await?.status,
            Status::SuspendedClientTool
        );
        let pending = runtime.pending(&id).await?;
        assert_eq!(pending[0].kind, PendingKind::Reconcile);
        assert_eq!(
            pending[0].input,
            json!({ "cents": 5 }),
            "the approved input, not the model's"
        );
        assert_eq!(pending[0].original_input, Some(json!({ "cents": 10 })));
        let answer = Submit::reconcile("s1", "p1", Reconciled::DidNotHappen);
        assert_eq!(
            runtime.submit_tool_result(answer).await?,
            SubmitOutcome::Accepted
        );
        faulty.arm(Fault::CrashBefore(CommitKind::ToolResults));
        assert!(runtime.resume(&id).await.is_err());
        faulty.clear();
        runtime.shutdown().await?;
    }
    let last = editable_runtime(process(), &ran)?;
    assert_eq!(last.resume(&id).await?.status, Status::SuspendedClientTool);
    let answer = Submit::reconcile("s1", "p1", Reconciled::DidNotHappen);
    assert_eq!(
        last.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(last.resume(&id).await?.status, Status::Completed);
    let inputs = ran.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
    assert_eq!(
        inputs,
        vec![json!({ "cents": 5 }); 4],
        "only ever with the edit"
    );
    Ok(())
}

/// A runtime over `store` whose agent `agent` has the tool `pay` and calls it once
/// (`p1`, 10 cents) before it says "paid".
fn with_pay(store: Arc<dyn Store>, agent: &str, pay: ToolDefinition) -> anyhow::Result<Runtime> {
    let definition = AgentDefinition::builder(agent)
        .tool(pay)
        .client_tool_timeout_ms(60_000)
        .build()?;
    let llm = ScriptedLlm::new().script(
        agent,
        vec![
            ModelReply::tool_calls(vec![ToolCall::new("p1", "pay", json!({ "cents": 10 }))]),
            ModelReply::text("paid"),
        ],
    );
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(1_000)))
        .background_deadlines(false)
        .agent(definition)
        .build()?)
}
