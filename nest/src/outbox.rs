//! Run events on their way to the Hub: kept by `(run_id, attempt)` then seq until the Hub acks
//! them, resent after every reconnect (the Hub appends if absent, so a resend is harmless), sent
//! in bounded batches; a waited-for (`sync`) event ends a batching window at once. The supervisor
//! pushes, the Hub link takes batches and applies acks.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use crate::model::{EventBatch, RunEvent};
use tokio::sync::Notify;

/// Run events not yet acknowledged by the Hub, by `(run_id, attempt)` then seq, with the
/// instance that produced them.
#[derive(Default)]
pub struct Outbox {
    state: Mutex<OutboxState>,
    notify: Notify,
    /// Woken when a waited-for event is queued (it ends a batching window early).
    urgent_notify: Notify,
    /// Streamed answer pieces, beside the events and never kept for a resend.
    pub deltas: crate::deltas::DeltaQueue,
}

#[derive(Default)]
struct OutboxState {
    unacked: BTreeMap<(String, u32), BTreeMap<u64, (String, RunEvent)>>,
    /// Keys of events not yet sent on the current stream, in order.
    unsent: VecDeque<(String, u32, u64)>,
    /// Whether an unsent event is waited for (`sync`): then the batch goes at once.
    urgent: bool,
    /// Attempts the Hub fenced off (newest last, at most [`FENCED_KEPT`]): a later event of
    /// one is dropped at once, never waited for (a stopping Nest waits for nothing fenced).
    fenced: VecDeque<(String, u32)>,
}

/// How many fenced attempts the outbox remembers.
const FENCED_KEPT: usize = 1024;

impl Outbox {
    /// Queues one event (from `instance_id`) for sending.
    pub fn push(&self, instance_id: &str, event: RunEvent) {
        {
            let mut st = self.lock();
            let key = (event.run_id.clone(), event.attempt);
            if st.fenced.contains(&key) {
                return;
            }
            let seq = event.seq;
            let slot = st.unacked.entry(key.clone()).or_default();
            let sync = event.sync;
            if slot.insert(seq, (instance_id.to_string(), event)).is_none() {
                st.unsent.push_back((key.0, key.1, seq));
                st.urgent |= sync;
            }
            if sync {
                self.urgent_notify.notify_one();
            }
        }
        self.notify.notify_one();
    }

    /// Forgets every event of `(run_id, attempt)` with seq <= `acked_seq` (all of them when fenced).
    pub fn ack(&self, run_id: &str, attempt: u32, acked_seq: u64, fenced: bool) {
        let mut st = self.lock();
        let key = (run_id.to_string(), attempt);
        if fenced && !st.fenced.contains(&key) {
            if st.fenced.len() >= FENCED_KEPT {
                st.fenced.pop_front();
            }
            st.fenced.push_back(key.clone());
        }
        if let Some(slot) = st.unacked.get_mut(&key) {
            if fenced {
                slot.clear();
            } else {
                slot.retain(|seq, _| *seq > acked_seq);
            }
            if slot.is_empty() {
                st.unacked.remove(&key);
            }
        }
    }

    /// Marks every unacked event unsent (a new stream starts).
    pub fn resend_all(&self) {
        {
            let mut st = self.lock();
            let keys: VecDeque<_> = st
                .unacked
                .iter()
                .flat_map(|((run, attempt), slot)| {
                    slot.keys().map(move |seq| (run.clone(), *attempt, *seq))
                })
                .collect();
            st.unsent = keys;
        }
        self.notify.notify_one();
    }

    /// Up to `max` events to send, grouped per instance (in order).
    pub fn take_batch(&self, max: usize) -> Vec<EventBatch> {
        let mut st = self.lock();
        st.urgent = false;
        let mut out: Vec<EventBatch> = Vec::new();
        let mut n = 0;
        while n < max {
            let Some((run, attempt, seq)) = st.unsent.pop_front() else {
                break;
            };
            let Some((instance, ev)) = st.unacked.get(&(run, attempt)).and_then(|s| s.get(&seq))
            else {
                continue;
            };
            match out.last_mut() {
                Some(last) if last.instance_id == *instance => last.events.push(ev.clone()),
                _ => out.push(EventBatch {
                    instance_id: instance.clone(),
                    events: vec![ev.clone()],
                }),
            }
            n += 1;
        }
        out
    }

    /// Whether an event someone waits for is queued (no batching window then).
    pub fn urgent(&self) -> bool {
        self.lock().urgent
    }

    /// Number of events waiting for an ack.
    pub fn pending(&self) -> usize {
        self.lock().unacked.values().map(|s| s.len()).sum()
    }

    /// Resolves when an event is queued.
    pub async fn queued(&self) {
        self.notify.notified().await
    }

    /// Resolves when a waited-for (`sync`) event is queued.
    pub async fn urgent_queued(&self) {
        self.urgent_notify.notified().await
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OutboxState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(run: &str, attempt: u32, seq: u64) -> RunEvent {
        RunEvent {
            run_id: run.into(),
            attempt,
            seq,
            task_id: String::new(),
            at_ms: 0,
            body: agen_contract::run::RunEventBody::from_wire_lossy("log", "{}"),
            sync: false,
        }
    }

    fn seqs(batch: &[EventBatch]) -> Vec<(String, String, u64)> {
        batch
            .iter()
            .flat_map(|b| {
                b.events
                    .iter()
                    .map(move |e| (b.instance_id.clone(), e.run_id.clone(), e.seq))
            })
            .collect()
    }

    #[test]
    fn events_are_sent_once_and_resent_after_a_reconnect_until_acked() {
        let o = Outbox::default();
        o.push("i1", ev("r1", 1, 1));
        o.push("i1", ev("r1", 1, 2));
        o.push("i2", ev("r2", 1, 1));
        o.push("i1", ev("r1", 1, 2)); // duplicate: ignored
        let first = o.take_batch(10);
        assert_eq!(
            seqs(&first),
            vec![
                ("i1".into(), "r1".into(), 1),
                ("i1".into(), "r1".into(), 2),
                ("i2".into(), "r2".into(), 1)
            ]
        );
        assert_eq!(first.len(), 2, "grouped per instance");
        assert!(
            o.take_batch(10).is_empty(),
            "sent events are not sent again on the same stream"
        );

        o.ack("r1", 1, 1, false);
        o.resend_all();
        assert_eq!(
            seqs(&o.take_batch(10)),
            vec![("i1".into(), "r1".into(), 2), ("i2".into(), "r2".into(), 1)]
        );

        o.ack("r2", 1, 0, true); // fenced: everything of that attempt goes
        o.ack("r1", 1, 2, false);
        assert_eq!(o.pending(), 0);
    }

    #[test]
    fn an_event_of_an_attempt_the_hub_fenced_is_never_waited_for() {
        let o = Outbox::default();
        o.push("i", ev("r", 1, 1));
        o.ack("r", 1, 0, true);
        assert_eq!(o.pending(), 0);
        // The attempt's run.finished comes after the fence: dropped, not kept for an ack
        // that never comes (a stopping Nest would wait its whole grace for it).
        o.push("i", ev("r", 1, 2));
        assert_eq!(o.pending(), 0);
        assert!(o.take_batch(10).is_empty());
        // The next attempt is its own.
        o.push("i", ev("r", 2, 1));
        assert_eq!(o.pending(), 1);
    }

    #[test]
    fn batches_are_bounded() {
        let o = Outbox::default();
        for seq in 1..=5 {
            o.push("i", ev("r", 1, seq));
        }
        assert_eq!(o.take_batch(2)[0].events.len(), 2);
        assert_eq!(o.take_batch(10)[0].events.len(), 3);
    }
}
