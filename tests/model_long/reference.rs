//! The reference model: what each session must look like after every operation, and what
//! every operation must answer, derived from the contract (DESIGN.md, ARCHITECTURE.md's
//! "Waiting on a human") without reading the runtime.

use std::collections::{BTreeMap, HashMap, HashSet};

use dormant::session::NOT_APPROVED;
use dormant::Status;
use serde_json::{json, Value};

/// How long a call waits (the agent's client-tool timeout).
pub(crate) const TIMEOUT_MS: u64 = 10_000;
/// Replies in the script: more than a session ever asks for (it retires first).
pub(crate) const SCRIPT_LEN: usize = 64;
/// A completed session with at least this many replies is checked in full and retired.
pub(crate) const RETIRE_AFTER: usize = 20;

/// The two kinds of pending call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// Client tool `edit`.
    Client,
    /// Approval gate of the server tool `deploy`.
    Approval,
}

/// Reply `k` of the script: its calls (id, kind), or none for a final text.
pub(crate) fn reply(k: usize) -> Vec<(String, Kind)> {
    match k % 4 {
        0 => vec![
            (format!("c{k}a"), Kind::Client),
            (format!("c{k}b"), Kind::Client),
        ],
        1 => vec![
            (format!("c{k}d"), Kind::Approval),
            (format!("c{k}e"), Kind::Client),
        ],
        2 => vec![(format!("c{k}a"), Kind::Client)],
        _ => Vec::new(),
    }
}

/// The tool message a call must end with.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Expect {
    /// This exact result.
    Result(Value),
    /// This exact error text.
    Error(String),
    /// An error the runtime wrote, beginning with this code.
    Code(&'static str),
}

impl Expect {
    /// Whether a recorded outcome is this one.
    pub(crate) fn matches(&self, outcome: &dormant::types::ToolOutcome) -> bool {
        match (self, outcome) {
            (Expect::Result(want), dormant::types::ToolOutcome::Result(got)) => want == got,
            (Expect::Error(want), dormant::types::ToolOutcome::Error(got)) => want == got,
            (Expect::Code(code), dormant::types::ToolOutcome::Error(got)) => got.starts_with(code),
            _ => false,
        }
    }
}

/// An answer as the driver submits it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Answer {
    /// A client result `{"v": n}`.
    Result(Value),
    /// An error text (either kind of call).
    Error(String),
    /// An approval decision.
    Decision {
        approved: bool,
        reason: Option<String>,
    },
}

impl Answer {
    /// The tool message this answer becomes.
    fn expect(&self) -> Expect {
        match self {
            Answer::Result(value) => Expect::Result(value.clone()),
            Answer::Error(text) => Expect::Error(text.clone()),
            // The approved `deploy` echoes its input, `{}`.
            Answer::Decision { approved: true, .. } => Expect::Result(json!({ "echo": {} })),
            Answer::Decision {
                approved: false,
                reason: None,
            } => Expect::Error(NOT_APPROVED.to_string()),
            Answer::Decision {
                approved: false,
                reason: Some(reason),
            } => Expect::Error(format!("{NOT_APPROVED} (reason: {reason})")),
        }
    }

    /// Whether the answer fits a call of `kind`.
    fn fits(&self, kind: Kind) -> bool {
        match self {
            Answer::Error(_) => true,
            Answer::Result(_) => kind == Kind::Client,
            Answer::Decision { .. } => kind == Kind::Approval,
        }
    }
}

/// Where a pending call stands.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum State {
    /// No answer yet (it may be past its deadline without a sweep).
    Waiting,
    /// An answer was accepted.
    Answered(Answer),
    /// The deadline passed and was recorded.
    TimedOut,
}

/// A pending call.
#[derive(Clone, Debug)]
pub(crate) struct Call {
    pub(crate) kind: Kind,
    pub(crate) deadline: u64,
    pub(crate) state: State,
}

/// A pending call as compared with the runtime's: waiting, expired, or answered.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum View {
    Waiting,
    Expired,
    Answered,
    Approved,
}

impl Call {
    /// How the call looks at `now`.
    pub(crate) fn view(&self, now: u64) -> View {
        match &self.state {
            State::Waiting if now < self.deadline => View::Waiting,
            State::Waiting | State::TimedOut => View::Expired,
            State::Answered(Answer::Decision { approved: true, .. }) => View::Approved,
            State::Answered(_) => View::Answered,
        }
    }
}

/// What a submit must answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SubmitCode {
    Accepted,
    AlreadyCompleted,
    UnknownToolCall,
    InvalidResult,
}

/// What a resume must answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ResumeCode {
    /// The run ended (or stayed suspended at a barrier) with this status.
    Ran(Status),
    NotResumable,
}

/// What closes a suspension's pending calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Close {
    /// A resume once no call waits.
    Drain,
    /// A new message.
    Abandon,
    /// An interrupt.
    Interrupt,
}

/// One session as the model predicts it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Session {
    /// Its status; `None` before its first execute.
    pub(crate) status: Option<Status>,
    /// Replies asked of the model so far (assistant messages).
    pub(crate) replies: usize,
    /// Calls pending, by id.
    pub(crate) pending: BTreeMap<String, Call>,
    /// Calls completed and tombstoned: a late submit is `already_completed`.
    pub(crate) settled: HashSet<String>,
    /// Calls an interrupt dropped unanswered: a late submit is `unknown_tool_call`.
    pub(crate) dropped: HashSet<String>,
    /// The tool message each call must end with, once recorded.
    pub(crate) results: HashMap<String, Expect>,
    /// Approved `deploy` calls that ran.
    pub(crate) deploys: u64,
    /// Calls an interrupt dropped whose conversation has no result yet: the next run closes
    /// them with an `interrupted` error.
    pub(crate) dangling: Vec<String>,
}

impl Session {
    /// A run starts: calls an interrupt dropped get their `interrupted` result.
    fn close_dangling(&mut self) {
        for id in std::mem::take(&mut self.dangling) {
            self.results.insert(id, Expect::Code("interrupted"));
        }
    }

    /// Asks the model until it suspends or ends the turn.
    fn run(&mut self, now: u64) {
        self.close_dangling();
        let calls = reply(self.replies);
        self.replies += 1;
        if calls.is_empty() {
            self.status = Some(Status::Completed);
            return;
        }
        for (id, kind) in calls {
            self.pending.insert(
                id,
                Call {
                    kind,
                    deadline: now + TIMEOUT_MS,
                    state: State::Waiting,
                },
            );
        }
        self.status = Some(Status::SuspendedClientTool);
    }

    /// Records every pending call's outcome and tombstones it: drained by a resume, closed by
    /// a new message (`abandon`), or by an interrupt (neither: unanswered calls are dropped).
    fn settle_all(&mut self, now: u64, close: Close) {
        for (id, call) in std::mem::take(&mut self.pending) {
            let expect = match (&call.state, call.view(now)) {
                (State::Answered(Answer::Decision { approved: true, .. }), _) => match close {
                    Close::Drain => {
                        self.deploys += 1;
                        Expect::Result(json!({ "echo": {} }))
                    }
                    // The approved tool never runs.
                    Close::Abandon => Expect::Code("client_tool_abandoned"),
                    Close::Interrupt => Expect::Code("interrupted"),
                },
                (State::Answered(answer), _) => answer.expect(),
                (_, View::Waiting) => match close {
                    Close::Abandon => Expect::Code("client_tool_abandoned"),
                    Close::Drain | Close::Interrupt => {
                        // Dropped without a tombstone; the conversation closes the call when
                        // the session goes on (the model is never sent a call without its
                        // result).
                        self.dangling.push(id.clone());
                        self.dropped.insert(id);
                        continue;
                    }
                },
                _ => Expect::Code("client_tool_timeout"),
            };
            self.results.insert(id.clone(), expect);
            self.settled.insert(id);
        }
    }

    /// A new message.
    pub(crate) fn execute(&mut self, now: u64) {
        if self.status == Some(Status::SuspendedClientTool) {
            self.settle_all(now, Close::Abandon);
        }
        self.run(now);
    }

    /// A new message whose run could not store the model's reply: the turn began (pending
    /// calls closed), then the run ended `interrupted`; the reply is asked again on resume.
    pub(crate) fn fault_mid_execute(&mut self, now: u64) {
        if self.status == Some(Status::SuspendedClientTool) {
            self.settle_all(now, Close::Abandon);
        }
        self.close_dangling();
        self.status = Some(Status::Interrupted);
    }

    /// A resume that drained its answers (and ran approved tools), then could not store the
    /// model's reply.
    pub(crate) fn fault_mid_resume(&mut self, now: u64) {
        self.settle_all(now, Close::Drain);
        self.close_dangling();
        self.status = Some(Status::Interrupted);
    }

    /// A resume.
    pub(crate) fn resume(&mut self, now: u64) -> ResumeCode {
        match self.status {
            Some(Status::SuspendedClientTool) => {
                if self
                    .pending
                    .values()
                    .any(|call| call.view(now) == View::Waiting)
                {
                    return ResumeCode::Ran(Status::SuspendedClientTool);
                }
                self.settle_all(now, Close::Drain);
                self.run(now);
            }
            Some(Status::Interrupted) => self.run(now),
            _ => return ResumeCode::NotResumable,
        }
        ResumeCode::Ran(self.status.unwrap_or(Status::Failed))
    }

    /// An interrupt.
    pub(crate) fn interrupt(&mut self, now: u64) {
        if self.status == Some(Status::SuspendedClientTool) {
            self.settle_all(now, Close::Interrupt);
            self.status = Some(Status::Interrupted);
        }
    }

    /// A submit for call `id`.
    pub(crate) fn submit(
        &mut self,
        id: &str,
        answer: Answer,
        approval_ok: bool,
        now: u64,
    ) -> SubmitCode {
        let Some(call) = self.pending.get_mut(id) else {
            return if self.settled.contains(id) {
                SubmitCode::AlreadyCompleted
            } else {
                SubmitCode::UnknownToolCall
            };
        };
        match call.view(now) {
            View::Waiting => {
                if !answer.fits(call.kind) || !approval_ok {
                    return SubmitCode::InvalidResult;
                }
                call.state = State::Answered(answer);
                SubmitCode::Accepted
            }
            View::Expired => {
                // The deadline is authoritative: the submit records the timeout.
                call.state = State::TimedOut;
                self.results
                    .insert(id.to_string(), Expect::Code("client_tool_timeout"));
                SubmitCode::AlreadyCompleted
            }
            View::Answered | View::Approved => SubmitCode::AlreadyCompleted,
        }
    }

    /// A sweep at `now`: every call past its deadline times out.
    pub(crate) fn sweep(&mut self, now: u64) {
        for (id, call) in self.pending.iter_mut() {
            if call.state == State::Waiting && call.deadline <= now {
                call.state = State::TimedOut;
                self.results
                    .insert(id.clone(), Expect::Code("client_tool_timeout"));
            }
        }
    }

    /// The pending calls as compared: (id, kind, view), by id.
    pub(crate) fn pending_view(&self, now: u64) -> Vec<(String, Kind, View)> {
        self.pending
            .iter()
            .map(|(id, call)| (id.clone(), call.kind, call.view(now)))
            .collect()
    }

    /// Calls that must have exactly one deadline index entry.
    pub(crate) fn armed(&self) -> Vec<String> {
        self.pending
            .iter()
            .filter(|(_, call)| call.state == State::Waiting)
            .map(|(id, _)| id.clone())
            .collect()
    }
}
