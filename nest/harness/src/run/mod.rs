//! The agent loop: runs one task's run inside an instance (or standalone): system prompt,
//! model, tools (MCP, host tools of an embedding program, built-ins), the loop until the model answers or calls `finish`, and the
//! run log events that make the run resumable.
//!
//! Public API (called by the `agen instance` process for each run the Hub assigns, and by
//! [`crate::standalone`] for `agen run`):
//! - [`Harness::new`] once per instance: bundle, tool backend (the instance's
//!   [`crate::mcp::ToolHost`]), resolved secrets, an HTTP client;
//! - [`Harness::run`] per run: a [`RunAssignment`], a [`RunEventSink`] that appends the run's
//!   events to its log, and a cancellation token; returns the [`RunOutcome`].
//!
//! Files by concern: `harness` (the per-instance [`Harness`] and the tools it offers), `state`
//! (one run's state, event emission, its end), `turn` (one model turn), `native` and `keen_loop`
//! (the two dialects' loops), `replay` (reading earlier attempts' events, for both dialects),
//! `tools` (routing a call, the [`ToolPolicy`], MCP calls and their `_meta`), `builtins` (the
//! built-in tools), `delegate` (`call_agent`/`start_agent`: child tasks through a [`Delegator`]), `remote` and
//! `a2a_client` (`call_agent` to a remote A2A agent), `gate` (permissions: what is offered, what is refused), `approval` (who
//! decides `ask` calls), `budget` (the task's token budget); secrets are taken out of results, errors and traces by [`crate::redact`].
//!
//! Invariants: a run always ends with exactly one `run.finished` event and a [`RunOutcome`]
//! (a model or tool failure never panics or escapes as an error); events hold deltas (one
//! turn's new assistant message, one tool's result), never the whole context; for a
//! side-effecting tool, `tool.started` is durable before the call is sent and
//! `tool.completed`/`tool.failed` is durable before the model sees the result; a provider
//! error ends the run `Failed` with `response_type: "error"` and is never retried as a recall.
//! Arrows run one way: the loops use `state`, `turn`, `tools`, `replay`; nothing here imports
//! a loop.

pub mod a2a_client;
mod approval;
mod budget;
mod builtin_names;
mod builtins;
mod cut;
mod delegate;
mod gate;
mod harness;
mod host;
mod keen_loop;
mod native;
mod output;
mod remote;
mod replay;
mod resources;
mod state;
mod tool_limits;
mod tools;
mod turn;

use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use agen_contract::run::{
    kind as event, Message, ResponseType, RunAssignment, RunEventBody, RunId, RunState,
    RunSuspended, TaskId, WaitingFor,
};
pub use approval::{
    denial_text, ApprovalDecision, ApprovalRequest, ApproveAll, Approver, NoApprover, BY_TIMEOUT,
};
pub use builtin_names::{
    BUILTIN_FINISH, BUILTIN_LOAD_SKILL, BUILTIN_READ_ARTIFACT, BUILTIN_REPORT_PROGRESS,
    BUILTIN_SAVE_ARTIFACT,
};
pub use delegate::{ChildEnd, ChildRequest, Delegator, BUILTIN_CALL_AGENT, BUILTIN_START_AGENT};
pub use harness::{model_config, Dialect, Harness, HarnessError};
pub use host::{
    check_host_tool_name, CallMeta, HostTool, HostToolError, HostToolSpec, ToolContext, ToolError,
};
pub use tools::ToolPolicy;

use crate::mcp::{CallError, ToolHost, ToolInfo, ToolOutput};

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
    /// Appends one event; when `sync`, returns only after it is durable.
    async fn emit(&self, body: RunEventBody, sync: bool) -> Result<(), SinkError>;

    /// Whether a side effect's result is made durable before the model sees it. A local log
    /// says yes (it costs one fsync, and a crash then never turns a finished call into
    /// `effect_unknown`); the fleet's sink says no: there a result is streamed and the ledger
    /// is kept by the order of the run's events (see `run::tools`), one wait per side effect.
    fn durable_results(&self) -> bool {
        false
    }

    /// A piece of model turn `turn`'s answer as it streams: not an event, never durable, never
    /// waited for (only the turn's `model.answered` is the record). Dropped by default.
    fn delta(&self, _turn: u32, _delta: crate::model::ModelDelta<'_>) {}

    /// Fires when the run is to stop at its next safe point (double texting `interrupt`):
    /// before a model turn, or during a model request, never inside a tool call; the run then
    /// ends cancelled, result [`INTERRUPTED`]. `None`: never.
    fn interrupt(&self) -> Option<CancellationToken> {
        None
    }
}

/// The result of a run stopped by an interrupt (see [`RunEventSink::interrupt`]).
pub const INTERRUPTED: &str = "interrupted";

/// How a run ends: its state, its result text and what that text is.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEnd {
    pub state: RunState,
    /// The final answer, or what went wrong.
    pub result: String,
    pub response_type: ResponseType,
    /// Set when the run gave its slot back instead of ending (see [`RunSuspended`]): the
    /// attempt ends with `run.suspended`, not `run.finished`.
    pub suspended: Option<RunSuspended>,
}

impl RunEnd {
    /// The model's final answer.
    pub fn answer(result: impl Into<String>) -> RunEnd {
        RunEnd {
            state: RunState::Succeeded,
            result: result.into(),
            response_type: ResponseType::Text,
            suspended: None,
        }
    }

    /// The model's final answer, JSON that matched the output schema.
    pub fn json_answer(result: impl Into<String>) -> RunEnd {
        RunEnd {
            response_type: ResponseType::Json,
            ..RunEnd::answer(result)
        }
    }

    /// The run failed: `why` says what went wrong and what to do.
    pub fn failed(why: impl Into<String>) -> RunEnd {
        RunEnd {
            state: RunState::Failed,
            result: why.into(),
            response_type: ResponseType::Error,
            suspended: None,
        }
    }

    /// The run waits for `why` without holding its instance (this attempt ends here).
    pub fn suspended(why: RunSuspended) -> RunEnd {
        RunEnd {
            state: RunState::Cancelled,
            result: String::new(),
            response_type: ResponseType::Error,
            suspended: Some(why),
        }
    }

    pub fn cancelled(why: impl Into<String>) -> RunEnd {
        RunEnd {
            state: RunState::Cancelled,
            result: why.into(),
            response_type: ResponseType::Error,
            suspended: None,
        }
    }
}

/// The end of a run, with what it adds to its conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    pub state: RunState,
    /// The final answer, or what went wrong.
    pub result: String,
    pub response_type: ResponseType,
    /// This run's new conversation messages (its user input, the assistant's turns and the
    /// tool results), to append to the conversation.
    pub messages: Vec<Message>,
    /// The run did not end: it gave its instance slot back and waits (its `run.suspended` is
    /// in the log; the instance sends no `run.finished`). Only fleet runs suspend (their
    /// approver and delegator say when, see [`Approver::suspend_after`]).
    pub suspended: Option<RunSuspended>,
}

/// The MCP tools a harness can call: implemented by [`crate::mcp::ToolHost`]; a trait so the
/// harness does not depend on how servers are launched. Tools written in the embedding program
/// are not MCP tools and do not go through here: they are [`HostTool`]s
/// ([`Harness::with_host_tools`]).
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

    /// Starts `server` again after it died, so an interrupted retry-safe call can be sent
    /// again; `Ok` once it is connected. A backend that cannot restart a server says why.
    async fn restart(&self, server: &str) -> Result<(), String> {
        Err(format!("tool server {server} cannot be restarted here"))
    }

    /// The MCP resources the servers listed (`list_resources`; none: the resource built-ins
    /// are not offered).
    fn resources(&self) -> Vec<crate::mcp::ResourceInfo> {
        Vec::new()
    }

    /// Reads resource `uri` of `server` as text (`read_resource`).
    async fn read_resource(
        &self,
        server: &str,
        uri: &str,
        timeout: Duration,
    ) -> Result<String, String> {
        let _ = (uri, timeout);
        Err(format!("tool server {server} has no resources here"))
    }

    /// The text of the MCP prompt `server/prompt` that `agent.md` `systemPrompts` names, as
    /// fetched when the servers started.
    fn system_prompt(&self, name: &str) -> Result<String, String> {
        Err(format!("prompt {name}: no MCP prompts here"))
    }
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

    async fn restart(&self, server: &str) -> Result<(), String> {
        ToolHost::restart(self, server).await
    }

    fn resources(&self) -> Vec<crate::mcp::ResourceInfo> {
        ToolHost::resources(self)
    }

    async fn read_resource(
        &self,
        server: &str,
        uri: &str,
        timeout: Duration,
    ) -> Result<String, String> {
        ToolHost::read_resource(self, server, uri, timeout).await
    }

    fn system_prompt(&self, name: &str) -> Result<String, String> {
        ToolHost::system_prompt(self, name)
    }
}

pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
