//! What the web console's JSON API answers: typed views of the `AgenService` replies (the
//! browser never sees protobuf). Every string here is data to be shown as text.

use std::collections::BTreeMap;

use agen_proto::v1 as pb;
use serde::Serialize;

fn task_state(s: i32) -> &'static str {
    match pb::TaskState::try_from(s).unwrap_or(pb::TaskState::Unspecified) {
        pb::TaskState::Queued => "queued",
        pb::TaskState::Running => "running",
        pb::TaskState::Waiting => "waiting",
        pb::TaskState::Succeeded => "succeeded",
        pb::TaskState::Failed => "failed",
        pb::TaskState::Cancelled => "cancelled",
        pb::TaskState::Unspecified => "unknown",
    }
}

fn instance_state(s: i32) -> &'static str {
    match pb::InstanceState::try_from(s).unwrap_or(pb::InstanceState::Unspecified) {
        pb::InstanceState::Starting => "starting",
        pb::InstanceState::Running => "running",
        pb::InstanceState::Unhealthy => "unhealthy",
        pb::InstanceState::Stopping => "stopping",
        pb::InstanceState::Lost => "lost",
        pb::InstanceState::Pending => "pending",
        pb::InstanceState::Stopped => "stopped",
        pb::InstanceState::Unspecified => "unknown",
    }
}

fn nest_state(s: i32) -> &'static str {
    match pb::NestState::try_from(s).unwrap_or(pb::NestState::Unspecified) {
        pb::NestState::Ready => "ready",
        pb::NestState::Lost => "lost",
        pb::NestState::Disconnected => "disconnected",
        pb::NestState::Unspecified => "unknown",
    }
}

fn sorted(m: &std::collections::HashMap<String, String>) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[derive(Debug, Serialize)]
pub struct Me {
    pub token_id: String,
    pub name: String,
    /// Empty for the cluster admin (every namespace).
    pub namespace: String,
    /// viewer, submitter, deployer, admin; `cluster-admin` for the admin token.
    pub role: String,
    pub csrf: String,
    pub expires_at_ms: i64,
}

#[derive(Debug, Serialize)]
pub struct Approval {
    pub task_id: String,
    pub deployment: String,
    pub call_id: String,
    pub tool: String,
    pub arguments_json: String,
    pub asked_at_ms: i64,
}

impl From<&pb::Approval> for Approval {
    fn from(a: &pb::Approval) -> Self {
        Approval {
            task_id: a.task_id.clone(),
            deployment: a.deployment.clone(),
            call_id: a.call_id.clone(),
            tool: a.tool.clone(),
            arguments_json: a.arguments_json.clone(),
            asked_at_ms: a.asked_at_ms,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Progress {
    pub step: String,
    pub done: Option<u64>,
    pub total: Option<u64>,
    pub note: String,
}

#[derive(Debug, Serialize)]
pub struct Task {
    pub task_id: String,
    pub namespace: String,
    pub deployment: String,
    pub input: String,
    pub input_bytes: u64,
    pub summary: bool,
    pub labels: BTreeMap<String, String>,
    pub state: &'static str,
    pub activity: String,
    pub progress: Option<Progress>,
    pub result: String,
    pub response_type: String,
    pub error: String,
    pub attempt: u32,
    pub instance_id: String,
    pub nest_name: String,
    pub parent_task_id: String,
    pub conversation_key: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub started_at_ms: i64,
    pub finished_at_ms: i64,
    pub warnings: Vec<String>,
    pub pending_approvals: Vec<Approval>,
}

impl From<&pb::Task> for Task {
    fn from(t: &pb::Task) -> Self {
        let outcome = t.outcome.clone().unwrap_or_default();
        Task {
            task_id: t.task_id.clone(),
            namespace: t.namespace.clone(),
            deployment: t.deployment.clone(),
            input: t.input.clone(),
            input_bytes: t.input_bytes,
            summary: t.summary,
            labels: sorted(&t.labels),
            state: task_state(t.state),
            activity: t.activity.clone(),
            progress: t.progress.as_ref().map(|p| Progress {
                step: p.step.clone(),
                done: p.done,
                total: p.total,
                note: p.note.clone(),
            }),
            result: outcome.result,
            response_type: outcome.response_type,
            error: outcome.error,
            attempt: t.attempt,
            instance_id: t.instance_id.clone(),
            nest_name: t.nest_name.clone(),
            parent_task_id: t.parent_task_id.clone(),
            conversation_key: t.conversation_key.clone(),
            created_at_ms: t.created_at_ms,
            updated_at_ms: t.updated_at_ms,
            started_at_ms: t.started_at_ms,
            finished_at_ms: t.finished_at_ms,
            warnings: t.warnings.clone(),
            pending_approvals: t.pending_approvals.iter().map(Approval::from).collect(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct TaskPage {
    pub tasks: Vec<Task>,
    pub next_page_token: String,
    /// How many tasks match the filters in all.
    pub total: u64,
}

impl From<&pb::ListTasksResponse> for TaskPage {
    fn from(p: &pb::ListTasksResponse) -> Self {
        TaskPage {
            tasks: p.tasks.iter().map(Task::from).collect(),
            next_page_token: p.next_page_token.clone(),
            total: p.total,
        }
    }
}

/// One step of a task as it happens (`WatchTask`), sent as a server-sent event.
#[derive(Debug, Serialize)]
pub struct TaskEvent {
    pub seq: u64,
    pub at_ms: i64,
    pub kind: String,
    /// The event's body as JSON text, shown as text.
    pub json: String,
    pub task: Option<Task>,
    /// A piece of the model's answer as it streams (`model.delta`, `delta.reset`): not stored.
    pub delta: Option<Delta>,
}

/// A piece of a model turn's streamed answer; `reset` voids what was shown of that turn and
/// every later one.
#[derive(Debug, Serialize)]
pub struct Delta {
    pub attempt: u32,
    pub turn: u32,
    pub text: String,
    pub reset: bool,
}

impl From<&pb::TaskEvent> for TaskEvent {
    fn from(e: &pb::TaskEvent) -> Self {
        TaskEvent {
            seq: e.seq,
            at_ms: e.at_ms,
            kind: e.kind.clone(),
            json: e.json.clone(),
            task: e.task.as_ref().map(Task::from),
            delta: e.delta.as_ref().map(|d| Delta {
                attempt: d.attempt,
                turn: d.turn,
                text: d.text.clone(),
                reset: d.reset,
            }),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Span {
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub status: String,
    pub attributes: BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
pub struct Trace {
    pub task_id: String,
    pub trace_id: String,
    pub spans: Vec<Span>,
}

impl From<&pb::Trace> for Trace {
    fn from(t: &pb::Trace) -> Self {
        Trace {
            task_id: t.task_id.clone(),
            trace_id: t.trace_id.clone(),
            spans: t
                .spans
                .iter()
                .map(|s| Span {
                    span_id: s.span_id.clone(),
                    parent_span_id: s.parent_span_id.clone(),
                    name: s.name.clone(),
                    start_ms: s.start_ms,
                    end_ms: s.end_ms,
                    status: s.status.clone(),
                    attributes: sorted(&s.attributes),
                })
                .collect(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Artifact {
    pub artifact_id: String,
    pub name: String,
    pub media_type: String,
    pub size: u64,
}

impl From<&pb::Artifact> for Artifact {
    fn from(a: &pb::Artifact) -> Self {
        Artifact {
            artifact_id: a.artifact_id.clone(),
            name: a.name.clone(),
            media_type: a.media_type.clone(),
            size: a.size,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Nest {
    pub nest_id: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub capacity: u32,
    pub instances: u32,
    pub version: String,
    pub state: &'static str,
    pub separation: String,
    pub cordoned: bool,
    pub draining_until_ms: i64,
    pub revoked: bool,
    pub last_heartbeat_ms: i64,
}

impl From<&pb::Nest> for Nest {
    fn from(n: &pb::Nest) -> Self {
        Nest {
            nest_id: n.nest_id.clone(),
            name: n.name.clone(),
            labels: sorted(&n.labels),
            capacity: n.capacity,
            instances: n.instances,
            version: n.version.clone(),
            state: nest_state(n.state),
            separation: n.separation.clone(),
            cordoned: n.cordoned,
            draining_until_ms: n.draining_until_ms,
            revoked: n.revoked,
            last_heartbeat_ms: n.last_heartbeat_ms,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Deployment {
    pub namespace: String,
    pub name: String,
    pub agent_name: String,
    pub bundle_digest: String,
    pub replicas: u32,
    pub ready_replicas: u32,
    pub generation: u64,
    pub selector: BTreeMap<String, String>,
    pub concurrency: u32,
    pub a2a_card_url: String,
    pub updated_at_ms: i64,
}

impl From<&pb::Deployment> for Deployment {
    fn from(d: &pb::Deployment) -> Self {
        Deployment {
            namespace: d.namespace.clone(),
            name: d.name.clone(),
            agent_name: d.agent_name.clone(),
            bundle_digest: d.bundle_digest.clone(),
            replicas: d.replicas,
            ready_replicas: d.ready_replicas,
            generation: d.generation,
            selector: sorted(&d.selector),
            concurrency: d.concurrency,
            a2a_card_url: d.a2a_card_url.clone(),
            updated_at_ms: d.updated_at_ms,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ServerProblem {
    pub server: String,
    pub reason: String,
}

#[derive(Debug, Serialize)]
pub struct Instance {
    pub instance_id: String,
    pub namespace: String,
    pub deployment: String,
    pub nest_name: String,
    pub state: &'static str,
    pub healthy: bool,
    pub tools_loaded: u32,
    pub servers_not_connected: Vec<ServerProblem>,
    pub generation: u64,
    pub message: String,
    pub restarts: u32,
    pub active_runs: u32,
}

impl From<&pb::Instance> for Instance {
    fn from(i: &pb::Instance) -> Self {
        Instance {
            instance_id: i.instance_id.clone(),
            namespace: i.namespace.clone(),
            deployment: i.deployment.clone(),
            nest_name: i.nest_name.clone(),
            state: instance_state(i.state),
            healthy: i.healthy,
            tools_loaded: i.tools_loaded,
            servers_not_connected: i
                .servers_not_connected
                .iter()
                .map(|p| ServerProblem {
                    server: p.server.clone(),
                    reason: p.reason.clone(),
                })
                .collect(),
            generation: i.generation,
            message: i.message.clone(),
            restarts: i.restarts,
            active_runs: i.active_runs,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Fleet {
    pub nests: Vec<Nest>,
    /// Why the Nests are not shown (a namespace token may not list them).
    pub nests_hidden: String,
    pub deployments: Vec<Deployment>,
    pub instances: Vec<Instance>,
}

#[derive(Debug, Serialize)]
pub struct Revision {
    pub generation: u64,
    pub bundle_digest: String,
    pub replicas: u32,
    pub created_at_ms: i64,
    pub deployed_by: String,
    pub change: String,
    pub current: bool,
}

impl From<&pb::DeploymentRevision> for Revision {
    fn from(r: &pb::DeploymentRevision) -> Self {
        Revision {
            generation: r.generation,
            bundle_digest: r.bundle_digest.clone(),
            replicas: r.replicas,
            created_at_ms: r.created_at_ms,
            deployed_by: r.deployed_by.clone(),
            change: r.change.clone(),
            current: r.current,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct DeploymentPage {
    pub deployment: Option<Deployment>,
    pub instances: Vec<Instance>,
    pub revisions: Vec<Revision>,
}

#[derive(Debug, Serialize)]
pub struct AuditEntry {
    pub at_ms: i64,
    pub token_id: String,
    pub token_name: String,
    pub namespace: String,
    pub call: String,
    pub target: String,
    pub outcome: String,
    pub message: String,
}

impl From<&pb::AuditEntry> for AuditEntry {
    fn from(a: &pb::AuditEntry) -> Self {
        AuditEntry {
            at_ms: a.at_ms,
            token_id: a.token_id.clone(),
            token_name: a.token_name.clone(),
            namespace: a.namespace.clone(),
            call: a.call.clone(),
            target: a.target.clone(),
            outcome: a.outcome.clone(),
            message: a.message.clone(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct LogLine {
    pub instance_id: String,
    pub server: String,
    pub at_ms: i64,
    pub level: String,
    pub text: String,
}

impl From<&pb::LogLine> for LogLine {
    fn from(l: &pb::LogLine) -> Self {
        LogLine {
            instance_id: l.instance_id.clone(),
            server: l.server.clone(),
            at_ms: l.at_ms,
            level: l.level.clone(),
            text: l.text.clone(),
        }
    }
}

/// An error as the browser gets it.
#[derive(Debug, Serialize)]
pub struct ApiError {
    pub error: String,
}

#[derive(Debug, Serialize)]
pub struct TaskDetail {
    pub task: Task,
    pub children: Vec<Task>,
    pub artifacts: Vec<Artifact>,
}
