//! Reading the events of earlier attempts of a run, for a resume (`docs/durability.md`),
//! once for both dialects: answered turns by number, recorded results by call id, which calls
//! started (and whether they were side-effecting), the run's end when the log holds one, and
//! the deadlines of waits an attempt suspended on.

use std::collections::{BTreeMap, HashMap};

use agen_contract::run::{KeenResult, ToolFailure};

use super::{Message, RunEnd, RunEventBody};
use crate::keen::ToolResult;

/// A recorded result of one call.
#[derive(Debug, Clone)]
pub(super) struct Recorded {
    /// What the model was shown (the result, or the error).
    pub text: String,
    pub is_error: bool,
    /// The exact Keen result kind, when the Keen dialect recorded it.
    pub keen: Option<KeenResult>,
    /// For a failure: why, and a Keen technical error's model-facing text.
    pub failure: Option<ToolFailure>,
    pub keen_text: Option<String>,
}

impl Recorded {
    /// The result as the Keen dialect gives it back to the model.
    pub fn to_keen(&self) -> ToolResult {
        let text = self.text.clone();
        match (self.failure, self.keen) {
            (None, Some(KeenResult::FlowError)) => ToolResult::FlowError(text),
            (None, _) if self.is_error => ToolResult::ScriptError(text),
            (None, _) => ToolResult::Answer(text),
            (Some(_), Some(KeenResult::TechnicalError)) => {
                ToolResult::TechnicalError(self.keen_text.clone().unwrap_or_default())
            }
            (Some(_), Some(KeenResult::NoResponse)) => ToolResult::NoResponse(text),
            // A native call's failure: what the model was told.
            (Some(ToolFailure::Timeout), _) => ToolResult::TechnicalError(text),
            (Some(_), _) => ToolResult::ScriptError(text),
        }
    }
}

/// What the log of earlier attempts settles.
#[derive(Debug, Default)]
pub(super) struct Replay {
    /// Answered model turns by turn number (flow agents' turns are not run turns).
    pub turns: BTreeMap<u32, Message>,
    /// Recorded results by call id (native ids, or `keen_<turn>`).
    pub results: HashMap<String, Recorded>,
    /// Calls whose start was recorded, with their `side_effect` flag.
    pub started: HashMap<String, bool>,
    /// The run's recorded end, when the log already holds one.
    pub finished: Option<RunEnd>,
}

/// The earliest deadline an earlier attempt gave the wait of `call_id` when it suspended
/// (`run.suspended`, unix ms): a resumed wait ends there, never later.
pub(super) fn wait_deadline(events: &[RunEventBody], call_id: &str) -> Option<i64> {
    events
        .iter()
        .filter_map(|ev| match ev {
            RunEventBody::RunSuspended(s) if s.waiting_for.call_id() == call_id => {
                Some(s.deadline_ms)
            }
            _ => None,
        })
        .min()
}

impl Replay {
    pub fn from_events(events: &[RunEventBody]) -> Replay {
        let mut out = Replay::default();
        for ev in events {
            match ev {
                RunEventBody::RunFinished(f) => {
                    out.finished = Some(RunEnd {
                        state: f.state,
                        result: f.result.clone(),
                        response_type: f.response_type,
                        suspended: None,
                    });
                }
                RunEventBody::ModelAnswered(a) if !a.flow_agent => {
                    if let (Some(turn), Some(message)) = (a.turn, a.message.clone()) {
                        out.turns.insert(turn, message);
                    }
                }
                RunEventBody::ToolStarted(s) => {
                    out.started.insert(s.call_id.clone(), s.side_effect);
                }
                RunEventBody::ToolCompleted(c) => {
                    out.results.insert(
                        c.call_id.clone(),
                        Recorded {
                            text: c.result.clone(),
                            is_error: c.is_error,
                            keen: c.keen_result,
                            failure: None,
                            keen_text: None,
                        },
                    );
                }
                // A call cut off by a cancel or a crash has no real result.
                RunEventBody::ToolFailed(f) if f.reason != ToolFailure::Cancelled => {
                    out.results.insert(
                        f.call_id.clone(),
                        Recorded {
                            text: f.error.clone(),
                            is_error: true,
                            keen: f.keen_result,
                            failure: Some(f.reason),
                            keen_text: f.keen_text.clone(),
                        },
                    );
                }
                _ => {}
            }
        }
        out
    }
}

/// What the model is told about an interrupted side-effecting call that is not sent again.
pub(super) fn effect_unknown_message(tool: &str) -> String {
    format!(
        "effect_unknown: the call to {tool} was interrupted before its result was recorded; it may or may not have taken effect. Check before calling it again."
    )
}
