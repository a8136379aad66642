//! Streams of a root whose waiting call belongs to a sub-agent behave the same whether the
//! child is local or on another server: `GET /sse` on the root at rest ends, and
//! `POST /submit-tool-result?resume=true&stream=true` with the child's answer streams the
//! resumed tree (the child's run, copied into the root's stream) to its end.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{read_events, serve, Event, Session, TestServer};
use dormant::remote::RemotePolicy;
use dormant::{
    AgentDefinition, ModelReply, Runtime, RuntimeBuilder, ScriptedLlm, SledStore, ToolCall,
    ToolDefinition,
};
use dormant_server::{Auth, HttpRemoteAgents, ServerConfig};
use serde_json::json;

const KEY: &str = "operator-key-for-tests";

/// Long enough for any run here; a stream that has not ended by then never would.
const BOUND: Duration = Duration::from_secs(20);

fn helper_llm() -> ScriptedLlm {
    ScriptedLlm::new().script(
        "helper",
        vec![
            ModelReply::tool_calls(vec![ToolCall::new("q1", "ask", json!({ "q": "ok?" }))]),
            ModelReply::text("helper done"),
        ],
    )
}

fn lead_script() -> Vec<ModelReply> {
    vec![
        ModelReply::tool_calls(vec![ToolCall::new(
            "d1",
            "delegate",
            json!({ "message": "ask the user" }),
        )]),
        ModelReply::text("lead done"),
    ]
}

fn helper() -> anyhow::Result<AgentDefinition> {
    Ok(AgentDefinition::builder("helper")
        .tool(ToolDefinition::client("ask"))
        .build()?)
}

fn on_temporary_store(llm: ScriptedLlm) -> anyhow::Result<RuntimeBuilder> {
    Ok(Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(llm))
        .background_deadlines(false))
}

/// A root agent `demo` (the name the test client starts) that delegates to `helper`, here
/// or on a second server; the second server, if any, is returned too.
async fn tree(remote: bool) -> anyhow::Result<(TestServer, Option<TestServer>)> {
    if !remote {
        let lead = AgentDefinition::builder("demo")
            .tool(ToolDefinition::sub_agent("delegate", "helper"))
            .build()?;
        let llm = helper_llm().script("demo", lead_script());
        let runtime = on_temporary_store(llm)?
            .agent(lead)
            .agent(helper()?)
            .build()?;
        let server = serve(
            runtime,
            Auth::allow_unauthenticated(),
            ServerConfig::default(),
        );
        return Ok((server.await?, None));
    }
    let far = on_temporary_store(helper_llm())?.agent(helper()?).build()?;
    let far = serve(far, Auth::api_key(KEY), ServerConfig::default()).await?;
    let lead = AgentDefinition::builder("demo")
        .tool(ToolDefinition::remote_sub_agent(
            "delegate", &far.base, "helper",
        ))
        .build()?;
    let runtime = on_temporary_store(ScriptedLlm::new().script("demo", lead_script()))?
        .agent(lead)
        .remote_agents(Arc::new(HttpRemoteAgents::new(Some(KEY.into()))))
        .remote_policy(RemotePolicy {
            attempts: 3,
            backoff: Duration::from_millis(20),
            ..RemotePolicy::default()
        })
        .build()?;
    let server = serve(
        runtime,
        Auth::allow_unauthenticated(),
        ServerConfig::default(),
    );
    Ok((server.await?, Some(far)))
}

async fn bounded<T>(what: &str, work: impl std::future::Future<Output = T>) -> anyhow::Result<T> {
    tokio::time::timeout(BOUND, work)
        .await
        .map_err(|_| anyhow::anyhow!("{what} did not end within {BOUND:?}"))
}

fn names(events: &[Event]) -> Vec<String> {
    events.iter().map(|event| event.name.clone()).collect()
}

async fn streams_of_a_waiting_tree_end_and_show_the_child(remote: bool) -> anyhow::Result<()> {
    let (server, _far) = tree(remote).await?;
    let session: Session = server.start("go").await?;
    let first = bounded("the first run's stream", server.events(&session, "")).await??;
    assert_eq!(
        first.last().map(|event| event.name.as_str()),
        Some("end"),
        "{:?}",
        names(&first)
    );
    let status = server.status(&session).await?;
    assert_eq!(status["status"], "suspended_awaiting_children", "{status}");

    // At rest (nothing runs without a request): a stream from the start shows it all and
    // ends, and so does one that has seen it all (a reconnect), at once.
    let again = bounded("a stream of the root at rest", server.events(&session, "")).await??;
    assert_eq!(names(&again), names(&first));
    let count = status["chunk_count"].as_u64().unwrap_or_default();
    let from = format!("&from={count}");
    let caught_up = server.events(&session, &from);
    let caught_up = bounded("a caught-up stream of the root at rest", caught_up).await??;
    assert_eq!(names(&caught_up), vec!["end".to_string()]);

    // The child's answer, resumed and streamed in one request: the child's run (copied into
    // the root's stream) and the root's to the end.
    let envelope = json!({ "session_id": session.id, "tool_call_id": "q1", "result": "yes" });
    let response = server
        .post(
            "/submit-tool-result?resume=true&stream=true",
            Some(&session.token),
            &envelope,
        )
        .await?;
    assert_eq!(response.status().as_u16(), 200);
    let resumed = bounded(
        "the resumed tree's stream",
        read_events(response, usize::MAX),
    )
    .await??;
    let seen = names(&resumed);
    assert_eq!(
        seen.first().map(String::as_str),
        Some("accepted"),
        "{seen:?}"
    );
    // A child's chunk is copied into the root's stream as `forwarded`, read as its own type.
    let child_text = resumed.iter().any(|event| {
        let kind = &event.data["kind"];
        event.name == "text"
            && kind["type"] == "forwarded"
            && kind["chunk"]["kind"]["text"] == "helper done"
    });
    assert!(child_text, "the child's run is not in the stream: {seen:?}");
    let end = resumed
        .iter()
        .rev()
        .find(|event| event.name == "run_end")
        .map(|event| event.data["kind"]["status"].clone());
    assert_eq!(end, Some(json!("completed")), "{seen:?}");
    assert_eq!(seen.last().map(String::as_str), Some("end"), "{seen:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_of_a_tree_waiting_on_a_local_child() -> anyhow::Result<()> {
    streams_of_a_waiting_tree_end_and_show_the_child(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_of_a_tree_waiting_on_a_remote_child() -> anyhow::Result<()> {
    streams_of_a_waiting_tree_end_and_show_the_child(true).await
}
