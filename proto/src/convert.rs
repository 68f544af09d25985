//! protobuf ⇄ contract, written once and used by both ends of the Nest stream (the Hub's
//! `server/convert.rs`, the Nest's `hub_client/convert.rs`): the types of `agen-contract` that
//! cross a process over gRPC. Those here cannot fail (a missing message field is its default);
//! one that can will be a `TryFrom` whose error names the field and why.

use agen_contract::run::{AssignedRun, Attempt, RunLease};
use agen_shared::bundle::Permissions;

use crate::v1 as pb;

impl From<&Permissions> for pb::ToolOverrides {
    fn from(p: &Permissions) -> Self {
        pb::ToolOverrides {
            allow: p.allow.clone(),
            ask: p.ask.clone(),
            deny: p.deny.clone(),
        }
    }
}

impl From<pb::ToolOverrides> for Permissions {
    fn from(o: pb::ToolOverrides) -> Self {
        Permissions {
            allow: o.allow,
            ask: o.ask,
            deny: o.deny,
        }
    }
}

impl From<AssignedRun> for pb::AssignRun {
    fn from(a: AssignedRun) -> Self {
        pb::AssignRun {
            run_id: a.run_id.0,
            attempt: a.attempt.0,
            task_id: a.task_id.0,
            instance_id: a.instance_id.0,
            namespace: a.namespace,
            deployment: a.deployment.0,
            input: a.input,
            labels: a.labels.into_iter().collect(),
            conversation_id: a.conversation_id,
            conversation_key: a.conversation_key,
            root_run_id: a.root_run_id.0,
            bundle_digest: a.bundle_digest,
            history_json: a.history_json,
            replay_json: a.replay_json,
            delegation_depth: a.delegation_depth,
            trace_id: a.trace_id,
            tool_overrides: Some((&a.tool_overrides).into()),
            context_by_fetch: a.context_by_fetch,
            max_tokens: a.max_tokens,
            output_schema_json: a.output_schema,
        }
    }
}

impl From<pb::AssignRun> for AssignedRun {
    /// Never fails: a missing `tool_overrides` narrows nothing; whether the order is usable
    /// (ids present, attempt above 0) is the Nest's to judge and report on the run.
    fn from(a: pb::AssignRun) -> Self {
        AssignedRun {
            run_id: a.run_id.into(),
            attempt: Attempt(a.attempt),
            task_id: a.task_id.into(),
            instance_id: a.instance_id.into(),
            namespace: a.namespace,
            deployment: a.deployment.into(),
            input: a.input,
            labels: a.labels.into_iter().collect(),
            conversation_id: a.conversation_id,
            conversation_key: a.conversation_key,
            root_run_id: a.root_run_id.into(),
            bundle_digest: a.bundle_digest,
            history_json: a.history_json,
            replay_json: a.replay_json,
            delegation_depth: a.delegation_depth,
            trace_id: a.trace_id,
            tool_overrides: a.tool_overrides.map(Permissions::from).unwrap_or_default(),
            context_by_fetch: a.context_by_fetch,
            max_tokens: a.max_tokens,
            output_schema: a.output_schema_json,
        }
    }
}

impl From<&RunLease> for pb::FetchRunContextRequest {
    fn from(l: &RunLease) -> Self {
        pb::FetchRunContextRequest {
            task_id: l.task_id.0.clone(),
            run_id: l.run_id.0.clone(),
            attempt: l.attempt.0,
            instance_id: l.instance_id.0.clone(),
        }
    }
}

impl From<&RunLease> for pb::ChildParent {
    fn from(l: &RunLease) -> Self {
        pb::ChildParent {
            task_id: l.task_id.0.clone(),
            run_id: l.run_id.0.clone(),
            attempt: l.attempt.0,
            instance_id: l.instance_id.0.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field survives contract → protobuf → contract.
    #[test]
    fn an_assignment_round_trips_through_protobuf() {
        let a = AssignedRun {
            run_id: "r".into(),
            attempt: Attempt(3),
            task_id: "t".into(),
            instance_id: "i".into(),
            namespace: "ns".into(),
            deployment: "d".into(),
            input: "hi".into(),
            labels: [("k".to_string(), "v".to_string())].into_iter().collect(),
            conversation_id: "c".into(),
            conversation_key: "ck".into(),
            root_run_id: "root".into(),
            delegation_depth: 1,
            trace_id: "tr".into(),
            bundle_digest: "sha256:00".into(),
            history_json: "[]".into(),
            replay_json: "[1]".into(),
            tool_overrides: Permissions {
                allow: vec!["a".into()],
                ask: vec!["b".into()],
                deny: vec!["c".into()],
            },
            context_by_fetch: true,
            max_tokens: 9,
            output_schema: "{}".into(),
        };
        let back = AssignedRun::from(pb::AssignRun::from(a.clone()));
        assert_eq!(back, a);
    }
}
