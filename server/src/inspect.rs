//! `dormant-server inspect --store DIR`: what a stopped store holds, for a person: every
//! session with its status, the calls it waits on (kind, approval id, deadline), its runs
//! and its last messages. It only reads: no deadline fires, no run is recovered.
//!
//! A damaged store (one that recovers less than it acknowledged) is refused, as the server
//! refuses it; `--salvage` opens what is left read-only, reports it under the damage, and
//! still exits non-zero.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use dormant::types::ToolOutcome;
use dormant::{Message, PendingKind, Runtime, SledStore};

/// Why the store could not be inspected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InspectError {
    /// `--store` names a database, not a directory: inspect reads sled stores. (The URL is
    /// not repeated: it may hold a password.)
    #[error("inspect reads a sled store's directory, not a database URL: a PostgreSQL store is shared by running nodes; ask one (GET /status)")]
    NotADirectory,
    /// No store is there: nothing was created.
    #[error("no dormant store in {}: inspect reads the directory a server's --store names, and creates nothing", .0.display())]
    NoStore(std::path::PathBuf),
    /// The store is damaged: it recovers less than it acknowledged. Nothing was reported.
    #[error("cannot open the store: {0} (`inspect --salvage` reports what is left)")]
    Damaged(#[source] dormant::store::Error),
    /// The store was opened to salvage it and reported; what it lost is this.
    #[error("the store is damaged: {0}; the report above is what is left of it")]
    Salvaged(dormant::store::Damage),
    /// The store could not be opened (another process may hold it).
    #[error("cannot open the store: {0}")]
    Open(#[source] dormant::store::Error),
    /// The runtime over the store could not be built.
    #[error(transparent)]
    Build(#[from] dormant::BuildError),
    /// A read failed.
    #[error(transparent)]
    Runtime(#[from] dormant::Error),
    /// The output could not be written.
    #[error("cannot write the report: {0}")]
    Write(#[from] std::io::Error),
}

/// A read failed: [`InspectError::Runtime`], as the runtime's error of the same name.
impl From<dormant::ReadError> for InspectError {
    fn from(error: dormant::ReadError) -> Self {
        InspectError::Runtime(error.into())
    }
}

impl From<dormant::store::Error> for InspectError {
    fn from(error: dormant::store::Error) -> Self {
        match error {
            error @ dormant::store::Error::Damaged { .. } => InspectError::Damaged(error),
            error => InspectError::Open(error),
        }
    }
}

/// How to inspect.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// How many of each session's last messages to show.
    pub messages: usize,
    /// Open a damaged store read-only and report what is left (then fail with
    /// [`InspectError::Salvaged`]) instead of refusing it.
    pub salvage: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            messages: 5,
            salvage: false,
        }
    }
}

/// Writes the report of the store in `dir` to `out`.
///
/// # Errors
/// See [`InspectError`]: a damaged store is [`InspectError::Damaged`], or, salvaged,
/// [`InspectError::Salvaged`] after its report.
pub async fn inspect(
    dir: &Path,
    out: &mut impl Write,
    options: Options,
) -> Result<(), InspectError> {
    if dir.to_string_lossy().contains("://") {
        return Err(InspectError::NotADirectory);
    }
    // Opening a sled store creates it: a mistyped path would report an empty store, and
    // leave one behind.
    if !dir.join("db").is_file() {
        return Err(InspectError::NoStore(dir.to_path_buf()));
    }
    let mut builder = SledStore::builder(dir);
    if options.salvage {
        builder = builder.salvage();
    }
    let store = builder.open()?;
    let damage = store.damage();
    if let Some(damage) = &damage {
        writeln!(out, "DAMAGED: {damage}\nWhat is left, read-only:\n")?;
    }
    // No agents, and no background deadlines: nothing the runtime does on its own writes.
    let runtime = Runtime::builder()
        .store(Arc::new(store))
        .background_deadlines(false)
        .build()?;
    let result = report(&runtime, out, options.messages).await;
    runtime.shutdown().await?;
    result?;
    match damage {
        Some(damage) => Err(InspectError::Salvaged(damage)),
        None => Ok(()),
    }
}

async fn report(runtime: &Runtime, out: &mut impl Write, last: usize) -> Result<(), InspectError> {
    let now = runtime.now_ms();
    let ids = runtime.session_ids().await?;
    writeln!(out, "{} session(s)", ids.len())?;
    for id in ids {
        let record = runtime.session(&id).await?;
        let lineage = match &record.parent {
            Some(parent) => format!(", sub-agent of {parent}"),
            None => String::new(),
        };
        writeln!(
            out,
            "\nsession {id}: agent {}, {}{}{lineage}, {} turn(s), {} message(s)",
            record.agent,
            record.status,
            if record.aborted { " (aborted)" } else { "" },
            record.run_count,
            record.message_count,
        )?;
        for call in runtime.pending(&id).await? {
            let kind = match call.kind {
                PendingKind::Client => "client tool".to_string(),
                PendingKind::Approval => format!("approval {}", call.approval_id()),
                PendingKind::Reconcile => format!(
                    "reconcile (idempotency key {})",
                    call.idempotency_key.as_deref().unwrap_or("unknown")
                ),
                PendingKind::Input => format!(
                    "input: {:?}",
                    call.request
                        .as_ref()
                        .map_or("", |request| request.message.as_str())
                ),
            };
            let when = if call.answer.is_some() {
                "answered, waiting for a resume".to_string()
            } else if call.deadline_at_ms <= now {
                format!("expired {} s ago", (now - call.deadline_at_ms) / 1000)
            } else {
                format!("deadline in {} s", (call.deadline_at_ms - now) / 1000)
            };
            writeln!(
                out,
                "  pending {} {} ({kind}), {when}, input {}",
                call.tool_call_id, call.tool_name, call.input
            )?;
        }
        for run in runtime.runs(&id).await? {
            let error = run
                .error
                .map(|error| {
                    let code = error.code.as_str();
                    // Most messages open with their code already ("aborted: …").
                    let message = error
                        .message
                        .strip_prefix(code)
                        .filter(|rest| rest.starts_with(':'))
                        .map_or_else(|| format!(": {}", error.message), str::to_string);
                    format!(", {code}{message}")
                })
                .unwrap_or_default();
            writeln!(
                out,
                "  run {} turn {}: {}, {} step(s){error}",
                run.run_id, run.turn, run.status, run.steps
            )?;
        }
        let messages = runtime.messages(&id).await?;
        for message in messages.iter().skip(messages.len().saturating_sub(last)) {
            writeln!(out, "  {}", line(message))?;
        }
    }
    Ok(())
}

fn line(message: &Message) -> String {
    let text = match message {
        Message::User { text } => format!("user: {text}"),
        Message::Assistant { text, tool_calls } => {
            let calls: Vec<String> = tool_calls
                .iter()
                .map(|call| format!("{}({})", call.name, call.input))
                .collect();
            match (text, calls.is_empty()) {
                (Some(text), true) => format!("assistant: {text}"),
                (Some(text), false) => format!("assistant: {text} calls {}", calls.join(", ")),
                (None, _) => format!("assistant calls {}", calls.join(", ")),
            }
        }
        Message::Tool {
            tool_call_id,
            tool_name,
            outcome,
        } => match outcome {
            ToolOutcome::Result(value) => format!("tool {tool_name} ({tool_call_id}): {value}"),
            ToolOutcome::Error(error) => {
                format!("tool {tool_name} ({tool_call_id}) error: {error}")
            }
        },
    };
    // One line each, whatever the content: long ones are cut.
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match flat.char_indices().nth(200) {
        Some((at, _)) => format!("{}…", &flat[..at]),
        None => flat,
    }
}
