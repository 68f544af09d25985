//! The Hub's order to run one run on one instance of a Nest ([`AssignedRun`], `AssignRun` on
//! the gRPC stream) and the lease a run's own calls name ([`RunLease`]). The Hub builds the
//! order, the Nest reads it; `agen_proto::convert` is the one place it becomes protobuf and back.
//! The instance is given the [`super::RunAssignment`] the Nest makes of it, with the history and
//! the replay read.

use std::collections::BTreeMap;

use agen_shared::bundle::Permissions;

use super::{Attempt, DeploymentRef, InstanceId, RunId, TaskId};

/// One run to execute on one instance, and the bundle version it must run on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AssignedRun {
    pub run_id: RunId,
    pub attempt: Attempt,
    pub task_id: TaskId,
    pub instance_id: InstanceId,
    pub namespace: String,
    pub deployment: DeploymentRef,
    pub input: String,
    pub labels: BTreeMap<String, String>,
    pub conversation_id: String,
    pub conversation_key: String,
    /// The first run of the delegation tree (this run's id when it was not delegated).
    pub root_run_id: RunId,
    pub delegation_depth: u32,
    /// The run's trace id (the caller's when it gave a traceparent).
    pub trace_id: String,
    pub bundle_digest: String,
    /// Earlier messages of the conversation (a JSON array), only from a Hub older than
    /// `context_by_fetch`; empty: none, or still to fetch.
    pub history_json: String,
    /// Events of earlier attempts (a JSON array), only from a Hub older than
    /// `context_by_fetch`; empty: none, or still to fetch.
    pub replay_json: String,
    /// The task's overrides of its bundle's permissions (they only narrow).
    pub tool_overrides: Permissions,
    /// The history and the replay come over `FetchRunContext` before the run starts.
    pub context_by_fetch: bool,
    /// The task's token budget over all attempts (0: the bundle's, or none).
    pub max_tokens: u64,
    /// The task's own output schema (JSON text; empty: the bundle's `outputSchema`).
    pub output_schema: String,
}

impl AssignedRun {
    /// Who holds this run: the lease the Hub checks on the run's own calls.
    pub fn lease(&self) -> RunLease {
        RunLease {
            task_id: self.task_id.clone(),
            run_id: self.run_id.clone(),
            attempt: self.attempt,
            instance_id: self.instance_id.clone(),
        }
    }
}

/// A run's lease as the Nest names it to the Hub: task, run, attempt and the instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunLease {
    pub task_id: TaskId,
    pub run_id: RunId,
    pub attempt: Attempt,
    pub instance_id: InstanceId,
}
