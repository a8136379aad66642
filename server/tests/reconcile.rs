//! A call a crash cut, of a tool that asks for reconciliation, over HTTP: `GET /status` and
//! `GET /inbox` list it as `kind: "reconcile"` with its idempotency key, and the submit
//! envelope `{"kind": "reconcile", "happened": false}` runs it once more.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dormant::definition::OnCut;
use dormant::store::{CommitKind, Store};
use dormant::testkit::{Fault, FaultyStore};
use dormant::{AgentDefinition, ModelReply, Runtime, ScriptedLlm, SledStore, ToolCall};
use dormant::{SessionId, ToolDefinition, ToolError};
use dormant_server::{Auth, ServerConfig};
use reqwest::StatusCode;
use serde_json::{json, Value};

use common::answer;

const OPERATOR: &str = "an-operator-key-of-some-length";

/// Agent `shop`: `pay` counts its runs; a cut call of it is reconciled.
fn runtime(store: Arc<dyn Store>, runs: &Arc<AtomicUsize>) -> anyhow::Result<Runtime> {
    let counted = Arc::clone(runs);
    let pay = ToolDefinition::server("pay", move |_input: Value, _ctx| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, ToolError>(json!({ "paid": 10 })) }
    })
    .description("Pays.")
    .on_cut(OnCut::Reconcile);
    let shop = AgentDefinition::builder("shop").tool(pay).build()?;
    let llm = ScriptedLlm::new().script(
        "shop",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new("p1", "pay", json!({ "cents": 10 }))]),
            ModelReply::text("paid"),
        ],
    );
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .background_deadlines(false)
        .agent(shop)
        .build()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_call_is_listed_with_its_key_and_answered_over_http() -> anyhow::Result<()> {
    let store: Arc<dyn Store> = Arc::new(SledStore::temporary()?);
    let runs = Arc::new(AtomicUsize::new(0));
    // `pay` runs, and the commit of its result fails as if the process died there.
    let faulty = Arc::new(FaultyStore::new(Arc::clone(&store)));
    faulty.arm(Fault::CrashBefore(CommitKind::ToolResults));
    let cut = runtime(faulty.clone(), &runs)?;
    let id: SessionId = "s1".parse()?;
    assert!(cut.execute_on(&id, "shop", "pay").await.is_err());
    faulty.clear();
    // Dropped, not shut down: a shutdown closes the store, which the server opens next.
    drop(cut);

    let server = common::serve(
        runtime(store, &runs)?,
        Auth::api_key(OPERATOR),
        ServerConfig::default(),
    )
    .await?;
    let post = |path: &str, body: Value| {
        server
            .http
            .post(server.url(path))
            .header("x-api-key", OPERATOR)
            .json(&body)
            .send()
    };
    let (code, resumed) = answer(post("/resume", json!({ "session_id": "s1" })).await?).await?;
    assert_eq!(code, StatusCode::ACCEPTED, "{resumed}");
    server.runtime.wait_tree_settled(&id).await;

    let get = |path: &str| {
        server
            .http
            .get(server.url(path))
            .header("x-api-key", OPERATOR)
            .send()
    };
    let (code, status) = answer(get("/status?session_id=s1").await?).await?;
    assert_eq!(code, StatusCode::OK, "{status}");
    let call = &status["pending"][0];
    assert_eq!(call["kind"], "reconcile", "{status}");
    assert_eq!(call["tool_name"], "pay");
    assert_eq!(call["description"], "Pays.");
    let key = call["idempotency_key"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(key.len(), 32, "{call}");

    let (code, inbox) = answer(get("/inbox?kind=reconcile").await?).await?;
    assert_eq!(code, StatusCode::OK, "{inbox}");
    assert_eq!(
        inbox["items"][0]["idempotency_key"],
        key.as_str(),
        "{inbox}"
    );

    // A client result is not an answer to it; "did not happen" is.
    let wrong = json!({ "session_id": "s1", "tool_call_id": "p1", "result": { "paid": 10 } });
    let (code, refused) = answer(post("/submit-tool-result", wrong).await?).await?;
    assert_eq!(
        (code, refused["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("invalid_result"))
    );
    let did_not = json!({ "kind": "reconcile", "session_id": "s1", "tool_call_id": "p1",
                          "happened": false });
    let (code, accepted) = answer(post("/submit-tool-result?resume=true", did_not).await?).await?;
    assert_eq!(code, StatusCode::OK, "{accepted}");
    server.runtime.wait_tree_settled(&id).await;
    let (_, status) = answer(get("/status?session_id=s1").await?).await?;
    assert_eq!(status["status"], "completed", "{status}");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "ran once more");
    server.stop().await?.shutdown().await?;
    Ok(())
}
