//! Task budgets: a task's timeout (`SubmitTaskRequest.timeout_ms`, else its bundle's
//! `limits.taskTimeout`) and token budget (`max_tokens`, else `limits.maxTokens`), resolved once
//! at submit and kept on the task for every attempt; and the deadline timer.
//!
//! Invariants: the deadline is durable (`BudgetRec.deadline_ms`, in the task's record), so a
//! Hub restart keeps it; the timer is a step of every reconcile pass (it runs in the boot
//! window too); a task past its deadline is ended through the cancel path (its run and tool
//! calls are cancelled by its Nest, with the same grace) and ends `Failed`, response type
//! `error`, with a result that says "deadline exceeded" — never `Cancelled`. The token budget is
//! the harness's to enforce (it knows each turn's usage); the Hub only carries it.

use std::time::Duration;

use agen_shared::duration::format_duration;

use crate::core::tasks::{SpecBudget, TaskSpec};
use crate::core::{Core, State};
use crate::error::Result;
use crate::model::*;

/// The longest task timeout (a year): a deadline always fits the clock.
pub const MAX_TIMEOUT_MS: u64 = 366 * 24 * 3600 * 1000;

/// A bundle's budget defaults (`limits.taskTimeout`, `limits.maxTokens`); 0: none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BundleBudget {
    pub timeout_ms: u64,
    pub max_tokens: u64,
}

impl BundleBudget {
    pub fn of(limits: &agen_shared::bundle::Limits) -> BundleBudget {
        BundleBudget {
            timeout_ms: limits.task_timeout.map_or(0, |d| {
                u64::try_from(d.as_millis()).unwrap_or(MAX_TIMEOUT_MS)
            }),
            max_tokens: limits.max_tokens.unwrap_or(0),
        }
    }
}

/// The budget of a task submitted at `now`: its deadline from its timeout (a submit's timeout
/// over [`MAX_TIMEOUT_MS`] is refused at the edge; a bundle's is cut to it).
pub(crate) fn with_deadline(mut b: BudgetRec, now: i64) -> BudgetRec {
    b.timeout_ms = b.timeout_ms.min(MAX_TIMEOUT_MS);
    b.deadline_ms = if b.timeout_ms == 0 {
        0
    } else {
        now.saturating_add(i64::try_from(b.timeout_ms).unwrap_or(i64::MAX))
    };
    b
}

/// The result (and error) of a task whose deadline passed.
pub fn deadline_text(task: &TaskRec) -> String {
    format!(
        "deadline exceeded: the task did not finish within its timeout of {} (agen submit --timeout or limits.taskTimeout in x-agen/harness.json)",
        format_duration(Duration::from_millis(task.budget.timeout_ms))
    )
}

impl Core {
    /// A submit's budget: its own values, else the defaults of the deployment's current bundle
    /// (none when the bundle cannot be read).
    pub(crate) fn task_budget(&self, namespace: &str, spec: &TaskSpec) -> BudgetRec {
        let SpecBudget {
            timeout_ms,
            max_tokens,
        } = spec.budget;
        let defaults = if timeout_ms == 0 || max_tokens == 0 {
            self.bundle_budget_of(namespace, &spec.deployment)
        } else {
            BundleBudget::default()
        };
        BudgetRec {
            timeout_ms: if timeout_ms > 0 {
                timeout_ms
            } else {
                defaults.timeout_ms
            },
            max_tokens: if max_tokens > 0 {
                max_tokens
            } else {
                defaults.max_tokens
            },
            deadline_ms: 0,
            deadline_exceeded: false,
        }
    }

    fn bundle_budget_of(&self, namespace: &str, deployment: &str) -> BundleBudget {
        let digest = self
            .lock()
            .deployments
            .get(&deployment_key(namespace, deployment))
            .map(|d| d.bundle_digest.clone());
        let Some(digest) = digest else {
            return BundleBudget::default();
        };
        let cached = || {
            self.bundle_budgets
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&digest)
                .copied()
        };
        if let Some(b) = cached() {
            return b;
        }
        if let Err(e) = self.load_stored_bundle(&digest) {
            tracing::warn!(%digest, error = %e, "cannot read the bundle's taskTimeout and maxTokens");
            return BundleBudget::default();
        }
        cached().unwrap_or_default()
    }

    /// The deadline timer: every unfinished task past its deadline is ended, a queued one at
    /// once, a running or waiting one through its run's cancel (see the module invariants).
    pub(in crate::core) fn expire_deadlines(&self, st: &mut State, now: i64) -> Result<()> {
        // A task a person cancelled ends cancelled, deadline or not.
        let due: Vec<String> = st
            .tasks
            .live()
            .filter(|t| {
                t.cancel_requested_at_ms == 0
                    && !t.budget.deadline_exceeded
                    && t.budget.deadline_ms > 0
                    && t.budget.deadline_ms <= now
            })
            .map(|t| t.task_id.clone())
            .collect();
        for id in due {
            let Some(mut task) = st.tasks.get(&id).cloned() else {
                continue;
            };
            task.budget.deadline_exceeded = true;
            let why = deadline_text(&task);
            tracing::info!(task = %task.task_id, "{why}");
            if task.state == TaskState::Queued || task.suspended.is_some() {
                // Nothing runs (queued, or suspended waiting): it ends now.
                self.finish_task(st, task, TaskState::Failed, &why, "error", &why)?;
            } else {
                self.save_task(st, task)?;
                // Its delegate children go with it (they end cancelled).
                self.cancel_tree(st, &id, &why)?;
            }
        }
        Ok(())
    }

    /// Ends a task whose cancel went through (its run ended, or its grace ran out): cancelled,
    /// or failed with "deadline exceeded" when the deadline timer cancelled it.
    pub(in crate::core) fn finish_cancelled(&self, st: &mut State, task: TaskRec) -> Result<()> {
        if task.budget.deadline_exceeded {
            let why = deadline_text(&task);
            return self.finish_task(st, task, TaskState::Failed, &why, "error", &why);
        }
        let reason = task.cancel_reason.clone();
        self.finish_task(st, task, TaskState::Cancelled, "", "text", &reason)
    }
}
