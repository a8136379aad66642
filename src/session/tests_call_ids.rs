//! The runtime's own ids for calls whose model id is empty or already used: assigned before
//! commit #1, the same on a replay, and used everywhere the call is recorded.

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::definition::{AgentDefinition, ToolDefinition};
use crate::llm::ModelReply;
use crate::types::ids::{RunId, SessionId};
use crate::types::message::{Message, ToolCall};
use crate::types::stream::ChunkKind;

fn agent() -> Arc<AgentDefinition> {
    let built = AgentDefinition::builder("a")
        .tool(ToolDefinition::client("ask"))
        .build();
    Arc::new(built.unwrap_or_else(|error| panic!("valid definition: {error}")))
}

fn started(id: &str) -> (Session, RunId) {
    let id: SessionId = id.parse().unwrap_or_else(|error| panic!("{error}"));
    let mut session = Session::create(id, agent(), Arc::new(Policy::default()), 0);
    let run_id = RunId::generate();
    let execute = Input::Execute {
        run_id,
        message: "go".into(),
        agent: "a".into(),
        new_only: false,
        remote_parent: None,
    };
    assert!(session.apply(execute, 1).is_ok());
    (session, run_id)
}

fn ask(id: &str) -> ToolCall {
    ToolCall::new(id, "ask", json!({}))
}

/// The ids of the calls of the reply to step `step`, as committed (the assistant message),
/// as streamed (`tool_start`) and as made pending.
fn reply(session: &mut Session, run_id: RunId, step: u32, calls: Vec<ToolCall>) -> Transition {
    let input = Input::ModelReplied {
        run_id,
        step,
        reply: Ok(ModelReply::tool_calls(calls)),
    };
    session
        .apply(input, 2)
        .unwrap_or_else(|error| panic!("{error}"))
}

fn committed_ids(transition: &Transition) -> (Vec<String>, Vec<String>) {
    let commit = transition.commit.as_ref();
    let message_ids = commit
        .iter()
        .flat_map(|commit| commit.messages.iter())
        .filter_map(|(_, message)| match message {
            Message::Assistant { tool_calls, .. } => Some(tool_calls),
            _ => None,
        })
        .flatten()
        .map(|call| call.id.clone())
        .collect();
    let started = commit
        .iter()
        .flat_map(|commit| commit.chunks.iter())
        .filter_map(|chunk| match &chunk.kind {
            ChunkKind::ToolStart { tool_call_id, .. } => Some(tool_call_id.clone()),
            _ => None,
        })
        .collect();
    (message_ids, started)
}

#[test]
fn empty_and_repeated_ids_in_one_reply_get_ids_of_their_own_everywhere() {
    let (mut session, run_id) = started("s");
    let t = reply(
        &mut session,
        run_id,
        1,
        vec![
            ask("tc-1"),
            ask("tc-1"),
            ask(""),
            ask("call-1-1"),
            ask("tc-1"),
        ],
    );
    // "call-1-1" is the model's own id for a later call: the second call takes the next.
    let expected = ["tc-1", "call-1-1-2", "call-1-2", "call-1-1", "call-1-4"];
    let (messages, started) = committed_ids(&t);
    assert_eq!(messages, expected);
    assert_eq!(started, expected);
    let mut pending = session.pending.ids();
    pending.sort();
    let mut sorted = expected.map(String::from).to_vec();
    sorted.sort();
    assert_eq!(pending, sorted);
    let assigned: Vec<(String, String)> = t
        .effects
        .iter()
        .filter_map(|effect| match effect {
            Effect::Observe(Observation::CallIdAssigned {
                original, assigned, ..
            }) => Some((original.clone(), assigned.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        assigned,
        [
            ("tc-1".to_string(), "call-1-1-2".to_string()),
            (String::new(), "call-1-2".to_string()),
            ("tc-1".to_string(), "call-1-4".to_string()),
        ]
    );
}

#[test]
fn an_id_too_long_for_a_key_or_taking_the_resume_due_name_gets_one_of_the_runtimes_own() {
    let (mut session, run_id) = started("s");
    let long = "x".repeat(super::call_ids::MAX_CALL_ID_BYTES + 1);
    let kept = "y".repeat(super::call_ids::MAX_CALL_ID_BYTES);
    let calls = vec![
        ask(&long),
        ask(&kept),
        ask(crate::store::schema::RESUME_DUE),
    ];
    let (messages, _) = committed_ids(&reply(&mut session, run_id, 1, calls));
    assert_eq!(
        messages,
        ["call-1-0".to_string(), kept, "call-1-2".to_string()]
    );
}

#[test]
fn a_replayed_reply_gets_the_same_ids() {
    let calls = || vec![ask(""), ask("x"), ask("x")];
    let (mut first, run_first) = started("s");
    let (mut second, run_second) = started("s");
    let a = committed_ids(&reply(&mut first, run_first, 1, calls()));
    let b = committed_ids(&reply(&mut second, run_second, 1, calls()));
    assert_eq!(a, b);
    assert_eq!(a.0, ["call-1-0", "x", "call-1-2"]);
}

#[test]
fn an_id_from_an_earlier_step_is_kept_and_an_id_the_runtime_assigns_is_new_to_the_conversation() {
    let (mut session, run_id) = started("s");
    reply(&mut session, run_id, 1, vec![ask("tc-1")]);
    let submit = Input::Submit {
        tool_call_id: "tc-1".into(),
        submission: Submission::Result(json!("one")),
    };
    assert!(session.apply(submit, 3).is_ok());
    let resume = session.apply(
        Input::Resume {
            run_id: RunId::generate(),
        },
        4,
    );
    let resumed = resume.unwrap_or_else(|error| panic!("{error}"));
    let next_run = resumed.effects.iter().find_map(|effect| match effect {
        Effect::CallModel { run_id, .. } => Some(*run_id),
        _ => None,
    });
    let Some(next_run) = next_run else {
        panic!("the resume asks the model: {:?}", resumed.effects);
    };
    // Messages so far: the user's (0), the reply (1), the result (2): the reply is 3. Its
    // `tc-1` is kept (the earlier one is done); its empty id gets one of the runtime's own.
    let t = reply(&mut session, next_run, 2, vec![ask("tc-1"), ask("")]);
    assert_eq!(committed_ids(&t).0, ["tc-1", "call-3-1"]);
    assert_eq!(session.pending.ids(), ["tc-1", "call-3-1"]);
    let ids: Vec<String> = session
        .messages
        .iter()
        .flat_map(|messages| messages.iter())
        .filter_map(|message| match message {
            Message::Assistant { tool_calls, .. } => Some(tool_calls),
            _ => None,
        })
        .flatten()
        .map(|call| call.id.clone())
        .collect();
    assert_eq!(ids, ["tc-1", "tc-1", "call-3-1"]);
}
