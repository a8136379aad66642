//! How deeply JSON values may nest, and how to look at or drop one that nests deeper than the
//! stack allows.
//!
//! Values reach the runtime from outside (a submitted result, a model's tool-call input, a
//! server tool's result) and are stored in MessagePack, whose decoder refuses anything nested
//! more than 1,024 containers deep. A value nested deeper than that would be accepted and
//! stored, and then the session could never be read again; far deeper, serializing, cloning,
//! validating or even dropping it recurses past the end of a worker's stack and the process
//! aborts. So every value from outside is measured first, here, without recursion, against
//! the runtime's limit (`RuntimeBuilder::max_json_depth`, 128 by default, like serde_json's
//! parser), and one that nests deeper is refused and taken apart without recursion.

use serde_json::Value;

/// The largest `max_json_depth` a runtime accepts: a value at this depth, wrapped in the
/// stored records around it (a log entry, a message, a chunk forwarded up a tree of
/// sub-agents at most [`MAX_TREE_DEPTH`] deep), stays well inside the decoder's 1,024.
pub(crate) const MAX_JSON_DEPTH_LIMIT: usize = 512;

/// The largest `max_depth` (of a tree of sub-agents) a runtime accepts. Each level below the
/// root wraps a forwarded chunk in two more containers, and a stream chunk is decoded through
/// serde's buffered form (it is internally tagged), which costs far more stack per level than
/// a value does: in a debug build, a 512-deep value forwarded up 24 levels overflowed a
/// worker's 2 MiB stack, and up 16 levels did not (`tests/deep_json.rs` holds that case).
pub(crate) const MAX_TREE_DEPTH: u32 = 16;

/// Whether `value` nests more than `limit` arrays and objects deep (a scalar is 0 deep, `[]`
/// and `{}` are 1 deep). It stops at the first container past the limit, and never recurses.
pub(crate) fn exceeds(value: &Value, limit: usize) -> bool {
    let mut stack: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((value, depth)) = stack.pop() {
        let depth = depth + 1;
        match value {
            Value::Array(_) | Value::Object(_) if depth > limit => return true,
            Value::Array(items) => stack.extend(items.iter().map(|item| (item, depth))),
            Value::Object(map) => stack.extend(map.values().map(|item| (item, depth))),
            _ => {}
        }
    }
    false
}

/// Drops `value` without recursing (serde_json's own drop recurses once per level).
pub(crate) fn dismantle(value: Value) {
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.into_iter().map(|(_, item)| item)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `[[…[0]…]]`, `levels` arrays deep, built without recursion.
    fn nested(levels: usize) -> Value {
        let mut value = json!(0);
        for _ in 0..levels {
            value = Value::Array(vec![value]);
        }
        value
    }

    #[test]
    fn depth_counts_containers_and_stops_at_the_limit() {
        assert!(!exceeds(&json!(1), 0));
        assert!(exceeds(&json!([]), 0));
        assert!(!exceeds(&json!({ "a": [1, { "b": 2 }] }), 3));
        assert!(exceeds(&json!({ "a": [1, { "b": 2 }] }), 2));
        assert!(!exceeds(&nested(128), 128));
        assert!(exceeds(&nested(129), 128));
    }

    #[test]
    fn a_value_far_deeper_than_the_stack_is_measured_and_dropped_without_recursing() {
        // Deep enough that serde_json's recursive drop would overflow a test thread's stack.
        let value = nested(1_000_000);
        assert!(exceeds(&value, 128));
        dismantle(value);
    }
}
