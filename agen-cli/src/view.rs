//! How API objects look to people (tables) and to scripts (JSON with snake_case keys).
//! The JSON shapes are contracts scripts rely on, like the CLI's flags: add keys, never rename them.

use agen_proto::v1 as pb;
use serde_json::{json, Value};

use crate::client::Output;

pub use crate::table::{table, Table};

/// Prints a value for scripts: pretty JSON or YAML.
pub fn print_value(output: Output, v: &Value) {
    match output {
        Output::Yaml => {
            let text = serde_yaml::to_string(v).unwrap_or_else(|_| v.to_string());
            crate::out::line(text.trim_end());
        }
        Output::Json | Output::Table => print_json(v),
    }
}

pub fn print_json(v: &Value) {
    let text = if ONE_LINE.with(std::cell::Cell::get) {
        serde_json::to_string(v)
    } else {
        serde_json::to_string_pretty(v)
    };
    crate::out::line(&text.unwrap_or_else(|_| v.to_string()));
}

thread_local! {
    /// Set while [`one_line`] runs: JSON is printed compact, one document per line.
    static ONE_LINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `print` with JSON printed on one line (`-w -o json`: JSON Lines).
pub fn one_line(print: impl FnOnce()) {
    ONE_LINE.with(|c| c.set(true));
    print();
    ONE_LINE.with(|c| c.set(false));
}

pub fn time(ms: i64) -> Value {
    if ms <= 0 {
        return Value::Null;
    }
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| Value::String(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)))
        .unwrap_or(Value::Null)
}

/// A task's timeout as it would be written: `90s`, `10m`, `1h30m`.
pub fn duration_ms(ms: u64) -> String {
    agen_shared::duration::format_duration(std::time::Duration::from_millis(ms))
}

/// "3s", "5m", "2h" since `ms`.
pub fn age(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    let secs = ((chrono::Utc::now().timestamp_millis() - ms) / 1000).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

pub fn short_digest(d: &str) -> String {
    let hex = d.strip_prefix("sha256:").unwrap_or(d);
    format!("sha256:{}", &hex[..hex.len().min(12)])
}

pub fn instance_state(s: i32) -> &'static str {
    match pb::InstanceState::try_from(s).unwrap_or(pb::InstanceState::Unspecified) {
        pb::InstanceState::Running => "running",
        pb::InstanceState::Unhealthy => "unhealthy",
        pb::InstanceState::Stopping => "stopping",
        pb::InstanceState::Stopped => "stopped",
        pb::InstanceState::Lost => "lost",
        // Pending placements are instances that are not started yet.
        pb::InstanceState::Pending => "pending",
        pb::InstanceState::Starting | pb::InstanceState::Unspecified => "starting",
    }
}

pub fn nest_state(s: i32) -> &'static str {
    match pb::NestState::try_from(s).unwrap_or(pb::NestState::Unspecified) {
        pb::NestState::Ready => "ready",
        pb::NestState::Lost => "lost",
        pb::NestState::Disconnected => "disconnected",
        pb::NestState::Unspecified => "unknown",
    }
}

pub fn task_state(s: i32) -> &'static str {
    match pb::TaskState::try_from(s).unwrap_or(pb::TaskState::Unspecified) {
        pb::TaskState::Queued | pb::TaskState::Unspecified => "queued",
        pb::TaskState::Running => "running",
        pb::TaskState::Waiting => "waiting",
        pb::TaskState::Succeeded => "succeeded",
        pb::TaskState::Failed => "failed",
        pb::TaskState::Cancelled => "cancelled",
    }
}

pub fn task_terminal(s: i32) -> bool {
    matches!(task_state(s), "succeeded" | "failed" | "cancelled")
}

pub fn instance_json(i: &pb::Instance) -> Value {
    json!({
        "namespace": i.namespace,
        "deployment": i.deployment,
        "instance": i.instance_id,
        "nest": i.nest_name,
        "nest_id": i.nest_id,
        "state": instance_state(i.state),
        "healthy": i.healthy,
        "tools_loaded": i.tools_loaded,
        "servers_not_connected": i.servers_not_connected.iter().map(|p| p.server.clone()).collect::<Vec<_>>(),
        "server_errors": i.servers_not_connected.iter().map(|p| json!({"server": p.server, "reason": p.reason})).collect::<Vec<_>>(),
        "message": i.message,
        "bundle_digest": i.bundle_digest,
        "generation": i.generation,
        "restarts": i.restarts,
        "active_runs": i.active_runs,
        "tools": i.tools,
        "resources": i.resources.iter().map(|r| json!({"server": r.server, "uri": r.uri, "name": r.name, "mime_type": r.mime_type})).collect::<Vec<_>>(),
        "created_at": time(i.created_at_ms),
        "updated_at": time(i.updated_at_ms),
        "usage": i.usage.as_ref().map(usage_json),
        "servers_usage": i.servers_usage.iter().map(usage_json).collect::<Vec<_>>(),
        "oom_kills": i.oom_kills,
    })
}

/// One instance's or tool server's measured use (`agen ps --all -o json`, `agen top -o json`).
pub fn usage_json(u: &pb::ResourceUsage) -> Value {
    json!({
        "name": u.name,
        "cpu_percent": u.cpu_percent,
        "cpu_seconds": u.cpu_seconds,
        "memory_bytes": u.memory_bytes,
        "pids": u.pids,
    })
}

/// `12.5%` and `84Mi` for tables (`-` when not measured).
pub fn usage_cells(u: Option<&pb::ResourceUsage>) -> (String, String) {
    match u {
        Some(u) => (
            format!("{:.1}%", u.cpu_percent),
            agen_shared::bundle::resources::format_bytes(u.memory_bytes),
        ),
        None => ("-".into(), "-".into()),
    }
}

pub fn deployment_json(d: &pb::Deployment) -> Value {
    json!({
        "namespace": d.namespace,
        "name": d.name,
        "deployment": d.name,
        "agent": d.agent_name,
        "a2a_card_url": d.a2a_card_url,
        "bundle_digest": d.bundle_digest,
        "replicas": d.replicas,
        "ready_replicas": d.ready_replicas,
        "generation": d.generation,
        "concurrency": d.concurrency,
        "selector": d.selector,
        "resources": resources_json(d.resources.as_ref()),
        "created_at": time(d.created_at_ms),
        "updated_at": time(d.updated_at_ms),
    })
}

/// A deployment's per-instance resources as declared, with the defaults named.
pub fn resources_json(r: Option<&pb::Resources>) -> Value {
    use agen_shared::bundle::resources::{self as res, format_bytes, format_cpu};
    let r = r.cloned().unwrap_or_default();
    let default = " (default, not a limit)";
    json!({
        "cpu": if r.cpu_millis > 0 { format_cpu(r.cpu_millis) } else { format!("{}{default}", format_cpu(res::DEFAULT_CPU_MILLIS)) },
        "memory": if r.memory_bytes > 0 { format_bytes(r.memory_bytes) } else { format!("{}{default}", format_bytes(res::DEFAULT_MEMORY_BYTES)) },
        "pids": if r.pids > 0 { r.pids } else { res::DEFAULT_PIDS },
    })
}

pub fn nest_json(n: &pb::Nest) -> Value {
    json!({
        "name": n.name,
        "nest_id": n.nest_id,
        "state": nest_state(n.state),
        "labels": n.labels,
        "capacity": n.capacity,
        "instances": n.instances,
        "version": n.version,
        "commit": n.commit,
        "protocol_version": n.protocol_version,
        "last_heartbeat": time(n.last_heartbeat_ms),
        "registered_at": time(n.registered_at_ms),
        "revoked": n.revoked,
        "cordoned": n.cordoned,
        "separation": n.separation,
        "network": n.network,
        "draining_until": time(n.draining_until_ms),
        "cpu_millis": n.cpu_millis,
        "memory_bytes": n.memory_bytes,
        "reserved_cpu_millis": n.reserved_cpu_millis,
        "reserved_memory_bytes": n.reserved_memory_bytes,
        "resources": n.resources,
    })
}

pub fn progress_json(p: &Option<pb::Progress>) -> Value {
    match p {
        None => Value::Null,
        Some(p) => json!({
            "step": p.step,
            "done": p.done,
            "total": p.total,
            "note": if p.note.is_empty() { Value::Null } else { Value::String(p.note.clone()) },
            "artifacts": p.artifacts,
            "updated_at": time(p.updated_at_ms),
        }),
    }
}

pub fn task_json(t: &pb::Task) -> Value {
    let outcome = match (&t.outcome, task_terminal(t.state)) {
        (Some(o), true) => json!({
            // A structured answer (`outputSchema`) is shown as the JSON it is.
            "result": if o.response_type == "json" {
                serde_json::from_str(&o.result).unwrap_or_else(|_| Value::String(o.result.clone()))
            } else {
                Value::String(o.result.clone())
            },
            "response_type": if o.response_type.is_empty() { "text" } else { o.response_type.as_str() },
            "error": if o.error.is_empty() { Value::Null } else { Value::String(o.error.clone()) },
        }),
        _ => Value::Null,
    };
    json!({
        "task": t.task_id,
        "task_id": t.task_id,
        "namespace": t.namespace,
        "deployment": t.deployment,
        "state": task_state(t.state),
        "input": t.input,
        "input_bytes": t.input_bytes,
        "summary": t.summary,
        "labels": t.labels,
        "conversation_key": if t.conversation_key.is_empty() { Value::Null } else { Value::String(t.conversation_key.clone()) },
        "conversation_id": if t.conversation_id.is_empty() { Value::Null } else { Value::String(t.conversation_id.clone()) },
        "progress": progress_json(&t.progress),
        "activity": t.activity,
        "outcome": outcome,
        "run_id": t.run_id,
        "attempt": t.attempt,
        "instance": t.instance_id,
        "nest": t.nest_name,
        "bundle_digest": t.bundle_digest,
        "parent_task": if t.parent_task_id.is_empty() { Value::Null } else { Value::String(t.parent_task_id.clone()) },
        "root_run_id": if t.root_run_id.is_empty() { Value::Null } else { Value::String(t.root_run_id.clone()) },
        "tool_overrides": t.tool_overrides.as_ref().map_or(Value::Null, |o| json!({"allow": o.allow, "ask": o.ask, "deny": o.deny})),
        "warnings": t.warnings,
        "timeout": if t.timeout_ms == 0 { Value::Null } else { Value::String(duration_ms(t.timeout_ms)) },
        "deadline": time(t.deadline_ms),
        "max_tokens": if t.max_tokens == 0 { Value::Null } else { Value::from(t.max_tokens) },
        "created_at": time(t.created_at_ms),
        "started_at": time(t.started_at_ms),
        "finished_at": time(t.finished_at_ms),
    })
}

/// Parses repeated `k=v` flags.
pub fn parse_labels(items: &[String]) -> anyhow::Result<std::collections::HashMap<String, String>> {
    items
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .filter(|(k, _)| !k.is_empty())
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| anyhow::anyhow!("label {kv:?} is not of the form key=value"))
        })
        .collect()
}
