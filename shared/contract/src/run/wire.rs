//! The run contract inside protobuf strings: a conversation history and the replay of earlier
//! attempts travel as JSON text (`FetchRunContext` chunks, put together by the Nest). Reading is lenient per item (an unreadable
//! message or event is skipped with a warning, never the whole run); writing is exact.

use serde::Deserialize;
use serde_json::Value;

use super::{Message, RunEventBody, UnknownEvent};

/// A conversation history from its JSON text (`""` is none).
pub fn history(text: &str) -> Vec<Message> {
    items(text, "conversation history")
        .into_iter()
        .enumerate()
        .filter_map(|(i, v)| match serde_json::from_value::<Message>(v) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!("conversation history message {i} is not a message, skipped: {e}");
                None
            }
        })
        .collect()
}

/// The JSON text of a conversation history.
pub fn history_to_wire(messages: &[Message]) -> String {
    serde_json::to_string(messages).unwrap_or_else(|_| "[]".into())
}

/// One replayed event as the Hub sends it: `{"kind", "json"}`, where `json` is the fields'
/// object or a string holding it (other keys, such as `seq`, are ignored).
#[derive(Deserialize)]
struct WireRecord {
    kind: String,
    #[serde(default)]
    json: Value,
}

/// The replay of earlier attempts from its JSON text (`""` is none).
pub fn replay(text: &str) -> Vec<RunEventBody> {
    items(text, "replay")
        .into_iter()
        .filter_map(|v| {
            let r: WireRecord = serde_json::from_value(v).ok()?;
            let json = match r.json {
                Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
                other => other,
            };
            Some(
                RunEventBody::from_parts(&r.kind, json.clone()).unwrap_or_else(|e| {
                    tracing::warn!("replayed event not readable, kept as unknown: {e}");
                    RunEventBody::Unknown(UnknownEvent { kind: r.kind, json })
                }),
            )
        })
        .collect()
}

/// The JSON text of a replay.
pub fn replay_to_wire(events: &[RunEventBody]) -> String {
    serde_json::to_string(events).unwrap_or_else(|_| "[]".into())
}

fn items(text: &str, what: &str) -> Vec<Value> {
    if text.trim().is_empty() {
        return Vec::new();
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(v)) => v,
        Ok(_) | Err(_) => {
            tracing::warn!("{what} from the hub is not a JSON array; ignored");
            Vec::new()
        }
    }
}
