//! Tasks: submission (idempotent by client request id), the per-deployment queue, dispatch to
//! instances with a free slot, run events from Nests (append-if-absent, fenced, flushed, then
//! acknowledged), task state from events, conversations, cancel, watch and traces.
//!
//! Invariants: a task is stored before `SubmitTask` answers; a conversation's tasks run strictly
//! in submission order (one at a time); an instance never runs more tasks than its deployment's
//! concurrency; a run's assignment (its lease: run id, attempt, Nest, instance) is in the store
//! before `AssignRun` leaves the Hub; a run event is acknowledged only after a store flush that
//! covers it, and stored only when it comes from the lease's Nest and instance for its run and
//! attempt (see `leases`); a run that loses its instance is re-dispatched with the same run id
//! and the next attempt, with the earlier events to replay (its Nest was lost, the Nest sent
//! `run.interrupted`, or reconciliation found it not running), onto another instance when one
//! is free, only onto an instance of the bundle digest the run started on (none left after a
//! rollover: the task fails saying so), and fails after `limits.maxAttempts` attempts ended
//! by its own instance failing.

use std::collections::{BTreeMap, HashMap, HashSet};

use agen_shared::run::{kind, RunEventBody, RunState};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{HubError, Result};
use crate::fleet::{namespace_or_default, validate_name, Core, State};
use crate::leases::{self, Requeue};
use crate::model::*;
use crate::nodes::{RunAssignment, ToNest};
use crate::store::{task_event_key, Append, Table};
pub use crate::trace::{build_spans, SpanRec};

/// How long a cancelled running task waits for its run to finish before it is cancelled anyway.
const CANCEL_GRACE_MS: i64 = 5_000;
/// The longest client request id.
pub const MAX_CLIENT_REQUEST_ID_BYTES: usize = 200;

/// The body of a `task.state` event: the state, what the task is doing, and its outcome once
/// it has one.
#[derive(serde::Serialize)]
struct TaskStateEvent<'a> {
    state: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_type: Option<&'a str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    error: &'a str,
}

/// A task event as it happens, with the task after it (for `WatchTask`).
#[derive(Debug, Clone)]
pub struct TaskUpdate {
    pub task_id: String,
    pub event: TaskEventRec,
    pub task: TaskRec,
}

/// What a client submits.
#[derive(Debug, Clone, Default)]
pub struct TaskSpec {
    pub namespace: String,
    pub deployment: String,
    pub input: String,
    pub labels: BTreeMap<String, String>,
    pub conversation_key: String,
    pub client_request_id: String,
    /// Set for a delegate call's child task (see `delegates.rs`).
    pub parent: Option<ChildOf>,
    /// Narrows the bundle's permissions for this task (see `SubmitTaskRequest.tool_overrides`).
    pub tool_overrides: agen_shared::bundle::Permissions,
    /// The caller's W3C traceparent (checked by [`crate::trace::parse_traceparent`]); empty: none.
    pub traceparent: String,
}

/// Where a child task sits in its delegation tree.
#[derive(Debug, Clone, Default)]
pub struct ChildOf {
    pub parent_task_id: String,
    pub root_run_id: String,
    pub delegation_depth: u32,
    /// The delegate call's span in the parent's trace.
    pub parent_span_id: String,
}

/// `ListTasks` filters and the page wanted.
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    pub namespace: String,
    pub deployment: String,
    pub state: String,
    pub conversation_key: String,
    /// Only the children of this task (empty: any).
    pub parent_task_id: String,
    /// Tasks per page: 0 is [`DEFAULT_PAGE_SIZE`]; at most [`MAX_PAGE_SIZE`].
    pub page_size: u32,
    /// Only tasks submitted before the task with this submission seq (the page token).
    pub before_seq: Option<u64>,
}

/// Tasks per `ListTasks` page unless asked otherwise.
pub const DEFAULT_PAGE_SIZE: u32 = 100;
/// The most tasks one `ListTasks` page holds.
pub const MAX_PAGE_SIZE: u32 = 1000;
/// A page also ends once its summaries reach about this many bytes.
pub const MAX_PAGE_BYTES: usize = 4 * 1024 * 1024;
/// How much of a task's input a summary carries.
pub const SUMMARY_INPUT_BYTES: usize = 256;
/// How much of a task's result a summary carries.
pub const SUMMARY_RESULT_BYTES: usize = 1024;

/// A task as `ListTasks` shows it: input and result cut to a prefix.
#[derive(Debug, Clone)]
pub struct TaskSummary {
    pub task: TaskRec,
    /// Size of the whole input.
    pub input_bytes: u64,
}

/// One page of `ListTasks`, newest first.
#[derive(Debug, Clone)]
pub struct TaskPage {
    pub tasks: Vec<TaskSummary>,
    /// The seq to continue before (the next page token); `None` on the last page.
    pub next_before_seq: Option<u64>,
}

/// One run event as a Nest sends it.
#[derive(Debug, Clone)]
pub struct IncomingRunEvent {
    pub run_id: String,
    pub attempt: u32,
    pub seq: u64,
    pub task_id: String,
    pub at_ms: i64,
    pub kind: String,
    pub json: String,
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

/// A task with its input and result cut to a prefix; the big strings are never copied whole.
fn summarize(t: &TaskRec) -> TaskSummary {
    let cut = crate::limits::cut;
    let task = TaskRec {
        task_id: t.task_id.clone(),
        namespace: t.namespace.clone(),
        deployment: t.deployment.clone(),
        input: cut(&t.input, SUMMARY_INPUT_BYTES),
        labels: t.labels.clone(),
        conversation_key: t.conversation_key.clone(),
        conversation_id: t.conversation_id.clone(),
        state: t.state,
        activity: cut(&t.activity, SUMMARY_RESULT_BYTES),
        progress: t.progress.clone(),
        outcome: t.outcome.as_ref().map(|o| OutcomeRec {
            result: cut(&o.result, SUMMARY_RESULT_BYTES),
            response_type: o.response_type.clone(),
            error: cut(&o.error, SUMMARY_RESULT_BYTES),
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
        seq: t.seq,
        next_event_seq: t.next_event_seq,
        cancel_requested_at_ms: t.cancel_requested_at_ms,
        cancel_reason: cut(&t.cancel_reason, SUMMARY_RESULT_BYTES),
        lease: t.lease.clone(),
        tool_overrides: t.tool_overrides.clone(),
        warnings: t.warnings.clone(),
        parent_task_id: t.parent_task_id.clone(),
        root_run_id: t.root_run_id.clone(),
        delegation_depth: t.delegation_depth,
        parent_span_id: t.parent_span_id.clone(),
        traceparent: t.traceparent.clone(),
    };
    TaskSummary {
        task,
        input_bytes: t.input.len() as u64,
    }
}

/// About how many bytes a summary takes on the wire.
fn summary_size(t: &TaskRec) -> usize {
    let labels: usize = t.labels.iter().map(|(k, v)| k.len() + v.len() + 8).sum();
    let progress = t.progress.as_ref().map_or(0, |p| {
        p.step.len() + p.note.len() + p.artifacts.iter().map(|a| a.len() + 4).sum::<usize>()
    });
    let outcome = t.outcome.as_ref().map_or(0, |o| {
        o.result.len() + o.error.len() + o.response_type.len()
    });
    512 + t.input.len()
        + labels
        + progress
        + outcome
        + t.activity.len()
        + t.conversation_key.len()
        + t.client_request_id.len()
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

impl Core {
    fn save_task(&self, st: &mut State, task: TaskRec) -> Result<()> {
        self.db.put_json(Table::Tasks, &task.task_id, &task)?;
        st.tasks.insert(task.task_id.clone(), task);
        Ok(())
    }

    /// Appends a task event, saves the task and tells watchers.
    fn emit(&self, st: &mut State, mut task: TaskRec, kind: &str, json: String) -> Result<()> {
        let now = now_ms();
        task.next_event_seq = task.next_event_seq.max(1);
        task.updated_at_ms = now;
        let event = TaskEventRec {
            seq: task.next_event_seq,
            at_ms: now,
            kind: kind.to_string(),
            json,
            snapshot: Some(TaskSnapshot::of(&task)),
        };
        task.next_event_seq += 1;
        let bytes = serde_json::to_vec(&event).map_err(|e| HubError::Internal(e.to_string()))?;
        self.db.raw().put(
            Table::TaskEvents,
            &task_event_key(&task.task_id, event.seq),
            &bytes,
        )?;
        self.save_task(st, task.clone())?;
        let _ = self.updates.send(TaskUpdate {
            task_id: task.task_id.clone(),
            event,
            task,
        });
        Ok(())
    }

    fn emit_state(&self, st: &mut State, task: TaskRec) -> Result<()> {
        let body = TaskStateEvent {
            state: task.state.as_str(),
            message: &task.activity,
            result: task.outcome.as_ref().map(|o| o.result.as_str()),
            response_type: task.outcome.as_ref().map(|o| o.response_type.as_str()),
            error: task.outcome.as_ref().map_or("", |o| o.error.as_str()),
        };
        let json = serde_json::to_string(&body).map_err(|e| HubError::Internal(e.to_string()))?;
        self.emit(st, task, "task.state", json)
    }

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
            }
            let now = now_ms();
            let seq = self.db.raw().increment("task_seq")?;
            let task = TaskRec {
                task_id: format!("task-{}", uuid::Uuid::now_v7().simple()),
                namespace: namespace.clone(),
                deployment: spec.deployment.clone(),
                input: spec.input.clone(),
                labels: spec.labels.clone(),
                conversation_key: spec.conversation_key.clone(),
                conversation_id: conversation_id_for(
                    &namespace,
                    &spec.deployment,
                    &spec.conversation_key,
                ),
                state: TaskState::Queued,
                activity: "queued".into(),
                progress: None,
                outcome: None,
                run_id: String::new(),
                attempt: 0,
                instance_id: String::new(),
                bundle_digest: String::new(),
                client_request_id: spec.client_request_id.clone(),
                created_at_ms: now,
                updated_at_ms: now,
                started_at_ms: 0,
                finished_at_ms: 0,
                nest_name: String::new(),
                seq,
                next_event_seq: 1,
                cancel_requested_at_ms: 0,
                cancel_reason: String::new(),
                lease: LeaseRec::default(),
                tool_overrides: spec.tool_overrides.clone(),
                warnings,
                parent_task_id: spec
                    .parent
                    .as_ref()
                    .map(|p| p.parent_task_id.clone())
                    .unwrap_or_default(),
                root_run_id: spec
                    .parent
                    .as_ref()
                    .map(|p| p.root_run_id.clone())
                    .unwrap_or_default(),
                delegation_depth: spec.parent.as_ref().map_or(0, |p| p.delegation_depth),
                parent_span_id: spec
                    .parent
                    .as_ref()
                    .map(|p| p.parent_span_id.clone())
                    .unwrap_or_default(),
                traceparent: spec.traceparent.clone(),
            };
            if !spec.client_request_id.is_empty() {
                self.db.put_json(
                    Table::RequestIds,
                    &request_key(&namespace, &spec.client_request_id),
                    &task.task_id,
                )?;
            }
            self.emit_state(&mut st, task.clone())?;
            st.tasks.get(&task.task_id).cloned().unwrap_or(task)
        };
        self.commit().await?;
        tracing::info!(task = %task.task_id, deployment = %format!("{}/{}", task.namespace, task.deployment), "task queued");
        self.poke();
        Ok(task)
    }

    pub fn get_task(&self, namespace: &str, task_id: &str) -> Result<TaskRec> {
        let namespace = namespace_or_default(namespace);
        if task_id.is_empty() {
            return Err(HubError::invalid(
                "task_id: expected a task id, got an empty string",
            ));
        }
        let st = self.lock();
        st.tasks
            .get(task_id)
            .filter(|t| t.namespace == namespace)
            .cloned()
            .ok_or_else(|| {
                HubError::not_found(format!("task {task_id} not found in namespace {namespace}"))
            })
    }

    /// One page of tasks, newest first, as summaries (no task's whole input is copied).
    pub fn list_tasks(&self, f: &TaskFilter) -> Result<TaskPage> {
        let namespace = namespace_or_default(&f.namespace);
        let state = if f.state.is_empty() {
            None
        } else {
            Some(TaskState::parse(&f.state).ok_or_else(|| {
                HubError::invalid(format!(
                    "state: `{}` is not a task state; expected one of queued, running, waiting, succeeded, failed, cancelled",
                    crate::limits::prefix(&f.state)
                ))
            })?)
        };
        let page_size = match f.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        } as usize;
        let st = self.lock();
        let mut matching: Vec<(u64, &TaskRec)> = st
            .tasks
            .values()
            .filter(|t| t.namespace == namespace)
            .filter(|t| f.deployment.is_empty() || t.deployment == f.deployment)
            .filter(|t| state.is_none_or(|s| t.state == s))
            .filter(|t| f.conversation_key.is_empty() || t.conversation_key == f.conversation_key)
            .filter(|t| f.parent_task_id.is_empty() || t.parent_task_id == f.parent_task_id)
            .filter(|t| f.before_seq.is_none_or(|before| t.seq < before))
            .map(|t| (t.seq, t))
            .collect();
        matching.sort_by_key(|(seq, _)| std::cmp::Reverse(*seq));
        let mut tasks = Vec::new();
        let mut bytes = 0usize;
        for (_, t) in &matching {
            let summary = summarize(t);
            bytes += summary_size(&summary.task);
            if !tasks.is_empty() && bytes > MAX_PAGE_BYTES {
                break;
            }
            tasks.push(summary);
            if tasks.len() == page_size {
                break;
            }
        }
        let next_before_seq = (tasks.len() < matching.len())
            .then(|| tasks.last().map(|s| s.task.seq))
            .flatten();
        Ok(TaskPage {
            tasks,
            next_before_seq,
        })
    }

    /// Cancels a task: a queued one at once, a running one through its Nest (with a grace).
    pub async fn cancel_task(
        &self,
        namespace: &str,
        task_id: &str,
        reason: &str,
    ) -> Result<TaskRec> {
        let task = self.get_task(namespace, task_id)?;
        let reason = if reason.is_empty() {
            "cancelled by the user"
        } else {
            reason
        };
        let out = {
            let mut st = self.lock();
            if !st.tasks.contains_key(&task.task_id) {
                return Err(HubError::not_found(format!("task {task_id} not found")));
            }
            // Cancelling a task cancels its delegation subtree (call_agent/start_agent children).
            let mut todo = vec![(task.task_id.clone(), reason.to_string())];
            while let Some((id, why)) = todo.pop() {
                self.cancel_one(&mut st, &id, &why)?;
                let children: Vec<String> = st
                    .tasks
                    .values()
                    .filter(|t| t.parent_task_id == id && !t.state.is_terminal())
                    .map(|t| t.task_id.clone())
                    .collect();
                for child in children {
                    todo.push((child, format!("its parent task {id} was cancelled")));
                }
            }
            st.tasks.get(task_id).cloned().unwrap_or(task)
        };
        self.commit().await?;
        self.poke();
        Ok(out)
    }

    /// Cancels one task: a queued one at once, a running one through its Nest (with a grace).
    fn cancel_one(&self, st: &mut State, task_id: &str, reason: &str) -> Result<()> {
        let Some(mut task) = st.tasks.get(task_id).cloned() else {
            return Ok(());
        };
        match task.state {
            s if s.is_terminal() => {}
            TaskState::Queued => {
                self.finish_task(st, task, TaskState::Cancelled, "", "text", reason)?;
            }
            _ => {
                if task.cancel_requested_at_ms == 0 {
                    task.cancel_requested_at_ms = now_ms();
                    task.cancel_reason = reason.to_string();
                    task.activity = format!("cancelling: {reason}");
                    let nest_id = st
                        .instances
                        .get(&task.instance_id)
                        .map(|i| i.nest_id.clone())
                        .unwrap_or_default();
                    st.live.send(
                        &nest_id,
                        ToNest::CancelRun {
                            run_id: task.run_id.clone(),
                            instance_id: task.instance_id.clone(),
                            reason: reason.to_string(),
                        },
                    );
                    self.save_task(st, task)?;
                }
            }
        }
        Ok(())
    }

    fn finish_task(
        &self,
        st: &mut State,
        mut task: TaskRec,
        state: TaskState,
        result: &str,
        response_type: &str,
        error: &str,
    ) -> Result<()> {
        let now = now_ms();
        task.state = state;
        task.activity = String::new();
        task.finished_at_ms = now;
        task.outcome = Some(OutcomeRec {
            result: result.to_string(),
            response_type: if response_type.is_empty() {
                "text".into()
            } else {
                response_type.to_string()
            },
            error: error.to_string(),
        });
        tracing::info!(task = %task.task_id, state = state.as_str(), "task finished");
        self.emit_state(st, task)
    }

    /// Puts the running tasks of `instance_id` back in the queue (next attempt on dispatch).
    pub(crate) fn requeue_tasks_of(
        &self,
        st: &mut State,
        instance_id: &str,
        why: &str,
        cause: Requeue,
    ) -> Result<()> {
        let ids: Vec<String> = st
            .tasks
            .values()
            .filter(|t| {
                t.instance_id == instance_id
                    && !t.state.is_terminal()
                    && t.state != TaskState::Queued
            })
            .map(|t| t.task_id.clone())
            .collect();
        for id in ids {
            if let Some(task) = st.tasks.get(&id).cloned() {
                self.requeue_task(st, task, why, cause)?;
            }
        }
        Ok(())
    }

    /// Puts one interrupted run back in the queue: the next dispatch re-runs it with the same
    /// run id, the next attempt and the earlier events to replay, on its bundle digest. When
    /// its own instance failed it (`Requeue::InstanceFailed`) the failure is counted, the retry
    /// backs off and avoids that instance, and a task with `limits.maxAttempts` (bundle
    /// `x-agen/harness.json`, default 5) such failures fails instead (no endless crash loop); one being cancelled ends cancelled.
    pub(crate) fn requeue_task(
        &self,
        st: &mut State,
        mut task: TaskRec,
        why: &str,
        cause: Requeue,
    ) -> Result<()> {
        if task.cancel_requested_at_ms > 0 {
            let reason = task.cancel_reason.clone();
            return self.finish_task(st, task, TaskState::Cancelled, "", "text", &reason);
        }
        let now = now_ms();
        if cause == Requeue::InstanceFailed {
            task.lease.failures += 1;
            task.lease.avoid_instance = task.lease.instance_id.clone();
            task.lease.not_before_ms = now + leases::retry_backoff_ms(task.lease.failures);
            let max = if task.bundle_digest.is_empty() {
                leases::DEFAULT_MAX_ATTEMPTS
            } else {
                self.max_attempts(&task.bundle_digest)
            };
            if task.lease.failures >= max {
                let error = format!(
                    "the run's instance failed {} times (last: {why}); giving up after {max} failed attempts: look at the Nest's log for the instance (journalctl -u agen-nest) and submit the task again",
                    task.lease.failures
                );
                tracing::warn!(task = %task.task_id, "{error}");
                return self.finish_task(st, task, TaskState::Failed, &error, "error", &error);
            }
        }
        tracing::warn!(task = %task.task_id, attempt = task.attempt, failures = task.lease.failures, "re-queueing task: {why}");
        task.state = TaskState::Queued;
        task.instance_id.clear();
        task.nest_name.clear();
        task.lease.started = false;
        task.lease.missing_since_ms = 0;
        task.lease.revoked = true;
        task.activity = format!("re-queued: {why}");
        self.emit_state(st, task)
    }

    pub(crate) fn fail_tasks_of_deployment(
        &self,
        st: &mut State,
        namespace: &str,
        name: &str,
    ) -> Result<()> {
        let ids: Vec<String> = st
            .tasks
            .values()
            .filter(|t| {
                t.namespace == namespace && t.deployment == name && t.state == TaskState::Queued
            })
            .map(|t| t.task_id.clone())
            .collect();
        for id in ids {
            if let Some(task) = st.tasks.get(&id).cloned() {
                self.finish_task(
                    st,
                    task,
                    TaskState::Failed,
                    "",
                    "error",
                    "deployment deleted before the task ran",
                )?;
            }
        }
        Ok(())
    }

    /// Dispatches queued tasks to instances with a free slot; expires cancel graces.
    pub(crate) fn dispatch_tasks(&self, st: &mut State, now: i64) -> Result<()> {
        self.expire_unstarted(st, now)?;
        // Running tasks whose cancel grace ran out are cancelled without their run.
        let expired: Vec<String> = st
            .tasks
            .values()
            .filter(|t| !t.state.is_terminal() && t.cancel_requested_at_ms > 0)
            .filter(|t| now - t.cancel_requested_at_ms > CANCEL_GRACE_MS)
            .map(|t| t.task_id.clone())
            .collect();
        for id in expired {
            if let Some(task) = st.tasks.get(&id).cloned() {
                let reason = task.cancel_reason.clone();
                self.finish_task(st, task, TaskState::Cancelled, "", "text", &reason)?;
            }
        }

        let mut active: HashMap<String, u32> = HashMap::new();
        for t in st.tasks.values() {
            if matches!(t.state, TaskState::Running | TaskState::Waiting)
                && !t.instance_id.is_empty()
            {
                *active.entry(t.instance_id.clone()).or_default() += 1;
            }
        }
        let mut order: Vec<(u64, String)> = st
            .tasks
            .values()
            .filter(|t| !t.state.is_terminal())
            .map(|t| (t.seq, t.task_id.clone()))
            .collect();
        order.sort();
        let mut busy_conversations: HashSet<String> = HashSet::new();
        for (_, id) in order {
            let Some(task) = st.tasks.get(&id).cloned() else {
                continue;
            };
            let first_of_conversation = busy_conversations.insert(task.conversation_id.clone());
            if task.state != TaskState::Queued || !first_of_conversation {
                continue;
            }
            if task.lease.not_before_ms > now {
                continue;
            }
            let key = deployment_key(&task.namespace, &task.deployment);
            let Some(d) = st.deployments.get(&key).cloned() else {
                self.finish_task(
                    st,
                    task,
                    TaskState::Failed,
                    "",
                    "error",
                    "deployment deleted before the task ran",
                )?;
                continue;
            };
            // A resumed run stays on the bundle version it started on: it waits for an
            // instance of that digest, and fails when the deployment has moved on and none
            // is left (a rollover finished while the run was interrupted).
            let pinned = (!task.bundle_digest.is_empty()).then(|| task.bundle_digest.clone());
            if let Some(digest) = &pinned {
                let any_left = st.instances.values().any(|i| {
                    i.namespace == d.namespace
                        && i.deployment == d.name
                        && &i.bundle_digest == digest
                        && !matches!(i.state, InstanceState::Lost | InstanceState::Stopping)
                });
                if !any_left && &d.bundle_digest != digest {
                    let error = format!(
                        "the run started on bundle {digest}, which no instance of deployment {} runs any more (it was redeployed as {}); a run resumes only on its own version: submit the task again",
                        d.name, d.bundle_digest
                    );
                    self.finish_task(st, task, TaskState::Failed, &error, "error", &error)?;
                    continue;
                }
            }
            // A new run goes to an instance of the deployed version when there is one, so
            // instances of a version being rolled over drain.
            let current_ready = st.instances.values().any(|i| {
                i.namespace == d.namespace
                    && i.deployment == d.name
                    && i.bundle_digest == d.bundle_digest
                    && i.state == InstanceState::Running
                    && i.healthy
            });
            let candidates: Vec<&InstanceRec> = st
                .instances
                .values()
                .filter(|i| i.namespace == d.namespace && i.deployment == d.name)
                .filter(|i| match &pinned {
                    Some(p) => &i.bundle_digest == p,
                    None => !current_ready || i.bundle_digest == d.bundle_digest,
                })
                .filter(|i| {
                    i.state == InstanceState::Running
                        && i.healthy
                        && st.live.is_connected(&i.nest_id)
                })
                .filter(|i| active.get(&i.instance_id).copied().unwrap_or(0) < d.concurrency)
                .collect();
            // A retry goes to another instance than the one that just failed it, if any.
            let avoid = &task.lease.avoid_instance;
            let others = candidates.iter().any(|i| &i.instance_id != avoid);
            let candidate = candidates
                .into_iter()
                .filter(|i| !others || &i.instance_id != avoid)
                .min_by_key(|i| {
                    (
                        i.generation != d.generation,
                        active.get(&i.instance_id).copied().unwrap_or(0),
                        i.instance_id.clone(),
                    )
                })
                .cloned();
            let Some(inst) = candidate else { continue };
            *active.entry(inst.instance_id.clone()).or_default() += 1;
            self.assign(st, task, &inst, now)?;
        }
        Ok(())
    }

    fn assign(
        &self,
        st: &mut State,
        mut task: TaskRec,
        inst: &InstanceRec,
        now: i64,
    ) -> Result<()> {
        if task.run_id.is_empty() {
            task.run_id = format!("run-{}", uuid::Uuid::now_v7().simple());
        }
        // Attempts are the task's, never reused: the fence of the run moves with them.
        task.attempt += 1;
        self.db.set_run_attempt(&task.run_id, task.attempt)?;
        task.lease.nest_id = inst.nest_id.clone();
        task.lease.instance_id = inst.instance_id.clone();
        task.lease.assigned_at_ms = now;
        task.lease.started = false;
        task.lease.missing_since_ms = 0;
        task.lease.revoked = false;
        let history: ConversationRec = self
            .db
            .get_json(Table::Conversations, &task.conversation_id)?
            .unwrap_or_default();
        let replay_json = if task.attempt > 1 {
            let events: Vec<Value> = self
                .db
                .run_events(&task.run_id)?
                .into_iter()
                .filter(|e| e.attempt < task.attempt)
                .map(|e| {
                    serde_json::json!({"attempt": e.attempt, "seq": e.seq, "at_ms": e.at_ms, "kind": e.kind,
                        "json": serde_json::from_str::<Value>(&e.json).unwrap_or(Value::String(e.json.clone()))})
                })
                .collect();
            Value::Array(events).to_string()
        } else {
            String::new()
        };
        task.state = TaskState::Running;
        task.instance_id = inst.instance_id.clone();
        task.nest_name = inst.nest_name.clone();
        task.bundle_digest = inst.bundle_digest.clone();
        if task.started_at_ms == 0 {
            task.started_at_ms = now;
        }
        task.activity = format!("starting on instance {}", inst.instance_id);
        let assignment = RunAssignment {
            run_id: task.run_id.clone(),
            attempt: task.attempt,
            task_id: task.task_id.clone(),
            instance_id: inst.instance_id.clone(),
            namespace: task.namespace.clone(),
            deployment: task.deployment.clone(),
            input: task.input.clone(),
            labels: task.labels.clone(),
            conversation_id: task.conversation_id.clone(),
            conversation_key: task.conversation_key.clone(),
            root_run_id: if task.root_run_id.is_empty() {
                task.run_id.clone()
            } else {
                task.root_run_id.clone()
            },
            delegation_depth: task.delegation_depth,
            trace_id: crate::trace::trace_id(&task),
            bundle_digest: inst.bundle_digest.clone(),
            history_json: Value::Array(history.messages).to_string(),
            replay_json,
            tool_overrides: task.tool_overrides.clone(),
        };
        tracing::info!(task = %task.task_id, run = %task.run_id, attempt = task.attempt, instance = %inst.instance_id, "dispatching run");
        // Held until the flush that makes this lease durable (`Core::commit`).
        st.live
            .send_durable(&inst.nest_id, ToNest::AssignRun(Box::new(assignment)));
        self.emit_state(st, task)
    }

    /// Stores a batch of run events that `nest_id` relayed from `instance_id`
    /// (append-if-absent, fenced), updates tasks, flushes once, and returns the
    /// acknowledgements to send back (one per run attempt). An event not from the lease's Nest
    /// and instance, for its run and attempt, is refused: never stored, it moves nothing, and
    /// its ack says `fenced` so that the sender stops.
    pub async fn run_events(
        &self,
        nest_id: &str,
        instance_id: &str,
        events: Vec<IncomingRunEvent>,
    ) -> Result<Vec<ToNest>> {
        let mut acks: BTreeMap<(String, u32), (u64, bool)> = BTreeMap::new();
        {
            let mut st = self.lock();
            let mut refused: Option<(usize, String)> = None;
            for e in events {
                if let Err(why) = leases::owner_check(&st, nest_id, instance_id, &e) {
                    acks.entry((e.run_id.clone(), e.attempt))
                        .or_insert((0, false))
                        .1 = true;
                    let r = refused.get_or_insert((0, why));
                    r.0 += 1;
                    continue;
                }
                let rec = RunEventRec {
                    run_id: e.run_id.clone(),
                    attempt: e.attempt,
                    seq: e.seq,
                    task_id: e.task_id.clone(),
                    at_ms: if e.at_ms == 0 { now_ms() } else { e.at_ms },
                    kind: e.kind.clone(),
                    json: e.json.clone(),
                };
                let outcome = self.db.append_run_event(&rec)?;
                let entry = acks
                    .entry((e.run_id.clone(), e.attempt))
                    .or_insert((0, false));
                match outcome {
                    Append::Fenced => entry.1 = true,
                    Append::Duplicate => entry.0 = entry.0.max(e.seq),
                    Append::Appended => {
                        entry.0 = entry.0.max(e.seq);
                        self.apply_run_event(&mut st, &rec)?;
                    }
                }
            }
            if let Some((n, why)) = refused {
                tracing::warn!(
                    nest_id,
                    instance = instance_id,
                    refused = n,
                    "run events refused: {why}"
                );
            }
        }
        self.commit().await?;
        self.poke();
        Ok(acks
            .into_iter()
            .map(|((run_id, attempt), (acked_seq, fenced))| ToNest::Ack {
                run_id,
                attempt,
                acked_seq,
                fenced,
            })
            .collect())
    }

    fn apply_run_event(&self, st: &mut State, e: &RunEventRec) -> Result<()> {
        let Some(task) = st.tasks.get(&e.task_id).cloned() else {
            return Ok(());
        };
        // A queued task's run was interrupted: late events of that attempt are kept in the log
        // (the next attempt replays them) but no longer move the task.
        if task.run_id != e.run_id
            || task.attempt != e.attempt
            || task.state.is_terminal()
            || task.state == TaskState::Queued
        {
            return Ok(());
        }
        let mut task = task;
        task.lease.started = true;
        task.lease.missing_since_ms = 0;
        let body = RunEventBody::from_wire(&e.kind, &e.json);
        match &body {
            Ok(RunEventBody::Activity(a)) => task.activity = a.activity.clone(),
            Ok(RunEventBody::ModelRequested(_)) => task.activity = "waiting for the model".into(),
            Ok(RunEventBody::ModelAnswered(_)) => task.activity = "thinking".into(),
            Ok(RunEventBody::ToolStarted(t)) => task.activity = format!("calling {}", t.tool),
            Ok(RunEventBody::ApprovalRequested(asked)) => {
                self.approval_requested(st, &mut task, asked)?
            }
            Ok(RunEventBody::ApprovalDecided(d)) => self.approval_decided(&mut task, d)?,
            Ok(RunEventBody::TaskProgress(p)) => {
                task.progress = Some(ProgressRec {
                    step: p.step.clone(),
                    done: p.done,
                    total: p.total,
                    note: p.note.clone().unwrap_or_default(),
                    artifacts: p.artifacts.clone(),
                    updated_at_ms: e.at_ms,
                });
            }
            Ok(RunEventBody::RunInterrupted(interrupted)) => {
                // The instance cannot finish the run: resume it elsewhere (or on its restart).
                // When the instance itself failed it is marked unhealthy first, so that the
                // retry does not go back to it before it says it is well again.
                let cause = leases::requeue_cause(interrupted);
                if cause == Requeue::InstanceFailed {
                    self.instance_failed(st, &task.lease.instance_id, &interrupted.reason)?;
                }
                self.emit(st, task.clone(), &e.kind, e.json.clone())?;
                let task = st.tasks.get(&task.task_id).cloned().unwrap_or(task);
                let why = if interrupted.reason.is_empty() {
                    "the instance process died"
                } else {
                    interrupted.reason.as_str()
                };
                return self.requeue_task(st, task, why, cause);
            }
            Ok(RunEventBody::RunFinished(f)) => {
                // The run event itself first, then the terminal state.
                self.emit(st, task.clone(), &e.kind, e.json.clone())?;
                let task = st.tasks.get(&task.task_id).cloned().unwrap_or(task);
                let state = match (f.state, task.cancel_requested_at_ms > 0) {
                    (RunState::Cancelled, _) | (_, true) => TaskState::Cancelled,
                    (RunState::Succeeded, false) => TaskState::Succeeded,
                    (RunState::Failed, false) => TaskState::Failed,
                };
                let error = if state == TaskState::Cancelled {
                    task.cancel_reason.clone()
                } else {
                    String::new()
                };
                if !f.messages.is_empty() && !task.conversation_id.is_empty() {
                    let mut conv: ConversationRec = self
                        .db
                        .get_json(Table::Conversations, &task.conversation_id)?
                        .unwrap_or_default();
                    for m in &f.messages {
                        conv.messages.push(
                            serde_json::to_value(m)
                                .map_err(|e| HubError::Internal(e.to_string()))?,
                        );
                    }
                    self.db
                        .put_json(Table::Conversations, &task.conversation_id, &conv)?;
                }
                let response_type = f.response_type.as_str();
                return self.finish_task(st, task, state, &f.result, response_type, &error);
            }
            Err(wrong) if e.kind == kind::RUN_FINISHED => {
                // The owner's last word cannot be read: the run is over all the same.
                self.emit(st, task.clone(), &e.kind, e.json.clone())?;
                let task = st.tasks.get(&task.task_id).cloned().unwrap_or(task);
                let error = format!("the run's run.finished event could not be read: {wrong}");
                return self.finish_task(st, task, TaskState::Failed, &error, "error", &error);
            }
            _ => {}
        }
        self.emit(st, task, &e.kind, e.json.clone())
    }

    /// Stored events of a task with seq >= `from_seq`.
    pub fn task_events(&self, task_id: &str, from_seq: u64) -> Result<Vec<TaskEventRec>> {
        let mut prefix = task_id.as_bytes().to_vec();
        prefix.push(0);
        let all: Vec<TaskEventRec> = self.db.list_json(Table::TaskEvents, &prefix)?;
        Ok(all.into_iter().filter(|e| e.seq >= from_seq).collect())
    }

    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<TaskUpdate> {
        self.updates.subscribe()
    }

    /// The spans of a task's run: one per model turn and one per tool call.
    pub fn trace(&self, namespace: &str, task_id: &str) -> Result<(TaskRec, Vec<SpanRec>)> {
        let task = self.get_task(namespace, task_id)?;
        let events = if task.run_id.is_empty() {
            Vec::new()
        } else {
            self.db.run_events(&task.run_id)?
        };
        let mut spans = build_spans(&task, &events);
        // The delegation subtree: each child's spans under its call_agent span.
        let mut todo = vec![task.task_id.clone()];
        let mut seen = std::collections::HashSet::new();
        while let Some(parent) = todo.pop() {
            if !seen.insert(parent.clone()) {
                continue;
            }
            let children: Vec<TaskRec> = {
                let st = self.lock();
                st.tasks
                    .values()
                    .filter(|t| t.parent_task_id == parent)
                    .cloned()
                    .collect()
            };
            for child in children {
                let events = if child.run_id.is_empty() {
                    Vec::new()
                } else {
                    self.db.run_events(&child.run_id)?
                };
                let mut child_spans = build_spans(&child, &events);
                if let Some(root) = child_spans.first_mut() {
                    root.parent_span_id = child.parent_span_id.clone();
                }
                spans.extend(child_spans);
                todo.push(child.task_id);
            }
        }
        Ok((task.clone(), spans))
    }
}
