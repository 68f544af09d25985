//! A `tools/call` result as text for the model: text blocks joined by newlines, other blocks
//! summarised (`[image: image/png, 1234 bytes]`), `structuredContent` as JSON when the result
//! has no text.
//!
//! Works on the wire JSON of each content block, so a block type this version of rmcp does not
//! know still gets a summary.

use rmcp::model::CallToolResult;
use serde_json::Value;

use super::ToolOutput;

pub(crate) fn tool_output(result: &CallToolResult) -> ToolOutput {
    let blocks: Vec<Value> = result
        .content
        .iter()
        .map(|b| serde_json::to_value(b).unwrap_or(Value::Null))
        .collect();
    ToolOutput {
        text: text_of(&blocks, result.structured_content.as_ref()),
        is_error: result.is_error.unwrap_or(false),
    }
}

fn text_of(blocks: &[Value], structured: Option<&Value>) -> String {
    let has_text = blocks
        .iter()
        .any(|b| b.get("type").and_then(Value::as_str) == Some("text"));
    let mut parts = Vec::new();
    if !has_text {
        if let Some(s) = structured {
            parts.push(s.to_string());
        }
    }
    parts.extend(blocks.iter().map(block_text));
    parts.join("\n")
}

fn block_text(b: &Value) -> String {
    let s = |k: &str| b.get(k).and_then(Value::as_str);
    match s("type").unwrap_or("") {
        "text" => s("text").unwrap_or("").to_string(),
        kind @ ("image" | "audio") => format!(
            "[{kind}: {}, {} bytes]",
            s("mimeType").unwrap_or("unknown type"),
            base64_len(s("data").unwrap_or(""))
        ),
        "resource" => {
            let r = b.get("resource").cloned().unwrap_or(Value::Null);
            let rs = |k: &str| r.get(k).and_then(Value::as_str);
            match rs("text") {
                Some(text) => text.to_string(),
                None => format!(
                    "[resource: {}, {}, {} bytes]",
                    rs("uri").unwrap_or("?"),
                    rs("mimeType").unwrap_or("unknown type"),
                    base64_len(rs("blob").unwrap_or(""))
                ),
            }
        }
        "resource_link" => format!(
            "[resource link: {} {}]",
            s("name").unwrap_or(""),
            s("uri").unwrap_or("?")
        ),
        other => format!(
            "[{} content]",
            if other.is_empty() { "unknown" } else { other }
        ),
    }
}

/// Decoded size of base64 `data`.
fn base64_len(data: &str) -> usize {
    let trimmed = data.trim_end_matches('=');
    trimmed.len() * 3 / 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(blocks: Value, structured: Option<Value>, expected: &str) {
        let blocks = blocks.as_array().cloned().unwrap_or_default();
        assert_eq!(text_of(&blocks, structured.as_ref()), expected);
    }

    #[test]
    fn result_text_table() {
        check(
            json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
            None,
            "a\nb",
        );
        check(
            json!([{"type": "text", "text": "see"}, {"type": "image", "mimeType": "image/png", "data": "AAAA"}]),
            None,
            "see\n[image: image/png, 3 bytes]",
        );
        check(json!([]), Some(json!({"n": 1})), "{\"n\":1}");
        check(
            json!([{"type": "text", "text": "t"}]),
            Some(json!({"n": 1})),
            "t",
        );
        check(
            json!([{"type": "resource", "resource": {"uri": "file:///a", "text": "inside"}}]),
            None,
            "inside",
        );
        check(
            json!([{"type": "resource_link", "name": "a.txt", "uri": "file:///a.txt"}]),
            None,
            "[resource link: a.txt file:///a.txt]",
        );
        check(json!([{"type": "hologram"}]), None, "[hologram content]");
        check(json!([]), None, "");
    }
}
