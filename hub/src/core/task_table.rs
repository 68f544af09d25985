//! [`TaskTable`]: the tasks the Hub holds in memory, with an index of the live ones (not
//! terminal) in submit order. The reconcile loop's passes (dispatch, expiring leases, waits and
//! cancel graces, draining old versions) walk only the live tasks, so their cost follows the
//! work in flight rather than every finished task retention still keeps.
//!
//! Invariant: `live` holds exactly the `(seq, task_id)` of every task in `all` whose state is
//! not terminal. Every way to change a task goes through this type: [`TaskTable::insert`],
//! [`TaskTable::remove`], and [`TaskTable::get_mut`], whose guard re-reads the task's state
//! when it is dropped. Reading goes through `Deref` to the map. `queued` counts the tasks in
//! state `Queued` per `(namespace, deployment)` the same way (the `--max-queued-tasks` check).

use std::collections::{BTreeSet, HashMap};
use std::ops::{Deref, DerefMut};

use crate::model::{TaskRec, TaskState};

/// Tasks in state `Queued` per `(namespace, deployment)`.
type QueuedCounts = HashMap<(String, String), usize>;

fn count_queued(queued: &mut QueuedCounts, task: &TaskRec, up: bool) {
    if task.state != TaskState::Queued {
        return;
    }
    let key = (task.namespace.clone(), task.deployment.clone());
    if up {
        *queued.entry(key).or_default() += 1;
    } else if let Some(n) = queued.get_mut(&key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            queued.remove(&key);
        }
    }
}

#[derive(Default)]
pub(crate) struct TaskTable {
    all: HashMap<String, TaskRec>,
    /// `(seq, task_id)` of each live task: submit order, then id.
    live: BTreeSet<(u64, String)>,
    queued: QueuedCounts,
}

impl TaskTable {
    /// Adds or replaces a task; returns the one it replaced.
    pub(crate) fn insert(&mut self, task: TaskRec) -> Option<TaskRec> {
        let key = (task.seq, task.task_id.clone());
        let live = !task.state.is_terminal();
        count_queued(&mut self.queued, &task, true);
        let old = self.all.insert(task.task_id.clone(), task);
        if let Some(old) = &old {
            self.live.remove(&(old.seq, old.task_id.clone()));
            count_queued(&mut self.queued, old, false);
        }
        if live {
            self.live.insert(key);
        }
        old
    }

    pub(crate) fn remove(&mut self, task_id: &str) -> Option<TaskRec> {
        let old = self.all.remove(task_id)?;
        self.live.remove(&(old.seq, old.task_id.clone()));
        count_queued(&mut self.queued, &old, false);
        Some(old)
    }

    /// The task to change in place; the index follows its state when the guard drops.
    pub(crate) fn get_mut(&mut self, task_id: &str) -> Option<TaskMut<'_>> {
        let task = self.all.get_mut(task_id)?;
        let was = (task.seq, !task.state.is_terminal());
        count_queued(&mut self.queued, task, false);
        Some(TaskMut {
            task,
            live: &mut self.live,
            queued: &mut self.queued,
            was,
        })
    }

    /// How many tasks of a deployment wait in state `Queued`.
    pub(crate) fn queued_of(&self, namespace: &str, deployment: &str) -> usize {
        self.queued
            .get(&(namespace.to_string(), deployment.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// The live tasks (not terminal) in submit order.
    pub(crate) fn live(&self) -> impl Iterator<Item = &TaskRec> + '_ {
        self.live.iter().filter_map(|(_, id)| self.all.get(id))
    }

    /// The ids of the live tasks in submit order.
    pub(crate) fn live_ids(&self) -> Vec<String> {
        self.live.iter().map(|(_, id)| id.clone()).collect()
    }
}

impl Deref for TaskTable {
    type Target = HashMap<String, TaskRec>;

    fn deref(&self) -> &Self::Target {
        &self.all
    }
}

impl FromIterator<TaskRec> for TaskTable {
    fn from_iter<I: IntoIterator<Item = TaskRec>>(tasks: I) -> Self {
        let mut table = TaskTable::default();
        for t in tasks {
            table.insert(t);
        }
        table
    }
}

/// A task being changed in place (see [`TaskTable::get_mut`]).
pub(crate) struct TaskMut<'a> {
    task: &'a mut TaskRec,
    live: &'a mut BTreeSet<(u64, String)>,
    /// Counted again from the task's state when the guard drops (taken out when it was made).
    queued: &'a mut QueuedCounts,
    /// Its seq and whether it was live when the guard was taken.
    was: (u64, bool),
}

impl Deref for TaskMut<'_> {
    type Target = TaskRec;

    fn deref(&self) -> &TaskRec {
        self.task
    }
}

impl DerefMut for TaskMut<'_> {
    fn deref_mut(&mut self) -> &mut TaskRec {
        self.task
    }
}

impl Drop for TaskMut<'_> {
    fn drop(&mut self) {
        count_queued(self.queued, self.task, true);
        let now = (self.task.seq, !self.task.state.is_terminal());
        if now == self.was {
            return;
        }
        if self.was.1 {
            self.live.remove(&(self.was.0, self.task.task_id.clone()));
        }
        if now.1 {
            self.live.insert((now.0, self.task.task_id.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TaskState;

    fn task(id: &str, seq: u64, state: TaskState) -> TaskRec {
        let mut t = TaskRec::example();
        t.task_id = id.into();
        t.seq = seq;
        t.state = state;
        t
    }

    fn live(t: &TaskTable) -> Vec<&str> {
        t.live().map(|t| t.task_id.as_str()).collect()
    }

    #[test]
    fn the_live_tasks_are_the_ones_not_terminal_in_submit_order_whatever_changes_them() {
        let mut t: TaskTable = [
            task("c", 3, TaskState::Running),
            task("a", 1, TaskState::Queued),
            task("done", 2, TaskState::Succeeded),
        ]
        .into_iter()
        .collect();
        assert_eq!(live(&t), ["a", "c"]);

        t.insert(task("b", 2, TaskState::Waiting));
        assert_eq!(
            live(&t),
            ["a", "b", "c"],
            "seq 2 is taken by a finished task too"
        );

        // Replacing a task moves it in or out of the index.
        t.insert(task("c", 3, TaskState::Failed));
        t.insert(task("done", 2, TaskState::Queued));
        assert_eq!(live(&t), ["a", "b", "done"]);

        // A change in place is followed when the guard drops; a change that keeps the task
        // live or finished moves nothing.
        t.get_mut("a").expect("a").state = TaskState::Cancelled;
        t.get_mut("b").expect("b").activity = "thinking".into();
        t.get_mut("c").expect("c").state = TaskState::Queued;
        assert_eq!(live(&t), ["b", "done", "c"]);

        assert_eq!(t.remove("b").map(|t| t.seq), Some(2));
        assert!(t.remove("b").is_none());
        assert_eq!(t.live_ids(), ["done", "c"]);
        assert_eq!(t.len(), 3, "the finished tasks stay in the table");
        let ex = TaskRec::example();
        assert_eq!(
            t.queued_of(&ex.namespace, &ex.deployment),
            2,
            "the queued count follows inserts, removals and changes in place"
        );
        assert_eq!(t.queued_of(&ex.namespace, "other"), 0);
    }
}
