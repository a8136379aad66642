//! Configuring a [`Runtime`].

use std::sync::Arc;

use dashmap::DashMap;
use dormant_actors::{Clock, Host, HostConfig, SystemClock};

use super::build_error::BuildError;
use super::claim::StoreClaim;
use super::inner::Inner;
use super::{define_all, Runtime};
use crate::cluster::leases::{Leases, SingleNode};
use crate::definition::AgentDefinition;
use crate::engine::actor::SessionActor;
use crate::engine::deadlines::Deadlines;
use crate::engine::metrics::Metrics;
use crate::engine::scheduler::DeadlineScheduler;
use crate::engine::shared::Shared;
use crate::llm::{LlmAdapter, ScriptedLlm};
use crate::session::submit::{DEFAULT_MAX_RESULT_BYTES, DEFAULT_TOMBSTONE_RETENTION_MS};
use crate::session::Policy;
use crate::store::{SledStore, Store};
use crate::types::hooks::{Hooks, NoHooks};
use crate::types::nesting::{MAX_JSON_DEPTH_LIMIT, MAX_TREE_DEPTH};

/// Configures and builds a [`Runtime`]. Everything has a default; the store defaults to a
/// temporary sled database, deleted when the runtime shuts down or its last clone is
/// dropped.
#[must_use]
pub struct RuntimeBuilder {
    store: Option<Arc<dyn Store>>,
    leases: Option<Arc<dyn Leases>>,
    llm: Option<Arc<dyn LlmAdapter>>,
    clock: Arc<dyn Clock>,
    hooks: Arc<dyn Hooks>,
    telemetry: crate::telemetry::Tracing,
    agents: Vec<AgentDefinition>,
    host: HostConfig,
    policy: Policy,
    tombstone_retention_ms: u64,
    child_inspection_timeout: std::time::Duration,
    max_result_bytes: usize,
    background_deadlines: bool,
    remote: Option<Arc<dyn crate::remote::RemoteAgents>>,
    remote_policy: crate::remote::RemotePolicy,
    peers: Option<Arc<dyn crate::cluster::peer::Peers>>,
}

impl Default for RuntimeBuilder {
    fn default() -> Self {
        Self {
            store: None,
            leases: None,
            llm: None,
            clock: Arc::new(SystemClock),
            hooks: Arc::new(NoHooks),
            telemetry: Default::default(),
            agents: Vec::new(),
            host: HostConfig::default(),
            policy: Policy::default(),
            tombstone_retention_ms: DEFAULT_TOMBSTONE_RETENTION_MS,
            child_inspection_timeout: crate::engine::actor::DEFAULT_CHILD_INSPECTION_TIMEOUT,
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            background_deadlines: true,
            remote: None,
            remote_policy: crate::remote::RemotePolicy::default(),
            peers: None,
        }
    }
}

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("store", &self.store)
            .field("clock", &self.clock)
            .field("agents", &self.agents.len())
            .field("host", &self.host)
            .finish()
    }
}

impl RuntimeBuilder {
    /// Sets the store (default: a temporary sled database), which this process uses alone: a
    /// store several nodes share is given with [`RuntimeBuilder::shared_store`].
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// Sets a store several nodes share that keeps their leases too, such as
    /// [`PgStore`](crate::PgStore): [`RuntimeBuilder::store`] and [`RuntimeBuilder::leases`]
    /// with the one store. Its commits are fenced by its leases, so it needs both.
    pub fn shared_store<S: Store + Leases>(self, store: Arc<S>) -> Self {
        self.store(Arc::clone(&store) as Arc<dyn Store>)
            .leases(store)
    }

    /// Sets who owns which tree of sessions among the nodes that share the store (default:
    /// [`SingleNode`], this process owns them all). With a lease table shared by several
    /// nodes, a call for a tree another live node owns is routed there
    /// ([`RuntimeBuilder::peers`]).
    pub fn leases(mut self, leases: Arc<dyn Leases>) -> Self {
        self.leases = Some(leases);
        self
    }

    /// Sets the model (default: a [`ScriptedLlm`] with no scripts).
    pub fn llm(mut self, llm: Arc<dyn LlmAdapter>) -> Self {
        self.llm = Some(llm);
        self
    }

    /// Sets the clock (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sets the hooks (default: none).
    pub fn hooks(mut self, hooks: Arc<dyn Hooks>) -> Self {
        self.hooks = hooks;
        self
    }

    /// Records OpenTelemetry spans of every run with `telemetry` (feature `otel`; see
    /// [`crate::telemetry`]). Without it nothing is recorded.
    #[cfg(feature = "otel")]
    pub fn telemetry(mut self, telemetry: crate::telemetry::Telemetry) -> Self {
        self.telemetry = Some(Arc::new(telemetry));
        self
    }

    /// Registers an agent.
    pub fn agent(mut self, agent: AgentDefinition) -> Self {
        self.agents.push(agent);
        self
    }

    /// Evicts the least recently used idle sessions past this many resident actors.
    pub fn max_resident(mut self, max: usize) -> Self {
        self.host.max_resident = Some(max);
        self
    }

    /// Passivates sessions that received nothing for this long.
    pub fn idle_after_ms(mut self, ms: u64) -> Self {
        self.host.idle_after_ms = Some(ms);
        self
    }

    /// Sets the crash-loop breaker: `crashes` within `window_ms` fail a session.
    pub fn crash_limit(mut self, crashes: u32, window_ms: u64) -> Self {
        self.host.max_crashes = crashes;
        self.host.crash_window_ms = window_ms;
        self
    }

    /// Sets the timeout of client tools (and approvals) when neither the tool nor the agent
    /// sets one (default five minutes; 0 means expired at once).
    pub fn client_tool_timeout_ms(mut self, ms: u64) -> Self {
        self.policy.client_tool_timeout_ms = ms;
        self
    }

    /// Resumes a suspended session on its own as soon as every call it waits on is answered
    /// or timed out (default off: `resume` is explicit).
    pub fn auto_resume(mut self, on: bool) -> Self {
        self.policy.auto_resume = on;
        self
    }

    /// How long a completed call answers duplicate submits with `already_completed` (default
    /// 24 hours); after that they answer `unknown_tool_call`.
    pub fn tombstone_retention_ms(mut self, ms: u64) -> Self {
        self.tombstone_retention_ms = ms;
        self
    }

    /// How deep a tree of sub-agents may grow below its root (default 8, at most 16). A
    /// sub-agent call that would go deeper gets the tool error `max_depth_exceeded`, so agents
    /// that delegate to each other in a cycle end with an error the model can read, never a
    /// hang.
    pub fn max_depth(mut self, depth: u32) -> Self {
        self.policy.max_depth = depth;
        self
    }

    /// How long recovery waits for one child it inspects (default 2 s) before writing it off
    /// as interrupted (`inspection_timed_out`), so a stuck child never holds up its parent's
    /// recovery for longer than this.
    pub fn child_inspection_timeout_ms(mut self, ms: u64) -> Self {
        self.child_inspection_timeout = std::time::Duration::from_millis(ms);
        self
    }

    /// How this runtime reaches the servers its remote sub-agents live on
    /// ([`ToolDefinition::remote_sub_agent`](crate::ToolDefinition::remote_sub_agent)):
    /// `dormant_server::HttpRemoteAgents` for dormant servers over HTTP. Without one, a
    /// remote sub-agent call is the tool error `remote_subagent_failed`.
    pub fn remote_agents(mut self, transport: Arc<dyn crate::remote::RemoteAgents>) -> Self {
        self.remote = Some(transport);
        self
    }

    /// How a call of this runtime reaches the node that owns its session, on a store several
    /// nodes share ([`crate::cluster::peer`]): `dormant_server::HttpPeers` over HTTP. Without one, every
    /// call is served here, and one for a session another live node owns answers
    /// [`Error::SessionUnavailable`](crate::Error::SessionUnavailable) ([`Runtime::owner_of`]
    /// names the owner).
    pub fn peers(mut self, transport: Arc<dyn crate::cluster::peer::Peers>) -> Self {
        self.peers = Some(transport);
        self
    }

    /// How a remote that does not answer is retried (default: 5 tries, from 100 ms, doubling)
    /// before the call becomes a tool error.
    pub fn remote_policy(mut self, policy: crate::remote::RemotePolicy) -> Self {
        self.remote_policy = policy;
        self.policy.remote_patience_ms = crate::session::duration_ms(policy.patience);
        self.policy.remote_retry_max_ms = crate::session::duration_ms(policy.max_retry_wait);
        self
    }

    /// How deeply a JSON value from outside may nest, counting arrays and objects (default
    /// 128, like serde_json's parser; at most 512): a submitted result deeper than this is
    /// refused with `invalid_request`, a model reply with a tool-call input deeper than this
    /// fails its run (`model_error`), and a server tool result deeper than this becomes the
    /// tool error `invalid_output`. Nothing that nests deeper is stored, so every stored value
    /// can be read back.
    pub fn max_json_depth(mut self, depth: usize) -> Self {
        self.policy.max_json_depth = depth;
        self
    }

    /// The largest submitted result or error accepted, in bytes (default 1 MiB).
    pub fn max_result_bytes(mut self, bytes: usize) -> Self {
        self.max_result_bytes = bytes;
        self
    }

    /// Whether the deadline scheduler wakes by itself (default on). Turn it off when a test or
    /// simulation drives a manual clock and fires deadlines with
    /// [`Runtime::sweep_deadlines`](crate::Runtime::sweep_deadlines).
    pub fn background_deadlines(mut self, on: bool) -> Self {
        self.background_deadlines = on;
        self
    }

    /// Refuses limits past what the stored form can hold (see `crate::types::nesting`).
    fn check_limits(&self) -> Result<(), BuildError> {
        let json_depth = self.policy.max_json_depth;
        if !(1..=MAX_JSON_DEPTH_LIMIT).contains(&json_depth) {
            return Err(BuildError::InvalidConfig {
                setting: "max_json_depth",
                reason: format!("{json_depth} is not within 1..={MAX_JSON_DEPTH_LIMIT}"),
            });
        }
        if self.policy.max_depth > MAX_TREE_DEPTH {
            return Err(BuildError::InvalidConfig {
                setting: "max_depth",
                reason: format!(
                    "{} is over {MAX_TREE_DEPTH}, the deepest tree of sub-agents whose forwarded stream chunks can be stored",
                    self.policy.max_depth
                ),
            });
        }
        Ok(())
    }

    /// Builds the runtime. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// A [`BuildError`]: [`BuildError::NoTokioRuntime`] outside a tokio runtime (the runtime
    /// starts actors), [`BuildError::InvalidConfig`] for a limit out of range or a shared
    /// store without its leases, [`BuildError::StoreInUse`] if another runtime of this process
    /// uses the store (one store has one runtime), [`BuildError::StoreClosed`] if a shutdown
    /// closed the store, [`BuildError::InvalidDefinition`] for an invalid agent set (a
    /// duplicate name, a sub-agent tool naming an unknown agent), or [`BuildError::Store`] if
    /// the default temporary store could not be opened.
    pub fn build(self) -> Result<Runtime, BuildError> {
        let tokio =
            tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoTokioRuntime)?;
        self.check_limits()?;
        let store = match self.store {
            Some(store) => store,
            None => Arc::new(SledStore::temporary()?),
        };
        let claim = StoreClaim::take(&store)?;
        // A store a shutdown closed cannot serve a new runtime: say so now, not at the first
        // request.
        if store.is_closed() {
            return Err(BuildError::StoreClosed);
        }
        let leases = self.leases.unwrap_or_else(|| Arc::new(SingleNode));
        // Every commit to a shared store is fenced by its lease: without the leases, none
        // would be written.
        if store.is_shared() && !leases.is_shared() {
            return Err(BuildError::InvalidConfig {
                setting: "leases",
                reason: "this store is shared by several nodes and fences every commit by the lease of its tree: give it with RuntimeBuilder::shared_store (or its leases with RuntimeBuilder::leases)".into(),
            });
        }
        let shared = Arc::new(Shared {
            store,
            leases,
            lineages: crate::cluster::lineage::Lineages::default(),
            owners: crate::cluster::leases::Owners::default(),
            llm: self.llm.unwrap_or_else(|| Arc::new(ScriptedLlm::new())),
            clock: Arc::clone(&self.clock),
            hooks: self.hooks,
            telemetry: self.telemetry,
            policy: Arc::new(self.policy),
            tombstone_retention_ms: self.tombstone_retention_ms,
            agents: DashMap::new(),
            streams: DashMap::new(),
            metrics: Metrics::default(),
            child_inspection_timeout: self.child_inspection_timeout,
            remote: self.remote,
            remote_policy: self.remote_policy,
            orphans_recorded: tokio::sync::Notify::new(),
            reports: crate::engine::actor::reports::Reports::default(),
            landing: crate::engine::landing::Landing::default(),
            peers: self.peers,
        });
        // Agents may name each other as sub-agents: the set is checked as a whole.
        if let Err(error) = define_all(&shared, self.agents) {
            let error = BuildError::from(error);
            tracing::error!(%error, "runtime.invalid_agent");
            return Err(error);
        }
        // In the order each part needs the one before: the session actors tell the scheduler
        // of new deadlines through its channel, the scheduler tells the session host of
        // timeouts.
        let (deadlines, requests) = Deadlines::channel();
        let host = Host::with_clock(
            SessionActor {
                shared: Arc::clone(&shared),
                deadlines: deadlines.clone(),
            },
            self.host,
            Arc::clone(&self.clock),
        );
        let scheduler = DeadlineScheduler {
            shared: Arc::clone(&shared),
            sessions: host.clone(),
            background: self.background_deadlines,
        };
        let mut background = vec![tokio.spawn(scheduler.run(requests)).abort_handle()];
        // Remote children let go while their server did not answer are stopped there once it
        // answers (a test driving time by hand stops them with `retry_remote_stops`).
        if self.background_deadlines && shared.remote.is_some() {
            let orphans = crate::remote::stop_orphans(Arc::clone(&shared));
            background.push(tokio.spawn(orphans).abort_handle());
        }
        // Ownership entries of the layout before one entry per owner are moved once, off
        // every caller's path; the router reads those not moved yet.
        tokio.spawn(migrate_ownership(Arc::downgrade(&shared.store)));
        Ok(Runtime {
            inner: Arc::new(Inner::new(
                host,
                deadlines,
                background,
                shared,
                self.max_result_bytes,
                tokio,
                claim,
            )),
        })
    }
}

/// Moves the ownership entries an earlier version wrote to the current layout (see
/// `schema/ownership.rs`). Holds the store only while it works: a runtime dropped at once
/// still releases it.
async fn migrate_ownership(store: std::sync::Weak<dyn crate::store::Store>) {
    let Some(store) = store.upgrade() else {
        return;
    };
    match crate::store::schema::migrate_ownership(store.as_ref()).await {
        Ok(0) => {}
        Ok(moved) => tracing::info!(moved, "schema.ownership_migrated"),
        // The runtime was shut down at once: the next one moves them.
        Err(crate::store::schema::Error::Store(crate::store::Error::Closed)) => {}
        Err(error) => tracing::warn!(%error, "schema.ownership_migration_failed"),
    }
}
