//! Suspended runs: a run that waits for a person's decision (`ask`) or for a child task
//! (`call_agent`) gives its instance slot back. Its attempt ends with `run.suspended`; the task
//! is `waiting` and holds no instance; once what it waits for is there (the call is decided,
//! the child ended) or the wait's deadline passes, the task goes back to the queue and its next
//! attempt resumes the run from its log (replayed through `FetchRunContext`), on an instance
//! of the bundle version it started on. A wait whose deadline passes resumes the run too: the
//! harness finds the deadline in its log (`run.suspended`) and ends the wait as it would have
//! in place.
//!
//! Invariants: a suspension is stored with the task before the event is acknowledged, so a
//! Hub restart keeps it; a wait never outlives its first deadline (a resumed attempt that
//! waits again keeps the earliest one, [`TaskRec::wait_deadlines`]); a resume is not an
//! instance failure (it never counts toward `limits.maxAttempts`); what is already there when
//! the suspension arrives wakes the task at once (no lost wake-up); a cancelled suspended task
//! ends at once (it has no run to stop).

use agen_contract::run::{RunSuspended, WaitingFor};

use crate::core::{Core, State};
use crate::error::Result;
use crate::model::{now_ms, SuspensionRec, TaskRec, TaskState};

impl Core {
    /// The owner's `run.suspended` (already stored as a run event): the task waits without a
    /// slot, or goes on at once when what it waits for is already there.
    pub(in crate::core) fn suspend_run(
        &self,
        st: &mut State,
        mut task: TaskRec,
        s: &RunSuspended,
    ) -> Result<()> {
        let key = s.waiting_for.call_id().to_string();
        let deadline_ms = match task.wait_deadlines.get(&key) {
            Some(&first) => first.min(s.deadline_ms),
            None => s.deadline_ms,
        };
        task.wait_deadlines.insert(key, deadline_ms);
        task.suspended = Some(SuspensionRec {
            waiting_for: s.waiting_for.clone(),
            deadline_ms,
            on_deadline: s.on_deadline.clone(),
            attempt: task.attempt,
            since_ms: now_ms(),
        });
        task.state = TaskState::Waiting;
        task.instance_id.clear();
        task.nest_name.clear();
        task.lease.started = false;
        task.lease.missing_since_ms = 0;
        // The attempt is over: nothing more of it is believed.
        task.lease.revoked = true;
        task.activity = match &s.waiting_for {
            WaitingFor::Approval { tool, .. } => {
                format!("waiting for approval of {tool} (the run gave its slot back)")
            }
            WaitingFor::Child { task_id, .. } => {
                format!("waiting for task {task_id} (the run gave its slot back)")
            }
        };
        tracing::info!(task = %task.task_id, run = %task.run_id, attempt = task.attempt, "run suspended: {}", task.activity);
        if task.cancel_requested_at_ms > 0 {
            return self.finish_cancelled(st, task);
        }
        let ready = self.wait_is_over(st, &task)?;
        self.emit_state(st, task.clone())?;
        if let Some(why) = ready {
            self.wake(st, &task.task_id, &why)?;
        }
        Ok(())
    }

    /// Why a suspended task may go on now, if it may: its call is decided, its child ended.
    fn wait_is_over(&self, st: &State, task: &TaskRec) -> Result<Option<String>> {
        let Some(s) = &task.suspended else {
            return Ok(None);
        };
        Ok(match &s.waiting_for {
            WaitingFor::Approval { call_id, .. } => self
                .decision_of(&task.task_id, call_id)?
                .map(|_| format!("call {call_id} was decided")),
            WaitingFor::Child { task_id, .. } => st
                .tasks
                .get(task_id)
                .is_none_or(|c| c.state.is_terminal())
                .then(|| format!("task {task_id} ended")),
        })
    }

    /// Puts a suspended task back in the queue: its next attempt resumes the run.
    pub(in crate::core) fn wake(&self, st: &mut State, task_id: &str, why: &str) -> Result<()> {
        let Some(mut task) = st.tasks.get(task_id).cloned() else {
            return Ok(());
        };
        if task.suspended.is_none() || task.state.is_terminal() {
            return Ok(());
        }
        task.suspended = None;
        task.state = TaskState::Queued;
        task.lease.not_before_ms = 0;
        task.activity = format!("resuming: {why}");
        tracing::info!(task = %task.task_id, run = %task.run_id, "resuming a suspended run: {why}");
        self.emit_state(st, task)
    }

    /// A task ended: the suspended parent waiting for it goes on.
    pub(in crate::core) fn wake_waiting_parent(
        &self,
        st: &mut State,
        child: &TaskRec,
    ) -> Result<()> {
        if child.parent_task_id.is_empty() {
            return Ok(());
        }
        let waits = st.tasks.get(&child.parent_task_id).is_some_and(|p| {
            matches!(&p.suspended, Some(SuspensionRec { waiting_for: WaitingFor::Child { task_id, .. }, .. }) if *task_id == child.task_id)
        });
        if waits {
            let why = format!("task {} ended {}", child.task_id, child.state.as_str());
            self.wake(st, &child.parent_task_id.clone(), &why)?;
        }
        Ok(())
    }

    /// A call was decided: the suspended task waiting for it goes on. Whether it was.
    pub(in crate::core) fn wake_decided(
        &self,
        st: &mut State,
        task_id: &str,
        call_id: &str,
    ) -> Result<bool> {
        let waits = st.tasks.get(task_id).is_some_and(|t| {
            matches!(&t.suspended, Some(SuspensionRec { waiting_for: WaitingFor::Approval { call_id: c, .. }, .. }) if c == call_id)
        });
        if waits {
            self.wake(st, task_id, &format!("call {call_id} was decided"))?;
        }
        Ok(waits)
    }

    /// Waits whose deadline passed: the run is resumed, and its harness ends the wait as it
    /// would have in place (an undecided call is denied by `approvalTimeout`, a child still
    /// running is cancelled at the caller's `toolTimeout`): it reads the deadline from its log.
    pub(in crate::core) fn expire_waits(&self, st: &mut State, now: i64) -> Result<()> {
        let due: Vec<String> = st
            .tasks
            .live()
            .filter(|t| t.suspended.as_ref().is_some_and(|s| s.deadline_ms <= now))
            .map(|t| t.task_id.clone())
            .collect();
        for task_id in due {
            self.wake(st, &task_id, "the wait's deadline passed")?;
        }
        Ok(())
    }
}
