//! What an approval is bound to: a digest of the call it approves, its input and its tool's
//! definition. A decision given for one call is then never applied to another — a call whose
//! input was changed, or whose tool was redefined since the request.

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::tool::{Approval, ToolDefinition, ToolKind};

/// The binding of an approval request for a call of `tool` with `input`: the hex SHA-256 of
/// the input and the tool's definition (name, kind, description, schemas, approval, retry
/// and finish flags), each in a canonical JSON form (object keys sorted), so that the same
/// call gives the same binding in any process and after any restart.
pub(crate) fn approval_binding(tool: &ToolDefinition, input: &Value) -> String {
    let kind = match &tool.kind {
        ToolKind::Server(_) => serde_json::json!({ "server": null }),
        ToolKind::Client { timeout_ms } => serde_json::json!({ "client": timeout_ms }),
        ToolKind::SubAgent { agent } => serde_json::json!({ "sub_agent": agent }),
        ToolKind::RemoteSubAgent { endpoint, agent } => {
            serde_json::json!({ "remote_sub_agent": [endpoint, agent] })
        }
    };
    let approval = match &tool.approval {
        Approval::Never => "never",
        Approval::Always => "always",
        Approval::Editable => "editable",
        Approval::When(_) => "when",
    };
    let definition = serde_json::json!({
        "name": tool.name,
        "kind": kind,
        "description": tool.description,
        "input_schema": tool.input_schema,
        "output_schema": tool.output_schema,
        "approval": approval,
        "safe_to_retry": tool.safe_to_retry,
        "finish_with": tool.finish_with,
    });
    let mut hasher = Sha256::new();
    for part in [input, &definition] {
        let mut text = String::new();
        canonical(part, &mut text);
        hasher.update((text.len() as u64).to_be_bytes());
        hasher.update(text.as_bytes());
    }
    hasher
        .finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// `value` as JSON with every object's keys in order.
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (index, key) in keys.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                if let Some(item) = map.get(key) {
                    canonical(item, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_binding_is_the_same_for_the_same_call_and_differs_for_any_change() {
        let tool = || ToolDefinition::client("edit").description("Edit the draft");
        let a = approval_binding(&tool(), &json!({ "a": 1, "b": [1, 2] }));
        // Key order does not matter; anything else does.
        assert_eq!(
            a,
            approval_binding(&tool(), &json!({ "b": [1, 2], "a": 1 }))
        );
        assert_ne!(
            a,
            approval_binding(&tool(), &json!({ "a": 1, "b": [2, 1] }))
        );
        assert_ne!(
            a,
            approval_binding(
                &tool().description("Edit it"),
                &json!({ "a": 1, "b": [1, 2] })
            )
        );
        assert_eq!(a.len(), 64);
    }
}
