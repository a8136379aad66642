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
use crate::llm::ScriptedLlm;
use crate::runtime::Runtime;
use crate::store::{CommitKind, SledStore, Store};
use crate::testkit::{Fault, FaultyStore};
use crate::types::clock::{Clock, ManualClock};
use crate::types::hooks::{HookEvent, Hooks};
use crate::types::ids::{RunId, SessionId};

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
            // Not a run's: the scenario's hook lists are per run.
            _ => return,
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
    /// The other runtimes, one per name the agents marked `remote` give, each served over
    /// HTTP by `host`.
    remotes: Vec<RemoteSide>,
    host: Option<Arc<dyn RemoteHost>>,
}

/// A runtime of remote agents and how it is served.
struct RemoteSide {
    name: String,
    // Declared before `dir`, as above.
    runtime: Option<Runtime>,
    served: Option<Served>,
    dir: tempfile::TempDir,
    /// Reserved before any runtime starts (agents of one side name the others' endpoints),
    /// and kept across restarts.
    port: u16,
}

impl RemoteSide {
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl std::fmt::Debug for RemoteSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSide")
            .field("name", &self.name)
            .field("port", &self.port)
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
            remotes: Vec::new(),
            host: None,
        };
        let mut names: Vec<String> = world
            .agents
            .iter()
            .filter_map(|agent| agent.remote.clone())
            .collect();
        names.sort();
        names.dedup();
        if !names.is_empty() {
            if host.is_none() {
                return Err(Error::Remote {
                    file: world.file,
                    reason: "this file needs a remote host to serve them over HTTP: run it with dormant::testkit::scenario::run_with (dormant-server's tests do)".into(),
                });
            }
            world.host = host;
        }
        for name in names {
            let dir = tempfile::Builder::new()
                .prefix("dormant-scenario-remote-")
                .tempdir()
                .map_err(|source| Error::TempDir {
                    file: world.file.clone(),
                    source,
                })?;
            let port = free_port().map_err(|reason| Error::Remote {
                file: world.file.clone(),
                reason,
            })?;
            world.remotes.push(RemoteSide {
                name,
                runtime: None,
                served: None,
                dir,
                port,
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
        if let Err(reason) = world.start_remotes().await {
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
            Err(source @ crate::BuildError::InvalidDefinition(_)) => {
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

    /// Every runtime of the world: the local one first, then the remote ones.
    pub(crate) fn runtimes(&self) -> Vec<&Runtime> {
        self.runtime
            .iter()
            .chain(self.remotes.iter().filter_map(|side| side.runtime.as_ref()))
            .collect()
    }

    /// The runtimes other than `runtime`: where the remote children of its sessions live.
    pub(crate) fn others(&self, runtime: &Runtime) -> Vec<&Runtime> {
        self.runtimes()
            .into_iter()
            .filter(|other| !std::ptr::eq(*other, runtime))
            .collect()
    }

    /// The runtime that holds `session`: the local one, unless only another one knows it.
    pub(crate) async fn runtime_for(&self, session: &SessionId) -> Result<&Runtime, crate::Error> {
        let local = self.runtime()?;
        if local.session(session).await.is_ok() {
            return Ok(local);
        }
        for side in &self.remotes {
            if let Some(runtime) = &side.runtime {
                if runtime.session(session).await.is_ok() {
                    return Ok(runtime);
                }
            }
        }
        Ok(local)
    }

    /// The runtime that defines agent `agent`.
    pub(crate) fn runtime_of_agent(&self, agent: &str) -> Result<&Runtime, crate::Error> {
        let side = self
            .agents
            .iter()
            .find(|spec| spec.name == agent)
            .and_then(|spec| spec.remote.as_deref());
        match side.and_then(|name| self.side(name)) {
            Some(runtime) => Ok(runtime),
            None => self.runtime(),
        }
    }

    /// The running runtime of remote side `name`.
    fn side(&self, name: &str) -> Option<&Runtime> {
        self.remotes
            .iter()
            .find(|side| side.name == name)
            .and_then(|side| side.runtime.as_ref())
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
        let agent = build::agent_beside(
            spec,
            &self.invocations,
            &self.remote_agents(spec.remote.as_deref()),
        )?;
        match spec.remote.as_deref().and_then(|name| self.side(name)) {
            Some(remote) => remote.define(agent)?,
            None => self.runtime()?.define(agent)?,
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
    /// On failure, what to report: the error's code and, in parentheses, its message.
    pub(crate) async fn restart(&mut self) -> Result<(), String> {
        let report = |code: &str, error: &dyn std::fmt::Display| format!("{code} ({error})");
        self.store = None;
        if let Some(runtime) = self.runtime.take() {
            runtime
                .shutdown()
                .await
                .map_err(|error| report(error.code(), &error))?;
        }
        self.stop_remotes()
            .await
            .map_err(|error| report(error.code(), &error))?;
        self.start_remotes().await.map_err(|reason| {
            report(
                "invalid_config",
                &format!("invalid runtime setting remote: {reason}"),
            )
        })?;
        let (runtime, store) = self.start().map_err(|error| report(error.code(), &error))?;
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
        if let Err(error) = self.stop_remotes().await {
            tracing::warn!(file = %self.file.display(), %error, "scenario.shutdown_failed");
        }
    }

    /// Where the agents of the other runtimes than `side` (`None`: the local one) are served.
    fn remote_agents(&self, side: Option<&str>) -> RemoteAgentsAt {
        let endpoints = self
            .agents
            .iter()
            .filter_map(|spec| {
                let name = spec.remote.as_deref()?;
                if Some(name) == side {
                    return None;
                }
                let remote = self.remotes.iter().find(|remote| remote.name == name)?;
                Some((spec.name.clone(), remote.endpoint()))
            })
            .collect();
        RemoteAgentsAt { endpoints }
    }

    /// Starts each remote runtime on its own store and serves it on its reserved port.
    async fn start_remotes(&mut self) -> Result<(), String> {
        let Some(host) = self.host.clone() else {
            return Ok(());
        };
        for index in 0..self.remotes.len() {
            let side = &self.remotes[index];
            let sled: Arc<dyn Store> =
                Arc::new(SledStore::open(side.dir.path()).map_err(|error| error.to_string())?);
            let mut builder = self
                .configured(Runtime::builder().store(sled))
                .remote_agents(host.transport());
            let beside = self.remote_agents(Some(&side.name));
            for spec in self
                .agents
                .iter()
                .filter(|spec| spec.remote.as_deref() == Some(side.name.as_str()))
            {
                let agent = build::agent_beside(spec, &self.invocations, &beside)
                    .map_err(|error| error.to_string())?;
                builder = builder.agent(agent);
            }
            let runtime = builder.build().map_err(|error| error.to_string())?;
            let served = host.serve(runtime.clone(), side.port).await?;
            let side = &mut self.remotes[index];
            side.runtime = Some(runtime);
            side.served = Some(served);
        }
        Ok(())
    }

    async fn stop_remotes(&mut self) -> Result<(), crate::Error> {
        for side in &mut self.remotes {
            if let Some(served) = side.served.take() {
                (served.stop)().await;
            }
            if let Some(runtime) = side.runtime.take() {
                runtime.shutdown().await?;
            }
        }
        Ok(())
    }

    /// A runtime over a freshly opened store, wrapped in a [`FaultyStore`] with no fault.
    fn start(&self) -> Result<(Runtime, Arc<FaultyStore>), crate::BuildError> {
        let sled: Arc<dyn Store> = Arc::new(SledStore::open(self.dir.path())?);
        let store = Arc::new(FaultyStore::new(sled));
        let mut builder =
            self.configured(Runtime::builder().store(Arc::clone(&store) as Arc<dyn Store>));
        if let Some(host) = &self.host {
            builder = builder.remote_agents(host.transport());
        }
        let remote_agents = self.remote_agents(None);
        for spec in self.agents.iter().filter(|spec| spec.remote.is_none()) {
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

/// A loopback port free now, for a remote runtime to be served on (reserved before any
/// runtime starts, because agents name each other's endpoints).
fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|error| format!("cannot find a free loopback port: {error}"))?;
    listener
        .local_addr()
        .map(|address| address.port())
        .map_err(|error| error.to_string())
}
