//! The core's rules, checked without actors, stores or time.

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::definition::{AgentDefinition, ToolDefinition, ToolError};
use crate::llm::{LlmError, ModelReply};
use crate::store::CommitKind;
use crate::types::ids::{RunId, SessionId};
use crate::types::message::{Message, ToolCall, ToolOutcome};
use crate::types::stream::ChunkKind;

fn agent(max_steps: u32) -> Arc<AgentDefinition> {
    let tool = ToolDefinition::server("work", |_input, _ctx| async {
        Ok::<_, ToolError>(json!(1))
    });
    let built = AgentDefinition::builder("a")
        .tool(tool)
        .max_steps(max_steps)
        .build();
    Arc::new(built.unwrap_or_else(|error| panic!("valid definition: {error}")))
}

fn policy() -> Arc<Policy> {
    Arc::new(Policy::default())
}

fn started(max_steps: u32) -> (Session, RunId) {
    let mut session = Session::create(SessionId::generate(), agent(max_steps), policy(), 0);
    let run_id = RunId::generate();
    let transition = session.apply(
        Input::Execute {
            run_id,
            message: "go".into(),
            agent: "a".into(),
            new_only: false,
            remote_parent: None,
        },
        1,
    );
    assert!(transition.is_ok());
    (session, run_id)
}

fn call(id: &str) -> ToolCall {
    ToolCall::new(id, "work", json!({}))
}

#[test]
fn execute_commits_the_run_before_asking_the_model() {
    let mut session = Session::create(SessionId::generate(), agent(5), policy(), 0);
    let run_id = RunId::generate();
    let transition = session
        .apply(
            Input::Execute {
                run_id,
                message: "go".into(),
                agent: "a".into(),
                new_only: false,
                remote_parent: None,
            },
            7,
        )
        .unwrap_or_default();
    let commit = transition
        .commit
        .as_ref()
        .map(|c| (c.kind, c.messages.len(), c.runs.len()));
    assert_eq!(commit, Some((CommitKind::RunStart, 1, 1)));
    assert!(matches!(
        transition.effects.last(),
        Some(Effect::CallModel { step: 1, .. })
    ));
    assert_eq!(session.record.status, Status::Running);
    let again = session.apply(
        Input::Execute {
            run_id,
            message: "twice".into(),
            agent: "a".into(),
            new_only: false,
            remote_parent: None,
        },
        8,
    );
    assert!(matches!(again, Err(crate::Error::AlreadyRunning(_))));
}

#[test]
fn tool_calls_are_committed_before_tools_run_and_results_before_the_next_step() {
    let (mut session, run_id) = started(5);
    let reply = Ok(ModelReply::tool_calls(vec![call("c1"), call("c2")]));
    let t = session
        .apply(
            Input::ModelReplied {
                run_id,
                step: 1,
                reply,
            },
            2,
        )
        .unwrap_or_default();
    assert_eq!(
        t.commit.as_ref().map(|c| c.kind),
        Some(CommitKind::ToolCalls)
    );
    let parallel = t.effects.iter().find_map(|effect| match effect {
        Effect::RunTools { parallel, .. } => Some(parallel.len()),
        _ => None,
    });
    assert_eq!(parallel, Some(2));
    assert!(session.is_busy());
    let outcomes = ["c2", "c1"]
        .iter()
        .map(|id| FinishedCall {
            tool_call_id: (*id).into(),
            outcome: ToolOutcome::Result(json!(id)),
            updates: serde_json::Map::new(),
            unsettled: false,
            asked: None,
        })
        .collect();
    let t = session
        .apply(
            Input::ToolsFinished {
                run_id,
                step: 1,
                outcomes,
            },
            3,
        )
        .unwrap_or_default();
    let commit = t.commit.as_ref().map(|c| (c.kind, c.messages.clone()));
    let Some((CommitKind::ToolResults, messages)) = commit else {
        panic!("expected a tool-results commit");
    };
    // Results are recorded in the model's call order, whatever order they finished in.
    let ids: Vec<&str> = messages
        .iter()
        .filter_map(|(_, m)| match m {
            Message::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, vec!["c1", "c2"]);
    assert!(matches!(
        t.effects.last(),
        Some(Effect::CallModel { step: 2, .. })
    ));
}

#[test]
fn a_stale_model_reply_changes_nothing() {
    let (mut session, run_id) = started(5);
    let t = session
        .apply(
            Input::ModelReplied {
                run_id,
                step: 9,
                reply: Ok(ModelReply::text("late")),
            },
            2,
        )
        .unwrap_or_default();
    assert!(t.commit.is_none() && t.effects.is_empty());
    assert_eq!(session.record.status, Status::Running);
}

#[test]
fn the_step_limit_ends_the_run_in_the_same_commit_as_the_last_results() {
    let (mut session, run_id) = started(1);
    let reply = Ok(ModelReply::tool_calls(vec![call("c1")]));
    let _ = session.apply(
        Input::ModelReplied {
            run_id,
            step: 1,
            reply,
        },
        2,
    );
    let outcomes = vec![FinishedCall {
        tool_call_id: "c1".into(),
        outcome: ToolOutcome::Result(json!(1)),
        updates: serde_json::Map::new(),
        unsettled: false,
        asked: None,
    }];
    let t = session
        .apply(
            Input::ToolsFinished {
                run_id,
                step: 1,
                outcomes,
            },
            3,
        )
        .unwrap_or_default();
    let commit = t.commit.as_ref();
    assert_eq!(
        commit.and_then(|c| c.record.as_ref()).map(|r| r.status),
        Some(Status::Failed)
    );
    assert_eq!(commit.map(|c| c.runs.len()), Some(1));
    let settled = t.effects.iter().find_map(|effect| match effect {
        Effect::Settle(outcome) => outcome.error.as_ref().map(|e| e.code),
        _ => None,
    });
    assert_eq!(settled, Some(ErrorCode::MaxSteps));
}

#[test]
fn a_model_failure_fails_the_run_with_its_code() {
    let (mut session, run_id) = started(5);
    let reply = Err(LlmError::Provider("down".into()));
    let t = session
        .apply(
            Input::ModelReplied {
                run_id,
                step: 1,
                reply,
            },
            2,
        )
        .unwrap_or_default();
    assert_eq!(t.commit.as_ref().map(|c| c.kind), Some(CommitKind::RunEnd));
    assert_eq!(
        session.outcome(2).error.map(|e| e.code),
        Some(ErrorCode::ModelError)
    );
}

#[test]
fn a_run_found_running_after_a_crash_is_closed_as_interrupted() {
    let (session, _) = started(5);
    let mut restored = Session::restore(
        session.record,
        agent(5),
        policy(),
        Stored {
            run: session.run,
            ..Stored::default()
        },
    );
    let t = restored.apply(Input::Recover, 10).unwrap_or_default();
    let chunk = t
        .commit
        .as_ref()
        .and_then(|c| c.chunks.last())
        .map(|c| c.kind.type_name());
    assert_eq!(chunk, Some("run_interrupted"));
    assert_eq!(restored.record.status, Status::Interrupted);
    assert!(
        restored
            .apply(Input::Recover, 11)
            .is_ok_and(|t| t.commit.is_none()),
        "recovery happens once"
    );
}

#[test]
fn a_new_turn_closes_tool_calls_a_crash_left_without_results() {
    let (mut session, run_id) = started(5);
    let reply = Ok(ModelReply::tool_calls(vec![call("c1")]));
    let _ = session.apply(
        Input::ModelReplied {
            run_id,
            step: 1,
            reply,
        },
        2,
    );
    // The process dies here: restore from the record, with the conversation as stored.
    let messages = session.messages.as_deref().cloned().unwrap_or_default();
    let mut restored = Session::restore(
        session.record.clone(),
        agent(5),
        policy(),
        Stored {
            run: session.run.clone(),
            ..Stored::default()
        },
    );
    let _ = restored.apply(Input::Recover, 3);
    restored.attach_messages(messages);
    let t = restored
        .apply(
            Input::Execute {
                run_id: RunId::generate(),
                message: "again".into(),
                agent: "a".into(),
                new_only: false,
                remote_parent: None,
            },
            4,
        )
        .unwrap_or_default();
    let first = t
        .commit
        .as_ref()
        .and_then(|c| c.messages.first())
        .map(|(_, m)| m.clone());
    assert!(matches!(
        first,
        Some(Message::Tool { tool_call_id, outcome: ToolOutcome::Error(_), .. }) if tool_call_id == "c1"
    ));
    // The cut call's tool_end closes it in the run that made it, before the new run starts.
    let kinds: Vec<&ChunkKind> = t
        .commit
        .as_ref()
        .map(|c| c.chunks.iter().map(|chunk| &chunk.kind).collect())
        .unwrap_or_default();
    assert!(
        matches!(kinds[..], [ChunkKind::ToolEnd { tool_call_id, .. }, ChunkKind::RunStart { turn: 2, .. }, ..] if tool_call_id == "c1"),
        "{kinds:?}"
    );
}

fn execute(new_only: bool, remote_parent: Option<crate::remote::RemoteParent>) -> Input {
    Input::Execute {
        run_id: RunId::generate(),
        message: "go".into(),
        agent: "a".into(),
        new_only,
        remote_parent,
    }
}

#[test]
fn a_start_only_for_a_new_session_starts_one_and_is_refused_by_one_that_exists(
) -> Result<(), crate::Error> {
    let mut session = Session::create(SessionId::generate(), agent(5), policy(), 0);
    // A new session: nothing to read first, and it starts.
    let first = execute(true, None);
    assert!(!first.needs_conversation());
    let started = session.apply(first, 1)?;
    assert!(started.commit.is_some());
    let reply = Input::ModelReplied {
        run_id: session.current_run_id(),
        step: 1,
        reply: Ok(ModelReply::text("done")),
    };
    session.apply(reply, 2)?;
    assert_eq!(session.record.status, Status::Completed);
    // It exists now: the same start (a replay of it) is refused and changes nothing.
    let count = session.record.log_count;
    let again = session.apply(execute(true, None), 3);
    assert!(
        matches!(again, Err(crate::Error::SessionExists(_))),
        "{again:?}"
    );
    assert_eq!(session.record.log_count, count);
    // Any other new turn goes on.
    assert!(session.apply(execute(false, None), 4)?.commit.is_some());
    Ok(())
}

#[test]
fn a_remote_parent_is_recorded_by_a_new_session_and_never_taken_over_later(
) -> Result<(), Box<dyn std::error::Error>> {
    let parent = |name: &str| -> Result<crate::remote::RemoteParent, crate::types::InvalidId> {
        Ok(crate::remote::RemoteParent {
            parent: name.parse()?,
            root: name.parse()?,
            traceparent: None,
        })
    };
    let mut session = Session::create(SessionId::generate(), agent(5), policy(), 0);
    let started = session.apply(execute(true, Some(parent("far-lead")?)), 1)?;
    let recorded = started
        .commit
        .and_then(|commit| commit.record)
        .and_then(|record| record.remote_parent);
    assert_eq!(recorded, Some(parent("far-lead")?));
    // A later turn naming another parent changes nothing (and is refused: only its parent
    // starts a remote child's turns).
    let reply = Input::ModelReplied {
        run_id: session.current_run_id(),
        step: 1,
        reply: Ok(ModelReply::text("done")),
    };
    session.apply(reply, 2)?;
    let other = session.apply(execute(false, Some(parent("intruder")?)), 3);
    assert!(
        matches!(other, Err(crate::Error::SubAgentSession { .. })),
        "{other:?}"
    );
    assert_eq!(session.record.remote_parent, Some(parent("far-lead")?));
    Ok(())
}
