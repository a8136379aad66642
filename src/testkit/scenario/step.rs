//! A validated step: its op with typed arguments, and what it expects.

use crate::types::ids::SessionId;

use super::format::{AgentSpec, CheckpointSpec, CommitSpec, Expect, SubmitStep};

/// The op names, in the spec's order (for messages).
pub(crate) const OP_NAMES: [&str; 14] = [
    "define",
    "execute",
    "submit",
    "resume",
    "interrupt",
    "abort",
    "advance_clock",
    "evict",
    "restart",
    "crash_before",
    "check",
    "checkpoints",
    "state_at",
    "fork",
];

/// One step of a scenario.
#[derive(Debug)]
pub(crate) struct Step {
    pub(crate) op: Op,
    pub(crate) expect: Expect,
}

/// What `evict` stops.
#[derive(Debug)]
pub(crate) enum EvictTarget {
    /// One session.
    Session(SessionId),
    /// Every resident session (`"session": "all"`).
    All,
}

/// An operation against the runtime.
#[derive(Debug)]
pub(crate) enum Op {
    /// Registers one more agent.
    Define(Box<AgentSpec>),
    /// Starts a run (or a new turn) and waits for it to end or suspend.
    Execute {
        agent: String,
        session: SessionId,
        message: String,
    },
    /// Submits a client tool result or an approval. `session` is the session the expectations
    /// look at: the step's `session` (or else the `session_id` of its `raw` envelope), `None`
    /// when there is none or it is not a valid id (a test of `invalid_request`).
    Submit {
        session: Option<SessionId>,
        submit: Box<SubmitStep>,
    },
    /// Resumes a suspended or interrupted session.
    Resume(SessionId),
    /// Durable interrupt.
    Interrupt(SessionId),
    /// Terminal abort.
    Abort(SessionId),
    /// Moves the manual clock and fires the deadlines that passed.
    AdvanceClock { ms: u64 },
    /// Stops resident actors; state stays in the store.
    Evict(EvictTarget),
    /// Drops the runtime and reopens the store.
    Restart,
    /// Arms a crash before the next commit of this kind; every commit fails from there until
    /// `restart`.
    CrashBefore { commit: CommitSpec },
    /// Checks the session as it is now.
    Check(SessionId),
    /// Lists the session's checkpoints.
    Checkpoints(SessionId),
    /// Reads the session as it was at a checkpoint.
    StateAt {
        session: SessionId,
        checkpoint: CheckpointSpec,
    },
    /// Forks `source` at a checkpoint into `fork` (the session the expectations look at).
    Fork {
        source: SessionId,
        checkpoint: CheckpointSpec,
        fork: SessionId,
        message: Option<String>,
        edit_message: Option<String>,
        answers: Vec<(String, crate::types::ForkAnswer)>,
    },
}

impl Op {
    /// The op's name as written in the file.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Op::Define(_) => "define",
            Op::Execute { .. } => "execute",
            Op::Submit { .. } => "submit",
            Op::Resume(_) => "resume",
            Op::Interrupt(_) => "interrupt",
            Op::Abort(_) => "abort",
            Op::AdvanceClock { .. } => "advance_clock",
            Op::Evict(_) => "evict",
            Op::Restart => "restart",
            Op::CrashBefore { .. } => "crash_before",
            Op::Check(_) => "check",
            Op::Checkpoints(_) => "checkpoints",
            Op::StateAt { .. } => "state_at",
            Op::Fork { .. } => "fork",
        }
    }

    /// The session the step's expectations look at, if the op names one.
    pub(crate) fn session(&self) -> Option<&SessionId> {
        match self {
            Op::Execute { session, .. }
            | Op::Resume(session)
            | Op::Interrupt(session)
            | Op::Abort(session)
            | Op::Check(session)
            | Op::Checkpoints(session)
            | Op::StateAt { session, .. }
            | Op::Fork { fork: session, .. }
            | Op::Evict(EvictTarget::Session(session)) => Some(session),
            Op::Submit { session, .. } => session.as_ref(),
            Op::Define(_)
            | Op::AdvanceClock { .. }
            | Op::Evict(EvictTarget::All)
            | Op::Restart
            | Op::CrashBefore { .. } => None,
        }
    }
}
