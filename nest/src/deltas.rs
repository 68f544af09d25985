//! Streamed model-answer pieces on their way to the Hub: the supervisor pushes a run's
//! [`RunDelta`]s (from the instance that holds the run), the Hub link takes them at most once
//! per [`SEND_EVERY`] as one `RunDeltas` message.
//!
//! Invariants: pieces are never stored, acked or resent: a queue that is over [`MAX_BYTES`]
//! drops new text (the Hub's watchers then see the turn whole in its `model.answered`) and a
//! reconnect drops what is queued; consecutive pieces of one run, attempt and turn are merged
//! (a reset never is), so a slow link sends fewer, larger pieces in the same order.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

use crate::model::RunDelta;

/// The link sends queued pieces at most this often.
pub const SEND_EVERY: Duration = Duration::from_millis(50);
/// Text queued at most; past it new text is dropped until the link takes the queue.
const MAX_BYTES: usize = 1 << 20;

#[derive(Default)]
pub struct DeltaQueue {
    queue: Mutex<(Vec<RunDelta>, usize)>,
    notify: Notify,
}

impl DeltaQueue {
    /// Queues one piece (merged into the last one when it continues it).
    pub fn push(&self, d: RunDelta) {
        {
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.1 + d.delta.text.len() > MAX_BYTES {
                tracing::debug!(run = %d.run_id, "delta queue full: a streamed piece is dropped");
                return;
            }
            q.1 += d.delta.text.len();
            match q.0.last_mut() {
                Some(last) if last.run_id == d.run_id && last.delta.continues_with(&d.delta) => {
                    last.delta.text.push_str(&d.delta.text)
                }
                _ => q.0.push(d),
            }
        }
        self.notify.notify_one();
    }

    /// Resolves when something is queued.
    pub async fn queued(&self) {
        loop {
            let notified = self.notify.notified();
            if !self
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .0
                .is_empty()
            {
                return;
            }
            notified.await;
        }
    }

    /// Everything queued, oldest first.
    pub fn take(&self) -> Vec<RunDelta> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.1 = 0;
        std::mem::take(&mut q.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agen_contract::run::TurnDelta;

    fn d(run: &str, attempt: u32, turn: u32, text: &str, reset: bool) -> RunDelta {
        RunDelta {
            run_id: run.into(),
            task_id: "t".into(),
            delta: TurnDelta {
                attempt,
                turn,
                text: text.into(),
                reset,
            },
        }
    }

    #[test]
    fn pieces_of_one_turn_merge_and_resets_stay_apart() {
        let q = DeltaQueue::default();
        q.push(d("r", 1, 1, "ab", false));
        q.push(d("r", 1, 1, "cd", false));
        q.push(d("r2", 1, 1, "x", false));
        q.push(d("r", 1, 1, "", true));
        q.push(d("r", 1, 1, "e", false));
        q.push(d("r", 1, 2, "f", false));
        assert_eq!(
            q.take(),
            vec![
                d("r", 1, 1, "abcd", false),
                d("r2", 1, 1, "x", false),
                d("r", 1, 1, "e", true),
                d("r", 1, 2, "f", false),
            ]
        );
        assert!(q.take().is_empty());
    }
}
