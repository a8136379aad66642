//! The core is deterministic: the same inputs, at the same times, give the same commits, byte
//! for byte (every run id comes in with an input; nothing reads a clock or draws an id). The
//! recorded life below applies every kind of [`Input`] at least once, across a root, its child
//! and a second root that a crash cut; `tests_golden.rs` keeps its commits as a golden file.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::json;

use super::child_calls::ChildKind;
use super::*;
use crate::definition::{AgentDefinition, Approval, CompanionMode, ToolDefinition, ToolError};
use crate::llm::ModelReply;
use crate::remote::RemoteCall;
use crate::store::schema::Commit;
use crate::types::ids::{RunId, SessionId};
use crate::types::message::{ToolCall, ToolOutcome};

/// The root of the recorded life.
pub(super) const ROOT: &str = "replayed";
/// The child of the root's sub-agent call `s1`.
pub(super) const CHILD: &str = "replayed-sub-s1";
/// A second root, whose run a crash cut.
pub(super) const CUT: &str = "recovered";

fn lead() -> Arc<AgentDefinition> {
    let server = |name: &str| {
        ToolDefinition::server(name, |_input, _ctx| async {
            Ok::<_, ToolError>(json!(null))
        })
    };
    let built = AgentDefinition::builder("lead")
        .tool(server("lookup"))
        .tool(ToolDefinition::client("edit"))
        .tool(server("deploy").require_approval(Approval::Always))
        .tool(ToolDefinition::sub_agent("delegate", "lead"))
        .tool(ToolDefinition::remote_sub_agent(
            "far",
            "http://remote.invalid",
            "worker",
        ))
        .persistent_agent("helper", CompanionMode::NonBlocking)
        .build();
    Arc::new(built.unwrap_or_else(|error| panic!("valid definition: {error}")))
}

fn run(n: u8) -> RunId {
    format!("01900000-0000-7000-8000-0000000000{n:02x}")
        .parse()
        .unwrap_or_else(|error| panic!("a valid run id: {error}"))
}

fn id(text: &str) -> SessionId {
    text.parse()
        .unwrap_or_else(|error| panic!("a valid id: {error}"))
}

/// One input of the recorded life: to which session, when, and whether it commits.
pub(super) struct Step {
    pub(super) session: &'static str,
    pub(super) input: Input,
    pub(super) now: u64,
    pub(super) commits: bool,
}

fn step(session: &'static str, now: u64, commits: bool, input: Input) -> Step {
    Step {
        session,
        input,
        now,
        commits,
    }
}

fn execute(run_id: RunId, message: &str) -> Input {
    Input::Execute {
        run_id,
        message: message.into(),
        agent: "lead".into(),
        new_only: false,
        remote_parent: None,
    }
}

fn replied(run_id: RunId, step: u32, reply: ModelReply) -> Input {
    Input::ModelReplied {
        run_id,
        step,
        reply: Ok(reply),
    }
}

fn finished(run_id: RunId, step: u32, call: &str, value: serde_json::Value) -> Input {
    Input::ToolsFinished {
        run_id,
        step,
        outcomes: vec![FinishedCall {
            tool_call_id: call.into(),
            outcome: ToolOutcome::Result(value),
            updates: serde_json::Map::from_iter([("last".to_string(), json!(call))]),
            unsettled: false,
            asked: None,
        }],
    }
}

fn reported(call: &str, report: ChildReport) -> Input {
    Input::ChildrenReported {
        reports: vec![ReportedChild {
            tool_call_id: call.into(),
            report,
            chunks: Vec::new(),
        }],
    }
}

fn remote_reported(call: &str, report: ChildReport, calls: Vec<RemoteCall>, as_of: u64) -> Input {
    Input::RemoteReported {
        tool_call_id: call.into(),
        report,
        chunks: Vec::new(),
        calls,
        as_of,
        watch: false,
    }
}

fn unreachable(call: &str) -> Input {
    Input::RemoteUnreachable {
        tool_call_id: call.into(),
        reason: "connection refused".into(),
    }
}

fn submit(call: &str, submission: Submission) -> Input {
    Input::Submit {
        tool_call_id: call.into(),
        submission,
    }
}

fn done(value: &str) -> ChildReport {
    ChildReport::Finished(ToolOutcome::Result(json!(value)))
}

/// A call the remote child of `x1` waits on.
fn remote_call() -> RemoteCall {
    RemoteCall {
        owner: "replayed-sub-x1".into(),
        tool_call_id: "r9".into(),
        tool_name: "ask".into(),
        kind: PendingKind::Client,
        approval_id: None,
        input: json!({ "q": "?" }),
        requested_at_ms: 0,
        deadline_at_ms: 50_000,
        waiting: true,
        answered: false,
        timed_out: false,
        idempotency_key: None,
        request: None,
        question: None,
        binding: None,
        description: None,
        input_schema: None,
        output_schema: None,
        editable: false,
    }
}

/// The root's life: a step with a server tool, a client tool, an approval, a local and a
/// remote child and a companion; answers (one lost and given again); a resume that wakes the
/// children, finds the remote one unreachable and answers the barrier; a look at it that falls
/// due, its report and the resume it was owed; the approved tool, the end of the run; a new
/// turn whose client call times out; an interrupt.
fn root_life() -> Vec<Step> {
    let (r1, r2, r3, r4) = (run(1), run(2), run(3), run(4));
    let first = ModelReply::tool_calls(vec![
        ToolCall::new("l1", "lookup", json!({ "q": "tea" })),
        ToolCall::new("e1", "edit", json!({ "line": 3 })),
        ToolCall::new("d1", "deploy", json!({ "env": "prod" })),
        ToolCall::new("s1", "delegate", json!({ "message": "help" })),
        ToolCall::new("x1", "far", json!({ "message": "far help" })),
        ToolCall::new(
            "h1",
            "companion__spawnAgent",
            json!({ "agentType": "helper", "name": "h", "message": "hi" }),
        ),
    ]);
    let approval = || Submission::Approval {
        approved: true,
        approval_id: format!("{r1}::d1"),
        reason: None,
        edited_input: None,
        binding: None,
    };
    let timeout = crate::definition::DEFAULT_CLIENT_TOOL_TIMEOUT_MS;
    vec![
        step(ROOT, 1, true, execute(r1, "go")),
        step(ROOT, 2, true, replied(r1, 1, first)),
        // Heard with a report for no call it knows, which changes nothing.
        step(
            ROOT,
            3,
            true,
            Input::ChildrenReported {
                reports: vec![
                    ReportedChild {
                        tool_call_id: "s1".into(),
                        report: ChildReport::Suspended(vec!["q1".into()]),
                        chunks: Vec::new(),
                    },
                    ReportedChild {
                        tool_call_id: "nobody".into(),
                        report: done("lost"),
                        chunks: Vec::new(),
                    },
                ],
            },
        ),
        step(
            ROOT,
            4,
            true,
            remote_reported(
                "x1",
                ChildReport::Suspended(vec!["r9".into()]),
                vec![remote_call()],
                0,
            ),
        ),
        step(
            ROOT,
            4,
            false,
            Input::RemoteAnswered {
                tool_call_id: "x1".into(),
            },
        ),
        step(ROOT, 5, true, finished(r1, 1, "l1", json!({ "stock": 3 }))),
        step(
            ROOT,
            6,
            true,
            submit("e1", Submission::Result(json!({ "applied": 1 }))),
        ),
        step(ROOT, 7, true, submit("d1", approval())),
        step(
            ROOT,
            8,
            false,
            Input::AnswerLost {
                tool_call_id: "d1".into(),
            },
        ),
        step(ROOT, 9, true, submit("d1", approval())),
        step(ROOT, 10, false, Input::Resume { run_id: r2 }),
        step(ROOT, 11, true, reported("s1", done("helped"))),
        step(ROOT, 12, true, unreachable("x1")),
        step(
            ROOT,
            1_012,
            true,
            Input::Timeout {
                tool_call_id: "x1".into(),
            },
        ),
        step(
            ROOT,
            1_013,
            true,
            remote_reported("x1", done("far done"), Vec::new(), 5),
        ),
        step(ROOT, 1_014, true, Input::Resume { run_id: r3 }),
        step(
            ROOT,
            1_015,
            true,
            finished(r3, 1, "d1", json!({ "deployed": true })),
        ),
        step(
            ROOT,
            1_016,
            true,
            replied(r3, 2, ModelReply::text("all done")),
        ),
        step(ROOT, 1_017, true, execute(r4, "again")),
        step(
            ROOT,
            1_018,
            true,
            replied(
                r4,
                1,
                ModelReply::tool_calls(vec![ToolCall::new("e2", "edit", json!({ "line": 4 }))]),
            ),
        ),
        step(
            ROOT,
            1_018 + timeout,
            true,
            Input::Timeout {
                tool_call_id: "e2".into(),
            },
        ),
        step(ROOT, 1_019 + timeout, true, Input::Interrupt),
    ]
}

/// The child's life: started by its parent, it suspends on a client call; a wake finds the
/// call still waiting; the answer; a wake that goes on; a crash cuts the run (recovered, the
/// actor restarted); a wake resumes it and it completes; a commit of it fails.
fn child_life() -> Vec<Step> {
    let (c1, c2, c3, c4) = (run(11), run(12), run(13), run(14));
    let start = ChildStart {
        origin: ChildOrigin {
            parent: id(ROOT),
            root: id(ROOT),
            tool_call_id: "s1".into(),
            depth: 1,
        },
        child: id(CHILD),
        agent: "lead".into(),
        message: "help".into(),
        kind: ChildKind::Ephemeral,
    };
    let ask = ModelReply::tool_calls(vec![ToolCall::new("q1", "edit", json!({ "line": 9 }))]);
    vec![
        step(CHILD, 2, true, Input::StartChild { run_id: c1, start }),
        step(CHILD, 3, true, replied(c1, 1, ask)),
        step(CHILD, 10, false, Input::Wake { run_id: c2 }),
        step(
            CHILD,
            10,
            true,
            submit("q1", Submission::Result(json!({ "line": "ok" }))),
        ),
        step(CHILD, 11, true, Input::Wake { run_id: c3 }),
        step(CHILD, 12, true, Input::Recover),
        step(CHILD, 13, false, Input::Restarted),
        step(CHILD, 14, true, Input::Wake { run_id: c4 }),
        step(CHILD, 15, true, replied(c4, 3, ModelReply::text("helped"))),
        step(
            CHILD,
            16,
            false,
            Input::CommitFailed {
                reason: "disk full".into(),
            },
        ),
    ]
}

/// The second root's life, a remote child of a session on another server: a step with a
/// child, a server tool and a remote child is cut by a crash; recovery learns the child finished; the remote child's server stays unreachable
/// past the patience and is written off; a resume goes on under the at-most-once rule; the
/// run completes; an abort.
fn cut_life() -> Vec<Step> {
    let (r5, r6) = (run(5), run(6));
    let calls = ModelReply::tool_calls(vec![
        ToolCall::new("s2", "delegate", json!({ "message": "dig" })),
        ToolCall::new("l2", "lookup", json!({ "q": "soil" })),
        ToolCall::new("x3", "far", json!({ "message": "far dig" })),
    ]);
    let patience = Policy::default().remote_patience_ms;
    let found = vec![(
        "s2".to_string(),
        ChildState::Finished(ToolOutcome::Result(json!("dug"))),
    )];
    // Started by a parent on another server, as its remote child.
    let remote_start = Input::Execute {
        run_id: r5,
        message: "dig".into(),
        agent: "lead".into(),
        new_only: true,
        remote_parent: Some(crate::remote::RemoteParent {
            parent: id("far-lead"),
            root: id("far-root"),
            traceparent: None,
        }),
    };
    vec![
        step(CUT, 1, true, remote_start),
        step(CUT, 2, true, replied(r5, 1, calls)),
        step(CUT, 3, true, Input::Recover),
        step(CUT, 4, true, Input::Reconciled { results: found }),
        step(CUT, 5, true, unreachable("x3")),
        step(CUT, 5 + patience, true, unreachable("x3")),
        step(CUT, 6 + patience, true, Input::Resume { run_id: r6 }),
        step(
            CUT,
            7 + patience,
            true,
            replied(r6, 2, ModelReply::text("dug it")),
        ),
        step(CUT, 8 + patience, true, Input::Abort),
        // A resume-due entry left from before the abort: removed, nothing resumes.
        step(CUT, 9 + patience, true, Input::ResumeDue { run_id: run(7) }),
    ]
}

/// The whole recorded life, in the order it is applied.
pub(super) fn recorded_life() -> Vec<Step> {
    let mut steps = root_life();
    steps.extend(child_life());
    steps.extend(cut_life());
    steps
}

/// Every kind of input, by name. [`name_of`] matches exhaustively, so a new kind of input does
/// not compile until it is named there; name it here too, and replay it above.
const EVERY_INPUT: [&str; 20] = [
    "execute",
    "resume",
    "resume_due",
    "submit",
    "answer_lost",
    "timeout",
    "interrupt",
    "abort",
    "recover",
    "restarted",
    "commit_failed",
    "model_replied",
    "tools_finished",
    "start_child",
    "wake",
    "children_reported",
    "remote_reported",
    "remote_answered",
    "remote_unreachable",
    "reconciled",
];

fn name_of(input: &Input) -> &'static str {
    match input {
        Input::Execute { .. } => "execute",
        Input::Resume { .. } => "resume",
        Input::ResumeDue { .. } => "resume_due",
        Input::Submit { .. } => "submit",
        Input::AnswerLost { .. } => "answer_lost",
        Input::Timeout { .. } => "timeout",
        Input::Interrupt => "interrupt",
        Input::Abort => "abort",
        Input::Recover => "recover",
        Input::Restarted => "restarted",
        Input::CommitFailed { .. } => "commit_failed",
        Input::ModelReplied { .. } => "model_replied",
        Input::ToolsFinished { .. } => "tools_finished",
        Input::StartChild { .. } => "start_child",
        Input::Wake { .. } => "wake",
        Input::ChildrenReported { .. } => "children_reported",
        Input::RemoteReported { .. } => "remote_reported",
        Input::RemoteAnswered { .. } => "remote_answered",
        Input::RemoteUnreachable { .. } => "remote_unreachable",
        Input::Reconciled { .. } => "reconciled",
    }
}

/// A replayed session and every commit its inputs made, in order.
pub(super) struct Replayed {
    pub(super) sessions: Vec<Session>,
    pub(super) commits: Vec<Commit>,
}

impl Replayed {
    pub(super) fn session(&self, id: &str) -> Option<&Session> {
        self.sessions
            .iter()
            .find(|session| session.record.id.as_str() == id)
    }
}

/// Applies the recorded life to new sessions and returns their commits and where they ended.
///
/// # Errors
/// A refused input, or one that did (or did not) commit against the script.
pub(super) fn replay() -> Result<Replayed, String> {
    let policy = Arc::new(Policy::default());
    let child = ChildOrigin {
        parent: id(ROOT),
        root: id(ROOT),
        tool_call_id: "s1".into(),
        depth: 1,
    };
    let mut sessions = vec![
        Session::create(id(ROOT), lead(), Arc::clone(&policy), 0),
        Session::create_child(id(CHILD), lead(), Arc::clone(&policy), 0, child),
        Session::create(id(CUT), lead(), Arc::clone(&policy), 0),
    ];
    let mut commits = Vec::new();
    for Step {
        session,
        input,
        now,
        commits: expected,
    } in recorded_life()
    {
        let name = name_of(&input);
        let target = sessions
            .iter_mut()
            .find(|known| known.record.id.as_str() == session)
            .ok_or_else(|| format!("no session {session}"))?;
        let transition = target
            .apply(input, now)
            .map_err(|error| format!("{name} to {session} at {now} refused: {error}"))?;
        if transition.commit.is_some() != expected {
            return Err(format!(
                "{name} to {session} at {now}: expected a commit: {expected}"
            ));
        }
        commits.extend(transition.commit);
    }
    Ok(Replayed { sessions, commits })
}

/// Every commit encoded, as its store writes.
pub(super) fn encoded(commits: &[Commit]) -> Result<Vec<crate::store::Batch>, String> {
    commits
        .iter()
        .map(|commit| commit.encode().map_err(|error| error.to_string()))
        .collect()
}

#[test]
fn the_recorded_life_applies_every_kind_of_input() {
    let covered: BTreeSet<&str> = recorded_life()
        .iter()
        .map(|step| name_of(&step.input))
        .collect();
    let every: BTreeSet<&str> = EVERY_INPUT.into_iter().collect();
    let missing: Vec<&&str> = every.difference(&covered).collect();
    assert!(missing.is_empty(), "never replayed: {missing:?}");
}

#[test]
fn replaying_the_same_inputs_gives_byte_identical_commits() -> Result<(), String> {
    let first = replay()?;
    let second = replay()?;
    // The recorded life went as described.
    let ended = |replayed: &Replayed, id: &str| {
        replayed.session(id).map(|session| {
            (
                session.record.status,
                session.record.run_count,
                session.record.aborted,
            )
        })
    };
    assert_eq!(ended(&first, ROOT), Some((Status::Interrupted, 3, false)));
    assert_eq!(ended(&first, CHILD), Some((Status::Completed, 3, false)));
    assert_eq!(ended(&first, CUT), Some((Status::Completed, 2, true)));
    let ops = |batches: Vec<crate::store::Batch>| -> Vec<Vec<crate::store::Op>> {
        batches.iter().map(|batch| batch.ops().to_vec()).collect()
    };
    let (first, second) = (
        ops(encoded(&first.commits)?),
        ops(encoded(&second.commits)?),
    );
    assert!(first.len() >= 30, "{} commits", first.len());
    assert_eq!(first, second);
    Ok(())
}
