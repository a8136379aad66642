//! The core's companion rules, checked without actors, stores or time.

use std::sync::Arc;

use serde_json::json;

use super::child_calls::ChildKind;
use super::*;
use crate::definition::{AgentDefinition, CompanionMode};
use crate::llm::ModelReply;
use crate::types::ids::{RunId, SessionId};
use crate::types::message::{ToolCall, ToolOutcome};

fn lead(mode: CompanionMode) -> Arc<AgentDefinition> {
    let built = AgentDefinition::builder("lead")
        .persistent_agent("helper", mode)
        .build();
    Arc::new(built.unwrap_or_else(|error| panic!("valid definition: {error}")))
}

fn reply(session: &mut Session, run_id: RunId, step: u32, calls: Vec<ToolCall>) -> Transition {
    let input = Input::ModelReplied {
        run_id,
        step,
        reply: Ok(ModelReply::tool_calls(calls)),
    };
    session
        .apply(input, u64::from(step) + 1)
        .unwrap_or_default()
}

fn report(session: &mut Session, call: &str, outcome: ChildReport) -> Transition {
    let input = Input::ChildrenReported {
        reports: vec![ReportedChild {
            tool_call_id: call.into(),
            report: outcome,
            chunks: Vec::new(),
        }],
    };
    session.apply(input, 50).unwrap_or_default()
}

fn spawn(id: &str, message: &str) -> ToolCall {
    ToolCall::new(
        id,
        "companion__spawnAgent",
        json!({ "agentType": "helper", "name": "h", "message": message }),
    )
}

/// A lead whose first step spawned companion `h` with call `c1`.
fn spawned(mode: CompanionMode) -> (Session, RunId, Transition) {
    let id: SessionId = "p".parse().unwrap_or_else(|_| SessionId::generate());
    let mut session = Session::create(id, lead(mode), Arc::new(Policy::default()), 0);
    let run_id = RunId::generate();
    let execute = Input::Execute {
        run_id,
        message: "go".into(),
        agent: "lead".into(),
        new_only: false,
        remote_parent: None,
    };
    assert!(session.apply(execute, 1).is_ok());
    let transition = reply(&mut session, run_id, 1, vec![spawn("c1", "first")]);
    (session, run_id, transition)
}

fn companion_status(session: &Session) -> Option<CompanionStatus> {
    session
        .companions
        .in_order()
        .first()
        .map(|companion| companion.status.clone())
}

#[test]
fn a_blocking_spawn_records_the_companion_in_commit_one_and_waits_for_its_report() {
    let (mut session, _, transition) = spawned(CompanionMode::Blocking);
    let commit = transition.commit.as_ref();
    let companions = commit.map_or(0, |c| {
        c.index
            .iter()
            .filter(|write| matches!(write, crate::store::schema::IndexWrite::PutCompanion(_)))
            .count()
    });
    assert_eq!(
        companions, 1,
        "the companion is durable with the model's reply"
    );
    let started: Vec<(String, String)> = transition
        .effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::StartChild(start) => {
                Some((start.child.to_string(), start.origin.tool_call_id.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(started, vec![("p-agent-h".to_string(), "c1".to_string())]);
    assert!(session.is_busy(), "the step waits for the companion");
    let done = report(
        &mut session,
        "c1",
        ChildReport::Finished(ToolOutcome::Result(json!("one"))),
    );
    assert_eq!(
        done.commit.map(|c| c.kind),
        Some(crate::store::CommitKind::ToolResults)
    );
    assert_eq!(companion_status(&session), Some(CompanionStatus::Completed));
}

#[test]
fn a_report_naming_an_older_turn_call_is_stale_and_changes_nothing() {
    let (mut session, run_id, _) = spawned(CompanionMode::NonBlocking);
    let _ = report(
        &mut session,
        "c1",
        ChildReport::Finished(ToolOutcome::Result(json!("one"))),
    );
    let send = ToolCall::new(
        "c2",
        "companion__sendMessage",
        json!({ "name": "h", "message": "second" }),
    );
    let _ = reply(&mut session, run_id, 2, vec![send]);
    assert_eq!(companion_status(&session), Some(CompanionStatus::Running));
    let stale = report(
        &mut session,
        "c1",
        ChildReport::Finished(ToolOutcome::Error("late".into())),
    );
    assert!(stale.commit.is_none(), "a stale report writes nothing");
    assert_eq!(companion_status(&session), Some(CompanionStatus::Running));
}

#[test]
fn a_terminated_companion_is_spawned_fresh_and_a_second_spawn_while_running_is_refused() {
    let (mut session, run_id, _) = spawned(CompanionMode::NonBlocking);
    let again = reply(&mut session, run_id, 2, vec![spawn("c2", "again")]);
    let refused = again.commit.as_ref().is_some_and(|commit| {
        commit.messages.iter().any(|(_, message)| {
            matches!(message, crate::types::message::Message::Tool { outcome: ToolOutcome::Error(text), .. } if text.starts_with("companion_busy"))
        })
    });
    assert!(refused, "a running companion takes no second spawn");
    let terminate = ToolCall::new("c3", "companion__terminateChild", json!({ "name": "h" }));
    let _ = reply(&mut session, run_id, 3, vec![terminate]);
    assert_eq!(
        companion_status(&session),
        Some(CompanionStatus::Terminated)
    );
    let respawn = reply(&mut session, run_id, 4, vec![spawn("c4", "fresh")]);
    let fresh = respawn.effects.iter().any(|effect| {
        matches!(effect, Effect::StartChild(start) if start.kind == ChildKind::Companion { fresh: true })
    });
    assert!(fresh, "a terminated companion starts over");
}

#[test]
fn a_fresh_turn_starts_the_conversation_over_and_clears_an_abort() {
    let helper = Arc::new(
        AgentDefinition::builder("helper")
            .build()
            .unwrap_or_else(|error| panic!("valid definition: {error}")),
    );
    let parent: SessionId = "p".parse().unwrap_or_else(|_| SessionId::generate());
    let id = parent.persistent_child("h");
    let origin = |call: &str| super::child_calls::ChildOrigin {
        parent: parent.clone(),
        root: parent.clone(),
        tool_call_id: call.into(),
        depth: 1,
    };
    let turn = |call: &str, message: &str, fresh: bool| Input::StartChild {
        run_id: RunId::generate(),
        start: ChildStart {
            origin: origin(call),
            child: id.clone(),
            agent: "helper".into(),
            message: message.into(),
            kind: ChildKind::Companion { fresh },
        },
    };
    let mut child = Session::create_child(
        id.clone(),
        helper,
        Arc::new(Policy::default()),
        0,
        origin("c1"),
    );
    assert!(child.apply(turn("c1", "first", true), 1).is_ok());
    let run_id = child.current_run_id();
    let replied = Input::ModelReplied {
        run_id,
        step: 1,
        reply: Ok(ModelReply::text("done")),
    };
    assert!(child.apply(replied, 2).is_ok());
    let _ = child.apply(Input::Abort, 2);
    assert!(child.record.aborted);
    assert!(child.apply(turn("c4", "again", true), 3).is_ok());
    assert!(!child.record.aborted);
    assert_eq!(
        child.record.history_start, 2,
        "the first turn's two messages stay stored"
    );
    assert_eq!(child.record.parent_call.as_deref(), Some("c4"));
    let seen = child.messages.as_deref().map_or(0, Vec::len);
    assert_eq!(seen, 1, "the model sees only the new message");
}
