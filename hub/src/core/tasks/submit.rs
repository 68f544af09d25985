//! Submitting a task: idempotent by client request id, conversations by key.

use sha2::{Digest, Sha256};

use crate::core::{namespace_or_default, validate_name, Core};
use crate::error::{HubError, Result};
use crate::store::Table;

use super::*;

impl Core {
    /// Queues a task; a retried submit with the same client request id returns the first task.
    pub async fn submit_task(&self, spec: TaskSpec) -> Result<TaskRec> {
        let namespace = namespace_or_default(&spec.namespace);
        validate_name("namespace", &namespace)?;
        validate_name("deployment", &spec.deployment)?;
        if spec.input.trim().is_empty() {
            return Err(HubError::invalid(
                "input: expected the task's text, got an empty string",
            ));
        }
        crate::limits::check_bytes(
            "client_request_id",
            &spec.client_request_id,
            MAX_CLIENT_REQUEST_ID_BYTES,
        )?;
        // Before the state lock: it may read the bundle.
        let warnings = self.override_warnings(&namespace, &spec);
        let budget = self.task_budget(&namespace, &spec);
        let double_texting = if spec.conversation_key.is_empty() {
            None
        } else {
            Some(self.double_texting_mode(&namespace, &spec))
        };
        let task = {
            let mut st = self.lock();
            if !st
                .deployments
                .contains_key(&deployment_key(&namespace, &spec.deployment))
            {
                return Err(HubError::not_found(format!(
                    "deployment {namespace}/{} not found",
                    spec.deployment
                )));
            }
            if !spec.client_request_id.is_empty() {
                let key = request_key(&namespace, &spec.client_request_id);
                if let Some(id) = self.db.get_json::<String>(Table::RequestIds, &key)? {
                    if let Some(t) = st.tasks.get(&id) {
                        if !same_submission(t, &spec) {
                            return Err(HubError::AlreadyExists(format!(
                                "client_request_id: `{}` was used for task {} with another deployment, input, labels or conversation key; use a new request id for a new task",
                                spec.client_request_id, t.task_id
                            )));
                        }
                        return Ok(t.clone());
                    }
                }
            }
            let queued = st.tasks.queued_of(&namespace, &spec.deployment);
            let r = (self.opts.limits).check_queued_tasks(&namespace, &spec.deployment, queued);
            self.limit_refusals.count("queued_tasks", r)?;
            if !spec.conversation_key.is_empty() {
                // The history quota: a conversation over it takes no more tasks (its next run
                // would carry the whole history).
                let id = conversation_id_for(&namespace, &spec.deployment, &spec.conversation_key);
                let held = self
                    .db
                    .raw()
                    .get(Table::Conversations, id.as_bytes())?
                    .map_or(0, |b| b.len());
                self.opts
                    .limits
                    .check_history(&spec.conversation_key, held)?;
                if let Some(mode) = double_texting {
                    self.double_text(&mut st, &id, &spec.conversation_key, mode)?;
                }
            }
            let now = now_ms();
            let seq = self.db.raw().increment("task_seq")?;
            let mut task = queued_task(
                NewTask {
                    namespace: &namespace,
                    deployment: &spec.deployment,
                    input: &spec.input,
                    labels: spec.labels.clone(),
                    conversation_key: &spec.conversation_key,
                    client_request_id: &spec.client_request_id,
                },
                seq,
                now,
            );
            task.tool_overrides = spec.tool_overrides.clone();
            task.warnings = warnings;
            if let Some(p) = &spec.parent {
                task.parent_task_id = p.parent_task_id.clone();
                task.root_run_id = p.root_run_id.clone();
                task.delegation_depth = p.delegation_depth;
                task.parent_span_id = p.parent_span_id.clone();
            }
            task.traceparent = spec.traceparent.clone();
            task.budget = crate::core::deadlines::with_deadline(budget, now);
            task.output_schema = spec.output_schema.clone();
            if !spec.client_request_id.is_empty() {
                self.db.put_json(
                    Table::RequestIds,
                    &request_key(&namespace, &spec.client_request_id),
                    &task.task_id,
                )?;
            }
            let hooks = self.webhooks_of_task(&task, &spec.webhooks)?;
            if !hooks.is_empty() {
                let rec = crate::core::webhooks::WebhookRec::new(&task, hooks);
                self.db.put_json(Table::Webhooks, &task.task_id, &rec)?;
                self.webhooks.opened(&task.task_id);
            }
            self.emit_state(&mut st, task.clone())?;
            st.tasks.get(&task.task_id).cloned().unwrap_or(task)
        };
        self.commit().await?;
        tracing::info!(task = %task.task_id, deployment = %format!("{}/{}", task.namespace, task.deployment), "task queued");
        self.poke();
        Ok(task)
    }
}

/// What a new task is made of; the rest starts empty.
pub(super) struct NewTask<'a> {
    pub namespace: &'a str,
    pub deployment: &'a str,
    pub input: &'a str,
    pub labels: BTreeMap<String, String>,
    pub conversation_key: &'a str,
    pub client_request_id: &'a str,
}

/// A task as a submit makes it at `now_ms`, numbered `seq`: queued, no run, no outcome, no
/// parent, no budget (the submit and `agen hub seed-tasks` build theirs from it).
pub(super) fn queued_task(n: NewTask<'_>, seq: u64, now_ms: i64) -> TaskRec {
    TaskRec {
        task_id: format!("task-{}", uuid::Uuid::now_v7().simple()),
        namespace: n.namespace.to_string(),
        deployment: n.deployment.to_string(),
        input: n.input.to_string(),
        labels: n.labels,
        conversation_key: n.conversation_key.to_string(),
        conversation_id: conversation_id_for(n.namespace, n.deployment, n.conversation_key),
        state: TaskState::Queued,
        activity: "queued".into(),
        progress: None,
        outcome: None,
        run_id: String::new(),
        attempt: 0,
        instance_id: String::new(),
        bundle_digest: String::new(),
        client_request_id: n.client_request_id.to_string(),
        created_at_ms: now_ms,
        updated_at_ms: now_ms,
        started_at_ms: 0,
        finished_at_ms: 0,
        nest_name: String::new(),
        seq,
        next_event_seq: 1,
        last_event_source: None,
        cancel_requested_at_ms: 0,
        cancel_reason: String::new(),
        rolled_back: false,
        lease: LeaseRec::default(),
        tool_overrides: Default::default(),
        warnings: Vec::new(),
        parent_task_id: String::new(),
        root_run_id: String::new(),
        delegation_depth: 0,
        parent_span_id: String::new(),
        traceparent: String::new(),
        suspended: None,
        wait_deadlines: Default::default(),
        budget: BudgetRec::default(),
        output_schema: String::new(),
    }
}

fn conversation_id_for(namespace: &str, deployment: &str, key: &str) -> String {
    if key.is_empty() {
        return format!("conv-{}", uuid::Uuid::now_v7().simple());
    }
    let mut h = Sha256::new();
    h.update(namespace.as_bytes());
    h.update([0]);
    h.update(deployment.as_bytes());
    h.update([0]);
    h.update(key.as_bytes());
    format!("conv-{}", &hex::encode(h.finalize())[..32])
}

/// Whether a retried submit asks for the same task as the one its request id made.
fn same_submission(t: &TaskRec, spec: &TaskSpec) -> bool {
    t.deployment == spec.deployment
        && t.input == spec.input
        && t.labels == spec.labels
        && t.conversation_key == spec.conversation_key
}

fn request_key(namespace: &str, id: &str) -> String {
    format!("{namespace}\u{0}{id}")
}
