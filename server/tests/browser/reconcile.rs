//! A call a crash cut, of a tool that asks for reconciliation, answered in the page: in the
//! inbox, the card says its effect may or may not have happened and shows its idempotency key;
//! "It did not happen" runs the tool once more, "It happened" records what it returned and
//! runs nothing. And in a conversation the crash left running: the page offers to resume it,
//! and the resume raises the reconcile call there.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dormant::definition::OnCut;
use dormant::store::{CommitKind, Store};
use dormant::testkit::{Fault, FaultyStore};
use dormant::{
    AgentDefinition, ModelReply, Runtime, ScriptedLlm, SessionId, SledStore, Status, ToolCall,
    ToolDefinition, ToolError,
};
use dormant_server::ServerConfig;
use serde_json::{json, Value};

use crate::browser::people::{self, OPERATOR_KEY};
use crate::setup;

/// Agent `shop`: `pay` (output `{paid: integer}`) counts its runs; cut calls are reconciled.
fn runtime(store: Arc<dyn Store>, runs: &Arc<AtomicUsize>) -> anyhow::Result<Runtime> {
    let counted = Arc::clone(runs);
    let pay = ToolDefinition::server("pay", move |_input: Value, _ctx| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, ToolError>(json!({ "paid": 10 })) }
    })
    .description("Charges the card.")
    .output_schema(json!({ "type": "object", "required": ["paid"],
                           "properties": { "paid": { "type": "integer" } } }))
    .on_cut(OnCut::Reconcile);
    let shop = AgentDefinition::builder("shop").tool(pay).build()?;
    let reply = |id: &str| {
        vec![
            ModelReply::tool_calls(vec![ToolCall::new(id, "pay", json!({ "cents": 10 }))]),
            ModelReply::text("paid"),
        ]
    };
    let llm = ScriptedLlm::new().script("shop", [reply("p1"), reply("p2")].concat());
    Ok(Runtime::builder()
        .store(store)
        .llm(Arc::new(llm))
        .background_deadlines(false)
        .agent(shop)
        .build()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_reconciles_calls_a_crash_cut_from_the_inbox() -> anyhow::Result<()> {
    let Some(opened) = setup::browser().await? else {
        return Ok(());
    };
    let browser = &opened.browser;
    let store: Arc<dyn Store> = Arc::new(SledStore::temporary()?);
    let runs = Arc::new(AtomicUsize::new(0));
    // Two sessions whose `pay` ran and whose result's commit failed, as if the process died.
    let faulty = Arc::new(FaultyStore::new(Arc::clone(&store)));
    let cut = runtime(faulty.clone(), &runs)?;
    let ids: Vec<SessionId> = vec!["first".parse()?, "second".parse()?, "third".parse()?];
    for id in &ids {
        faulty.arm(Fault::CrashBefore(CommitKind::ToolResults));
        anyhow::ensure!(cut.execute_on(id, "shop", "pay").await.is_err());
        faulty.clear();
    }
    drop(cut);
    let runtime = runtime(store, &runs)?;
    // The first two are resumed here (as a daemon's recovery would); the third is left as the
    // crash left it, for its conversation's page.
    for id in &ids[..2] {
        let waiting = runtime.resume(id).await?;
        anyhow::ensure!(waiting.status == Status::SuspendedClientTool, "{waiting:?}");
    }
    let server =
        crate::common::serve(runtime.clone(), people::auth(), ServerConfig::default()).await?;

    browser.goto(&server.url("/#inbox")).await?;
    browser.type_into("#operator-key", OPERATOR_KEY).await?;
    browser.click("#use-key").await?;
    browser
        .wait_for_text("#inbox-status", "2 calls wait")
        .await?;
    let first = r#"li.inbox-item[data-session-id="first"] form[data-kind="reconcile"]"#;
    browser.wait_for_text(first, "Did pay take effect?").await?;
    browser
        .wait_for_text(first, "may or may not have happened")
        .await?;
    let key = runtime.pending(&ids[0]).await?[0]
        .idempotency_key
        .clone()
        .unwrap_or_default();
    anyhow::ensure!(key.len() == 32);
    browser.wait_for_text(first, &key).await?;
    if let Some(path) = people::screenshot_path("reconcile") {
        browser.screenshot(&path).await?;
    }

    // The first did not happen: it runs once more.
    browser
        .click(&format!(r#"{first} button[data-action="did-not-happen"]"#))
        .await?;
    browser
        .wait_for_text("#inbox-status", "Answered: pay of session first")
        .await?;
    runtime.wait_tree_settled(&ids[0]).await;
    anyhow::ensure!(runtime.status(&ids[0]).await? == Status::Completed);
    anyhow::ensure!(
        runs.load(Ordering::SeqCst) == 4,
        "three cut runs and one more"
    );

    // The second happened: the person says what it returned, and nothing runs.
    let second = r#"li.inbox-item[data-session-id="second"] form[data-kind="reconcile"]"#;
    browser
        .click(&format!(r#"{second} button[data-action="happened"]"#))
        .await?;
    browser.wait_for_text(second, "marked fields").await?;
    browser
        .type_into(&format!(r#"{second} input[name="paid"]"#), "10")
        .await?;
    browser
        .click(&format!(r#"{second} button[data-action="happened"]"#))
        .await?;
    browser
        .wait_for_text("#inbox-status", "Answered: pay of session second")
        .await?;
    runtime.wait_tree_settled(&ids[1]).await;
    anyhow::ensure!(runtime.status(&ids[1]).await? == Status::Completed);
    anyhow::ensure!(runs.load(Ordering::SeqCst) == 4, "nothing ran again");
    let recorded = runtime.messages(&ids[1]).await?.into_iter().any(|message| {
        matches!(message, dormant::Message::Tool { outcome: dormant::types::ToolOutcome::Result(value), .. }
                 if value == json!({ "paid": 10 }))
    });
    anyhow::ensure!(recorded, "the person's result is the call's result");

    // The third: its conversation, opened with its token, offers to resume the run the crash
    // stopped; the resume asks whether `pay` took effect.
    let token = server
        .http
        .post(server.url("/token"))
        .header("x-api-key", OPERATOR_KEY)
        .json(&json!({ "session_id": "third" }))
        .send()
        .await?
        .json::<Value>()
        .await?;
    let remembered = json!({ "session_id": "third", "token": token["token"], "since": 1 });
    browser
        .script(
            "localStorage.setItem('dormant-page', JSON.stringify(arguments[0]));",
            json!([remembered]),
        )
        .await?;
    browser.goto(&server.url("/")).await?;
    browser
        .wait_for_text(
            "#recover-text",
            "The server stopped while this conversation was running",
        )
        .await?;
    browser.click("#resume-run").await?;
    let card = r#"#pending form[data-kind="reconcile"]"#;
    browser.wait_for_text(card, "Did pay take effect?").await?;
    browser
        .click(&format!(r#"{card} button[data-action="did-not-happen"]"#))
        .await?;
    browser.wait_for_text(card, "sent").await?;
    // Nothing else waits: the page resumes the run, which completes.
    browser.wait_for_text("#log", "paid").await?;
    runtime.wait_tree_settled(&ids[2]).await;
    anyhow::ensure!(runtime.status(&ids[2]).await? == Status::Completed);
    anyhow::ensure!(
        runs.load(Ordering::SeqCst) == 5,
        "three cut runs, and one more for each of two"
    );
    opened.close().await?;
    server.stop().await?.shutdown().await?;
    Ok(())
}
