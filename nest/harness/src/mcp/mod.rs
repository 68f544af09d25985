//! The tool-server host: launches a bundle's MCP servers exactly as the spec says (command
//! servers with cwd = bundle dir and a cleared environment; url servers over streamable HTTP),
//! lists their tools as `<server>.<tool>`, calls them with `_meta`, a timeout and cancellation,
//! and notices when a server dies.
//!
//! Public API (used by `agen_nest::instance` — the `agen instance` process — and by `run`, the harness loop):
//! - [`ToolHost::start`] starts every server of a bundle (in parallel, each with a start deadline)
//!   and never fails as a whole: a server that does not start is reported in
//!   [`ToolHost::status`] with the first lines of its stderr.
//! - [`ToolHost::tools`] lists the MCP tools that loaded.
//! - [`ToolHost::call`] calls one tool.
//! - [`ToolHost::died`] resolves when any connected server dies (the instance turns unhealthy).
//! - [`ToolHost::shutdown`] closes every client and kills every server's process group.
//!
//! Invariants: a command server's process never outlives the host (own process group,
//! `kill_on_drop`, `PR_SET_PDEATHSIG`, group SIGTERM/SIGKILL on shutdown and on drop); a command
//! server never sees a host variable outside the allowlist of [`launch::ALLOWED_ENV`]; secret
//! values are never logged or put in a reason.

mod host;
mod launch;
mod listing;
mod output;
mod resources;
mod start;
mod stderr;

pub use host::ToolHost;
pub use launch::ALLOWED_ENV;
pub use listing::ResourceInfo;
pub use resources::MAX_RESOURCE_CHARS;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Everything a launch needs besides the bundle itself.
#[derive(Clone)]
pub struct LaunchContext {
    /// Path of the running agen binary: `AGEN_BIN`, and what `"command": "agen"` runs.
    pub agen_bin: PathBuf,
    /// Resolved secret values by name, for `${NAME}` in `env` and `headers`.
    pub secrets: BTreeMap<String, String>,
    /// How long one server may take to start and answer `tools/list`.
    pub start_timeout: Duration,
    /// The environment the allowlist is taken from; `None` = this process's environment.
    /// Tests inject one here instead of mutating their own environment.
    pub host_env: Option<Vec<(String, String)>>,
    /// Who each command server runs as (a separated fleet instance); empty: as this process.
    /// When it is not empty, a command server without a seat is not started.
    pub seats: BTreeMap<String, ServerSeat>,
}

/// Who a command server of a separated instance runs as: a uid and gid of its own (never its
/// instance's, never another server's), its instance's gid as its one supplementary group (so
/// it reads the bundle copy), its own HOME and TMPDIR. Spawned from the instance's privileged
/// thread (`agen_shared::privileged`), with no capability.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ServerSeat {
    pub uid: u32,
    pub gid: u32,
    pub group: u32,
    pub home: PathBuf,
    pub tmp: PathBuf,
}

impl LaunchContext {
    /// A context with no secrets, a 30 s start deadline and this process's environment.
    pub fn new(agen_bin: impl Into<PathBuf>) -> LaunchContext {
        LaunchContext {
            agen_bin: agen_bin.into(),
            secrets: BTreeMap::new(),
            start_timeout: Duration::from_secs(30),
            host_env: None,
            seats: BTreeMap::new(),
        }
    }
}

impl std::fmt::Debug for LaunchContext {
    // Secret values and the host environment are never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchContext")
            .field("agen_bin", &self.agen_bin)
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .field("start_timeout", &self.start_timeout)
            .field("host_env", &self.host_env.as_ref().map(|e| e.len()))
            .field("seats", &self.seats)
            .finish()
    }
}

/// One MCP tool as the harness sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolInfo {
    /// The server's name in `mcp.json`.
    pub server: String,
    /// The tool's own name on that server.
    pub tool: String,
    pub description: String,
    /// JSON Schema of the arguments.
    pub input_schema: serde_json::Value,
    /// `readOnlyHint` from the server.
    pub read_only: bool,
    /// `idempotentHint` from the server.
    pub idempotent: bool,
}

impl ToolInfo {
    /// `<server>.<tool>`, the name in settings, logs and traces.
    pub fn qualified_name(&self) -> String {
        format!("{}.{}", self.server, self.tool)
    }
    /// `<server>_<tool>`, the name the model sees.
    pub fn model_name(&self) -> String {
        format!("{}_{}", self.server, self.tool)
    }
}

/// A server that is not connected, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerProblem {
    pub server: String,
    pub reason: String,
}

/// What the host reports to its Nest.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostStatus {
    pub tools_loaded: u32,
    pub not_connected: Vec<ServerProblem>,
}

/// The result of one tool call, as text for the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub text: String,
    /// The server said `isError: true`.
    pub is_error: bool,
}

/// Why a call produced no result. The variant says whether the call may have reached its server:
/// [`CallError::NotSent`] provably never left this process (it did not run), an
/// [`CallError::Interrupted`] call was handed to its server and no answer came back (it may have
/// run), a [`CallError::Failed`] call was answered with an error.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error(transparent)]
    NotSent(#[from] NotSent),
    #[error("the call to tool server {server} was interrupted: {cause}")]
    Interrupted { server: String, cause: Interruption },
    #[error("tool server {server} failed the call: {message}")]
    Failed { server: String, message: String },
}

/// Why a call was never sent.
#[derive(Debug, thiserror::Error)]
pub enum NotSent {
    #[error("unknown tool {0}")]
    UnknownTool(String),
    #[error("tool server {0} is not connected")]
    NotConnected(String),
    #[error("bad arguments for tool {tool}: {message}")]
    BadArguments { tool: String, message: String },
    /// The run was cancelled before the call was handed to its server.
    #[error("the run was cancelled before the call was sent")]
    Cancelled,
    /// The server did not take the call (its connection was busy) within the call's time.
    #[error("the call could not be sent within {}", agen_shared::duration::format_duration(*.0))]
    Timeout(Duration),
}

/// What cut off a call that was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Interruption {
    #[error("no answer within {}", agen_shared::duration::format_duration(*.0))]
    Timeout(Duration),
    #[error("the call was cancelled")]
    Cancelled,
    /// The server died or its connection closed before it answered.
    #[error("{0}")]
    Lost(String),
}

impl CallError {
    /// Whether the call may have reached its server (and so may have taken effect).
    pub fn may_have_run(&self) -> bool {
        !matches!(self, CallError::NotSent(_))
    }

    /// A call that never left this process because its server is not connected.
    pub fn not_connected(server: impl Into<String>) -> CallError {
        CallError::NotSent(NotSent::NotConnected(server.into()))
    }

    /// A call that was sent to `server` and cut off by `cause`.
    pub fn interrupted(server: impl Into<String>, cause: Interruption) -> CallError {
        CallError::Interrupted {
            server: server.into(),
            cause,
        }
    }
}

/// An error and its sources as one line for people: rmcp's wrapper layers (which name Rust
/// types) are left out, and a message already contained in the one before it is not repeated.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        let msg = err.to_string();
        if !msg.contains("rmcp::") && !parts.iter().any(|p| p.contains(&msg)) {
            parts.push(msg);
        }
        next = err.source();
    }
    if parts.is_empty() {
        return e.to_string();
    }
    parts.join(": ")
}
