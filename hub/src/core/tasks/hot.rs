//! The hot path of run events: activity, model, tool and progress events of a started run
//! move nothing but what its task is doing. A batch's run of them changes the tasks in memory
//! at once and is written with plain ordered store writes ([`crate::store::Db::append_hot_run_events`]:
//! each run event right after the task event that records it, no atomic write, so no log
//! buffer sealed per batch), and only then do watchers hear of it.
//!
//! Invariants: the group is written before any other event of the batch (the store keeps a
//! run's events in seq order) and before the batch's acks are held; a write that fails puts
//! back what the group changed in memory (the store is then broken, and healing it reloads the
//! tasks from what it holds); an event already stored, or already in the group, is not added
//! again (a resend writes nothing). After a crash the store holds a prefix of the writes, so a
//! stored run event always has its task event; a task event may have been stored without its
//! run event, which its Nest then resends (it was never acked): the task remembers the run
//! event its newest task event records (`TaskRec::last_event_source`), and that resend writes
//! the run event alone instead of recording it twice.
//!
//! Whether an event is stored already is known without asking the store while its lease counts
//! what is stored (`LeaseRec::stored_through`: exact from the attempt's start, since attempts
//! are never reused and every append of a current attempt passes through `Core::run_events`
//! under the lock); the count moves as an event joins a group and becomes unknown when a
//! group's write fails.

use std::collections::HashSet;
use std::sync::Arc;

use agen_contract::run::{kind, RunEventBody};

use crate::core::{Core, State};
use crate::error::Result;
use crate::model::*;

/// The hot events of a batch not yet written, with what they changed in memory.
#[derive(Default)]
pub(super) struct HotGroup {
    /// Each run event with its task event (`None`: stored already, before a crash).
    writes: Vec<(RunEventRec, Option<TaskEventRec>)>,
    keys: HashSet<(String, u32, u64)>,
    updates: Vec<Arc<TaskUpdate>>,
    /// Each changed task as it was before the group's first change to it.
    before: Vec<(String, Before)>,
}

/// The fields a hot event changes on its task.
struct Before {
    activity: String,
    progress: Option<ProgressRec>,
    updated_at_ms: i64,
    next_event_seq: u64,
    last_event_source: Option<RunEventRef>,
}

impl HotGroup {
    /// Whether `e` is in the group already.
    pub(super) fn holds(&self, e: &RunEventRec) -> bool {
        self.keys.contains(&(e.run_id.clone(), e.attempt, e.seq))
    }

    /// Adds an event (not stored yet) and applies its change to its task in memory.
    pub(super) fn push(&mut self, st: &mut State, e: RunEventRec, hot: HotChange) {
        self.keys.insert((e.run_id.clone(), e.attempt, e.seq));
        let Some(mut task) = st.tasks.get_mut(&hot.event_task_id) else {
            self.writes.push((e, Some(hot.event)));
            return;
        };
        // Counted as stored now: a failed write makes the count unknown (`write`).
        task.lease.stored(e.seq);
        if task.last_event_source.as_ref() == hot.event.source.as_ref() {
            // Its task event was stored just before a crash, its run event was not: the Nest
            // resent it, and only the run event is written now.
            self.writes.push((e, None));
            return;
        }
        self.writes.push((e, Some(hot.event.clone())));
        if !self.before.iter().any(|(id, _)| *id == hot.event_task_id) {
            self.before.push((
                hot.event_task_id.clone(),
                Before {
                    activity: task.activity.clone(),
                    progress: task.progress.clone(),
                    updated_at_ms: task.updated_at_ms,
                    next_event_seq: task.next_event_seq,
                    last_event_source: task.last_event_source.clone(),
                },
            ));
        }
        if let Some(activity) = hot.activity {
            task.activity = activity;
        }
        if let Some(progress) = hot.progress {
            task.progress = Some(progress);
        }
        task.updated_at_ms = hot.event.at_ms;
        task.next_event_seq = hot.event.seq + 1;
        task.last_event_source = hot.event.source.clone();
        self.updates.push(Arc::new(TaskUpdate {
            body: hot.body,
            task_id: hot.event_task_id,
            event: hot.event,
            task: task.clone(),
        }));
    }

    /// Writes the group (in order, see the module doc) and tells watchers; on failure puts the tasks back
    /// as they were. Empty afterwards either way.
    pub(super) fn write(&mut self, core: &Core, st: &mut State) -> Result<()> {
        if self.writes.is_empty() {
            return Ok(());
        }
        let written = core.db.append_hot_run_events(&self.writes);
        let group = std::mem::take(self);
        match written {
            Ok(()) => {
                for update in group.updates {
                    core.publish(update);
                }
                Ok(())
            }
            Err(e) => {
                // Some of the writes may have happened: which are stored is unknown now.
                for (ev, _) in &group.writes {
                    if let Some(mut task) = st.tasks.get_mut(&ev.task_id) {
                        task.lease.forget_stored();
                    }
                }
                for (task_id, before) in group.before {
                    if let Some(mut task) = st.tasks.get_mut(&task_id) {
                        task.activity = before.activity;
                        task.progress = before.progress;
                        task.updated_at_ms = before.updated_at_ms;
                        task.next_event_seq = before.next_event_seq;
                        task.last_event_source = before.last_event_source;
                    }
                }
                Err(e.into())
            }
        }
    }
}

/// What a hot run event changes on its task, with the task event that records it.
pub(super) struct HotChange {
    event_task_id: String,
    /// Whether the event is stored already, when its lease knows (`LeaseRec::knows_stored`).
    pub(super) known_stored: Option<bool>,
    activity: Option<String>,
    progress: Option<ProgressRec>,
    event: TaskEventRec,
    /// The body, read once here for every follower of the update.
    body: Option<Arc<RunEventBody>>,
}

/// The change a run event makes when it is on the hot path: its task runs this very attempt,
/// has started (its lease record already says so) and the event moves nothing but what the task
/// is doing. `None` for every other event (state changes, approvals, the run's end, the first
/// event of an attempt), which take the full path.
pub(super) fn hot_change(st: &State, e: &RunEventRec) -> Option<HotChange> {
    let task = st.tasks.get(&e.task_id)?;
    if task.run_id != e.run_id
        || task.attempt != e.attempt
        || task.state != TaskState::Running
        || !task.lease.started
        || task.lease.missing_since_ms != 0
        || task.lease.revoked
    {
        return None;
    }
    let body = RunEventBody::from_wire(&e.kind, &e.json);
    let (activity, progress) = match &body {
        Ok(RunEventBody::TaskProgress(p) | RunEventBody::ProgressLatest(p)) => (
            None,
            Some(ProgressRec {
                step: p.step.clone(),
                done: p.done,
                total: p.total,
                note: p.note.clone().unwrap_or_default(),
                artifacts: p.artifacts.clone(),
                updated_at_ms: e.at_ms,
            }),
        ),
        Ok(
            RunEventBody::ApprovalRequested(_)
            | RunEventBody::ApprovalDecided(_)
            | RunEventBody::RunInterrupted(_)
            | RunEventBody::RunSuspended(_)
            | RunEventBody::RunFinished(_),
        ) => return None,
        Err(_) if e.kind == kind::RUN_FINISHED => return None,
        Ok(body) => (body.activity().map(|a| a.into_owned()), None),
        Err(_) => (None, None),
    };
    let now = now_ms();
    let mut snapshot = TaskSnapshot::of(task);
    if let Some(a) = &activity {
        snapshot.activity = a.clone();
    }
    if let Some(p) = &progress {
        snapshot.progress = Some(p.clone());
    }
    snapshot.updated_at_ms = now;
    Some(HotChange {
        event_task_id: task.task_id.clone(),
        known_stored: task.lease.knows_stored(e.seq),
        activity,
        progress,
        event: TaskEventRec {
            seq: task.next_event_seq.max(1),
            at_ms: now,
            kind: e.kind.clone(),
            json: e.json.clone(),
            snapshot: Some(snapshot),
            source: Some(RunEventRef::of(e)),
        },
        body: body.ok().map(Arc::new),
    })
}
