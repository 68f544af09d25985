//! Host tools: tools written in the program that embeds the harness (the SDK's Rust tools), a
//! kind of tool of their own beside MCP tools and built-ins. A [`HostTool`] says what it is
//! ([`HostToolSpec`]: name, description, JSON Schema, `read_only` / `idempotent` hints) and is
//! called with the same `_meta` an MCP call carries, as a [`ToolContext`].
//!
//! Invariants: a host tool goes through the same gate (permissions, approvals), the same
//! [`super::ToolPolicy`] (hints overridable by `x-agen/config.json` `tools.<name>`) and the same
//! effect ledger as an MCP tool: for a side-effecting one, `tool.started` is durable before it
//! is called. A call runs in a task of its own, so a panic is a tool failure, and a cancel or a
//! timeout drops its future (the tool stops at its next `.await`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::builtin_names::BUILTIN_NAMES;
use crate::mcp::{CallError, Interruption, ToolOutput};

/// What a host tool is, as the model and the ledger see it.
#[derive(Debug, Clone, PartialEq)]
pub struct HostToolSpec {
    /// The name the model calls it by, permissions and `tools.<name>` overrides judge it by:
    /// 1 to 64 of `a-z A-Z 0-9 _ -`, not a built-in's.
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments (an object schema).
    pub input_schema: Value,
    /// Reads only: never side-effecting for the ledger, retried freely after a crash.
    pub read_only: bool,
    /// Calling it twice does no more than calling it once: retried after a crash.
    pub idempotent: bool,
}

/// What a host tool call knows of the work it belongs to: the same fields an MCP call gets in
/// `_meta`.
#[derive(Debug, Clone, PartialEq)]
pub struct CallMeta {
    pub namespace: String,
    pub deployment: String,
    pub task_id: String,
    pub run_id: String,
    pub root_run_id: String,
    pub conversation_id: String,
    pub conversation_key: String,
    pub labels: std::collections::BTreeMap<String, String>,
    /// W3C `traceparent` of this call's span.
    pub traceparent: String,
    /// `agen/idempotencyKey`, on side-effecting calls only: the run id and the call's position
    /// in the run, the same on every resume and attempt of this call and different for every
    /// other call, so a tool can deduplicate what Agen could not know (an `effect_unknown`).
    pub idempotency_key: Option<String>,
}

impl CallMeta {
    /// The `_meta` object an MCP call carries (`agen/namespace`, …, `traceparent`).
    pub fn to_map(&self) -> Map<String, Value> {
        let text = |s: &str| Value::String(s.to_string());
        let labels: Map<String, Value> = self
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), text(v)))
            .collect();
        let mut m = Map::new();
        m.insert("agen/namespace".into(), text(&self.namespace));
        m.insert("agen/deployment".into(), text(&self.deployment));
        m.insert("agen/taskId".into(), text(&self.task_id));
        m.insert("agen/runId".into(), text(&self.run_id));
        m.insert("agen/rootRunId".into(), text(&self.root_run_id));
        m.insert("agen/conversationId".into(), text(&self.conversation_id));
        m.insert("agen/conversationKey".into(), text(&self.conversation_key));
        m.insert("agen/labels".into(), Value::Object(labels));
        m.insert("traceparent".into(), text(&self.traceparent));
        if let Some(key) = &self.idempotency_key {
            m.insert("agen/idempotencyKey".into(), text(key));
        }
        m
    }
}

/// The context argument of a host tool call.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The model's id of this call (stable across resumes of the same call).
    pub call_id: String,
    pub meta: CallMeta,
    /// Fires when the run is cancelled or the call times out; the call's future is dropped
    /// right after, so a tool only needs it for work it hands to other tasks.
    pub cancel: CancellationToken,
}

impl ToolContext {
    /// The `_meta` object, exactly as an MCP server would receive it.
    pub fn meta_map(&self) -> Map<String, Value> {
        self.meta.to_map()
    }
}

/// A host tool's own failure: the model is told `message` as the tool's error result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    pub message: String,
}

impl ToolError {
    pub fn new(message: impl Into<String>) -> ToolError {
        ToolError {
            message: message.into(),
        }
    }
}

/// A tool written in the host program. Implement it for a type, or build one from an async
/// closure (the SDK's `Tool` builder).
#[async_trait::async_trait]
pub trait HostTool: Send + Sync + 'static {
    fn spec(&self) -> HostToolSpec;
    /// Runs the call: `Ok(text)` is the result the model sees, `Err` an error result.
    async fn call(&self, arguments: Value, cx: ToolContext) -> Result<String, ToolError>;
}

/// Why a host tool cannot be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostToolError {
    #[error("host tool name `{0}` is not valid; expected 1 to 64 of a-z, A-Z, 0-9, `_` and `-`, e.g. get_weather")]
    BadName(String),
    #[error("host tool name `{0}` is taken by a built-in tool; pick another name")]
    Builtin(String),
}

/// Checks a host tool's name.
pub fn check_host_tool_name(name: &str) -> Result<(), HostToolError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !ok {
        return Err(HostToolError::BadName(name.to_string()));
    }
    if BUILTIN_NAMES.contains(&name) {
        return Err(HostToolError::Builtin(name.to_string()));
    }
    Ok(())
}

/// One registered host tool with its spec read once.
#[derive(Clone)]
pub(super) struct Registered {
    pub spec: HostToolSpec,
    pub tool: Arc<dyn HostTool>,
}

/// Calls `tool` in a task of its own, within `timeout`, stopped by `cancel`.
pub(super) async fn call(
    tool: &Registered,
    arguments: Map<String, Value>,
    cx: ToolContext,
    timeout: Duration,
) -> Result<ToolOutput, CallError> {
    let cancel = cx.cancel.clone();
    let t = tool.tool.clone();
    let mut task = tokio::spawn(async move { t.call(Value::Object(arguments), cx).await });
    let joined = tokio::select! {
        r = &mut task => r,
        _ = cancel.cancelled() => {
            task.abort();
            return Err(CallError::interrupted("host", Interruption::Cancelled));
        }
        _ = tokio::time::sleep(timeout) => {
            cancel.cancel();
            task.abort();
            return Err(CallError::interrupted("host", Interruption::Timeout(timeout)));
        }
    };
    match joined {
        Ok(Ok(text)) => Ok(ToolOutput {
            text,
            is_error: false,
        }),
        Ok(Err(e)) => Ok(ToolOutput {
            text: e.message,
            is_error: true,
        }),
        Err(e) => Err(CallError::Failed {
            server: "host".into(),
            message: if e.is_panic() {
                "the host tool panicked".into()
            } else {
                format!("the host tool's task ended: {e}")
            },
        }),
    }
}
