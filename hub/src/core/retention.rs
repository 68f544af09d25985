//! Retention and backup. Task retention (`--task-retention`): a periodic sweep removes the
//! history of deployments removed longer ago than the retention, and finished tasks older than the
//! retention, with their task events, run events, run attempt, approvals, webhooks, request-id entry and
//! the artifacts no other task refers to; then the store is compacted when what it removed
//! outweighs what is left (`Store::compact`: the event log is rewritten while the Hub runs).
//!
//! Invariants: only terminal tasks are removed, measured from `finished_at_ms`; a task is gone
//! from memory before its records are removed from the store (nobody reads half a task); an
//! artifact's bytes go only when no task of its namespace refers to it any more.
//!
//! Audit retention (`--audit-retention`, default 400 days): the same sweep removes audit records
//! older than it ([`crate::tokens::audit::sweep`]); they live in sled, not in the event log.
//!
//! Both retentions can change while the Hub runs (`agen hub` reloads them on SIGHUP):
//! [`LiveRetention`] holds the current values, every sweep reads them, and a change wakes the
//! loop so that its interval follows at once.
//!
//! Backup: [`Core::write_snapshot`] writes the store and the data dir's keys (see
//! [`crate::store::snapshot`]) while the state lock is held.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::core::Core;
use crate::error::Result;
use crate::model::TaskRec;
use crate::store::Table;

/// What one sweep removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    pub tasks: usize,
    pub run_events: usize,
    pub task_events: usize,
    pub artifacts: usize,
    /// Whether the event log was rewritten without what the sweep removed (only when the dead
    /// records outweigh the live ones).
    pub compacted: bool,
}

/// How often the sweep runs for a retention: a tenth of it, between 1 second and 1 hour.
pub fn sweep_interval(retention: Duration) -> Duration {
    (retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(3600))
}

/// The task and audit retentions in force, changeable while the Hub runs.
#[derive(Debug)]
pub struct LiveRetention {
    task_ms: AtomicU64,
    audit_ms: AtomicU64,
    changed: tokio::sync::Notify,
}

impl LiveRetention {
    pub fn new(task: Duration, audit: Duration) -> LiveRetention {
        LiveRetention {
            task_ms: AtomicU64::new(millis(task)),
            audit_ms: AtomicU64::new(millis(audit)),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// The task retention in force.
    pub fn task(&self) -> Duration {
        Duration::from_millis(self.task_ms.load(Ordering::Relaxed))
    }

    /// The audit retention in force.
    pub fn audit(&self) -> Duration {
        Duration::from_millis(self.audit_ms.load(Ordering::Relaxed))
    }

    /// Sets both retentions; the sweep loop wakes and follows them from its next pass.
    pub fn set(&self, task: Duration, audit: Duration) {
        self.task_ms.store(millis(task), Ordering::Relaxed);
        self.audit_ms.store(millis(audit), Ordering::Relaxed);
        self.changed.notify_one();
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn as_keep_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn prefix(parts: &[&str]) -> Vec<u8> {
    let mut k = parts.join("\0").into_bytes();
    k.push(0);
    k
}

impl Core {
    /// Writes a snapshot of the store and the data dir's keys to `out`, holding the state
    /// lock so that no state change lands in it half made.
    pub fn write_snapshot(
        &self,
        out: impl std::io::Write,
    ) -> Result<crate::store::snapshot::Counts> {
        let _still = self.lock();
        Ok(crate::store::snapshot::write(
            self.db.raw(),
            &self.opts.data_dir,
            out,
        )?)
    }

    /// Runs until `shutdown`: sweeps expired tasks and audit records every [`sweep_interval`]
    /// of the shorter retention.
    pub async fn run_retention(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let every = sweep_interval(self.retention.task().min(self.retention.audit()));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
                // A reload: sweep now under the new values, then at their interval.
                _ = self.retention.changed.notified() => {}
            }
            let now = crate::model::now_ms();
            let keep_ms = as_keep_ms(self.retention.task());
            match self.sweep_removed_history(now, keep_ms) {
                Ok(0) => {}
                Ok(rows) => tracing::info!(
                    rows,
                    "removed the history of deployments removed before the task retention"
                ),
                Err(e) => {
                    tracing::error!(error = %e, "deployment history retention sweep failed; retrying")
                }
            }
            let audit_keep_ms = as_keep_ms(self.retention.audit());
            match crate::tokens::audit::sweep(&self.db, now.saturating_sub(audit_keep_ms)) {
                Ok(0) => {}
                Ok(records) => tracing::info!(
                    records,
                    retention = ?self.retention.audit(),
                    "removed audit records past the audit retention"
                ),
                Err(e) => tracing::error!(error = %e, "audit retention sweep failed; retrying"),
            }
            match self.sweep_expired_tasks(now).await {
                Ok(s) if s.tasks > 0 => tracing::info!(
                    tasks = s.tasks,
                    run_events = s.run_events,
                    task_events = s.task_events,
                    artifacts = s.artifacts,
                    compacted = s.compacted,
                    retention = ?self.retention.task(),
                    "removed finished tasks past their retention"
                ),
                Ok(_) => {}
                Err(e) => tracing::error!(error = %e, "task retention sweep failed; retrying"),
            }
        }
    }

    /// Removes every finished task that finished more than `task_retention` before `now_ms`.
    pub async fn sweep_expired_tasks(&self, now_ms: i64) -> Result<Swept> {
        let keep_ms = as_keep_ms(self.retention.task());
        let expired: Vec<TaskRec> = {
            let mut st = self.lock();
            let ids: Vec<String> = st
                .tasks
                .values()
                .filter(|t| {
                    t.state.is_terminal()
                        && t.finished_at_ms > 0
                        && now_ms.saturating_sub(t.finished_at_ms) > keep_ms
                })
                .map(|t| t.task_id.clone())
                .collect();
            ids.iter().filter_map(|id| st.tasks.remove(id)).collect()
        };
        let mut swept = Swept::default();
        if expired.is_empty() {
            return Ok(swept);
        }
        let raw = self.db.raw();
        let mut artifacts: Vec<(String, String)> = Vec::new();
        // The records in sled go first, made durable before any event goes from the log: a
        // task sled still knows keeps every event it counts (the store's check at open, see
        // `store::integrity`); a crash in between leaves events of no task, which are ignored.
        for t in &expired {
            if !t.run_id.is_empty() {
                raw.remove(Table::RunAttempts, t.run_id.as_bytes())?;
            }
            for (k, _) in raw.scan(Table::ArtifactTasks, &prefix(&[&t.namespace, &t.task_id]))? {
                raw.remove(Table::ArtifactTasks, &k)?;
                if let Some(id) = k.rsplit(|b| *b == 0).next() {
                    artifacts.push((t.namespace.clone(), String::from_utf8_lossy(id).into()));
                }
            }
            raw.remove(Table::Approvals, t.task_id.as_bytes())?;
            raw.remove(Table::Webhooks, t.task_id.as_bytes())?;
            if !t.client_request_id.is_empty() {
                let key = format!("{}\0{}", t.namespace, t.client_request_id);
                // Only if it still names this task (a later task may have taken the id).
                if self
                    .db
                    .get_json::<String>(Table::RequestIds, &key)?
                    .as_deref()
                    == Some(t.task_id.as_str())
                {
                    raw.remove(Table::RequestIds, key.as_bytes())?;
                }
            }
            raw.remove(Table::Tasks, t.task_id.as_bytes())?;
            swept.tasks += 1;
        }
        self.db.flush().await?;
        for t in &expired {
            if !t.run_id.is_empty() {
                for (k, _) in raw.scan(Table::RunEvents, &prefix(&[&t.run_id]))? {
                    raw.remove(Table::RunEvents, &k)?;
                    swept.run_events += 1;
                }
            }
            for (k, _) in raw.scan(Table::TaskEvents, &prefix(&[&t.task_id]))? {
                raw.remove(Table::TaskEvents, &k)?;
                swept.task_events += 1;
            }
        }
        artifacts.sort();
        artifacts.dedup();
        if !artifacts.is_empty() {
            let mut usage = self.artifact_usage.lock().await;
            for (ns, id) in &artifacts {
                let tail = [b"\0", id.as_bytes()].concat();
                let referenced = raw
                    .scan(Table::ArtifactTasks, &prefix(&[ns]))?
                    .iter()
                    .any(|(k, _)| k.ends_with(&tail));
                if !referenced {
                    let k = [ns.as_bytes(), b"\0", id.as_bytes()].concat();
                    raw.remove(Table::ArtifactData, &k)?;
                    raw.remove(Table::ArtifactMeta, &k)?;
                    swept.artifacts += 1;
                }
            }
            // Counted again from the store at the next save.
            *usage = None;
        }
        self.db.flush().await?;
        // What the sweep removed is dead weight in the event log until it is rewritten. A
        // rewrite that fails leaves the store as it was: the sweep still succeeded.
        let db = self.db.clone();
        let compacted = match tokio::task::spawn_blocking(move || db.compact()).await {
            Ok(done) => done.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        swept.compacted = compacted.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "compacting the store failed; it is unchanged");
            false
        });
        Ok(swept)
    }
}
