//! What the session actors, the deadline scheduler and the runtime's calls share.

use std::sync::Arc;

use dashmap::DashMap;
use dormant_actors::Clock;
use tokio::sync::broadcast;

use crate::definition::AgentDefinition;
use crate::engine::metrics::Metrics;
use crate::error::Error;
use crate::llm::LlmAdapter;
use crate::session::Policy;
use crate::store::schema;
use crate::store::Store;
use crate::types::hooks::Hooks;
use crate::types::ids::SessionId;
use crate::types::stream::StreamEvent;

/// What the session actors, the scheduler and the runtime's calls share: the store, the
/// model, the clock, the hooks, the agents, the live streams, the metrics.
pub(crate) struct Shared {
    pub(crate) store: Arc<dyn Store>,
    /// Who owns which tree, when other nodes share the store.
    pub(crate) leases: Arc<dyn crate::cluster::leases::Leases>,
    /// The lineages of sessions read so far (a session's never changes): the root a call is
    /// routed by and its actor's lease is named after, and what an answer's root is checked
    /// against.
    pub(crate) lineages: crate::cluster::lineage::Lineages,
    /// The owners of other nodes' trees looked up lately.
    pub(crate) owners: crate::cluster::leases::Owners,
    pub(crate) llm: Arc<dyn LlmAdapter>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) hooks: Arc<dyn Hooks>,
    /// What the sessions record OpenTelemetry spans with, if anything (feature `otel`).
    pub(crate) telemetry: crate::telemetry::Tracing,
    pub(crate) policy: Arc<Policy>,
    pub(crate) tombstone_retention_ms: u64,
    pub(crate) agents: DashMap<String, Arc<AgentDefinition>>,
    /// Live followers of a session's stream: chunks are published after their commit, a
    /// model call's deltas as they arrive.
    pub(crate) streams: DashMap<SessionId, broadcast::Sender<StreamEvent>>,
    pub(crate) metrics: Metrics,
    /// How long recovery waits for one child before writing it off as interrupted.
    pub(crate) child_inspection_timeout: std::time::Duration,
    /// How remote sub-agents are reached, if any agent has one.
    pub(crate) remote: Option<Arc<dyn crate::remote::RemoteAgents>>,
    /// How a remote that does not answer is retried.
    pub(crate) remote_policy: crate::remote::RemotePolicy,
    /// Told when a remote child to stop is recorded (`remote/orphans.rs`).
    pub(crate) orphans_recorded: tokio::sync::Notify,
    /// How calls for sessions another node owns reach it, if they may.
    pub(crate) peers: Option<Arc<dyn crate::cluster::peer::Peers>>,
    /// Children's reports on their way to their parents, heard in groups.
    pub(crate) reports: crate::engine::actor::reports::Reports,
    /// The accepted answers' commits on their way, which a session's loading waits for.
    pub(crate) landing: crate::engine::landing::Landing,
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
    /// The root of `session`'s tree, remembered once read.
    pub(crate) async fn root_of(&self, session: &SessionId) -> Result<SessionId, Error> {
        Ok(self.lineages.root(self.store.as_ref(), session).await?)
    }

    /// Makes a session's commit durable, and counts it. The one way a session's writes reach
    /// the store (a step, a submit beside the mailbox, a recovery).
    pub(crate) async fn commit(&self, commit: &schema::Commit) -> Result<(), Error> {
        let batch = commit.encode()?;
        let size = crate::engine::metrics::BatchSize::of(&batch);
        let started = std::time::Instant::now();
        self.store.commit(batch).await?;
        self.metrics.record_commit(started.elapsed(), &size);
        // A remote child written off in this commit is stopped there once its server answers:
        // the task that does it waits for word of one.
        let orphaned = commit
            .index
            .iter()
            .any(|write| matches!(write, schema::IndexWrite::PutOrphan(_)));
        if orphaned {
            self.orphans_recorded.notify_one();
        }
        Ok(())
    }
}
