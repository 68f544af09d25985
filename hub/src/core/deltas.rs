//! Streamed model answers on their way to watchers: the pieces a Nest relays for the runs it
//! holds ([`Core::relay_deltas`]) go out on a channel per task ([`Core::subscribe_deltas`]),
//! never through the store or the task-update broadcast.
//!
//! Invariants: a piece is taken only from the Nest that holds the task's current, unrevoked
//! lease, for that run and attempt; nothing here is durable (a Hub restart forgets it all); a
//! turn that was cut off and is asked again (a later attempt asking a turn at or before the
//! last one streamed, or the provider's own retry) is preceded by a reset, so the text after
//! a turn's last reset is its `model.answered`; each task keeps the current turn's text (at
//! most [`KEPT_BYTES`]) so that a watcher who comes late starts with it, and forgets all when
//! the task ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agen_contract::run::TurnDelta;
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};
use tokio::time::Instant;

use crate::core::Core;
use crate::model::TaskState;

/// Frames a watcher may fall behind by before it starts again from the turn's text.
const CAPACITY: usize = 1024;
/// The current turn's text kept per task for late watchers.
pub const KEPT_BYTES: usize = 1 << 20;

/// A piece from a Nest.
#[derive(Debug, Clone, PartialEq)]
pub struct DeltaIn {
    pub run_id: String,
    pub task_id: String,
    pub delta: TurnDelta,
}

#[derive(Default)]
pub(crate) struct Deltas(Mutex<HashMap<String, TaskStream>>);

struct TaskStream {
    tx: broadcast::Sender<Arc<TurnDelta>>,
    /// The current turn and its text so far (`None` before the first piece or after a reset).
    current: Option<TurnDelta>,
    /// The current turn's text outgrew [`KEPT_BYTES`]: a late watcher gets no beginning.
    overflow: bool,
}

impl Deltas {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, TaskStream>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies one piece: the frames it makes (a reset first when it asks a cut turn again).
    fn apply(&self, task_id: &str, d: TurnDelta) {
        let mut map = self.lock();
        let s = map
            .entry(task_id.to_string())
            .or_insert_with(|| TaskStream {
                tx: broadcast::channel(CAPACITY).0,
                current: None,
                overflow: false,
            });
        let frame = match &mut s.current {
            Some(cur) if cur.continues_with(&d) => {
                if s.overflow || cur.text.len() + d.text.len() > KEPT_BYTES {
                    s.overflow = true;
                    cur.text.clear();
                } else {
                    cur.text.push_str(&d.text);
                }
                d
            }
            Some(cur) => {
                let cut = d.reset
                    || (d.attempt != cur.attempt && d.turn <= cur.turn)
                    || (d.attempt == cur.attempt && d.turn < cur.turn);
                let frame = TurnDelta { reset: cut, ..d };
                s.current = Some(frame.clone());
                s.overflow = false;
                frame
            }
            None => {
                s.current = Some(d.clone());
                s.overflow = false;
                d
            }
        };
        if frame.reset || !frame.text.is_empty() {
            let _ = s.tx.send(Arc::new(frame));
        }
    }

    /// Forgets an ended task (its watchers' channel closes).
    pub(crate) fn forget(&self, task_id: &str) {
        self.lock().remove(task_id);
    }
}

impl Core {
    /// Relays the pieces `nest_id` sent for the runs it holds now; drops the others.
    pub fn relay_deltas(&self, nest_id: &str, deltas: Vec<DeltaIn>) {
        let allowed: Vec<DeltaIn> = {
            let st = self.lock();
            deltas
                .into_iter()
                .filter(|d| {
                    st.tasks.get(&d.task_id).is_some_and(|t| {
                        t.state == TaskState::Running
                            && t.run_id == d.run_id
                            && t.attempt == d.delta.attempt
                            && !t.lease.revoked
                            && t.lease.nest_id == nest_id
                    })
                })
                .collect()
        };
        for d in allowed {
            self.deltas.apply(&d.task_id, d.delta);
        }
    }

    /// Subscribes to `task_id`'s streamed pieces: the current turn's text so far as a reset
    /// frame (when there is any and it was kept whole), then the live frames.
    pub fn subscribe_deltas(
        &self,
        task_id: &str,
    ) -> (Option<TurnDelta>, broadcast::Receiver<Arc<TurnDelta>>) {
        let mut map = self.deltas.lock();
        let s = map
            .entry(task_id.to_string())
            .or_insert_with(|| TaskStream {
                tx: broadcast::channel(CAPACITY).0,
                current: None,
                overflow: false,
            });
        let start = s
            .current
            .as_ref()
            .filter(|c| !s.overflow && !c.text.is_empty())
            .map(|c| TurnDelta {
                reset: true,
                ..c.clone()
            });
        (start, s.tx.subscribe())
    }

    /// Whether `task_id` still streams (a subscription made after its end would never close).
    pub fn forget_deltas_if_ended(&self, task_id: &str, state: TaskState) {
        if state.is_terminal() {
            self.deltas.forget(task_id);
        }
    }
}

/// At most one frame per turn this often (see [`DeltaFollower`]).
pub const EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// One watcher's frames of a task, coalesced: at most one frame per turn every [`EVERY`]; a
/// watcher that fell behind starts again from the turn's text (a reset frame carrying it),
/// never with a gap; [`DeltaFollower::drain`] takes what arrived so far at once (before a
/// durable event goes out, so a turn's text precedes its `model.answered`).
fn merge(pending: &mut Vec<TurnDelta>, d: TurnDelta) {
    match pending.last_mut() {
        Some(last) if last.continues_with(&d) => last.text.push_str(&d.text),
        // A reset voids what is pending of its turn and later ones.
        Some(_) if d.reset => {
            pending.retain(|p| p.turn < d.turn && p.attempt == d.attempt);
            pending.push(d);
        }
        _ => pending.push(d),
    }
}

pub struct DeltaFollower {
    core: Arc<Core>,
    task_id: String,
    rx: Option<broadcast::Receiver<Arc<TurnDelta>>>,
    pending: Vec<TurnDelta>,
    next_at: Instant,
}

impl DeltaFollower {
    /// Follows `task_id`'s frames when `on`; else [`DeltaFollower::next`] never resolves.
    pub fn new(core: &Arc<Core>, task_id: &str, on: bool) -> DeltaFollower {
        let (start, rx) = if on {
            let (start, rx) = core.subscribe_deltas(task_id);
            (start, Some(rx))
        } else {
            (None, None)
        };
        DeltaFollower {
            core: core.clone(),
            task_id: task_id.to_string(),
            rx,
            pending: start.into_iter().collect(),
            next_at: Instant::now(),
        }
    }

    fn take(&mut self) -> Vec<TurnDelta> {
        self.next_at = Instant::now() + EVERY;
        self.pending.drain(..).collect()
    }

    /// The frames due next: waits for a piece, then until [`EVERY`] after the last frames,
    /// taking every piece that arrives meanwhile. Never resolves when off or closed with
    /// nothing pending.
    pub async fn next(&mut self) -> Vec<TurnDelta> {
        loop {
            if !self.pending.is_empty() && Instant::now() >= self.next_at {
                return self.take();
            }
            let Some(rx) = self.rx.as_mut() else {
                if self.pending.is_empty() {
                    return std::future::pending().await;
                }
                tokio::time::sleep_until(self.next_at).await;
                continue;
            };
            let due = (!self.pending.is_empty()).then_some(self.next_at);
            let got = tokio::select! {
                r = rx.recv() => Some(r),
                _ = async {
                    match due {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => None,
            };
            match got {
                Some(Ok(d)) => merge(&mut self.pending, (*d).clone()),
                Some(Err(RecvError::Lagged(_))) => self.restart(),
                Some(Err(RecvError::Closed)) => self.rx = None,
                None => {}
            }
        }
    }

    /// Every frame taken so far, at once (before a durable event).
    pub fn drain(&mut self) -> Vec<TurnDelta> {
        while let Some(rx) = self.rx.as_mut() {
            match rx.try_recv() {
                Ok(d) => merge(&mut self.pending, (*d).clone()),
                Err(TryRecvError::Lagged(_)) => {
                    self.restart();
                    break;
                }
                Err(TryRecvError::Closed) => self.rx = None,
                Err(TryRecvError::Empty) => break,
            }
        }
        if self.pending.is_empty() {
            return Vec::new();
        }
        self.take()
    }

    /// Fell behind: starts again from the turn's text as the Hub keeps it.
    fn restart(&mut self) {
        let (start, rx) = self.core.subscribe_deltas(&self.task_id);
        self.rx = Some(rx);
        self.pending.clear();
        self.pending.extend(start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(attempt: u32, turn: u32, text: &str, reset: bool) -> TurnDelta {
        TurnDelta {
            attempt,
            turn,
            text: text.into(),
            reset,
        }
    }

    fn frames(rx: &mut broadcast::Receiver<Arc<TurnDelta>>) -> Vec<TurnDelta> {
        let mut out = Vec::new();
        while let Ok(f) = rx.try_recv() {
            out.push((*f).clone());
        }
        out
    }

    #[test]
    fn a_turn_asked_again_by_a_later_attempt_is_reset_and_a_next_turn_is_not() {
        let ds = Deltas::default();
        ds.apply("t", d(1, 1, "x", false));
        let (start, mut rx) = {
            let mut map = ds.lock();
            let s = map.get_mut("t").expect("stream");
            (s.current.clone(), s.tx.subscribe())
        };
        assert_eq!(start, Some(d(1, 1, "x", false)));
        ds.apply("t", d(1, 1, "yz", false));
        ds.apply("t", d(1, 2, "next", false));
        ds.apply("t", d(2, 2, "again", false));
        ds.apply("t", d(2, 2, "", true));
        ds.apply("t", d(2, 2, "b", false));
        ds.apply("t", d(2, 3, "c", false));
        assert_eq!(
            frames(&mut rx),
            vec![
                d(1, 1, "yz", false),
                d(1, 2, "next", false),
                d(2, 2, "again", true),
                d(2, 2, "", true),
                d(2, 2, "b", false),
                d(2, 3, "c", false),
            ]
        );
        ds.forget("t");
        assert!(matches!(
            rx.try_recv(),
            Err(broadcast::error::TryRecvError::Closed)
        ));
    }
}
