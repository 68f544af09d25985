//! Run leases: which Nest, instance, run id and attempt may run a task now (`LeaseRec` on the
//! task, durable before `AssignRun` leaves the Hub), checked for every run event, reconciled
//! with what each Nest reports its instances run, and expired when a run does not start.
//!
//! Invariants: an event is believed only from the lease's Nest (by certificate) and instance,
//! for the task's current run id and attempt, while the lease stands (a task that goes back to
//! the queue revokes it at once), and never for an unknown task; reconciliation
//! cancels at once a run a Nest executes that is not the lease (another instance, an older
//! attempt, a finished or re-queued task), and re-dispatches, after a short grace and without
//! counting it as a failure, a leased run its Nest does not hold; a run the Hub has not heard
//! from within `--run-start-deadline` is re-dispatched and counted as its instance failing.

use std::collections::HashMap;

use agen_contract::run::RunInterrupted;

use crate::core::tasks::IncomingRunEvent;
use crate::core::{Core, State};
use crate::error::Result;
use crate::model::*;
use crate::nodes::ToNest;

/// Attempts a run may lose to its own instance failing before the task fails
/// (`limits.maxAttempts`).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// How long a leased run may be missing from its Nest's reports before it is re-dispatched
/// (an `AssignRun` may still be on its way when a report is taken).
pub const RECONCILE_GRACE_MS: i64 = 2_000;

/// Why a run goes back to the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// Its own instance failed it (process or tool-server death, start deadline): counted
    /// against `maxAttempts`, backs off, and avoids that instance.
    InstanceFailed,
    /// Anything else (a stop the Hub asked for, a Nest fencing itself, reconciliation).
    NotCounted,
}

/// The back-off before the retry of a run whose instance failed it `failures` times.
pub fn retry_backoff_ms(failures: u32) -> i64 {
    (250_i64 << failures.min(6)).min(5_000)
}

/// How an interrupted run counts: `instance_died` (or no cause: an older Nest, which sent
/// `run.interrupted` only when the instance died or was stopped) is the instance's failure;
/// `instance_stopped`, `not_here`, `nest_fenced` and the rest are not.
pub fn requeue_cause(i: &RunInterrupted) -> Requeue {
    match i.cause.as_str() {
        "instance_died" | "" => Requeue::InstanceFailed,
        _ => Requeue::NotCounted,
    }
}

/// Whether the event may be stored: it must come from the lease's Nest and instance, for the
/// task's run id and current attempt. Says why not.
pub(crate) fn owner_check(
    st: &State,
    nest_id: &str,
    instance_id: &str,
    e: &IncomingRunEvent,
) -> std::result::Result<(), String> {
    let Some(task) = st.tasks.get(&e.task_id) else {
        return Err(format!(
            "task `{}` of run `{}` is unknown to the hub",
            e.task_id, e.run_id
        ));
    };
    if task.run_id != e.run_id || task.run_id.is_empty() {
        return Err(format!(
            "run `{}` is not the run of task {}",
            e.run_id, task.task_id
        ));
    }
    if e.attempt != task.attempt {
        return Err(format!(
            "attempt {} of run {} is not the one the hub issued ({})",
            e.attempt, e.run_id, task.attempt
        ));
    }
    if task.lease.revoked {
        return Err(format!(
            "attempt {} of run {} was revoked: the task went back to the queue",
            e.attempt, e.run_id
        ));
    }
    if task.lease.nest_id != nest_id || task.lease.instance_id != instance_id {
        return Err(format!(
            "run {} attempt {} was assigned to instance {} on nest {}, not to instance {instance_id} on nest {nest_id}",
            e.run_id, e.attempt, task.lease.instance_id, task.lease.nest_id
        ));
    }
    Ok(())
}

/// Whether the task's lease names a run that should be executing (a suspended run's attempt
/// is over: it gave its slot back).
fn leased(t: &TaskRec) -> bool {
    matches!(t.state, TaskState::Running | TaskState::Waiting) && t.suspended.is_none()
}

impl Core {
    /// Compares what `nest_id` reports its instances run with the leases of the Hub.
    pub(crate) fn reconcile_runs(
        &self,
        st: &mut State,
        nest_id: &str,
        reports: &[InstanceReport],
        now: i64,
    ) -> Result<()> {
        let held: HashMap<&str, (&str, u32)> = reports
            .iter()
            .flat_map(|r| {
                r.runs
                    .iter()
                    .map(move |(run, attempt)| (run.as_str(), (r.instance_id.as_str(), *attempt)))
            })
            .collect();
        // Runs executing here that are not the lease: cancelled at once (their events are
        // refused anyway).
        if !held.is_empty() {
            let by_run: HashMap<&str, &TaskRec> = st
                .tasks
                .live()
                .filter(|t| held.contains_key(t.run_id.as_str()))
                .map(|t| (t.run_id.as_str(), t))
                .collect();
            let mut cancel = Vec::new();
            for (run, (instance, attempt)) in &held {
                let task = by_run.get(run);
                let ok = task.is_some_and(|t| {
                    leased(t)
                        && t.attempt == *attempt
                        && t.lease.instance_id == *instance
                        && t.lease.nest_id == nest_id
                });
                if !ok {
                    // A report written before this very attempt ended (its end crossed the
                    // report on the way) is no news: cancelled all the same, quietly.
                    let just_ended = task.is_some_and(|t| {
                        t.state.is_terminal() && t.attempt == *attempt && t.instance_id == *instance
                    });
                    cancel.push((run.to_string(), instance.to_string(), *attempt, just_ended));
                }
            }
            for (run_id, instance_id, attempt, just_ended) in cancel {
                if just_ended {
                    tracing::debug!(nest_id, run = %run_id, attempt, instance = %instance_id, "a report still lists a run that has ended: cancelling it");
                } else {
                    tracing::warn!(nest_id, run = %run_id, attempt, instance = %instance_id, "cancelling a run the hub did not assign to this instance");
                }
                st.live.send(
                    nest_id,
                    ToNest::CancelRun {
                        run_id,
                        instance_id,
                        reason: "reconciliation: the hub did not assign this run (or this attempt) to this instance".into(),
                        interrupt: false,
                    },
                );
            }
        }
        // Leased runs this Nest does not hold: re-dispatched after a grace.
        let mine: Vec<String> = st
            .tasks
            .live()
            .filter(|t| leased(t) && t.lease.nest_id == nest_id)
            .map(|t| t.task_id.clone())
            .collect();
        for id in mine {
            let Some(mut task) = st.tasks.get(&id).cloned() else {
                continue;
            };
            let holds = held
                .get(task.run_id.as_str())
                .is_some_and(|(i, a)| *i == task.lease.instance_id.as_str() && *a == task.attempt);
            if holds {
                if task.lease.missing_since_ms != 0 {
                    task.lease.missing_since_ms = 0;
                    self.db
                        .put_json(crate::store::Table::Tasks, &task.task_id, &task)?;
                    st.tasks.insert(task);
                }
                continue;
            }
            if now - task.lease.assigned_at_ms < RECONCILE_GRACE_MS {
                continue;
            }
            if task.lease.missing_since_ms == 0 {
                task.lease.missing_since_ms = now;
                self.db
                    .put_json(crate::store::Table::Tasks, &task.task_id, &task)?;
                st.tasks.insert(task);
                continue;
            }
            if now - task.lease.missing_since_ms >= RECONCILE_GRACE_MS {
                let why = format!(
                    "reconciliation: instance {} on nest {} does not hold attempt {} of run {}",
                    task.lease.instance_id, nest_id, task.attempt, task.run_id
                );
                self.requeue_task(st, task, &why, Requeue::NotCounted)?;
            }
        }
        Ok(())
    }

    /// Re-dispatches runs the Hub has not heard from within the run start deadline.
    pub(crate) fn expire_unstarted(&self, st: &mut State, now: i64) -> Result<()> {
        let deadline = self.opts.run_start_deadline.as_millis() as i64;
        let late: Vec<String> = st
            .tasks
            .live()
            .filter(|t| t.state == TaskState::Running && !t.lease.started)
            .filter(|t| t.lease.assigned_at_ms > 0 && now - t.lease.assigned_at_ms > deadline)
            .map(|t| t.task_id.clone())
            .collect();
        for id in late {
            if let Some(task) = st.tasks.get(&id).cloned() {
                let why = format!(
                    "attempt {} did not start within {}s on instance {}",
                    task.attempt,
                    deadline / 1000,
                    task.lease.instance_id
                );
                self.requeue_task(st, task, &why, Requeue::InstanceFailed)?;
            }
        }
        Ok(())
    }

    /// Marks an instance that failed a run unhealthy until its Nest reports it well again,
    /// so that no retry is dispatched to it meanwhile.
    pub(crate) fn instance_failed(
        &self,
        st: &mut State,
        instance_id: &str,
        why: &str,
    ) -> Result<()> {
        let Some(mut rec) = st.instances.get(instance_id).cloned() else {
            return Ok(());
        };
        if !rec.healthy && rec.state != InstanceState::Running {
            return Ok(());
        }
        rec.healthy = false;
        rec.healthy_since_ms = 0;
        if rec.state == InstanceState::Running {
            rec.state = InstanceState::Starting;
        }
        if !why.is_empty() {
            rec.message = why.to_string();
        }
        rec.updated_at_ms = now_ms();
        self.save_instance(st, rec)
    }
}
