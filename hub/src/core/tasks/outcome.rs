//! How a task ends or starts over: cancel (with a grace for its run), finish, requeue after a
//! lost run, fail every task of a removed deployment, fail the tasks whose history the store
//! lost (`agen hub repair`).

use crate::core::leases;
use crate::core::leases::Requeue;
use crate::core::{Core, State};
use crate::error::{HubError, Result};
use crate::nodes::ToNest;

use super::*;

/// How long a cancelled running task waits for its run to finish before it is cancelled anyway.
pub(in crate::core) const CANCEL_GRACE_MS: i64 = 5_000;

impl Core {
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
            self.cancel_tree(&mut st, &task.task_id, reason)?;
            st.tasks.get(task_id).cloned().unwrap_or(task)
        };
        self.commit().await?;
        self.poke();
        Ok(out)
    }

    /// Cancels a task and its delegation subtree (call_agent/start_agent children).
    pub(in crate::core) fn cancel_tree(
        &self,
        st: &mut State,
        task_id: &str,
        reason: &str,
    ) -> Result<()> {
        let mut todo = vec![(task_id.to_string(), reason.to_string())];
        while let Some((id, why)) = todo.pop() {
            self.cancel_one(st, &id, &why)?;
            let children: Vec<String> = st
                .tasks
                .children_of(&id, None)
                .filter(|t| !t.state.is_terminal())
                .map(|t| t.task_id.clone())
                .collect();
            for child in children {
                todo.push((child, format!("its parent task {id} was cancelled")));
            }
        }
        Ok(())
    }

    /// Cancels one task: a queued one at once, a running one through its Nest (with a grace).
    pub(in crate::core) fn cancel_one(
        &self,
        st: &mut State,
        task_id: &str,
        reason: &str,
    ) -> Result<()> {
        let Some(mut task) = st.tasks.get(task_id).cloned() else {
            return Ok(());
        };
        match task.state {
            s if s.is_terminal() => {}
            // Queued, or suspended (no run to stop): cancelled at once.
            _ if task.state == TaskState::Queued || task.suspended.is_some() => {
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
                            interrupt: false,
                        },
                    );
                    self.save_task(st, task)?;
                }
            }
        }
        Ok(())
    }

    pub(in crate::core) fn finish_task(
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
        task.suspended = None;
        tracing::info!(task = %task.task_id, state = state.as_str(), "task finished");
        self.emit_state(st, task.clone())?;
        self.wake_waiting_parent(st, &task)
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
            return self.finish_cancelled(st, task);
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

    /// Ends each task of `ids` `failed` with reason `history_lost` (`agen hub repair`: the
    /// store lost part of its history, so it is never resumed from a partial replay). A task
    /// that had ended keeps its result, but is failed too: its record no longer says all that
    /// happened. Its run's next attempt is fenced, so a Nest still running it is stopped.
    /// Returns the ids it ended (those the store knows).
    pub async fn fail_history_lost(
        &self,
        ids: &std::collections::BTreeSet<String>,
        why: &str,
    ) -> Result<Vec<String>> {
        let mut ended = Vec::new();
        {
            let mut st = self.lock();
            for id in ids {
                let Some(mut task) = st.tasks.get(id).cloned() else {
                    continue;
                };
                let error = format!("{}: {why}", crate::store::integrity::HISTORY_LOST);
                if !task.run_id.is_empty() {
                    self.db.set_run_attempt(&task.run_id, task.attempt + 1)?;
                }
                if task.state.is_terminal() {
                    let result = task.outcome.as_ref().map(|o| o.result.clone());
                    task.state = TaskState::Failed;
                    task.outcome = Some(OutcomeRec {
                        result: result.unwrap_or_default(),
                        response_type: "error".into(),
                        error,
                    });
                    self.emit_state(&mut st, task)?;
                } else {
                    self.finish_task(&mut st, task, TaskState::Failed, "", "error", &error)?;
                }
                ended.push(id.clone());
            }
        }
        self.commit().await?;
        Ok(ended)
    }
}
