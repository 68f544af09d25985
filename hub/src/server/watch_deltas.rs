//! A `WatchTask` watcher's streamed frames (`WatchTaskRequest.deltas`): the task's pieces from
//! [`Core::subscribe_deltas`], coalesced so that a watcher gets at most one frame per turn
//! every [`EVERY`].
//!
//! Invariants: frames go out in the order the Hub took them; a watcher that fell behind starts
//! again from the turn's text (a reset frame carrying it), never with a gap; before a durable
//! event goes out, every frame taken so far goes first ([`DeltaFollower::drain`]), so a turn's
//! text precedes its `model.answered` and the task's end.

use std::sync::Arc;
use std::time::Duration;

use agen_proto::v1 as pb;
use agen_shared::run::TurnDelta;
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};
use tokio::time::Instant;

use super::convert;
use crate::core::Core;

/// At most one frame per turn this often.
pub const EVERY: Duration = Duration::from_millis(50);

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

/// Sends `frames` in order; false when the watcher is gone.
pub(super) async fn send(
    tx: &tokio::sync::mpsc::Sender<Result<pb::TaskEvent, tonic::Status>>,
    frames: Vec<pb::TaskEvent>,
) -> bool {
    for f in frames {
        if tx.send(Ok(f)).await.is_err() {
            return false;
        }
    }
    true
}

pub(super) struct DeltaFollower {
    core: Arc<Core>,
    task_id: String,
    rx: Option<broadcast::Receiver<Arc<TurnDelta>>>,
    pending: Vec<TurnDelta>,
    next_at: Instant,
}

impl DeltaFollower {
    /// Follows `task_id`'s frames when `on`; else [`DeltaFollower::next`] never resolves.
    pub(super) fn new(core: &Arc<Core>, task_id: &str, on: bool) -> DeltaFollower {
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

    fn take(&mut self) -> Vec<pb::TaskEvent> {
        self.next_at = Instant::now() + EVERY;
        self.pending
            .drain(..)
            .map(|d| convert::delta_event(&d))
            .collect()
    }

    /// The frames due next: waits for a piece, then until [`EVERY`] after the last frames,
    /// taking every piece that arrives meanwhile. Never resolves when off or closed with
    /// nothing pending.
    pub(super) async fn next(&mut self) -> Vec<pb::TaskEvent> {
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
    pub(super) fn drain(&mut self) -> Vec<pb::TaskEvent> {
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
