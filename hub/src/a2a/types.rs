//! The A2A v1.0 wire types the Hub speaks (JSON-RPC binding, ProtoJSON field names as PyPI
//! `a2a-sdk` 1.3 sends and parses them): JSON-RPC envelopes, the agent card, messages, tasks,
//! artifacts and stream events. Only the fields the Hub reads or writes are here; unknown
//! fields of a request are ignored (as ProtoJSON parsers do).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use agen_shared::a2a::{Artifact, Message, Part, Role, Task, TaskState, TaskStatus};

/// The A2A protocol version the Hub serves.
pub const PROTOCOL_VERSION: &str = "1.0";
/// The protocol binding of the Hub's interface.
pub const BINDING_JSONRPC: &str = "JSONRPC";

/// A JSON-RPC 2.0 request. `id` is the caller's, echoed untouched.
#[derive(Debug, Deserialize)]
pub struct RpcRequest {
    #[serde(default)]
    pub jsonrpc: String,
    pub method: String,
    #[serde(default)]
    pub params: Option<Value>,
    #[serde(default)]
    pub id: Value,
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
    /// `GetTask`: how many history messages to return (absent: all).
    #[serde(default)]
    pub history_length: Option<i64>,
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

/// `AgentCard`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCard {
    pub name: String,
    pub description: String,
    pub supported_interfaces: Vec<AgentInterface>,
    pub provider: AgentProvider,
    pub version: String,
    pub capabilities: AgentCapabilities,
    pub security_schemes: BTreeMap<String, SecurityScheme>,
    pub security_requirements: Vec<SecurityRequirement>,
    pub default_input_modes: Vec<String>,
    pub default_output_modes: Vec<String>,
    pub skills: Vec<AgentSkill>,
}

/// `AgentInterface`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInterface {
    pub url: String,
    pub protocol_binding: String,
    pub protocol_version: String,
}

/// `AgentProvider`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentProvider {
    pub organization: String,
    pub url: String,
}

/// `AgentCapabilities`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCapabilities {
    pub streaming: bool,
    pub push_notifications: bool,
}

/// `SecurityScheme` (the Hub offers HTTP bearer authentication only).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SecurityScheme {
    pub http_auth_security_scheme: HttpAuthSecurityScheme,
}

/// `HTTPAuthSecurityScheme`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpAuthSecurityScheme {
    pub description: String,
    pub scheme: String,
}

/// `SecurityRequirement`: scheme name to its scopes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SecurityRequirement {
    pub schemes: BTreeMap<String, StringList>,
}

/// `StringList`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StringList {
    pub list: Vec<String>,
}

/// `AgentSkill`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentSkill {
    pub id: String,
    pub name: String,
    pub description: String,
    pub tags: Vec<String>,
}
