//! One line of an instance's stderr, read back: the instance logs JSON (`AGEN_LOG_FORMAT=json`,
//! set by the Nest), so its level, its message and, for a tool server's stderr (target
//! `agen::mcp::server`, field `server`), the server it came from are read, not guessed. A line
//! that is not such JSON (a panic, a library writing to stderr) is kept whole.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// The target the instance logs its tool servers' stderr lines under.
pub const SERVER_TARGET: &str = "agen::mcp::server";

/// What one stderr line of an instance says.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceLine {
    /// The tool server whose stderr this is; `None` for the instance's own line.
    pub server: Option<String>,
    /// `ERROR` … `TRACE`, or empty for a raw line.
    pub level: String,
    /// The message, then the event's other fields as ` key=value`.
    pub text: String,
}

#[derive(Deserialize)]
struct JsonLine {
    level: String,
    #[serde(default)]
    target: String,
    #[serde(default)]
    fields: BTreeMap<String, Value>,
}

/// Reads one line of an instance's stderr.
pub fn parse_instance_line(line: &str) -> InstanceLine {
    let raw = || InstanceLine {
        server: None,
        level: String::new(),
        text: line.to_string(),
    };
    if !line.starts_with('{') {
        return raw();
    }
    let Ok(mut json) = serde_json::from_str::<JsonLine>(line) else {
        return raw();
    };
    let mut text = match json.fields.remove("message") {
        Some(Value::String(s)) => s,
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let server = if json.target == SERVER_TARGET {
        match json.fields.remove("server") {
            Some(Value::String(s)) => Some(s),
            _ => None,
        }
    } else {
        None
    };
    // The Nest tags every line with the instance id itself: once per line.
    json.fields.remove("instance");
    for (k, v) in &json.fields {
        let v = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        text.push_str(&format!(" {k}={v}"));
    }
    InstanceLine {
        server,
        level: json.level,
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[track_caller]
    fn check(line: &str, server: Option<&str>, level: &str, text: &str) {
        assert_eq!(
            parse_instance_line(line),
            InstanceLine {
                server: server.map(str::to_string),
                level: level.to_string(),
                text: text.to_string()
            }
        );
    }

    #[test]
    fn instance_lines_are_read_by_their_fields() {
        check(
            r#"{"timestamp":"2026-12-01T10:00:00Z","level":"INFO","fields":{"message":"hello","server":"crm"},"target":"agen::mcp::server"}"#,
            Some("crm"),
            "INFO",
            "hello",
        );
        check(
            r#"{"timestamp":"t","level":"WARN","fields":{"message":"server failed","server":"crm","code":3,"instance":"i-1"},"target":"agen_harness::mcp::host"}"#,
            None,
            "WARN",
            "server failed code=3 server=crm",
        );
        check(
            "thread 'main' panicked at x",
            None,
            "",
            "thread 'main' panicked at x",
        );
        check("{not json", None, "", "{not json");
    }
}
