//! How the A2A client reaches an agent: its card (where its JSON-RPC interface is, whether it
//! streams, whether it is a dormant server), one JSON-RPC call, and the agent's errors as typed
//! refusals. Every body read is bounded.

use std::time::Duration;

use dormant::remote::RemoteError;
use serde_json::{json, Value};

use super::A2aClient;
use crate::a2a::DORMANT_EXTENSION;

/// The most of an agent's answer (or card) read: a task with its history and artifacts.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// Where an agent takes JSON-RPC requests, and what its card says of it.
#[derive(Clone, Debug)]
pub(super) struct Interface {
    pub(super) url: String,
    /// It can stream a task's updates (`SubscribeToTask`).
    pub(super) streaming: bool,
    /// It declares dormant's extension: its tasks list their calls, and its submit contract
    /// judges the answers.
    pub(super) dormant: bool,
}

/// A call that failed, and whether its request may have reached the agent (an answer sent
/// twice must not be applied twice: a request that may have arrived is not sent again).
pub(super) struct Failed {
    pub(super) error: RemoteError,
    pub(super) maybe_sent: bool,
}

impl From<RemoteError> for Failed {
    fn from(error: RemoteError) -> Self {
        Self {
            error,
            maybe_sent: false,
        }
    }
}

impl A2aClient {
    /// The agent's JSON-RPC interface, from its card (asked once).
    pub(super) async fn interface(&self, base: &str) -> Result<Interface, RemoteError> {
        if let Some(interface) = self.known.lock().interfaces.get(base) {
            return Ok(interface.clone());
        }
        let card_url = format!("{base}/.well-known/agent-card.json");
        let response = self
            .authorized(self.client.reqwest().get(&card_url))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|error| crate::remote::unreachable(base, &error))?;
        let status = response.status();
        if !status.is_success() {
            return Err(RemoteError::Refused {
                endpoint: base.to_string(),
                status: status.as_u16(),
                code: "agent_card".into(),
                message: format!("GET {card_url} answered {status}"),
            });
        }
        let body = bounded(base, response).await?;
        let card: Value = serde_json::from_slice(&body)
            .map_err(|error| protocol(base, format!("its agent card: {error}")))?;
        let interface = interface_of(base, &card)?;
        self.known
            .lock()
            .interfaces
            .insert(base.to_string(), interface.clone());
        Ok(interface)
    }

    pub(super) fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.credential {
            Some(credential) => request.header("x-api-key", credential),
            None => request,
        }
    }

    /// One JSON-RPC call: its result, or the agent's error as a typed refusal.
    pub(super) async fn rpc(
        &self,
        base: &str,
        method: &str,
        params: Value,
    ) -> Result<Value, RemoteError> {
        self.rpc_sent(base, method, params, None)
            .await
            .map_err(|failed| failed.error)
    }

    /// [`A2aClient::rpc`], saying of a failure whether the request may have reached the agent,
    /// with the W3C `traceparent` of the run that makes it, if given.
    pub(super) async fn rpc_sent(
        &self,
        base: &str,
        method: &str,
        params: Value,
        traceparent: Option<&str>,
    ) -> Result<Value, Failed> {
        let url = self.interface(base).await?.url;
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
        let mut request = self.authorized(self.client.reqwest().post(&url));
        if let Some(traceparent) = traceparent {
            request = request.header("traceparent", traceparent);
        }
        let response = request
            .header("A2A-Version", "1.0")
            .json(&body)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .map_err(|error| Failed {
                maybe_sent: !error.is_connect(),
                error: crate::remote::unreachable(base, &error),
            })?;
        let status = response.status();
        // Overloaded or going away: try again later, whatever the body says.
        if status.as_u16() == 503 || status.as_u16() == 429 {
            return Err(Failed {
                error: RemoteError::Refused {
                    endpoint: base.to_string(),
                    status: status.as_u16(),
                    code: "http_error".into(),
                    message: format!("{method} answered {status}"),
                },
                maybe_sent: false,
            });
        }
        let bytes = bounded(base, response).await.map_err(|error| Failed {
            error,
            maybe_sent: true,
        })?;
        let answer: Value = match serde_json::from_slice(&bytes) {
            Ok(answer) => answer,
            Err(error) if status.is_success() => {
                return Err(Failed {
                    error: protocol(base, format!("{method}: {error}")),
                    maybe_sent: true,
                })
            }
            Err(_) => Value::Null,
        };
        if let Some(error) = answer.get("error") {
            return Err(refusal(base, error).into());
        }
        if !status.is_success() {
            return Err(RemoteError::Refused {
                endpoint: base.to_string(),
                status: status.as_u16(),
                code: "http_error".into(),
                message: format!("{method} answered {status}"),
            }
            .into());
        }
        answer.get("result").cloned().ok_or_else(|| Failed {
            error: protocol(base, format!("{method}: no result")),
            maybe_sent: true,
        })
    }
}

/// The card's JSON-RPC interface (one of protocol 1.x first), refused if it would take the
/// credential from https to plain http.
fn interface_of(base: &str, card: &Value) -> Result<Interface, RemoteError> {
    let interfaces: Vec<&Value> = card["supportedInterfaces"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|interface| interface["protocolBinding"] == "JSONRPC")
                .collect()
        })
        .unwrap_or_default();
    let chosen = interfaces
        .iter()
        .find(|interface| {
            interface["protocolVersion"]
                .as_str()
                .is_some_and(|version| version.starts_with('1'))
        })
        .or(interfaces.first());
    let url = chosen
        .and_then(|interface| interface["url"].as_str())
        .or_else(|| card["url"].as_str())
        .ok_or_else(|| protocol(base, "its agent card names no JSON-RPC interface".into()))?;
    if base.starts_with("https://") && !url.starts_with("https://") {
        return Err(protocol(
            base,
            format!("its agent card names {url}: not over https, as the card was"),
        ));
    }
    let dormant = card["capabilities"]["extensions"]
        .as_array()
        .is_some_and(|extensions| {
            extensions
                .iter()
                .any(|extension| extension["uri"] == DORMANT_EXTENSION)
        });
    Ok(Interface {
        url: url.to_string(),
        streaming: card["capabilities"]["streaming"] == true,
        dormant,
    })
}

/// The body, refused past [`MAX_BODY`].
async fn bounded(base: &str, response: reqwest::Response) -> Result<Vec<u8>, RemoteError> {
    crate::remote::read_bounded(base, response, MAX_BODY).await
}

/// A JSON-RPC error as a typed refusal: dormant's code from its `ErrorInfo` when it gave one,
/// else `a2a_{code}`. A task the agent does not know is a 404 (the child is lost); an internal
/// error a 503 (tried again: the agent may be restarting).
pub(super) fn refusal(base: &str, error: &Value) -> RemoteError {
    let number = error["code"].as_i64().unwrap_or_default();
    let dormant_code = error["data"].as_array().and_then(|details| {
        details
            .iter()
            .find_map(|detail| detail["metadata"]["code"].as_str())
    });
    let status = match number {
        -32001 => 404,
        -32700 | -32600 | -32602 => 400,
        -32601 | -32004 | -32003 | -32005 | -32009 => 501,
        -32002 => 409,
        -32603 => 503,
        // The agent's own answer, of a kind this side does not know: final (not a 502, which
        // says a proxy could not reach the agent, and is tried again).
        _ => 422,
    };
    RemoteError::Refused {
        endpoint: base.to_string(),
        status,
        code: dormant_code.map_or_else(|| format!("a2a_{number}"), str::to_string),
        message: error["message"].as_str().unwrap_or_default().to_string(),
    }
}

pub(super) fn protocol(base: &str, reason: String) -> RemoteError {
    RemoteError::Protocol {
        endpoint: base.to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_errors_are_typed_refusals_with_dormants_code_when_given() {
        let plain = refusal("http://a", &json!({"code": -32001, "message": "no task"}));
        assert!(plain.is_not_found(), "{plain}");
        let internal = refusal(
            "http://a",
            &json!({"code": -32603, "message": "restarting"}),
        );
        assert!(internal.is_retryable(), "{internal}");
        let dormant = refusal(
            "http://a",
            &json!({"code": -32004, "message": "answered", "data": [
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "ALREADY_COMPLETED",
                 "metadata": {"code": "already_completed"}}
            ]}),
        );
        assert!(
            matches!(&dormant, RemoteError::Refused { code, .. } if code == "already_completed"),
            "{dormant}"
        );
        let other = refusal("http://a", &json!({"code": -32601, "message": "no"}));
        assert!(matches!(other, RemoteError::Refused { ref code, .. } if code == "a2a_-32601"));
    }

    #[test]
    fn a_card_is_read_for_its_interface_and_a_downgrade_is_refused() -> Result<(), String> {
        let card = json!({
            "supportedInterfaces": [
                {"url": "https://a/v03", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
                {"url": "https://a/v1", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            ],
            "capabilities": {"streaming": true, "extensions": [{"uri": DORMANT_EXTENSION}]},
        });
        let interface = interface_of("https://a", &card).map_err(|error| error.to_string())?;
        assert_eq!(interface.url, "https://a/v1");
        assert!(interface.streaming && interface.dormant);
        let plain = json!({"supportedInterfaces": [
            {"url": "http://a/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}]});
        assert!(interface_of("https://a", &plain).is_err());
        let other = interface_of("http://a", &plain).map_err(|error| error.to_string())?;
        assert!(!other.dormant && !other.streaming);
        Ok(())
    }
}
