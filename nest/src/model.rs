//! The Nest's domain: what the Hub asks of it (place an instance, run a run, send logs) and
//! what it tells the Hub (instance reports, run events), as the Nest's own types.
//!
//! Invariant: nothing here knows protobuf. The supervisor, the outbox, the relays and the
//! socket speak these types; `hub_client::convert` is the one place that turns them into the
//! Hub's messages and back (as the Hub's `server/convert.rs` does on its side).

use std::collections::BTreeMap;

use agen_contract::run::RunEventBody;
use serde::{Deserialize, Serialize};

/// The Hub's order to run an instance here (`PlaceInstance`).
#[derive(Clone, Default, PartialEq)]
pub struct PlaceOrder {
    pub instance_id: String,
    pub namespace: String,
    pub deployment: String,
    pub bundle_digest: String,
    pub generation: u64,
    /// Runs at once (0 from an older Hub: 1).
    pub concurrency: u32,
    /// Values of the bundle's `source: platform` secrets, by name (never logged).
    pub platform_secrets: BTreeMap<String, String>,
    /// What the instance with its tool servers may use (see `cgroup`).
    pub resources: agen_shared::bundle::ResourceSpec,
}

impl std::fmt::Debug for PlaceOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlaceOrder")
            .field("instance_id", &self.instance_id)
            .field("namespace", &self.namespace)
            .field("deployment", &self.deployment)
            .field("bundle_digest", &self.bundle_digest)
            .field("generation", &self.generation)
            .field("concurrency", &self.concurrency)
            .field(
                "platform_secrets",
                &self.platform_secrets.keys().collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// An instance's state as this Nest reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    /// Waiting for what it needs on this Nest (a free uid of the range); the message says what.
    Pending,
    Starting,
    Running,
    Unhealthy,
    Stopping,
}

impl InstanceState {
    /// The lowercase name (metrics labels).
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Pending => "pending",
            InstanceState::Starting => "starting",
            InstanceState::Running => "running",
            InstanceState::Unhealthy => "unhealthy",
            InstanceState::Stopping => "stopping",
        }
    }
}

/// A tool server that is not connected, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerProblem {
    pub server: String,
    pub reason: String,
}

/// A run handed to an instance, at its attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAttempt {
    pub run_id: String,
    pub attempt: u32,
}

/// What this Nest says about one of its instances.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceReport {
    pub instance_id: String,
    pub namespace: String,
    pub deployment: String,
    pub bundle_digest: String,
    pub generation: u64,
    pub state: InstanceState,
    pub healthy: bool,
    /// MCP tools only.
    pub tools_loaded: u32,
    pub servers_not_connected: Vec<ServerProblem>,
    /// Why it is in this state.
    pub message: String,
    pub restarts: u32,
    pub pid: u32,
    /// Runs the instance says it executes now (run ids).
    pub active_runs: Vec<String>,
    /// `<server>.<tool>` names.
    pub tools: Vec<String>,
    /// The MCP resources its tool servers listed at their start.
    pub resources: Vec<agen_harness::mcp::ResourceInfo>,
    /// The runs handed to the instance (queued or executing), by run id.
    pub run_attempts: Vec<RunAttempt>,
    /// Its group's CPU and memory (the instance with its tool servers), then each tool
    /// server's own; filled when a snapshot is taken.
    pub usage: Option<UsageSample>,
    pub servers_usage: Vec<UsageSample>,
    /// Times its processes were killed by its memory limit.
    pub oom_kills: u32,
}

/// Measured use of an instance or a tool server (`name`: the server, empty for the instance).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageSample {
    pub name: String,
    pub cpu_percent: f64,
    pub cpu_seconds: f64,
    pub memory_bytes: u64,
    pub pids: u32,
}

impl InstanceReport {
    /// The first report of a placed instance.
    pub fn new(p: &PlaceOrder, state: InstanceState, message: String) -> InstanceReport {
        InstanceReport {
            instance_id: p.instance_id.clone(),
            namespace: p.namespace.clone(),
            deployment: p.deployment.clone(),
            bundle_digest: p.bundle_digest.clone(),
            generation: p.generation,
            state,
            healthy: false,
            tools_loaded: 0,
            servers_not_connected: Vec::new(),
            message,
            restarts: 0,
            pid: 0,
            active_runs: Vec::new(),
            tools: Vec::new(),
            resources: Vec::new(),
            run_attempts: Vec::new(),
            usage: None,
            servers_usage: Vec::new(),
            oom_kills: 0,
        }
    }
}

/// The Hub's order to run a run on one of this Nest's instances (`AssignRun`), before it
/// becomes the instance's [`crate::socket::RunOrder`]; and the lease a run's calls name.
pub use agen_contract::run::{AssignedRun, RunLease};

/// One run event on its way to the Hub, keyed `(run_id, attempt, seq)`. On the Nest socket
/// it is one JSON line with the body's `kind` and `json` beside the key (see `socket`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEvent {
    pub run_id: String,
    pub attempt: u32,
    pub seq: u64,
    pub task_id: String,
    pub at_ms: i64,
    #[serde(flatten)]
    pub body: RunEventBody,
    /// The instance waits for this event's ack before it goes on.
    pub sync: bool,
}

/// A piece of a run's streamed model answer on its way to the Hub (see
/// [`agen_contract::run::TurnDelta`]): never stored, acked or resent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunDelta {
    pub run_id: String,
    pub task_id: String,
    #[serde(flatten)]
    pub delta: agen_contract::run::TurnDelta,
}

/// Events of one instance, in order, as one message to the Hub.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    pub instance_id: String,
    pub events: Vec<RunEvent>,
}

/// The Hub asks for an instance's kept logs (`LogRequest`); answered over `SendLogs`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogRequest {
    pub request_id: String,
    pub instance_id: String,
    /// A tool server's name; empty: the instance's own stderr.
    pub server: String,
    pub since_ms: i64,
    /// The last this many lines (0: all).
    pub tail: u32,
    pub follow: bool,
    /// The reader's namespace (empty: not checked).
    pub namespace: String,
    /// The Hub no longer lists the instance and asks every Nest.
    pub search: bool,
}

/// Part of the answer to a [`LogRequest`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogChunk {
    pub request_id: String,
    pub lines: Vec<LogLine>,
    /// Why the request cannot be served.
    pub error: String,
    /// With `error`: this Nest keeps no logs of the instance (in the request's namespace).
    pub not_kept: bool,
}

/// One kept log line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogLine {
    pub instance_id: String,
    pub server: String,
    pub at_ms: i64,
    pub level: String,
    pub text: String,
}

/// Part of a run's context (`FetchRunContext`): the first announces the totals.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContextChunk {
    pub history_size: u64,
    pub replay_size: u64,
    pub history: Vec<u8>,
    pub replay: Vec<u8>,
}

/// An artifact an instance saves, as the Hub stores it (its id is the content's digest).
#[derive(Debug, Clone, PartialEq)]
pub struct NewArtifact {
    pub artifact_id: String,
    pub name: String,
    pub media_type: String,
    pub task_id: String,
    pub namespace: String,
}
