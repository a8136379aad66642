//! The simulated agents' server tools, which count their invocations for the end check.
//!
//! They count only the calls of this run's sessions: with `--store DIR` the store may hold
//! sessions an earlier process left behind, and this runtime runs some of them (their expired
//! deadlines fire at boot; with `--auto-resume` they then resume and run tools), but that is
//! not this run's work.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dormant::{Approval, SessionId, ToolDefinition, ToolError};
use serde_json::Value;

use crate::plan::{deploy_result, lookup_result, DEPLOY, LOOKUP};

/// Invocations of one tool by this run's sessions.
#[derive(Debug)]
pub(crate) struct Invocations {
    own: Arc<HashSet<SessionId>>,
    count: AtomicU64,
}

impl Invocations {
    /// Counts the invocations of the sessions in `own`.
    pub(crate) fn new(own: Arc<HashSet<SessionId>>) -> Arc<Self> {
        Arc::new(Self {
            own,
            count: AtomicU64::new(0),
        })
    }

    fn record(&self, session: &SessionId) {
        if self.own.contains(session) {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many there were.
    pub(crate) fn get(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// A server tool that does trivial work and counts its invocations.
pub(crate) fn lookup_tool(calls: Arc<Invocations>) -> ToolDefinition {
    ToolDefinition::server(LOOKUP, move |input: Value, ctx| {
        let calls = Arc::clone(&calls);
        async move {
            calls.record(ctx.session_id());
            Ok::<_, ToolError>(lookup_result(&input["step"]))
        }
    })
    .description("Looks an item up")
    .safe_to_retry(true)
}

/// A server tool that needs a person's approval before each call; counts its invocations.
pub(crate) fn deploy_tool(calls: Arc<Invocations>) -> ToolDefinition {
    ToolDefinition::server(DEPLOY, move |input: Value, ctx| {
        let calls = Arc::clone(&calls);
        async move {
            calls.record(ctx.session_id());
            Ok::<_, ToolError>(deploy_result(&input))
        }
    })
    .description("Deploys, once a person approves")
    .require_approval(Approval::Always)
}
