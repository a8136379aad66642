//! A server tool that asks a person for input while it runs (`ToolContext::ask`): the question
//! is an `input` call of the session — in the inbox, answered through the submit contract from
//! the root of the tree, checked against the schema it asked for, with a deadline — and the
//! tool runs again with the answer, after an eviction or a reopen of the store too.

use std::sync::{Arc, Mutex};

use dormant::definition::{InputAnswer, InputRequest};
use dormant::store::Store;
use dormant::types::{InboxFilter, ToolOutcome};
use dormant::{
    AgentDefinition, ManualClock, MemoryStore, ModelReply, PendingKind, Runtime, ScriptedLlm,
    SessionId, SledStore, Status, Submit, SubmitOutcome, ToolCall, ToolDefinition, ToolError,
};
use serde_json::{json, Value};

mod common;

/// What each run of `transfer` saw: its idempotency key and the answers so far.
type Runs = Arc<Mutex<Vec<(String, Vec<InputAnswer>)>>>;

/// `transfer` asks which account to take the money from (an object with a string `account`),
/// then, if `confirm`, whether to go on; it answers with what it was told.
fn transfer(runs: &Runs, confirm: bool) -> ToolDefinition {
    let runs = Arc::clone(runs);
    ToolDefinition::server("transfer", move |input: Value, ctx| {
        let runs = Arc::clone(&runs);
        async move {
            runs.lock()
                .map_err(|_| ToolError::new("poisoned"))?
                .push((ctx.idempotency_key().to_string(), ctx.answers().to_vec()));
            let account = match ctx.answers().first() {
                None => {
                    let question = InputRequest::new("Which account?").schema(json!({
                        "type": "object",
                        "required": ["account"],
                        "properties": { "account": { "type": "string" } }
                    }));
                    return Err(ctx.ask(question));
                }
                Some(InputAnswer::Declined { reason }) => {
                    return Err(ToolError::new(format!("declined: {reason:?}")))
                }
                Some(InputAnswer::Accepted { content }) => content["account"].clone(),
            };
            if confirm && ctx.answers().len() < 2 {
                return Err(ctx.ask(InputRequest::new("Go on?")));
            }
            let confirmed = ctx.answers().get(1).cloned();
            Ok(json!({ "from": account, "cents": input["cents"], "confirmed": confirmed }))
        }
    })
}

/// `lead` delegates to the sub-agent `payer`, whose `transfer` asks for input.
fn tree(store: Arc<dyn Store>, runs: &Runs, confirm: bool) -> anyhow::Result<Runtime> {
    let llm = ScriptedLlm::new()
        .script(
            "lead",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new(
                    "c1",
                    "pay",
                    json!({ "message": "pay 10" }),
                )]),
                ModelReply::text("done"),
            ],
        )
        .script(
            "payer",
            vec![
                ModelReply::tool_calls(vec![ToolCall::new(
                    "t1",
                    "transfer",
                    json!({ "cents": 10 }),
                )]),
                ModelReply::text("paid"),
            ],
        );
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .clock(Arc::new(ManualClock::new(1_000)))
        .background_deadlines(false)
        .agent(
            AgentDefinition::builder("lead")
                .tool(ToolDefinition::sub_agent("pay", "payer"))
                .build()?,
        )
        .agent(
            AgentDefinition::builder("payer")
                .tool(transfer(runs, confirm))
                .client_tool_timeout_ms(60_000)
                .build()?,
        )
        .build()?)
}

/// Agent `payer` alone, whose model calls `tool` as `transfer` (call `t1`) once, then says
/// "paid"; client calls (and questions) wait 5 s.
fn payer(tool: ToolDefinition, clock: Arc<ManualClock>) -> anyhow::Result<Runtime> {
    payer_on(Arc::new(MemoryStore::new()), tool, clock)
}

/// [`payer`] on `store`.
fn payer_on(
    store: Arc<dyn Store>,
    tool: ToolDefinition,
    clock: Arc<ManualClock>,
) -> anyhow::Result<Runtime> {
    let llm = ScriptedLlm::new().script(
        "payer",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new("t1", "transfer", json!({ "cents": 5 }))]),
            ModelReply::text("paid"),
        ],
    );
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .clock(clock)
        .background_deadlines(false)
        .agent(
            AgentDefinition::builder("payer")
                .tool(tool)
                .client_tool_timeout_ms(5_000)
                .build()?,
        )
        .build()?)
}

fn seen(runs: &Runs) -> anyhow::Result<Vec<(String, Vec<InputAnswer>)>> {
    Ok(runs
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone())
}

fn accepted(account: &str) -> InputAnswer {
    InputAnswer::Accepted {
        content: json!({ "account": account }),
    }
}

#[tokio::test]
async fn a_question_asked_in_a_sub_agent_is_answered_at_the_root_and_the_tool_goes_on(
) -> anyhow::Result<()> {
    let runs: Runs = Arc::default();
    let runtime = tree(Arc::new(MemoryStore::new()), &runs, false)?;
    let root: SessionId = "root".parse()?;
    let waiting = runtime.execute_on(&root, "lead", "pay").await?;
    assert_eq!(waiting.status, Status::SuspendedAwaitingChildren);

    // The question waits in the inbox, under the root, with what it asks.
    let inbox = runtime
        .inbox(&InboxFilter::all().kind(PendingKind::Input), None, 10)
        .await?;
    assert_eq!(inbox.items.len(), 1);
    let item = &inbox.items[0];
    assert_eq!(item.root, root);
    assert_ne!(item.session, root, "the child asks");
    assert_eq!(item.tool_call_id, "t1");
    let request = item
        .request
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no request"))?;
    assert_eq!(request.message, "Which account?");
    assert_eq!(
        request.schema.as_ref().map(|s| &s["required"]),
        Some(&json!(["account"]))
    );

    // An answer that does not match the schema is refused, and the call keeps waiting.
    let wrong = runtime
        .submit_tool_result(Submit::result("root", "t1", json!({ "acct": 7 })))
        .await?;
    let SubmitOutcome::InvalidResult { errors, .. } = wrong else {
        anyhow::bail!("a wrong answer was not refused: {wrong:?}");
    };
    assert!(!errors.is_empty());
    // An approval is not an answer to a question.
    let approval = Submit::approval("root", "t1", "x::t1", true, None);
    assert!(matches!(
        runtime.submit_tool_result(approval).await?,
        SubmitOutcome::InvalidResult { .. }
    ));

    let answer = Submit::result("root", "t1", json!({ "account": "savings" }));
    assert_eq!(
        runtime.submit_json(&answer.to_json()).await?,
        SubmitOutcome::Accepted
    );
    // First writer wins.
    let again = Submit::result("root", "t1", json!({ "account": "checking" }));
    assert_eq!(
        runtime.submit_tool_result(again).await?,
        SubmitOutcome::AlreadyCompleted
    );

    let done = runtime.resume(&root).await?;
    assert_eq!(done.status, Status::Completed);
    assert_eq!(done.text.as_deref(), Some("done"));
    let runs = seen(&runs)?;
    assert_eq!(runs.len(), 2, "asked, then ran again with the answer");
    assert_eq!(runs[0].0, runs[1].0, "the same idempotency key both times");
    assert_eq!(runs[0].1, vec![]);
    assert_eq!(runs[1].1, vec![accepted("savings")]);
    let child = root.ephemeral_child("c1");
    let messages = runtime.messages(&child).await?;
    assert_eq!(
        common::tool_result(&messages, "t1"),
        Some(&ToolOutcome::Result(
            json!({ "from": "savings", "cents": 10, "confirmed": null })
        ))
    );
    assert!(runtime
        .inbox(&InboxFilter::all(), None, 10)
        .await?
        .items
        .is_empty());
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_second_question_keeps_the_first_answer_and_a_refusal_reaches_the_tool(
) -> anyhow::Result<()> {
    let runs: Runs = Arc::default();
    let runtime = tree(Arc::new(MemoryStore::new()), &runs, true)?;
    let root: SessionId = "root".parse()?;
    runtime.execute_on(&root, "lead", "pay").await?;
    let inbox = runtime.inbox(&InboxFilter::all(), None, 10).await?;
    assert_eq!(inbox.items[0].question, Some(1));
    let first = Submit::result("root", "t1", json!({ "account": "savings" })).for_question(1);
    assert_eq!(
        runtime.submit_tool_result(first).await?,
        SubmitOutcome::Accepted
    );
    let asks_again = runtime.resume(&root).await?;
    assert_eq!(asks_again.status, Status::SuspendedAwaitingChildren);
    let inbox = runtime.inbox(&InboxFilter::all(), None, 10).await?;
    assert_eq!(inbox.items.len(), 1);
    assert_eq!(
        inbox.items[0].request.as_ref().map(|r| r.message.as_str()),
        Some("Go on?")
    );
    assert_eq!(
        inbox.items[0].question,
        Some(2),
        "the call's second question"
    );
    // A retried answer to the first question is not taken for the second.
    let retried = Submit::result("root", "t1", json!({ "account": "savings" })).for_question(1);
    assert_eq!(
        runtime.submit_tool_result(retried).await?,
        SubmitOutcome::AlreadyCompleted
    );
    let ahead = Submit::error("root", "t1", "no").for_question(3);
    assert!(matches!(
        runtime.submit_tool_result(ahead).await?,
        SubmitOutcome::InvalidResult { .. }
    ));
    // A refusal is an error submitted for the call.
    let refuse = Submit::error("root", "t1", "not today").for_question(2);
    assert_eq!(
        runtime.submit_tool_result(refuse).await?,
        SubmitOutcome::Accepted
    );
    let done = runtime.resume(&root).await?;
    assert_eq!(done.status, Status::Completed);
    let runs = seen(&runs)?;
    assert_eq!(runs.len(), 3);
    let refused = InputAnswer::Declined {
        reason: Some("not today".into()),
    };
    assert_eq!(runs[2].1, vec![accepted("savings"), refused.clone()]);
    let messages = runtime.messages(&root.ephemeral_child("c1")).await?;
    assert_eq!(
        common::tool_result(&messages, "t1"),
        Some(&ToolOutcome::Result(json!({
            "from": "savings",
            "cents": 10,
            "confirmed": serde_json::to_value(&refused)?
        })))
    );
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_question_pending_across_a_reopen_of_the_store_is_answered_after_it() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let runs: Runs = Arc::default();
    let root: SessionId = "root".parse()?;
    {
        let runtime = tree(Arc::new(SledStore::open(dir.path())?), &runs, false)?;
        let waiting = runtime.execute_on(&root, "lead", "pay").await?;
        assert_eq!(waiting.status, Status::SuspendedAwaitingChildren);
        runtime.shutdown().await?;
    }
    // The process is gone; the store is opened again by a new runtime.
    let runtime = tree(Arc::new(SledStore::open(dir.path())?), &runs, false)?;
    let inbox = runtime.inbox(&InboxFilter::all(), None, 10).await?;
    assert_eq!(inbox.items.len(), 1);
    assert_eq!(inbox.items[0].kind, PendingKind::Input);
    assert_eq!(
        inbox.items[0].request.as_ref().map(|r| r.message.as_str()),
        Some("Which account?")
    );
    let answer = Submit::result("root", "t1", json!({ "account": "savings" }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    let done = runtime.resume(&root).await?;
    assert_eq!(done.status, Status::Completed);
    let runs = seen(&runs)?;
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0].0, runs[1].0);
    assert_eq!(runs[1].1, vec![accepted("savings")]);
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_question_nobody_answers_times_out_and_the_tool_does_not_run_again() -> anyhow::Result<()>
{
    let runs: Runs = Arc::default();
    let clock = Arc::new(ManualClock::new(1_000));
    let runtime = payer(transfer(&runs, false), clock.clone())?;
    let id: SessionId = "s".parse()?;
    let waiting = runtime.execute_on(&id, "payer", "pay").await?;
    assert_eq!(waiting.pending, vec!["t1".to_string()]);
    clock.advance(5_000);
    runtime.sweep_deadlines().await?;
    let late = Submit::result("s", "t1", json!({ "account": "savings" }));
    assert_eq!(
        runtime.submit_tool_result(late).await?,
        SubmitOutcome::AlreadyCompleted
    );
    let done = runtime.resume(&id).await?;
    assert_eq!(done.status, Status::Completed);
    let messages = runtime.messages(&id).await?;
    let Some(ToolOutcome::Error(error)) = common::tool_result(&messages, "t1") else {
        anyhow::bail!("no timeout recorded");
    };
    assert!(error.starts_with("client_tool_timeout"), "{error}");
    assert!(
        error.contains("nobody answered the question transfer asked"),
        "{error}"
    );
    assert_eq!(seen(&runs)?.len(), 1, "the tool never ran again");
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn an_approved_call_that_asks_keeps_its_approval_and_runs_with_the_answer(
) -> anyhow::Result<()> {
    let runs: Runs = Arc::default();
    let runtime = payer(
        transfer(&runs, false).require_approval(dormant::Approval::Always),
        Arc::new(ManualClock::new(1_000)),
    )?;
    let id: SessionId = "s".parse()?;
    runtime.execute_on(&id, "payer", "pay").await?;
    let pending = runtime.pending(&id).await?;
    assert_eq!(pending[0].kind, PendingKind::Approval);
    let approve = Submit::approval("s", "t1", pending[0].approval_id(), true, None)
        .bound_to(pending[0].binding.clone().unwrap_or_default());
    assert_eq!(
        runtime.submit_tool_result(approve).await?,
        SubmitOutcome::Accepted
    );
    let asks = runtime.resume(&id).await?;
    assert_eq!(asks.status, Status::SuspendedClientTool);
    let question = runtime.pending(&id).await?;
    assert_eq!(question[0].kind, PendingKind::Input);
    assert!(
        question[0].binding.is_some(),
        "the approval's binding stays with the call"
    );

    let answer = Submit::result("s", "t1", json!({ "account": "savings" }));
    assert_eq!(
        runtime.submit_tool_result(answer).await?,
        SubmitOutcome::Accepted
    );
    assert_eq!(runtime.resume(&id).await?.status, Status::Completed);
    assert_eq!(
        seen(&runs)?.len(),
        2,
        "ran on the approval, then with the answer"
    );
    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_fork_at_a_question_does_not_answer_it() -> anyhow::Result<()> {
    use dormant::types::{ForkAnswer, ForkOptions};
    let runs: Runs = Arc::default();
    let runtime = payer(transfer(&runs, false), Arc::new(ManualClock::new(1_000)))?;
    let id: SessionId = "s".parse()?;
    runtime.execute_on(&id, "payer", "pay").await?;
    // A fork at the question does not answer it.
    let checkpoint = runtime
        .checkpoints(&id)
        .await?
        .last()
        .map(|checkpoint| checkpoint.id)
        .ok_or_else(|| anyhow::anyhow!("no checkpoint"))?;
    let answered = ForkOptions::new().answer("t1", ForkAnswer::Result(json!({ "account": "x" })));
    let refused = runtime.fork(&id, checkpoint, answered).await;
    let Err(error) = refused else {
        anyhow::bail!("a fork answered a question: {refused:?}");
    };
    assert!(
        error.to_string().contains("asked a person for input"),
        "{error}"
    );

    runtime.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn a_crash_while_the_tool_runs_again_with_its_answer_follows_the_at_most_once_rule(
) -> anyhow::Result<()> {
    use dormant::store::CommitKind;
    use dormant::testkit::{Fault, FaultyStore};
    use dormant::types::ToolErrorCode;
    for safe in [false, true] {
        let runs: Runs = Arc::default();
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let faulty = Arc::new(FaultyStore::new(Arc::clone(&store)));
        let tool = || transfer(&runs, false).safe_to_retry(safe);
        let clock = Arc::new(ManualClock::new(1_000));
        let id: SessionId = "s".parse()?;
        {
            let runtime = payer_on(faulty.clone(), tool(), clock.clone())?;
            runtime.execute_on(&id, "payer", "pay").await?;
            let answer = Submit::result("s", "t1", json!({ "account": "savings" }));
            assert_eq!(
                runtime.submit_tool_result(answer).await?,
                SubmitOutcome::Accepted
            );
            // The run that goes on with the answer dies before its result is committed.
            faulty.arm(Fault::CrashBefore(CommitKind::ToolResults));
            assert!(runtime.resume(&id).await.is_err());
            faulty.clear();
        }
        let runtime = payer_on(store, tool(), clock)?;
        let done = runtime.resume(&id).await?;
        assert_eq!(done.status, Status::Completed);
        let messages = runtime.messages(&id).await?;
        let result = common::tool_result(&messages, "t1").cloned();
        let runs = seen(&runs)?;
        if safe {
            assert_eq!(runs.len(), 3, "asked, cut, and once more after the crash");
            assert_eq!(runs[2].1, vec![accepted("savings")], "with the answer");
            assert!(matches!(result, Some(ToolOutcome::Result(_))), "{result:?}");
        } else {
            assert_eq!(runs.len(), 2, "not run again");
            let code = result.as_ref().and_then(ToolOutcome::code);
            assert_eq!(code, Some(ToolErrorCode::ToolDurabilityError), "{result:?}");
        }
        runtime.shutdown().await?;
    }
    Ok(())
}

/// Asks once, and remembers which questions the session closed.
struct Asking {
    closed: Arc<Mutex<Vec<String>>>,
}

impl dormant::definition::ToolHandler for Asking {
    fn call(
        &self,
        _input: Value,
        ctx: dormant::definition::ToolContext,
    ) -> dormant::llm::BoxFuture<'static, Result<Value, ToolError>> {
        Box::pin(async move {
            match ctx.answers().first() {
                None => Err(ctx.ask(InputRequest::new("Sure?"))),
                Some(_) => Ok(json!("done")),
            }
        })
    }

    fn question_closed(&self, idempotency_key: &str) {
        if let Ok(mut closed) = self.closed.lock() {
            closed.push(idempotency_key.to_string());
        }
    }
}

#[tokio::test]
async fn a_tool_is_told_when_the_session_closes_its_question() -> anyhow::Result<()> {
    let closed = Arc::new(Mutex::new(Vec::new()));
    let tool = ToolDefinition::server_handler(
        "transfer",
        Asking {
            closed: Arc::clone(&closed),
        },
    );
    let runtime = payer(tool, Arc::new(ManualClock::new(1_000)))?;
    let id: SessionId = "s".parse()?;
    runtime.execute_on(&id, "payer", "pay").await?;
    let key = runtime.pending(&id).await?[0]
        .idempotency_key
        .clone()
        .unwrap_or_default();
    assert_eq!(key.len(), 32, "the question carries its call's key");
    assert!(closed
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .is_empty());
    // A new message closes the question: the tool never goes on with it.
    let next = runtime.execute_on(&id, "payer", "never mind").await?;
    assert_eq!(next.status, Status::Completed);
    let told = closed
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    assert_eq!(told, vec![key]);
    runtime.shutdown().await?;
    Ok(())
}
