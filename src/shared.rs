//! What every session actor, router shard and the deadline scheduler share.

use std::sync::{Arc, OnceLock};

use dashmap::DashMap;
use dormant_actors::{Clock, WeakHost};
use tokio::sync::broadcast;

use crate::definition::AgentDefinition;
use crate::error::Error;
use crate::hooks::Hooks;
use crate::ids::SessionId;
use crate::llm::LlmAdapter;
use crate::metrics::Metrics;
use crate::scheduler::DeadlineScheduler;
use crate::schema;
use crate::session::Policy;
use crate::store::Store;
use crate::stream::Chunk;
use crate::submit::SubmitOutcome;

/// What every session actor (and the router and scheduler) shares.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) llm: Arc<dyn LlmAdapter>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) hooks: Arc<dyn Hooks>,
    pub(crate) policy: Arc<Policy>,
    pub(crate) tombstone_retention_ms: u64,
    pub(crate) agents: DashMap<String, Arc<AgentDefinition>>,
    /// Live followers of a session's stream; chunks are published after their commit.
    pub(crate) streams: DashMap<SessionId, broadcast::Sender<Chunk>>,
    pub(crate) metrics: Metrics,
    /// Told about newly armed deadlines so it can wake earlier (weak: the scheduler holds
    /// this `Shared`, and a cycle would keep the store open after shutdown).
    pub(crate) scheduler: OnceLock<WeakHost<DeadlineScheduler>>,
    /// How long recovery waits for one child before writing it off as interrupted.
    pub(crate) child_inspection_timeout: std::time::Duration,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("store", &self.store)
            .field("agents", &self.agents.len())
            .field("policy", &self.policy)
            .finish()
    }
}

impl Shared {
    /// Makes a session's commit durable, and counts it. The one way a session's writes reach
    /// the store (a step, a submit beside the mailbox, a recovery).
    pub(crate) async fn commit(&self, commit: &schema::Commit) -> Result<(), Error> {
        let batch = commit.encode()?;
        let size = crate::metrics::BatchSize::of(&batch);
        let started = std::time::Instant::now();
        self.store.commit(batch).await?;
        self.metrics.record_commit(started.elapsed(), &size);
        Ok(())
    }

    /// Whether a tombstone written at `completed_at` still answers duplicates at `now`.
    pub(crate) fn tombstone_alive(&self, completed_at: u64, now: u64) -> bool {
        now < completed_at.saturating_add(self.tombstone_retention_ms)
    }

    /// `already_completed` if the call completed within retention, else `unknown_tool_call`.
    pub(crate) fn settled_call_outcome(
        &self,
        root: &SessionId,
        call: &str,
    ) -> Result<SubmitOutcome, Error> {
        let now = self.clock.now_ms();
        Ok(match schema::tombstone(self.store.as_ref(), root, call)? {
            Some(at) if self.tombstone_alive(at, now) => SubmitOutcome::AlreadyCompleted,
            _ => SubmitOutcome::UnknownToolCall,
        })
    }
}
