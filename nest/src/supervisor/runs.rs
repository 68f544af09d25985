//! Runs handed to instances: assign (queued while the instance connects, deferred behind an
//! older attempt), cancel, fence, approvals and acks delivered, and the one `run.interrupted` a
//! run gets when its instance can no longer finish it.

use tokio::sync::mpsc;

use crate::model::{AssignedRun, RunEvent};
use crate::socket::{RunOrder, ToInstance};
use agen_contract::run::{RunEventBody, RunInterrupted};

use super::*;

impl Supervisor {
    /// Forwards a run assignment to its instance (queued while the instance is not connected).
    /// A newer attempt of a run this Nest still holds replaces the older one: the older one
    /// is cancelled and relays nothing more; on the same instance the newer one is handed over
    /// once the older one is done.
    pub fn assign(&self, a: AssignedRun) {
        let id = a.instance_id.0.clone();
        let run_id = a.run_id.0.clone();
        let track = RunTrack {
            instance: id.clone(),
            attempt: a.attempt.0,
            task_id: a.task_id.0.clone(),
            last_seq: 0,
        };
        let msg = ToInstance::Run(RunOrder::from(a));
        let mut st = self.lock();
        if !st.instances.contains_key(&id) {
            drop(st);
            let why = format!("instance {id} is not running on nest {}", self.opts.name);
            tracing::warn!(run = %run_id, "{why}; the run fails");
            self.interrupt_run(&run_id, &track, "not_here", &why);
            return;
        }
        let older = st
            .runs
            .get(&run_id)
            .map(|t| (t.instance.clone(), t.attempt));
        if let Some((_, attempt)) = &older {
            if *attempt >= track.attempt {
                tracing::debug!(run = %run_id, attempt = track.attempt, "an attempt this old or older is already here; assignment ignored");
                return;
            }
        }
        st.runs.insert(run_id.clone(), track);
        if let Some((old_instance, old_attempt)) = older {
            tracing::info!(run = %run_id, old_attempt, "a newer attempt replaces the one still here");
            if let Some(e) = st.instances.get_mut(&old_instance) {
                fence_on(
                    e,
                    &run_id,
                    old_attempt,
                    "a newer attempt of the run was assigned",
                );
            }
            if old_instance == id {
                // The instance's next report carries the run (`with_runs`).
                st.deferred.insert(run_id, msg);
                return;
            }
        }
        if let Some(e) = st.instances.get_mut(&id) {
            e.report.active_runs.push(run_id.clone());
            send_or_queue(e, msg);
        }
        // Not reported on its own: the instance reports as it starts the run, and that
        // report (like every heartbeat) carries the run and its attempt (`with_runs`).
    }

    /// The Hub has been silent too long: every run here is cancelled at once and relays
    /// nothing more, and each ends with a `run.interrupted` (cause `nest_fenced`) that the
    /// Hub receives when the link is back (if it has not re-dispatched the run already).
    /// Returns how many runs were fenced.
    pub fn fence_all(&self, why: &str) -> usize {
        let runs: Vec<(String, RunTrack)> = {
            let mut st = self.lock();
            let runs: Vec<(String, RunTrack)> = st.runs.drain().collect();
            st.deferred.clear();
            for (run_id, t) in &runs {
                if let Some(e) = st.instances.get_mut(&t.instance) {
                    fence_on(e, run_id, t.attempt, why);
                    e.report.active_runs.retain(|r| r != run_id);
                }
            }
            let ids: std::collections::BTreeSet<String> =
                runs.iter().map(|(_, t)| t.instance.clone()).collect();
            for id in &ids {
                self.report(&st, id);
            }
            runs
        };
        for (run_id, track) in &runs {
            self.interrupt_run(run_id, track, "nest_fenced", why);
        }
        if !runs.is_empty() {
            tracing::warn!(runs = runs.len(), "{why}: cancelled every run here");
        }
        runs.len()
    }

    /// Cancels a run (the instance cancels its token: model request and tool calls stop).
    pub fn cancel(&self, run_id: &str, instance_id: &str, reason: &str) {
        let mut st = self.lock();
        let id = st
            .runs
            .get(run_id)
            .map(|t| t.instance.clone())
            .unwrap_or_else(|| instance_id.to_string());
        if let Some(e) = st.instances.get_mut(&id) {
            send_or_queue(
                e,
                ToInstance::Cancel {
                    run_id: run_id.to_string(),
                    reason: reason.to_string(),
                },
            );
        }
    }

    /// Asks a run to stop at its next safe point (double texting `interrupt`): the instance
    /// tells its harness, which ends the run cancelled before its next model turn.
    pub fn interrupt(&self, run_id: &str, instance_id: &str) {
        let mut st = self.lock();
        let id = st
            .runs
            .get(run_id)
            .map(|t| t.instance.clone())
            .unwrap_or_else(|| instance_id.to_string());
        if let Some(e) = st.instances.get_mut(&id) {
            send_or_queue(
                e,
                ToInstance::Interrupt {
                    run_id: run_id.to_string(),
                },
            );
        }
    }

    /// Relays the Hub's decision about an `ask` call to the instance running the run (queued
    /// while the instance is not connected).
    pub fn deliver_approval(
        &self,
        run_id: &str,
        instance_id: &str,
        decided: agen_contract::run::ApprovalDecided,
    ) {
        let mut st = self.lock();
        let id = st
            .runs
            .get(run_id)
            .map(|t| t.instance.clone())
            .unwrap_or_else(|| instance_id.to_string());
        if let Some(e) = st.instances.get_mut(&id) {
            send_or_queue(
                e,
                ToInstance::ApprovalDecided {
                    run_id: run_id.to_string(),
                    decided,
                },
            );
        }
    }

    /// Relays the Hub's ack of a run's events to the instance running it. A fenced attempt is
    /// no run of this Nest's any more: forgotten at once (a stopping Nest does not wait for
    /// it; the instance ends it when the fenced ack reaches it).
    pub fn deliver_ack(&self, run_id: &str, attempt: u32, acked_seq: u64, fenced: bool) {
        let mut st = self.lock();
        let Some(instance) = st.runs.get(run_id).map(|t| t.instance.clone()) else {
            return;
        };
        if fenced && st.runs.get(run_id).is_some_and(|t| t.attempt == attempt) {
            st.runs.remove(run_id);
            if let Some(e) = st.instances.get_mut(&instance) {
                e.report.active_runs.retain(|r| r != run_id);
            }
            self.report(&st, &instance);
        }
        let Some(e) = st.instances.get(&instance) else {
            return;
        };
        if let Some((_, tx)) = &e.conn {
            let _ = tx.send(ToInstance::Ack {
                run_id: run_id.to_string(),
                attempt,
                acked_seq,
                fenced,
            });
        }
    }

    pub(super) fn drop_runs_of(&self, id: &str) -> Vec<(String, RunTrack)> {
        let mut st = self.lock();
        let ids: Vec<String> = st
            .runs
            .iter()
            .filter(|(_, t)| t.instance == id)
            .map(|(r, _)| r.clone())
            .collect();
        for r in &ids {
            st.deferred.remove(r);
        }
        ids.into_iter()
            .filter_map(|r| st.runs.remove(&r).map(|t| (r, t)))
            .collect()
    }

    /// Reports a run its instance can no longer finish (the process died, the instance was
    /// stopped, or it is not here): a final `run.interrupted` (`{reason}`) after the last event
    /// the instance sent. The Hub re-dispatches the run (same run id, attempt + 1, its events
    /// to replay, at most 3 attempts), so the task resumes instead of failing or hanging.
    pub(super) fn interrupt_run(&self, run_id: &str, track: &RunTrack, cause: &str, why: &str) {
        let event = RunEvent {
            run_id: run_id.to_string(),
            attempt: track.attempt,
            seq: track.last_seq + 1,
            task_id: track.task_id.clone(),
            at_ms: chrono::Utc::now().timestamp_millis(),
            body: RunEventBody::RunInterrupted(RunInterrupted {
                reason: why.to_string(),
                cause: cause.to_string(),
            }),
            sync: true,
        };
        self.outbox.push(&track.instance, event);
    }
}

/// Tells the instance of `e` to stop an attempt at once: cancelled, and fenced so that it
/// waits for no ack.
pub(super) fn fence_on(e: &mut Entry, run_id: &str, attempt: u32, why: &str) {
    send_or_queue(
        e,
        ToInstance::Cancel {
            run_id: run_id.to_string(),
            reason: why.to_string(),
        },
    );
    if let Some((_, tx)) = &e.conn {
        let _ = tx.send(ToInstance::Ack {
            run_id: run_id.to_string(),
            attempt,
            acked_seq: 0,
            fenced: true,
        });
    }
}

pub(super) fn send_or_queue(e: &mut Entry, msg: ToInstance) {
    match &e.conn {
        Some((_, tx)) => {
            if let Err(mpsc::error::SendError(msg)) = tx.send(msg) {
                e.queued.push(msg);
            }
        }
        None => e.queued.push(msg),
    }
}
