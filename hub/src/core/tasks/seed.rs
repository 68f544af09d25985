//! Seeding a stopped Hub's store with finished tasks, for benchmarks of the task list at size
//! (`agen hub seed-tasks`): each task is written as the Hub writes one that was submitted and
//! succeeded (its record, and its two `task.state` events, queued then succeeded, each with
//! the task's snapshot), through the [`crate::store::Store`] trait, so the local store and
//! PostgreSQL take it alike and the Hub loads it at start like any other.

use std::collections::BTreeMap;

use super::TaskStateEvent;
use crate::error::{HubError, Result};
use crate::model::*;
use crate::store::{task_event_key, Db, Table};

/// What to seed.
#[derive(Debug, Clone)]
pub struct SeedSpec {
    pub namespace: String,
    pub deployment: String,
    pub count: u64,
    /// Label `batch` of task i is `i % batches` (0: no label).
    pub batches: u64,
}

fn encode<T: serde::Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(v)
        .map_err(|e| HubError::Internal(format!("cannot encode a seeded task: {e}")))
}

/// Writes `spec.count` succeeded tasks, one millisecond of submission time apart and ending
/// now, then makes them durable. Returns their ids, oldest first.
pub fn seed_finished_tasks(db: &Db, spec: &SeedSpec) -> Result<Vec<String>> {
    let now = now_ms();
    let first = now - i64::try_from(spec.count).unwrap_or(i64::MAX / 2);
    let mut ids = Vec::new();
    for i in 0..spec.count {
        let at = first + i64::try_from(i).unwrap_or(0);
        let seq = db.raw().increment("task_seq")?;
        let mut labels = BTreeMap::new();
        if spec.batches > 0 {
            labels.insert("batch".to_string(), (i % spec.batches).to_string());
        }
        let mut task = TaskRec {
            task_id: format!("task-{}", uuid::Uuid::now_v7().simple()),
            namespace: spec.namespace.clone(),
            deployment: spec.deployment.clone(),
            input: format!("seeded task number {i}"),
            labels,
            conversation_key: String::new(),
            conversation_id: format!("conv-{}", uuid::Uuid::now_v7().simple()),
            state: TaskState::Queued,
            activity: "queued".into(),
            progress: None,
            outcome: None,
            run_id: String::new(),
            attempt: 0,
            instance_id: String::new(),
            bundle_digest: String::new(),
            client_request_id: String::new(),
            created_at_ms: at,
            updated_at_ms: at,
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
            parent_task_id: String::new(),
            root_run_id: String::new(),
            delegation_depth: 0,
            parent_span_id: String::new(),
            tool_overrides: Default::default(),
            warnings: Vec::new(),
            traceparent: String::new(),
            suspended: None,
            wait_deadlines: BTreeMap::new(),
            budget: BudgetRec::default(),
            output_schema: String::new(),
        };
        let state_event = |task: &mut TaskRec| -> Result<()> {
            let body = TaskStateEvent {
                state: task.state.as_str(),
                message: &task.activity,
                result: task.outcome.as_ref().map(|o| o.result.as_str()),
                response_type: task.outcome.as_ref().map(|o| o.response_type.as_str()),
                error: task.outcome.as_ref().map_or("", |o| o.error.as_str()),
            };
            let event = TaskEventRec {
                seq: task.next_event_seq,
                at_ms: task.updated_at_ms,
                kind: "task.state".into(),
                json: String::from_utf8(encode(&body)?).unwrap_or_default(),
                snapshot: Some(TaskSnapshot::of(task)),
                source: None,
            };
            db.raw().put(
                Table::TaskEvents,
                &task_event_key(&task.task_id, event.seq),
                &encode(&event)?,
            )?;
            task.next_event_seq += 1;
            Ok(())
        };
        state_event(&mut task)?;
        task.state = TaskState::Succeeded;
        task.activity = "succeeded".into();
        task.outcome = Some(OutcomeRec {
            result: format!("answer number {i}"),
            response_type: "text".into(),
            error: String::new(),
        });
        task.started_at_ms = at;
        task.finished_at_ms = at;
        state_event(&mut task)?;
        db.raw()
            .put(Table::Tasks, task.task_id.as_bytes(), &encode(&task)?)?;
        ids.push(task.task_id);
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::core::tasks::TaskFilter;

    #[tokio::test]
    async fn seeded_tasks_are_loaded_as_finished_tasks_with_their_events_and_listed_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let ids = {
            let core = crate::core::test_core(dir.path());
            let spec = SeedSpec {
                namespace: "default".into(),
                deployment: "many".into(),
                count: 120,
                batches: 10,
            };
            let ids = seed_finished_tasks(&core.db, &spec).unwrap();
            core.db.flush().await.unwrap();
            core.db.close();
            ids
        };
        let core = crate::core::test_core(dir.path());
        let page = core
            .list_tasks(&TaskFilter {
                page_size: 50,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(page.total, 120);
        assert_eq!(page.tasks.len(), 50);
        assert_eq!(page.tasks[0].task.task_id, ids[119], "newest first");
        assert_eq!(page.tasks[0].task.state, TaskState::Succeeded);
        let next = core
            .list_tasks(&TaskFilter {
                page_size: 50,
                before_seq: page.next_before_seq,
                label_key: "batch".into(),
                label_value: "3".into(),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(next.total, 12, "one in ten has batch=3");
        assert!(next
            .tasks
            .iter()
            .all(|t| t.task.seq < page.tasks[49].task.seq));
        let events = core.task_events(&ids[0], 0).unwrap();
        assert_eq!(events.len(), 2);
        assert!(events[1].json.contains("succeeded"), "{:?}", events[1]);
    }
}
