//! The agent harness: runs one task's run inside an instance (or standalone): system prompt,
//! model, tools (MCP + built-ins), the loop until the model answers or calls `finish`, and the
//! run log events that make the run resumable.
//!
//! Public API (called by the `agen instance` process for each run the Hub assigns, and by
//! [`standalone`] for `agen run`):
//! - [`Harness::new`] once per instance: bundle, tool backend (the instance's
//!   [`crate::mcp::ToolHost`]), resolved secrets, an HTTP client;
//! - [`Harness::run`] per run: a [`RunRequest`], a [`RunEventSink`] that appends the run's
//!   events to its log, and a cancellation token; returns the [`RunOutcome`].
//!
//! Invariants: a run always ends with exactly one `run.finished` event and a [`RunOutcome`]
//! (a model or tool failure never panics or escapes as an error); events hold deltas (one
//! turn's new assistant message, one tool's result), never the whole context; for a
//! side-effecting tool, `tool.started` is durable before the call is sent and
//! `tool.completed`/`tool.failed` is durable before the model sees the result; a provider
//! error ends the run `Failed` with `response_type: "error"` and is never retried as a recall.

mod harness;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use harness::{
    model_config, Dialect, Harness, HarnessError, BUILTIN_FINISH, BUILTIN_LOAD_SKILL,
    BUILTIN_READ_ARTIFACT, BUILTIN_REPORT_PROGRESS, BUILTIN_SAVE_ARTIFACT,
};

use crate::mcp::{CallError, ToolHost, ToolInfo, ToolOutput};

/// One run to execute, as assigned by the Hub (or made up by `agen run`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunRequest {
    pub run_id: String,
    /// 1 for the first attempt; a resume elsewhere has a higher attempt.
    pub attempt: u32,
    pub task_id: String,
    pub namespace: String,
    pub deployment: String,
    /// The task's input text (this run's user message).
    pub input: String,
    pub labels: BTreeMap<String, String>,
    pub conversation_id: String,
    /// The caller's key; empty when the task has none.
    pub conversation_key: String,
    /// The first run of the delegation tree (this run's id when it was not delegated).
    pub root_run_id: String,
    /// Earlier messages of the conversation, in the JSON form of [`crate::model::Message`]
    /// (what earlier [`RunOutcome::messages`] held).
    pub history: Vec<Value>,
    /// Events of earlier attempts of this run, in order; may be empty. Both dialects resume
    /// from them (answered turns are reused, recorded results too, an interrupted
    /// side-effecting call becomes `effect_unknown`; Keen calls are keyed `keen_<turn>`).
    pub replay: Vec<RunEventRecord>,
}

/// One event of a run log, as replayed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEventRecord {
    pub kind: String,
    pub json: Value,
}

/// Event kinds the harness emits, and their JSON.
pub mod event {
    /// `{"turn": n}` (`{"flow_agent": true}` for a Keen flow's agent node): a model request is
    /// about to be sent.
    pub const MODEL_REQUESTED: &str = "model.requested";
    /// `{"turn": n, "message": <the new assistant message>, "usage": {...}|null, "stop_reason"}`:
    /// the turn's delta, never the whole context. A resume rebuilds the context from these.
    pub const MODEL_ANSWERED: &str = "model.answered";
    /// `{"call_id", "tool" (<server>.<tool>, or a Keen tool's name), "model_name", "side_effect",
    /// "arguments"?}` (`arguments` only with `traceToolArguments`, secrets redacted, 4 KiB);
    /// emitted with `sync` for a side-effecting tool, before the call is sent.
    pub const TOOL_STARTED: &str = "tool.started";
    /// `{"call_id", "tool", "result", "is_error", "duration_ms"}`; `sync` when side-effecting.
    pub const TOOL_COMPLETED: &str = "tool.completed";
    /// `{"call_id", "tool", "error" (what the model was told), "reason":
    /// "timeout"|"cancelled"|"failed"|"unknown_tool"|"bad_arguments"|"limit"|"effect_unknown",
    /// "duration_ms"}`; `sync` when side-effecting.
    pub const TOOL_FAILED: &str = "tool.failed";
    /// `{"activity": "calling time.get_current_time"}`: what the run is doing now.
    pub const ACTIVITY: &str = "activity";
    /// The arguments of a `report_progress` call (at most one event per 10 s; the latest
    /// held-back report is sent when due or at the run's end).
    pub const TASK_PROGRESS: &str = "task.progress";
    /// `{"id" (sha256:<hex>), "name", "media_type", "size"}`: `save_artifact` stored an
    /// artifact (or found the same bytes already stored).
    pub const ARTIFACT_SAVED: &str = "artifact.saved";
    /// `{"state": "succeeded"|"failed"|"cancelled", "result", "response_type"}`; always the
    /// last event of a run, with `sync`.
    pub const RUN_FINISHED: &str = "run.finished";
    /// `{"reason"}`: sent by the Nest (not the harness) when the instance process died
    /// mid-run, or was stopped, or is not on the Nest; the Hub re-dispatches the run with
    /// attempt + 1. Replay ignores it.
    pub const RUN_INTERRUPTED: &str = "run.interrupted";
}

/// Why an event could not be appended.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SinkError {
    /// This attempt was superseded by a newer one: the run must stop at once.
    #[error("run attempt is fenced off by a newer attempt")]
    Fenced,
    #[error("run log unavailable: {0}")]
    Unavailable(String),
}

/// Where a run's events go: the Nest link (fleet) or a local sled log (standalone).
#[async_trait::async_trait]
pub trait RunEventSink: Send + Sync {
    /// Appends one event (kinds in [`event`]); when `sync`, returns only after it is durable.
    async fn emit(&self, kind: &str, json: Value, sync: bool) -> Result<(), SinkError>;
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Succeeded,
    Failed,
    Cancelled,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Cancelled => "cancelled",
        }
    }
}

/// The end of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    pub state: RunState,
    /// The final answer, or what went wrong.
    pub result: String,
    /// `"text"` or `"error"`.
    pub response_type: String,
    /// This run's new conversation messages (its user input, the assistant's turns and the
    /// tool results), in the JSON form of [`crate::model::Message`], to append to the
    /// conversation.
    pub messages: Vec<Value>,
}

/// The tools a harness can call: implemented by [`crate::mcp::ToolHost`]; a trait so the
/// harness does not depend on how servers are launched.
#[async_trait::async_trait]
pub trait ToolBackend: Send + Sync {
    /// The MCP tools that loaded.
    fn tools(&self) -> Vec<ToolInfo>;
    /// Calls `<server>.<tool>` with `arguments` and `meta` (sent as `_meta`), within `timeout`;
    /// `cancel` aborts the call (MCP cancel notification).
    async fn call_tool(
        &self,
        tool: &ToolInfo,
        arguments: serde_json::Map<String, Value>,
        meta: serde_json::Map<String, Value>,
        timeout: Duration,
        cancel: CancellationToken,
    ) -> Result<ToolOutput, CallError>;
}

#[async_trait::async_trait]
impl ToolBackend for ToolHost {
    fn tools(&self) -> Vec<ToolInfo> {
        ToolHost::tools(self)
    }

    async fn call_tool(
        &self,
        tool: &ToolInfo,
        arguments: serde_json::Map<String, Value>,
        meta: serde_json::Map<String, Value>,
        timeout: Duration,
        cancel: CancellationToken,
    ) -> Result<ToolOutput, CallError> {
        self.call(
            &tool.qualified_name(),
            Value::Object(arguments),
            meta,
            timeout,
            cancel,
        )
        .await
    }
}
