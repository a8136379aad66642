//! An MCP call's result as a tool's result: its structured content if it has one, else its
//! text; `isError` as the tool's own error.

use rmcp::model::{CallToolResult, RawContent};
use serde_json::Value;

use crate::definition::ToolError;

/// The tool result for the model: `structuredContent` when the server gives one, the text
/// when every content item is text (joined by newlines), else the content items as JSON.
pub(super) fn outcome(result: CallToolResult) -> Result<Value, ToolError> {
    if result.is_error == Some(true) {
        let text = text(&result).unwrap_or_else(|| content_json(&result).to_string());
        return Err(ToolError(text));
    }
    if let Some(structured) = result.structured_content {
        return Ok(structured);
    }
    Ok(text(&result)
        .map(Value::String)
        .unwrap_or_else(|| content_json(&result)))
}

/// The text of a result whose items are all text.
fn text(result: &CallToolResult) -> Option<String> {
    let mut parts = Vec::with_capacity(result.content.len());
    for item in &result.content {
        match &item.raw {
            RawContent::Text(text) => parts.push(text.text.as_str()),
            _ => return None,
        }
    }
    Some(parts.join("\n"))
}

fn content_json(result: &CallToolResult) -> Value {
    serde_json::to_value(&result.content).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use rmcp::model::Content;
    use serde_json::json;

    use super::*;

    #[test]
    fn structured_content_wins_then_text_then_items() {
        let mut result = CallToolResult::success(vec![Content::text("42")]);
        assert_eq!(outcome(result.clone()), Ok(json!("42")));
        result.structured_content = Some(json!({ "answer": 42 }));
        assert_eq!(outcome(result), Ok(json!({ "answer": 42 })));
        let image = CallToolResult::success(vec![Content::image("AAAA", "image/png")]);
        let value = outcome(image).unwrap_or_default();
        assert_eq!(value[0]["type"], "image");
    }

    #[test]
    fn an_error_result_is_the_tool_error_with_its_text() {
        let result = CallToolResult::error(vec![Content::text("no such file")]);
        assert_eq!(outcome(result), Err(ToolError::new("no such file")));
    }
}
