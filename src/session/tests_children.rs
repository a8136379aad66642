//! The core's sub-agent rules, checked without actors, stores or time.

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::definition::{AgentDefinition, ToolDefinition};
use crate::ids::{RunId, SessionId};
use crate::llm::ModelReply;
use crate::message::{ToolCall, ToolOutcome};
use crate::store::CommitKind;

fn lead() -> Arc<AgentDefinition> {
    let built = AgentDefinition::builder("lead")
        .tool(ToolDefinition::sub_agent("delegate", "lead"))
        .build();
    Arc::new(built.unwrap_or_else(|error| panic!("valid definition: {error}")))
}

/// A lead whose first step delegated `calls`; returns it waiting on its children.
fn delegating(calls: &[&str], policy: Policy) -> (Session, RunId, Transition) {
    let id: SessionId = "p".parse().unwrap_or_else(|_| SessionId::generate());
    let mut session = Session::create(id, lead(), Arc::new(policy), 0);
    let run_id = RunId::generate();
    let execute = Input::Execute {
        run_id,
        message: "go".into(),
        agent: "lead".into(),
        new_only: false,
        remote_parent: None,
    };
    assert!(session.apply(execute, 1).is_ok());
    let reply = ModelReply::tool_calls(
        calls
            .iter()
            .map(|id| ToolCall::new(*id, "delegate", json!({ "message": "do it" })))
            .collect(),
    );
    let replied = Input::ModelReplied {
        run_id,
        step: 1,
        reply: Ok(reply),
    };
    let transition = session.apply(replied, 2).unwrap_or_default();
    (session, run_id, transition)
}

fn report(session: &mut Session, call: &str, report: ChildReport, now: u64) -> Transition {
    let input = Input::ChildReported {
        tool_call_id: call.into(),
        report,
        chunks: Vec::new(),
    };
    session.apply(input, now).unwrap_or_default()
}

#[test]
fn commit_one_records_each_child_before_it_starts() {
    let (session, _, transition) = delegating(&["c1", "c2"], Policy::default());
    let commit = transition.commit.as_ref();
    assert_eq!(commit.map(|c| c.kind), Some(CommitKind::ToolCalls));
    let entries = commit.map_or(0, |c| {
        c.index
            .iter()
            .filter(|write| matches!(write, crate::schema::IndexWrite::PutChild(_)))
            .count()
    });
    assert_eq!(entries, 2);
    let starts: Vec<String> = transition
        .effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::StartChild(start) => Some(start.child.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(starts, vec!["p-sub-c1", "p-sub-c2"]);
    assert!(session.is_busy());
}

#[test]
fn the_step_settles_when_the_last_child_reports_and_a_waiting_child_suspends_the_parent() {
    let (mut session, _, _) = delegating(&["c1", "c2"], Policy::default());
    let first = report(
        &mut session,
        "c1",
        ChildReport::Finished(ToolOutcome::Result(json!("a"))),
        3,
    );
    assert_eq!(
        first.commit.as_ref().map(|c| c.kind),
        Some(CommitKind::Other)
    );
    assert!(session.is_busy(), "c2 has not reported");
    let second = report(
        &mut session,
        "c2",
        ChildReport::Suspended(vec!["q1".into()]),
        4,
    );
    assert_eq!(
        second.commit.as_ref().map(|c| c.kind),
        Some(CommitKind::ToolResults)
    );
    assert_eq!(session.record.status, Status::SuspendedAwaitingChildren);
    assert_eq!(session.outcome(4).pending, vec!["q1".to_string()]);
}

#[test]
fn a_resume_wakes_waiting_children_and_goes_on_once_they_finished() {
    let (mut session, _, _) = delegating(&["c1"], Policy::default());
    report(
        &mut session,
        "c1",
        ChildReport::Suspended(vec!["q1".into()]),
        3,
    );
    let resumed = session.apply(
        Input::Resume {
            run_id: RunId::generate(),
        },
        5,
    );
    let Ok(transition) = resumed else {
        panic!("a resume wakes the child: {resumed:?}");
    };
    assert!(
        transition.commit.is_none(),
        "nothing runs before the child reports"
    );
    assert!(matches!(
        transition.effects.as_slice(),
        [Effect::WakeChildren(children)] if children.len() == 1
    ));
    // Still waiting: the barrier answers without a new run.
    let still = report(
        &mut session,
        "c1",
        ChildReport::Suspended(vec!["q1".into()]),
        6,
    );
    assert!(still
        .effects
        .iter()
        .any(|e| matches!(e, Effect::Settle(o) if o.status == Status::SuspendedAwaitingChildren)));
    assert_eq!(session.record.run_count, 1);
    // Finished: the parent drains its result and asks the model again.
    let _ = session.apply(
        Input::Resume {
            run_id: RunId::generate(),
        },
        7,
    );
    let done = report(
        &mut session,
        "c1",
        ChildReport::Finished(ToolOutcome::Result(json!("ok"))),
        8,
    );
    assert_eq!(session.record.run_count, 2);
    assert!(done
        .effects
        .iter()
        .any(|e| matches!(e, Effect::CallModel { .. })));
}

#[test]
fn a_sub_agent_call_beyond_max_depth_is_a_tool_error() {
    let policy = Policy {
        max_depth: 0,
        ..Policy::default()
    };
    let (session, _, transition) = delegating(&["c1"], policy);
    assert!(!transition
        .effects
        .iter()
        .any(|effect| matches!(effect, Effect::StartChild(_))));
    let recorded = transition.commit.as_ref().and_then(|c| {
        c.messages.iter().find_map(|(_, message)| match message {
            crate::message::Message::Tool { outcome, .. } => Some(outcome.clone()),
            _ => None,
        })
    });
    assert!(
        matches!(recorded, Some(ToolOutcome::Error(text)) if text.starts_with("max_depth_exceeded"))
    );
    assert!(session.is_busy(), "the run goes on to its next step");
}
