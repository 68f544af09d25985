//! [`TaskTable`]: the tasks the Hub holds in memory, with an index of the live ones (not
//! terminal) in submit order. The reconcile loop's passes (dispatch, expiring leases, waits and
//! cancel graces, draining old versions) walk only the live tasks, so their cost follows the
//! work in flight rather than every finished task retention still keeps. Two more indexes in
//! submit order serve reads: each namespace's tasks (a `ListTasks` page is a bounded walk
//! back from its newest task, not a sort of the namespace) and each parent's children
//! (`ListTasks` by parent, the delegation tree of `GetTrace`).
//!
//! Invariant: `live` holds exactly the `(seq, task_id)` of every task in `all` whose state is
//! not terminal; `by_namespace` and `children` hold exactly the `(seq, task_id)` of every
//! task in `all`, under its namespace and (when it has one) its parent. Every way to change a
//! task goes through this type: [`TaskTable::insert`], [`TaskTable::remove`], and
//! [`TaskTable::get_mut`], whose guard re-reads the task's state and seq when it is dropped (a
//! task's namespace and parent never change). Reading goes through `Deref` to the map.
//! `queued` counts the tasks in state `Queued` per `(namespace, deployment)` the same way (the
//! `--max-queued-tasks` check).

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;
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
    /// `(seq, task_id)` of every task, by namespace.
    by_namespace: HashMap<String, BTreeSet<(u64, String)>>,
    /// `(seq, task_id)` of every task that has a parent, by parent task id.
    children: HashMap<String, BTreeSet<(u64, String)>>,
}

/// Adds `key` to `map[group]`.
fn index(map: &mut HashMap<String, BTreeSet<(u64, String)>>, group: &str, key: (u64, String)) {
    match map.get_mut(group) {
        Some(set) => {
            set.insert(key);
        }
        None => {
            map.insert(group.to_string(), BTreeSet::from([key]));
        }
    }
}

/// Removes `key` from `map[group]` (and the group once empty).
fn unindex(map: &mut HashMap<String, BTreeSet<(u64, String)>>, group: &str, key: &(u64, String)) {
    if let Some(set) = map.get_mut(group) {
        set.remove(key);
        if set.is_empty() {
            map.remove(group);
        }
    }
}

/// The ids in `set` with a seq below `before` (all of them for `None`), newest first.
fn newest_first(
    set: Option<&BTreeSet<(u64, String)>>,
    before: Option<u64>,
) -> impl Iterator<Item = &str> + '_ {
    let upper = match before {
        Some(seq) => Bound::Excluded((seq, String::new())),
        None => Bound::Unbounded,
    };
    set.into_iter().flat_map(move |set| {
        set.range((Bound::Unbounded, upper.clone()))
            .rev()
            .map(|(_, id)| id.as_str())
    })
}

impl TaskTable {
    /// Adds or replaces a task; returns the one it replaced.
    pub(crate) fn insert(&mut self, task: TaskRec) -> Option<TaskRec> {
        let key = (task.seq, task.task_id.clone());
        let live = !task.state.is_terminal();
        let (namespace, parent) = (task.namespace.clone(), task.parent_task_id.clone());
        count_queued(&mut self.queued, &task, true);
        let old = self.all.insert(task.task_id.clone(), task);
        if let Some(old) = &old {
            self.unindex(old);
        }
        if live {
            self.live.insert(key.clone());
        }
        if !parent.is_empty() {
            index(&mut self.children, &parent, key.clone());
        }
        index(&mut self.by_namespace, &namespace, key);
        old
    }

    pub(crate) fn remove(&mut self, task_id: &str) -> Option<TaskRec> {
        let old = self.all.remove(task_id)?;
        self.unindex(&old);
        Some(old)
    }

    fn unindex(&mut self, old: &TaskRec) {
        let key = (old.seq, old.task_id.clone());
        self.live.remove(&key);
        count_queued(&mut self.queued, old, false);
        unindex(&mut self.by_namespace, &old.namespace, &key);
        if !old.parent_task_id.is_empty() {
            unindex(&mut self.children, &old.parent_task_id, &key);
        }
    }

    /// The tasks of `namespace` submitted before the task with seq `before` (all of them for
    /// `None`), newest first: a walk of the index, as far as the caller reads.
    pub(crate) fn in_namespace(
        &self,
        namespace: &str,
        before: Option<u64>,
    ) -> impl Iterator<Item = &TaskRec> + '_ {
        newest_first(self.by_namespace.get(namespace), before).filter_map(|id| self.all.get(id))
    }

    /// How many tasks `namespace` holds.
    pub(crate) fn count_in_namespace(&self, namespace: &str) -> usize {
        self.by_namespace.get(namespace).map_or(0, BTreeSet::len)
    }

    /// The tasks whose parent is `parent` submitted before `before` (all for `None`), newest
    /// first.
    pub(crate) fn children_of(
        &self,
        parent: &str,
        before: Option<u64>,
    ) -> impl Iterator<Item = &TaskRec> + '_ {
        newest_first(self.children.get(parent), before).filter_map(|id| self.all.get(id))
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
            by_namespace: &mut self.by_namespace,
            children: &mut self.children,
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
    by_namespace: &'a mut HashMap<String, BTreeSet<(u64, String)>>,
    children: &'a mut HashMap<String, BTreeSet<(u64, String)>>,
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
        let (old, new) = (
            (self.was.0, self.task.task_id.clone()),
            (now.0, self.task.task_id.clone()),
        );
        if self.was.1 {
            self.live.remove(&old);
        }
        if now.1 {
            self.live.insert(new.clone());
        }
        if old.0 != new.0 {
            let (namespace, parent) = (&self.task.namespace, &self.task.parent_task_id);
            unindex(self.by_namespace, namespace, &old);
            index(self.by_namespace, namespace, new.clone());
            if !parent.is_empty() {
                unindex(self.children, parent, &old);
                index(self.children, parent, new);
            }
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

    fn ids<'a>(it: impl Iterator<Item = &'a TaskRec>) -> Vec<&'a str> {
        it.map(|t| t.task_id.as_str()).collect()
    }

    #[test]
    fn namespaces_and_parents_list_their_tasks_newest_first_from_any_seq() {
        let in_ns = |id: &str, seq: u64, ns: &str, parent: &str| {
            let mut t = task(id, seq, TaskState::Succeeded);
            t.namespace = ns.into();
            t.parent_task_id = parent.into();
            t
        };
        let mut t: TaskTable = [
            in_ns("a1", 1, "a", ""),
            in_ns("b2", 2, "b", ""),
            in_ns("a3", 3, "a", "a1"),
            in_ns("a4", 4, "a", ""),
            in_ns("a5", 5, "a", "a1"),
        ]
        .into_iter()
        .collect();
        assert_eq!(ids(t.in_namespace("a", None)), ["a5", "a4", "a3", "a1"]);
        assert_eq!(
            ids(t.in_namespace("a", Some(4))),
            ["a3", "a1"],
            "before seq 4"
        );
        assert_eq!(ids(t.in_namespace("a", Some(1))), Vec::<&str>::new());
        assert_eq!(ids(t.in_namespace("nobody", None)), Vec::<&str>::new());
        assert_eq!(
            (t.count_in_namespace("a"), t.count_in_namespace("b")),
            (4, 1)
        );
        assert_eq!(ids(t.children_of("a1", None)), ["a5", "a3"]);
        assert_eq!(ids(t.children_of("a1", Some(5))), ["a3"]);

        // Replaced, removed, or its seq changed in place: every index follows.
        t.insert(in_ns("a3", 6, "a", "a1"));
        assert_eq!(ids(t.in_namespace("a", None)), ["a3", "a5", "a4", "a1"]);
        assert_eq!(ids(t.children_of("a1", None)), ["a3", "a5"]);
        t.get_mut("a5").expect("a5").seq = 7;
        assert_eq!(ids(t.in_namespace("a", None)), ["a5", "a3", "a4", "a1"]);
        assert_eq!(ids(t.children_of("a1", None)), ["a5", "a3"]);
        t.remove("a5");
        t.remove("b2");
        assert_eq!(ids(t.in_namespace("a", None)), ["a3", "a4", "a1"]);
        assert_eq!(ids(t.children_of("a1", None)), ["a3"]);
        assert_eq!(t.count_in_namespace("b"), 0);
        assert!(
            !t.by_namespace.contains_key("b"),
            "an empty namespace leaves the index"
        );
    }
}
