//! Checkpoints, the state at one, and forks that never repeat a side effect (issue 31).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{counting_tool, tool_result, RecordingHooks};
use dormant::types::{ErrorCode, ForkError, ForkOptions, HookEvent, ToolErrorCode, ToolOutcome};
use dormant::{
    AgentDefinition, Error, ManualClock, Message, ModelReply, Runtime, ScriptedLlm, SessionId,
    SledStore, Status, Submit, SubmitOutcome, ToolCall, ToolDefinition,
};
use serde_json::json;

/// Counts of the server tools' runs.
#[derive(Default, Clone)]
struct Runs {
    charge: Arc<AtomicUsize>,
    deploy: Arc<AtomicUsize>,
}

impl Runs {
    fn charges(&self) -> usize {
        self.charge.load(Ordering::SeqCst)
    }

    fn deploys(&self) -> usize {
        self.deploy.load(Ordering::SeqCst)
    }
}

/// Agent `shop`: server tool `charge` (counted), client tool `confirm` (30 s to answer),
/// approval-gated server tool `deploy` (counted), sub-agent tool `helper` (agent `helper`,
/// which waits on its own client tool `ask`).
fn runtime(
    store: Arc<dyn dormant::store::Store>,
    clock: &ManualClock,
    script: Vec<ModelReply>,
    runs: &Runs,
    hooks: Arc<RecordingHooks>,
) -> anyhow::Result<Runtime> {
    let shop = AgentDefinition::builder("shop")
        .tool(counting_tool("charge", runs.charge.clone()))
        .tool(ToolDefinition::client("confirm").timeout_ms(30_000))
        .tool(
            counting_tool("deploy", runs.deploy.clone())
                .require_approval(dormant::Approval::Always),
        )
        .tool(ToolDefinition::sub_agent("helper", "helper"))
        .build()?;
    let helper = AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("ask"))
        .build()?;
    let llm = ScriptedLlm::new().script("shop", script).script(
        "helper",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new("a1", "ask", json!({}))]),
            ModelReply::text("helped"),
        ],
    );
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .clock(Arc::new(clock.clone()))
        .hooks(hooks)
        .background_deadlines(false)
        .agent(shop)
        .agent(helper)
        .build()?)
}

fn call(id: &str, tool: &str) -> ModelReply {
    ModelReply::tool_calls(vec![ToolCall::new(id, tool, json!({ "n": 1 }))])
}

fn memory() -> Arc<dyn dormant::store::Store> {
    Arc::new(dormant::MemoryStore::new())
}

/// The id of the session's last checkpoint.
async fn last_checkpoint(
    runtime: &Runtime,
    id: &SessionId,
) -> anyhow::Result<dormant::types::CheckpointId> {
    let checkpoints = runtime.checkpoints(id).await?;
    Ok(checkpoints
        .last()
        .ok_or_else(|| anyhow::anyhow!("no checkpoint"))?
        .id)
}

#[tokio::test]
async fn every_commit_is_a_checkpoint_and_state_at_reads_the_past() -> anyhow::Result<()> {
    let runs = Runs::default();
    let clock = ManualClock::new(1_000);
    let script = vec![call("c1", "charge"), ModelReply::text("charged")];
    let runtime = runtime(memory(), &clock, script, &runs, Arc::default())?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "shop", "buy it").await?;

    let checkpoints = runtime.checkpoints(&id).await?;
    let statuses: Vec<Status> = checkpoints.iter().map(|c| c.status).collect();
    assert_eq!(
        statuses.last(),
        Some(&Status::Completed),
        "{checkpoints:#?}"
    );
    // The step's first commit holds the reply with the call in flight.
    let in_step = checkpoints
        .iter()
        .find(|c| c.open_calls.iter().any(|call| call.id == "c1"))
        .ok_or_else(|| anyhow::anyhow!("no checkpoint with c1 in flight: {checkpoints:#?}"))?;
    assert_eq!(in_step.status, Status::Running);
    assert_eq!(in_step.step, 1);
    assert!(checkpoints.windows(2).all(|pair| pair[0].id < pair[1].id));

    let past = runtime
        .state_at(&id, in_step.id)
        .await?
        .found()
        .ok_or_else(|| anyhow::anyhow!("no state at {}", in_step.id))?;
    assert_eq!(past.record.status, Status::Running);
    assert_eq!(past.messages.len(), 2, "{:#?}", past.messages);
    assert!(tool_result(&past.messages, "c1").is_none());
    let now = runtime.messages(&id).await?;
    assert_eq!(&now[..2], &past.messages[..]);
    assert_eq!(
        runtime
            .state_at(&id, dormant::types::CheckpointId(999))
            .await?,
        dormant::types::StateAt::Unknown
    );
    assert!(matches!(
        runtime.checkpoints(&"nobody".parse()?).await,
        Err(dormant::ReadError::UnknownSession(_))
    ));
    Ok(())
}

#[tokio::test]
async fn a_fork_over_a_pending_call_waits_again_and_never_reruns_recorded_tools(
) -> anyhow::Result<()> {
    let runs = Runs::default();
    let clock = ManualClock::new(1_000);
    let script = vec![
        call("c1", "charge"),
        call("k1", "confirm"),
        ModelReply::text("done"),
    ];
    let hooks = Arc::new(RecordingHooks::default());
    let runtime = runtime(memory(), &clock, script, &runs, hooks.clone())?;
    let source: SessionId = "s1".parse()?;
    let suspended = runtime.execute_on(&source, "shop", "buy it").await?;
    assert_eq!(suspended.status, Status::SuspendedClientTool);
    assert_eq!(runs.charges(), 1);
    let checkpoint = last_checkpoint(&runtime, &source).await?;
    let source_deadline = runtime.pending(&source).await?[0].deadline_at_ms;

    clock.advance(5_000);
    let fork = runtime
        .fork(&source, checkpoint, ForkOptions::new())
        .await?;
    assert_eq!(runtime.status(&fork).await?, Status::SuspendedClientTool);
    let pending = runtime.pending(&fork).await?;
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].tool_call_id, "k1");
    assert_eq!(
        pending[0].deadline_at_ms,
        source_deadline + 5_000,
        "a new deadline"
    );
    assert_ne!(
        pending[0].run_id, suspended.run_id,
        "the fork waits under a run of its own"
    );
    let record = runtime.session(&fork).await?;
    let origin = record
        .forked_from
        .ok_or_else(|| anyhow::anyhow!("no origin"))?;
    assert_eq!(
        (origin.session, origin.checkpoint),
        (source.clone(), checkpoint)
    );
    assert_eq!(record.root, fork);

    // The source's answer stays the source's.
    let answer = Submit::result("s1", "k1", json!({ "ok": "source" }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(runtime.resume(&source).await?.status, Status::Completed);
    assert_eq!(runtime.pending(&fork).await?.len(), 1);
    assert!(tool_result(&runtime.messages(&fork).await?, "k1").is_none());

    let answer = Submit::result(fork.as_str(), "k1", json!({ "ok": "fork" }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(runtime.resume(&fork).await?.status, Status::Completed);
    let messages = runtime.messages(&fork).await?;
    assert_eq!(
        tool_result(&messages, "k1"),
        Some(&ToolOutcome::Result(json!({ "ok": "fork" })))
    );
    assert_eq!(
        tool_result(&messages, "c1"),
        Some(&ToolOutcome::Result(json!({ "echo": { "n": 1 } }))),
        "the recorded result is the fork's"
    );
    assert_eq!(runs.charges(), 1, "never run again");

    let events = hooks.events.lock().clone();
    assert!(events.iter().any(|event| matches!(event,
        HookEvent::SessionForked { session, forked_from } if session == &fork && forked_from.checkpoint == checkpoint)));
    assert!(events.iter().any(|event| matches!(event,
        HookEvent::AgentResumed { session, resumed_from_checkpoint: Some(origin), .. }
            if session == &fork && origin.checkpoint == checkpoint)));
    Ok(())
}

#[tokio::test]
async fn a_fork_inside_a_step_gives_the_call_in_flight_a_durability_error() -> anyhow::Result<()> {
    let runs = Runs::default();
    let clock = ManualClock::new(1_000);
    let script = vec![call("c1", "charge"), ModelReply::text("charged")];
    let runtime = runtime(memory(), &clock, script, &runs, Arc::default())?;
    let source: SessionId = "s1".parse()?;
    runtime.execute_on(&source, "shop", "buy it").await?;
    assert_eq!(runs.charges(), 1);
    let in_step = runtime
        .checkpoints(&source)
        .await?
        .into_iter()
        .find(|c| c.status == Status::Running && !c.open_calls.is_empty())
        .ok_or_else(|| anyhow::anyhow!("no checkpoint inside the step"))?;

    let fork = runtime
        .fork(&source, in_step.id, ForkOptions::new())
        .await?;
    assert_eq!(runtime.status(&fork).await?, Status::Interrupted);
    let runs_of_fork = runtime.runs(&fork).await?;
    let cut = runs_of_fork.last().and_then(|run| run.error.clone());
    assert_eq!(cut.map(|error| error.code), Some(ErrorCode::ForkPoint));

    let resumed = runtime.resume(&fork).await?;
    assert_eq!(resumed.status, Status::Completed);
    assert_eq!(
        runs.charges(),
        1,
        "the call in flight at the fork point is not run again"
    );
    match tool_result(&runtime.messages(&fork).await?, "c1") {
        Some(ToolOutcome::Error(error)) => assert!(
            error.contains(ToolErrorCode::ToolDurabilityError.as_str()),
            "{error}"
        ),
        other => anyhow::bail!("expected a durability error, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn an_approval_is_asked_again_in_a_fork() -> anyhow::Result<()> {
    let runs = Runs::default();
    let clock = ManualClock::new(1_000);
    let script = vec![call("d1", "deploy"), ModelReply::text("deployed")];
    let runtime = runtime(memory(), &clock, script, &runs, Arc::default())?;
    let source: SessionId = "s1".parse()?;
    let suspended = runtime.execute_on(&source, "shop", "ship").await?;
    let checkpoint = last_checkpoint(&runtime, &source).await?;
    let source_approval = format!("{}::d1", suspended.run_id);
    let approve = Submit::approval("s1", "d1", source_approval.clone(), true, None);
    assert_eq!(
        runtime.submit_tool_result(approve).await?,
        SubmitOutcome::Accepted
    );

    let fork = runtime
        .fork(&source, checkpoint, ForkOptions::new())
        .await?;
    let pending = runtime.pending(&fork).await?;
    assert_eq!(pending.len(), 1);
    assert!(pending[0].answer.is_none(), "the approval is not inherited");
    assert_ne!(pending[0].approval_id(), source_approval);
    let replayed = Submit::approval(fork.as_str(), "d1", source_approval, true, None);
    let outcome = runtime.submit_tool_result(replayed).await?;
    assert!(
        matches!(outcome, SubmitOutcome::InvalidResult { .. }),
        "the source's approval id does not approve the fork's call: {outcome:?}"
    );
    // Resuming the fork runs nothing: its call still waits.
    assert_eq!(
        runtime.resume(&fork).await?.status,
        Status::SuspendedClientTool
    );
    assert_eq!(runs.deploys(), 0);
    assert_eq!(runtime.resume(&source).await?.status, Status::Completed);
    assert_eq!(runs.deploys(), 1, "the source's approved call ran once");
    Ok(())
}

#[tokio::test]
async fn a_fork_with_an_edited_message_runs_the_new_text() -> anyhow::Result<()> {
    let runs = Runs::default();
    let clock = ManualClock::new(1_000);
    let script = vec![
        ModelReply::text("first answer"),
        ModelReply::text("second answer"),
    ];
    let runtime = runtime(memory(), &clock, script, &runs, Arc::default())?;
    let source: SessionId = "s1".parse()?;
    runtime.execute_on(&source, "shop", "hello").await?;
    runtime.execute_on(&source, "shop", "again").await?;
    let checkpoint = last_checkpoint(&runtime, &source).await?;

    let fork = runtime
        .fork(
            &source,
            checkpoint,
            ForkOptions::new().edit_last_message("something else"),
        )
        .await?;
    let texts = |messages: Vec<Message>| -> Vec<String> {
        messages
            .into_iter()
            .map(|message| match message {
                Message::User { text } => format!("user: {text}"),
                Message::Assistant { text, .. } => format!("model: {}", text.unwrap_or_default()),
                Message::Tool { tool_name, .. } => format!("tool: {tool_name}"),
            })
            .collect()
    };
    assert_eq!(
        texts(runtime.messages(&fork).await?),
        [
            "user: hello",
            "model: first answer",
            "user: something else",
            "model: second answer"
        ]
    );
    assert_eq!(
        texts(runtime.messages(&source).await?)[2],
        "user: again",
        "the source is not touched"
    );

    // The first message edited: a fork with no history before it.
    let first = runtime.checkpoints(&source).await?[0].id;
    let fresh = runtime
        .fork(
            &source,
            first,
            ForkOptions::new().edit_last_message("hi there"),
        )
        .await?;
    assert_eq!(
        texts(runtime.messages(&fresh).await?),
        ["user: hi there", "model: first answer"]
    );
    assert_eq!(runtime.runs(&fresh).await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_fork_with_a_message_abandons_what_waited() -> anyhow::Result<()> {
    let runs = Runs::default();
    let clock = ManualClock::new(1_000);
    let script = vec![call("k1", "confirm"), ModelReply::text("moved on")];
    let runtime = runtime(memory(), &clock, script, &runs, Arc::default())?;
    let source: SessionId = "s1".parse()?;
    runtime.execute_on(&source, "shop", "buy").await?;
    let checkpoint = last_checkpoint(&runtime, &source).await?;
    let fork = runtime
        .fork(
            &source,
            checkpoint,
            ForkOptions::new()
                .id("my-fork".parse()?)
                .message("never mind"),
        )
        .await?;
    assert_eq!(fork.as_str(), "my-fork");
    assert_eq!(runtime.status(&fork).await?, Status::Completed);
    assert!(runtime.pending(&fork).await?.is_empty());
    assert_eq!(runtime.status(&source).await?, Status::SuspendedClientTool);
    Ok(())
}

fn helper_script() -> Vec<ModelReply> {
    vec![
        ModelReply::tool_calls(vec![ToolCall::new(
            "h1",
            "helper",
            json!({ "message": "help" }),
        )]),
        ModelReply::text("done"),
    ]
}

fn refusal(result: Result<SessionId, Error>) -> anyhow::Result<ForkError> {
    match result {
        Err(Error::Fork(error)) => Ok(error),
        other => Err(anyhow::anyhow!("expected a refusal, got {other:?}")),
    }
}

#[tokio::test]
async fn a_tree_forks_with_its_waiting_child_and_answers_reach_the_forks_child_only(
) -> anyhow::Result<()> {
    let runs = Runs::default();
    let clock = ManualClock::new(1_000);
    let runtime = runtime(memory(), &clock, helper_script(), &runs, Arc::default())?;
    let source: SessionId = "s1".parse()?;
    let run = runtime.execute_on(&source, "shop", "get help").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren);
    let checkpoint = last_checkpoint(&runtime, &source).await?;
    let past = runtime
        .state_at(&source, checkpoint)
        .await?
        .found()
        .ok_or_else(|| anyhow::anyhow!("no state"))?;
    assert_eq!(past.children, [source.ephemeral_child("h1")]);

    let fork = runtime
        .fork(&source, checkpoint, ForkOptions::new())
        .await?;
    assert_eq!(
        runtime.status(&fork).await?,
        Status::SuspendedAwaitingChildren
    );
    let forked_child = fork.ephemeral_child("h1");
    let child_record = runtime.session(&forked_child).await?;
    assert_eq!(child_record.root, fork);
    assert_eq!(child_record.parent.as_ref(), Some(&fork));
    assert_eq!(runtime.pending(&forked_child).await?.len(), 1);

    // The fork's root answers its own child; the source's child still waits.
    let answer = Submit::result(fork.as_str(), "a1", json!({ "answer": "fork" }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(runtime.resume(&fork).await?.status, Status::Completed);
    // The fork's stream holds each of the child's chunks once: those copied with the
    // history, then what the forked child wrote.
    let mut copied = std::collections::HashSet::new();
    let mut starts = 0;
    for chunk in runtime.chunks(&fork, 0).await? {
        match chunk.kind {
            dormant::types::ChunkKind::Forwarded { chunk, .. } => {
                assert!(
                    copied.insert(chunk.seq),
                    "child chunk {} copied twice",
                    chunk.seq
                );
            }
            dormant::types::ChunkKind::SubagentStart { .. } => starts += 1,
            _ => {}
        }
    }
    assert_eq!(starts, 1);
    let source_child = source.ephemeral_child("h1");
    assert_eq!(
        runtime.status(&source_child).await?,
        Status::SuspendedClientTool
    );
    assert!(runtime.pending(&source_child).await?[0].answer.is_none());

    // The source moves on: its child answered, the tree completed. Its old checkpoint still
    // says where the child stood (the child's chunks the root had copied by then).
    let answer = Submit::result("s1", "a1", json!({ "answer": "source" }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(runtime.resume(&source).await?.status, Status::Completed);
    let again = runtime
        .fork(&source, checkpoint, ForkOptions::new())
        .await?;
    assert_eq!(
        runtime.status(&again).await?,
        Status::SuspendedAwaitingChildren
    );
    let again_child = again.ephemeral_child("h1");
    let waiting = runtime.pending(&again_child).await?;
    assert_eq!(waiting.len(), 1);
    assert!(
        waiting[0].answer.is_none(),
        "the source's later answer is not the fork's"
    );
    assert!(tool_result(&runtime.messages(&again_child).await?, "a1").is_none());
    // With a new message, nothing of the child is needed: its call is closed.
    let moved = runtime
        .fork(
            &source,
            checkpoint,
            ForkOptions::new().message("never mind"),
        )
        .await?;
    assert_eq!(runtime.status(&moved).await?, Status::Completed);
    Ok(())
}

#[tokio::test]
async fn forks_that_cannot_be_made_are_refused_with_nothing_written() -> anyhow::Result<()> {
    let runs = Runs::default();
    let clock = ManualClock::new(1_000);
    let runtime = runtime(memory(), &clock, helper_script(), &runs, Arc::default())?;
    let source: SessionId = "s1".parse()?;
    runtime.execute_on(&source, "shop", "get help").await?;
    let checkpoint = last_checkpoint(&runtime, &source).await?;
    let before = runtime.session_ids().await?;

    let child = source.ephemeral_child("h1");
    let child_checkpoint = last_checkpoint(&runtime, &child).await?;
    assert!(matches!(
        refusal(runtime.fork(&child, child_checkpoint, ForkOptions::new()).await)?,
        ForkError::NotARoot { root, .. } if root == source
    ));
    assert!(matches!(
        refusal(
            runtime
                .fork(
                    &source,
                    dormant::types::CheckpointId(99),
                    ForkOptions::new()
                )
                .await
        )?,
        ForkError::UnknownCheckpoint { .. }
    ));
    assert!(matches!(
        refusal(
            runtime
                .fork(
                    &source,
                    checkpoint,
                    ForkOptions::new().message("a").edit_last_message("b")
                )
                .await
        )?,
        ForkError::MessageAndEdit
    ));
    let first = runtime.checkpoints(&source).await?[0].id;
    assert!(matches!(
        refusal(
            runtime
                .fork(&source, first, ForkOptions::new().id(child.clone()))
                .await
        )?,
        ForkError::IdTaken(taken) if taken == child
    ));
    assert_eq!(runtime.session_ids().await?, before, "nothing was written");
    assert!(matches!(
        runtime
            .fork(&"nobody".parse()?, first, ForkOptions::new())
            .await,
        Err(Error::UnknownSession(_))
    ));
    Ok(())
}

#[test]
fn a_fork_and_its_source_survive_a_restart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let runs = Runs::default();
    let clock = ManualClock::new(1_000);
    let script = || {
        vec![
            call("c1", "charge"),
            call("k1", "confirm"),
            ModelReply::text("done"),
        ]
    };
    let tokio = tokio::runtime::Runtime::new()?;
    let source: SessionId = "s1".parse()?;
    let fork = tokio.block_on(async {
        let store = Arc::new(SledStore::open(dir.path())?);
        let runtime = runtime(store, &clock, script(), &runs, Arc::default())?;
        runtime.execute_on(&source, "shop", "buy").await?;
        let checkpoint = last_checkpoint(&runtime, &source).await?;
        let fork = runtime
            .fork(&source, checkpoint, ForkOptions::new())
            .await?;
        runtime.shutdown().await?;
        anyhow::Ok(fork)
    })?;
    tokio.block_on(async {
        let store = Arc::new(SledStore::open(dir.path())?);
        let runtime = runtime(store, &clock, script(), &runs, Arc::default())?;
        for session in [&source, &fork] {
            assert_eq!(runtime.status(session).await?, Status::SuspendedClientTool);
            let answer = Submit::result(session.as_str(), "k1", json!({ "ok": true }));
            assert_eq!(
                runtime.submit_tool_result(answer).await?,
                SubmitOutcome::Accepted
            );
            assert_eq!(runtime.resume(session).await?.status, Status::Completed);
        }
        assert_eq!(runs.charges(), 1);
        runtime.shutdown().await?;
        anyhow::Ok(())
    })
}

#[tokio::test]
async fn compaction_keeps_the_newest_checkpoints_and_the_session_reads_as_before(
) -> anyhow::Result<()> {
    let chat = AgentDefinition::builder("chat")
        .tool(ToolDefinition::client("confirm"))
        .retention(dormant::types::Retention::keep_last(4))
        .build()?;
    let script = (0..6)
        .flat_map(|turn| {
            [
                ModelReply::tool_calls(vec![ToolCall::new(
                    format!("k{turn}"),
                    "confirm",
                    json!({}),
                )]),
                ModelReply::text(format!("turn {turn}")),
            ]
        })
        .collect();
    let store: Arc<dyn dormant::store::Store> = Arc::new(SledStore::temporary()?);
    let runtime = Runtime::builder()
        .store(store)
        .llm(Arc::new(ScriptedLlm::new().script("chat", script)))
        .clock(Arc::new(ManualClock::new(1_000)))
        .background_deadlines(false)
        .agent(chat)
        .build()?;
    let id: SessionId = "s1".parse()?;
    let mut first_suspension = None;
    for turn in 0..6 {
        runtime
            .execute_on(&id, "chat", format!("message {turn}"))
            .await?;
        if turn == 0 {
            first_suspension = Some(last_checkpoint(&runtime, &id).await?);
        }
        let answer = Submit::result("s1", format!("k{turn}"), json!({ "turn": turn }));
        assert_eq!(
            runtime.submit_tool_result(answer).await?,
            SubmitOutcome::Accepted
        );
        assert_eq!(runtime.resume(&id).await?.status, Status::Completed);
    }
    runtime.wait_settled(&id).await;
    let compacted = first_suspension.ok_or_else(|| anyhow::anyhow!("no first suspension"))?;

    // Each run end compacts once half as many again as kept have piled up.
    let checkpoints = runtime.checkpoints(&id).await?;
    assert!(
        (4..=6).contains(&checkpoints.len()),
        "{} checkpoints kept",
        checkpoints.len()
    );
    let oldest = checkpoints[0].id;
    assert!(matches!(
        runtime.state_at(&id, compacted).await?,
        dormant::types::StateAt::Compacted { oldest_kept } if oldest_kept == oldest
    ));
    assert!(matches!(
        runtime.fork(&id, compacted, ForkOptions::new()).await,
        Err(Error::Fork(ForkError::Compacted { oldest_kept, .. })) if oldest_kept == oldest
    ));
    // Nothing the session recorded is lost: every message, run and stream chunk.
    let messages = runtime.messages(&id).await?;
    assert_eq!(messages.len(), 6 * 4);
    assert_eq!(runtime.runs(&id).await?.len(), 12);
    let chunks = runtime.chunks(&id, 0).await?;
    assert!(chunks
        .iter()
        .enumerate()
        .all(|(seq, chunk)| chunk.seq == seq as u64));
    assert_eq!(chunks.len() as u64, runtime.session(&id).await?.chunk_count);

    // Down to one, by hand: the newest checkpoint reads as it did.
    let newest = checkpoints[checkpoints.len() - 1].id;
    let past = |state: dormant::types::StateAt| {
        state
            .found()
            .map(|past| (past.record, past.messages, past.runs))
            .ok_or_else(|| anyhow::anyhow!("no state"))
    };
    let before = past(runtime.state_at(&id, newest).await?)?;
    let done = runtime
        .compact_checkpoints(&id, dormant::types::Retention::keep_last(1))
        .await?;
    assert_eq!(done.removed, checkpoints.len() - 1);
    let after = runtime.checkpoints(&id).await?;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].id, newest);
    // The merged checkpoint lists what all the merged ones recorded; the state is the same.
    assert_eq!(past(runtime.state_at(&id, newest).await?)?, before);
    assert_eq!(runtime.messages(&id).await?, messages);
    assert_eq!(
        runtime
            .compact_checkpoints(&id, dormant::types::Retention::keep_last(1))
            .await?
            .removed,
        0
    );
    // A fork of the newest still works, and the session goes on.
    let fork = runtime
        .fork(&id, after[0].id, ForkOptions::new().message("and now?"))
        .await?;
    assert_eq!(
        runtime.messages(&fork).await?[..messages.len()],
        messages[..]
    );
    Ok(())
}

#[tokio::test]
async fn a_maximum_age_merges_checkpoints_older_than_it_once_a_run_ends() -> anyhow::Result<()> {
    let chat = AgentDefinition::builder("chat")
        .retention(dormant::types::Retention::max_age_ms(60_000))
        .build()?;
    let script = (0..4)
        .map(|turn| ModelReply::text(format!("turn {turn}")))
        .collect();
    let clock = ManualClock::new(1_000);
    let runtime = Runtime::builder()
        .store(memory())
        .llm(Arc::new(ScriptedLlm::new().script("chat", script)))
        .clock(Arc::new(clock.clone()))
        .background_deadlines(false)
        .agent(chat)
        .build()?;
    let id: SessionId = "s1".parse()?;
    runtime.execute_on(&id, "chat", "first").await?;
    runtime.execute_on(&id, "chat", "second").await?;
    runtime.wait_settled(&id).await;
    let young = runtime.checkpoints(&id).await?;
    assert_eq!(young.len(), 4, "nothing is old yet");

    // 100 s later (past the age and half of it again), a run ends: the first runs' four
    // checkpoints, all older than the age, are merged into the oldest young one (the third
    // run's first).
    clock.advance(100_000);
    runtime.execute_on(&id, "chat", "third").await?;
    runtime.wait_settled(&id).await;
    let kept = runtime.checkpoints(&id).await?;
    assert_eq!(kept.len(), 2, "{kept:#?}");
    let oldest = kept[0].id;
    assert_eq!(oldest.0, young[3].id.0 + 1);
    for old in &young {
        assert!(matches!(
            runtime.state_at(&id, old.id).await?,
            dormant::types::StateAt::Compacted { oldest_kept } if oldest_kept == oldest
        ));
    }
    assert_eq!(runtime.messages(&id).await?.len(), 6);
    Ok(())
}

#[tokio::test]
async fn a_fork_can_start_with_other_answers_than_its_source_got() -> anyhow::Result<()> {
    use dormant::types::ForkAnswer;
    let runs = Runs::default();
    let clock = ManualClock::new(1_000);
    let script = vec![
        call("c1", "charge"),
        ModelReply::tool_calls(vec![
            ToolCall::new("k1", "confirm", json!({})),
            ToolCall::new("d1", "deploy", json!({ "env": "prod" })),
        ]),
        ModelReply::text("done"),
    ];
    let runtime = runtime(memory(), &clock, script, &runs, Arc::default())?;
    let source: SessionId = "s1".parse()?;
    runtime.execute_on(&source, "shop", "buy and ship").await?;
    let suspended = last_checkpoint(&runtime, &source).await?;
    let before = runtime.session_ids().await?;

    // Refused before anything is written: a call that does not wait there, a decision for a
    // client tool, a result for an approval.
    for (call, answer) in [
        ("nope", ForkAnswer::Result(json!(1))),
        ("k1", ForkAnswer::Approve),
        ("d1", ForkAnswer::Result(json!(1))),
    ] {
        let options = ForkOptions::new().answer(call, answer);
        assert!(matches!(
            refusal(runtime.fork(&source, suspended, options).await)?,
            ForkError::CannotAnswer { call: refused, .. } if refused == call
        ));
    }
    // Over the submit contract's size limit (1 MiB by default): refused the same way.
    let big = ForkAnswer::Result(json!({ "blob": "x".repeat(2 << 20) }));
    assert!(matches!(
        refusal(runtime.fork(&source, suspended, ForkOptions::new().answer("k1", big)).await)?,
        ForkError::CannotAnswer { reason, .. } if reason.contains("payload_too_large")
    ));
    assert_eq!(runtime.session_ids().await?, before, "nothing was written");

    // The source approves; a fork of the same suspension answers otherwise and denies.
    let approve = Submit::approval(
        "s1",
        "d1",
        format!(
            "{}::d1",
            runtime
                .session(&source)
                .await?
                .current_run
                .ok_or_else(|| anyhow::anyhow!("no run"))?
        ),
        true,
        None,
    );
    assert_eq!(
        runtime.submit_tool_result(approve).await?,
        SubmitOutcome::Accepted
    );
    let answer = Submit::result("s1", "k1", json!({ "by": "source" }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    let fork = runtime
        .fork(
            &source,
            suspended,
            ForkOptions::new()
                .answer("k1", ForkAnswer::Result(json!({ "by": "fork" })))
                .answer("d1", ForkAnswer::Deny(Some("not from the fork".into()))),
        )
        .await?;
    assert_eq!(runtime.status(&fork).await?, Status::Completed);
    let messages = runtime.messages(&fork).await?;
    assert_eq!(
        tool_result(&messages, "k1"),
        Some(&ToolOutcome::Result(json!({ "by": "fork" })))
    );
    assert!(
        matches!(tool_result(&messages, "d1"), Some(ToolOutcome::Error(error)) if error.contains("not from the fork"))
    );
    assert_eq!(
        runs.deploys(),
        0,
        "denied in the fork, not yet run in the source"
    );
    assert_eq!(runtime.resume(&source).await?.status, Status::Completed);
    assert_eq!(runs.deploys(), 1);

    // Inside the first step, with the charge in flight: the fork records the given result
    // instead of a durability error, and never runs the charge.
    let in_step = runtime
        .checkpoints(&source)
        .await?
        .into_iter()
        .find(|c| c.open_calls.iter().any(|call| call.id == "c1"))
        .ok_or_else(|| anyhow::anyhow!("no checkpoint with c1 in flight"))?;
    let given = runtime
        .fork(
            &source,
            in_step.id,
            ForkOptions::new().answer("c1", ForkAnswer::Result(json!({ "charged": "by hand" }))),
        )
        .await?;
    assert_eq!(runtime.status(&given).await?, Status::SuspendedClientTool);
    assert_eq!(
        tool_result(&runtime.messages(&given).await?, "c1"),
        Some(&ToolOutcome::Result(json!({ "charged": "by hand" })))
    );
    assert_eq!(runs.charges(), 1, "the charge ran once, in the source");
    Ok(())
}

/// A run whose finishing tool succeeded while a child still waited is suspended with its
/// output decided. A fork made there keeps it: once the fork's child finishes, the fork
/// completes with that output, as its source would, without asking the model again.
#[tokio::test]
async fn a_fork_of_a_run_that_waits_only_to_finish_completes_with_its_output() -> anyhow::Result<()>
{
    let lead = AgentDefinition::builder("lead")
        .tool(
            ToolDefinition::server("submit", |_input, _ctx| async {
                Ok::<_, dormant::ToolError>(json!("submitted"))
            })
            .finish_with(true),
        )
        .tool(ToolDefinition::sub_agent("helper", "helper"))
        .build()?;
    let helper = AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("ask"))
        .build()?;
    let llm = ScriptedLlm::new()
        .script(
            "lead",
            vec![
                ModelReply::tool_calls(vec![
                    ToolCall::new("h1", "helper", json!({ "message": "help" })),
                    ToolCall::new("f1", "submit", json!({})),
                ]),
                ModelReply::text("asked again"),
            ],
        )
        .script(
            "helper",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new("a1", "ask", json!({}))]),
                ModelReply::text("helped"),
            ],
        );
    let runtime = Runtime::builder()
        .store(memory())
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(1_000)))
        .background_deadlines(false)
        .agent(lead)
        .agent(helper)
        .build()?;
    let source: SessionId = "s1".parse()?;
    let run = runtime.execute_on(&source, "lead", "go").await?;
    assert_eq!(run.status, Status::SuspendedAwaitingChildren);
    let checkpoint = last_checkpoint(&runtime, &source).await?;
    let fork = runtime
        .fork(&source, checkpoint, ForkOptions::new())
        .await?;
    let answer = Submit::result(fork.as_str(), "a1", json!({ "answer": "fork" }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    let done = runtime.resume(&fork).await?;
    assert_eq!(done.status, Status::Completed);
    assert_eq!(done.output, Some(json!("submitted")));
    assert_ne!(done.text.as_deref(), Some("asked again"));
    Ok(())
}

/// A model that gives a call of a later step the id of an earlier one (some do: `call_0`
/// each reply): the earlier call's approval is not the later one's. A fork at the later
/// call's suspension asks for its approval again; it does not take it as approved and in
/// flight.
#[tokio::test]
async fn an_approval_of_an_earlier_call_with_the_same_id_is_not_the_forks() -> anyhow::Result<()> {
    let runs = Runs::default();
    let clock = ManualClock::new(1_000);
    let script = vec![
        call("d1", "deploy"),
        call("d1", "deploy"),
        ModelReply::text("deployed twice"),
    ];
    let runtime = runtime(memory(), &clock, script, &runs, Arc::default())?;
    let source: SessionId = "s1".parse()?;
    let first = runtime.execute_on(&source, "shop", "ship").await?;
    let approve = Submit::approval("s1", "d1", format!("{}::d1", first.run_id), true, None);
    assert_eq!(
        runtime.submit_tool_result(approve).await?,
        SubmitOutcome::Accepted
    );
    // The first deploy runs, and the model asks for a second one under the same id.
    let second = runtime.resume(&source).await?;
    assert_eq!(second.status, Status::SuspendedClientTool);
    assert_eq!(runs.deploys(), 1);
    let checkpoint = last_checkpoint(&runtime, &source).await?;

    let fork = runtime
        .fork(&source, checkpoint, ForkOptions::new())
        .await?;
    let pending = runtime.pending(&fork).await?;
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert!(
        pending[0].answer.is_none(),
        "the second call waits for its own approval: {pending:?}"
    );
    assert_eq!(
        runtime.resume(&fork).await?.status,
        Status::SuspendedClientTool
    );
    assert_eq!(runs.deploys(), 1, "nothing ran unapproved");
    Ok(())
}

/// A fork made inside a step whose two calls were in flight: `pay` (not safe to retry, with
/// a check that looks its idempotency key up) and `slow` (safe to retry). The fork's resume
/// gives `pay` a `tool_durability_error` and runs `slow` again; the process stops before
/// `slow` returns. The resume after that must not take `pay` for the fork's own call in
/// flight: checked under the fork's key, which the provider never saw, it would be found not
/// to have happened, and paid a second time.
#[tokio::test]
async fn a_copied_call_in_flight_is_not_reconciled_after_a_crash_in_the_forks_first_resume(
) -> anyhow::Result<()> {
    use dormant::definition::Reconciled;
    use std::sync::atomic::AtomicBool;

    let paid: Arc<parking_lot::Mutex<Vec<String>>> = Arc::default();
    let (block, started) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(tokio::sync::Notify::new()),
    );
    let agent = || -> anyhow::Result<AgentDefinition> {
        let pay = ToolDefinition::server("pay", {
            let paid = Arc::clone(&paid);
            move |_input, ctx: dormant::definition::ToolContext| {
                let paid = Arc::clone(&paid);
                async move {
                    paid.lock().push(ctx.idempotency_key().to_string());
                    Ok::<_, dormant::ToolError>(json!("paid"))
                }
            }
        })
        .reconcile_with({
            let paid = Arc::clone(&paid);
            move |_input: serde_json::Value, key: String| {
                let known = paid.lock().contains(&key);
                async move {
                    Some(if known {
                        Reconciled::Happened(json!("paid"))
                    } else {
                        Reconciled::DidNotHappen
                    })
                }
            }
        });
        let slow = ToolDefinition::server("slow", {
            let (block, started) = (Arc::clone(&block), Arc::clone(&started));
            move |_input, _ctx| {
                let (block, started) = (Arc::clone(&block), Arc::clone(&started));
                async move {
                    if block.load(Ordering::SeqCst) {
                        started.notify_one();
                        std::future::pending::<()>().await;
                    }
                    Ok::<_, dormant::ToolError>(json!("slow"))
                }
            }
        })
        .safe_to_retry(true);
        Ok(AgentDefinition::builder("pair")
            .tool(pay)
            .tool(slow)
            .build()?)
    };
    let store = memory();
    let clock = ManualClock::new(1_000);
    let build = |script: Vec<ModelReply>| -> anyhow::Result<Runtime> {
        Ok(Runtime::builder()
            .store(Arc::clone(&store))
            .llm(Arc::new(ScriptedLlm::new().script("pair", script)))
            .clock(Arc::new(clock.clone()))
            .background_deadlines(false)
            .agent(agent()?)
            .build()?)
    };
    let both = ModelReply::tool_calls(vec![
        ToolCall::new("p1", "pay", json!({})),
        ToolCall::new("w1", "slow", json!({})),
    ]);
    let first = build(vec![both, ModelReply::text("done")])?;
    let source: SessionId = "s1".parse()?;
    first.execute_on(&source, "pair", "go").await?;
    assert_eq!(paid.lock().len(), 1);
    let in_step = first
        .checkpoints(&source)
        .await?
        .into_iter()
        .find(|c| c.status == Status::Running && c.open_calls.len() == 2)
        .ok_or_else(|| anyhow::anyhow!("no checkpoint with both calls in flight"))?;
    let fork = first.fork(&source, in_step.id, ForkOptions::new()).await?;

    block.store(true, Ordering::SeqCst);
    // The process stops while `slow` runs.
    common::stop_while_a_resumed_tool_runs(&first, &fork, &started).await?;
    block.store(false, Ordering::SeqCst);
    let bounded = std::time::Duration::from_secs(30);

    // The script is read by reply number: the fork's next is its second.
    let second = build(vec![ModelReply::text("unused"), ModelReply::text("done")])?;
    let resumed = tokio::time::timeout(bounded, second.resume(&fork))
        .await
        .map_err(|_| anyhow::anyhow!("the resume never ended; paid: {:?}", paid.lock()))??;
    let paid_now = paid.lock().clone();
    assert_eq!(paid_now.len(), 1, "paid again: {paid_now:?}");
    assert_eq!(resumed.status, Status::Completed);
    match tool_result(&second.messages(&fork).await?, "p1") {
        Some(ToolOutcome::Error(error)) => assert!(
            error.contains(ToolErrorCode::ToolDurabilityError.as_str()),
            "{error}"
        ),
        other => anyhow::bail!("expected a durability error, got {other:?}"),
    }
    Ok(())
}
