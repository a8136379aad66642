//! The core's sub-agent rules, checked without actors, stores or time.

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::definition::{AgentDefinition, ToolDefinition};
use crate::llm::ModelReply;
use crate::store::CommitKind;
use crate::types::ids::{RunId, SessionId};
use crate::types::message::{ToolCall, ToolOutcome};

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
    let input = Input::ChildrenReported {
        reports: vec![ReportedChild {
            tool_call_id: call.into(),
            report,
            chunks: Vec::new(),
        }],
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
            .filter(|write| matches!(write, crate::store::schema::IndexWrite::PutChild(_)))
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

/// A fan-in heard in one input: every report recorded, the step settled once, one commit,
/// whatever order the reports came in; a report for no known call changes nothing.
#[test]
fn reports_heard_together_are_one_commit_that_settles_the_step_once() {
    let calls = ["c1", "c2", "c3"];
    let (mut session, _, _) = delegating(&calls, Policy::default());
    let reported = |call: &str, report: ChildReport| ReportedChild {
        tool_call_id: call.into(),
        report,
        chunks: Vec::new(),
    };
    let reports = vec![
        reported("c3", ChildReport::Suspended(vec!["q3".into()])),
        reported("nobody", ChildReport::Crashed),
        reported("c1", ChildReport::Finished(ToolOutcome::Result(json!("a")))),
        reported("c2", ChildReport::Suspended(vec!["q2".into()])),
    ];
    let heard = session
        .apply(Input::ChildrenReported { reports }, 3)
        .unwrap_or_default();
    let commit = heard.commit.as_ref();
    assert_eq!(commit.map(|c| c.kind), Some(CommitKind::ToolResults));
    let entries = commit.map_or(0, |c| {
        c.index
            .iter()
            .filter(|write| matches!(write, crate::store::schema::IndexWrite::PutChild(_)))
            .count()
    });
    assert_eq!(entries, 3, "one entry written per child that reported");
    assert_eq!(session.record.status, Status::SuspendedAwaitingChildren);
    let mut pending = session.outcome(3).pending;
    pending.sort();
    assert_eq!(pending, vec!["q2".to_string(), "q3".to_string()]);

    // Only reports for no known call: nothing changes, nothing is committed.
    let nobody = vec![reported("nobody", ChildReport::Crashed)];
    let ignored = session
        .apply(Input::ChildrenReported { reports: nobody }, 4)
        .unwrap_or_default();
    assert!(ignored.commit.is_none() && ignored.effects.is_empty());
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
            crate::types::message::Message::Tool { outcome, .. } => Some(outcome.clone()),
            _ => None,
        })
    });
    assert!(
        matches!(recorded, Some(ToolOutcome::Error(text)) if text.starts_with("max_depth_exceeded"))
    );
    assert!(session.is_busy(), "the run goes on to its next step");
}

#[test]
fn each_way_a_child_cannot_run_reaches_its_parent_as_a_tool_error_with_its_stable_code(
) -> Result<(), String> {
    let id = |text: &str| text.parse::<SessionId>().map_err(|error| error.to_string());
    let child = id("p-sub-c1")?;
    let parent = id("p")?;
    let error = || "the disk is full".to_string();
    let cases = [
        (
            ChildUnavailable::UnknownAgent {
                agent: "ghost".into(),
            },
            "unknown_agent: no agent named ghost is defined",
        ),
        (
            ChildUnavailable::NotOwnedHere {
                child: child.clone(),
                error: error(),
            },
            "sub_agent_unavailable: child p-sub-c1 cannot be owned here: the disk is full",
        ),
        (
            ChildUnavailable::Unreadable {
                child: child.clone(),
                error: error(),
            },
            "sub_agent_unavailable: child p-sub-c1 cannot be read: the disk is full",
        ),
        (
            ChildUnavailable::CrashedBeforeFirstCommit {
                child: child.clone(),
                panic: "boom".into(),
            },
            "sub_agent_failed: child p-sub-c1 crashed before the first commit of its run: boom",
        ),
        (
            ChildUnavailable::CannotRun {
                child: child.clone(),
                error: error(),
            },
            "sub_agent_failed: child p-sub-c1 cannot run: the disk is full",
        ),
        (
            ChildUnavailable::Failed {
                child,
                error: error(),
            },
            "sub_agent_failed: child p-sub-c1 failed: the disk is full",
        ),
    ];
    for (why, text) in cases {
        let Effect::Report {
            parent: to,
            tool_call_id,
            report,
        } = why.report(&parent, "c1".into())
        else {
            return Err(format!("{why:?} is no report"));
        };
        let error = ToolOutcome::Error(text.into());
        assert_eq!(
            error.code().map(|code| code.as_str()),
            text.split(':').next()
        );
        assert_eq!(
            (to, tool_call_id, report),
            (
                parent.clone(),
                "c1".to_string(),
                ChildReport::Finished(error)
            )
        );
    }
    Ok(())
}

#[test]
fn a_child_whose_end_recovery_cannot_learn_is_recorded_with_a_reason_that_begins_with_its_code(
) -> Result<(), Box<dyn std::error::Error>> {
    let child: SessionId = "p-sub-c1".parse()?;
    let cases = [
        (
            LostChild::InspectionTimedOut {
                child: child.clone(),
                after_ms: 2_000,
            },
            "inspection_timed_out: child p-sub-c1 did not answer within 2000 ms",
        ),
        (
            LostChild::Missing {
                child: child.clone(),
            },
            "child_missing: no session p-sub-c1 is stored",
        ),
        (
            LostChild::Interrupted {
                child: child.clone(),
            },
            "child_interrupted: child p-sub-c1 was cut by a crash",
        ),
        (
            LostChild::Unreadable {
                error: "corrupt".into(),
            },
            "child_unreadable: corrupt",
        ),
    ];
    for (lost, reason) in cases {
        assert!(reason.starts_with(lost.code()));
        assert_eq!(
            lost.state(),
            ChildState::Interrupted {
                reason: reason.into()
            }
        );
    }
    // What the store holds of a child decides which: none at all is a missing child.
    assert_eq!(
        stored_state(&child, None),
        LostChild::Missing { child }.state()
    );
    Ok(())
}
