//! The core's rules for remote children, checked without actors, stores, networks or time:
//! when a parent looks at a remote child by itself.

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::definition::{AgentDefinition, ToolDefinition};
use crate::llm::ModelReply;
use crate::remote::RemoteCall;
use crate::store::schema::{self, IndexWrite};
use crate::types::ids::{RunId, SessionId};
use crate::types::message::{ToolCall, ToolOutcome};

fn lead() -> Arc<AgentDefinition> {
    let built = AgentDefinition::builder("lead")
        .tool(ToolDefinition::remote_sub_agent(
            "far",
            "http://remote.invalid",
            "worker",
        ))
        .build();
    Arc::new(built.unwrap_or_else(|error| panic!("valid definition: {error}")))
}

/// A lead whose first step delegated `d1` to a remote child.
fn delegating(policy: Policy) -> Session {
    let reply = vec![ToolCall::new("d1", "far", json!({ "message": "do it" }))];
    replied_with(lead(), policy, reply).0
}

/// A session of `agent` whose first step's model reply made `calls`, and that run.
fn replied_with(
    agent: Arc<AgentDefinition>,
    policy: Policy,
    calls: Vec<ToolCall>,
) -> (Session, RunId) {
    let id: SessionId = "p".parse().unwrap_or_else(|_| SessionId::generate());
    let mut session = Session::create(id, agent, Arc::new(policy), 0);
    let run_id = RunId::generate();
    let execute = Input::Execute {
        run_id,
        message: "go".into(),
        agent: "lead".into(),
        new_only: false,
        remote_parent: None,
    };
    assert!(session.apply(execute, 1).is_ok());
    let replied = Input::ModelReplied {
        run_id,
        step: 1,
        reply: Ok(ModelReply::tool_calls(calls)),
    };
    assert!(session.apply(replied, 2).is_ok());
    (session, run_id)
}

/// The remote children a transition stops, with whether each is aborted.
fn remote_stops(transition: &Transition) -> Vec<(SessionId, bool)> {
    transition
        .effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::StopChildren { children, abort } => Some(
                children
                    .iter()
                    .filter(|child| child.remote.is_some())
                    .map(|child| (child.child.clone(), *abort))
                    .collect::<Vec<_>>(),
            ),
            _ => None,
        })
        .flatten()
        .collect()
}

fn call(id: &str, deadline: u64, waiting: bool, timed_out: bool) -> RemoteCall {
    RemoteCall {
        owner: "p-sub-d1".into(),
        tool_call_id: id.into(),
        tool_name: "ask".into(),
        kind: PendingKind::Client,
        approval_id: None,
        input: json!({}),
        requested_at_ms: 0,
        deadline_at_ms: deadline,
        waiting,
        answered: false,
        timed_out,
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

fn reported(
    session: &mut Session,
    report: ChildReport,
    calls: Vec<RemoteCall>,
    watch: bool,
    now: u64,
) -> Transition {
    let input = Input::RemoteReported {
        tool_call_id: "d1".into(),
        report,
        chunks: Vec::new(),
        calls,
        as_of: 3,
        watch,
    };
    session.apply(input, now).unwrap_or_default()
}

fn timeout(session: &mut Session, call: &str, now: u64) -> Transition {
    let input = Input::Timeout {
        tool_call_id: call.into(),
    };
    session.apply(input, now).unwrap_or_default()
}

/// Deadline entries, as (at, call).
type Entries = Vec<(u64, String)>;

/// The looks at remote children a transition arms and removes in the deadline index, by the
/// call each looks at (the removal under a look's bare call id, for an entry armed before
/// looks had a name of their own, is left out: it goes with each removal).
fn deadlines(transition: &Transition) -> (Entries, Entries) {
    let mut put = Vec::new();
    let mut deleted = Vec::new();
    for write in transition.commit.iter().flat_map(|commit| &commit.index) {
        let look = |call: &str| schema::remote_look_call(call).map(str::to_string);
        match write {
            IndexWrite::PutDeadline { at, call } => put.extend(look(call).map(|c| (*at, c))),
            IndexWrite::DeleteDeadline { at, call } => {
                deleted.extend(look(call).map(|c| (*at, c)));
            }
            _ => {}
        }
    }
    (put, deleted)
}

/// A look moved deletes its entry under both names, the bare call id too.
#[test]
fn a_look_moved_removes_its_entry_under_its_name_and_its_bare_call_id() {
    let mut session = delegating(Policy::default());
    let first = reported(
        &mut session,
        ChildReport::Suspended(vec!["a".into()]),
        vec![call("a", 5_000, true, false)],
        false,
        3,
    );
    assert_eq!(deadlines(&first).0, vec![(5_000, "d1".to_string())]);
    let moved = timeout(&mut session, "d1", 5_000);
    let removed: Vec<String> = moved
        .commit
        .iter()
        .flat_map(|commit| &commit.index)
        .filter_map(|write| match write {
            IndexWrite::DeleteDeadline { at: 5_000, call } => Some(call.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        removed,
        vec![schema::remote_look_entry("d1"), "d1".to_string()]
    );
}

fn watches(transition: &Transition) -> Vec<String> {
    transition
        .effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::DriveRemote(RemoteDrive {
                call,
                how: crate::remote::Drive::Watch,
                ..
            }) => Some(call.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_suspended_remote_child_is_looked_at_when_its_first_call_falls_due() {
    let mut session = delegating(Policy::default());
    let suspended = reported(
        &mut session,
        ChildReport::Suspended(vec!["q1".into(), "q2".into()]),
        vec![
            call("q1", 9_000, true, false),
            call("q2", 5_000, true, false),
        ],
        false,
        10,
    );
    assert_eq!(deadlines(&suspended).0, vec![(5_000, "d1".to_string())]);

    // Early (a stale entry): nothing.
    let early = timeout(&mut session, "d1", 4_999);
    assert!(early.commit.is_none() && early.effects.is_empty());

    // Due: ask the child, and look again a second later in case it is late there.
    let due = timeout(&mut session, "d1", 5_000);
    assert_eq!(watches(&due), vec!["d1".to_string()]);
    assert_eq!(
        deadlines(&due),
        (
            vec![(6_000, "d1".to_string())],
            vec![(5_000, "d1".to_string())]
        )
    );
}

#[test]
fn a_call_past_its_deadline_that_the_remote_has_not_timed_out_yet_is_looked_at_again_later() {
    let mut session = delegating(Policy::default());
    reported(
        &mut session,
        ChildReport::Suspended(vec!["q1".into()]),
        vec![call("q1", 1_000, true, false)],
        false,
        10,
    );
    timeout(&mut session, "d1", 1_000);
    // The look found q1 expired by the remote's clock but its timeout not recorded there yet.
    let unrecorded = reported(
        &mut session,
        ChildReport::Suspended(Vec::new()),
        vec![call("q1", 1_000, false, false)],
        true,
        1_500,
    );
    let (put, deleted) = deadlines(&unrecorded);
    assert_eq!(deleted, vec![(2_000, "d1".to_string())]);
    assert_eq!(put, vec![(2_500, "d1".to_string())], "a second at least");

    // Recorded now: nothing left to look for.
    let recorded = reported(
        &mut session,
        ChildReport::Suspended(Vec::new()),
        vec![call("q1", 1_000, false, true)],
        true,
        3_000,
    );
    let (put, deleted) = deadlines(&recorded);
    assert!(put.is_empty(), "{put:?}");
    assert_eq!(deleted, vec![(2_500, "d1".to_string())]);
    let late = timeout(&mut session, "d1", 3_000);
    assert!(watches(&late).is_empty());
}

#[test]
fn a_remote_whose_clock_is_behind_is_looked_at_less_and_less_often() {
    let mut session = delegating(Policy::default());
    reported(
        &mut session,
        ChildReport::Suspended(vec!["q1".into()]),
        vec![call("q1", 1_000, true, false)],
        false,
        10,
    );
    let mut now = 1_000;
    let mut waits = Vec::new();
    for _ in 0..9 {
        let looked = timeout(&mut session, "d1", now);
        let next = deadlines(&looked).0.first().map_or(0, |(at, _)| *at);
        waits.push(next - now);
        now = next;
    }
    assert_eq!(
        waits,
        vec![1_000, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000]
    );
}

#[test]
fn a_remote_child_that_finished_by_itself_resumes_an_auto_resuming_parent() {
    let policy = Policy {
        auto_resume: true,
        ..Policy::default()
    };
    let mut session = delegating(policy);
    reported(
        &mut session,
        ChildReport::Suspended(vec!["q1".into()]),
        vec![call("q1", 1_000, true, false)],
        false,
        10,
    );
    timeout(&mut session, "d1", 1_000);
    let finished = reported(
        &mut session,
        ChildReport::Finished(ToolOutcome::Result(json!("gave up waiting"))),
        Vec::new(),
        true,
        1_000,
    );
    assert!(
        finished
            .effects
            .iter()
            .any(|effect| matches!(effect, Effect::AutoResume)),
        "{:?}",
        finished.effects
    );
    assert_eq!(deadlines(&finished).1, vec![(2_000, "d1".to_string())]);
}

fn unreachable(session: &mut Session, now: u64) -> Transition {
    let input = Input::RemoteUnreachable {
        tool_call_id: "d1".into(),
        reason: "connection refused".into(),
    };
    session.apply(input, now).unwrap_or_default()
}

/// A lead whose remote child waits on `q1`, answered (at the remote), and which a resume is
/// now waking.
fn waking_an_answered_child(policy: Policy) -> Session {
    let mut session = delegating(policy);
    reported(
        &mut session,
        ChildReport::Suspended(vec!["q1".into()]),
        vec![call("q1", 900_000, true, false)],
        false,
        10,
    );
    let answered = RemoteCall {
        answered: true,
        ..call("q1", 900_000, false, false)
    };
    reported(
        &mut session,
        ChildReport::Suspended(Vec::new()),
        vec![answered],
        true,
        20,
    );
    let resume = Input::Resume {
        run_id: RunId::generate(),
    };
    let woken = session.apply(resume, 30).unwrap_or_default();
    // The core wakes a remote child through its driver.
    assert!(woken.effects.iter().any(|effect| matches!(
        effect,
        Effect::DriveRemote(RemoteDrive {
            how: crate::remote::Drive::Wake,
            ..
        })
    )));
    session
}

#[test]
fn a_resume_that_cannot_reach_its_remote_child_answers_that_the_tree_still_waits_and_tries_again() {
    let mut session = waking_an_answered_child(Policy::default());
    let away = unreachable(&mut session, 1_000);
    let settled = away.effects.iter().find_map(|effect| match effect {
        Effect::Settle(outcome) => Some(outcome.status),
        _ => None,
    });
    assert_eq!(settled, Some(Status::SuspendedAwaitingChildren));
    assert!(!session.is_busy());
    assert_eq!(deadlines(&away).0, vec![(2_000, "d1".to_string())]);

    // The look falls due: the resume that was asked for is tried again.
    let again = timeout(&mut session, "d1", 2_000);
    let how = again.effects.iter().find_map(|effect| match effect {
        Effect::DriveRemote(drive) => Some(drive.how.clone()),
        _ => None,
    });
    assert_eq!(how, Some(crate::remote::Drive::Wake));
    // Away for longer now: the next try waits as long as it has been away.
    let still = unreachable(&mut session, 5_000);
    assert_eq!(deadlines(&still).0, vec![(5_000 + 4_000, "d1".to_string())]);

    // Back: the child resumed and finished, and the resume of the lead is carried out.
    let back = reported(
        &mut session,
        ChildReport::Finished(ToolOutcome::Result(json!("done"))),
        Vec::new(),
        false,
        9_000,
    );
    assert!(
        back.effects
            .iter()
            .any(|effect| matches!(effect, Effect::AutoResume)),
        "{:?}",
        back.effects
    );
}

#[test]
fn a_remote_away_past_the_patience_is_written_off_and_recorded_to_be_stopped() {
    let policy = Policy {
        remote_patience_ms: 60_000,
        ..Policy::default()
    };
    let mut session = waking_an_answered_child(policy);
    unreachable(&mut session, 1_000);
    let within = unreachable(&mut session, 60_999);
    assert!(within
        .commit
        .iter()
        .flat_map(|commit| &commit.index)
        .all(|write| !matches!(write, IndexWrite::PutOrphan(_))));
    let gone = unreachable(&mut session, 61_000);
    let writes: Vec<&IndexWrite> = gone.commit.iter().flat_map(|c| &c.index).collect();
    assert!(
        writes
            .iter()
            .any(|write| matches!(write, IndexWrite::PutOrphan(orphan) if orphan.abort)),
        "{writes:?}"
    );
    let entry = writes.iter().find_map(|write| match write {
        IndexWrite::PutChild(entry) => Some(entry.state.clone()),
        _ => None,
    });
    assert!(
        matches!(&entry, Some(ChildState::Finished(ToolOutcome::Error(text))) if text.starts_with("remote_subagent_lost")),
        "{entry:?}"
    );
    assert!(gone
        .effects
        .iter()
        .any(|effect| matches!(effect, Effect::AutoResume)));
}

#[test]
fn a_remote_child_an_abort_lets_go_is_recorded_to_be_stopped_in_the_abort_s_own_commit() {
    let mut session = waking_an_answered_child(Policy::default());
    let aborted = session.apply(Input::Abort, 1_000).unwrap_or_default();
    let stopped: Vec<SessionId> = aborted
        .effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::StopChildren {
                children,
                abort: true,
            } => Some(children),
            _ => None,
        })
        .flatten()
        .filter(|child| child.remote.is_some())
        .map(|child| child.child.clone())
        .collect();
    assert_eq!(stopped.len(), 1, "{:?}", aborted.effects);
    let recorded: Vec<&crate::remote::RemoteOrphan> = aborted
        .commit
        .iter()
        .flat_map(|commit| &commit.index)
        .filter_map(|write| match write {
            IndexWrite::PutOrphan(orphan) => Some(orphan),
            _ => None,
        })
        .collect();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0].child, stopped[0]);
    assert!(recorded[0].abort);
    assert_eq!(recorded[0].since_ms, 1_000);
    assert_eq!(
        recorded[0].held_until_ms,
        Some(1_000 + crate::remote::STOP_UNDER_WAY_MS),
        "left to its own stop, under way"
    );
}

/// With `auto_resume`, a remote child that waits on nothing but its parent's resume (its
/// server does not resume it by itself) makes the parent resume, which wakes it; the resume
/// owed goes with the wake, so that a child that keeps answering so is not woken again each
/// time the scheduler looks.
#[test]
fn a_parent_that_resumes_by_itself_wakes_a_remote_child_waiting_only_on_its_resume() {
    use crate::store::schema::{RESUME_DUE, RESUME_DUE_AT};
    let policy = Policy {
        auto_resume: true,
        ..Policy::default()
    };
    let mut session = delegating(policy);
    let asked = reported(
        &mut session,
        ChildReport::Suspended(vec!["q1".into()]),
        vec![call("q1", 900_000, true, false)],
        false,
        10,
    );
    assert!(!asked
        .effects
        .iter()
        .any(|effect| matches!(effect, Effect::AutoResume)));
    let answered = RemoteCall {
        answered: true,
        ..call("q1", 900_000, false, false)
    };
    let waits_on_us = reported(
        &mut session,
        ChildReport::Suspended(Vec::new()),
        vec![answered],
        true,
        20,
    );
    assert!(waits_on_us
        .effects
        .iter()
        .any(|effect| matches!(effect, Effect::AutoResume)));
    let owed = |transition: &Transition, put: bool| {
        transition
            .commit
            .iter()
            .flat_map(|commit| &commit.index)
            .any(|write| match write {
                IndexWrite::PutDeadline { at, call } if put => {
                    *at == RESUME_DUE_AT && call == RESUME_DUE
                }
                IndexWrite::DeleteDeadline { at, call } if !put => {
                    *at == RESUME_DUE_AT && call == RESUME_DUE
                }
                _ => false,
            })
    };
    assert!(owed(&waits_on_us, true), "the resume owed is recorded");
    let woken = session
        .apply(
            Input::ResumeDue {
                run_id: RunId::generate(),
            },
            30,
        )
        .unwrap_or_default();
    assert!(woken.effects.iter().any(|effect| matches!(
        effect,
        Effect::DriveRemote(RemoteDrive {
            how: crate::remote::Drive::Wake,
            ..
        })
    )));
    assert!(owed(&woken, false), "the wake takes the resume owed");
}

/// A run a crash interrupted leaves its remote child going on there; an interrupt asked for
/// then reaches it (its entry stays, for a resume to re-attach).
#[test]
fn an_interrupt_of_a_run_a_crash_interrupted_reaches_its_remote_child() {
    let session = delegating(Policy::default());
    let stored = Stored {
        run: session.run.clone(),
        children: session.children.entries(),
        ..Stored::default()
    };
    let mut restored =
        Session::restore(session.record, lead(), Arc::new(Policy::default()), stored);
    let recovered = restored.apply(Input::Recover, 10).unwrap_or_default();
    assert!(recovered.commit.is_some(), "the crash's cut is recorded");
    assert_eq!(restored.record.status, Status::Interrupted);
    let interrupted = restored.apply(Input::Interrupt, 11).unwrap_or_default();
    let stopped = remote_stops(&interrupted);
    assert_eq!(stopped.len(), 1, "{:?}", interrupted.effects);
    assert!(!stopped[0].1, "interrupted, not aborted");
    assert!(
        restored
            .children
            .entries()
            .iter()
            .any(|entry| entry.remote.is_some()),
        "its entry stays"
    );
}

/// The root's entries of calls a remote child waits on, as (put, deleted) call ids.
fn routed(transition: &Transition) -> (Vec<String>, Vec<String>) {
    let mut put = Vec::new();
    let mut deleted = Vec::new();
    for write in transition.commit.iter().flat_map(|commit| &commit.index) {
        match write {
            IndexWrite::PutRemoteOwnership { owner, .. } => {
                put.push(owner.call.tool_call_id.clone());
            }
            IndexWrite::DeleteOwnership { call, .. } => deleted.push(call.clone()),
            _ => {}
        }
    }
    (put, deleted)
}

/// A remote child re-attached after a crash (the step that made its call is run again: its
/// entry waits on it again) reports that one of the calls it waited on before no longer waits
/// (answered at the remote meanwhile): the root's entry of that call is cleared, as without
/// the crash, so that the root no longer lists it as waiting.
#[test]
fn a_call_a_remote_child_no_longer_waits_on_after_a_re_attach_is_cleared_from_the_root() {
    // A step with a server tool beside the remote child: the child suspends while the tool
    // runs, and a crash cuts the step there.
    let built = AgentDefinition::builder("lead")
        .tool(ToolDefinition::remote_sub_agent(
            "far",
            "http://remote.invalid",
            "worker",
        ))
        .tool(ToolDefinition::server("slow", |_input, _ctx| async {
            Ok::<_, crate::definition::ToolError>(json!(null))
        }))
        .build();
    let agent = Arc::new(built.unwrap_or_else(|error| panic!("valid definition: {error}")));
    let calls = vec![
        ToolCall::new("d1", "far", json!({ "message": "do it" })),
        ToolCall::new("s1", "slow", json!({})),
    ];
    let (mut session, run_id) = replied_with(Arc::clone(&agent), Policy::default(), calls);
    let first = reported(
        &mut session,
        ChildReport::Suspended(vec!["a".into(), "b".into()]),
        vec![call("a", 1_000, true, false), call("b", 1_000, true, false)],
        false,
        3,
    );
    assert_eq!(routed(&first).0, vec!["a".to_string(), "b".to_string()]);

    let stored = Stored {
        run: session.run.clone(),
        children: session.children.entries(),
        ..Stored::default()
    };
    let messages = session.messages.clone();
    let mut restored = Session::restore(session.record, agent, Arc::new(Policy::default()), stored);
    // What the actor loads for the resume: the conversation, cut after the model's reply.
    restored.messages = messages;
    assert!(restored.apply(Input::Recover, 10).is_ok());
    let resumed = restored
        .apply(Input::Resume { run_id }, 11)
        .unwrap_or_default();
    assert!(
        restored
            .children
            .entries()
            .iter()
            .all(|entry| entry.state == ChildState::Running),
        "the step ran again and waits on its child: {:?}",
        resumed.effects
    );
    let input = Input::RemoteReported {
        tool_call_id: "d1".into(),
        report: ChildReport::Suspended(vec!["b".into()]),
        chunks: Vec::new(),
        calls: vec![call("b", 1_000, true, false)],
        as_of: 4,
        watch: false,
    };
    let after = restored.apply(input, 12).unwrap_or_default();
    let (put, deleted) = routed(&after);
    assert_eq!(put, vec!["b".to_string()]);
    assert_eq!(
        deleted,
        vec!["a".to_string()],
        "the answered call is cleared"
    );
}

/// An abort while the remote child's start was in flight: its stop may reach the server before
/// the start, find nothing, and the child then starts there for nobody. Its start's report,
/// coming to a parent without its entry, stops it again; a watch's does not.
#[test]
fn a_remote_child_that_reports_after_its_entry_went_is_stopped_there() {
    let mut session = delegating(Policy::default());
    let aborted = session.apply(Input::Abort, 3).unwrap_or_default();
    assert!(
        aborted
            .effects
            .iter()
            .any(|effect| matches!(effect, Effect::StopChildren { abort: true, .. })),
        "{:?}",
        aborted.effects
    );
    assert!(session.children.get("d1").is_none(), "the entry went");
    let watched = reported(
        &mut session,
        ChildReport::Suspended(vec!["a".into()]),
        vec![call("a", 1_000, true, false)],
        true,
        4,
    );
    assert!(watched.effects.is_empty(), "{:?}", watched.effects);
    let started = reported(
        &mut session,
        ChildReport::Suspended(vec!["a".into()]),
        vec![call("a", 1_000, true, false)],
        false,
        5,
    );
    let stopped: Vec<(String, bool)> = remote_stops(&started)
        .into_iter()
        .map(|(child, abort)| (child.to_string(), abort))
        .collect();
    assert_eq!(stopped, vec![("p-sub-d1".to_string(), true)]);
}
