//! The A2A v1.0 wire types the Hub speaks (JSON-RPC binding, ProtoJSON field names as PyPI
//! `a2a-sdk` 1.3 sends and parses them): JSON-RPC envelopes, the agent card, messages, tasks,
//! artifacts and stream events. Only the fields the Hub reads or writes are here; unknown
//! fields of a request are ignored (as ProtoJSON parsers do).

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use agen_contract::a2a::{
    AgentCapabilities, AgentCard, AgentInterface, AgentProvider, AgentSkill, Artifact,
    HttpAuthSecurityScheme, Message, Part, Role, SecurityRequirement, SecurityScheme, StringList,
    Task, TaskState, TaskStatus,
};

/// The A2A protocol version the Hub serves.
pub const PROTOCOL_VERSION: &str = "1.0";
/// The protocol binding of the Hub's interface.
pub const BINDING_JSONRPC: &str = "JSONRPC";

/// A JSON-RPC 2.0 request, as [`RpcRequest::parse`] accepts it. `id` is the caller's, echoed
/// untouched (`None`: a notification, which gets no answer).
#[derive(Debug)]
pub struct RpcRequest {
    pub method: String,
    pub params: Option<Value>,
    pub id: Option<Value>,
}

/// The members of a request object, each as sent, checked by [`RpcRequest::parse`].
#[derive(Debug, Deserialize)]
struct RawRequest {
    #[serde(default)]
    jsonrpc: Option<Value>,
    #[serde(default)]
    method: Option<Value>,
    #[serde(default)]
    params: Option<Value>,
    /// `Some(Value::Null)` when sent as `null`, `None` when absent.
    #[serde(default, deserialize_with = "present")]
    id: Option<Value>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

impl RpcRequest {
    /// Reads a request body by JSON-RPC 2.0 §4 and §5.1: not JSON is a parse error (-32700);
    /// JSON that is not a request object is an invalid request (-32600), answered with the
    /// request's `id` when it is a valid id and with `null` otherwise.
    pub fn parse(body: &[u8]) -> Result<RpcRequest, (Value, RpcError)> {
        let invalid = |id: Value, message: String| {
            (
                id,
                RpcError {
                    code: codes::INVALID_REQUEST,
                    message,
                },
            )
        };
        let value: Value = serde_json::from_slice(body).map_err(|e| {
            (
                Value::Null,
                RpcError {
                    code: codes::PARSE_ERROR,
                    message: format!("request: not JSON: {e}"),
                },
            )
        })?;
        if value.is_array() {
            return Err(invalid(
                Value::Null,
                "request: batches are not served; send one JSON-RPC request object per HTTP request".into(),
            ));
        }
        let raw: RawRequest = serde_json::from_value(value).map_err(|_| {
            invalid(
                Value::Null,
                "request: expected a JSON-RPC 2.0 request object".into(),
            )
        })?;
        let id = match raw.id {
            None => None,
            Some(v @ (Value::Null | Value::String(_) | Value::Number(_))) => Some(v),
            Some(_) => {
                return Err(invalid(
                    Value::Null,
                    "id: expected a string, a number or null".into(),
                ))
            }
        };
        let echo = id.clone().unwrap_or(Value::Null);
        match raw.jsonrpc {
            Some(Value::String(v)) if v == "2.0" => {}
            Some(Value::String(v)) => {
                return Err(invalid(
                    echo,
                    format!(
                        "jsonrpc: expected \"2.0\", got {:?}",
                        crate::limits::cut(&v, 20)
                    ),
                ))
            }
            _ => {
                return Err(invalid(
                    echo,
                    "jsonrpc: expected the member \"jsonrpc\": \"2.0\"".into(),
                ))
            }
        }
        let method = match raw.method {
            Some(Value::String(m)) => m,
            Some(_) => return Err(invalid(echo, "method: expected a string".into())),
            None => {
                return Err(invalid(
                    echo,
                    "method: missing; expected the name of an A2A method such as SendMessage"
                        .into(),
                ))
            }
        };
        let params = match raw.params {
            None | Some(Value::Null) => None,
            Some(p @ (Value::Object(_) | Value::Array(_))) => Some(p),
            Some(_) => {
                return Err(invalid(
                    echo,
                    "params: expected an object (or an array), per JSON-RPC 2.0".into(),
                ))
            }
        };
        Ok(RpcRequest { method, params, id })
    }
}

/// A JSON-RPC 2.0 response: a result or an error.
#[derive(Debug, Serialize)]
pub struct RpcResponse<T: Serialize> {
    pub jsonrpc: &'static str,
    pub id: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<RpcError>,
}

impl<T: Serialize> RpcResponse<T> {
    pub fn ok(id: Value, result: T) -> Self {
        RpcResponse {
            jsonrpc: "2.0",
            id,
            result: Some(result),
            error: None,
        }
    }
}

impl RpcResponse<()> {
    pub fn err(id: Value, error: RpcError) -> Self {
        RpcResponse {
            jsonrpc: "2.0",
            id,
            result: None,
            error: Some(error),
        }
    }
}

/// A JSON-RPC error object; `code` is one of the A2A codes (see [`codes`]).
#[derive(Debug, Clone, Serialize)]
pub struct RpcError {
    pub code: i32,
    pub message: String,
}

/// The JSON-RPC error codes of A2A v1.0 that the Hub answers with.
pub mod codes {
    pub const PARSE_ERROR: i32 = -32700;
    pub const INVALID_REQUEST: i32 = -32600;
    pub const METHOD_NOT_FOUND: i32 = -32601;
    pub const INVALID_PARAMS: i32 = -32602;
    pub const INTERNAL: i32 = -32603;
    pub const TASK_NOT_FOUND: i32 = -32001;
    pub const TASK_NOT_CANCELABLE: i32 = -32002;
    pub const PUSH_NOT_SUPPORTED: i32 = -32003;
    pub const UNSUPPORTED_OPERATION: i32 = -32004;
    pub const CONTENT_TYPE_NOT_SUPPORTED: i32 = -32005;
    pub const VERSION_NOT_SUPPORTED: i32 = -32009;
}

/// `SendMessageConfiguration` (the fields the Hub honours).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageConfiguration {
    /// Answer at once with the task as queued instead of when it finished or needs input.
    #[serde(default)]
    pub return_immediately: bool,
    #[serde(default)]
    pub task_push_notification_config: Option<Value>,
}

/// `SendMessageRequest` (params of `SendMessage` and `SendStreamingMessage`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendMessageRequest {
    pub message: Message,
    #[serde(default)]
    pub configuration: Option<SendMessageConfiguration>,
}

/// `GetTaskRequest`, `CancelTaskRequest`, `SubscribeToTaskRequest`: a task by id.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskIdRequest {
    #[serde(default)]
    pub id: String,
    /// `GetTask`: how many history messages to return, the newest (absent: all).
    #[serde(default)]
    pub history_length: Option<i64>,
}

/// A ProtoJSON enum value: its name, or its number.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum EnumValue {
    Name(String),
    Number(i64),
}

/// `ListTasksRequest`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTasksRequest {
    #[serde(default)]
    pub context_id: Option<String>,
    #[serde(default)]
    pub status: Option<EnumValue>,
    #[serde(default)]
    pub page_size: Option<i64>,
    #[serde(default)]
    pub page_token: Option<String>,
    #[serde(default)]
    pub history_length: Option<i64>,
    /// RFC 3339 (a ProtoJSON `Timestamp`).
    #[serde(default)]
    pub status_timestamp_after: Option<String>,
    #[serde(default)]
    pub include_artifacts: Option<bool>,
}

/// `ListTasksResponse`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTasksResponse {
    pub tasks: Vec<Task>,
    pub next_page_token: String,
    pub page_size: i32,
    pub total_size: i32,
}

/// `TaskStatusUpdateEvent`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatusUpdateEvent {
    pub task_id: String,
    pub context_id: String,
    pub status: TaskStatus,
}

/// `TaskArtifactUpdateEvent`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskArtifactUpdateEvent {
    pub task_id: String,
    pub context_id: String,
    pub artifact: Artifact,
    pub append: bool,
    pub last_chunk: bool,
}

/// `SendMessageResponse` (the Hub always answers with the task).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum SendMessageResponse {
    Task(Task),
}

/// `StreamResponse`: one event of `SendStreamingMessage` / `SubscribeToTask`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamResponse {
    Task(Task),
    StatusUpdate(TaskStatusUpdateEvent),
    ArtifactUpdate(TaskArtifactUpdateEvent),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(body: &str) -> (Value, i32) {
        match RpcRequest::parse(body.as_bytes()) {
            Ok(r) => panic!("{body} parsed: {r:?}"),
            Err((id, e)) => (id, e.code),
        }
    }

    #[test]
    fn a_request_is_read_by_json_rpc_2() {
        let ok = RpcRequest::parse(
            br#"{"jsonrpc": "2.0", "method": "GetTask", "params": {"id": "t"}, "id": 4}"#,
        )
        .ok()
        .map(|r| (r.method, r.id));
        assert_eq!(ok, Some(("GetTask".to_string(), Some(Value::from(4)))));
        let note = RpcRequest::parse(br#"{"jsonrpc": "2.0", "method": "GetTask"}"#).ok();
        assert_eq!(note.map(|r| r.id), Some(None), "no id: a notification");
        let table = [
            (
                r#"{"jsonrpc": "2.0", "method": "#,
                Value::Null,
                codes::PARSE_ERROR,
            ),
            (
                r#"{"jsonrpc": "2.0", "id": "a"}"#,
                Value::from("a"),
                codes::INVALID_REQUEST,
            ),
            (
                r#"{"jsonrpc": "1.0", "method": "M", "id": 2}"#,
                Value::from(2),
                codes::INVALID_REQUEST,
            ),
            (
                r#"{"method": "M", "id": 2}"#,
                Value::from(2),
                codes::INVALID_REQUEST,
            ),
            (
                r#"{"jsonrpc": "2.0", "method": "M", "id": {"a": 1}}"#,
                Value::Null,
                codes::INVALID_REQUEST,
            ),
            (
                r#"{"jsonrpc": "2.0", "method": "M", "id": [1]}"#,
                Value::Null,
                codes::INVALID_REQUEST,
            ),
            (
                r#"{"jsonrpc": "2.0", "method": 1, "id": null}"#,
                Value::Null,
                codes::INVALID_REQUEST,
            ),
            (
                r#"{"jsonrpc": "2.0", "method": "M", "params": 3, "id": 1}"#,
                Value::from(1),
                codes::INVALID_REQUEST,
            ),
            (r#"[]"#, Value::Null, codes::INVALID_REQUEST),
            (r#"17"#, Value::Null, codes::INVALID_REQUEST),
        ];
        for (body, id, code) in table {
            assert_eq!(refused(body), (id, code), "{body}");
        }
    }
}
