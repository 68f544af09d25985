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
//!
//! Modules: [`submit`], [`dispatch`], [`events`] (run events from Nests), `hot` (their hot path,
//! one store write per batch), [`outcome`] (cancel,
//! finish, requeue), [`query`] (get, list, watch, trace).

use std::collections::BTreeMap;

use crate::core::{Core, State};
use crate::error::{HubError, Result};
use crate::store::{task_event_key, Table};

use crate::model::*;

pub mod dispatch;
pub mod double_texting;
pub mod events;
mod hot;
pub mod outcome;
pub mod query;
pub mod seed;
pub mod submit;
pub mod watchers;

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
    /// The submit's timeout and token budget (0: the bundle's default, or none).
    pub budget: SpecBudget,
    /// URLs told of the task's end (`core/webhooks.rs`), checked by `Core::submit_webhooks`.
    pub webhooks: Vec<crate::core::webhooks::WebhookTarget>,
    /// What the submit does to its conversation's tasks in flight (`None`: the bundle's).
    pub double_texting: Option<agen_shared::bundle::DoubleTexting>,
    /// The submit's own output schema (JSON text checked at the edge; empty: the bundle's).
    pub output_schema: String,
}

/// A submit's own timeout and token budget (`SubmitTaskRequest.timeout_ms`, `max_tokens`); 0
/// takes the bundle's `limits.taskTimeout` / `limits.maxTokens`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpecBudget {
    pub timeout_ms: u64,
    pub max_tokens: u64,
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
    /// Only tasks with this label key (empty: any), and this value when it is not empty.
    pub label_key: String,
    pub label_value: String,
    /// Only tasks submitted at or after this time (unix ms; 0: no bound).
    pub created_after_ms: i64,
    /// Only tasks submitted before this time (unix ms; 0: no bound).
    pub created_before_ms: i64,
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
    /// How many tasks match the filter in all.
    pub total: u64,
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
    /// The sender waits for this event's ack (a ledger point): it is flushed at once.
    pub sync: bool,
}

impl Core {
    pub(in crate::core) fn save_task(&self, st: &mut State, task: TaskRec) -> Result<()> {
        self.db.put_json(Table::Tasks, &task.task_id, &task)?;
        st.tasks.insert(task);
        Ok(())
    }

    /// Appends a task event, saves the task and tells watchers.
    pub(in crate::core) fn emit(
        &self,
        st: &mut State,
        mut task: TaskRec,
        kind: &str,
        json: String,
    ) -> Result<()> {
        let now = now_ms();
        task.next_event_seq = task.next_event_seq.max(1);
        task.updated_at_ms = now;
        let event = TaskEventRec {
            seq: task.next_event_seq,
            at_ms: now,
            kind: kind.to_string(),
            json,
            snapshot: Some(TaskSnapshot::of(&task)),
            source: None,
        };
        task.next_event_seq += 1;
        task.last_event_source = None;
        let bytes = serde_json::to_vec(&event).map_err(|e| HubError::Internal(e.to_string()))?;
        self.db.raw().put(
            Table::TaskEvents,
            &task_event_key(&task.task_id, event.seq),
            &bytes,
        )?;
        self.save_task(st, task.clone())?;
        self.publish(std::sync::Arc::new(TaskUpdate {
            body: None,
            task_id: task.task_id.clone(),
            event,
            task,
        }));
        Ok(())
    }

    pub(in crate::core) fn emit_state(&self, st: &mut State, task: TaskRec) -> Result<()> {
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
}
