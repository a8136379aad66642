//! The A2A agent card says how a caller authenticates: a session's token always, the API key
//! when the server checks one.

mod common;

use std::sync::Arc;

use dormant::{AgentDefinition, ModelReply, Runtime, ScriptedLlm, SledStore};
use dormant_server::{Auth, ServerConfig};
use reqwest::StatusCode;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_card_names_the_api_key_and_the_session_token() -> anyhow::Result<()> {
    let runtime = Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(
            ScriptedLlm::new().script("desk", vec![ModelReply::text("hi")]),
        ))
        .agent(AgentDefinition::builder("desk").build()?)
        .build()?;
    let config = ServerConfig::default().page_agent("desk");
    let server = common::serve(
        runtime,
        Auth::api_key("an-operator-key-of-some-length"),
        config,
    )
    .await?;
    // The card is public: no credential.
    let response = server
        .http
        .get(server.url("/.well-known/agent-card.json"))
        .send()
        .await?;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response
            .headers()
            .get("cache-control")
            .and_then(|value| value.to_str().ok()),
        Some("no-store")
    );
    let card: Value = response.json().await?;
    assert_eq!(card["name"], "desk");
    assert_eq!(card["supportedInterfaces"][0]["protocolBinding"], "JSONRPC");
    assert_eq!(
        card["securitySchemes"]["apiKey"]["apiKeySecurityScheme"]["name"],
        "x-api-key"
    );
    assert_eq!(
        card["securitySchemes"]["sessionToken"]["httpAuthSecurityScheme"]["scheme"],
        "bearer"
    );
    let alternatives: Vec<&str> = card["securityRequirements"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter_map(|requirement| {
                    requirement["schemes"]
                        .as_object()?
                        .keys()
                        .next()
                        .map(String::as_str)
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(alternatives, ["sessionToken", "apiKey"]);
    server.stop().await?.shutdown().await?;
    Ok(())
}

/// Each agent has a card of its own, whose interface starts that agent's tasks; an agent the
/// server does not have is a typed 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_agent_has_a_card_and_an_endpoint_of_its_own() -> anyhow::Result<()> {
    let runtime = Runtime::builder()
        .store(Arc::new(SledStore::temporary()?))
        .llm(Arc::new(
            ScriptedLlm::new()
                .script("desk", vec![ModelReply::text("desk here")])
                .script("archive", vec![ModelReply::text("archive here")]),
        ))
        .agent(AgentDefinition::builder("desk").build()?)
        .agent(AgentDefinition::builder("archive").build()?)
        .build()?;
    let config = ServerConfig::default().page_agent("desk");
    let server = common::serve(runtime, Auth::allow_unauthenticated(), config).await?;
    let card: Value = server
        .http
        .get(server.url("/a2a/archive/.well-known/agent-card.json"))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(card["name"], "archive");
    let url = card["supportedInterfaces"][0]["url"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(url.ends_with("/a2a/archive"), "{card}");
    // Behind a TLS proxy that says so, the interface is https.
    let proxied: Value = server
        .http
        .get(server.url("/a2a/archive/.well-known/agent-card.json"))
        .header("x-forwarded-proto", "https")
        .send()
        .await?
        .json()
        .await?;
    let proxied_url = proxied["supportedInterfaces"][0]["url"]
        .as_str()
        .unwrap_or_default();
    assert!(proxied_url.starts_with("https://"), "{proxied}");

    let message = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": { "message": {
            "messageId": "m-1", "role": "ROLE_USER", "parts": [{ "text": "hello" }],
        } },
    });
    let answer: Value = server
        .http
        .post(&url)
        .header("A2A-Version", "1.0")
        .json(&message)
        .send()
        .await?
        .json()
        .await?;
    let task = &answer["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{answer}");
    assert_eq!(task["artifacts"][0]["parts"][0]["text"], "archive here");

    let missing = server
        .http
        .get(server.url("/a2a/nobody/.well-known/agent-card.json"))
        .send()
        .await?;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let body: Value = missing.json().await?;
    assert_eq!(body["code"], "unknown_agent");
    // A name that is no text once decoded is a JSON error like any other.
    let garbled = server
        .http
        .get(server.url("/a2a/%FF/.well-known/agent-card.json"))
        .send()
        .await?;
    assert_eq!(garbled.status(), StatusCode::BAD_REQUEST);
    let body: Value = garbled.json().await?;
    assert_eq!(body["code"], "invalid_request", "{body}");
    // Each agent's endpoint counts under its route's name, not as `other`.
    let metrics = server.http.get(server.url("/metrics")).send().await?;
    let metrics = metrics.text().await?;
    assert!(
        metrics.contains("dormant_http_requests_total{route=\"/a2a/{agent}\",status=\"200\"} 1"),
        "{metrics}"
    );
    server.stop().await?.shutdown().await?;
    Ok(())
}
