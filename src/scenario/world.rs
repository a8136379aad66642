//! The runtime under test for one file: a sled store in a temporary directory (behind a
//! [`FaultyStore`] that `crash_before` arms), a manual clock from 0 ms, the scripted model, and
//! the observers (hook log, invocation counts) that outlive restarts.

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use super::build::{self, Invocations, RemoteAgentsAt};
use super::error::Error;
use super::format::{AgentSpec, ConfigSpec};
use super::parse::Scenario;
use super::prompts::PromptLog;
use super::remote::{RemoteHost, Served};
use crate::clock::{Clock, ManualClock};
use crate::hooks::{HookEvent, Hooks};
use crate::ids::{RunId, SessionId};
use crate::llm::ScriptedLlm;
use crate::runtime::Runtime;
use crate::store::{CommitKind, Fault, FaultyStore, SledStore, Store};

/// Every hook that fired, with the run it belongs to.
#[derive(Debug, Default)]
pub(crate) struct HookLog(Mutex<Vec<(RunId, &'static str)>>);

impl HookLog {
    /// The names of the hooks of `run`, in the order they fired.
    pub(crate) fn names(&self, run: RunId) -> Vec<&'static str> {
        self.0
            .lock()
            .iter()
            .filter(|(id, _)| *id == run)
            .map(|(_, name)| *name)
            .collect()
    }
}

impl Hooks for HookLog {
    fn on_event(&self, event: &HookEvent) {
        let run = match event {
            HookEvent::BeforeTool { run_id, .. }
            | HookEvent::OnStateChange { run_id, .. }
            | HookEvent::OnMessage { run_id, .. }
            | HookEvent::AfterTool { run_id, .. }
            | HookEvent::AgentSuspended { run_id, .. }
            | HookEvent::AgentResumed { run_id, .. } => *run_id,
        };
        self.0.lock().push((run, event.name()));
    }
}

/// The runtime a file runs against, and what survives its restarts.
#[derive(Debug)]
pub(crate) struct World {
    file: PathBuf,
    // Declared before `dir`: the store must close before its directory is removed.
    runtime: Option<Runtime>,
    /// The fault-injecting wrapper of the runtime's store; a new one, with no fault, on each
    /// start.
    store: Option<Arc<FaultyStore>>,
    dir: tempfile::TempDir,
    clock: ManualClock,
    config: ConfigSpec,
    llm: Arc<ScriptedLlm>,
    /// The model the runtime calls: `llm`, remembering the prompts.
    pub(crate) prompts: Arc<PromptLog>,
    pub(crate) hooks: Arc<HookLog>,
    pub(crate) invocations: Arc<Invocations>,
    /// The agents registered so far (the file's, then those `define` added), to rebuild the
    /// runtime with on `restart`.
    agents: Vec<AgentSpec>,
    /// The second runtime, served over HTTP, of the agents marked `remote`.
    remote: Option<RemoteSide>,
}

/// The runtime of the remote agents and how it is served.
struct RemoteSide {
    host: Arc<dyn RemoteHost>,
    // Declared before `dir`, as above.
    runtime: Option<Runtime>,
    served: Option<Served>,
    dir: tempfile::TempDir,
    port: u16,
    endpoint: String,
}

impl std::fmt::Debug for RemoteSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSide")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl World {
    /// Opens a fresh store and a runtime with the file's agents, and with a second one served
    /// by `host` for the agents marked `remote`.
    pub(crate) async fn open(
        scenario: &Scenario,
        host: Option<Arc<dyn RemoteHost>>,
    ) -> Result<Self, Error> {
        let file = scenario.file().to_path_buf();
        let dir = tempfile::Builder::new()
            .prefix("dormant-scenario-")
            .tempdir()
            .map_err(|source| Error::TempDir {
                file: file.clone(),
                source,
            })?;
        let llm = Arc::new(ScriptedLlm::new());
        let mut world = Self {
            file,
            runtime: None,
            store: None,
            dir,
            clock: ManualClock::new(0),
            config: scenario.config.clone(),
            llm: Arc::clone(&llm),
            prompts: Arc::new(PromptLog::new(llm)),
            hooks: Arc::default(),
            invocations: Arc::default(),
            agents: scenario.agents.clone(),
            remote: None,
        };
        if world.agents.iter().any(|agent| agent.remote) {
            let Some(host) = host else {
                return Err(Error::Remote {
                    file: world.file,
                    reason: "this file needs a remote host to serve them over HTTP: run it with dormant::scenario::run_with (dormant-server's tests do)".into(),
                });
            };
            let dir = tempfile::Builder::new()
                .prefix("dormant-scenario-remote-")
                .tempdir()
                .map_err(|source| Error::TempDir {
                    file: world.file.clone(),
                    source,
                })?;
            world.remote = Some(RemoteSide {
                host,
                runtime: None,
                served: None,
                dir,
                port: 0,
                endpoint: String::new(),
            });
        }
        for (index, agent) in world.agents.iter().enumerate() {
            build::agent(agent, &world.invocations).map_err(|source| Error::Agent {
                file: world.file.clone(),
                path: format!("agents[{index}]"),
                source: Box::new(source.into()),
            })?;
            world
                .llm
                .set_agent_script(agent.name.as_str(), build::script(&agent.script));
        }
        if let Err(reason) = world.start_remote().await {
            return Err(Error::Remote {
                file: world.file,
                reason,
            });
        }
        match world.start() {
            Ok((runtime, store)) => {
                world.runtime = Some(runtime);
                world.store = Some(store);
            }
            Err(source @ crate::Error::InvalidDefinition(_)) => {
                return Err(Error::Agent {
                    file: world.file,
                    path: "agents".into(),
                    source: Box::new(source),
                })
            }
            Err(source) => {
                return Err(Error::Runtime {
                    file: world.file,
                    source: Box::new(source),
                })
            }
        }
        Ok(world)
    }

    /// The running runtime ([`crate::Error::ShutDown`] after a failed restart).
    pub(crate) fn runtime(&self) -> Result<&Runtime, crate::Error> {
        self.runtime.as_ref().ok_or(crate::Error::ShutDown)
    }

    /// The remote runtime, if the file has remote agents.
    pub(crate) fn remote_runtime(&self) -> Option<&Runtime> {
        self.remote
            .as_ref()
            .and_then(|remote| remote.runtime.as_ref())
    }

    /// Every runtime of the world: the local one first.
    pub(crate) fn runtimes(&self) -> Vec<&Runtime> {
        self.runtime.iter().chain(self.remote_runtime()).collect()
    }

    /// The runtime that holds `session`: the local one, unless only the remote knows it.
    pub(crate) async fn runtime_for(&self, session: &SessionId) -> Result<&Runtime, crate::Error> {
        let local = self.runtime()?;
        if let Some(remote) = self.remote_runtime() {
            if local.session(session).await.is_err() && remote.session(session).await.is_ok() {
                return Ok(remote);
            }
        }
        Ok(local)
    }

    /// The runtime that defines agent `agent`.
    pub(crate) fn runtime_of_agent(&self, agent: &str) -> Result<&Runtime, crate::Error> {
        let remote = self
            .agents
            .iter()
            .any(|spec| spec.name == agent && spec.remote);
        match (remote, self.remote_runtime()) {
            (true, Some(runtime)) => Ok(runtime),
            _ => self.runtime(),
        }
    }

    /// The manual clock's time (ms).
    pub(crate) fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Moves the manual clock forward by `ms`.
    pub(crate) fn advance_clock(&self, ms: u64) {
        self.clock.advance(ms);
    }

    /// Arms a crash before the next commit of `kind`: it fails, and so does every commit after
    /// it, until [`World::restart`] opens the store again without the fault.
    pub(crate) fn crash_before(&self, kind: CommitKind) -> Result<(), crate::Error> {
        self.runtime()?;
        let store = self.store.as_ref().ok_or(crate::Error::ShutDown)?;
        store.arm(Fault::CrashBefore(kind));
        Ok(())
    }

    /// Registers one more agent; a refusal is the runtime's own error.
    pub(crate) fn define(&mut self, spec: &AgentSpec) -> Result<(), crate::Error> {
        let agent = build::agent_beside(spec, &self.invocations, &self.remote_agents())?;
        match (spec.remote, self.remote_runtime()) {
            (true, Some(remote)) => remote.define(agent)?,
            _ => self.runtime()?.define(agent)?,
        }
        // Only now: a refused duplicate must not replace the registered agent's script.
        self.llm
            .set_agent_script(spec.name.as_str(), build::script(&spec.script));
        self.agents.push(spec.clone());
        Ok(())
    }

    /// Shuts the runtime down, drops it with its store, and opens both again on the same
    /// directory, with no fault armed (a crash the old store was dying of stays in the past).
    /// The clock, model, hook log and counts carry over.
    pub(crate) async fn restart(&mut self) -> Result<(), crate::Error> {
        self.store = None;
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown().await?;
        }
        self.stop_remote().await?;
        self.start_remote()
            .await
            .map_err(|reason| crate::Error::InvalidConfig {
                setting: "remote",
                reason,
            })?;
        let (runtime, store) = self.start()?;
        self.runtime = Some(runtime);
        self.store = Some(store);
        Ok(())
    }

    /// Shuts the runtime down before the directory goes.
    pub(crate) async fn close(mut self) {
        if let Some(runtime) = self.runtime.take() {
            if let Err(error) = runtime.shutdown().await {
                tracing::warn!(file = %self.file.display(), %error, "scenario.shutdown_failed");
            }
        }
        if let Err(error) = self.stop_remote().await {
            tracing::warn!(file = %self.file.display(), %error, "scenario.shutdown_failed");
        }
    }

    /// The remote agents' names and where they are served (none without a remote side).
    fn remote_agents(&self) -> RemoteAgentsAt {
        match &self.remote {
            Some(remote) => RemoteAgentsAt {
                names: self
                    .agents
                    .iter()
                    .filter(|spec| spec.remote)
                    .map(|spec| spec.name.clone())
                    .collect(),
                endpoint: remote.endpoint.clone(),
            },
            None => RemoteAgentsAt::default(),
        }
    }

    /// Starts the remote runtime on its own store and serves it: on a free port the first
    /// time, then on the same one (its children's entries name it).
    async fn start_remote(&mut self) -> Result<(), String> {
        let Some(remote) = &self.remote else {
            return Ok(());
        };
        let sled: Arc<dyn Store> =
            Arc::new(SledStore::open(remote.dir.path()).map_err(|error| error.to_string())?);
        let mut builder = self.configured(Runtime::builder().store(sled));
        for spec in self.agents.iter().filter(|spec| spec.remote) {
            let agent = build::agent(spec, &self.invocations).map_err(|error| error.to_string())?;
            builder = builder.agent(agent);
        }
        let runtime = builder.build().map_err(|error| error.to_string())?;
        let served = remote.host.serve(runtime.clone(), remote.port).await?;
        if let Some(remote) = &mut self.remote {
            remote.port = served.port;
            remote.endpoint = served.endpoint.clone();
            remote.runtime = Some(runtime);
            remote.served = Some(served);
        }
        Ok(())
    }

    async fn stop_remote(&mut self) -> Result<(), crate::Error> {
        let Some(remote) = &mut self.remote else {
            return Ok(());
        };
        if let Some(served) = remote.served.take() {
            (served.stop)().await;
        }
        if let Some(runtime) = remote.runtime.take() {
            runtime.shutdown().await?;
        }
        Ok(())
    }

    /// A runtime over a freshly opened store, wrapped in a [`FaultyStore`] with no fault.
    fn start(&self) -> Result<(Runtime, Arc<FaultyStore>), crate::Error> {
        let sled: Arc<dyn Store> = Arc::new(SledStore::open(self.dir.path())?);
        let store = Arc::new(FaultyStore::new(sled));
        let mut builder =
            self.configured(Runtime::builder().store(Arc::clone(&store) as Arc<dyn Store>));
        if let Some(remote) = &self.remote {
            builder = builder.remote_agents(remote.host.transport());
        }
        let remote_agents = self.remote_agents();
        for spec in self.agents.iter().filter(|spec| !spec.remote) {
            let agent = build::agent_beside(spec, &self.invocations, &remote_agents)?;
            builder = builder.agent(agent);
        }
        Ok((builder.build()?, store))
    }

    /// The file's clock, model, hooks and config on `builder`.
    fn configured(&self, builder: crate::RuntimeBuilder) -> crate::RuntimeBuilder {
        let mut builder = builder
            .llm(Arc::clone(&self.prompts) as Arc<_>)
            .clock(Arc::new(self.clock.clone()))
            .hooks(Arc::clone(&self.hooks) as Arc<_>);
        // The runner moves the clock and fires deadlines itself (`advance_clock`, and a sweep
        // after each op), so nothing fires behind its back.
        builder = builder.background_deadlines(false);
        let config = &self.config;
        if let Some(ms) = config.client_tool_timeout_ms {
            builder = builder.client_tool_timeout_ms(ms);
        }
        if let Some(ms) = config.tombstone_retention_ms {
            builder = builder.tombstone_retention_ms(ms);
        }
        if let Some(bytes) = config.max_result_bytes {
            builder = builder.max_result_bytes(usize::try_from(bytes).unwrap_or(usize::MAX));
        }
        if let Some(on) = config.auto_resume {
            builder = builder.auto_resume(on);
        }
        if let Some(ms) = self.config.idle_after_ms {
            builder = builder.idle_after_ms(ms);
        }
        if let Some(max) = self.config.max_resident {
            builder = builder.max_resident(max);
        }
        builder
    }
}
