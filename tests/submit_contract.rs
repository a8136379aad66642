//! Every malformed or misdirected submit answers its typed outcome, stores nothing, and a
//! valid submit afterwards is accepted.

mod common;

use std::sync::Arc;

use common::{calls_then_text, editor_runtime, temp_store};
use dormant::{ManualClock, SessionId};
use dormant::{Submit, SubmitOutcome};
use serde_json::{json, Value};

async fn suspended_with_client_and_approval() -> anyhow::Result<dormant::Runtime> {
    let script = calls_then_text(&[("tc-1", "edit"), ("d1", "deploy")], "done");
    let runtime = editor_runtime(
        temp_store()?,
        ManualClock::new(0),
        script,
        Arc::default(),
        |b| b.max_result_bytes(1024),
    )?;
    runtime.execute_on(&"s1".parse()?, "editor", "go").await?;
    Ok(runtime)
}

#[tokio::test]
async fn malformed_envelopes_are_refused_and_store_nothing() -> anyhow::Result<()> {
    let runtime = suspended_with_client_and_approval().await?;
    let id: SessionId = "s1".parse()?;
    let before = runtime.pending(&id).await?;
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({ "session_id": "", "tool_call_id": "tc-1", "result": {} }),
            "invalid_request",
        ),
        (
            json!({ "session_id": "s1", "tool_call_id": "", "result": {} }),
            "invalid_request",
        ),
        (
            json!({ "session_id": "s1", "tool_call_id": "tc-1" }),
            "invalid_request",
        ),
        (
            json!({ "session_id": "s1", "tool_call_id": "tc-1", "result": {"applied": 1}, "error": "x" }),
            "invalid_request",
        ),
        (
            json!({ "session_id": "s1", "tool_call_id": "tc-1", "result": {}, "extra": 1 }),
            "invalid_request",
        ),
        (
            json!({ "kind": "telepathy", "session_id": "s1", "tool_call_id": "tc-1", "result": {} }),
            "invalid_request",
        ),
        (json!("not an object"), "invalid_request"),
        // via_root is for a remote sub-agent's parent: a malformed one is refused.
        (
            json!({ "session_id": "s1", "tool_call_id": "tc-1", "result": {}, "via_root": "a\nb" }),
            "invalid_request",
        ),
        (
            json!({ "session_id": "s1", "tool_call_id": "tc-1", "result": {}, "via_root": 7 }),
            "invalid_request",
        ),
        (
            json!({ "session_id": "s1\n", "tool_call_id": "tc-1", "result": {} }),
            "invalid_request",
        ),
        (
            json!({ "session_id": "s1", "tool_call_id": "tc-1", "result": { "applied": "many" } }),
            "invalid_result",
        ),
        (
            json!({ "session_id": "s1", "tool_call_id": "tc-1", "result": { "applied": -1 } }),
            "invalid_result",
        ),
        // Kind binding: an approval sent to a client call, a result sent to an approval call.
        (
            json!({ "kind": "approval-response", "session_id": "s1", "tool_call_id": "tc-1",
                 "approval_id": "x::tc-1", "approved": true }),
            "invalid_result",
        ),
        (
            json!({ "session_id": "s1", "tool_call_id": "d1", "result": { "applied": 1 } }),
            "invalid_result",
        ),
        (
            json!({ "kind": "approval-response", "session_id": "s1", "tool_call_id": "d1",
                 "approval_id": "wrong::d1", "approved": true }),
            "invalid_result",
        ),
        (
            json!({ "session_id": "s1", "tool_call_id": "tc-1", "result": { "applied": 1, "pad": "x".repeat(2048) } }),
            "payload_too_large",
        ),
        (
            json!({ "session_id": "nobody", "tool_call_id": "tc-1", "result": { "applied": 1 } }),
            "unknown_tool_call",
        ),
        (
            json!({ "session_id": "s1", "tool_call_id": "tc-404", "result": { "applied": 1 } }),
            "unknown_tool_call",
        ),
    ];
    for (envelope, expected) in cases {
        let outcome = runtime.submit_json(&envelope).await?;
        assert_eq!(outcome.code(), expected, "{envelope}: {outcome:?}");
    }
    // The typed path classifies an empty approval id as the JSON path does: a malformed
    // request, not a wrong answer.
    let empty_approval = json!({ "kind": "approval-response", "session_id": "s1",
        "tool_call_id": "d1", "approval_id": "", "approved": true });
    assert_eq!(
        runtime.submit_json(&empty_approval).await?.code(),
        "invalid_request"
    );
    let typed = runtime
        .submit_tool_result(Submit::approval("s1", "d1", "", true, None))
        .await?;
    assert_eq!(
        typed,
        SubmitOutcome::InvalidRequest {
            reason: "approval_id may not be empty".into()
        }
    );
    assert_eq!(runtime.pending(&id).await?, before, "nothing was stored");
    assert!(
        runtime
            .session_ids()
            .await?
            .iter()
            .all(|s| s.as_str() == "s1"),
        "nothing was created"
    );
    let valid = runtime
        .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": 1 })))
        .await?;
    assert_eq!(valid, SubmitOutcome::Accepted);
    Ok(())
}

#[tokio::test]
async fn schema_errors_are_listed_and_error_submissions_skip_the_schema() -> anyhow::Result<()> {
    let runtime = suspended_with_client_and_approval().await?;
    match runtime
        .submit_tool_result(Submit::result("s1", "tc-1", json!({ "applied": "x" })))
        .await?
    {
        SubmitOutcome::InvalidResult { errors, .. } => {
            assert!(errors.iter().any(|e| e.contains("/applied")), "{errors:?}");
        }
        other => anyhow::bail!("expected invalid_result, got {other:?}"),
    }
    let error = runtime
        .submit_tool_result(Submit::error("s1", "tc-1", "user cancelled"))
        .await?;
    assert_eq!(error, SubmitOutcome::Accepted);
    Ok(())
}

#[tokio::test]
async fn a_submit_naming_a_sub_agent_session_is_an_invalid_request() -> anyhow::Result<()> {
    use dormant::store::{Batch, CommitKind, Tree};
    let store = temp_store()?;
    let runtime = editor_runtime(
        Arc::clone(&store),
        ManualClock::new(0),
        calls_then_text(&[("tc-1", "edit")], "done"),
        Arc::default(),
        |b| b,
    )?;
    runtime.execute_on(&"root".parse()?, "editor", "go").await?;
    // A child record, as the sub-agent machinery writes it: same shape, with a parent.
    let mut child = runtime.session(&"root".parse()?).await?;
    child.id = "root-sub-tc-9".parse()?;
    child.parent = Some("root".parse()?);
    let mut bytes = vec![dormant::store::schema::FORMAT_VERSION];
    bytes.extend(rmp_serde::to_vec_named(&child)?);
    let mut batch = Batch::new(CommitKind::Other);
    batch.put(Tree::Sessions, b"root-sub-tc-9".to_vec(), bytes);
    store.commit(batch).await?;
    let outcome = runtime
        .submit_tool_result(Submit::result(
            "root-sub-tc-9",
            "tc-1",
            json!({ "applied": 1 }),
        ))
        .await?;
    assert_eq!(outcome.code(), "invalid_request", "{outcome:?}");
    let valid = runtime
        .submit_tool_result(Submit::result("root", "tc-1", json!({ "applied": 1 })))
        .await?;
    assert_eq!(valid, SubmitOutcome::Accepted);
    Ok(())
}
