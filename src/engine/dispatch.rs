//! Runs the server tools of a step: phase 1 in parallel, then phase 2 (`finish_with` and
//! `__finish__`) in order, stopping at the first that finishes the run. A handler that panics
//! becomes a tool error; it never takes down its session.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use serde_json::{Map, Value};

use crate::definition::reconcile::{idempotency_key, CheckFn, Reconciled};
use crate::definition::{
    AgentDefinition, InputAnswer, InputRequest, ToolContext, ToolHandler, ToolKind, FINISH_TOOL,
};
use crate::session::FinishedCall;
use crate::types::ids::{RunId, SessionId};
use crate::types::message::{ToolCall, ToolOutcome};
use crate::types::panic::panic_text;
use crate::types::tool_error::ToolErrorCode;

/// What every call of one step shares.
#[derive(Clone, Debug)]
pub(crate) struct StepContext {
    pub(crate) agent: Arc<AgentDefinition>,
    pub(crate) session: SessionId,
    pub(crate) run_id: RunId,
    pub(crate) state: Arc<Value>,
    /// The message seq of the model reply whose calls these are (part of each call's
    /// idempotency key).
    pub(crate) reply_seq: u64,
    /// Calls a crash cut that their tool's check settles first (see
    /// [`crate::definition::reconcile`]).
    pub(crate) checks: Vec<String>,
    /// The answers given to calls that asked for input, by call id.
    pub(crate) answers: HashMap<String, Arc<[InputAnswer]>>,
}

/// Runs the step's tools and returns their outcomes.
pub(crate) async fn run_step(
    step: StepContext,
    parallel: Vec<ToolCall>,
    sequential: Vec<ToolCall>,
) -> Vec<FinishedCall> {
    let mut finished =
        futures::future::join_all(parallel.into_iter().map(|call| run_one(&step, call))).await;
    let mut done = false;
    for call in sequential {
        if done {
            // A cut call not checked yet may have taken effect: never "skipped".
            let outcome = if step.checks.contains(&call.id) {
                ToolErrorCode::ToolDurabilityError.with(format_args!(
                    "the process stopped while {} (call {}) was running, and an earlier call in this step finished the run before it was reconciled: check whether its effect happened (idempotency key {}) before calling it again.",
                    call.name,
                    call.id,
                    idempotency_key(&step.session, step.reply_seq, &call.id)
                ))
            } else {
                ToolErrorCode::Skipped.with("an earlier call in this step already finished the run")
            };
            finished.push(FinishedCall {
                tool_call_id: call.id,
                outcome: outcome.into(),
                updates: Map::new(),
                unsettled: false,
                asked: None,
            });
            continue;
        }
        let result = run_one(&step, call).await;
        done = !result.outcome.is_error();
        finished.push(result);
    }
    finished
}

async fn run_one(step: &StepContext, call: ToolCall) -> FinishedCall {
    if call.name == FINISH_TOOL {
        return FinishedCall {
            outcome: finish_outcome(&step.agent, &call.input),
            tool_call_id: call.id,
            updates: Map::new(),
            unsettled: false,
            asked: None,
        };
    }
    let tool = step.agent.tool(&call.name).map(|tool| &tool.def);
    let handler = match tool.map(|tool| &tool.kind) {
        Some(ToolKind::Server(handler)) => Arc::clone(handler),
        _ => {
            return FinishedCall {
                outcome: ToolErrorCode::UnknownTool.with(&call.name).into(),
                tool_call_id: call.id,
                updates: Map::new(),
                unsettled: false,
                asked: None,
            }
        }
    };
    let key = idempotency_key(&step.session, step.reply_seq, &call.id);
    if step.checks.contains(&call.id) {
        let check = tool.and_then(|tool| tool.check.clone());
        let outcome = match check_cut_call(step, &call, check, &key).await {
            Some(Reconciled::DidNotHappen) => None, // it runs once more, below
            Some(Reconciled::Happened(value)) => Some(ToolOutcome::Result(value)),
            Some(Reconciled::Failed(error)) => Some(ToolOutcome::Error(error)),
            None => {
                return FinishedCall {
                    outcome: ToolOutcome::Error("not settled by its check".into()),
                    tool_call_id: call.id,
                    updates: Map::new(),
                    unsettled: true,
                    asked: None,
                }
            }
        };
        if let Some(outcome) = outcome {
            return FinishedCall {
                tool_call_id: call.id,
                outcome,
                updates: Map::new(),
                unsettled: false,
                asked: None,
            };
        }
    }
    let ctx = ToolContext::new(
        step.session.clone(),
        step.run_id,
        call.id.clone(),
        key,
        Arc::clone(&step.state),
        step.answers
            .get(&call.id)
            .cloned()
            .unwrap_or_else(|| Arc::new([])),
    );
    // Called inside the catch: a handler may panic before it hands back its future (a
    // closure's code before its `async` block), and that is the tool's error too.
    let input = call.input;
    let running = AssertUnwindSafe(async { handler.call(input, ctx.clone()).await }).catch_unwind();
    let outcome = match running.await {
        Ok(Ok(value)) => ToolOutcome::Result(value),
        Ok(Err(error)) => match ctx.take_asked().map(checked_request) {
            Some(Ok(request)) => {
                return FinishedCall {
                    tool_call_id: call.id,
                    outcome: ToolOutcome::Error(error.0),
                    updates: Map::new(),
                    unsettled: false,
                    asked: Some(crate::session::Asked {
                        request,
                        tool: call.name,
                        idempotency_key: ctx.idempotency_key().to_string(),
                    }),
                }
            }
            Some(Err(reason)) => {
                // No question is raised: whatever the handler holds for its answer goes.
                question_closed(
                    handler.as_ref(),
                    ctx.idempotency_key(),
                    &step.session,
                    &call.name,
                );
                ToolErrorCode::InvalidOutput
                    .with(format_args!(
                        "{} asked for input with a schema that does not compile: {reason}",
                        call.name
                    ))
                    .into()
            }
            None => ToolOutcome::Error(error.0),
        },
        Err(panic) => {
            let reason = panic_text(panic.as_ref());
            tracing::error!(session = %step.session, tool = %crate::types::Untrusted(&call.name), reason = %crate::types::Untrusted(&reason), "tool.panicked");
            ToolErrorCode::ToolPanicked.with(reason).into()
        }
    };
    FinishedCall {
        tool_call_id: call.id,
        outcome,
        updates: ctx.take_updates(),
        unsettled: false,
        asked: None,
    }
}

/// Tells `handler` that the question of its call `key` is closed
/// ([`ToolHandler::question_closed`]); a panic there is logged, never the session's end.
pub(crate) fn question_closed(
    handler: &dyn ToolHandler,
    key: &str,
    session: &SessionId,
    tool: &str,
) {
    let told = std::panic::catch_unwind(AssertUnwindSafe(|| handler.question_closed(key)));
    if let Err(panic) = told {
        let reason = panic_text(panic.as_ref());
        tracing::error!(session = %session, tool = %crate::types::Untrusted(tool), reason = %crate::types::Untrusted(&reason), "tool.question_closed_panicked");
    }
}

/// A tool's question, if its answer's schema compiles (an answer is checked against it).
fn checked_request(request: InputRequest) -> Result<InputRequest, String> {
    match &request.schema {
        Some(schema) => crate::definition::Schema::compile(schema).map(|_| request),
        None => Ok(request),
    }
}

/// What the tool's check says of the effect of a call a crash cut; `None` (no check, it
/// cannot tell, or it panicked) leaves it to a person.
async fn check_cut_call(
    step: &StepContext,
    call: &ToolCall,
    check: Option<CheckFn>,
    key: &str,
) -> Option<Reconciled> {
    let check = check?;
    // Called inside the catch, as a handler is.
    let running =
        AssertUnwindSafe(async { check.0.check(call.input.clone(), key.to_string()).await });
    match running.catch_unwind().await {
        Ok(settled) => {
            tracing::info!(session = %step.session, tool = %crate::types::Untrusted(&call.name), call = %crate::types::Untrusted(&call.id), settled = settled.is_some(), "tool.reconcile_checked");
            settled
        }
        Err(panic) => {
            let reason = panic_text(panic.as_ref());
            tracing::error!(session = %step.session, tool = %crate::types::Untrusted(&call.name), reason = %crate::types::Untrusted(&reason), "tool.reconcile_check_panicked");
            None
        }
    }
}

/// `__finish__` succeeds with its input when it satisfies the agent's output schema.
fn finish_outcome(agent: &AgentDefinition, input: &Value) -> ToolOutcome {
    let Some(schema) = agent.output() else {
        return ToolErrorCode::UnknownTool
            .with("the agent has no output schema")
            .into();
    };
    let errors = schema.errors(input);
    if errors.is_empty() {
        ToolOutcome::Result(input.clone())
    } else {
        ToolErrorCode::InvalidOutput
            .with(format_args!(
                "the value does not match the output schema: {}",
                errors.join("; ")
            ))
            .into()
    }
}
