//! Checking a step's expectations against what its op returned and the session as it is now.
//! Each mismatch is a sentence `expected X, got Y`.

use serde_json::Value;

use super::build::definition_error_code;
use super::format::{ToolResultSpec, UsageSpec};
use super::step::Step;
use super::tree;
use super::world::World;
use crate::error::Error;
use crate::runtime::Runtime;
use crate::session::submit::SubmitOutcome;
use crate::session::{RunOutcome, RunRecord};
use crate::types::ids::{RunId, SessionId};
use crate::types::message::{Message, ToolOutcome};
use crate::types::usage::{RunUsage, UsageEntry};

/// What an op returned.
#[derive(Debug)]
pub(crate) enum Observed {
    /// A run ended or suspended (`execute`, `resume`: for a resume held by the barrier, the
    /// run still suspended), or the runtime refused the op.
    Run(Result<RunOutcome, Error>),
    /// The op only succeeds or fails (`define`, `interrupt`, `abort`, `advance_clock`,
    /// `evict`, `restart`, `check`).
    Done(Result<(), Error>),
    /// How the runtime answered a `submit` (an `Err` only for a store failure or a runtime
    /// that is gone).
    Submit(Result<SubmitOutcome, Error>),
    /// A session's checkpoints (`checkpoints`).
    Checkpoints(Result<Vec<crate::types::Checkpoint>, Error>),
    /// The session at a checkpoint (`state_at`), or why not.
    Past(Result<crate::types::StateAt, Error>),
}

impl Observed {
    fn error(&self) -> Option<&Error> {
        match self {
            Observed::Run(Err(error))
            | Observed::Done(Err(error))
            | Observed::Submit(Err(error))
            | Observed::Checkpoints(Err(error))
            | Observed::Past(Err(error)) => Some(error),
            Observed::Run(Ok(_))
            | Observed::Done(Ok(()))
            | Observed::Submit(Ok(_))
            | Observed::Checkpoints(Ok(_))
            | Observed::Past(Ok(_)) => None,
        }
    }
}

/// Every expectation of `step` that does not hold, as `expected X, got Y`, in the order of
/// the spec's table.
pub(crate) async fn check(world: &World, step: &Step, observed: &Observed) -> Vec<String> {
    let expect = &step.expect;
    let mut out = Mismatches::default();
    // `parse.rs` refuses expectations about a session on a step that names none.
    let runtime = match step.op.session() {
        Some(session) => world.runtime_for(session).await.ok(),
        None => None,
    };
    let view = step.op.session().map(|session| View {
        runtime,
        others: runtime
            .map(|runtime| world.others(runtime))
            .unwrap_or_default(),
        session,
        observed,
        now: world.now(),
    });
    let view = view.as_ref();
    if let (Some(expected), Some(view)) = (expect.status, view) {
        let got = view.status().await;
        if got != expected.as_str() {
            out.push("status", expected.as_str(), got);
        }
    }
    if let (Some(expected), Some(view)) = (&expect.pending, view) {
        let mut expected: Vec<&str> = expected.iter().map(String::as_str).collect();
        expected.sort_unstable();
        expected.dedup();
        match view.pending().await {
            Ok(got) if got == expected => {}
            Ok(got) => {
                let got: Vec<&str> = got.iter().map(String::as_str).collect();
                out.push("pending", show_list(&expected), show_list(&got));
            }
            Err(error) => out.push("pending", show_list(&expected), describe(&error)),
        }
    }
    if let (Some(expected), Some(view)) = (&expect.text, view) {
        match view.last_run().await {
            Ok((text, _)) if text == *expected => {}
            Ok((text, _)) => out.push("text", show_text(expected), show_text(&text)),
            Err(error) => out.push("text", show_text(expected), describe(&error)),
        }
    }
    if let (Some(expected), Some(view)) = (&expect.output, view) {
        match view.last_run().await {
            Ok((_, output)) if output.as_ref().unwrap_or(&Value::Null) == expected => {}
            Ok((_, output)) => out.push("output", expected, show_value(&output)),
            Err(error) => out.push("output", expected, describe(&error)),
        }
    }
    match (&expect.error, observed.error()) {
        (Some(expected), _) => {
            let got = error_codes(world, step.op.session(), observed).await;
            if !got.iter().any(|code| code == expected) {
                let got = got.first().map_or("no error", String::as_str);
                out.push("error", expected, got);
            }
        }
        (None, Some(error)) => out
            .0
            .push(format!("expected success, got {}", describe(error))),
        (None, None) => {}
    }
    if let Some(expected) = expect.submit {
        match observed {
            Observed::Submit(Ok(outcome)) if outcome.code() == expected.as_str() => {}
            Observed::Submit(Ok(outcome)) => {
                out.push("submit", expected.as_str(), show_submit(outcome));
            }
            Observed::Submit(Err(error)) => out.push("submit", expected.as_str(), describe(error)),
            // `parse.rs` allows a submit outcome only on a submit step.
            Observed::Run(_) | Observed::Done(_) | Observed::Checkpoints(_) | Observed::Past(_) => {
                out.push("submit", expected.as_str(), "no submit");
            }
        }
    }
    if let Some(expected) = expect.checkpoints {
        match observed {
            Observed::Checkpoints(Ok(list)) if list.len() == expected => {}
            Observed::Checkpoints(Ok(list)) => out.push("checkpoints", expected, list.len()),
            _ => out.push("checkpoints", expected, "no list"),
        }
    }
    if let Some(expected) = &expect.state {
        check_state(&mut out, expected, observed);
    }
    if let (Some(expected), Some(view)) = (&expect.tool_results, view) {
        for (id, wanted) in expected {
            let key = format!("tool_results.{id}");
            match view.tool_outcome(id).await {
                Ok(Some(outcome)) if matches(wanted, &outcome) => {}
                Ok(Some(outcome)) => out.push(&key, show_wanted(wanted), show_outcome(&outcome)),
                Ok(None) => out.push(&key, show_wanted(wanted), "no result recorded"),
                Err(error) => out.push(&key, show_wanted(wanted), describe(&error)),
            }
        }
    }
    for (tool, &expected) in expect.invocations.iter().flatten() {
        let got = world.invocations.count(tool);
        if got != expected {
            out.push(&format!("invocations.{tool}"), expected, got);
        }
    }
    if let (Some(expected), Some(view)) = (expect.runs, view) {
        match view.runs().await {
            Ok(runs) if runs.len() == expected => {}
            Ok(runs) => out.push("runs", expected, runs.len()),
            Err(error) => out.push("runs", expected, describe(&error)),
        }
    }
    if let (Some(expected), Some(view)) = (&expect.events, view) {
        let expected: Vec<&str> = expected.iter().map(|event| event.as_str()).collect();
        match view.event_names().await {
            Ok(got) if is_subsequence(&expected, &got) => {}
            Ok(got) => out.push("events in order", show_list(&expected), show_list(&got)),
            Err(error) => out.push("events in order", show_list(&expected), describe(&error)),
        }
    }
    if let (Some(expected), Some(view)) = (&expect.companions, view) {
        match view.companions().await {
            Ok(got) => {
                for (name, status) in expected {
                    let found = got.iter().find(|companion| &companion.name == name);
                    let got =
                        found.map_or("no such companion", |companion| companion.status.as_str());
                    if got != status {
                        out.push(&format!("companions.{name}"), status, got);
                    }
                }
            }
            Err(error) => {
                let names: Vec<&str> = expected.keys().map(String::as_str).collect();
                out.push("companions", show_list(&names), describe(&error));
            }
        }
    }
    if let (Some(expected), Some(view)) = (&expect.usage, view) {
        match view.runs().await {
            Ok(runs) => {
                let usage = runs.last().map(|run| run.usage.clone()).unwrap_or_default();
                check_usage(expected, &usage, &mut out);
            }
            Err(error) => out.push("usage", "a run", describe(&error)),
        }
    }
    if let Some(view) = view {
        let prompt = world.prompts.last_prompt(view.session);
        let quote = |text: &str| Value::String(text.to_string()).to_string();
        let shown = || prompt.as_deref().map_or("no model call".into(), quote);
        if let Some(expected) = &expect.prompt_contains {
            let text = prompt.as_deref().unwrap_or_default();
            let mut from = 0;
            for part in expected {
                match text[from..].find(part.as_str()) {
                    Some(at) => from += at + part.len(),
                    None => {
                        out.push("prompt to contain, in order,", quote(part), shown());
                        break;
                    }
                }
            }
        }
        for part in expect.prompt_excludes.iter().flatten() {
            if prompt
                .as_deref()
                .is_some_and(|text| text.contains(part.as_str()))
            {
                out.push("prompt without", quote(part), shown());
            }
        }
    }
    if let (Some(expected), Some(view)) = (&expect.hooks, view) {
        let expected: Vec<&str> = expected.iter().map(|hook| hook.as_str()).collect();
        let key = "hooks of the last run in order";
        match view.last_run_id().await {
            Ok(run) => {
                let got = run.map(|run| world.hooks.names(run)).unwrap_or_default();
                if !is_subsequence(&expected, &got) {
                    out.push(key, show_list(&expected), show_list(&got));
                }
            }
            Err(error) => out.push(key, show_list(&expected), describe(&error)),
        }
    }
    out.0
}

/// Each key of `expected` against the run's usage.
fn check_usage(expected: &UsageSpec, got: &RunUsage, out: &mut Mismatches) {
    let pairs = [
        (
            "input_tokens",
            expected.input_tokens,
            got.tokens.input_tokens,
        ),
        (
            "output_tokens",
            expected.output_tokens,
            got.tokens.output_tokens,
        ),
        (
            "cached_input_tokens",
            expected.cached_input_tokens,
            got.tokens.cached_input_tokens.unwrap_or(0),
        ),
        (
            "model_calls",
            expected.model_calls.map(u64::from),
            got.model_calls.into(),
        ),
        (
            "tool_calls",
            expected.tool_calls.map(u64::from),
            got.tool_calls.into(),
        ),
        (
            "tool_errors",
            expected.tool_errors.map(u64::from),
            got.tool_errors.into(),
        ),
    ];
    for (key, want, have) in pairs {
        if let Some(want) = want {
            if want != have {
                out.push(&format!("usage.{key}"), want, have);
            }
        }
    }
    if let Some(expected) = &expected.failed_tools {
        let mut expected: Vec<&str> = expected.iter().map(String::as_str).collect();
        expected.sort_unstable();
        let mut failed: Vec<&str> = got
            .entries
            .iter()
            .filter_map(|entry| match entry {
                UsageEntry::Tool {
                    tool_call_id,
                    success: false,
                    ..
                } => Some(tool_call_id.as_str()),
                _ => None,
            })
            .collect();
        failed.sort_unstable();
        if failed != expected {
            out.push(
                "usage.failed_tools",
                show_list(&expected),
                show_list(&failed),
            );
        }
    }
}

/// The mismatches of one step.
#[derive(Default)]
struct Mismatches(Vec<String>);

impl Mismatches {
    fn push(&mut self, key: &str, expected: impl std::fmt::Display, got: impl std::fmt::Display) {
        self.0.push(format!("expected {key} {expected}, got {got}"));
    }
}

/// A `state_at` step's `state`: the session as it was at the checkpoint.
fn check_state(out: &mut Mismatches, expected: &super::format::StateSpec, observed: &Observed) {
    let past = match observed {
        Observed::Past(Ok(crate::types::StateAt::Found(past))) => past,
        Observed::Past(Ok(crate::types::StateAt::Compacted { oldest_kept })) => {
            return out.push(
                "state",
                "a checkpoint",
                format!("compacted (the oldest is {oldest_kept})"),
            )
        }
        _ => return out.push("state", "a checkpoint", "none"),
    };
    if let Some(status) = expected.status {
        if status != past.record.status {
            out.push("state.status", status.as_str(), past.record.status.as_str());
        }
    }
    if let Some(count) = expected.messages {
        if count != past.messages.len() {
            out.push("state.messages", count, past.messages.len());
        }
    }
    if let Some(calls) = &expected.open_calls {
        let mut want: Vec<&str> = calls.iter().map(String::as_str).collect();
        let mut got: Vec<&str> = past
            .checkpoint
            .open_calls
            .iter()
            .map(|call| call.id.as_str())
            .collect();
        want.sort_unstable();
        got.sort_unstable();
        if want != got {
            out.push("state.open_calls", show_list(&want), show_list(&got));
        }
    }
}

/// The codes the step's error may be expected as: the op's own error, or else the error the
/// session's last run ended with. A refused definition answers both `invalid_definition` and
/// the rule it broke.
async fn error_codes(
    world: &World,
    session: Option<&SessionId>,
    observed: &Observed,
) -> Vec<String> {
    let codes = |error: &Error| match error {
        Error::InvalidDefinition(rule) => {
            vec![
                error.code().to_string(),
                definition_error_code(rule).to_string(),
            ]
        }
        _ => vec![error.code().to_string()],
    };
    match observed {
        Observed::Run(Err(error))
        | Observed::Done(Err(error))
        | Observed::Submit(Err(error))
        | Observed::Checkpoints(Err(error))
        | Observed::Past(Err(error)) => codes(error),
        Observed::Past(Ok(crate::types::StateAt::Compacted { .. })) => {
            vec!["checkpoint_compacted".to_string()]
        }
        Observed::Past(Ok(crate::types::StateAt::Unknown)) => {
            vec!["unknown_checkpoint".to_string()]
        }
        Observed::Checkpoints(Ok(_)) | Observed::Past(Ok(_)) => Vec::new(),
        Observed::Run(Ok(outcome)) => outcome
            .error
            .iter()
            .map(|error| error.code.as_str().to_string())
            .collect(),
        // A submit's outcome is checked by `submit`; its error, as for any op that only
        // succeeds, is the one the session's last run ended with (an automatic resume's).
        Observed::Done(Ok(())) | Observed::Submit(Ok(_)) => match session {
            None => Vec::new(),
            Some(session) => match runs_of(world, session).await {
                Ok(runs) => runs
                    .last()
                    .and_then(|run| run.error.as_ref())
                    .map(|error| vec![error.code.as_str().to_string()])
                    .unwrap_or_default(),
                Err(error) => codes(&error),
            },
        },
    }
}

/// The session as the expectations see it: the op's run outcome when it has one, else the
/// store.
struct View<'a> {
    runtime: Option<&'a Runtime>,
    /// The other runtimes: the trees of remote children there are part of the session's
    /// tree.
    others: Vec<&'a Runtime>,
    session: &'a SessionId,
    observed: &'a Observed,
    /// The manual clock's time: a call past its deadline no longer waits.
    now: u64,
}

impl View<'_> {
    fn runtime(&self) -> Result<&Runtime, Error> {
        self.runtime.ok_or(Error::ShutDown)
    }

    async fn status(&self) -> String {
        match self.observed {
            Observed::Run(Ok(outcome)) => outcome.status.as_str().into(),
            Observed::Run(Err(error)) => describe(error),
            Observed::Done(_)
            | Observed::Submit(_)
            | Observed::Checkpoints(_)
            | Observed::Past(_) => {
                let status = match self.runtime() {
                    Ok(runtime) => runtime.status(self.session).await.map_err(Error::from),
                    Err(error) => Err(error),
                };
                match status {
                    Ok(status) => status.as_str().into(),
                    Err(error) => describe(&error),
                }
            }
        }
    }

    /// The text and output of the op's run, or else of the session's last run.
    async fn last_run(&self) -> Result<(Option<String>, Option<Value>), Error> {
        if let Observed::Run(Ok(outcome)) = self.observed {
            return Ok((outcome.text.clone(), outcome.output.clone()));
        }
        let runs = self.runs().await?;
        Ok(runs
            .last()
            .map(|run| (run.text.clone(), run.output.clone()))
            .unwrap_or_default())
    }

    /// The ids of the tree's calls that still await an answer, sorted, each once (a set: two
    /// sessions may wait on calls with one id).
    async fn pending(&self) -> Result<Vec<String>, Error> {
        let runtime = self.runtime()?;
        let mut calls = tree::waiting_calls(runtime, self.session, self.now).await?;
        for remote in &self.others {
            for child in tree::remote_children(runtime, remote, self.session).await? {
                calls.extend(tree::waiting_calls(remote, &child, self.now).await?);
            }
        }
        calls.sort();
        calls.dedup();
        Ok(calls)
    }

    async fn companions(&self) -> Result<Vec<crate::session::Companion>, Error> {
        Ok(self.runtime()?.companions(self.session).await?)
    }

    async fn runs(&self) -> Result<Vec<RunRecord>, Error> {
        Ok(self.runtime()?.runs(self.session).await?)
    }

    async fn last_run_id(&self) -> Result<Option<RunId>, Error> {
        Ok(self.runs().await?.last().map(|run| run.run_id))
    }

    async fn event_names(&self) -> Result<Vec<&'static str>, Error> {
        let chunks = self.runtime()?.chunks(self.session, 0).await?;
        Ok(chunks.iter().map(|chunk| chunk.kind.type_name()).collect())
    }

    /// The recorded outcome of tool call `id`, in the session or any session of its tree.
    async fn tool_outcome(&self, id: &str) -> Result<Option<ToolOutcome>, Error> {
        let runtime = self.runtime()?;
        if let Some(outcome) = outcome_in(runtime, self.session, id).await? {
            return Ok(Some(outcome));
        }
        for other in tree::sessions(runtime, self.session).await? {
            if other == *self.session {
                continue;
            }
            if let Some(outcome) = outcome_in(runtime, &other, id).await? {
                return Ok(Some(outcome));
            }
        }
        for remote in &self.others {
            for child in tree::remote_children(runtime, remote, self.session).await? {
                for member in tree::sessions(remote, &child).await? {
                    if let Some(outcome) = outcome_in(remote, &member, id).await? {
                        return Ok(Some(outcome));
                    }
                }
            }
        }
        Ok(None)
    }
}

/// The recorded outcome of tool call `id` in `session`'s messages.
async fn outcome_in(
    runtime: &Runtime,
    session: &SessionId,
    id: &str,
) -> Result<Option<ToolOutcome>, Error> {
    Ok(runtime
        .messages(session)
        .await?
        .into_iter()
        .find_map(|message| match message {
            Message::Tool {
                tool_call_id,
                outcome,
                ..
            } if tool_call_id == id => Some(outcome),
            _ => None,
        }))
}

/// The run records of `session`, if the world has a runtime.
async fn runs_of(world: &World, session: &SessionId) -> Result<Vec<RunRecord>, Error> {
    Ok(world.runtime_for(session).await?.runs(session).await?)
}

fn matches(wanted: &ToolResultSpec, outcome: &ToolOutcome) -> bool {
    match (wanted, outcome) {
        (
            ToolResultSpec {
                result: Some(expected),
                ..
            },
            ToolOutcome::Result(value),
        ) => expected == value,
        (
            ToolResultSpec {
                error: Some(part), ..
            },
            ToolOutcome::Error(text),
        ) => text.contains(part.as_str()),
        _ => false,
    }
}

/// Whether `expected` appears in `got` in order, not necessarily adjacent.
fn is_subsequence(expected: &[&str], got: &[&str]) -> bool {
    let mut got = got.iter();
    expected.iter().all(|wanted| got.any(|name| name == wanted))
}

fn describe(error: &Error) -> String {
    format!("error {} ({error})", error.code())
}

fn show_text(text: &Option<String>) -> String {
    text.as_ref().map_or_else(
        || "none".into(),
        |text| Value::String(text.clone()).to_string(),
    )
}

fn show_value(value: &Option<Value>) -> String {
    value
        .as_ref()
        .map_or_else(|| "none".into(), Value::to_string)
}

fn show_wanted(wanted: &ToolResultSpec) -> String {
    match (&wanted.result, &wanted.error) {
        (Some(value), _) => format!("result {value}"),
        (None, Some(part)) => format!("an error containing {}", Value::String(part.clone())),
        (None, None) => "nothing".into(),
    }
}

fn show_outcome(outcome: &ToolOutcome) -> String {
    match outcome {
        ToolOutcome::Result(value) => format!("result {value}"),
        ToolOutcome::Error(text) => format!("error {}", Value::String(text.clone())),
    }
}

/// A submit outcome with what the runtime said about it.
fn show_submit(outcome: &SubmitOutcome) -> String {
    match outcome {
        SubmitOutcome::Accepted
        | SubmitOutcome::AlreadyCompleted
        | SubmitOutcome::UnknownToolCall => outcome.code().into(),
        SubmitOutcome::InvalidRequest { reason } => format!("{} ({reason})", outcome.code()),
        SubmitOutcome::InvalidResult { reason, errors } if errors.is_empty() => {
            format!("{} ({reason})", outcome.code())
        }
        SubmitOutcome::InvalidResult { reason, errors } => {
            format!("{} ({reason}: {})", outcome.code(), errors.join("; "))
        }
        SubmitOutcome::PayloadTooLarge { size, limit } => {
            format!("{} ({size} bytes, limit {limit})", outcome.code())
        }
        SubmitOutcome::StaleApproval { reason } => format!("{} ({reason})", outcome.code()),
    }
}

fn show_list(names: &[&str]) -> String {
    format!("[{}]", names.join(", "))
}

#[cfg(test)]
mod tests {
    use super::is_subsequence;

    #[test]
    fn a_subsequence_keeps_order_but_not_adjacency() {
        let got = ["run_start", "text", "tool_start", "tool_end", "run_end"];
        assert!(is_subsequence(&["run_start", "tool_end", "run_end"], &got));
        assert!(is_subsequence(&[], &got));
        assert!(!is_subsequence(&["tool_end", "tool_start"], &got));
        assert!(!is_subsequence(&["run_start", "run_start"], &got));
    }
}
