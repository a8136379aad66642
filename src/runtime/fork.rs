//! Time travel and forks: a session's checkpoints, the session as it was at one, and a new
//! session whose history is the source's up to one ([`Runtime::checkpoints`],
//! [`Runtime::state_at`], [`Runtime::fork`]). ARCHITECTURE.md, "Checkpoints and forks", says
//! what a fork keeps and what it asks again.

use super::read_error::ReadError;
use super::Runtime;
use crate::definition::ToolKind;
use crate::engine::actor::SessionMsg;
use crate::error::Error;
use crate::store::schema::{self, history};
use crate::types::checkpoint::PastState;
use crate::types::checkpoint::{Checkpoint, CheckpointId, ForkError, ForkOptions, ForkOrigin};
use crate::types::hooks::HookEvent;
use crate::types::ids::SessionId;
use crate::types::message::Message;
use crate::types::record::Status;

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
    /// calls that had no result yet. `None` if the session has no such checkpoint.
    ///
    /// # Errors
    /// As [`Runtime::checkpoints`].
    pub async fn state_at(
        &self,
        id: &SessionId,
        checkpoint: CheckpointId,
    ) -> Result<Option<PastState>, ReadError> {
        self.ensure_open()?;
        let history = self.read(history::load_history(self.store(), id, Some(checkpoint)).await)?;
        self.require_session_if(history.is_empty(), id).await?;
        Ok(history::state_at(id, &history, checkpoint))
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
    /// let first = runtime.checkpoints(&id).await?[0].id;
    /// let fork = runtime
    ///     .fork(&id, first, ForkOptions::new().edit_last_message("try it another way"))
    ///     .await?;
    /// assert_eq!(runtime.session(&fork).await?.forked_from.map(|origin| origin.checkpoint), Some(first));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Fork`] (nothing written) for a checkpoint the session does not have, a
    /// sub-agent as the source, sub-agents at work at the checkpoint, persistent sub-agents,
    /// a taken id; [`Error::UnknownSession`], [`Error::UnknownAgent`] (the source's agent is
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
        let unknown = || ForkError::UnknownCheckpoint {
            session: source.clone(),
            checkpoint,
        };
        let at = copied
            .last()
            .filter(|entry| entry.seq == checkpoint.0)
            .and_then(|entry| entry.record.clone())
            .ok_or_else(unknown)?;
        if at.parent.is_some() || at.remote_parent.is_some() {
            return Err(ForkError::NotARoot {
                session: source.clone(),
                root: at.root.clone(),
            }
            .into());
        }
        let companions = self.read(schema::load_companions(store, source).await)?;
        if !companions.is_empty() {
            return Err(ForkError::HasCompanions {
                session: source.clone(),
                names: companions.into_iter().map(|c| c.name).collect(),
            }
            .into());
        }
        let agent = self.agent(&at.agent)?;
        let mut continue_with = options.message;
        let at = match options.edit_last_message {
            Some(text) => {
                continue_with = Some(text);
                cut_before_last_user_message(&mut copied, source, checkpoint)?
            }
            None => at,
        };
        let open = history::checkpoints(source, &copied)
            .pop()
            .map(|last| last.open_calls)
            .unwrap_or_default();
        let at_work: Vec<String> = open
            .iter()
            .filter(|call| {
                matches!(
                    agent.tool(&call.name).map(|tool| tool.def.kind()),
                    Some(ToolKind::SubAgent { .. } | ToolKind::RemoteSubAgent { .. })
                )
            })
            .map(|call| call.id.clone())
            .collect();
        if !at_work.is_empty() {
            return Err(ForkError::SubAgentsAtWork {
                session: source.clone(),
                checkpoint,
                calls: at_work,
            }
            .into());
        }
        let fork = options.id.unwrap_or_else(SessionId::generate);
        if self
            .read(schema::load_lineage(store, &fork).await)?
            .is_some()
        {
            return Err(ForkError::IdTaken(fork).into());
        }
        let origin = ForkOrigin {
            session: source.clone(),
            checkpoint,
        };
        let run = history::current_run(&copied, &at);
        let now = self.now_ms();
        let batch = history::fork_batch(&copied, &at, run.as_ref(), &fork, &origin, now)?;
        self.ask(&fork, |reply| SessionMsg::Fork { batch, reply })
            .await?;
        tracing::info!(session = %fork, source = %source, checkpoint = %checkpoint, "session.forked");
        crate::types::hooks::notify(
            self.inner.shared.hooks.as_ref(),
            &HookEvent::SessionForked {
                session: fork.clone(),
                forked_from: origin,
            },
        );
        match continue_with {
            Some(message) => {
                self.execute_on(&fork, agent.name(), message).await?;
            }
            // Its calls wait again, under a new run: nothing runs (only client calls and
            // approvals can wait in a suspension of a session without sub-agents at work).
            None if at.status == Status::SuspendedClientTool => {
                self.resume(&fork).await?;
            }
            None => {}
        }
        Ok(fork)
    }
}

/// Cuts `history` (the source's, up to `checkpoint`) just before the entry that recorded its
/// last user message, and returns the record the fork starts from there.
fn cut_before_last_user_message(
    history: &mut Vec<history::LogEntry>,
    source: &SessionId,
    checkpoint: CheckpointId,
) -> Result<crate::types::record::SessionRecord, ForkError> {
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
    history.truncate(with_message);
    Ok(
        match history.last().and_then(|entry| entry.record.clone()) {
            Some(record) => record,
            None => history::before_first_message(&first),
        },
    )
}
