//! proto ⇄ domain conversion: the only place in the Nest that knows both `agen_proto` and
//! `crate::model` (the Hub link and the typed calls of [`super::HubClient`] use it).
//!
//! Invariant: a conversion copies fields and nothing else, so the bytes on the wire are what
//! the Nest sent before it had its own types (a run event's `kind` and `json` are its body's).

use agen_harness::artifacts::ArtifactMeta;
use agen_harness::run::{ChildEnd, ChildRequest, RunState};
use agen_proto::v1 as pb;

use crate::model::*;

pub fn place(p: pb::PlaceInstance) -> PlaceOrder {
    PlaceOrder {
        instance_id: p.instance_id,
        namespace: p.namespace,
        deployment: p.deployment,
        bundle_digest: p.bundle_digest,
        generation: p.generation,
        concurrency: p.concurrency,
        platform_secrets: p.platform_secrets.into_iter().collect(),
        resources: p
            .resources
            .map(|r| agen_shared::bundle::ResourceSpec {
                cpu_millis: (r.cpu_millis > 0).then_some(r.cpu_millis),
                memory_bytes: (r.memory_bytes > 0).then_some(r.memory_bytes),
                pids: (r.pids > 0).then_some(r.pids),
            })
            .unwrap_or_default(),
    }
}

fn usage(u: UsageSample) -> pb::ResourceUsage {
    pb::ResourceUsage {
        name: u.name,
        cpu_percent: u.cpu_percent,
        cpu_seconds: u.cpu_seconds,
        memory_bytes: u.memory_bytes,
        pids: u.pids,
    }
}

pub fn assigned_run(a: pb::AssignRun) -> AssignedRun {
    a.into()
}

pub fn log_request(r: pb::LogRequest) -> LogRequest {
    LogRequest {
        request_id: r.request_id,
        instance_id: r.instance_id,
        server: r.server,
        since_ms: r.since_ms,
        tail: r.tail,
        follow: r.follow,
        namespace: r.namespace,
        search: r.search,
    }
}

/// The run, instance and decision of an `ApprovalDecision`. Edited arguments that are not a
/// JSON object (the Hub checks them; a damaged message) deny the call rather than send it with
/// the arguments the person replaced.
pub fn approval(d: pb::ApprovalDecision) -> (String, String, agen_contract::run::ApprovalDecided) {
    let (mut approved, mut reason) = (d.approved, d.reason);
    let arguments = match d.arguments_json.as_str() {
        "" => None,
        text => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v) if v.is_object() => Some(v),
            _ => {
                approved = false;
                reason = "the edited arguments of this approval could not be read as a JSON object; the call was not sent".into();
                None
            }
        },
    };
    (
        d.run_id,
        d.instance_id,
        agen_contract::run::ApprovalDecided {
            call_id: d.call_id,
            approved,
            reason,
            by: d.by,
            digest: d.digest,
            arguments,
        },
    )
}

fn instance_state(s: InstanceState) -> pb::InstanceState {
    match s {
        InstanceState::Pending => pb::InstanceState::Pending,
        InstanceState::Starting => pb::InstanceState::Starting,
        InstanceState::Running => pb::InstanceState::Running,
        InstanceState::Unhealthy => pb::InstanceState::Unhealthy,
        InstanceState::Stopping => pb::InstanceState::Stopping,
    }
}

pub fn report(r: InstanceReport) -> pb::InstanceReport {
    pb::InstanceReport {
        instance_id: r.instance_id,
        namespace: r.namespace,
        deployment: r.deployment,
        bundle_digest: r.bundle_digest,
        generation: r.generation,
        state: instance_state(r.state) as i32,
        healthy: r.healthy,
        tools_loaded: r.tools_loaded,
        servers_not_connected: r
            .servers_not_connected
            .into_iter()
            .map(|p| pb::ServerProblem {
                server: p.server,
                reason: p.reason,
            })
            .collect(),
        message: r.message,
        restarts: r.restarts,
        pid: r.pid,
        active_runs: r.active_runs,
        tools: r.tools,
        resources: r
            .resources
            .into_iter()
            .map(|x| pb::McpResource {
                server: x.server,
                uri: x.uri,
                name: x.name,
                mime_type: x.mime_type,
            })
            .collect(),
        run_attempts: r
            .run_attempts
            .into_iter()
            .map(|a| pb::ActiveRun {
                run_id: a.run_id,
                attempt: a.attempt,
            })
            .collect(),
        usage: r.usage.map(usage),
        servers_usage: r.servers_usage.into_iter().map(usage).collect(),
        oom_kills: r.oom_kills,
    }
}

pub fn reports(rs: Vec<InstanceReport>) -> Vec<pb::InstanceReport> {
    rs.into_iter().map(report).collect()
}

pub fn run_event(e: RunEvent) -> pb::RunEvent {
    pb::RunEvent {
        run_id: e.run_id,
        attempt: e.attempt,
        seq: e.seq,
        task_id: e.task_id,
        at_ms: e.at_ms,
        kind: e.body.kind().to_string(),
        json: e.body.to_json_string(),
        sync: e.sync,
    }
}

pub fn run_events(b: EventBatch) -> pb::RunEvents {
    pb::RunEvents {
        instance_id: b.instance_id,
        events: b.events.into_iter().map(run_event).collect(),
    }
}

pub fn run_deltas(ds: Vec<crate::model::RunDelta>) -> pb::RunDeltas {
    pb::RunDeltas {
        deltas: ds
            .into_iter()
            .map(|d| pb::RunDelta {
                run_id: d.run_id,
                task_id: d.task_id,
                attempt: d.delta.attempt,
                turn: d.delta.turn,
                text: d.delta.text,
                reset: d.delta.reset,
            })
            .collect(),
    }
}

pub fn log_chunk(c: LogChunk) -> pb::LogChunk {
    pb::LogChunk {
        request_id: c.request_id,
        lines: c
            .lines
            .into_iter()
            .map(|l| pb::LogLine {
                instance_id: l.instance_id,
                server: l.server,
                at_ms: l.at_ms,
                level: l.level,
                text: l.text,
                nest: String::new(),
            })
            .collect(),
        error: c.error,
        not_kept: c.not_kept,
    }
}

pub fn context_request(l: &RunLease) -> pb::FetchRunContextRequest {
    l.into()
}

pub fn context_chunk(c: pb::RunContextChunk) -> ContextChunk {
    ContextChunk {
        history_size: c.history_size,
        replay_size: c.replay_size,
        history: c.history,
        replay: c.replay,
    }
}

pub fn child_parent(l: &RunLease) -> pb::ChildParent {
    l.into()
}

pub fn start_child(parent: &RunLease, c: ChildRequest) -> pb::StartChildRequest {
    pb::StartChildRequest {
        parent: Some(child_parent(parent)),
        namespace: c.namespace.unwrap_or_default(),
        deployment: c.deployment,
        input: c.input,
        conversation_key: c.conversation_key,
        idempotency_key: c.idempotency_key,
        parent_span_id: c.parent_span_id,
    }
}

/// How the child ended; `None` while it still runs.
pub fn child_end(r: pb::WaitChildResponse) -> Option<ChildEnd> {
    if !r.done {
        return None;
    }
    let state = match pb::TaskState::try_from(r.state) {
        Ok(pb::TaskState::Succeeded) => RunState::Succeeded,
        Ok(pb::TaskState::Cancelled) => RunState::Cancelled,
        _ => RunState::Failed,
    };
    Some(ChildEnd {
        state,
        result: r.result,
        artifacts: r.artifacts,
    })
}

/// The first chunk's metadata of an artifact of `size` bytes.
pub fn new_artifact(a: NewArtifact, size: u64) -> pb::Artifact {
    pb::Artifact {
        artifact_id: a.artifact_id,
        name: a.name,
        media_type: a.media_type,
        size,
        task_id: a.task_id,
        created_at_ms: 0,
        namespace: a.namespace,
    }
}

pub fn artifact_meta(a: pb::Artifact) -> ArtifactMeta {
    ArtifactMeta {
        id: a.artifact_id,
        name: a.name,
        media_type: a.media_type,
        size: a.size,
        task_id: a.task_id,
        created_at_ms: a.created_at_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agen_contract::run::{RunEventBody, RunInterrupted};
    use pretty_assertions::assert_eq;

    #[test]
    fn a_run_event_goes_out_with_its_bodys_kind_and_json() {
        let body = RunEventBody::RunInterrupted(RunInterrupted {
            reason: "gone".into(),
            cause: "instance_died".into(),
        });
        let e = RunEvent {
            run_id: "r".into(),
            attempt: 2,
            seq: 7,
            task_id: "t".into(),
            at_ms: 5,
            body: body.clone(),
            sync: true,
        };
        assert_eq!(
            run_event(e),
            pb::RunEvent {
                run_id: "r".into(),
                attempt: 2,
                seq: 7,
                task_id: "t".into(),
                at_ms: 5,
                kind: "run.interrupted".into(),
                json: body.to_json_string(),
                sync: true,
            }
        );
    }

    #[test]
    fn a_report_keeps_every_field_and_its_state() {
        let place = PlaceOrder {
            instance_id: "i".into(),
            namespace: "ns".into(),
            deployment: "d".into(),
            bundle_digest: "sha256:00".into(),
            generation: 4,
            ..Default::default()
        };
        let mut r = InstanceReport::new(&place, InstanceState::Unhealthy, "down".into());
        r.servers_not_connected = vec![ServerProblem {
            server: "time".into(),
            reason: "exited".into(),
        }];
        r.restarts = 2;
        r.pid = 77;
        r.active_runs = vec!["r1".into()];
        r.run_attempts = vec![RunAttempt {
            run_id: "r1".into(),
            attempt: 3,
        }];
        assert_eq!(
            report(r),
            pb::InstanceReport {
                instance_id: "i".into(),
                namespace: "ns".into(),
                deployment: "d".into(),
                bundle_digest: "sha256:00".into(),
                generation: 4,
                state: pb::InstanceState::Unhealthy as i32,
                healthy: false,
                tools_loaded: 0,
                servers_not_connected: vec![pb::ServerProblem {
                    server: "time".into(),
                    reason: "exited".into(),
                }],
                message: "down".into(),
                restarts: 2,
                pid: 77,
                active_runs: vec!["r1".into()],
                tools: vec![],
                resources: vec![],
                run_attempts: vec![pb::ActiveRun {
                    run_id: "r1".into(),
                    attempt: 3,
                }],
                usage: None,
                servers_usage: vec![],
                oom_kills: 0,
            }
        );
        for (s, name) in [
            (InstanceState::Starting, "INSTANCE_STATE_STARTING"),
            (InstanceState::Running, "INSTANCE_STATE_RUNNING"),
            (InstanceState::Unhealthy, "INSTANCE_STATE_UNHEALTHY"),
            (InstanceState::Stopping, "INSTANCE_STATE_STOPPING"),
        ] {
            assert_eq!(instance_state(s).as_str_name(), name);
            assert_eq!(
                format!("instance_state_{}", s.as_str()),
                name.to_lowercase()
            );
        }
    }

    #[test]
    fn an_assignment_keeps_every_field() {
        let a = pb::AssignRun {
            run_id: "r".into(),
            attempt: 3,
            task_id: "t".into(),
            instance_id: "i".into(),
            namespace: "ns".into(),
            deployment: "d".into(),
            input: "hi".into(),
            labels: [("k".to_string(), "v".to_string())].into_iter().collect(),
            conversation_id: "c".into(),
            conversation_key: "ck".into(),
            root_run_id: "root".into(),
            bundle_digest: "sha256:00".into(),
            history_json: "[]".into(),
            replay_json: "[1]".into(),
            delegation_depth: 1,
            trace_id: "tr".into(),
            tool_overrides: Some(pb::ToolOverrides {
                allow: vec!["a".into()],
                ask: vec!["b".into()],
                deny: vec!["c".into()],
            }),
            context_by_fetch: true,
            max_tokens: 9,
            output_schema_json: String::new(),
        };
        let got = assigned_run(a);
        assert_eq!(
            (
                got.lease(),
                got.labels.get("k").map(String::as_str),
                got.tool_overrides.deny.clone(),
                got.context_by_fetch,
                got.max_tokens,
                got.replay_json.as_str(),
            ),
            (
                RunLease {
                    task_id: "t".into(),
                    run_id: "r".into(),
                    attempt: 3.into(),
                    instance_id: "i".into(),
                },
                Some("v"),
                vec!["c".to_string()],
                true,
                9,
                "[1]",
            )
        );
    }
}
