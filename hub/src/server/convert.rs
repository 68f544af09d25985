//! proto ⇄ domain conversion: the only place that knows both `agen_proto` and `crate::model`.

use agen_proto::v1 as pb;

use crate::core::tasks::{IncomingRunEvent, TaskSummary};
use crate::core::DeploymentView;
use crate::error::HubError;
use crate::model::*;
use crate::nodes::ToNest;
use crate::trace::SpanRec;

pub fn deployment(d: &DeploymentView) -> pb::Deployment {
    let r = &d.rec;
    pb::Deployment {
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        bundle_digest: r.bundle_digest.clone(),
        replicas: r.replicas,
        selector: r.selector.clone().into_iter().collect(),
        concurrency: r.concurrency,
        generation: r.generation,
        created_at_ms: r.created_at_ms,
        updated_at_ms: r.updated_at_ms,
        ready_replicas: d.ready_replicas,
        agent_name: r.agent_name.clone(),
        // Filled by the handlers that know the Hub's public URL.
        a2a_card_url: String::new(),
        resources: Some(resources(&r.resources)),
    }
}

pub fn resources(r: &agen_shared::bundle::ResourceSpec) -> pb::Resources {
    pb::Resources {
        cpu_millis: r.cpu_millis.unwrap_or(0),
        memory_bytes: r.memory_bytes.unwrap_or(0),
        pids: r.pids.unwrap_or(0),
    }
}

/// A request's `Resources`: 0 is "not declared".
pub fn resource_spec(r: Option<&pb::Resources>) -> agen_shared::bundle::ResourceSpec {
    let r = r.cloned().unwrap_or_default();
    agen_shared::bundle::ResourceSpec {
        cpu_millis: (r.cpu_millis > 0).then_some(r.cpu_millis),
        memory_bytes: (r.memory_bytes > 0).then_some(r.memory_bytes),
        pids: (r.pids > 0).then_some(r.pids),
    }
}

fn usage_sample(u: &UsageSample) -> pb::ResourceUsage {
    pb::ResourceUsage {
        name: u.name.clone(),
        cpu_percent: u.cpu_percent,
        cpu_seconds: u.cpu_seconds,
        memory_bytes: u.memory_bytes,
        pids: u.pids,
    }
}

fn usage_sample_from(u: &pb::ResourceUsage) -> UsageSample {
    UsageSample {
        name: u.name.clone(),
        cpu_percent: if u.cpu_percent.is_finite() {
            u.cpu_percent.max(0.0)
        } else {
            0.0
        },
        cpu_seconds: if u.cpu_seconds.is_finite() {
            u.cpu_seconds.max(0.0)
        } else {
            0.0
        },
        memory_bytes: u.memory_bytes,
        pids: u.pids,
    }
}

fn instance_state(s: InstanceState) -> pb::InstanceState {
    match s {
        InstanceState::Pending => pb::InstanceState::Pending,
        InstanceState::Starting => pb::InstanceState::Starting,
        InstanceState::Running => pb::InstanceState::Running,
        InstanceState::Unhealthy => pb::InstanceState::Unhealthy,
        InstanceState::Stopping => pb::InstanceState::Stopping,
        InstanceState::Stopped => pb::InstanceState::Stopped,
        InstanceState::Lost => pb::InstanceState::Lost,
    }
}

fn instance_state_from(v: i32) -> Option<InstanceState> {
    Some(match pb::InstanceState::try_from(v).ok()? {
        pb::InstanceState::Unspecified => return None,
        pb::InstanceState::Pending => InstanceState::Pending,
        pb::InstanceState::Starting => InstanceState::Starting,
        pb::InstanceState::Running => InstanceState::Running,
        pb::InstanceState::Unhealthy => InstanceState::Unhealthy,
        pb::InstanceState::Stopping => InstanceState::Stopping,
        pb::InstanceState::Stopped => InstanceState::Stopped,
        pb::InstanceState::Lost => InstanceState::Lost,
    })
}

pub fn instance(i: &InstanceRec, active_runs: u32) -> pb::Instance {
    pb::Instance {
        instance_id: i.instance_id.clone(),
        namespace: i.namespace.clone(),
        deployment: i.deployment.clone(),
        nest_id: i.nest_id.clone(),
        nest_name: i.nest_name.clone(),
        state: instance_state(i.state) as i32,
        healthy: i.healthy,
        tools_loaded: i.tools_loaded,
        servers_not_connected: i
            .servers_not_connected
            .iter()
            .map(|(server, reason)| pb::ServerProblem {
                server: server.clone(),
                reason: reason.clone(),
            })
            .collect(),
        bundle_digest: i.bundle_digest.clone(),
        generation: i.generation,
        message: i.message.clone(),
        restarts: i.restarts,
        created_at_ms: i.created_at_ms,
        updated_at_ms: i.updated_at_ms,
        active_runs,
        tools: i.tools.clone(),
        resources: i
            .resources
            .iter()
            .map(|r| pb::McpResource {
                server: r.server.clone(),
                uri: r.uri.clone(),
                name: r.name.clone(),
                mime_type: r.mime_type.clone(),
            })
            .collect(),
        usage: Some(usage_sample(&i.usage.instance)),
        servers_usage: i.usage.servers.iter().map(usage_sample).collect(),
        oom_kills: i.oom_kills,
    }
}

pub fn nest(n: &NestRec, instances: u32) -> pb::Nest {
    pb::Nest {
        nest_id: n.nest_id.clone(),
        name: n.name.clone(),
        labels: n.labels.clone().into_iter().collect(),
        capacity: n.capacity,
        version: n.version.clone(),
        state: match n.state {
            NestState::Ready => pb::NestState::Ready,
            NestState::Disconnected => pb::NestState::Disconnected,
            NestState::Lost => pb::NestState::Lost,
        } as i32,
        last_heartbeat_ms: n.last_heartbeat_ms,
        instances,
        registered_at_ms: n.registered_at_ms,
        // Set by ListNests from the Nest identities.
        revoked: false,
        cordoned: n.cordoned,
        separation: n.separation.clone(),
        network: n.network.clone(),
        draining_until_ms: n.draining_until_ms,
        commit: n.commit.clone(),
        protocol_version: n.protocol_version.clone(),
        cpu_millis: n.cpu_millis,
        memory_bytes: n.memory_bytes,
        // Set by ListNests from the instances placed on it.
        reserved_cpu_millis: 0,
        reserved_memory_bytes: 0,
        resources: n.resources.clone(),
    }
}

/// The state filter of `ListTasks`: the `task_state` enum when set, else the deprecated
/// `state` string (checked by the core either way). An unknown enum value is passed on as a
/// name the core refuses with a clear message.
pub fn task_state_filter(task_state: i32, state: String) -> String {
    let from_enum = match pb::TaskState::try_from(task_state) {
        Ok(pb::TaskState::Unspecified) => return state,
        Ok(pb::TaskState::Queued) => TaskState::Queued,
        Ok(pb::TaskState::Running) => TaskState::Running,
        Ok(pb::TaskState::Waiting) => TaskState::Waiting,
        Ok(pb::TaskState::Succeeded) => TaskState::Succeeded,
        Ok(pb::TaskState::Failed) => TaskState::Failed,
        Ok(pb::TaskState::Cancelled) => TaskState::Cancelled,
        Err(_) => return format!("task_state {task_state}"),
    };
    from_enum.as_str().to_string()
}

pub(super) fn task_state(s: TaskState) -> pb::TaskState {
    match s {
        TaskState::Queued => pb::TaskState::Queued,
        TaskState::Running => pb::TaskState::Running,
        TaskState::Waiting => pb::TaskState::Waiting,
        TaskState::Succeeded => pb::TaskState::Succeeded,
        TaskState::Failed => pb::TaskState::Failed,
        TaskState::Cancelled => pb::TaskState::Cancelled,
    }
}

pub fn task(t: &TaskRec) -> pb::Task {
    pb::Task {
        task_id: t.task_id.clone(),
        namespace: t.namespace.clone(),
        deployment: t.deployment.clone(),
        input: t.input.clone(),
        labels: t.labels.clone().into_iter().collect(),
        conversation_key: t.conversation_key.clone(),
        conversation_id: t.conversation_id.clone(),
        state: task_state(t.state) as i32,
        activity: t.activity.clone(),
        progress: t.progress.as_ref().map(|p| pb::Progress {
            step: p.step.clone(),
            done: p.done,
            total: p.total,
            note: p.note.clone(),
            artifacts: p.artifacts.clone(),
            updated_at_ms: p.updated_at_ms,
        }),
        outcome: t.outcome.as_ref().map(|o| pb::Outcome {
            result: o.result.clone(),
            response_type: o.response_type.clone(),
            error: o.error.clone(),
        }),
        run_id: t.run_id.clone(),
        attempt: t.attempt,
        instance_id: t.instance_id.clone(),
        bundle_digest: t.bundle_digest.clone(),
        client_request_id: t.client_request_id.clone(),
        created_at_ms: t.created_at_ms,
        updated_at_ms: t.updated_at_ms,
        started_at_ms: t.started_at_ms,
        finished_at_ms: t.finished_at_ms,
        nest_name: t.nest_name.clone(),
        input_bytes: t.input.len() as u64,
        summary: false,
        parent_task_id: t.parent_task_id.clone(),
        tool_overrides: Some(to_pb_overrides(&t.tool_overrides)),
        warnings: t.warnings.clone(),
        timeout_ms: t.budget.timeout_ms,
        deadline_ms: t.budget.deadline_ms,
        max_tokens: t.budget.max_tokens,
        pending_approvals: Vec::new(),
        root_run_id: if t.root_run_id.is_empty() {
            t.run_id.clone()
        } else {
            t.root_run_id.clone()
        },
    }
}

/// A task as `ListTasks` shows it (input and result cut to a prefix).
pub fn task_summary(s: &TaskSummary) -> pb::Task {
    pb::Task {
        input_bytes: s.input_bytes,
        summary: true,
        ..task(&s.task)
    }
}

/// The `ListTasks` page token that continues before the task with submission seq `seq`.
pub fn page_token(seq: u64) -> String {
    format!("tasks-before.{seq}")
}

/// The seq a page token continues before; empty is the first page.
pub fn parse_page_token(token: &str) -> Result<Option<u64>, HubError> {
    if token.is_empty() {
        return Ok(None);
    }
    token
        .strip_prefix("tasks-before.")
        .and_then(|n| n.parse().ok())
        .map(Some)
        .ok_or_else(|| {
            HubError::invalid(format!(
                "page_token: `{}` is not a token from ListTasks; pass next_page_token of the previous page as it came",
                crate::limits::prefix(token)
            ))
        })
}

/// A task event with the task as it was right after it (its snapshot over `t`, the task now;
/// events stored before snapshots were kept carry `t` itself).
pub fn task_event(e: &TaskEventRec, t: &TaskRec) -> pb::TaskEvent {
    let then = e.snapshot.as_ref().map(|s| s.over(t));
    pb::TaskEvent {
        seq: e.seq,
        at_ms: e.at_ms,
        kind: e.kind.clone(),
        json: e.json.clone(),
        task: Some(task(then.as_ref().unwrap_or(t))),
        delta: None,
    }
}

pub fn span(s: &SpanRec) -> pb::Span {
    pb::Span {
        span_id: s.span_id.clone(),
        parent_span_id: s.parent_span_id.clone(),
        name: s.name.clone(),
        start_ms: s.start_ms,
        end_ms: s.end_ms,
        status: s.status.clone(),
        attributes: s.attributes.clone().into_iter().collect(),
    }
}

pub fn instance_report(r: &pb::InstanceReport) -> InstanceReport {
    InstanceReport {
        instance_id: r.instance_id.clone(),
        namespace: r.namespace.clone(),
        deployment: r.deployment.clone(),
        bundle_digest: r.bundle_digest.clone(),
        generation: r.generation,
        state: instance_state_from(r.state),
        healthy: r.healthy,
        tools_loaded: r.tools_loaded,
        servers_not_connected: r
            .servers_not_connected
            .iter()
            .map(|p| (p.server.clone(), p.reason.clone()))
            .collect(),
        message: r.message.clone(),
        restarts: r.restarts,
        tools: r.tools.clone(),
        resources: r
            .resources
            .iter()
            .take(crate::core::nests::MAX_INSTANCE_RESOURCES)
            .map(|x| McpResourceRec {
                server: crate::limits::cut(&x.server, 256),
                uri: crate::limits::cut(&x.uri, 2048),
                name: crate::limits::cut(&x.name, 256),
                mime_type: crate::limits::cut(&x.mime_type, 256),
            })
            .collect(),
        runs: r
            .run_attempts
            .iter()
            .map(|a| (a.run_id.clone(), a.attempt))
            .collect(),
        usage: Usage {
            instance: r.usage.as_ref().map(usage_sample_from).unwrap_or_default(),
            // Bounded like the tool servers a bundle may declare.
            servers: r
                .servers_usage
                .iter()
                .take(256)
                .map(usage_sample_from)
                .collect(),
        },
        oom_kills: r.oom_kills,
    }
}

pub fn registration(r: &pb::Register) -> Registration {
    Registration {
        nest_id: r.nest_id.clone(),
        name: r.name.clone(),
        labels: r.labels.clone().into_iter().collect(),
        capacity: r.capacity,
        version: r.version.clone(),
        instances: r.instances.iter().map(instance_report).collect(),
        fallback_name: r.fallback_name.clone(),
        separation: r.separation.clone(),
        network: r.network.clone(),
        protocol_version: r.protocol_version.clone(),
        commit: r.commit.clone(),
        cpu_millis: r.cpu_millis,
        memory_bytes: r.memory_bytes,
        resources: r.resources.clone(),
    }
}

pub fn run_deltas(b: pb::RunDeltas) -> Vec<crate::core::deltas::DeltaIn> {
    b.deltas
        .into_iter()
        .map(|d| crate::core::deltas::DeltaIn {
            run_id: d.run_id,
            task_id: d.task_id,
            delta: turn_delta_in(d.attempt, d.turn, d.text, d.reset),
        })
        .collect()
}

fn turn_delta_in(
    attempt: u32,
    turn: u32,
    text: String,
    reset: bool,
) -> agen_contract::run::TurnDelta {
    agen_contract::run::TurnDelta {
        attempt,
        turn,
        text,
        reset,
    }
}

/// `SubmitTaskRequest.double_texting` (empty: the bundle's mode).
pub fn double_texting(
    mode: &str,
) -> Result<Option<agen_shared::bundle::DoubleTexting>, crate::error::HubError> {
    if mode.is_empty() {
        return Ok(None);
    }
    agen_shared::bundle::DoubleTexting::parse(mode)
        .map(Some)
        .ok_or_else(|| {
            crate::error::HubError::invalid(format!(
                "double_texting: expected one of {}, got {:?}",
                agen_shared::bundle::DoubleTexting::NAMES,
                crate::limits::cut(mode, 40)
            ))
        })
}

/// A streamed frame for `WatchTask` (seq 0, no task: not a durable event).
pub fn delta_event(d: &agen_contract::run::TurnDelta) -> pb::TaskEvent {
    pb::TaskEvent {
        seq: 0,
        at_ms: chrono::Utc::now().timestamp_millis(),
        kind: d.kind().to_string(),
        json: serde_json::to_string(d).unwrap_or_default(),
        task: None,
        delta: Some(pb::TurnDelta {
            attempt: d.attempt,
            turn: d.turn,
            text: d.text.clone(),
            reset: d.reset,
        }),
    }
}

pub fn run_event(e: &pb::RunEvent) -> IncomingRunEvent {
    IncomingRunEvent {
        run_id: e.run_id.clone(),
        attempt: e.attempt,
        seq: e.seq,
        task_id: e.task_id.clone(),
        at_ms: e.at_ms,
        kind: e.kind.clone(),
        json: e.json.clone(),
        sync: e.sync,
    }
}

pub fn to_nest(m: ToNest) -> pb::HubMessage {
    use pb::hub_message::Msg;
    let msg = match m {
        ToNest::Registered {
            nest_id,
            heartbeat_interval_ms,
            stop_instances,
            disconnect_grace_ms,
        } => Msg::Registered(pb::Registered {
            nest_id,
            heartbeat_interval_ms,
            stop_instances,
            disconnect_grace_ms,
        }),
        ToNest::LogRequest {
            request_id,
            instance_id,
            server,
            since_ms,
            tail,
            follow,
            namespace,
            search,
        } => Msg::LogRequest(pb::LogRequest {
            request_id,
            instance_id,
            server,
            since_ms,
            tail,
            follow,
            namespace,
            search,
        }),
        ToNest::Ping { ca_sha256 } => Msg::Ping(pb::HubPing {
            at_ms: crate::model::now_ms(),
            ca_sha256,
        }),
        ToNest::Place {
            instance_id,
            namespace,
            deployment,
            bundle_digest,
            generation,
            concurrency,
            platform_secrets,
            resources: resources_spec,
        } => Msg::Place(pb::PlaceInstance {
            instance_id,
            namespace,
            deployment,
            bundle_digest,
            generation,
            concurrency,
            platform_secrets: platform_secrets.0.into_iter().collect(),
            resources: Some(resources(&resources_spec)),
        }),
        ToNest::Stop {
            instance_id,
            reason,
        } => Msg::Stop(pb::StopInstance {
            instance_id,
            reason,
        }),
        // Deprecated `history_json`/`replay_json` stay empty: the context travels over
        // `FetchRunContext`.
        ToNest::AssignRun(a) => Msg::AssignRun(pb::AssignRun::from(*a)),
        ToNest::CancelRun {
            run_id,
            instance_id,
            reason,
            interrupt,
        } => Msg::CancelRun(pb::CancelRun {
            run_id,
            instance_id,
            reason,
            interrupt,
        }),
        ToNest::ApprovalDecided {
            run_id,
            instance_id,
            call_id,
            approved,
            reason,
            by,
            digest,
            arguments,
        } => Msg::ApprovalDecided(pb::ApprovalDecision {
            run_id,
            instance_id,
            call_id,
            approved,
            reason,
            by,
            digest,
            arguments_json: arguments.map(|a| a.to_string()).unwrap_or_default(),
        }),
        ToNest::Ack {
            run_id,
            attempt,
            acked_seq,
            fenced,
        } => Msg::Ack(pb::RunEventsAck {
            run_id,
            attempt,
            acked_seq,
            fenced,
        }),
    };
    pb::HubMessage { msg: Some(msg) }
}

/// A secret's metadata (there is no field for its value).
pub fn secret(m: &crate::secrets::SecretMeta) -> pb::Secret {
    pb::Secret {
        namespace: m.namespace.clone(),
        name: m.name.clone(),
        created_at_ms: m.created_at_ms,
        updated_at_ms: m.updated_at_ms,
    }
}

pub fn artifact(a: &crate::core::artifacts::ArtifactRec) -> pb::Artifact {
    pb::Artifact {
        artifact_id: a.id.clone(),
        name: a.name.clone(),
        media_type: a.media_type.clone(),
        size: a.size,
        task_id: a.task_id.clone(),
        created_at_ms: a.created_at_ms,
        namespace: a.namespace.clone(),
    }
}

/// An artifact's bytes as a `GetArtifact` / `ReadArtifact` stream: the first chunk carries
/// the metadata; always at least one chunk.
pub fn artifact_chunks(
    a: &crate::core::artifacts::ArtifactRec,
    bytes: &[u8],
) -> Vec<pb::ArtifactChunk> {
    const CHUNK: usize = 1024 * 1024;
    let mut chunks: Vec<pb::ArtifactChunk> = bytes
        .chunks(CHUNK)
        .map(|c| pb::ArtifactChunk {
            artifact: None,
            data: c.to_vec(),
        })
        .collect();
    if chunks.is_empty() {
        chunks.push(pb::ArtifactChunk::default());
    }
    if let Some(first) = chunks.first_mut() {
        first.artifact = Some(artifact(a));
    }
    chunks
}

pub fn log_line(l: crate::logs::LogLineRec) -> pb::LogLine {
    pb::LogLine {
        instance_id: l.instance_id,
        server: l.server,
        at_ms: l.at_ms,
        level: l.level,
        text: l.text,
        nest: l.nest,
    }
}

pub fn log_line_rec(l: pb::LogLine) -> crate::logs::LogLineRec {
    crate::logs::LogLineRec {
        instance_id: l.instance_id,
        server: l.server,
        at_ms: l.at_ms,
        level: l.level,
        text: l.text,
        nest: l.nest,
    }
}

/// The largest output schema a submit may give (`SubmitTaskRequest.output_schema_json`).
pub const MAX_OUTPUT_SCHEMA_BYTES: usize = 64 * 1024;

/// A submit's own output schema, checked: at most 64 KiB of JSON that compiles as a JSON
/// schema; returned as compact JSON text (empty: none).
pub fn output_schema(text: String) -> Result<String, HubError> {
    if text.trim().is_empty() {
        return Ok(String::new());
    }
    crate::limits::check_bytes("output_schema_json", &text, MAX_OUTPUT_SCHEMA_BYTES)?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        HubError::invalid(format!(
            "output_schema_json: not JSON ({e}); expected a JSON schema such as {{\"type\": \"object\"}}"
        ))
    })?;
    agen_shared::bundle::OutputSchema::new("--output-schema", value.clone())
        .map_err(|m| HubError::invalid(format!("output_schema_json: {m}")))?;
    Ok(value.to_string())
}

/// Most patterns in each list of a task's tool overrides.
const MAX_OVERRIDE_PATTERNS: usize = 64;
/// Longest tool pattern.
const MAX_PATTERN_BYTES: usize = 256;

/// A submit's tool overrides, checked: at most 64 patterns per list, each 1–256 bytes.
pub fn tool_overrides(o: pb::ToolOverrides) -> Result<agen_shared::bundle::Permissions, HubError> {
    for (list, patterns) in [("allow", &o.allow), ("ask", &o.ask), ("deny", &o.deny)] {
        let field = format!("tool_overrides.{list}");
        if patterns.len() > MAX_OVERRIDE_PATTERNS {
            return Err(HubError::invalid(format!(
                "{field}: {} patterns is over the limit of {MAX_OVERRIDE_PATTERNS}",
                patterns.len()
            )));
        }
        for p in patterns {
            crate::limits::check_bytes(&field, p, MAX_PATTERN_BYTES)?;
            if p.trim().is_empty() {
                return Err(HubError::invalid(format!(
                    "{field}: an empty pattern; expected `<server>.<tool>`, `<server>_<tool>` or `*`"
                )));
            }
        }
    }
    Ok(agen_shared::bundle::Permissions {
        allow: o.allow,
        ask: o.ask,
        deny: o.deny,
    })
}

fn to_pb_overrides(p: &agen_shared::bundle::Permissions) -> pb::ToolOverrides {
    p.into()
}
