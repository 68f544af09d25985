//! Markdown files with YAML front matter (`x-agen/agent.md`, `skills/*/SKILL.md`): splitting the
//! `---` fenced header from the body and turning the YAML into a JSON object.
//!
//! Invariant: the header must open on the first line and close with a `---` line; anything
//! else is an error naming the file, never silently treated as body text.

use serde_json::{Map, Value};

use super::error::{BundleError, Result};

/// The parsed header (a JSON object; empty for an empty header) and the body (trimmed).
pub(crate) struct FrontMatter {
    pub fields: Map<String, Value>,
    pub body: String,
}

pub(crate) fn split(file: &str, text: &str) -> Result<FrontMatter> {
    let err = |message: String| BundleError::FrontMatter {
        file: file.to_string(),
        message,
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or("");
    if first.trim_end() != "---" {
        return Err(err(
            "expected the file to start with a `---` line, then YAML fields, then a closing `---` line".into(),
        ));
    }
    let mut yaml = String::new();
    let mut closed = false;
    let mut consumed = first.len();
    for line in lines.by_ref() {
        consumed += line.len();
        if line.trim_end() == "---" {
            closed = true;
            break;
        }
        yaml.push_str(line);
    }
    if !closed {
        return Err(err(
            "no closing `---` line; expected YAML fields between two `---` lines".into(),
        ));
    }
    let body = text[consumed..].trim().to_string();
    let fields = if yaml.trim().is_empty() {
        Map::new()
    } else {
        let parsed: serde_yaml::Value = serde_yaml::from_str(&yaml).map_err(|e| {
            let at = e
                .location()
                // +1: the opening fence is line 1 of the file.
                .map(|l| format!(" at line {} column {}", l.line() + 1, l.column()))
                .unwrap_or_default();
            // serde_yaml's own positions count from the header, not the file: drop them.
            let full = e.to_string();
            let message = full.split(" at line ").next().unwrap_or(&full).to_string();
            err(format!("invalid YAML{at}: {message}"))
        })?;
        match serde_json::to_value(&parsed) {
            Ok(Value::Object(map)) => map,
            Ok(Value::Null) => Map::new(),
            Ok(_) => {
                return Err(err(
                    "expected `key: value` fields, got a single value or a list".into(),
                ))
            }
            Err(e) => return Err(err(format!("cannot be represented as JSON: {e}"))),
        }
    };
    Ok(FrontMatter { fields, body })
}
