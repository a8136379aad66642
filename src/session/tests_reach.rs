//! How the core reaches a child: one of this process by a message, a remote one by a driver.
//! The core decides and hands the actor everything it needs, so the actor never asks again.

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::definition::{AgentDefinition, ToolDefinition};
use crate::llm::ModelReply;
use crate::remote::{Drive, RemoteChild, RemoteParent};
use crate::store::CommitKind;
use crate::types::ids::{RunId, SessionId};
use crate::types::message::{ToolCall, ToolOutcome};

fn lead() -> Arc<AgentDefinition> {
    let built = AgentDefinition::builder("lead")
        .tool(ToolDefinition::sub_agent("near", "lead"))
        .tool(ToolDefinition::remote_sub_agent(
            "far",
            "http://remote.invalid",
            "worker",
        ))
        .build();
    Arc::new(built.unwrap_or_else(|error| panic!("valid definition: {error}")))
}

fn id(text: &str) -> Result<SessionId, String> {
    text.parse().map_err(|error| format!("{error}"))
}

fn far() -> RemoteChild {
    RemoteChild {
        endpoint: "http://remote.invalid".into(),
        agent: "worker".into(),
    }
}

/// A lead whose first step called `n1` (a child here) and `f1` (a remote child); returns it
/// and that step's transition.
fn delegating() -> Result<(Session, Transition), String> {
    stepped(
        lead(),
        vec![
            ToolCall::new("n1", "near", json!({ "message": "here" })),
            ToolCall::new("f1", "far", json!({ "message": "there" })),
        ],
    )
}

/// A session of `agent` whose first step made `calls`; returns it and that step's transition.
fn stepped(
    agent: Arc<AgentDefinition>,
    calls: Vec<ToolCall>,
) -> Result<(Session, Transition), String> {
    let mut session = Session::create(id("p")?, agent, Arc::new(Policy::default()), 0);
    let run_id = RunId::generate();
    let execute = Input::Execute {
        run_id,
        message: "go".into(),
        agent: "lead".into(),
        new_only: false,
        remote_parent: None,
    };
    session
        .apply(execute, 1)
        .map_err(|error| error.to_string())?;
    let replied = Input::ModelReplied {
        run_id,
        step: 1,
        reply: Ok(ModelReply::tool_calls(calls)),
    };
    let transition = session
        .apply(replied, 2)
        .map_err(|error| error.to_string())?;
    Ok((session, transition))
}

/// An answer accepted at an A2A child's agent (which goes on by itself once answered) arms a
/// durable look at the child, in a commit before the watch: a crash before the watch reports
/// is healed by that look. A second answer before it commits nothing more.
#[test]
fn an_answer_accepted_at_an_a2a_child_arms_a_durable_look() -> Result<(), String> {
    let built = AgentDefinition::builder("lead")
        .tool(ToolDefinition::a2a_agent("agent", "http://agent.invalid"))
        .build()
        .map_err(|error| error.to_string())?;
    let call = ToolCall::new("a1", "agent", json!({ "message": "there" }));
    let (mut session, _) = stepped(Arc::new(built), vec![call])?;
    let answered = |session: &mut Session| {
        let input = Input::RemoteAnswered {
            tool_call_id: "a1".into(),
        };
        apply(session, input, 3)
    };
    let first = answered(&mut session)?;
    assert!(first.commit.is_some());
    assert_eq!(drives(&first).len(), 1);
    let look = session
        .children
        .get("a1")
        .and_then(|entry| entry.remote_look)
        .ok_or("no look armed")?;
    assert_eq!(look.at_ms, 3 + 5_000);
    let again = answered(&mut session)?;
    assert!(again.commit.is_none());
    assert_eq!(drives(&again).len(), 1);
    Ok(())
}

/// A watch that finds a remote child's run cut by a crash there (nobody here waits on a wake of
/// it) wakes the child: its server keeps a cut run until its parent wakes it. A wake's own
/// report of a cut run wakes nothing more (no loop).
#[test]
fn a_watch_that_finds_a_remote_child_cut_by_a_crash_wakes_it() -> Result<(), String> {
    let (mut session, _) = delegating()?;
    let cut = |watch: bool| Input::RemoteReported {
        tool_call_id: "f1".into(),
        report: ChildReport::Crashed,
        chunks: Vec::new(),
        calls: Vec::new(),
        as_of: 0,
        watch,
    };
    // While the step waits on its children, a watch's report is not the one it waits for.
    let settled = Input::ChildrenReported {
        reports: vec![crate::session::ReportedChild {
            tool_call_id: "n1".into(),
            report: ChildReport::Finished(ToolOutcome::Result(json!("near done"))),
            chunks: Vec::new(),
        }],
    };
    apply(&mut session, settled, 3)?;
    let suspended = Input::RemoteReported {
        tool_call_id: "f1".into(),
        report: ChildReport::Suspended(vec!["ask-1".into()]),
        chunks: Vec::new(),
        calls: Vec::new(),
        as_of: 0,
        watch: false,
    };
    apply(&mut session, suspended, 4)?;
    let watched = apply(&mut session, cut(true), 5)?;
    let hows: Vec<Drive> = drives(&watched)
        .into_iter()
        .map(|drive| drive.how)
        .collect();
    assert_eq!(hows, vec![Drive::Wake]);
    let woken = apply(&mut session, cut(false), 6)?;
    assert!(drives(&woken).is_empty());
    Ok(())
}

fn drives(transition: &Transition) -> Vec<RemoteDrive> {
    transition
        .effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::DriveRemote(drive) => Some(drive.clone()),
            _ => None,
        })
        .collect()
}

fn apply(session: &mut Session, input: Input, now: u64) -> Result<Transition, String> {
    session.apply(input, now).map_err(|error| error.to_string())
}

#[test]
fn a_remote_child_is_started_by_its_driver_and_a_child_here_by_a_message() -> Result<(), String> {
    let (session, step) = delegating()?;
    let started: Vec<String> = step
        .effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::StartChild(start) => Some(start.child.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(started, vec!["p-sub-n1"]);
    let start = Drive::Start {
        message: "there".into(),
        parent: RemoteParent {
            parent: id("p")?,
            root: id("p")?,
            // With the `otel` feature, the call's span for the child's runs to link to.
            traceparent: crate::telemetry::call_traceparent(session.current_run_id()),
        },
    };
    let expected = RemoteDrive {
        call: "f1".into(),
        child: id("p-sub-f1")?,
        remote: far(),
        forwarded: 0,
        how: start,
    };
    assert_eq!(drives(&step), vec![expected]);
    Ok(())
}

#[test]
fn a_resume_wakes_a_remote_child_by_its_driver_and_a_child_here_by_a_message() -> Result<(), String>
{
    let (mut session, _) = delegating()?;
    let waiting = |call: &str| ChildReport::Suspended(vec![format!("q-{call}")]);
    for call in ["n1", "f1"] {
        let input = Input::ChildrenReported {
            reports: vec![ReportedChild {
                tool_call_id: call.into(),
                report: waiting(call),
                chunks: Vec::new(),
            }],
        };
        apply(&mut session, input, 3)?;
    }
    assert!(!session.is_busy(), "the step suspended on both children");
    let resumed = apply(
        &mut session,
        Input::Resume {
            run_id: RunId::generate(),
        },
        4,
    )?;
    let woken: Vec<&(String, SessionId)> = resumed
        .effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::WakeChildren(children) => Some(children),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(woken, vec![&("n1".to_string(), id("p-sub-n1")?)]);
    let hows: Vec<(String, Drive)> = drives(&resumed)
        .into_iter()
        .map(|drive| (drive.call, drive.how))
        .collect();
    assert_eq!(hows, vec![("f1".to_string(), Drive::Wake)]);
    Ok(())
}

#[test]
fn an_interrupt_stops_each_child_where_it_lives() -> Result<(), String> {
    let (mut session, _) = delegating()?;
    let stopped = apply(&mut session, Input::Interrupt, 3)?;
    let children: Vec<ChildAt> = stopped
        .effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::StopChildren { children, .. } => Some(children.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    let expected = vec![
        ChildAt {
            child: id("p-sub-n1")?,
            remote: None,
        },
        ChildAt {
            child: id("p-sub-f1")?,
            remote: Some(far()),
        },
    ];
    assert_eq!(children, expected);
    Ok(())
}

#[test]
fn an_answer_accepted_at_the_remote_watches_its_child_until_the_child_has_finished(
) -> Result<(), String> {
    let (mut session, _) = delegating()?;
    let answered = |session: &mut Session, call: &str| {
        let input = Input::RemoteAnswered {
            tool_call_id: call.into(),
        };
        apply(session, input, 3)
    };
    let watched = answered(&mut session, "f1")?;
    // Over dormant's own protocol the child waits for its parent's resume: nothing to commit.
    assert!(watched.commit.is_none());
    let hows: Vec<Drive> = drives(&watched)
        .into_iter()
        .map(|drive| drive.how)
        .collect();
    assert_eq!(hows, vec![Drive::Watch]);
    // A child here, or a call nothing waits on, is not watched.
    assert!(answered(&mut session, "n1")?.effects.is_empty());
    assert!(answered(&mut session, "nobody")?.effects.is_empty());
    let done = Input::RemoteReported {
        tool_call_id: "f1".into(),
        report: ChildReport::Finished(ToolOutcome::Result(json!("done"))),
        chunks: Vec::new(),
        calls: Vec::new(),
        as_of: 0,
        watch: false,
    };
    apply(&mut session, done, 4)?;
    assert!(answered(&mut session, "f1")?.effects.is_empty());
    Ok(())
}

#[test]
fn recovery_inspects_children_here_and_watches_remote_ones() -> Result<(), String> {
    let (mut session, _) = delegating()?;
    // A crash cut the step: read back, the children are still recorded as running.
    let cut = apply(&mut session, Input::Recover, 3)?;
    assert_eq!(
        cut.commit.map(|commit| commit.kind),
        Some(CommitKind::RunEnd)
    );
    let reconcile = session.children_to_reconcile();
    assert_eq!(reconcile.inspect, vec![("n1".to_string(), id("p-sub-n1")?)]);
    let watched: Vec<(String, Drive)> = reconcile
        .watch
        .into_iter()
        .map(|drive| (drive.call, drive.how))
        .collect();
    assert_eq!(watched, vec![("f1".to_string(), Drive::Watch)]);
    Ok(())
}

#[test]
fn a_model_call_streams_its_deltas_after_the_chunks_its_commit_records() -> Result<(), String> {
    let (mut session, _) = delegating()?;
    for call in ["n1", "f1"] {
        let input = Input::ChildrenReported {
            reports: vec![ReportedChild {
                tool_call_id: call.into(),
                report: ChildReport::Finished(ToolOutcome::Result(json!(call))),
                chunks: Vec::new(),
            }],
        };
        let reported = apply(&mut session, input, 3)?;
        let after = reported.effects.iter().find_map(|effect| match effect {
            Effect::CallModel { after_seq, .. } => Some(*after_seq),
            _ => None,
        });
        let Some(after) = after else {
            continue;
        };
        let recorded = reported
            .commit
            .and_then(|commit| commit.record)
            .map(|record| record.chunk_count);
        assert_eq!(Some(after), recorded);
        return Ok(());
    }
    Err("no step asked for the model".into())
}
