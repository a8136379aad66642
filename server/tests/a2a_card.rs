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
