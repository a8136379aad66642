//! `--openai`: the sessions run on a real model, any OpenAI-compatible server named by
//! `OPENAI_BASE_URL`, `OPENAI_API_KEY` and `OPENAI_MODEL` (built with `--features openai`).
//!
//! A real model does not follow a script, so this mode cannot check what the scripted modes
//! check (which step suspends where). It drives whatever the model does: each session gets one
//! message; whenever its run suspends, the simulated client answers every call that waits (the
//! client tool `confirm` with `{"confirmed": true}`, an approval with yes) and resumes, up to
//! `MAX_ROUNDS` times. At the end it checks what holds for any model: every answer the runtime
//! accepted is in its session's messages exactly once, with its value. It reports sessions/s,
//! suspensions, run outcomes and the tokens the provider reported.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use dormant::types::ToolOutcome;
use dormant::{AgentDefinition, Message, PendingKind, Runtime, SessionId, Status, ToolDefinition};
use dormant::{Submit, SubmitOutcome};
use futures::StreamExt;
use serde_json::json;

use crate::Args;

/// Suspensions a session may go through before the driver gives up on it.
const MAX_ROUNDS: usize = 8;
const AGENT: &str = "assistant";

/// What one session went through.
#[derive(Debug, Default)]
struct SessionRun {
    status: Option<Status>,
    error: Option<String>,
    suspensions: usize,
    /// Client-tool calls whose answer the runtime accepted.
    accepted: Vec<String>,
}

/// Runs the sessions on the real model; returns how many problems the end check found.
pub(crate) async fn simulate(args: Args) -> anyhow::Result<usize> {
    let (_temp, _path, store) = crate::open_store(&args)?;
    let model = dormant::OpenAiAdapter::from_env()
        .context("--openai reads OPENAI_BASE_URL, OPENAI_API_KEY and OPENAI_MODEL")?;
    let agent = AgentDefinition::builder(AGENT)
        .system_prompt(
            "You help a user check stock. Look the item up with `lookup`, then ask the user to \
             confirm with `confirm` (a one-line summary), then answer in one short sentence.",
        )
        .tool(
            ToolDefinition::server("lookup", |input, _| async move {
                Ok(json!({ "item": input["item"], "stock": 3 }))
            })
            .description("Looks an item up in the stock.")
            .input_schema(json!({ "type": "object", "required": ["item"],
                "properties": { "item": { "type": "string" } } }))
            .safe_to_retry(true),
        )
        .tool(
            ToolDefinition::client("confirm")
                .description("Asks the user to confirm a one-line summary.")
                .input_schema(json!({ "type": "object", "required": ["summary"],
                    "properties": { "summary": { "type": "string" } } })),
        )
        .build()?;
    let runtime = Runtime::builder()
        .store(store as Arc<dyn dormant::store::Store>)
        .llm(Arc::new(model))
        .agent(agent)
        .build()?;
    let ids: Vec<SessionId> = (0..args.sessions).map(|_| SessionId::generate()).collect();
    let started = Instant::now();
    let runs: Vec<SessionRun> = futures::stream::iter(ids.iter().enumerate())
        .map(|(index, id)| drive(&runtime, id, index))
        .buffered(args.concurrency)
        .collect()
        .await;
    let elapsed = started.elapsed();

    let mut problems = 0;
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let (mut input_tokens, mut output_tokens, mut model_calls) = (0, 0, 0);
    for (id, run) in ids.iter().zip(&runs) {
        let outcome = match (&run.status, &run.error) {
            (_, Some(error)) => format!("error: {error}"),
            (Some(status), None) => status.to_string(),
            (None, None) => "unknown".into(),
        };
        *outcomes.entry(outcome).or_default() += 1;
        for usage in runtime.runs(id).await?.iter().map(|run| &run.usage) {
            input_tokens += usage.tokens.input_tokens;
            output_tokens += usage.tokens.output_tokens;
            model_calls += usage.model_calls;
        }
        let messages = runtime.messages(id).await?;
        for call in &run.accepted {
            let recorded = messages
                .iter()
                .filter(|message| {
                    matches!(message,
                    Message::Tool { tool_call_id, outcome: ToolOutcome::Result(value), .. }
                        if tool_call_id == call && value == &json!({ "confirmed": true }))
                })
                .count();
            if recorded != 1 {
                problems += 1;
                eprintln!(
                    "session {id}: the accepted answer to {call} is recorded {recorded} times"
                );
            }
        }
    }
    runtime.shutdown().await?;

    let suspensions: usize = runs.iter().map(|run| run.suspensions).sum();
    let answers: usize = runs.iter().map(|run| run.accepted.len()).sum();
    println!(
        "mode:             real model (OpenAI-compatible), {} sessions, concurrency {}",
        args.sessions, args.concurrency
    );
    println!(
        "elapsed:          {:.2} s ({:.2} sessions/s)",
        elapsed.as_secs_f64(),
        args.sessions as f64 / elapsed.as_secs_f64()
    );
    println!("suspensions:      {suspensions} ({answers} client answers accepted)");
    println!("model calls:      {model_calls}; tokens {input_tokens} in, {output_tokens} out");
    for (outcome, count) in &outcomes {
        println!("outcome:          {count} × {outcome}");
    }
    println!(
        "verified:         {}",
        if problems == 0 {
            "ok (every accepted answer recorded exactly once)"
        } else {
            "FAILED"
        }
    );
    Ok(problems)
}

/// One session: its message, then answer-and-resume until the run ends.
async fn drive(runtime: &Runtime, id: &SessionId, index: usize) -> SessionRun {
    let mut run = SessionRun::default();
    let message = format!("Session {index}: do we have item-{index} in stock?");
    let mut outcome = runtime.execute_on(id, AGENT, &message).await;
    loop {
        let settled = match outcome {
            Ok(settled) => settled,
            Err(error) => {
                run.error = Some(error.to_string());
                return run;
            }
        };
        run.status = Some(settled.status);
        let waiting = matches!(
            settled.status,
            Status::SuspendedClientTool | Status::SuspendedAwaitingChildren
        );
        if !waiting || run.suspensions == MAX_ROUNDS {
            if let Some(error) = settled.error {
                run.error = Some(format!("{}: {}", error.code.as_str(), error.message));
            }
            return run;
        }
        run.suspensions += 1;
        if let Err(error) = answer_all(runtime, id, &mut run).await {
            run.error = Some(error.to_string());
            return run;
        }
        outcome = runtime.resume(id).await;
    }
}

/// Answers every call the session waits on.
async fn answer_all(runtime: &Runtime, id: &SessionId, run: &mut SessionRun) -> anyhow::Result<()> {
    let now = runtime.now_ms();
    for call in runtime.pending(id).await? {
        if !call.is_waiting(now) {
            continue;
        }
        let submit = match call.kind {
            // The simulator's tools never ask for input; an answer is an empty object.
            PendingKind::Input => {
                Submit::result(id.to_string(), call.tool_call_id.clone(), json!({}))
            }
            PendingKind::Client => Submit::result(
                id.to_string(),
                call.tool_call_id.clone(),
                json!({ "confirmed": true }),
            ),
            PendingKind::Approval => Submit::approval(
                id.to_string(),
                call.tool_call_id.clone(),
                call.approval_id(),
                true,
                None,
            ),
            // The simulator's tools are never cut by a crash, but a reconciliation is still
            // answered: the effect did not happen, so the tool runs once more.
            PendingKind::Reconcile => Submit::reconcile(
                id.to_string(),
                call.tool_call_id.clone(),
                dormant::definition::Reconciled::DidNotHappen,
            ),
        };
        let outcome = runtime.submit_tool_result(submit).await?;
        if outcome == SubmitOutcome::Accepted && call.kind == PendingKind::Client {
            run.accepted.push(call.tool_call_id);
        }
    }
    Ok(())
}
