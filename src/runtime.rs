//! The public entry point: a [`Runtime`] hosts sessions on a store and runs their agents.
//!
//! Public for what the runtime returns beyond the crate root's front door
//! ([`Runtime`], [`RuntimeBuilder`]): its counters
//! ([`RuntimeStats`], [`HostStats`], [`Latency`], [`ClientToolStats`]), a deadline sweep's
//! report ([`SweepReport`], [`ExpiredCall`]) and a handle that does not keep it alive
//! ([`WeakRuntime`]).

pub(crate) mod build_error;
pub(crate) mod builder;
mod call;
mod claim;
mod follow;
mod fork;
pub(crate) mod handle;
mod inbox;
mod inner;
pub(crate) mod read_error;
mod route;
mod stop;
mod submit;
pub(crate) mod submit_follow;
mod tool_info;

use std::sync::Arc;

use futures::Stream;
use tokio::sync::oneshot;

use crate::cluster::peer::{PeerCall, SubmitResumed};
use crate::definition::{AgentDefinition, DefinitionError, ToolKind};
use crate::engine::actor::{host_error, SessionMsg};
use crate::engine::deadlines::SchedulerMsg;
use crate::engine::shared::Shared;
use crate::error::Error;
use crate::session::submit::{Submit, SubmitOutcome};
use crate::session::{ChildCall, Companion, PendingCall};
use crate::session::{RunOutcome, RunRecord, RunStarted, SessionRecord, Status};
use crate::store::schema;
use crate::types::ids::SessionId;
use crate::types::message::Message;
use crate::types::stream::Chunk;
use read_error::ReadError;

pub(crate) use builder::RuntimeBuilder;
pub(crate) use handle::Runtime;
use inner::Inner;

// Public beyond the front door (the crate root has `Runtime`, `RuntimeBuilder`): what the
// runtime's counters, deadline sweeps and weak handle return.
pub use crate::engine::deadlines::SweepReport;
pub use crate::engine::metrics::{ClientToolStats, Latency};
pub use crate::store::schema::ExpiredCall;
/// The actor host's counters in [`RuntimeStats::host`], re-exported so that reading them needs
/// no dependency on `dormant-actors`.
pub use dormant_actors::HostStats;

/// A snapshot of the runtime's counters (serializable, for a metrics endpoint).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct RuntimeStats {
    /// Actor lifecycle counters (activations, passivations, resident actors).
    pub host: HostStats,
    /// Latency of durable step commits, as the sessions waited for them.
    pub commit_latency: Latency,
    /// Bytes written by step commits.
    pub commit_bytes: u64,
    /// Key writes (puts and deletes) made by step commits: each is one sled tree update.
    pub commit_writes: u64,
    /// Children that recovery inspected after a crash cut their parent's step.
    pub reconciled_children: u64,
}

/// A [`Runtime`] handle that does not keep it alive; see [`Runtime::downgrade`].
#[derive(Clone, Debug)]
pub struct WeakRuntime {
    inner: std::sync::Weak<Inner>,
}

impl WeakRuntime {
    /// The runtime, while any strong handle on it remains.
    pub fn upgrade(&self) -> Option<Runtime> {
        self.inner.upgrade().map(|inner| Runtime { inner })
    }
}

impl Runtime {
    /// Starts configuring a runtime.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// Registers one more agent.
    ///
    /// # Errors
    /// [`Error::InvalidDefinition`] if an agent of that name exists or a sub-agent tool names
    /// an agent that is not registered.
    pub fn define(&self, agent: AgentDefinition) -> Result<(), Error> {
        self.ensure_open()?;
        define(&self.inner.shared, agent)
    }

    /// Whether an agent of that name is defined here.
    ///
    /// ```
    /// # fn demo(runtime: dormant::Runtime) {
    /// if !runtime.has_agent("researcher") {
    ///     eprintln!("no agent researcher");
    /// }
    /// # }
    /// ```
    pub fn has_agent(&self, name: &str) -> bool {
        self.inner.shared.agents.contains_key(name)
    }

    /// Starts a new session of `agent` with a server-issued id and waits for its first run to
    /// end (or suspend).
    ///
    /// # Errors
    /// [`Error::UnknownAgent`], or a store failure (then nothing was acknowledged).
    pub async fn execute(
        &self,
        agent: &str,
        message: impl Into<String>,
    ) -> Result<RunOutcome, Error> {
        self.execute_on(&SessionId::generate(), agent, message)
            .await
    }

    /// Runs `message` on the session `id` (creating it if it does not exist; a completed,
    /// failed or interrupted session starts a new turn that sees the whole conversation) and
    /// waits for the run to end or suspend. On a suspended session, the calls still waiting
    /// are closed first with the error `client_tool_abandoned` and tombstoned, so a late
    /// submit for one answers `already_completed`. A run a crash cut goes on under the
    /// at-most-once rule first: a call it had dispatched without a result gets
    /// `tool_durability_error` (nothing runs again on a new message).
    ///
    /// **Dropping the returned future does not stop the run.** Once the future has been
    /// polled, the message is the session's and its run goes on in the runtime, durably,
    /// whether or not anyone waits for it; only the answer is lost. Follow it with
    /// [`Runtime::follow`] or [`Runtime::status`], and stop it with [`Runtime::interrupt`] or
    /// [`Runtime::abort`], which cancel its model call and tools at once. A future dropped
    /// before it was first polled sent nothing.
    ///
    /// # Errors
    /// [`Error::AlreadyRunning`] while a run is in progress, [`Error::AgentMismatch`] if the
    /// session runs another agent, [`Error::SubAgentSession`] for a sub-agent's session, local
    /// or the remote child of a parent on another server (its parent starts its turns),
    /// [`Error::Aborted`], [`Error::UnknownAgent`], a store failure.
    pub async fn execute_on(
        &self,
        id: &SessionId,
        agent: &str,
        message: impl Into<String>,
    ) -> Result<RunOutcome, Error> {
        self.routed(PeerCall::Execute {
            session: id.clone(),
            agent: agent.to_string(),
            message: message.into(),
        })
        .await
    }

    /// Like [`Runtime::execute_on`], but returns as soon as the new turn is durably started
    /// (its first commit made) instead of when it ends: the run goes on in the runtime. Follow
    /// it with [`Runtime::follow`] from [`RunStarted::from_seq`], or ask
    /// [`Runtime::status`]. This is what a server answering over HTTP wants: a run can take
    /// longer than a request should.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use dormant::{AgentDefinition, ModelReply, Runtime, ScriptedLlm, Status};
    /// use futures::StreamExt;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let llm = ScriptedLlm::new().script("greeter", vec![ModelReply::text("hello")]);
    /// # let runtime = Runtime::builder().llm(Arc::new(llm))
    /// #     .agent(AgentDefinition::builder("greeter").build()?).build()?;
    /// let id = "s1".parse()?;
    /// let started = runtime.start_on(&id, "greeter", "hi").await?;
    /// let mut stream = Box::pin(runtime.follow(&id, started.from_seq));
    /// while let Some(chunk) = stream.next().await {
    ///     if let dormant::types::ChunkKind::RunEnd { status, .. } = chunk?.kind {
    ///         assert_eq!(status, Status::Completed);
    ///         break;
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Runtime::execute_on`]; a store failure means nothing was started.
    pub async fn start_on(
        &self,
        id: &SessionId,
        agent: &str,
        message: impl Into<String>,
    ) -> Result<RunStarted, Error> {
        self.start(id, agent, message.into(), false, None).await
    }

    /// Like [`Runtime::start_on`], but only for a session that does not exist yet: one that
    /// does answers [`Error::SessionExists`] and nothing runs. Decided by the session's actor,
    /// so of two racing calls exactly one starts it. What a parent on another server uses to
    /// start a remote child: a replayed start finds the child instead of giving it a second
    /// turn.
    ///
    /// # Errors
    /// [`Error::SessionExists`], and as [`Runtime::start_on`].
    pub async fn start_new(
        &self,
        id: &SessionId,
        agent: &str,
        message: impl Into<String>,
    ) -> Result<RunStarted, Error> {
        self.start(id, agent, message.into(), true, None).await
    }

    // dormant-server's plumbing: its `POST /start` for a parent on another server. Public for
    // that crate, hidden from a daemon author's docs: a daemon serves it through the router.
    #[doc(hidden)]
    /// Like [`Runtime::start_new`], for a session that a parent on another server starts as
    /// its remote sub-agent: the session records `parent` (its parent and root there) and
    /// keeps a local child's rules from then on. A new turn from anyone else is refused
    /// ([`Error::SubAgentSession`]), and a submit naming it is `invalid_request` unless it says
    /// it comes through that root ([`Submit::via_root`]); its parent's server forwards the
    /// answers its root is given that way. What `dormant_server::HttpRemoteAgents` asks a
    /// remote for (`POST /start` with `parent_session_id` and `root_session_id`).
    ///
    /// # Errors
    /// As [`Runtime::start_new`].
    pub async fn start_remote_child(
        &self,
        id: &SessionId,
        agent: &str,
        message: impl Into<String>,
        parent: crate::remote::RemoteParent,
    ) -> Result<RunStarted, Error> {
        self.start(id, agent, message.into(), true, Some(parent))
            .await
    }

    /// A new turn of `id`, answered once its first commit is durable (`new_only`: only if
    /// the session does not exist; `remote_parent`: created as a remote child).
    async fn start(
        &self,
        id: &SessionId,
        agent: &str,
        message: String,
        new_only: bool,
        remote_parent: Option<crate::remote::RemoteParent>,
    ) -> Result<RunStarted, Error> {
        self.routed(PeerCall::Start {
            session: id.clone(),
            agent: agent.to_string(),
            message,
            new_only,
            remote_parent,
        })
        .await
    }

    /// Submits an answer for a pending client-tool or approval call. The answer always names
    /// the ROOT session; the router finds the session (a sub-agent, say) that owns the call.
    /// `Accepted` is returned only once the answer is durable; the first accepted answer wins.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use dormant::{AgentDefinition, ModelReply, Runtime, ScriptedLlm, Status, ToolCall, ToolDefinition};
    /// use dormant::{Submit, SubmitOutcome};
    /// use serde_json::json;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let llm = ScriptedLlm::new().script("editor", vec![
    /// #     ModelReply::tool_calls(vec![ToolCall::new("tc-1", "edit", json!({}))]),
    /// #     ModelReply::text("done"),
    /// # ]);
    /// # let runtime = Runtime::builder().llm(Arc::new(llm))
    /// #     .agent(AgentDefinition::builder("editor").tool(ToolDefinition::client("edit")).build()?)
    /// #     .build()?;
    /// let id = "s1".parse()?;
    /// let run = runtime.execute_on(&id, "editor", "edit it").await?;
    /// assert_eq!(run.status, Status::SuspendedClientTool);
    /// let outcome = runtime.submit_tool_result(Submit::result("s1", "tc-1", json!({ "ok": true }))).await?;
    /// assert_eq!(outcome, SubmitOutcome::Accepted);
    /// let resumed = runtime.resume(&id).await?;
    /// assert_eq!(resumed.status, Status::Completed);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Only a store failure (or a shut-down runtime); every expected outcome, bad input
    /// included, is a [`SubmitOutcome`].
    pub async fn submit_tool_result(&self, submit: Submit) -> Result<SubmitOutcome, Error> {
        self.routed(PeerCall::Submit { submit }).await
    }

    // dormant-server's plumbing: `POST /submit-tool-result?resume=true`, answered with a
    // peer call's types (`SubmitResumed` holds a `PeerFailure`). Public for that crate, hidden
    // from a daemon author's docs: a daemon calls `submit_tool_result`, then `start_resume`.
    #[doc(hidden)]
    /// [`Runtime::submit_tool_result`], and once the answer is accepted,
    /// [`Runtime::start_resume`] of the session it names, in one call: one hop to the node
    /// that owns the session's tree, not two (what `POST /submit-tool-result?resume=true`
    /// does). The resume is tried once the call has its answer: this one, accepted, or one
    /// before it (`already_completed`, as a retry of a request cut off before its resume
    /// was asked for is answered); its failure does not undo the answer, and is in it. The
    /// two run on a task of their own, so a caller that gives up midway does not leave the
    /// answer in and the resume never asked for.
    ///
    /// # Errors
    /// As [`Runtime::submit_tool_result`].
    pub async fn submit_and_resume(&self, submit: Submit) -> Result<SubmitResumed, Error> {
        self.routed(PeerCall::SubmitAndResume { submit }).await
    }

    /// Submits a JSON envelope as a client sends it (see [`Submit::from_json`]); a malformed
    /// envelope answers `InvalidRequest` and stores nothing.
    ///
    /// # Errors
    /// As [`Runtime::submit_tool_result`].
    pub async fn submit_json(&self, envelope: &serde_json::Value) -> Result<SubmitOutcome, Error> {
        self.ensure_open()?;
        match Submit::from_json(envelope) {
            Ok(submit) => self.submit_tool_result(submit).await,
            Err(reason) => Ok(SubmitOutcome::InvalidRequest { reason }),
        }
    }

    /// Resumes a suspended (or interrupted) session: answers are drained into tool results in
    /// call order, approved tools run, expired calls become `client_tool_timeout` errors, and
    /// the run goes on until it ends or suspends again. While some call is still unanswered and
    /// unexpired, nothing runs and the outcome lists what is pending (a barrier). A resume
    /// while a run is in progress waits for that run.
    ///
    /// # Errors
    /// [`Error::UnknownSession`], [`Error::Aborted`], [`Error::NotResumable`] for a session
    /// whose last run completed or failed, a store failure.
    pub async fn resume(&self, id: &SessionId) -> Result<RunOutcome, Error> {
        self.routed(PeerCall::Resume {
            session: id.clone(),
            wait: true,
        })
        .await
    }

    /// Like [`Runtime::resume`], but returns as soon as the resume is durably applied instead
    /// of when the run ends: [`RunStarted::status`] is `running` while the run goes on, or
    /// the suspended status of a resume that found calls still pending (nothing ran).
    ///
    /// # Errors
    /// As [`Runtime::resume`].
    pub async fn start_resume(&self, id: &SessionId) -> Result<RunStarted, Error> {
        self.routed(PeerCall::Resume {
            session: id.clone(),
            wait: false,
        })
        .await
    }

    /// Interrupts a session durably: a suspended run ends `interrupted` at once (its pending
    /// calls are dropped; late submits answer `unknown_tool_call`), and so does a running one:
    /// its model call and the tools it is running are cancelled (their futures dropped) and
    /// each call of its step is closed with an `interrupted` error. Its children and working
    /// companions are interrupted too, at any depth, evicted or not; they keep their
    /// conversations. Returns once every session of the tree below has stopped and none of
    /// its calls is pending. `resume` continues an interrupted session. On a session with no
    /// run to stop (completed, failed, interrupted or aborted) it does nothing.
    ///
    /// # Errors
    /// [`Error::UnknownSession`], a store failure.
    pub async fn interrupt(&self, id: &SessionId) -> Result<(), Error> {
        self.routed(PeerCall::Stop {
            session: id.clone(),
            abort: false,
        })
        .await
    }

    /// Aborts a session: terminal. A running, suspended or interrupted run fails (a running
    /// one at once, its model call and tools cancelled), pending calls are dropped, its
    /// children are aborted and its companions terminated, at any depth, and the session
    /// refuses `resume` and `execute` from then on. Returns once every session of the tree
    /// below has stopped. A session whose last run completed or failed keeps that run and its
    /// status as they were; only the refusals are new.
    ///
    /// # Errors
    /// [`Error::UnknownSession`], a store failure.
    pub async fn abort(&self, id: &SessionId) -> Result<(), Error> {
        self.routed(PeerCall::Stop {
            session: id.clone(),
            abort: true,
        })
        .await
    }

    /// Waits until no run of the session is in progress (an automatic resume, say). A session
    /// stored as running that has no actor in this process (its run was cut by a crash) is
    /// activated, which records that run as interrupted.
    pub async fn wait_settled(&self, id: &SessionId) {
        let waited = self.routed::<bool>(PeerCall::WaitSettled {
            session: id.clone(),
            tree: false,
        });
        // A runtime shut down, or an owner that went away, has nothing left to wait for.
        let _ = waited.await;
    }

    /// [`Runtime::wait_settled`] on this node.
    async fn wait_settled_here(&self, id: &SessionId) {
        if self.inner.is_closing() {
            return;
        }
        let (reply, settled) = oneshot::channel();
        if self.inner.host.is_resident(id) {
            self.inner
                .host
                .send(id.clone(), SessionMsg::WaitSettled { reply });
        } else {
            // A session stored as running with no actor here was cut by a crash: activating it
            // closes that run as interrupted, which is the settled state it is waiting for.
            // Looked at in a task of its own, so that a caller who stops waiting at once (a
            // timed wait such as `GET /status?settle_ms=1`, while the store read is still
            // under way) still has the cut run closed; else the reply is dropped unsent.
            let runtime = self.clone();
            let id = id.clone();
            tokio::spawn(async move {
                if matches!(runtime.status(&id).await, Ok(Status::Running)) {
                    runtime
                        .inner
                        .host
                        .send(id, SessionMsg::WaitSettled { reply });
                }
            });
        }
        let _ = settled.await;
    }

    /// Waits until no session of `root`'s tree here has work in progress: [`Runtime::wait_settled`]
    /// for the root and every sub-agent (and companion) below it that has not finished, until
    /// one pass finds all of them settled. A child that goes on by itself (an answer accepted
    /// with `auto_resume`) settles before its parent learns of it, so the root alone may look
    /// settled while its tree still works; this is what a remote parent waits for before it
    /// reads a child's status (`GET /status?settle_ms=`).
    pub async fn wait_tree_settled(&self, root: &SessionId) {
        let waited = self.routed::<bool>(PeerCall::WaitSettled {
            session: root.clone(),
            tree: true,
        });
        let _ = waited.await;
    }

    /// [`Runtime::wait_tree_settled`] on this node.
    async fn wait_tree_settled_here(&self, root: &SessionId) {
        loop {
            self.wait_settled_here(root).await;
            let mut quiet = true;
            for session in self.tree_below(root).await {
                if !self.is_settled_here(&session).await {
                    quiet = false;
                    self.wait_settled_here(&session).await;
                }
            }
            if quiet && self.is_settled_here(root).await {
                return;
            }
        }
    }

    /// The sessions below `root` whose calls have not finished, breadth first (at most
    /// 10,000; sessions that cannot be read are left out).
    async fn tree_below(&self, root: &SessionId) -> Vec<SessionId> {
        const MAX_SESSIONS: usize = 10_000;
        let store = self.store();
        let mut found = Vec::new();
        let mut queue = std::collections::VecDeque::from([root.clone()]);
        while let Some(session) = queue.pop_front() {
            if found.len() >= MAX_SESSIONS {
                break;
            }
            let children = schema::load_children(store, &session)
                .await
                .unwrap_or_default();
            for child in children {
                if !child.state.is_finished() && child.remote.is_none() {
                    found.push(child.child.clone());
                    queue.push_back(child.child);
                }
            }
            let companions = schema::load_companions(store, &session)
                .await
                .unwrap_or_default();
            for companion in companions {
                if !found.contains(&companion.child) {
                    found.push(companion.child.clone());
                    queue.push_back(companion.child);
                }
            }
        }
        found
    }

    /// Why the store cannot take commits now, if it says so (a full disk): commits fail with
    /// a retryable error meanwhile, reads go on. What a health check reports.
    pub fn store_degraded(&self) -> Option<String> {
        self.inner.shared.store.degraded()
    }

    /// Whether the session is settled now: no run of it in progress, no resume waking its
    /// sub-agents, no remote sub-agent being followed, no automatic resume queued. What
    /// [`Runtime::wait_settled`] waits for, without waiting. A session with no actor in this
    /// process is settled unless it is stored as running (a crash cut its run).
    pub async fn is_settled(&self, id: &SessionId) -> bool {
        let settled = self.routed::<bool>(PeerCall::IsSettled {
            session: id.clone(),
        });
        // A runtime shut down has nothing at work.
        settled.await.unwrap_or(true)
    }

    /// [`Runtime::is_settled`] on this node.
    async fn is_settled_here(&self, id: &SessionId) -> bool {
        if self.inner.is_closing() {
            return true;
        }
        if !self.inner.host.is_resident(id) {
            return !matches!(self.status(id).await, Ok(Status::Running));
        }
        let (reply, settled) = oneshot::channel();
        self.inner
            .host
            .send(id.clone(), SessionMsg::IsSettled { reply });
        settled.await.unwrap_or(true)
    }

    /// Tries once to stop, on their servers, the remote sub-agents this runtime's trees let go
    /// while those servers did not answer (written off after [`RemotePolicy::patience`],
    /// or aborted or interrupted with their tree), and returns how many are left. A
    /// background task does this by itself whenever one is recorded and then every
    /// [`RemotePolicy::max_retry_wait`] while any is left, unless the runtime was built with
    /// `background_deadlines(false)` (a test driving time by hand calls this instead).
    ///
    /// [`RemotePolicy::patience`]: crate::remote::RemotePolicy::patience
    /// [`RemotePolicy::max_retry_wait`]: crate::remote::RemotePolicy::max_retry_wait
    ///
    /// # Errors
    /// A store failure.
    pub async fn retry_remote_stops(&self) -> Result<usize, Error> {
        self.ensure_open()?;
        crate::remote::stop_orphans_once(&self.inner.shared).await
    }

    /// Fires every deadline that has passed by the runtime's clock and waits until the
    /// sessions concerned have recorded their timeouts and settled. The background scheduler
    /// does the same on its own; call this after moving a manual clock.
    ///
    /// # Errors
    /// A store failure, or a shut-down runtime.
    pub async fn sweep_deadlines(&self) -> Result<SweepReport, Error> {
        self.ensure_open()?;
        let (reply, answer) = oneshot::channel();
        self.inner
            .deadlines
            .send(SchedulerMsg::Sweep { reply: Some(reply) });
        answer.await.map_err(|_| Error::ShutDown)?
    }

    /// Pending calls whose deadline is at or before `now`, earliest first: an ordered range
    /// read of the durable deadline index, O(log n + k) for k results.
    ///
    /// # Errors
    /// A store failure.
    pub async fn find_expired_pending(&self, now: u64) -> Result<Vec<ExpiredCall>, ReadError> {
        self.ensure_open()?;
        let mut expired = self.read(schema::expired_calls(self.store(), now, usize::MAX).await)?;
        // A resume the runtime owes a session, a look at a remote sub-agent: no calls (the
        // scheduler fires those).
        expired.retain(|call| !schema::is_runtime_entry(&call.tool_call_id));
        Ok(expired)
    }

    /// The session's pending calls (waiting, or answered and waiting for a resume).
    ///
    /// # Errors
    /// As [`Runtime::session`].
    pub async fn pending(&self, id: &SessionId) -> Result<Vec<PendingCall>, ReadError> {
        self.session(id).await?;
        let mut calls = self.read(schema::load_pending(self.store(), id).await)?;
        calls.sort_by_key(|call| call.position);
        Ok(calls)
    }

    /// The calls under root `root` that remote sub-agents' trees wait on (their client tools
    /// and approvals, and those of their own children), each with the local session whose
    /// call runs the remote child. A submit at `root` answers any of them. What
    /// [`Runtime::pending`] is to a session's own calls, this is to its remote ones: together
    /// with the pending calls of its local sub-agents they are everything the root waits on.
    ///
    /// # Errors
    /// As [`Runtime::session`].
    pub async fn pending_remote(
        &self,
        root: &SessionId,
    ) -> Result<Vec<(SessionId, crate::remote::RemoteCall)>, ReadError> {
        self.session(root).await?;
        let owners = self.read(schema::remote_owned(self.store(), root).await)?;
        Ok(owners
            .into_iter()
            .map(|owner| (owner.via, owner.call))
            .collect())
    }

    /// The session's sub-agent calls that have not become tool results yet: which child runs
    /// each, and what the session last learned of it.
    ///
    /// # Errors
    /// As [`Runtime::session`].
    pub async fn children(&self, id: &SessionId) -> Result<Vec<ChildCall>, ReadError> {
        self.session(id).await?;
        let mut calls = self.read(schema::load_children(self.store(), id).await)?;
        calls.sort_by_key(|call| call.position);
        Ok(calls)
    }

    /// The persistent sub-agents (companions) of a session, by name, as the session knows
    /// them: where each one's turn stands and its last reply.
    ///
    /// # Errors
    /// As [`Runtime::session`].
    pub async fn companions(&self, id: &SessionId) -> Result<Vec<Companion>, ReadError> {
        self.ensure_open()?;
        let companions = self.read(schema::load_companions(self.store(), id).await)?;
        self.require_session_if(companions.is_empty(), id).await?;
        Ok(companions)
    }

    /// How client-tool and approval calls fared: wait times and outcome counters.
    pub fn client_tool_stats(&self) -> ClientToolStats {
        self.inner.shared.metrics.client_tools()
    }

    /// The session's stored record (status, counters, custom state).
    ///
    /// # Errors
    /// [`ReadError::UnknownSession`], or a typed error if the stored record is unreadable.
    pub async fn session(&self, id: &SessionId) -> Result<SessionRecord, ReadError> {
        self.ensure_open()?;
        self.read(schema::load_record(self.store(), id).await)?
            .ok_or_else(|| ReadError::UnknownSession(id.clone()))
    }

    /// [`ReadError::UnknownSession`] if `found_nothing` and the session does not exist. A read that
    /// found any of a session's log entries proves it exists (its first commit wrote the
    /// snapshot with them), so only an empty answer costs the check: a read of the snapshot
    /// (one key, often on another page than the log), not of the current record (a reverse
    /// scan of the log).
    async fn require_session_if(
        &self,
        found_nothing: bool,
        id: &SessionId,
    ) -> Result<(), ReadError> {
        if !found_nothing {
            return Ok(());
        }
        match self.read(schema::load_lineage(self.store(), id).await)? {
            Some(_) => Ok(()),
            None => Err(ReadError::UnknownSession(id.clone())),
        }
    }

    /// Every session in the store (roots and sub-agents), in id order.
    ///
    /// # Errors
    /// A store failure, or a stored key that is not a session id.
    pub async fn session_ids(&self) -> Result<Vec<SessionId>, ReadError> {
        self.ensure_open()?;
        self.read(schema::list_sessions(self.store()).await)
    }

    /// The session's status.
    ///
    /// # Errors
    /// As [`Runtime::session`].
    pub async fn status(&self, id: &SessionId) -> Result<Status, ReadError> {
        Ok(self.session(id).await?.status)
    }

    /// The session's conversation, in order.
    ///
    /// # Errors
    /// As [`Runtime::session`].
    pub async fn messages(&self, id: &SessionId) -> Result<Vec<Message>, ReadError> {
        self.ensure_open()?;
        let messages = self.read(schema::load_messages(self.store(), id).await)?;
        self.require_session_if(messages.is_empty(), id).await?;
        Ok(messages)
    }

    /// The session's run records, in turn order.
    ///
    /// # Errors
    /// As [`Runtime::session`].
    pub async fn runs(&self, id: &SessionId) -> Result<Vec<RunRecord>, ReadError> {
        self.ensure_open()?;
        let runs = self.read(schema::load_runs(self.store(), id).await)?;
        self.require_session_if(runs.is_empty(), id).await?;
        Ok(runs)
    }

    /// One run record of the session, by its turn number (the current run's is
    /// `session(id).run_count`); `None` if the session has no such run.
    ///
    /// # Errors
    /// As [`Runtime::session`].
    pub async fn run(&self, id: &SessionId, turn: u32) -> Result<Option<RunRecord>, ReadError> {
        self.ensure_open()?;
        let run = self.read(schema::load_run(self.store(), id, turn).await)?;
        self.require_session_if(run.is_none(), id).await?;
        Ok(run)
    }

    /// The session's stored stream chunks from sequence number `from` on.
    ///
    /// # Errors
    /// As [`Runtime::session`].
    pub async fn chunks(&self, id: &SessionId, from: u64) -> Result<Vec<Chunk>, ReadError> {
        self.chunks_at_most(id, from, usize::MAX).await
    }

    /// [`Runtime::chunks`], `most` of them at most: the stored stream is read a page at a
    /// time until it has them, so a long history is not read whole for its first few.
    ///
    /// # Errors
    /// As [`Runtime::session`].
    pub async fn chunks_at_most(
        &self,
        id: &SessionId,
        from: u64,
        most: usize,
    ) -> Result<Vec<Chunk>, ReadError> {
        self.ensure_open()?;
        let chunks = self.read(schema::load_chunks_at_most(self.store(), id, from, most).await)?;
        self.require_session_if(chunks.is_empty(), id).await?;
        Ok(chunks)
    }

    /// Follows the session's stream from sequence number `from`: stored chunks first, then
    /// live ones as their commits become durable, without gaps or repeats. The stream does
    /// not end with a run (a session may run again): stop at the `run_end` you wait for (not
    /// a forwarded child's, see [`ChunkKind::is_forwarded`](crate::types::ChunkKind::is_forwarded)).
    /// It ends when the runtime shuts down (after shutdown it yields one `ShutDown` error).
    /// A session that does not exist yet is followed too, from its first chunk on: call
    /// [`Runtime::status`] first to refuse unknown ids.
    pub fn follow(
        &self,
        id: &SessionId,
        from: u64,
    ) -> impl Stream<Item = Result<Chunk, Error>> + Send + 'static {
        if self.inner.is_closing() {
            return futures::future::Either::Left(futures::stream::once(async {
                Err(Error::ShutDown)
            }));
        }
        futures::future::Either::Right(follow::follow(
            Arc::clone(&self.inner.shared),
            id.clone(),
            from,
        ))
    }

    /// [`Runtime::follow`], with the live [`Delta`](crate::types::Delta)s of model calls in between
    /// the chunks: text and tool-call fragments as a streaming model produces them. Deltas are
    /// never stored, so a follower that starts late (or falls behind) does not get them; the
    /// step's assembled reply arrives as its stored `text` and `tool_start` chunks either way.
    ///
    /// ```
    /// # async fn run(runtime: dormant::Runtime, id: dormant::SessionId) {
    /// use dormant::StreamEvent;
    /// use futures::StreamExt;
    ///
    /// let mut events = std::pin::pin!(runtime.follow_live(&id, 0));
    /// while let Some(Ok(event)) = events.next().await {
    ///     match event {
    ///         StreamEvent::Delta(delta) => println!("… {:?}", delta.kind),
    ///         StreamEvent::Chunk(chunk) => println!("#{} {}", chunk.seq, chunk.kind.type_name()),
    ///     }
    /// }
    /// # }
    /// ```
    pub fn follow_live(
        &self,
        id: &SessionId,
        from: u64,
    ) -> impl Stream<Item = Result<crate::StreamEvent, Error>> + Send + 'static {
        if self.inner.is_closing() {
            return futures::future::Either::Left(futures::stream::once(async {
                Err(Error::ShutDown)
            }));
        }
        futures::future::Either::Right(follow::follow_routed(
            Arc::clone(&self.inner.shared),
            id.clone(),
            from,
            true,
            None,
        ))
    }

    /// [`Runtime::follow_live`] for a follower that ends at the session's next settle, with a
    /// future done once the session is settled (no run, resume or woken sub-agent at work in
    /// it), with its chunk count then: the follower ends after the chunks before that count.
    /// `None` if the count could not be read (the follower then ends where it is). A session
    /// another node runs is followed there to its settle, which its stream then tells: no
    /// call of its own waits for it, unless the peers transport cannot do that. So poll the
    /// stream while waiting for the future: the future may learn the settle from it.
    ///
    /// ```
    /// # async fn run(runtime: dormant::Runtime, id: dormant::SessionId) {
    /// use dormant::StreamEvent;
    /// use futures::StreamExt;
    ///
    /// let (events, settled) = runtime.follow_live_to_settle(&id, 0);
    /// let mut events = std::pin::pin!(events);
    /// let mut settled = std::pin::pin!(settled);
    /// let mut next = 0;
    /// let end = loop {
    ///     tokio::select! {
    ///         biased;
    ///         event = events.next() => match event {
    ///             Some(Ok(StreamEvent::Chunk(chunk))) => next = chunk.seq + 1,
    ///             Some(Ok(StreamEvent::Delta(_))) => {}
    ///             Some(Err(_)) | None => break None,
    ///         },
    ///         end = &mut settled => break end,
    ///     }
    /// };
    /// // Every chunk below `end` came before the settle was told; a chunk at or past it
    /// // belongs to a later run.
    /// # let _ = (next, end);
    /// # }
    /// ```
    pub fn follow_live_to_settle(
        &self,
        id: &SessionId,
        from: u64,
    ) -> (
        impl Stream<Item = Result<crate::StreamEvent, Error>> + Send + 'static,
        impl std::future::Future<Output = Option<u64>> + Send + 'static,
    ) {
        let (tell, told) = tokio::sync::oneshot::channel();
        let events = if self.inner.is_closing() {
            futures::future::Either::Left(futures::stream::once(async { Err(Error::ShutDown) }))
        } else {
            futures::future::Either::Right(follow::follow_routed(
                Arc::clone(&self.inner.shared),
                id.clone(),
                from,
                true,
                Some(tell),
            ))
        };
        (events, self.settle_told(id, told))
    }

    /// The chunk count of `id` once it settles: as `told` says (by the owner's stream), or,
    /// if it never does, waited for and read here.
    pub(super) fn settle_told(
        &self,
        id: &SessionId,
        told: tokio::sync::oneshot::Receiver<u64>,
    ) -> impl std::future::Future<Output = Option<u64>> + Send + 'static {
        let runtime = self.clone();
        let id = id.clone();
        async move {
            if let Ok(chunks) = told.await {
                return Some(chunks);
            }
            // Followed here, or the owner's stream ended before it told: waited for here
            // (a call to the owner, if another node runs it).
            runtime.wait_settled(&id).await;
            runtime.chunk_count(&id).await
        }
    }

    /// The session's chunk count as its stored record says (`None` if it does not read): once
    /// settled, where a stream that ends at the settle stops.
    pub(super) async fn chunk_count(&self, id: &SessionId) -> Option<u64> {
        self.session(id).await.ok().map(|record| record.chunk_count)
    }

    /// Whether a suspended session resumes on its own once every call it waits on is
    /// answered or timed out ([`RuntimeBuilder::auto_resume`](crate::RuntimeBuilder::auto_resume)):
    /// when not, nothing runs a suspended session again but an explicit `resume`.
    pub fn auto_resumes(&self) -> bool {
        self.inner.shared.policy.auto_resume
    }

    /// Whether other nodes may share this runtime's store (it holds leases, as PostgreSQL
    /// does): only then can another node own a session, and a front such as the agent server
    /// need look for that owner. `false` on a store only this process uses (sled, memory).
    pub fn store_is_shared(&self) -> bool {
        self.inner.shared.leases.is_shared()
    }

    // The cluster's routing, for dormant-server's tests and this crate's lease model test.
    // Public for them, hidden from a daemon author's docs: every call routes itself.
    #[doc(hidden)]
    /// The other node that owns the session's tree, on a store several nodes share: where a
    /// request for it must go (its address, if it advertised one). `None` when this process
    /// may serve it: on a store of its own always, on a shared one when no other live node
    /// holds the tree's lease.
    ///
    /// # Errors
    /// A store failure.
    pub async fn owner_of(
        &self,
        id: &SessionId,
    ) -> Result<Option<crate::cluster::leases::LeaseOwner>, Error> {
        let shared = &self.inner.shared;
        if !shared.leases.is_shared() {
            return Ok(None);
        }
        let root = crate::store::schema::tree_root(shared.store.as_ref(), id).await?;
        Ok(shared.leases.owner(root.as_str()).await?)
    }

    /// The time by the runtime's clock (ms), the clock every deadline and timestamp it
    /// records is read from.
    pub fn now_ms(&self) -> u64 {
        self.inner.shared.clock.now_ms()
    }

    /// How many sessions have a live stream channel (someone follows them).
    pub fn live_followed_sessions(&self) -> usize {
        self.inner.shared.streams.len()
    }

    /// Stops the session's actor (if resident and idle) and waits; its state stays in the store.
    pub async fn evict(&self, id: &SessionId) {
        self.inner.host.evict_and_wait(id).await;
    }

    /// Stops every idle resident session actor and waits.
    pub async fn evict_all(&self) {
        self.inner.host.evict_all().await;
    }

    /// Passivates sessions idle for longer than the configured idle time; returns how many.
    pub fn passivate_idle(&self) -> usize {
        self.inner.host.passivate_idle()
    }

    /// The sessions that have a resident actor (for the scenario runner's `evict` op).
    #[cfg(feature = "test-util")]
    pub(crate) fn resident_sessions(&self) -> Vec<SessionId> {
        self.inner.host.resident_keys()
    }

    /// Whether the session has an actor right now.
    pub fn is_resident(&self, id: &SessionId) -> bool {
        self.inner.host.is_resident(id)
    }

    /// The runtime's counters.
    pub fn stats(&self) -> RuntimeStats {
        RuntimeStats {
            host: self.inner.host.stats(),
            commit_latency: self.inner.shared.metrics.commit_latency(),
            commit_bytes: self.inner.shared.metrics.commit_bytes(),
            commit_writes: self.inner.shared.metrics.commit_writes(),
            reconciled_children: self.inner.shared.metrics.reconciled(),
        }
    }

    /// Bytes the store occupies on disk.
    ///
    /// # Errors
    /// A store failure.
    pub async fn store_size_on_disk(&self) -> Result<u64, ReadError> {
        self.ensure_open()?;
        self.read(
            self.store()
                .size_on_disk()
                .await
                .map_err(schema::Error::from),
        )
    }

    /// Stops every session actor, then flushes and closes the store (so its directory can be
    /// reopened at once). From the moment it begins, every method of this runtime and its
    /// clones answers [`Error::ShutDown`], and so does a call waiting on a run in progress
    /// (whose model call and tools are cancelled). Runs still in progress are recorded as
    /// interrupted when their session is next activated.
    ///
    /// Dropping the last clone without calling this is like killing the process, without
    /// the exit: a store nobody else holds is released before the drop returns (commits in
    /// flight fail; everything acknowledged is durable), and the actors stop in the
    /// background. A store you still hold stays open, and building another runtime on it
    /// answers [`BuildError::StoreInUse`](crate::BuildError::StoreInUse) until those actors have stopped (`shutdown` stops them
    /// before it returns, but closes the store too). A clone held by the runtime itself
    /// (in a hook or a tool) keeps it alive: give those a [`WeakRuntime`].
    ///
    /// Calling it again, on this handle or a clone, returns `Ok` at once.
    ///
    /// # Errors
    /// The final flush failed.
    pub async fn shutdown(&self) -> Result<(), Error> {
        // A second shutdown (of this handle or a clone) has nothing left to do.
        if self.inner.is_shut_down() {
            return Ok(());
        }
        self.inner.mark_closing();
        self.inner.stop_scheduler();
        self.inner.host.shutdown().await;
        self.inner.shared.streams.clear();
        // Closing (not just flushing) releases the store's files at once, even while a task
        // that is finishing still holds a handle: the directory can be reopened right away.
        self.inner.shared.store.close().await?;
        // Only now: a shutdown cancelled half way (a timeout around it) leaves the drop to
        // finish the job.
        self.inner.mark_shut_down();
        Ok(())
    }

    /// A handle that does not keep the runtime alive, for a hook or a tool that needs to call
    /// the runtime that runs it: a strong clone there would keep the runtime (its actors, its
    /// store and the store's lock) alive after every other handle is gone.
    pub fn downgrade(&self) -> WeakRuntime {
        WeakRuntime {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// Runs `task` on the tokio runtime this one was built in, from any thread (a metrics
    /// exporter's callbacks run on the exporter's own).
    #[cfg(feature = "otel")]
    pub(crate) fn spawn_detached(
        &self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        drop(self.inner.tokio().spawn(task));
    }

    fn agent(&self, name: &str) -> Result<Arc<AgentDefinition>, Error> {
        self.inner
            .shared
            .agents
            .get(name)
            .map(|agent| Arc::clone(agent.value()))
            .ok_or_else(|| Error::UnknownAgent(name.to_string()))
    }

    /// The reply port was dropped: the actor crashed while handling the call, or the host
    /// refused it (the refusal is answered through `reject`, so this is the crash).
    fn lost_reply(&self, id: &SessionId) -> Error {
        match self.inner.host.failure(id) {
            Some(error) => host_error(error),
            // A shutdown stops actors with their runs in flight: a defined outcome.
            None if self.inner.is_closing() => Error::ShutDown,
            None => Error::Crashed(id.clone()),
        }
    }

    /// [`ReadError::ShutDown`] once `shutdown` has begun (a call's `?` makes it
    /// [`Error::ShutDown`]).
    fn ensure_open(&self) -> Result<(), ReadError> {
        if self.inner.is_closing() {
            return Err(ReadError::ShutDown);
        }
        Ok(())
    }

    /// The store the runtime reads.
    fn store(&self) -> &dyn crate::store::Store {
        self.inner.shared.store.as_ref()
    }

    /// A read's result: a store that closed under it (a shutdown began) answers `ShutDown`.
    fn read<T>(&self, read: Result<T, schema::Error>) -> Result<T, ReadError> {
        read.map_err(|error| match ReadError::from(error) {
            ReadError::Store(crate::store::Error::Closed) if self.inner.is_closing() => {
                ReadError::ShutDown
            }
            other => other,
        })
    }
}

fn define(shared: &Shared, agent: AgentDefinition) -> Result<(), Error> {
    Ok(define_all(shared, vec![agent])?)
}

/// Registers a set of agents at once, so agents of the set may name each other (in a cycle,
/// even) as sub-agents; a sub-agent tool naming an agent neither in the set nor registered is
/// refused, and nothing of the set is registered then.
pub(crate) fn define_all(
    shared: &Shared,
    agents: Vec<AgentDefinition>,
) -> Result<(), DefinitionError> {
    let known = |name: &str| {
        shared.agents.contains_key(name) || agents.iter().any(|agent| agent.name() == name)
    };
    for (index, agent) in agents.iter().enumerate() {
        let duplicate = shared.agents.contains_key(agent.name())
            || agents[..index]
                .iter()
                .any(|earlier| earlier.name() == agent.name());
        if duplicate {
            return Err(DefinitionError::DuplicateAgent {
                agent: agent.name().to_string(),
            });
        }
        if let Some(target) = agent
            .persistent_agents()
            .iter()
            .find(|persistent| !known(&persistent.agent))
        {
            return Err(DefinitionError::UnknownPersistentAgent {
                agent: agent.name().to_string(),
                target: target.agent.clone(),
            });
        }
        for tool in agent.tools() {
            if let ToolKind::SubAgent { agent: target } = tool.kind() {
                if !known(target) {
                    return Err(DefinitionError::UnknownSubAgent {
                        agent: agent.name().to_string(),
                        tool: tool.name().to_string(),
                        target: target.clone(),
                    });
                }
            }
        }
    }
    for agent in agents {
        shared
            .agents
            .insert(agent.name().to_string(), Arc::new(agent));
    }
    Ok(())
}
