//! Updates of one task, for its watchers (`WatchTask`): each watched task has a channel of its
//! own, so a watcher wakes only for its task's events. Every update still goes to
//! [`Core::subscribe`] as well (metrics, OTLP, A2A, delegates hear every task).
//!
//! Invariants: an update is published to its task's channel before the all-tasks channel, both
//! by [`Core::publish`], the one place updates leave the core; a task's channel exists while
//! one of its [`TaskUpdates`] lives (the last one to drop removes it, under the same lock a new
//! subscription takes, so a subscriber never holds a channel that is no longer fed).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use crate::core::Core;
use crate::model::TaskUpdate;

/// Updates a watcher of one task may fall behind by before it reads the rest from the store.
const PER_TASK_CAPACITY: usize = 256;

/// The channels of the tasks someone watches, by task id.
#[derive(Default)]
pub(crate) struct Watchers(Mutex<HashMap<String, broadcast::Sender<Arc<TaskUpdate>>>>);

impl Watchers {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, broadcast::Sender<Arc<TaskUpdate>>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One watcher's subscription to one task's updates.
pub struct TaskUpdates {
    rx: broadcast::Receiver<Arc<TaskUpdate>>,
    task_id: String,
    core: Arc<Core>,
}

impl TaskUpdates {
    /// The next update of the task (`Lagged` when this watcher fell behind).
    pub async fn recv(&mut self) -> Result<Arc<TaskUpdate>, broadcast::error::RecvError> {
        self.rx.recv().await
    }
}

impl Drop for TaskUpdates {
    fn drop(&mut self) {
        let mut watchers = self.core.watchers.lock();
        // This subscription's receiver is still alive here: it is the last one when it is 1.
        if watchers
            .get(&self.task_id)
            .is_some_and(|tx| tx.receiver_count() <= 1)
        {
            watchers.remove(&self.task_id);
        }
    }
}

impl Core {
    /// Subscribes to `task_id`'s updates alone (subscribe before reading what is stored, so
    /// nothing falls between the two).
    pub fn subscribe_task(self: &Arc<Self>, task_id: &str) -> TaskUpdates {
        let rx = self
            .watchers
            .lock()
            .entry(task_id.to_string())
            .or_insert_with(|| broadcast::channel(PER_TASK_CAPACITY).0)
            .subscribe();
        TaskUpdates {
            rx,
            task_id: task_id.to_string(),
            core: self.clone(),
        }
    }

    /// Sends an update to its task's watchers, then to everyone who hears every task.
    pub(crate) fn publish(&self, update: Arc<TaskUpdate>) {
        if let Some(tx) = self.watchers.lock().get(&update.task_id) {
            let _ = tx.send(update.clone());
        }
        self.forget_deltas_if_ended(&update.task_id, update.task.state);
        let _ = self.updates.send(update);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::Arc;

    use super::*;
    use crate::model::{TaskEventRec, TaskRec};

    fn core(dir: &std::path::Path) -> Arc<Core> {
        crate::core::test_core(dir)
    }

    fn update(task_id: &str, seq: u64) -> Arc<TaskUpdate> {
        Arc::new(TaskUpdate {
            body: None,
            task_id: task_id.into(),
            event: TaskEventRec {
                seq,
                at_ms: 0,
                kind: "activity".into(),
                json: "{}".into(),
                snapshot: None,
                source: None,
            },
            task: TaskRec::example(),
        })
    }

    #[tokio::test]
    async fn a_watcher_hears_its_task_alone_and_the_last_one_gone_closes_the_channel() {
        let dir = tempfile::tempdir().unwrap();
        let core = core(dir.path());
        let mut everything = core.subscribe();
        let mut a1 = core.subscribe_task("a");
        let a2 = core.subscribe_task("a");
        let mut b = core.subscribe_task("b");
        core.publish(update("b", 1));
        core.publish(update("a", 2));
        assert_eq!(a1.recv().await.unwrap().event.seq, 2, "a's watcher skips b");
        assert_eq!(b.recv().await.unwrap().event.seq, 1);
        let all: Vec<u64> = [everything.recv().await, everything.recv().await]
            .into_iter()
            .map(|u| u.unwrap().event.seq)
            .collect();
        assert_eq!(all, [1, 2], "the all-tasks channel hears both");

        drop(a1);
        assert!(core.watchers.lock().contains_key("a"), "a2 still watches");
        drop(a2);
        assert!(!core.watchers.lock().contains_key("a"), "nobody watches a");
        assert!(core.watchers.lock().contains_key("b"));
        // A new watcher after that gets a fresh channel that is fed.
        let mut again = core.subscribe_task("a");
        core.publish(update("a", 3));
        assert_eq!(again.recv().await.unwrap().event.seq, 3);
    }
}
