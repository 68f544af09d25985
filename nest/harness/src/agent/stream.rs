//! One embedded run's events: the sink that passes each event to the local run log (when the
//! agent has one), to the caller's stream and to the outcome's tallies (usage, artifacts); and
//! [`RunStream`], the typed events as they happen, then the [`Outcome`]; [`RunItems`], the
//! same with the model's answer as it streams ([`RunItem::Delta`], never logged).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use agen_contract::run::{ArtifactSaved, TurnDelta, Usage};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{AgentError, Outcome};
use crate::model::ModelDelta;
use crate::run::{RunEventBody, RunEventSink, SinkError};
use crate::run_log::SledRunLog;

/// What a run's events add up to for its [`Outcome`].
#[derive(Debug, Default, Clone)]
pub(super) struct Tally {
    pub usage: Usage,
    pub artifacts: Vec<ArtifactSaved>,
}

impl Tally {
    pub fn add(&mut self, body: &RunEventBody) {
        match body {
            RunEventBody::ModelAnswered(a) => {
                if let Some(u) = &a.usage {
                    self.usage.input_tokens += u.input_tokens;
                    self.usage.output_tokens += u.output_tokens;
                }
            }
            RunEventBody::ArtifactSaved(a) if !self.artifacts.iter().any(|s| s.id == a.id) => {
                self.artifacts.push(a.clone());
            }
            _ => {}
        }
    }
}

/// What a run stream carries: a run event, or a piece of a model turn's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum RunItem {
    /// A run event (also in the run log, when the agent has one).
    Event(RunEventBody),
    /// The model's answer as it streams: not an event, never logged. A reset (the provider
    /// retried the turn) voids what was shown of that turn; the text after a turn's last reset
    /// is what its `model.answered` holds.
    Delta(TurnDelta),
}

/// The sink of one embedded run.
pub(super) struct Tee {
    pub log: Option<Arc<SledRunLog>>,
    pub tx: mpsc::UnboundedSender<RunItem>,
    pub tally: Mutex<Tally>,
    /// The run attempt (1, or the next one on a resume).
    pub attempt: u32,
}

#[async_trait::async_trait]
impl RunEventSink for Tee {
    async fn emit(&self, body: RunEventBody, sync: bool) -> Result<(), SinkError> {
        // The log first: an event the caller saw is in the log too (a waited-for one only
        // once it is durable).
        let logged = match &self.log {
            Some(log) => log.emit(body.clone(), sync).await,
            None => Ok(()),
        };
        self.tally
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(&body);
        // A caller that stopped reading does not stop the run.
        let _ = self.tx.send(RunItem::Event(body));
        logged
    }

    fn delta(&self, turn: u32, delta: ModelDelta<'_>) {
        let (text, reset) = match delta {
            ModelDelta::Text(t) => (t.to_string(), false),
            ModelDelta::Reset => (String::new(), true),
        };
        let _ = self.tx.send(RunItem::Delta(TurnDelta {
            attempt: self.attempt,
            turn,
            text,
            reset,
        }));
    }

    fn durable_results(&self) -> bool {
        self.log.is_some()
    }
}

/// A run in progress: a [`futures::Stream`] of its typed events as they happen (the last is
/// `run.finished`), then [`RunStream::outcome`]. Dropping it before the outcome cancels the run.
pub struct RunStream {
    pub(super) run_id: String,
    pub(super) rx: mpsc::UnboundedReceiver<RunItem>,
    pub(super) task: Option<JoinHandle<Result<Outcome, AgentError>>>,
    pub(super) cancel: CancellationToken,
}

impl RunStream {
    /// The run's id (the name of its folder in the agent's run log).
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Cancels the run: a tool call in flight is stopped, the run ends `cancelled`.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Waits for the run's end (events not read yet are dropped). Dropping this future before
    /// the end cancels the run.
    pub async fn outcome(mut self) -> Result<Outcome, AgentError> {
        let Some(task) = self.task.take() else {
            return Err(AgentError::Run("the outcome was already taken".into()));
        };
        // Dropping this future before the end cancels the run, as dropping the stream does.
        let guard = self.cancel.clone().drop_guard();
        let out = match task.await {
            Ok(r) => r,
            Err(e) => Err(AgentError::Run(format!("the run's task ended: {e}"))),
        };
        guard.disarm();
        out
    }
}

impl RunStream {
    /// This stream with the model's answer as it streams between the events: items are
    /// [`RunItem::Event`]s and [`RunItem::Delta`]s, in the order the run made them.
    pub fn with_deltas(self) -> RunItems {
        RunItems(self)
    }
}

impl futures::Stream for RunStream {
    type Item = RunEventBody;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RunEventBody>> {
        loop {
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(RunItem::Delta(_))) => continue,
                Poll::Ready(Some(RunItem::Event(e))) => return Poll::Ready(Some(e)),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// A [`RunStream`] that also yields the model's answer as it streams
/// ([`RunStream::with_deltas`]). Dropping it before the outcome cancels the run.
pub struct RunItems(RunStream);

impl RunItems {
    /// The run's id.
    pub fn run_id(&self) -> &str {
        self.0.run_id()
    }

    /// Cancels the run (see [`RunStream::cancel`]).
    pub fn cancel(&self) {
        self.0.cancel();
    }

    /// Waits for the run's end (see [`RunStream::outcome`]).
    pub async fn outcome(self) -> Result<Outcome, AgentError> {
        self.0.outcome().await
    }
}

impl futures::Stream for RunItems {
    type Item = RunItem;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RunItem>> {
        self.0.rx.poll_recv(cx)
    }
}

impl Drop for RunStream {
    fn drop(&mut self) {
        if self.task.is_some() {
            self.cancel.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agen_contract::run::ModelAnswered;

    fn answered(input: u64, output: u64) -> RunEventBody {
        RunEventBody::ModelAnswered(ModelAnswered {
            turn: Some(1),
            flow_agent: false,
            message: None,
            usage: Some(Usage {
                input_tokens: input,
                output_tokens: output,
            }),
            stop_reason: None,
            response_id: None,
            response_model: None,
            error: None,
        })
    }

    #[test]
    fn usage_adds_up_over_turns_and_an_artifact_saved_twice_counts_once() {
        let saved = RunEventBody::ArtifactSaved(ArtifactSaved {
            id: "sha256:ab".into(),
            name: "r".into(),
            media_type: "text/plain".into(),
            size: 1,
        });
        let mut t = Tally::default();
        for e in [answered(3, 4), saved.clone(), answered(10, 1), saved] {
            t.add(&e);
        }
        assert_eq!(
            t.usage,
            Usage {
                input_tokens: 13,
                output_tokens: 5
            }
        );
        assert_eq!(t.artifacts.len(), 1);
    }
}
