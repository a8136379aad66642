//! The runtime under test for one file: a sled store in a temporary directory (behind a
//! [`FaultyStore`] that `crash_before` arms), a manual clock from 0 ms, the scripted model, and
//! the observers (hook log, invocation counts) that outlive restarts.

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use super::build::{self, Invocations};
use super::error::Error;
use super::format::{AgentSpec, ConfigSpec};
use super::parse::Scenario;
use super::prompts::PromptLog;
use crate::clock::{Clock, ManualClock};
use crate::definition::AgentDefinition;
use crate::hooks::{HookEvent, Hooks};
use crate::ids::RunId;
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
}

impl World {
    /// Opens a fresh store and a runtime with the file's agents.
    pub(crate) fn open(scenario: &Scenario) -> Result<Self, Error> {
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
        };
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
        let agent = build::agent(spec, &self.invocations)?;
        self.runtime()?.define(agent)?;
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
    }

    /// A runtime over a freshly opened store, wrapped in a [`FaultyStore`] with no fault.
    fn start(&self) -> Result<(Runtime, Arc<FaultyStore>), crate::Error> {
        let sled: Arc<dyn Store> = Arc::new(SledStore::open(self.dir.path())?);
        let store = Arc::new(FaultyStore::new(sled));
        let mut builder = Runtime::builder()
            .store(Arc::clone(&store) as Arc<dyn Store>)
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
        for spec in &self.agents {
            let agent: AgentDefinition = build::agent(spec, &self.invocations)?;
            builder = builder.agent(agent);
        }
        Ok((builder.build()?, store))
    }
}
