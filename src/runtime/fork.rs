//! Time travel and forks: a session's checkpoints, the session as it was at one, and a new
//! session whose history is the source's up to one ([`Runtime::checkpoints`],
//! [`Runtime::state_at`], [`Runtime::fork`]). ARCHITECTURE.md, "Checkpoints and forks", says
//! what a fork keeps and what it asks again.

use futures::future::BoxFuture;

use super::read_error::ReadError;
use super::Runtime;
use crate::definition::ToolKind;
use crate::engine::actor::SessionMsg;
use crate::error::Error;
use crate::store::schema::history::Placement;
use crate::store::schema::{self, history};
use crate::types::checkpoint::{
    Checkpoint, CheckpointId, Compaction, ForkAnswer, ForkError, ForkOptions, ForkOrigin,
    Retention, StateAt,
};
use crate::types::hooks::HookEvent;
use crate::types::ids::RunId;
use crate::types::ids::SessionId;
use crate::types::message::Message;
use crate::types::record::{ChildCall, ChildState, SessionRecord, Status};

impl Runtime {
    /// The session's checkpoints, oldest first: one for every commit that recorded something
    /// of it (a run's start, each step's model reply and results, a suspension, a run's end),
    /// with what the commit recorded. Checkpoints are positions in the session's durable log,
    /// which is append-only: they cost no write of their own and keep their ids.
    ///
    /// ```
    /// # async fn demo(runtime: dormant::Runtime, id: dormant::SessionId) -> anyhow::Result<()> {
    /// for checkpoint in runtime.checkpoints(&id).await? {
    ///     println!("{} turn {} step {}: {}", checkpoint.id, checkpoint.turn, checkpoint.step, checkpoint.status);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ReadError::UnknownSession`], or a typed error if the stored log is unreadable.
    pub async fn checkpoints(&self, id: &SessionId) -> Result<Vec<Checkpoint>, ReadError> {
        self.ensure_open()?;
        let history = self.read(history::load_history(self.store(), id, None).await)?;
        self.require_session_if(history.is_empty(), id).await?;
        Ok(history::checkpoints(id, &history))
    }

    /// The session as it was at `checkpoint`: its record, conversation and runs then, and the
    /// calls that had no result yet; or that the checkpoint was compacted away, or that the
    /// session has no such checkpoint.
    ///
    /// # Errors
    /// As [`Runtime::checkpoints`].
    pub async fn state_at(
        &self,
        id: &SessionId,
        checkpoint: CheckpointId,
    ) -> Result<StateAt, ReadError> {
        self.ensure_open()?;
        let history = self.read(history::load_history(self.store(), id, Some(checkpoint)).await)?;
        self.require_session_if(history.is_empty(), id).await?;
        if let Some(mut past) = self.read(history::state_at(id, &history, checkpoint))? {
            if let Ok(agent) = self.agent(&past.record.agent) {
                past.children = past
                    .checkpoint
                    .open_calls
                    .iter()
                    .filter(|call| {
                        let tool = agent.tool(&call.name).map(|tool| tool.def.kind());
                        matches!(tool, Some(ToolKind::SubAgent { .. }))
                    })
                    .map(|call| id.ephemeral_child(&call.id))
                    .collect();
            }
            return Ok(StateAt::Found(Box::new(past)));
        }
        Ok(match self.compacted_before(id, checkpoint).await? {
            Some(oldest_kept) => StateAt::Compacted { oldest_kept },
            None => StateAt::Unknown,
        })
    }

    /// Merges the checkpoints of the session that `retention` lets go into the oldest kept
    /// (the newest is always kept), as an agent's [`retention`](crate::definition::AgentBuilder::retention)
    /// does once a run ends: the session reads as before, and the checkpoints merged can no
    /// longer be read or forked. Done by the session's actor, between its commits.
    ///
    /// ```
    /// # async fn demo(runtime: dormant::Runtime, id: dormant::SessionId) -> Result<(), dormant::Error> {
    /// use dormant::types::Retention;
    /// let done = runtime.compact_checkpoints(&id, Retention::keep_last(10)).await?;
    /// println!("{} merged, the oldest now {}", done.removed, done.oldest_kept);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::UnknownSession`], a store failure.
    pub async fn compact_checkpoints(
        &self,
        id: &SessionId,
        retention: Retention,
    ) -> Result<Compaction, Error> {
        self.session(id).await?;
        self.ask(id, |reply| SessionMsg::Compact {
            retention,
            reply: Some(reply),
        })
        .await
    }

    /// The oldest checkpoint of `id`, if `checkpoint` is older (compacted away).
    async fn compacted_before(
        &self,
        id: &SessionId,
        checkpoint: CheckpointId,
    ) -> Result<Option<CheckpointId>, ReadError> {
        let oldest = self.read(history::oldest_checkpoint(self.store(), id).await)?;
        Ok(oldest
            .map(|(oldest, _)| oldest)
            .filter(|oldest| checkpoint < *oldest))
    }

    /// Makes a new session whose history is `source`'s up to `checkpoint`, and returns its id
    /// once it is durable (and its first run, if the options start one, has settled). The
    /// source is not touched and may keep running meanwhile.
    ///
    /// Nothing is done twice: a tool result recorded up to the checkpoint is the fork's as
    /// it is, never run again. Where the checkpoint is a suspension, its client calls and
    /// approvals wait again in the fork, with new deadlines, under a new run (so an approval
    /// id of the source is not one of the fork's): answers the source got later are not the
    /// fork's, and an approval is asked again. Where the checkpoint is inside a step, the fork
    /// stands interrupted there, and its `resume` goes on as the source would have after a
    /// crash at that point: a server call in flight gets `tool_durability_error` (unless its
    /// tool is safe to retry), never a second run. With [`ForkOptions::message`] the fork
    /// continues with a new message instead; with [`ForkOptions::edit_last_message`] its
    /// history ends before the last user message and it runs with the edited one.
    ///
    /// ```
    /// # async fn demo(runtime: dormant::Runtime, id: dormant::SessionId) -> anyhow::Result<()> {
    /// use dormant::types::ForkOptions;
    /// let checkpoints = runtime.checkpoints(&id).await?;
    /// let first = checkpoints.first().ok_or(anyhow::anyhow!("no checkpoint"))?.id;
    /// let fork = runtime
    ///     .fork(&id, first, ForkOptions::new().edit_last_message("try it another way"))
    ///     .await?;
    /// assert_eq!(runtime.session(&fork).await?.forked_from.map(|origin| origin.checkpoint), Some(first));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Fork`] (nothing written) for a checkpoint the session does not have or that
    /// was compacted away, a sub-agent as the source, sub-agents at work at a checkpoint the
    /// tree has moved on from, remote sub-agents at work, persistent sub-agents, a taken id; [`Error::UnknownSession`], [`Error::UnknownAgent`] (the source's agent is
    /// not defined here), and the errors of the run the options start.
    pub async fn fork(
        &self,
        source: &SessionId,
        checkpoint: CheckpointId,
        options: ForkOptions,
    ) -> Result<SessionId, Error> {
        self.ensure_open()?;
        if options.message.is_some() && options.edit_last_message.is_some() {
            return Err(ForkError::MessageAndEdit.into());
        }
        let store = self.store();
        let mut copied = self.read(history::load_history(store, source, Some(checkpoint)).await)?;
        self.require_session_if(copied.is_empty(), source).await?;
        let found = copied
            .last()
            .filter(|entry| entry.seq == checkpoint.0)
            .and_then(|entry| entry.record.clone());
        let Some(at) = found else {
            return Err(match self.compacted_before(source, checkpoint).await? {
                Some(oldest_kept) => ForkError::Compacted {
                    session: source.clone(),
                    checkpoint,
                    oldest_kept,
                },
                None => ForkError::UnknownCheckpoint {
                    session: source.clone(),
                    checkpoint,
                },
            }
            .into());
        };
        if at.parent.is_some() || at.remote_parent.is_some() {
            return Err(ForkError::NotARoot {
                session: source.clone(),
                root: at.root.clone(),
            }
            .into());
        }
        let mut continue_with = options.message;
        let at = match options.edit_last_message {
            Some(text) => {
                continue_with = Some(text);
                cut_before_last_user_message(&mut copied, source, checkpoint)?
            }
            None => at,
        };
        if continue_with.is_some() && !options.answers.is_empty() {
            return Err(ForkError::MessageAndEdit.into());
        }
        let fork = options.id.unwrap_or_else(SessionId::generate);
        if self
            .read(schema::load_lineage(store, &fork).await)?
            .is_some()
        {
            return Err(ForkError::IdTaken(fork).into());
        }
        let answers = plan_answers(
            source,
            checkpoint,
            &copied,
            &at,
            &*self.agent(&at.agent)?,
            options.answers,
        )?;
        self.check_answer_sizes(source, checkpoint, &answers)?;
        let latest = self.latest_checkpoint(source).await?;
        let suspended = at.status;
        let agent = self.agent(&at.agent)?;
        let mut batch = history::fork_batch(&fork);
        let place = Placement {
            id: fork.clone(),
            root: fork.clone(),
            parent: None,
        };
        let cut = Cut {
            source: source.clone(),
            checkpoint,
            copied,
            at,
            latest: latest == Some(checkpoint),
        };
        // A new message closes whatever waited: only a fork that stays at the checkpoint
        // takes the sub-agents at work there with it.
        let from_latest = self
            .write_fork(&mut batch, cut, place, continue_with.is_none())
            .await?;
        let now = self.now_ms();
        let mut submits = Vec::new();
        for planned in answers.planned {
            match planned {
                Planned::Given {
                    call,
                    position,
                    answer,
                } => self.read(history::put_given_result(
                    &mut batch,
                    &fork,
                    &call,
                    position,
                    answer,
                    &answers.at,
                    now,
                ))?,
                Planned::Submit { call, answer } => submits.push((call, answer)),
            }
        }
        if from_latest && self.latest_checkpoint(source).await? != latest {
            // The tree moved on while its children were read: they may be past the checkpoint.
            return Err(ForkError::SubAgentsMovedOn {
                session: source.clone(),
                checkpoint,
                calls: Vec::new(),
            }
            .into());
        }
        self.ask(&fork, |reply| SessionMsg::Fork { batch, reply })
            .await?;
        let origin = ForkOrigin {
            session: source.clone(),
            checkpoint,
        };
        tracing::info!(session = %fork, source = %source, checkpoint = %checkpoint, "session.forked");
        crate::types::hooks::notify(
            self.inner.shared.hooks.as_ref(),
            &HookEvent::SessionForked {
                session: fork.clone(),
                forked_from: origin,
            },
        );
        let continued = self
            .go_on(
                &fork,
                checkpoint,
                &agent,
                continue_with,
                suspended,
                answers.any,
                submits,
            )
            .await;
        if let Err(error) = continued {
            return Err(ForkError::ContinuationFailed {
                fork,
                code: error.code().to_string(),
                reason: error.to_string(),
            }
            .into());
        }
        Ok(fork)
    }
}

/// The answers a fork starts with, checked against the calls open at its cut.
struct PlannedAnswers {
    planned: Vec<Planned>,
    /// The record at the cut (the run the given results belong to).
    at: SessionRecord,
    /// Whether there are any.
    any: bool,
}

/// What becomes of one answer.
enum Planned {
    /// A server call in flight at the checkpoint: its result, written with the fork.
    Given {
        call: crate::types::message::ToolCall,
        position: usize,
        answer: crate::types::record::Answer,
    },
    /// A client call or an approval waiting: submitted to the fork once it waits again.
    Submit { call: String, answer: ForkAnswer },
}

/// Checks each answer against the call it names, among those without a result at the cut.
fn plan_answers(
    source: &SessionId,
    checkpoint: CheckpointId,
    copied: &[history::LogEntry],
    at: &SessionRecord,
    agent: &crate::definition::AgentDefinition,
    answers: Vec<(String, ForkAnswer)>,
) -> Result<PlannedAnswers, Error> {
    use crate::types::record::Answer;
    let any = !answers.is_empty();
    let open = history::checkpoints(source, copied)
        .pop()
        .map(|last| last.open_calls)
        .unwrap_or_default();
    let approved = if any {
        history::approved_calls(source, copied).map_err(Error::from)?
    } else {
        Default::default()
    };
    let suspension = at.status == Status::SuspendedClientTool;
    let mut planned = Vec::new();
    for (id, answer) in answers {
        let refuse = |reason: &str| ForkError::CannotAnswer {
            session: source.clone(),
            checkpoint,
            call: id.clone(),
            reason: reason.to_string(),
        };
        let Some((position, call)) = open.iter().enumerate().find(|(_, call)| call.id == id) else {
            return Err(refuse("no call of that id is without a result there").into());
        };
        let Some(tool) = agent.tool(&call.name) else {
            return Err(refuse("its tool is not one of the agent's").into());
        };
        let approval = match tool.def.approval {
            crate::definition::Approval::Never => Some(false),
            crate::definition::Approval::Always | crate::definition::Approval::Editable => {
                Some(true)
            }
            crate::definition::Approval::When(_) => None,
        };
        match (tool.def.kind(), answer) {
            (ToolKind::Client { .. }, ForkAnswer::Result(value)) => {
                let errors = tool
                    .output
                    .as_ref()
                    .map(|schema| schema.errors(&value))
                    .unwrap_or_default();
                if !errors.is_empty() {
                    let reason = format!(
                        "the result does not match the tool's output schema: {}",
                        errors.join("; ")
                    );
                    return Err(refuse(&reason).into());
                }
                planned.push(Planned::Submit {
                    call: id,
                    answer: ForkAnswer::Result(value),
                });
            }
            (ToolKind::Client { .. }, answer @ ForkAnswer::Error(_)) => {
                planned.push(Planned::Submit { call: id, answer });
            }
            (ToolKind::Client { .. }, _) => {
                return Err(refuse("a client tool takes a result or an error").into());
            }
            // A tool that never needs approval and is open at a suspension asked a person for
            // input there: the fork does not answer its question (the call's work before it
            // asked belongs to the source), it goes on as after a crash (run again if safe to
            // retry, asking again in the fork, else `tool_durability_error`).
            (ToolKind::Server(_), _)
                if suspension && approval == Some(false) && !approved.contains_key(&id) =>
            {
                return Err(refuse(
                    "it asked a person for input at the checkpoint: a fork does not answer it (it runs again in the fork if it is safe to retry, and asks again there)",
                )
                .into());
            }
            (ToolKind::Server(_), answer) => {
                // At a suspension an open server call waits for its approval; elsewhere it was
                // running, unless it needs an approval it never got.
                let waits = !approved.contains_key(&id) && (suspension || approval == Some(true));
                if !suspension && !approved.contains_key(&id) && approval.is_none() {
                    return Err(refuse("whether it needs an approval depends on its input: fork at the suspension that asked").into());
                }
                match (waits, answer) {
                    (
                        true,
                        answer @ (ForkAnswer::Approve | ForkAnswer::Deny(_) | ForkAnswer::Error(_)),
                    ) => {
                        planned.push(Planned::Submit { call: id, answer });
                    }
                    (true, ForkAnswer::Result(_)) => {
                        return Err(refuse(
                            "it waits for an approval: approve, deny, or give an error",
                        )
                        .into());
                    }
                    (false, ForkAnswer::Result(value)) => planned.push(Planned::Given {
                        call: call.clone(),
                        position,
                        answer: Answer::Result(value),
                    }),
                    (false, ForkAnswer::Error(error)) => planned.push(Planned::Given {
                        call: call.clone(),
                        position,
                        answer: Answer::Error(error),
                    }),
                    (false, _) => {
                        return Err(refuse(
                            "it was running at the checkpoint: give its result or an error",
                        )
                        .into());
                    }
                }
            }
            _ => return Err(refuse("a sub-agent's call is answered by its sub-agent").into()),
        }
    }
    Ok(PlannedAnswers {
        planned,
        at: at.clone(),
        any,
    })
}

impl Runtime {
    /// What a fork does once written: the new message's run, or the resume that makes its
    /// calls wait again (and records the results given for calls that were running), then the
    /// answers for the calls that wait, and the resume that goes on with them.
    #[allow(clippy::too_many_arguments)]
    async fn go_on(
        &self,
        fork: &SessionId,
        checkpoint: CheckpointId,
        agent: &crate::definition::AgentDefinition,
        message: Option<String>,
        suspended: Status,
        answered: bool,
        submits: Vec<(String, ForkAnswer)>,
    ) -> Result<(), Error> {
        match message {
            Some(message) => {
                self.execute_on(fork, agent.name(), message).await?;
            }
            // Its calls wait again, under a new run, and its forked sub-agents' calls too:
            // nothing runs, only client calls and approvals can wait. With answers it goes on
            // from there (a result given for a call in flight is recorded as the call's).
            None if answered
                || matches!(
                    suspended,
                    Status::SuspendedClientTool | Status::SuspendedAwaitingChildren
                ) =>
            {
                self.resume(fork).await?;
            }
            None => {}
        }
        if !submits.is_empty() {
            for (call, answer) in submits {
                self.answer_fork(fork, checkpoint, call, answer).await?;
            }
            self.resume(fork).await?;
        }
        Ok(())
    }

    /// Refuses, before anything is written, an answer the submit contract would refuse for its
    /// size or depth (`max_result_bytes`, the JSON depth limit).
    fn check_answer_sizes(
        &self,
        source: &SessionId,
        checkpoint: CheckpointId,
        answers: &PlannedAnswers,
    ) -> Result<(), Error> {
        use crate::session::submit::Submit;
        for planned in &answers.planned {
            let (call, submit) = match planned {
                Planned::Submit {
                    call,
                    answer: ForkAnswer::Result(value),
                } => (
                    call,
                    Submit::result(source.as_str(), call.as_str(), value.clone()),
                ),
                Planned::Submit {
                    call,
                    answer: ForkAnswer::Error(error),
                } => (
                    call,
                    Submit::error(source.as_str(), call.as_str(), error.clone()),
                ),
                Planned::Given { call, answer, .. } => match answer {
                    crate::types::record::Answer::Result(value) => (
                        &call.id,
                        Submit::result(source.as_str(), call.id.as_str(), value.clone()),
                    ),
                    crate::types::record::Answer::Error(error) => (
                        &call.id,
                        Submit::error(source.as_str(), call.id.as_str(), error.clone()),
                    ),
                    _ => continue,
                },
                Planned::Submit { .. } => continue,
            };
            if let Err(refused) = submit.check(self.limits()) {
                return Err(ForkError::CannotAnswer {
                    session: source.clone(),
                    checkpoint,
                    call: call.clone(),
                    reason: format!("the submit contract refuses it: {}", refused.code()),
                }
                .into());
            }
        }
        Ok(())
    }

    /// Submits one of a fork's answers to the call that waits again in the fork.
    async fn answer_fork(
        &self,
        fork: &SessionId,
        checkpoint: CheckpointId,
        call: String,
        answer: ForkAnswer,
    ) -> Result<(), Error> {
        use crate::session::submit::{Submit, SubmitOutcome};
        let submit = match answer {
            ForkAnswer::Result(value) => Submit::result(fork.as_str(), call.as_str(), value),
            ForkAnswer::Error(error) => Submit::error(fork.as_str(), call.as_str(), error),
            ForkAnswer::Approve | ForkAnswer::Deny(_) => {
                let pending = self.pending(fork).await?;
                let id = pending
                    .iter()
                    .find(|entry| entry.tool_call_id == call)
                    .map(|entry| entry.approval_id())
                    .unwrap_or_default();
                let (approved, reason) = match answer {
                    ForkAnswer::Deny(reason) => (false, reason),
                    _ => (true, None),
                };
                Submit::approval(fork.as_str(), call.as_str(), id, approved, reason)
            }
        };
        match self.submit_tool_result(submit).await? {
            SubmitOutcome::Accepted => Ok(()),
            refused => Err(ForkError::CannotAnswer {
                session: fork.clone(),
                checkpoint,
                call,
                reason: format!(
                    "the fork was made, and refused the answer: {}",
                    refused.code()
                ),
            }
            .into()),
        }
    }
}

/// A session's history cut at a checkpoint, to be forked.
struct Cut {
    source: SessionId,
    checkpoint: CheckpointId,
    /// Its log up to the checkpoint.
    copied: Vec<history::LogEntry>,
    /// Its record there.
    at: SessionRecord,
    /// The checkpoint is the session's latest.
    latest: bool,
}

impl Runtime {
    /// The id of `session`'s newest checkpoint, `None` before its first commit.
    async fn latest_checkpoint(&self, session: &SessionId) -> Result<Option<CheckpointId>, Error> {
        let record = self.read(schema::load_record(self.store(), session).await)?;
        Ok(record
            .and_then(|record| record.log_count.checked_sub(1))
            .map(CheckpointId))
    }

    /// Adds to `batch` the writes that make `place` a fork of `cut`, and with `children` the
    /// forks of its sub-agents at work at the checkpoint, each where it stood then (with
    /// theirs); returns whether one of them was placed by being the latest, which holds only
    /// while the tree has not moved on. A sub-agent call whose child never started is left to
    /// the fork's resume, which starts it: in the source, it started after the checkpoint.
    fn write_fork<'a>(
        &'a self,
        batch: &'a mut crate::store::Batch,
        cut: Cut,
        place: Placement,
        children: bool,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let store = self.store();
            let Cut {
                source,
                checkpoint,
                copied,
                at,
                latest,
            } = cut;
            let companions = self.read(schema::load_companions(store, &source).await)?;
            if !companions.is_empty() {
                return Err(ForkError::HasCompanions {
                    session: source,
                    names: companions.into_iter().map(|c| c.name).collect(),
                }
                .into());
            }
            let agent = self.agent(&at.agent)?;
            let open = history::checkpoints(&source, &copied)
                .pop()
                .map(|last| last.open_calls)
                .unwrap_or_default();
            let (mut local, mut remote) = (Vec::new(), Vec::new());
            for (position, call) in open.into_iter().enumerate() {
                match agent.tool(&call.name).map(|tool| tool.def.kind()) {
                    Some(ToolKind::SubAgent { .. }) => local.push((position, call)),
                    Some(ToolKind::RemoteSubAgent { .. }) => remote.push(call.id),
                    _ => {}
                }
            }
            if !children {
                local.clear();
                remote.clear();
            }
            if !remote.is_empty() {
                return Err(ForkError::RemoteSubAgents {
                    session: source,
                    checkpoint,
                    calls: remote,
                }
                .into());
            }
            let mut from_latest = false;
            let now = self.now_ms();
            for (position, parent_call) in local {
                let call = parent_call.id.clone();
                let child = source.ephemeral_child(&call);
                let mut child_log = self.read(history::load_history(store, &child, None).await)?;
                if child_log.is_empty() {
                    continue;
                }
                // Where the child stood at the checkpoint: right after the commit that wrote
                // the last of its chunks the parent had copied by then. Nothing copied yet:
                // only the latest checkpoint says where it stands (its latest checkpoint).
                let forwarded = self.read(history::forwarded_count(&source, &copied, &call))?;
                let moved_on = || ForkError::SubAgentsMovedOn {
                    session: source.clone(),
                    checkpoint,
                    calls: vec![call.clone()],
                };
                let index = if forwarded > 0 {
                    child_log
                        .iter()
                        .position(|entry| {
                            entry
                                .record
                                .as_ref()
                                .is_some_and(|record| record.chunk_count >= forwarded)
                        })
                        .ok_or_else(moved_on)?
                } else if latest {
                    from_latest = true;
                    child_log.len() - 1
                } else {
                    return Err(moved_on().into());
                };
                let child_at = child_log[index].record.clone().ok_or_else(moved_on)?;
                let child_checkpoint = CheckpointId(child_log[index].seq);
                if forwarded > 0
                    && index == 0
                    && child_checkpoint.0 > 0
                    && child_at.chunk_count != forwarded
                {
                    // Compacted past the point: its oldest checkpoint is later than that.
                    return Err(ForkError::Compacted {
                        session: child,
                        checkpoint: child_checkpoint,
                        oldest_kept: child_checkpoint,
                    }
                    .into());
                }
                let child_latest = index + 1 == child_log.len();
                child_log.truncate(index + 1);
                let child_cut = Cut {
                    source: child,
                    checkpoint: child_checkpoint,
                    copied: child_log,
                    at: child_at,
                    latest: child_latest,
                };
                let child_place = Placement {
                    id: place.id.ephemeral_child(&call),
                    root: place.root.clone(),
                    parent: Some((place.id.clone(), call.clone())),
                };
                let entry = ChildCall {
                    tool_call_id: call,
                    tool_name: parent_call.name,
                    child: child_place.id.clone(),
                    run_id: at.current_run.unwrap_or_else(RunId::generate),
                    position: u32::try_from(position).unwrap_or(u32::MAX),
                    started_at_ms: now,
                    state: ChildState::Running,
                    forwarded,
                    companion: None,
                    remote: None,
                    remote_look: None,
                    routed_calls: Vec::new(),
                };
                self.read(history::put_forked_child(batch, &place.id, &entry))?;
                from_latest |= self.write_fork(batch, child_cut, child_place, true).await?;
            }
            let run = self.read(history::current_run(&source, &copied, &at))?;
            let origin = ForkOrigin {
                session: source,
                checkpoint,
            };
            history::write_fork(batch, &copied, &at, run.as_ref(), &place, &origin, now)?;
            Ok(from_latest)
        })
    }
}

/// Cuts `history` (the source's, up to `checkpoint`) just before the entry that recorded its
/// last user message, and returns the record the fork starts from there.
fn cut_before_last_user_message(
    history: &mut Vec<history::LogEntry>,
    source: &SessionId,
    checkpoint: CheckpointId,
) -> Result<SessionRecord, ForkError> {
    let no_message = || ForkError::NoMessageToEdit {
        session: source.clone(),
        checkpoint,
    };
    let with_message = history
        .iter()
        .rposition(|entry| {
            entry
                .messages
                .iter()
                .any(|(_, message)| matches!(message, Message::User { .. }))
        })
        .ok_or_else(no_message)?;
    let first = history
        .first()
        .and_then(|entry| entry.record.clone())
        .ok_or_else(no_message)?;
    if let Some(merged) = history
        .first()
        .filter(|entry| with_message == 0 && entry.seq > 0)
    {
        // The message is in the entry retention merged the older ones into: the history
        // before it is gone as checkpoints.
        return Err(ForkError::Compacted {
            session: source.clone(),
            checkpoint,
            oldest_kept: CheckpointId(merged.seq),
        });
    }
    history.truncate(with_message);
    Ok(
        match history.last().and_then(|entry| entry.record.clone()) {
            Some(record) => record,
            None => history::before_first_message(&first),
        },
    )
}
