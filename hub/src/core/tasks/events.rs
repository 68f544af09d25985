//! Run events from Nests: fenced by the lease, appended if absent, then applied to the task.

use std::collections::BTreeMap;
use std::sync::Arc;

use agen_contract::run::{kind, RunEventBody, RunState};

use crate::core::leases;
use crate::core::leases::Requeue;
use crate::core::{Core, State};
use crate::error::{HubError, Result};
use crate::nodes::ToNest;
use crate::store::{Append, Table};

use super::hot::{hot_change, HotGroup};
use super::*;

impl Core {
    /// Stores a batch of run events that `nest_id` relayed from `instance_id`
    /// (append-if-absent, fenced) and updates tasks; the acknowledgements (one per run
    /// attempt) leave for the Nest once a flush covers them (`core::commit`: at once when an
    /// event of the batch is waited for, else lazily), so the caller goes on reading. An event
    /// not from the lease's Nest and instance, for its run and attempt, is refused: never
    /// stored, it moves nothing, and its ack says `fenced` so that the sender stops.
    pub fn run_events(
        self: &Arc<Self>,
        nest_id: &str,
        instance_id: &str,
        events: Vec<IncomingRunEvent>,
    ) -> Result<()> {
        let mut acks: BTreeMap<(String, u32), (u64, bool)> = BTreeMap::new();
        let waited_for = events.iter().any(|e| e.sync);
        // Only an event that moves a task's state (not activity, model, tool or progress
        // events of a started run) gives the reconcile loop something to do.
        let mut moved = false;
        {
            let mut st = self.lock();
            let mut refused: Option<(usize, String)> = None;
            let mut hot = HotGroup::default();
            for e in events {
                if let Err(why) = leases::owner_check(&st, nest_id, instance_id, &e) {
                    acks.entry((e.run_id.clone(), e.attempt))
                        .or_insert((0, false))
                        .1 = true;
                    let r = refused.get_or_insert((0, why));
                    r.0 += 1;
                    continue;
                }
                let rec = RunEventRec {
                    run_id: e.run_id.clone(),
                    attempt: e.attempt,
                    seq: e.seq,
                    task_id: e.task_id.clone(),
                    at_ms: if e.at_ms == 0 { now_ms() } else { e.at_ms },
                    kind: e.kind.clone(),
                    json: e.json.clone(),
                };
                // The hot path (activity, model, tool, progress events of a started run): the
                // task changes in memory now, and the run events with their task events are
                // written together, one atomic write for the run of them; the task record is
                // not rewritten (`Core::open` derives it from its newest task event).
                if let Some(h) = hot_change(&st, &rec) {
                    let stored = match h.known_stored {
                        Some(stored) => stored,
                        None => {
                            hot.holds(&rec)
                                || self.db.has_run_event(&rec.run_id, rec.attempt, rec.seq)?
                        }
                    };
                    if !stored {
                        hot.push(&mut st, rec, h);
                    }
                    let entry = acks
                        .entry((e.run_id.clone(), e.attempt))
                        .or_insert((0, false));
                    entry.0 = entry.0.max(e.seq);
                    continue;
                }
                // Every other event in order: the hot ones before it are written first.
                hot.write(self, &mut st)?;
                let entry = acks
                    .entry((e.run_id.clone(), e.attempt))
                    .or_insert((0, false));
                let appended = self.db.append_run_event(&rec);
                if let Some(mut task) = st.tasks.get_mut(&rec.task_id) {
                    match appended {
                        Ok(Append::Appended) => task.lease.stored(rec.seq),
                        Ok(Append::Duplicate | Append::Fenced) => {}
                        Err(_) => task.lease.forget_stored(),
                    }
                }
                match appended? {
                    Append::Fenced => entry.1 = true,
                    Append::Duplicate => entry.0 = entry.0.max(e.seq),
                    Append::Appended => {
                        entry.0 = entry.0.max(e.seq);
                        moved = true;
                        self.apply_run_event(&mut st, &rec)?
                    }
                }
            }
            hot.write(self, &mut st)?;
            if let Some((n, why)) = refused {
                tracing::warn!(
                    nest_id,
                    instance = instance_id,
                    refused = n,
                    "run events refused: {why}"
                );
            }
            // Held until a flush covering the writes above ends (`core::commit`).
            for ((run_id, attempt), (acked_seq, fenced)) in acks {
                let ack = ToNest::Ack {
                    run_id,
                    attempt,
                    acked_seq,
                    fenced,
                };
                st.live.send_durable(nest_id, ack);
            }
        }
        self.commit_soon(waited_for);
        if moved {
            self.poke();
        }
        Ok(())
    }

    pub(in crate::core) fn apply_run_event(&self, st: &mut State, e: &RunEventRec) -> Result<()> {
        let Some(task) = st.tasks.get(&e.task_id).cloned() else {
            return Ok(());
        };
        // A queued task's run was interrupted: late events of that attempt are kept in the log
        // (the next attempt replays them) but no longer move the task.
        if task.run_id != e.run_id
            || task.attempt != e.attempt
            || task.state.is_terminal()
            || task.state == TaskState::Queued
            || task.suspended.is_some()
        {
            return Ok(());
        }
        let mut task = task;
        task.lease.started = true;
        task.lease.missing_since_ms = 0;
        let body = RunEventBody::from_wire(&e.kind, &e.json);
        if let Some(activity) = body.as_ref().ok().and_then(RunEventBody::activity) {
            task.activity = activity.into_owned();
        }
        match &body {
            Ok(RunEventBody::ApprovalRequested(asked)) => {
                self.approval_requested(st, &mut task, asked)?
            }
            Ok(RunEventBody::ApprovalDecided(d)) => self.approval_decided(&mut task, d)?,
            Ok(RunEventBody::TaskProgress(p) | RunEventBody::ProgressLatest(p)) => {
                task.progress = Some(ProgressRec {
                    step: p.step.clone(),
                    done: p.done,
                    total: p.total,
                    note: p.note.clone().unwrap_or_default(),
                    artifacts: p.artifacts.clone(),
                    updated_at_ms: e.at_ms,
                });
            }
            Ok(RunEventBody::RunInterrupted(interrupted)) => {
                // The instance cannot finish the run: resume it elsewhere (or on its restart).
                // When the instance itself failed it is marked unhealthy first, so that the
                // retry does not go back to it before it says it is well again.
                let cause = leases::requeue_cause(interrupted);
                if cause == Requeue::InstanceFailed {
                    self.instance_failed(st, &task.lease.instance_id, &interrupted.reason)?;
                }
                self.emit(st, task.clone(), &e.kind, e.json.clone())?;
                let task = st.tasks.get(&task.task_id).cloned().unwrap_or(task);
                let why = if interrupted.reason.is_empty() {
                    "the instance process died"
                } else {
                    interrupted.reason.as_str()
                };
                return self.requeue_task(st, task, why, cause);
            }
            Ok(RunEventBody::RunSuspended(s)) => {
                // The event itself first, then the wait without a slot.
                self.emit(st, task.clone(), &e.kind, e.json.clone())?;
                let task = st.tasks.get(&task.task_id).cloned().unwrap_or(task);
                return self.suspend_run(st, task, s);
            }
            Ok(RunEventBody::RunFinished(f)) => {
                // The run event itself first, then the terminal state.
                self.emit(st, task.clone(), &e.kind, e.json.clone())?;
                let task = st.tasks.get(&task.task_id).cloned().unwrap_or(task);
                let state = match (f.state, task.cancel_requested_at_ms > 0) {
                    (RunState::Cancelled, _) | (_, true) => TaskState::Cancelled,
                    (RunState::Succeeded, false) => TaskState::Succeeded,
                    (RunState::Failed, false) => TaskState::Failed,
                };
                let error = if state == TaskState::Cancelled {
                    task.cancel_reason.clone()
                } else {
                    String::new()
                };
                // A rolled-back run leaves only a note of its completed side effects.
                let note: Vec<_>;
                let messages = if task.rolled_back {
                    note = self.rollback_note(&task, &f.messages).into_iter().collect();
                    &note
                } else {
                    &f.messages
                };
                if !messages.is_empty() && !task.conversation_id.is_empty() {
                    let mut conv: ConversationRec = self
                        .db
                        .get_json(Table::Conversations, &task.conversation_id)?
                        .unwrap_or_default();
                    for m in messages {
                        conv.messages.push(
                            serde_json::to_value(m)
                                .map_err(|e| HubError::Internal(e.to_string()))?,
                        );
                    }
                    self.db
                        .put_json(Table::Conversations, &task.conversation_id, &conv)?;
                }
                if task.budget.deadline_exceeded {
                    // The deadline timer cancelled the run: the task failed, whatever the run
                    // managed to say as it stopped.
                    return self.finish_cancelled(st, task);
                }
                let response_type = f.response_type.as_str();
                return self.finish_task(st, task, state, &f.result, response_type, &error);
            }
            Err(wrong) if e.kind == kind::RUN_FINISHED => {
                // The owner's last word cannot be read: the run is over all the same.
                self.emit(st, task.clone(), &e.kind, e.json.clone())?;
                let task = st.tasks.get(&task.task_id).cloned().unwrap_or(task);
                let error = format!("the run's run.finished event could not be read: {wrong}");
                return self.finish_task(st, task, TaskState::Failed, &error, "error", &error);
            }
            _ => {}
        }
        self.emit(st, task, &e.kind, e.json.clone())
    }
}
