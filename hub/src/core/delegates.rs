//! Delegate calls (`call_agent` / `start_agent`): a run's child tasks. A Nest asks on behalf
//! of a run it holds the lease of ([`Parent`]); the Hub makes the child with the call's
//! idempotency key as its client request id, so a resumed call finds the same child and never
//! starts a second one; it tells the caller when the child ends and cancels it on request.
//!
//! Invariants: only the lease holder of the parent run (Nest, instance, run id, current
//! attempt) may start, wait for or cancel its children; a child goes only to a deployment the
//! parent's bundle lists in `delegates` (the bundle the run is pinned to), in the delegate's
//! namespace or the parent's; a child records its parent, the root run of its tree and its
//! depth.

use std::sync::Arc;
use std::time::Duration;

use agen_shared::bundle::Delegate;

use crate::core::tasks::{ChildOf, TaskSpec};
use crate::core::{namespace_or_default, Core};
use crate::error::{HubError, Result};
use crate::model::{TaskRec, TaskState};

/// The longest a single `WaitChild` holds the call open.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// The run asking, as its Nest names it.
#[derive(Debug, Clone)]
pub struct Parent {
    pub task_id: String,
    pub run_id: String,
    pub attempt: u32,
    pub instance_id: String,
    /// The calling Nest by certificate; `None` on a plaintext Hub.
    pub nest_id: Option<String>,
}

/// A child task to start.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    /// Empty: the parent's namespace.
    pub namespace: String,
    pub deployment: String,
    pub input: String,
    pub conversation_key: String,
    pub idempotency_key: String,
    /// The call's span in the parent's trace.
    pub parent_span_id: String,
}

/// How a child ended (or that it has not yet).
#[derive(Debug, Clone)]
pub struct ChildEnd {
    pub done: bool,
    pub state: TaskState,
    pub result: String,
    pub response_type: String,
    pub artifacts: Vec<String>,
}

/// What a bundle says about delegation: whom it may call and how deep a tree may grow.
#[derive(Debug, Clone, Default)]
pub(crate) struct Delegation {
    pub delegates: Vec<Delegate>,
    /// `limits.maxDelegationDepth` of `x-agen/harness.json`.
    pub max_depth: u32,
}

impl Core {
    /// The parent task, when `p` holds its lease now.
    fn leased_parent(&self, p: &Parent) -> Result<TaskRec> {
        let st = self.lock();
        let Some(task) = st.tasks.get(&p.task_id) else {
            return Err(HubError::not_found(format!(
                "parent task {} is unknown to the hub",
                p.task_id
            )));
        };
        let holds = task.run_id == p.run_id
            && !task.run_id.is_empty()
            && task.attempt == p.attempt
            && !task.lease.revoked
            && task.lease.instance_id == p.instance_id
            && p.nest_id.as_ref().is_none_or(|n| *n == task.lease.nest_id)
            && matches!(task.state, TaskState::Running | TaskState::Waiting);
        if !holds {
            return Err(HubError::PermissionDenied(format!(
                "run {} attempt {} of task {} is not the run this nest and instance hold; only the run's current attempt may delegate",
                p.run_id, p.attempt, p.task_id
            )));
        }
        Ok(task.clone())
    }

    /// The delegation rules of the bundle `digest` (read once per digest: a digest names one
    /// content, so this never goes stale).
    async fn delegation_of(&self, digest: &str) -> Result<Arc<Delegation>> {
        if let Some(d) = self
            .bundle_delegation
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(digest)
        {
            return Ok(d.clone());
        }
        let Some(bytes) = self.bundle_bytes(digest)? else {
            return Err(HubError::not_found(format!(
                "bundle {digest} of the parent run is not in the hub's store"
            )));
        };
        let delegation = tokio::task::spawn_blocking(move || bundle_delegation(&bytes))
            .await
            .map_err(|e| HubError::Internal(format!("bundle check panicked: {e}")))??;
        let delegation = Arc::new(delegation);
        self.bundle_delegation
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(digest.to_string(), delegation.clone());
        Ok(delegation)
    }

    /// Starts (or finds again, by its idempotency key) the child task of a delegate call.
    pub async fn start_child(&self, p: &Parent, spec: ChildSpec) -> Result<TaskRec> {
        let parent = self.leased_parent(p)?;
        let delegation = self.delegation_of(&parent.bundle_digest).await?;
        let parent_ns = namespace_or_default(&parent.namespace);
        let namespace = if spec.namespace.is_empty() {
            parent_ns.clone()
        } else {
            spec.namespace.clone()
        };
        // A remote A2A agent is called by the harness itself, never as a child task.
        let listed = delegation.delegates.iter().any(|d| {
            d.a2a.is_none()
                && d.deployment == spec.deployment
                && d.namespace.clone().unwrap_or_else(|| parent_ns.clone()) == namespace
        });
        if !listed {
            return Err(HubError::PermissionDenied(format!(
                "deployment {namespace}/{} is not a delegate of deployment {}/{} (x-agen/config.json delegates)",
                spec.deployment, parent.namespace, parent.deployment
            )));
        }
        // The Hub holds the limit too: a harness that does not check it starts nothing deeper.
        // And caps it (`--max-delegation-depth`): a bundle cannot raise its own limit.
        let depth = parent.delegation_depth + 1;
        let hub_max = self.opts.limits.max_delegation_depth;
        if depth > delegation.max_depth.min(hub_max) {
            let over = if hub_max < delegation.max_depth {
                format!("the Hub's --max-delegation-depth of {hub_max} (the bundle asks for {}; an operator may raise the flag)", delegation.max_depth)
            } else {
                format!(
                    "limits.maxDelegationDepth of {} (x-agen/harness.json of deployment {}/{})",
                    delegation.max_depth, parent.namespace, parent.deployment
                )
            };
            return Err(HubError::ResourceExhausted(format!(
                "delegation depth: a child of task {} would make the tree {depth} deep, over {over}",
                parent.task_id
            )));
        }
        if spec.idempotency_key.is_empty() {
            return Err(HubError::invalid(
                "idempotency_key: expected the call's agen/idempotencyKey, got an empty string",
            ));
        }
        let root_run_id = if parent.root_run_id.is_empty() {
            parent.run_id.clone()
        } else {
            parent.root_run_id.clone()
        };
        // One task tree is one W3C trace: the child's runs use the parent's trace id (their
        // tool calls' `_meta` `traceparent` included), and its run span's parent is the
        // parent's `call_agent` span.
        let candidate = format!(
            "00-{}-{}-01",
            crate::trace::trace_id(&parent),
            spec.parent_span_id
        );
        let traceparent = if crate::trace::parse_traceparent(&candidate).is_some() {
            candidate
        } else {
            String::new()
        };
        let child = self
            .submit_task(TaskSpec {
                namespace,
                deployment: spec.deployment,
                input: spec.input,
                // A child carries its parent's labels (its tool calls' `_meta` `agen/labels`).
                labels: parent.labels.clone(),
                conversation_key: spec.conversation_key,
                client_request_id: spec.idempotency_key,
                parent: Some(ChildOf {
                    parent_task_id: parent.task_id.clone(),
                    root_run_id,
                    delegation_depth: parent.delegation_depth + 1,
                    parent_span_id: spec.parent_span_id,
                }),
                // A child runs under its own bundle's permissions.
                tool_overrides: Default::default(),
                traceparent,
                budget: Default::default(),
                webhooks: Vec::new(),
                double_texting: None,
                output_schema: String::new(),
            })
            .await?;
        if child.parent_task_id != parent.task_id {
            return Err(HubError::AlreadyExists(format!(
                "idempotency_key: already used for task {}, which is not a child of task {}",
                child.task_id, parent.task_id
            )));
        }
        Ok(child)
    }

    /// The child `child_id` of the run `p`, checked.
    fn child_of(&self, p: &Parent, child_id: &str) -> Result<TaskRec> {
        let parent = self.leased_parent(p)?;
        let st = self.lock();
        match st.tasks.get(child_id) {
            Some(c) if c.parent_task_id == parent.task_id => Ok(c.clone()),
            _ => Err(HubError::not_found(format!(
                "task {child_id} is not a child of task {}",
                parent.task_id
            ))),
        }
    }

    /// Waits up to `wait` (at most [`MAX_WAIT`]) for the child to end.
    pub async fn wait_child(&self, p: &Parent, child_id: &str, wait: Duration) -> Result<ChildEnd> {
        let mut updates = self.subscribe();
        let mut child = self.child_of(p, child_id)?;
        let deadline = tokio::time::Instant::now() + wait.min(MAX_WAIT);
        while !child.state.is_terminal() {
            match tokio::time::timeout_at(deadline, updates.recv()).await {
                Err(_) => break,
                Ok(Ok(u)) if u.task_id == child_id => child = u.task.clone(),
                Ok(Ok(_)) => {}
                Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {
                    child = self.child_of(p, child_id)?;
                }
                Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => break,
            }
        }
        if !child.state.is_terminal() {
            return Ok(ChildEnd {
                done: false,
                state: child.state,
                result: String::new(),
                response_type: String::new(),
                artifacts: Vec::new(),
            });
        }
        let artifacts = self
            .list_artifacts(&child.namespace, &child.task_id)?
            .into_iter()
            .map(|a| a.id)
            .collect();
        let outcome = child.outcome.clone().unwrap_or_default();
        let result = if outcome.result.is_empty() {
            outcome.error
        } else {
            outcome.result
        };
        Ok(ChildEnd {
            done: true,
            state: child.state,
            result,
            response_type: outcome.response_type,
            artifacts,
        })
    }

    /// Cancels a child of the run `p` (with its own subtree).
    pub async fn cancel_child(&self, p: &Parent, child_id: &str, reason: &str) -> Result<()> {
        let child = self.child_of(p, child_id)?;
        self.cancel_task(&child.namespace, &child.task_id, reason)
            .await?;
        Ok(())
    }
}

/// The delegation rules an uploaded bundle declares.
pub(crate) fn bundle_delegation(bytes: &[u8]) -> Result<Delegation> {
    let tmp = tempfile::tempdir().map_err(HubError::io(
        std::env::temp_dir(),
        "cannot create a temporary folder",
    ))?;
    let dir = tmp.path().join("bundle");
    agen_shared::bundle::unpack(bytes, &dir)
        .map_err(|e| HubError::invalid(format!("bundle: {e}")))?;
    let bundle = agen_shared::bundle::Bundle::load(&dir)
        .map_err(|e| HubError::invalid(format!("bundle: {e}")))?;
    Ok(Delegation {
        delegates: bundle.config.delegates,
        max_depth: bundle.harness.limits.max_delegation_depth,
    })
}
