//! The one door into the session core: every input is an [`Input`], and [`Session::apply`] is
//! the only way a session's state changes. Each input has one handler (in `step.rs`,
//! `suspend.rs`, `resume.rs`, `cut.rs`, `children.rs`, `companions.rs`); each returns a
//! [`Transition`]: the writes to make durable, then the effects, as data.
//!
//! Nothing here reads a clock, generates an id or touches a store: `now` and every run id
//! come in with the input (`now` is kept in the apply's context, `apply_cx.rs`, for every
//! handler to read), so the same inputs give the same commits, byte for byte.

use serde_json::{Map, Value};

use super::apply_cx::ApplyCx;
use super::child_calls::{ChildReport, ChildStart, ReportedChild};
use super::core::Session;
use super::remote_children::ReportPosition;
use super::step::Outside;
use super::{ChildState, Submission, Transition};
use crate::error::Error;
use crate::llm::{LlmError, ModelReply};
use crate::remote::RemoteParent;
use crate::types::ids::RunId;
use crate::types::message::ToolOutcome;
use crate::types::stream::Chunk;

/// An input to the state machine.
#[derive(Debug)]
pub(crate) enum Input {
    /// A user message from outside: a new session's first run, or a new turn. `agent` is the
    /// agent the caller asked for; with `new_only`, only a session that does not exist yet
    /// takes it (a remote parent's start, replayed or not); `remote_parent` makes a new
    /// session the remote child of a session of another server.
    Execute {
        run_id: RunId,
        message: String,
        agent: String,
        new_only: bool,
        remote_parent: Option<RemoteParent>,
    },
    /// Continue a suspended or interrupted run as the run `run_id` (a resume while a run is in
    /// progress joins it).
    Resume { run_id: RunId },
    /// The session's resume-due entry fell due (`schema::RESUME_DUE`): resume as the run
    /// `run_id` if an automatic resume is still owed, else remove the entry.
    ResumeDue { run_id: RunId },
    /// An answer for one of this session's pending calls.
    Submit {
        tool_call_id: String,
        submission: Submission,
    },
    /// The commit of an accepted answer failed: it is forgotten.
    AnswerLost { tool_call_id: String },
    /// A call's deadline passed.
    Timeout { tool_call_id: String },
    /// A durable interrupt.
    Interrupt,
    /// A terminal abort.
    Abort,
    /// The session was just read back from the store: a run recorded as running has no live
    /// actor (a crash cut it, or a commit of this actor failed).
    Recover,
    /// The session was read back after its actor panicked: its parent learns that the run
    /// was cut.
    Restarted,
    /// A commit of this session failed (before it is read back): its parent learns why.
    CommitFailed { reason: String },
    /// The model answered a step.
    ModelReplied {
        run_id: RunId,
        step: u32,
        reply: Result<ModelReply, LlmError>,
    },
    /// The tools a step (or a resume) dispatched finished.
    ToolsFinished {
        run_id: RunId,
        step: u32,
        outcomes: Vec<FinishedCall>,
    },
    /// This session's parent starts it as the child of a sub-agent call, or gives a companion
    /// a new turn (or re-attaches to either); `run_id` is the run it would start.
    StartChild { run_id: RunId, start: ChildStart },
    /// The parent goes on (a resume cascading down, a re-attach): resume if possible, as the
    /// run `run_id`, and report where this session stands.
    Wake { run_id: RunId },
    /// Children reported where they stand (in the order they did; one or many, heard
    /// together): recorded in one commit.
    ChildrenReported { reports: Vec<ReportedChild> },
    /// A remote child's driver reported, with the calls the child's tree waits on.
    RemoteReported {
        tool_call_id: String,
        report: ChildReport,
        chunks: Vec<Chunk>,
        calls: Vec<crate::remote::RemoteCall>,
        as_of: u64,
        watch: bool,
    },
    /// An answer for a call under the remote child of `tool_call_id` was accepted at the
    /// remote (the root forwarded it there).
    RemoteAnswered { tool_call_id: String },
    /// A remote child's server did not answer its driver (after the policy's tries).
    RemoteUnreachable {
        tool_call_id: String,
        reason: String,
    },
    /// Background recovery learned how children recorded as running ended.
    Reconciled { results: Vec<(String, ChildState)> },
}

impl Input {
    /// Whether handling it may read the conversation (which an idle session keeps on disk
    /// only): the caller loads it first.
    pub(crate) fn needs_conversation(&self) -> bool {
        // A start only for a new session needs none: a new session has no conversation, and
        // one that exists refuses it.
        matches!(
            self,
            Input::Execute {
                new_only: false,
                ..
            } | Input::Resume { .. }
                | Input::ResumeDue { .. }
                | Input::Interrupt
                | Input::Abort
                | Input::StartChild { .. }
                | Input::Wake { .. }
        )
    }
}

/// One tool call's outcome, with the custom-state keys its handler set.
#[derive(Debug, Clone)]
pub(crate) struct FinishedCall {
    pub(crate) tool_call_id: String,
    pub(crate) outcome: ToolOutcome,
    pub(crate) updates: Map<String, Value>,
    /// A call a crash cut whose tool's check could not say whether its effect happened: it
    /// becomes a `reconcile` call for a person (`outcome` is not recorded).
    pub(crate) unsettled: bool,
    /// The handler asked a person for input ([`crate::definition::ToolContext::ask`]): the
    /// call becomes an `input` call (`outcome` is not recorded).
    pub(crate) asked: Option<Asked>,
}

/// A question a call's handler asked, with the call's idempotency key (a question that comes
/// back after its step was cut is closed by it).
#[derive(Debug, Clone)]
pub(crate) struct Asked {
    pub(crate) request: crate::definition::InputRequest,
    pub(crate) tool: String,
    pub(crate) idempotency_key: String,
}

impl Session {
    /// Applies one input at time `now`: the only way a session's state changes. Each handler
    /// writes what it stages and asks for into one [`ApplyCx`], which becomes the transition.
    ///
    /// # Errors
    /// A refusal that changes nothing and that the caller is answered with (a second
    /// `Execute` while running, an aborted session, a resume with nothing to resume, …).
    pub(crate) fn apply(&mut self, input: Input, now: u64) -> Result<Transition, Error> {
        let mut cx = ApplyCx::new(now);
        self.handle(&mut cx, input)?;
        if self.policy.auto_resume {
            cx.record_resume_due();
        }
        cx.record_remote_stops();
        Ok(cx.into_transition())
    }

    /// Hands `input` to its handler.
    fn handle(&mut self, cx: &mut ApplyCx, input: Input) -> Result<(), Error> {
        match input {
            Input::Execute {
                run_id,
                message,
                agent,
                new_only,
                remote_parent,
            } => {
                let outside = Outside {
                    agent,
                    new_only,
                    remote_parent,
                };
                self.execute_from_outside(cx, run_id, message, outside)?;
            }
            Input::Resume { run_id } => self.resume(cx, run_id)?,
            Input::ResumeDue { run_id } => self.resume_due(cx, run_id)?,
            Input::Submit {
                tool_call_id,
                submission,
            } => self.submit(cx, &tool_call_id, submission),
            Input::AnswerLost { tool_call_id } => self.revert_answer(&tool_call_id),
            Input::Timeout { tool_call_id } => self.timeout(cx, &tool_call_id),
            Input::Interrupt => self.interrupt(cx),
            Input::Abort => self.abort(cx),
            Input::Recover => self.recover_after_crash(cx),
            Input::Restarted => self.restarted(cx),
            Input::CommitFailed { reason } => self.commit_failed(cx, &reason),
            Input::ModelReplied {
                run_id,
                step,
                reply,
            } => self.model_replied(cx, run_id, step, reply),
            Input::ToolsFinished {
                run_id,
                step,
                outcomes,
            } => self.tools_finished(cx, run_id, step, outcomes),
            Input::StartChild { run_id, start } => self.start_child(cx, run_id, start),
            Input::Wake { run_id } => self.wake(cx, run_id),
            Input::ChildrenReported { reports } => self.children_reported(cx, reports),
            Input::RemoteReported {
                tool_call_id,
                report,
                chunks,
                calls,
                as_of,
                watch,
            } => {
                let position = ReportPosition { as_of, watch };
                self.remote_reported(cx, &tool_call_id, report, chunks, calls, position);
            }
            Input::RemoteAnswered { tool_call_id } => self.remote_answered(cx, &tool_call_id),
            Input::RemoteUnreachable {
                tool_call_id,
                reason,
            } => self.remote_unreachable(cx, &tool_call_id, &reason),
            Input::Reconciled { results } => self.reconciled(cx, results),
        }
        Ok(())
    }
}
