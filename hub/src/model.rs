//! The Hub's domain records (what the store persists, as JSON): deployments, Nests,
//! instances, tasks, task events, run events, conversations. No protobuf here: conversion
//! lives in `server/`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeploymentRec {
    pub namespace: String,
    pub name: String,
    pub bundle_digest: String,
    pub replicas: u32,
    pub selector: BTreeMap<String, String>,
    /// Tasks one instance runs at a time (at least 1).
    pub concurrency: u32,
    pub generation: u64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub agent_name: String,
    /// Per-instance resources, flags over the bundle's `resources` (undeclared keys: defaults).
    #[serde(default)]
    pub resources: agen_shared::bundle::ResourceSpec,
}

impl DeploymentRec {
    pub fn key(&self) -> String {
        deployment_key(&self.namespace, &self.name)
    }
}

pub fn deployment_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// A stored bundle's metadata (the bytes are stored beside it by digest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BundleMeta {
    pub digest: String,
    pub size: u64,
    pub agent_name: String,
    pub uploaded_at_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NestState {
    Ready,
    Disconnected,
    Lost,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NestRec {
    pub nest_id: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub capacity: u32,
    pub version: String,
    pub state: NestState,
    pub last_heartbeat_ms: i64,
    pub registered_at_ms: i64,
    /// No new placements (cordon, drain); kept across re-registrations.
    #[serde(default)]
    pub cordoned: bool,
    /// The `cordon` of the Nest's own configuration as last sent (`NestSettings`): a change
    /// of it cordons or uncordons; the API's cordon/uncordon win until it changes again.
    #[serde(default)]
    pub config_cordon: bool,
    /// Who its instances run as, as the Nest reported it at its last registration.
    #[serde(default)]
    pub separation: String,
    /// Its instances' network isolation, as the Nest reported it.
    #[serde(default)]
    pub network: String,
    /// Set while the Nest drains before it stops (SIGTERM): no new runs and no placements go
    /// to it until then (unix ms); a new registration clears it.
    #[serde(default)]
    pub draining_until_ms: i64,
    /// The commit it was built from and the protocol version it spoke at its last registration.
    #[serde(default)]
    pub commit: String,
    #[serde(default)]
    pub protocol_version: String,
    /// What it offers placement (thousandths of a CPU, bytes; 0: an older Nest, not checked)
    /// and how it enforces limits.
    #[serde(default)]
    pub cpu_millis: u32,
    #[serde(default)]
    pub memory_bytes: u64,
    #[serde(default)]
    pub resources: String,
}

impl NestRec {
    /// Whether the Nest is draining at `now`.
    pub fn draining(&self, now: i64) -> bool {
        self.draining_until_ms > now
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    /// Waiting for a Nest or a back-off.
    Pending,
    Starting,
    Running,
    Unhealthy,
    Stopping,
    /// Ended on purpose (its Nest left gracefully); hidden after a while.
    Stopped,
    Lost,
}

impl InstanceState {
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Pending => "pending",
            InstanceState::Starting => "starting",
            InstanceState::Running => "running",
            InstanceState::Unhealthy => "unhealthy",
            InstanceState::Stopping => "stopping",
            InstanceState::Stopped => "stopped",
            InstanceState::Lost => "lost",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceRec {
    pub instance_id: String,
    pub namespace: String,
    pub deployment: String,
    /// Empty while pending.
    pub nest_id: String,
    pub nest_name: String,
    pub state: InstanceState,
    pub healthy: bool,
    pub tools_loaded: u32,
    /// (server, reason)
    pub servers_not_connected: Vec<(String, String)>,
    pub bundle_digest: String,
    pub generation: u64,
    pub message: String,
    pub restarts: u32,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub tools: Vec<String>,
    /// The MCP resources its tool servers listed at their start (the Nest's last report).
    #[serde(default)]
    pub resources: Vec<McpResourceRec>,
    /// Pending placements wait until this time (replacement back-off).
    #[serde(default)]
    pub not_before_ms: i64,
    /// Since when the instance has been running and healthy (0: not).
    #[serde(default)]
    pub healthy_since_ms: i64,
    /// Whether it replaced a failed instance (its own failure then extends the back-off).
    #[serde(default)]
    pub replacement: bool,
    /// Since when it is being moved to another Nest to spread replicas again (0: not): a
    /// replacement is placed first and this one stops once that runs and this has no run.
    #[serde(default)]
    pub leaving_since_ms: i64,
    /// Placed only to resume runs of an old bundle version whose instances are all gone (a
    /// run that waited across a redeploy and a Nest loss); not a replica, stopped once no run
    /// of its version is left.
    #[serde(default)]
    pub for_resume: bool,
    /// Consecutive failures of the replica slot it holds (the instances it replaced failed
    /// this many times in a row; 0 once it ran healthy for a while): its own failure backs
    /// its replacement off by one more step (`scheduler::slots`).
    #[serde(default)]
    pub slot_failures: u32,
    /// Times its processes were killed by its memory limit (the Nest counts).
    #[serde(default)]
    pub oom_kills: u32,
    /// Its Nest's last measurement (memory only, never stored).
    #[serde(skip)]
    pub usage: Usage,
}

/// One MCP resource a tool server of an instance lists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpResourceRec {
    pub server: String,
    pub uri: String,
    pub name: String,
    #[serde(default)]
    pub mime_type: String,
}

/// Measured CPU and memory of an instance process and of each of its tool servers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    pub instance: UsageSample,
    pub servers: Vec<UsageSample>,
}

/// One process tree's use (`name`: the tool server, empty for the instance).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageSample {
    pub name: String,
    pub cpu_percent: f64,
    pub cpu_seconds: f64,
    pub memory_bytes: u64,
    pub pids: u32,
}

/// What a Nest says about one instance (domain form of `InstanceReport`).
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceReport {
    pub instance_id: String,
    pub namespace: String,
    pub deployment: String,
    pub bundle_digest: String,
    pub generation: u64,
    pub state: Option<InstanceState>,
    pub healthy: bool,
    pub tools_loaded: u32,
    pub servers_not_connected: Vec<(String, String)>,
    pub message: String,
    pub restarts: u32,
    pub tools: Vec<String>,
    pub resources: Vec<McpResourceRec>,
    /// The runs the Nest has handed to this instance, as (run id, attempt).
    pub runs: Vec<(String, u32)>,
    pub usage: Usage,
    pub oom_kills: u32,
}

/// A Nest's `Register` in domain form.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    pub nest_id: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub capacity: u32,
    pub version: String,
    pub instances: Vec<InstanceReport>,
    /// The name to take when `name` (a default) is held by another live Nest; empty when
    /// `name` was given explicitly.
    pub fallback_name: String,
    /// Who its instances run as (shown by `agen nests`).
    pub separation: String,
    /// Its instances' network isolation (shown by `agen nests`).
    pub network: String,
    /// The protocol version it speaks, `MAJOR.MINOR` (empty: a Nest built before versions).
    pub protocol_version: String,
    /// The commit it was built from.
    pub commit: String,
    pub cpu_millis: u32,
    pub memory_bytes: u64,
    pub resources: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Queued,
    Running,
    Waiting,
    Succeeded,
    Failed,
    Cancelled,
}

impl TaskState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Failed | TaskState::Cancelled
        )
    }
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Queued => "queued",
            TaskState::Running => "running",
            TaskState::Waiting => "waiting",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
        }
    }
    pub fn parse(s: &str) -> Option<TaskState> {
        Some(match s {
            "queued" => TaskState::Queued,
            "running" => TaskState::Running,
            "waiting" => TaskState::Waiting,
            "succeeded" => TaskState::Succeeded,
            "failed" => TaskState::Failed,
            "cancelled" => TaskState::Cancelled,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProgressRec {
    pub step: String,
    pub done: Option<u64>,
    pub total: Option<u64>,
    pub note: String,
    pub artifacts: Vec<String>,
    pub updated_at_ms: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OutcomeRec {
    pub result: String,
    pub response_type: String,
    pub error: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRec {
    pub task_id: String,
    pub namespace: String,
    pub deployment: String,
    pub input: String,
    pub labels: BTreeMap<String, String>,
    pub conversation_key: String,
    pub conversation_id: String,
    pub state: TaskState,
    pub activity: String,
    pub progress: Option<ProgressRec>,
    pub outcome: Option<OutcomeRec>,
    pub run_id: String,
    pub attempt: u32,
    pub instance_id: String,
    pub bundle_digest: String,
    pub client_request_id: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub started_at_ms: i64,
    pub finished_at_ms: i64,
    pub nest_name: String,
    /// Submission order (queue position).
    pub seq: u64,
    /// Seq of the next task event.
    pub next_event_seq: u64,
    /// The run event that the newest task event records, when a hot run event wrote it (not
    /// stored: read back from that task event when the task is loaded, see
    /// `core::catch_up_from_events`).
    #[serde(skip)]
    pub last_event_source: Option<RunEventRef>,
    #[serde(default)]
    pub cancel_requested_at_ms: i64,
    #[serde(default)]
    pub cancel_reason: String,
    /// Cancelled by a newer message of its conversation (`doubleTexting: rollback`): its run's
    /// messages do not join the conversation, only a note of its completed side effects.
    #[serde(default)]
    pub rolled_back: bool,
    /// The durable record of the attempt the Hub issued last (the fence and the owner).
    #[serde(default)]
    pub lease: LeaseRec,
    /// The task whose `call_agent`/`start_agent` made this one (empty for a submitted task).
    #[serde(default)]
    pub parent_task_id: String,
    /// The first run of the delegation tree (empty: this task's own run).
    #[serde(default)]
    pub root_run_id: String,
    /// Delegate calls above this task (0 for a submitted task).
    #[serde(default)]
    pub delegation_depth: u32,
    /// The delegate call's span in the parent's trace (the child's root span nests under it).
    #[serde(default)]
    pub parent_span_id: String,
    /// The submit's narrowing of the bundle's permissions, sent with every attempt.
    #[serde(default)]
    pub tool_overrides: agen_shared::bundle::Permissions,
    /// What the Hub noticed at submit but did not refuse (an override that tried to widen).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// The caller's W3C traceparent given to SubmitTask (validated); empty when none. The run's
    /// trace uses its trace id and the run span nests under its span.
    #[serde(default)]
    pub traceparent: String,
    /// Set while the task's run is suspended: it gave its instance slot back to wait for a
    /// decision or a child task (see `core::suspend`). The task is `waiting` and holds no
    /// instance meanwhile.
    #[serde(default)]
    pub suspended: Option<SuspensionRec>,
    /// The earliest deadline each wait of this task was given (by call id), so that a resumed
    /// attempt that waits again never extends it.
    #[serde(default)]
    pub wait_deadlines: BTreeMap<String, i64>,
    /// The task's deadline and token budget, kept for every attempt.
    #[serde(default)]
    pub budget: BudgetRec,
    /// The submit's own output schema (JSON text, validated; `agen submit --output-schema`),
    /// sent with every attempt; empty: the bundle's `outputSchema`, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub output_schema: String,
}

#[cfg(test)]
impl TaskRec {
    /// A finished task with every field set, for unit tests.
    pub fn example() -> TaskRec {
        TaskRec {
            task_id: "task-1".into(),
            namespace: "default".into(),
            deployment: "hello".into(),
            input: "hi".into(),
            labels: BTreeMap::new(),
            conversation_key: String::new(),
            conversation_id: "c".into(),
            state: TaskState::Failed,
            activity: String::new(),
            progress: None,
            outcome: None,
            run_id: "run-1".into(),
            attempt: 1,
            instance_id: String::new(),
            bundle_digest: String::new(),
            client_request_id: String::new(),
            created_at_ms: 0,
            updated_at_ms: 0,
            started_at_ms: 5,
            finished_at_ms: 100,
            nest_name: String::new(),
            seq: 1,
            next_event_seq: 1,
            last_event_source: None,
            cancel_requested_at_ms: 0,
            cancel_reason: String::new(),
            rolled_back: false,
            lease: LeaseRec::default(),
            parent_task_id: String::new(),
            root_run_id: String::new(),
            delegation_depth: 0,
            parent_span_id: String::new(),
            tool_overrides: Default::default(),
            warnings: Vec::new(),
            traceparent: String::new(),
            suspended: None,
            wait_deadlines: Default::default(),
            budget: Default::default(),
            output_schema: String::new(),
        }
    }
}

/// A suspended run's wait, as the Hub keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuspensionRec {
    pub waiting_for: agen_contract::run::WaitingFor,
    /// The earliest deadline this wait was given (unix ms).
    pub deadline_ms: i64,
    /// The reason given when the deadline passes.
    pub on_deadline: String,
    /// The attempt that suspended.
    pub attempt: u32,
    pub since_ms: i64,
}

/// A task's deadline and token budget (its submit's, else its bundle's `limits.taskTimeout` and
/// `limits.maxTokens`, resolved at submit). 0: none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetRec {
    #[serde(default)]
    pub timeout_ms: u64,
    /// `created_at_ms + timeout_ms`: the Hub's deadline timer ends the task then.
    #[serde(default)]
    pub deadline_ms: i64,
    #[serde(default)]
    pub max_tokens: u64,
    /// Set when the deadline passed: the task's cancel ends it failed, "deadline exceeded".
    #[serde(default)]
    pub deadline_exceeded: bool,
}

/// Who may run a task now: the attempt the Hub issued last, to which Nest and instance. It is
/// in the store before `AssignRun` leaves the Hub; events, progress and `RunDone` are believed
/// only from this Nest and instance, for this run id and attempt. Attempts are issued per task
/// and never reused, whatever the run id.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LeaseRec {
    /// The Nest the current attempt was sent to (by certificate id).
    pub nest_id: String,
    /// The instance the current attempt was sent to (kept while the task waits to resume).
    pub instance_id: String,
    /// When the current attempt was sent.
    pub assigned_at_ms: i64,
    /// Whether the Hub has heard from the current attempt (an event).
    pub started: bool,
    /// Set when the task went back to the queue: the attempt is fenced at once, nothing more
    /// of it is stored (the next attempt replays what was).
    pub revoked: bool,
    /// Since when reconciliation finds the assigned instance not running it (0: it does).
    pub missing_since_ms: i64,
    /// Attempts ended by the run's own instance failing (these count against `maxAttempts`).
    pub failures: u32,
    /// The instance that last failed this task: a retry avoids it while another is available.
    pub avoid_instance: String,
    /// No re-dispatch before this time (back-off after an instance failure).
    pub not_before_ms: i64,
    /// The run events of this attempt the Hub knows to be stored: `Some(n)` when exactly
    /// `1..=n` are, none above; `None` when it does not know (after a restart, an event past a
    /// gap, a failed write), and the store is asked. Memory only: it spares each hot event a
    /// store lookup, and it is kept under the lock every append takes.
    #[serde(skip)]
    pub stored_through: Option<u64>,
}

impl LeaseRec {
    /// Whether run event `seq` of this attempt is stored, when the lease knows.
    pub fn knows_stored(&self, seq: u64) -> Option<bool> {
        self.stored_through.map(|n| seq <= n)
    }

    /// Run event `seq` of this attempt was just written: the next one in order keeps the
    /// count exact, anything else (a gap, a rewrite) makes it unknown.
    pub fn stored(&mut self, seq: u64) {
        self.stored_through = match self.stored_through {
            Some(n) if seq == n + 1 => Some(seq),
            _ => None,
        };
    }

    /// Which run events of this attempt are stored is no longer known (a write failed).
    pub fn forget_stored(&mut self) {
        self.stored_through = None;
    }
}

/// One stored step of a task (`TaskEvent` on the wire).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskEventRec {
    pub seq: u64,
    pub at_ms: i64,
    pub kind: String,
    pub json: String,
    /// What of the task this event left behind, so a replay shows the task as it was then
    /// (absent on events stored before snapshots were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<TaskSnapshot>,
    /// The run event this task event records, for the task events of hot run events (which
    /// are written before their run event: see `Db::append_hot_run_events`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<RunEventRef>,
}

/// The key of one run event.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunEventRef {
    pub run_id: String,
    pub attempt: u32,
    pub seq: u64,
}

impl RunEventRef {
    pub fn of(e: &RunEventRec) -> RunEventRef {
        RunEventRef {
            run_id: e.run_id.clone(),
            attempt: e.attempt,
            seq: e.seq,
        }
    }
}

/// The fields of a task that change while it runs (the rest never change after submit), as
/// they were right after one task event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskSnapshot {
    pub state: TaskState,
    pub activity: String,
    pub progress: Option<ProgressRec>,
    pub outcome: Option<OutcomeRec>,
    pub run_id: String,
    pub attempt: u32,
    pub instance_id: String,
    pub nest_name: String,
    pub bundle_digest: String,
    pub updated_at_ms: i64,
    pub started_at_ms: i64,
    pub finished_at_ms: i64,
}

impl TaskSnapshot {
    pub fn of(t: &TaskRec) -> TaskSnapshot {
        TaskSnapshot {
            state: t.state,
            activity: t.activity.clone(),
            progress: t.progress.clone(),
            outcome: t.outcome.clone(),
            run_id: t.run_id.clone(),
            attempt: t.attempt,
            instance_id: t.instance_id.clone(),
            nest_name: t.nest_name.clone(),
            bundle_digest: t.bundle_digest.clone(),
            updated_at_ms: t.updated_at_ms,
            started_at_ms: t.started_at_ms,
            finished_at_ms: t.finished_at_ms,
        }
    }

    /// `task` (as it is now) as it was at this snapshot.
    pub fn over(&self, task: &TaskRec) -> TaskRec {
        TaskRec {
            state: self.state,
            activity: self.activity.clone(),
            progress: self.progress.clone(),
            outcome: self.outcome.clone(),
            run_id: self.run_id.clone(),
            attempt: self.attempt,
            instance_id: self.instance_id.clone(),
            nest_name: self.nest_name.clone(),
            bundle_digest: self.bundle_digest.clone(),
            updated_at_ms: self.updated_at_ms,
            started_at_ms: self.started_at_ms,
            finished_at_ms: self.finished_at_ms,
            ..task.clone()
        }
    }
}

/// One run event, keyed (run_id, attempt, seq).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEventRec {
    pub run_id: String,
    pub attempt: u32,
    pub seq: u64,
    pub task_id: String,
    pub at_ms: i64,
    pub kind: String,
    pub json: String,
}

/// Messages a conversation has accumulated (model messages as JSON values).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConversationRec {
    pub messages: Vec<serde_json::Value>,
}

/// A task event as it happens, with the task after it (for `WatchTask`).
#[derive(Debug, Clone)]
pub struct TaskUpdate {
    pub task_id: String,
    pub event: TaskEventRec,
    pub task: TaskRec,
    /// The event's body as the hot path read it (`None`: not read, or not readable): a
    /// follower uses it instead of reading `event.json` again.
    pub body: Option<std::sync::Arc<agen_contract::run::RunEventBody>>,
}
