//! The core is deterministic: the same inputs, at the same times, give the same commits, byte
//! for byte (every run id comes in with an input; nothing reads a clock or draws an id).

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::definition::{AgentDefinition, Approval, ToolDefinition, ToolError};
use crate::ids::{RunId, SessionId};
use crate::llm::ModelReply;
use crate::message::{ToolCall, ToolOutcome};
use crate::store::Op;

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
        .build();
    Arc::new(built.unwrap_or_else(|error| panic!("valid definition: {error}")))
}

fn run(n: u8) -> RunId {
    format!("01900000-0000-7000-8000-0000000000{n:02x}")
        .parse()
        .unwrap_or_else(|error| panic!("a valid run id: {error}"))
}

/// A recorded life of a session: a step with a server tool, a client tool, an approval and a
/// child; answers; a resume that wakes the child and runs the approved tool; the end of the
/// run; a new turn; an interrupt of it.
fn recorded_inputs() -> Vec<(Input, u64)> {
    let (r1, r2, r3) = (run(1), run(2), run(3));
    let reply = ModelReply::tool_calls(vec![
        ToolCall::new("l1", "lookup", json!({ "q": "tea" })),
        ToolCall::new("e1", "edit", json!({ "line": 3 })),
        ToolCall::new("d1", "deploy", json!({ "env": "prod" })),
        ToolCall::new("s1", "delegate", json!({ "message": "help" })),
    ]);
    let finished = |id: &str, value: serde_json::Value| FinishedCall {
        tool_call_id: id.into(),
        outcome: ToolOutcome::Result(value),
        updates: serde_json::Map::new(),
    };
    vec![
        (
            Input::Execute {
                run_id: r1,
                message: "go".into(),
                agent: "lead".into(),
            },
            1,
        ),
        (
            Input::ModelReplied {
                run_id: r1,
                step: 1,
                reply: Ok(reply),
            },
            2,
        ),
        (
            Input::ChildReported {
                tool_call_id: "s1".into(),
                report: ChildReport::Suspended(vec!["q1".into()]),
                chunks: Vec::new(),
            },
            3,
        ),
        (
            Input::ToolsFinished {
                run_id: r1,
                step: 1,
                outcomes: vec![finished("l1", json!({ "stock": 3 }))],
            },
            4,
        ),
        (
            Input::Submit {
                tool_call_id: "e1".into(),
                submission: Submission::Result(json!({ "applied": 1 })),
            },
            5,
        ),
        (
            Input::Submit {
                tool_call_id: "d1".into(),
                submission: Submission::Approval {
                    approved: true,
                    approval_id: format!("{r1}::d1"),
                    reason: None,
                },
            },
            6,
        ),
        (Input::Resume { run_id: r2 }, 7),
        (
            Input::ChildReported {
                tool_call_id: "s1".into(),
                report: ChildReport::Finished(ToolOutcome::Result(json!("helped"))),
                chunks: Vec::new(),
            },
            8,
        ),
        (
            Input::ToolsFinished {
                run_id: r2,
                step: 1,
                outcomes: vec![finished("d1", json!({ "deployed": true }))],
            },
            9,
        ),
        (
            Input::ModelReplied {
                run_id: r2,
                step: 2,
                reply: Ok(ModelReply::text("all done")),
            },
            10,
        ),
        (
            Input::Execute {
                run_id: r3,
                message: "again".into(),
                agent: "lead".into(),
            },
            11,
        ),
        (Input::Interrupt, 12),
    ]
}

/// Applies the recorded inputs to a new session and returns every commit's writes, encoded,
/// and where the session ended.
fn replay() -> (Vec<Vec<Op>>, Status, u32) {
    let id: SessionId = "replayed"
        .parse()
        .unwrap_or_else(|error| panic!("a valid id: {error}"));
    let mut session = Session::create(id, lead(), Arc::new(Policy::default()), 0);
    let mut commits = Vec::new();
    for (input, now) in recorded_inputs() {
        let transition = session
            .apply(input, now)
            .unwrap_or_else(|error| panic!("input at {now} refused: {error}"));
        if let Some(commit) = transition.commit {
            let batch = commit
                .encode()
                .unwrap_or_else(|error| panic!("commit at {now} encodes: {error}"));
            commits.push(batch.ops().to_vec());
        }
    }
    (commits, session.record.status, session.record.run_count)
}

#[test]
fn replaying_the_same_inputs_gives_byte_identical_commits() {
    let (first, status, runs) = replay();
    let (second, ..) = replay();
    // The recorded life went as described: three runs, the last one interrupted.
    assert_eq!((status, runs), (Status::Interrupted, 3));
    assert!(first.len() >= 8, "{} commits", first.len());
    assert_eq!(first, second);
}
