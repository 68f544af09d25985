//! Reading tasks: one, a page of summaries, the event history, the live feed and the trace.

use crate::core::{namespace_or_default, Core};
use crate::error::{HubError, Result};
use crate::model::TaskUpdate;
use crate::store::Table;
use crate::trace::{build_spans, SpanRec};

use super::*;

impl Core {
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
        let keep = |t: &TaskRec| {
            (f.deployment.is_empty() || t.deployment == f.deployment)
                && state.is_none_or(|s| t.state == s)
                && (f.conversation_key.is_empty() || t.conversation_key == f.conversation_key)
                && (f.label_key.is_empty()
                    || t.labels
                        .get(&f.label_key)
                        .is_some_and(|v| f.label_value.is_empty() || *v == f.label_value))
                && (f.created_after_ms == 0 || t.created_at_ms >= f.created_after_ms)
                && (f.created_before_ms == 0 || t.created_at_ms < f.created_before_ms)
        };
        let only_namespace = f.deployment.is_empty()
            && state.is_none()
            && f.conversation_key.is_empty()
            && f.label_key.is_empty()
            && f.created_after_ms == 0
            && f.created_before_ms == 0
            && f.parent_task_id.is_empty();
        let st = self.lock();
        // Newest first from the page token: a walk of the namespace's index (or the parent's
        // children) that stops at the page's end, not a sort of every task.
        let from = |before: Option<u64>| -> Box<dyn Iterator<Item = &TaskRec> + '_> {
            if f.parent_task_id.is_empty() {
                Box::new(st.tasks.in_namespace(&namespace, before))
            } else {
                Box::new(
                    st.tasks
                        .children_of(&f.parent_task_id, before)
                        .filter(|t| t.namespace == namespace),
                )
            }
        };
        // Every page counts every match; the page token narrows only the page itself.
        let total = if only_namespace {
            st.tasks.count_in_namespace(&namespace)
        } else {
            from(None).filter(|t| keep(t)).count()
        } as u64;
        let mut matching = from(f.before_seq).filter(|t| keep(t));
        let mut tasks = Vec::new();
        let mut bytes = 0usize;
        let mut cut = false;
        for t in matching.by_ref() {
            let summary = summarize(t);
            bytes += summary_size(&summary.task);
            if !tasks.is_empty() && bytes > MAX_PAGE_BYTES {
                cut = true;
                break;
            }
            tasks.push(summary);
            if tasks.len() == page_size {
                break;
            }
        }
        let more = cut || matching.next().is_some();
        let next_before_seq = more.then(|| tasks.last().map(|s| s.task.seq)).flatten();
        Ok(TaskPage {
            tasks,
            next_before_seq,
            total,
        })
    }

    /// A page of the tasks of `namespace/deployment` that `keep` accepts, most recently updated
    /// first (ties: the greater task id first), strictly after the task at `after` (its
    /// updated time and id) in that order; with how many match in all.
    pub fn recent_tasks(
        &self,
        namespace: &str,
        deployment: &str,
        keep: impl Fn(&TaskRec) -> bool,
        after: Option<(i64, &str)>,
        page_size: usize,
    ) -> RecentPage {
        let namespace = namespace_or_default(namespace);
        let st = self.lock();
        let mut matching: Vec<&TaskRec> = st
            .tasks
            .values()
            .filter(|t| t.namespace == namespace && t.deployment == deployment && keep(t))
            .collect();
        let total = matching.len();
        let order = |t: &TaskRec| std::cmp::Reverse((t.updated_at_ms, t.task_id.clone()));
        matching.sort_by_cached_key(|t| order(t));
        let start = match after {
            None => 0,
            Some((ms, id)) => {
                let cursor = std::cmp::Reverse((ms, id.to_string()));
                matching.partition_point(|t| order(t) <= cursor)
            }
        };
        let rest = &matching[start.min(matching.len())..];
        RecentPage {
            tasks: rest.iter().take(page_size).map(|t| (*t).clone()).collect(),
            more: rest.len() > page_size,
            total,
        }
    }

    /// The tasks of conversation `conversation_id` in `namespace` whose label `key` is
    /// `value`, in submission order.
    pub fn labelled_in_conversation(
        &self,
        namespace: &str,
        conversation_id: &str,
        key: &str,
        value: &str,
    ) -> Vec<TaskRec> {
        if conversation_id.is_empty() {
            return Vec::new();
        }
        let namespace = namespace_or_default(namespace);
        let st = self.lock();
        let mut found: Vec<TaskRec> = st
            .tasks
            .values()
            .filter(|t| {
                t.namespace == namespace
                    && t.conversation_id == conversation_id
                    && t.labels.get(key).is_some_and(|v| v == value)
            })
            .cloned()
            .collect();
        found.sort_by_key(|t| t.seq);
        found
    }

    /// The tasks of `namespace` that have label `key`, in submission order.
    pub fn labelled(&self, namespace: &str, key: &str) -> Vec<TaskRec> {
        let namespace = namespace_or_default(namespace);
        let st = self.lock();
        let mut found: Vec<TaskRec> = st
            .tasks
            .values()
            .filter(|t| t.namespace == namespace && t.labels.contains_key(key))
            .cloned()
            .collect();
        found.sort_by_key(|t| t.seq);
        found
    }

    /// Stored events of a task with seq >= `from_seq`.
    pub fn task_events(&self, task_id: &str, from_seq: u64) -> Result<Vec<TaskEventRec>> {
        let mut prefix = task_id.as_bytes().to_vec();
        prefix.push(0);
        let all: Vec<TaskEventRec> = self.db.list_json(Table::TaskEvents, &prefix)?;
        Ok(all.into_iter().filter(|e| e.seq >= from_seq).collect())
    }

    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<std::sync::Arc<TaskUpdate>> {
        self.updates.subscribe()
    }

    /// The spans of a task's run: one per model turn and one per tool call.
    pub fn trace(&self, namespace: &str, task_id: &str) -> Result<(TaskRec, Vec<SpanRec>)> {
        self.trace_for(namespace, task_id, &|_| true)
    }

    /// [`Core::trace`] for a caller who may read only the namespaces `may_read` allows: a child
    /// task in any other namespace is one opaque span (its task id and state; nothing of its
    /// run, its deployment or its own children).
    pub fn trace_for(
        &self,
        namespace: &str,
        task_id: &str,
        may_read: &dyn Fn(&str) -> bool,
    ) -> Result<(TaskRec, Vec<SpanRec>)> {
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
                let mut children: Vec<TaskRec> =
                    st.tasks.children_of(&parent, None).cloned().collect();
                children.reverse();
                children
            };
            for child in children {
                if !may_read(&namespace_or_default(&child.namespace)) {
                    spans.push(opaque_span(&child));
                    continue;
                }
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

/// A child the caller may not read: where it hangs in the tree, its id and state.
fn opaque_span(child: &TaskRec) -> SpanRec {
    SpanRec {
        span_id: crate::trace::build_spans(child, &[])
            .first()
            .map(|s| s.span_id.clone())
            .unwrap_or_default(),
        parent_span_id: child.parent_span_id.clone(),
        name: "delegated task (another namespace)".into(),
        start_ms: child.created_at_ms,
        end_ms: child.finished_at_ms.max(child.created_at_ms),
        status: child.state.as_str().to_string(),
        attributes: std::collections::BTreeMap::from([(
            "task_id".to_string(),
            child.task_id.clone(),
        )]),
    }
}

/// A page of [`Core::recent_tasks`].
#[derive(Debug, Clone)]
pub struct RecentPage {
    pub tasks: Vec<TaskRec>,
    /// More tasks follow the page.
    pub more: bool,
    /// How many tasks match, on every page.
    pub total: usize,
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
        last_event_source: None,
        cancel_requested_at_ms: t.cancel_requested_at_ms,
        cancel_reason: cut(&t.cancel_reason, SUMMARY_RESULT_BYTES),
        rolled_back: false,
        lease: t.lease.clone(),
        tool_overrides: t.tool_overrides.clone(),
        warnings: t.warnings.clone(),
        parent_task_id: t.parent_task_id.clone(),
        root_run_id: t.root_run_id.clone(),
        delegation_depth: t.delegation_depth,
        parent_span_id: t.parent_span_id.clone(),
        traceparent: t.traceparent.clone(),
        suspended: t.suspended.clone(),
        wait_deadlines: Default::default(),
        budget: t.budget.clone(),
        output_schema: t.output_schema.clone(),
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
