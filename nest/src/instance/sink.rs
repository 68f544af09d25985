//! [`NestSink`]: the [`RunEventSink`] of a fleet run. It numbers events per
//! `(run_id, attempt)` from 1, sends them to the Nest over the instance socket, and for a
//! `sync` event waits until the Hub acknowledged that seq (relayed by the Nest).
//!
//! Invariants: seqs are gap-free and increase in emit order, and events reach the socket in seq
//! order (a seq is taken and its event queued under one lock, so parallel tool calls cannot
//! overtake each other): the Hub's cumulative ack of seq N then means every event up to N is
//! durable, which is what lets a side effect's "completed" be streamed rather than waited
//! for (see the harness's `run::tools`); a fenced attempt fails every
//! later emit with [`SinkError::Fenced`]; the harness's own `run.finished` is held back: the
//! host sends the one final `run.finished` (with the run's messages) through [`NestSink::finish`].
//! A turn's streamed text goes as `delta` lines beside the events: no seq, never waited for.

use agen_contract::run::RunFinished;
use tokio::sync::{mpsc, watch};

use crate::socket::{RunEventMsg, ToNest};
use agen_harness::{RunEventBody, RunEventSink, SinkError};

pub struct NestSink {
    run_id: String,
    attempt: u32,
    task_id: String,
    /// The last seq handed out; held while its event is queued.
    seq: std::sync::Mutex<u64>,
    to_nest: mpsc::UnboundedSender<ToNest>,
    acks: watch::Receiver<(u64, bool)>,
    /// Fired by a double-texting interrupt (see [`RunEventSink::interrupt`]).
    interrupt: Option<tokio_util::sync::CancellationToken>,
}

impl NestSink {
    pub fn new(
        run_id: String,
        attempt: u32,
        task_id: String,
        to_nest: mpsc::UnboundedSender<ToNest>,
        acks: watch::Receiver<(u64, bool)>,
    ) -> NestSink {
        NestSink {
            run_id,
            attempt,
            task_id,
            seq: std::sync::Mutex::new(0),
            to_nest,
            acks,
            interrupt: None,
        }
    }

    /// The run stops at its next safe point once `token` fires.
    pub fn with_interrupt(mut self, token: tokio_util::sync::CancellationToken) -> NestSink {
        self.interrupt = Some(token);
        self
    }

    /// Sends the final `run.finished` (sync) and waits for its ack.
    pub async fn finish(&self, finished: RunFinished) -> Result<(), SinkError> {
        self.send(RunEventBody::RunFinished(finished), true).await
    }

    async fn send(&self, body: RunEventBody, sync: bool) -> Result<(), SinkError> {
        if self.acks.borrow().1 {
            return Err(SinkError::Fenced);
        }
        let seq = {
            let mut last = self.seq.lock().unwrap_or_else(|p| p.into_inner());
            let seq = *last + 1;
            let msg = RunEventMsg {
                run_id: self.run_id.clone(),
                attempt: self.attempt,
                seq,
                task_id: self.task_id.clone(),
                at_ms: chrono::Utc::now().timestamp_millis(),
                body,
                sync,
            };
            self.to_nest
                .send(ToNest::Event(msg))
                .map_err(|_| SinkError::Unavailable("the nest connection is closed".into()))?;
            *last = seq;
            seq
        };
        if !sync {
            return Ok(());
        }
        let mut acks = self.acks.clone();
        let fenced = match acks
            .wait_for(|(acked, fenced)| *acked >= seq || *fenced)
            .await
        {
            Ok(v) => v.1,
            Err(_) => {
                return Err(SinkError::Unavailable(
                    "the nest connection is closed".into(),
                ))
            }
        };
        if fenced {
            Err(SinkError::Fenced)
        } else {
            Ok(())
        }
    }
}

#[async_trait::async_trait]
impl RunEventSink for NestSink {
    async fn emit(&self, body: RunEventBody, sync: bool) -> Result<(), SinkError> {
        if matches!(body, RunEventBody::RunFinished(_)) {
            // The instance sends the final one, with the run's messages.
            return Ok(());
        }
        self.send(body, sync).await
    }

    fn interrupt(&self) -> Option<tokio_util::sync::CancellationToken> {
        self.interrupt.clone()
    }

    fn delta(&self, turn: u32, delta: agen_harness::model::ModelDelta<'_>) {
        use agen_harness::model::ModelDelta;
        let (text, reset) = match delta {
            ModelDelta::Text(t) => (t.to_string(), false),
            ModelDelta::Reset => (String::new(), true),
        };
        // Never waited for, never acked: a closed connection just loses the piece.
        let _ = self.to_nest.send(ToNest::Delta(crate::model::RunDelta {
            run_id: self.run_id.clone(),
            task_id: self.task_id.clone(),
            delta: agen_contract::run::TurnDelta {
                attempt: self.attempt,
                turn,
                text,
                reset,
            },
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn body(kind: &str, json: serde_json::Value) -> RunEventBody {
        RunEventBody::from_parts(kind, json).unwrap()
    }

    fn sink() -> (
        Arc<NestSink>,
        mpsc::UnboundedReceiver<ToNest>,
        watch::Sender<(u64, bool)>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (acks, acks_rx) = watch::channel((0, false));
        (
            Arc::new(NestSink::new("r".into(), 2, "t".into(), tx, acks_rx)),
            rx,
            acks,
        )
    }

    fn seq_kind(m: ToNest) -> (u64, String, bool) {
        match m {
            ToNest::Event(e) => (e.seq, e.body.kind().to_string(), e.sync),
            other => panic!("expected an event, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn events_are_numbered_from_one_and_sync_waits_for_the_ack() {
        let (s, mut rx, acks) = sink();
        s.emit(body("model.requested", json!({"turn": 1})), false)
            .await
            .expect("async emit");
        s.emit(body("run.finished", json!({"state": "succeeded"})), true)
            .await
            .expect("held back");
        let waiting = tokio::spawn({
            let s = s.clone();
            async move {
                s.emit(
                    body("tool.started", json!({"call_id": "c", "tool": "t"})),
                    true,
                )
                .await
            }
        });
        assert_eq!(
            seq_kind(rx.recv().await.expect("event")),
            (1, "model.requested".into(), false)
        );
        assert_eq!(
            seq_kind(rx.recv().await.expect("event")),
            (2, "tool.started".into(), true)
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a sync emit waits for its ack");
        acks.send_replace((1, false));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(
            !waiting.is_finished(),
            "an ack of an earlier seq is not enough"
        );
        acks.send_replace((2, false));
        waiting.await.expect("join").expect("acked");
        drop(acks);
        let err = s
            .finish(serde_json::from_value(json!({"state": "succeeded"})).unwrap())
            .await
            .expect_err("no ack can come any more");
        assert!(matches!(err, SinkError::Unavailable(_)), "{err}");
    }

    #[tokio::test]
    async fn a_fenced_attempt_fails_every_emit() {
        let (s, _rx, acks) = sink();
        acks.send_replace((0, true));
        assert!(matches!(
            s.emit(
                body("tool.started", json!({"call_id": "c", "tool": "t"})),
                true
            )
            .await,
            Err(SinkError::Fenced)
        ));
        assert!(matches!(
            s.emit(body("log", json!({})), false).await,
            Err(SinkError::Fenced)
        ));
    }
}
