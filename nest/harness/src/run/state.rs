//! One run's state: its context, the events it emits (a fenced attempt stops the run; a lost
//! `sync` event stops it too), progress held back between reports, and its end: the one
//! `run.finished` and the [`RunOutcome`].

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agen_contract::run::{trace, Activity, Progress, RunFinished, RunSuspended};
use agen_shared::bundle::StoreToolArguments;
use tokio_util::sync::CancellationToken;

use super::budget::TokenBudget;
use super::harness::Harness;
use super::{
    lock, Message, RunAssignment, RunEnd, RunEventBody, RunEventSink, RunOutcome, SinkError,
};
use crate::artifacts;

/// `task.progress` events are sent at most this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// The state of one run.
pub(super) struct Run<'h> {
    pub(super) h: &'h Harness,
    pub(super) req: &'h RunAssignment,
    sink: Arc<dyn RunEventSink>,
    /// Fires on the caller's cancel and when the sink says this attempt is fenced off.
    pub(super) cancel: CancellationToken,
    fenced: AtomicBool,
    /// Set when a side-effecting result could not be made durable: the run stops.
    log_lost: Mutex<Option<String>>,
    /// Set when the run gives its slot back to wait (see [`Run::suspend`]): the run stops.
    suspension: Mutex<Option<RunSuspended>>,
    /// The run's W3C trace id (derived from the run id: every attempt is in one trace).
    pub(super) trace_id: String,
    pub(super) context: Mutex<std::sync::Arc<Vec<Message>>>,
    /// This run's new messages (the outcome's `messages`).
    new_messages: Mutex<Vec<Message>>,
    pub(super) tool_calls: AtomicU32,
    /// When the last `task.progress` went out, and the latest report held back since then.
    last_progress: Mutex<(Option<Instant>, Option<Progress>)>,
    /// What the next model turn is doing, when it is more than "waiting for the model"
    /// (Keen: "reading the result of <tool>").
    pub(super) next_turn_activity: Mutex<Option<String>>,
    /// The task's token budget and the tokens used against it (earlier attempts included).
    pub(super) budget: TokenBudget,
    /// The task's own output schema (`agen submit --output-schema`), compiled; it takes the
    /// place of the bundle's `outputSchema`.
    pub(super) task_output_schema: Option<agen_shared::bundle::OutputSchema>,
}

impl<'h> Run<'h> {
    pub(super) fn new(
        h: &'h Harness,
        req: &'h RunAssignment,
        sink: Arc<dyn RunEventSink>,
        caller_cancel: CancellationToken,
    ) -> Run<'h> {
        let mut context = Vec::with_capacity(req.history.len() + 1);
        context.extend(req.history.iter().cloned());
        let user = Message::user(req.input.clone());
        context.push(user.clone());
        Run {
            h,
            req,
            sink,
            cancel: caller_cancel.child_token(),
            fenced: AtomicBool::new(false),
            log_lost: Mutex::new(None),
            suspension: Mutex::new(None),
            trace_id: if req.trace_id.is_empty() {
                trace::trace_id(req.run_id.as_str())
            } else {
                req.trace_id.clone()
            },
            context: Mutex::new(std::sync::Arc::new(context)),
            new_messages: Mutex::new(vec![user]),
            tool_calls: AtomicU32::new(0),
            last_progress: Mutex::new((None, None)),
            next_turn_activity: Mutex::new(None),
            budget: TokenBudget::new(req, h.bundle.harness.limits.max_tokens),
            task_output_schema: super::output::task_schema(req),
        }
    }

    /// The position of call `call_id` among this run's tool calls, from 0 (the same on every
    /// resume: replay pushes the same turns in the same order); `None` for a call that is not
    /// in an assistant message (a Keen call, whose id already names its turn).
    pub(super) fn call_position(&self, call_id: &str) -> Option<usize> {
        let mut before = 0;
        let mut found = None;
        for m in lock(&self.new_messages).iter() {
            if let Message::Assistant { tool_calls, .. } = m {
                if let Some(i) = tool_calls.iter().position(|c| c.id == call_id) {
                    found = Some(before + i);
                }
                before += tool_calls.len();
            }
        }
        found
    }

    /// Where the run's events go (a turn's streamed text goes there too).
    pub(super) fn sink(&self) -> &dyn RunEventSink {
        &*self.sink
    }

    /// `m` as the run log and the conversation keep it: as it is, or under
    /// `storeToolArguments: "redacted"` without secrets and `sensitiveFields`.
    pub(super) fn stored(&self, m: &Message) -> Message {
        let harness = &self.h.bundle.harness;
        match harness.store_tool_arguments {
            StoreToolArguments::Full => m.clone(),
            StoreToolArguments::Redacted => {
                crate::redact::stored_message(m, &self.h.redactor, &harness.sensitive_fields)
            }
        }
    }

    pub(super) fn push(&self, m: Message) {
        // Copies the conversation only when a request still shares it.
        std::sync::Arc::make_mut(&mut *lock(&self.context)).push(m.clone());
        lock(&self.new_messages).push(m);
    }

    /// How many of this run's own messages match `f` (its conversation history left out).
    pub(super) fn count_new(&self, f: impl Fn(&Message) -> bool) -> usize {
        lock(&self.new_messages).iter().filter(|m| f(m)).count()
    }

    /// Emits one event. A fenced attempt cancels the run; a failure of a `sync` event is
    /// returned (the caller must not go on as if it were durable); other failures are logged.
    pub(super) async fn emit(&self, body: RunEventBody, sync: bool) -> Result<(), SinkError> {
        let kind = body.kind().to_string();
        match self.sink.emit(body, sync).await {
            Ok(()) => Ok(()),
            Err(SinkError::Fenced) => {
                self.fenced.store(true, Ordering::SeqCst);
                self.cancel.cancel();
                Err(SinkError::Fenced)
            }
            Err(e) => {
                tracing::warn!(run_id = %self.req.run_id, kind, "run event not appended: {e}");
                if sync {
                    Err(e)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Streams a side effect's result: sent without waiting for its ack (the order of the
    /// run's events keeps the ledger; see `run::tools`) unless the sink makes results durable
    /// first ([`super::RunEventSink::durable_results`]); a sink that already knows it cannot
    /// take the event (a closed connection, a local log that cannot write) says so, and the
    /// caller must stop the run before the model acts on the result.
    pub(super) async fn emit_streamed(&self, body: RunEventBody) -> Result<(), SinkError> {
        let sync = self.sink.durable_results();
        match self.sink.emit(body, sync).await {
            Ok(()) => Ok(()),
            Err(SinkError::Fenced) => {
                self.fenced.store(true, Ordering::SeqCst);
                self.cancel.cancel();
                Err(SinkError::Fenced)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether a newer attempt of this run has taken over (its work is then not ours to undo).
    pub(super) fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    /// Records that a side-effecting result could not be made durable: the run stops before
    /// the model can act on it.
    pub(super) fn lose_log(&self, why: String) {
        *lock(&self.log_lost) = Some(why);
        self.cancel.cancel();
    }

    /// The run gives its instance slot back to wait for `why`: it stops at once (every call
    /// still going is cut off like at a cancel) and ends with `run.suspended`; the Hub resumes
    /// it from its log when what it waits for is there. The first suspension wins.
    pub(super) fn suspend(&self, why: RunSuspended) {
        lock(&self.suspension).get_or_insert(why);
        self.cancel.cancel();
    }

    /// Sends the latest held-back progress report when it is due, or at once with `force`
    /// (the run is ending), so the task always ends up with the latest report.
    pub(super) async fn flush_progress(&self, force: bool) {
        let pending = {
            let mut p = lock(&self.last_progress);
            if p.1.is_some() && (force || p.0.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY)) {
                p.0 = Some(Instant::now());
                p.1.take()
            } else {
                None
            }
        };
        if let Some(progress) = pending {
            let _ = self.emit(RunEventBody::TaskProgress(progress), false).await;
        }
    }

    /// A `report_progress`: sent now as `task.progress`, or held back until it is due (and
    /// sent at once as `progress.latest`, so the task shows the latest report).
    pub(super) async fn progress(&self, progress: Progress) {
        let send = {
            let mut p = lock(&self.last_progress);
            if p.0.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
                *p = (Some(Instant::now()), None);
                true
            } else {
                // Held back; the latest report goes out later (see `flush_progress`).
                p.1 = Some(progress.clone());
                false
            }
        };
        let body = if send {
            RunEventBody::TaskProgress(progress)
        } else {
            RunEventBody::ProgressLatest(progress)
        };
        let _ = self.emit(body, false).await;
    }

    pub(super) async fn activity(&self, text: String) {
        let _ = self
            .emit(RunEventBody::Activity(Activity { activity: text }), false)
            .await;
    }

    /// The end of a run whose cancel token fired: fenced, log lost, suspended or cancelled.
    pub(super) fn cancelled_end(&self) -> RunEnd {
        if self.fenced.load(Ordering::SeqCst) {
            RunEnd::failed("this run attempt was superseded by a newer attempt")
        } else if let Some(why) = lock(&self.log_lost).clone() {
            RunEnd::failed(why)
        } else if let Some(why) = lock(&self.suspension).clone() {
            RunEnd::suspended(why)
        } else {
            RunEnd::cancelled("the run was cancelled")
        }
    }

    pub(super) fn max_turns_end(&self) -> RunEnd {
        let max_turns = self.h.bundle.harness.limits.max_turns.max(1);
        RunEnd::failed(format!(
            "the run stopped after {max_turns} model turns without a final answer (limits.maxTurns in x-agen/harness.json); raise the limit or make the task smaller"
        ))
    }

    /// Emits `run.finished` (or `run.suspended`) and builds the outcome.
    pub(super) async fn finish(self, end: RunEnd) -> RunOutcome {
        // At most one `task.progress` per 10 s, the run's end included: a report held back
        // already reached the task as `progress.latest`.
        self.flush_progress(false).await;
        if let Some(why) = end.suspended {
            if let Err(e) = self
                .emit(RunEventBody::RunSuspended(why.clone()), true)
                .await
            {
                tracing::warn!(run_id = %self.req.run_id, "run.suspended not recorded: {e}");
            }
            return RunOutcome {
                state: end.state,
                result: end.result,
                response_type: end.response_type,
                messages: Vec::new(),
                suspended: Some(why),
            };
        }
        // Every call the model made gets an answer, so the history stays valid.
        let mut answered = HashSet::new();
        let mut pending = Vec::new();
        for m in lock(&self.new_messages).iter() {
            match m {
                Message::Assistant { tool_calls, .. } => {
                    pending.extend(tool_calls.iter().map(|c| (c.id.clone(), c.name.clone())))
                }
                Message::Tool { call_id, .. } => {
                    answered.insert(call_id.clone());
                }
                _ => {}
            }
        }
        for (id, name) in pending {
            if !answered.contains(&id) {
                self.push(Message::Tool {
                    call_id: id,
                    name,
                    content: "not run: the run ended first".into(),
                    is_error: true,
                });
            }
        }
        let _ = self
            .emit(
                RunEventBody::RunFinished(RunFinished {
                    state: end.state,
                    result: end.result.clone(),
                    response_type: end.response_type,
                    messages: Vec::new(),
                }),
                true,
            )
            .await;
        let messages = lock(&self.new_messages)
            .iter()
            .map(|m| self.stored(&artifacts::elide_saved_content(m)))
            .collect();
        RunOutcome {
            state: end.state,
            result: end.result,
            response_type: end.response_type,
            messages,
            suspended: None,
        }
    }
}
