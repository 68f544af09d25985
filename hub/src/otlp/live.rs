//! Live export: every task update marks its top-level task; every [`FLUSH`] the marked tasks'
//! traces are rebuilt ([`Core::trace`], GetTrace's ids) and each span that has ended since
//! (a model turn answered, a tool call done, an approval decided; the run's own span and the
//! spans still open when the task ends) joins the queue once. Batches of at most [`BATCH`]
//! spans go to the exporter; the queue holds at most [`QUEUE`] spans, and a span that finds it
//! full is dropped and counted (`agen_hub_otlp_spans_dropped_total`), never waited for. So a
//! task waiting for an approval already shows its turns and calls at the collector.
//!
//! What was exported is remembered in memory: after a Hub restart the ended spans of a task
//! still going on are exported again (same ids; collectors keep one of each).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;

use super::spans::{self, HubResource, ModelInfo};
use super::{pb, Exporter, EXPORT_TIMEOUT};
use crate::core::Core;
use crate::model::{TaskRec, TaskState};
use crate::trace::SpanRec;

/// How often ended spans are collected and a batch is sent.
const FLUSH: Duration = Duration::from_millis(500);
/// The most spans one export carries.
const BATCH: usize = 512;
/// The most spans waiting for export; more are dropped and counted.
pub const QUEUE: usize = 4096;
/// Finished tasks remembered so that a late update does not export their spans twice.
const FINISHED_KEPT: usize = 4096;

/// Spans dropped because the queue was full (or the Hub stopped before sending them).
pub static SPANS_DROPPED: LazyLock<Counter> = LazyLock::new(Counter::default);
/// Spans the collector accepted.
pub static SPANS_EXPORTED: LazyLock<Counter> = LazyLock::new(Counter::default);

/// A span waiting for export, with its task's namespace and id.
struct Queued {
    namespace: String,
    task_id: String,
    span: pb::Span,
}

/// The follower's memory: tasks to look at, spans already queued, the queue.
#[derive(Default)]
struct Live {
    /// Top-level tasks (namespace, id) updated since the last flush.
    dirty: HashSet<(String, String)>,
    /// Span ids queued so far, per top-level task still going on.
    sent: HashMap<String, HashSet<String>>,
    finished: HashSet<String>,
    finished_order: VecDeque<String>,
    queue: VecDeque<Queued>,
    /// The bundle's model by digest (reading a bundle unpacks it).
    models: HashMap<String, ModelInfo>,
}

/// Starts following `core`'s task updates and exporting with `exporter`.
pub(super) fn start(core: Arc<Core>, exporter: Exporter) {
    let resource = HubResource::current();
    let (tx, mut rx) = mpsc::channel::<Vec<Queued>>(2);
    let exporter = Arc::new(exporter);
    let sender = exporter.clone();
    tokio::spawn(async move {
        while let Some(batch) = rx.recv().await {
            let n = batch.len() as u64;
            let mut tasks: Vec<String> = Vec::new();
            for q in &batch {
                if !tasks.contains(&q.task_id) {
                    tasks.push(q.task_id.clone());
                }
            }
            let what = tasks
                .iter()
                .map(|t| format!("task {t}"))
                .collect::<Vec<_>>()
                .join(", ");
            let request = spans::request(
                &resource,
                batch.into_iter().map(|q| (q.namespace, q.span)).collect(),
            );
            match tokio::time::timeout(EXPORT_TIMEOUT, sender.export(request)).await {
                Ok(Ok(())) => {
                    SPANS_EXPORTED.inc_by(n);
                    tracing::debug!(spans = n, "spans exported over OTLP");
                }
                Ok(Err(e)) => {
                    SPANS_DROPPED.inc_by(n);
                    sender.warn_failed(&what, n, &e);
                }
                Err(_) => {
                    SPANS_DROPPED.inc_by(n);
                    sender.warn_failed(&what, n, &format!("timed out after {EXPORT_TIMEOUT:?}"));
                }
            }
        }
    });
    let mut updates = core.subscribe();
    tokio::spawn(async move {
        let mut live = Live::default();
        let mut tick = tokio::time::interval(FLUSH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                n = updates.recv() => match n {
                    Ok(u) => {
                        if let Some(root) = top_level(&core, &u.task) {
                            live.dirty.insert(root);
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(missed = n, "OTLP export fell behind the task updates; spans of tasks updated among {n} updates are exported at their task's next update");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick() => {
                    live.collect(&core);
                    live.send(&tx);
                }
                _ = core.stopping.cancelled() => {
                    live.collect(&core);
                    live.send(&tx);
                    let left = live.queue.len() as u64;
                    if left > 0 {
                        SPANS_DROPPED.inc_by(left);
                        tracing::warn!(spans = left, "the Hub stops with {left} spans not yet exported over OTLP");
                    }
                    return;
                }
            }
        }
    });
}

/// The top-level task `task` belongs to (itself when it has no parent).
fn top_level(core: &Core, task: &TaskRec) -> Option<(String, String)> {
    if task.parent_task_id.is_empty() {
        return Some((task.namespace.clone(), task.task_id.clone()));
    }
    let st = core.lock();
    let mut t = st.tasks.get(&task.parent_task_id)?;
    for _ in 0..64 {
        if t.parent_task_id.is_empty() {
            return Some((t.namespace.clone(), t.task_id.clone()));
        }
        t = st.tasks.get(&t.parent_task_id)?;
    }
    None
}

/// Whether `s` has ended: its own end is in the log, or (a task's span) its task has.
fn ended(s: &SpanRec) -> bool {
    if s.attributes.contains_key("task_id") {
        return TaskState::parse(&s.status).is_some_and(TaskState::is_terminal);
    }
    s.status != "running"
}

impl Live {
    /// Queues the spans of the dirty tasks that ended since they were last looked at.
    fn collect(&mut self, core: &Core) {
        for (namespace, task_id) in std::mem::take(&mut self.dirty) {
            if self.finished.contains(&task_id) {
                continue;
            }
            let (task, all) = match core.trace(&namespace, &task_id) {
                Ok(t) => t,
                Err(e) => {
                    tracing::debug!(task = %task_id, "no trace to export for task {task_id}: {e}");
                    continue;
                }
            };
            let model = self
                .models
                .entry(task.bundle_digest.clone())
                .or_insert_with(|| ModelInfo::of_bundle(core, &task.bundle_digest))
                .clone();
            let trace_id = hex::decode(crate::trace::trace_id(&task)).unwrap_or_default();
            let sent = self.sent.entry(task_id.clone()).or_default();
            let mut dropped = 0u64;
            for s in &all {
                if !ended(s) || sent.contains(&s.span_id) {
                    continue;
                }
                sent.insert(s.span_id.clone());
                if self.queue.len() >= QUEUE {
                    dropped += 1;
                    continue;
                }
                self.queue.push_back(Queued {
                    namespace: task.namespace.clone(),
                    task_id: task_id.clone(),
                    span: spans::span(&task, &trace_id, s, &model),
                });
            }
            if dropped > 0 {
                SPANS_DROPPED.inc_by(dropped);
                tracing::warn!(task = %task_id, dropped, "the OTLP export queue is full ({QUEUE} spans); {dropped} spans of task {task_id} are dropped");
            }
            if task.state.is_terminal() {
                self.sent.remove(&task_id);
                self.finished.insert(task_id.clone());
                self.finished_order.push_back(task_id);
                if self.finished_order.len() > FINISHED_KEPT {
                    if let Some(old) = self.finished_order.pop_front() {
                        self.finished.remove(&old);
                    }
                }
            }
        }
    }

    /// Hands batches to the exporter while it takes them; the rest waits in the queue.
    fn send(&mut self, tx: &mpsc::Sender<Vec<Queued>>) {
        while !self.queue.is_empty() {
            let permit = match tx.try_reserve() {
                Ok(p) => p,
                Err(_) => return,
            };
            let n = self.queue.len().min(BATCH);
            permit.send(self.queue.drain(..n).collect());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn span(status: &str, task: bool) -> SpanRec {
        let mut attributes = BTreeMap::new();
        if task {
            attributes.insert("task_id".to_string(), "t".to_string());
        }
        SpanRec {
            span_id: "s".into(),
            parent_span_id: String::new(),
            name: "x".into(),
            start_ms: 0,
            end_ms: 0,
            status: status.into(),
            attributes,
        }
    }

    #[test]
    fn a_span_has_ended_once_its_end_or_its_tasks_end_is_known() {
        assert!(!ended(&span("running", false)));
        assert!(ended(&span("ok", false)));
        assert!(ended(&span("error", false)));
        assert!(!ended(&span("waiting", true)));
        assert!(!ended(&span("running", true)));
        assert!(ended(&span("succeeded", true)));
        assert!(ended(&span("cancelled", true)));
    }
}
