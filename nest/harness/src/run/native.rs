//! The native dialect's loop: tools in the request, `tool_calls` in the reply, results as tool
//! messages in the order the calls were asked; and its resume from the log of earlier attempts.

use agen_contract::run::{ToolFailed, ToolFailure};
use agen_shared::bundle::OutputSchema;

use super::output::{self, AnswerCheck};
use super::replay::{effect_unknown_message, Replay};
use super::state::Run;
use super::{Message, RunEnd, RunEventBody};

impl Run<'_> {
    pub(super) async fn native_loop(&self) -> RunEnd {
        let tools: std::sync::Arc<[_]> = self.offered_specs().into();
        let max_turns = self.h.bundle.harness.limits.max_turns.max(1);
        let first_turn = match self.replay_native().await {
            Ok(t) => t,
            Err(end) => return end,
        };
        for turn in first_turn..=max_turns {
            let reply = match self.ask(turn, &self.h.system_prompt, &tools).await {
                Ok(r) => r,
                Err(end) => return end,
            };
            if reply.tool_calls.is_empty() {
                match self.check_answer(&reply.text) {
                    AnswerCheck::Retry(feedback) => {
                        self.push(Message::user(feedback));
                        continue;
                    }
                    AnswerCheck::End(end) => return end,
                }
            }
            let results = self.run_calls(&reply.tool_calls).await;
            let mut finish = None;
            for (call, r) in reply.tool_calls.iter().zip(results) {
                if finish.is_none() {
                    finish = r.finish.clone();
                }
                self.push(Message::Tool {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    content: r.content,
                    is_error: r.is_error,
                });
            }
            if self.cancel.is_cancelled() {
                return self.cancelled_end();
            }
            if let Some(result) = finish {
                match self.check_answer(&result) {
                    AnswerCheck::Retry(feedback) => self.push(Message::user(feedback)),
                    AnswerCheck::End(end) => return end,
                }
            }
        }
        self.max_turns_end()
    }

    /// Rebuilds the context from the events of earlier attempts: answered turns are not asked
    /// again, recorded results are reused, an interrupted side-effecting call is reported to
    /// the model as `effect_unknown`, and an interrupted read-only or idempotent call (or one
    /// never sent) is run again. Returns the next turn, or the run's end when the log already
    /// holds it.
    async fn replay_native(&self) -> Result<u32, RunEnd> {
        if self.req.replay.is_empty() {
            return Ok(1);
        }
        let replay = Replay::from_events(&self.req.replay);
        if let Some(end) = replay.finished {
            return Err(end);
        }
        let Some(last_turn) = replay.turns.keys().next_back().copied() else {
            return Ok(1);
        };
        self.activity(format!(
            "resuming at turn {} (attempt {})",
            last_turn + 1,
            self.req.attempt
        ))
        .await;
        for message in replay.turns.into_values() {
            let calls = match &message {
                Message::Assistant { tool_calls, .. } => tool_calls.clone(),
                _ => Vec::new(),
            };
            let answer = match &message {
                Message::Assistant {
                    content,
                    tool_calls,
                } if tool_calls.is_empty() => Some(content.clone()),
                _ => None,
            };
            self.push(message);
            if let Some(text) = answer {
                // An answer the schema refused was sent back with its error: the same error
                // again, so the resumed context is the one the model saw.
                match self.check_answer(&text) {
                    AnswerCheck::Retry(feedback) => {
                        self.push(Message::user(feedback));
                        continue;
                    }
                    AnswerCheck::End(end) => return Err(end),
                }
            }
            let mut finish = None;
            for call in &calls {
                // `finish` is run again (its recorded result is not the run's end).
                let recorded = replay
                    .results
                    .get(&call.id)
                    .filter(|_| call.name != super::builtin_names::BUILTIN_FINISH);
                let (content, is_error) = if let Some(r) = recorded {
                    (r.text.clone(), r.is_error)
                } else if replay.started.get(&call.id).copied().unwrap_or(false)
                    && !self.policy_of_model_name(&call.name).retry_safe()
                {
                    let content = effect_unknown_message(&call.name);
                    let _ = self
                        .emit(
                            RunEventBody::ToolFailed(ToolFailed {
                                call_id: call.id.clone(),
                                tool: call.name.clone(),
                                error: content.clone(),
                                reason: ToolFailure::EffectUnknown,
                                duration_ms: 0,
                                keen_result: None,
                                keen_text: None,
                            }),
                            true,
                        )
                        .await;
                    (content, true)
                } else {
                    let r = self.run_call(call).await;
                    if finish.is_none() {
                        finish = r.finish.clone();
                    }
                    (r.content, r.is_error)
                };
                self.push(Message::Tool {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    content,
                    is_error,
                });
            }
            if let Some(result) = finish {
                match self.check_answer(&result) {
                    AnswerCheck::Retry(feedback) => self.push(Message::user(feedback)),
                    AnswerCheck::End(end) => return Err(end),
                }
            }
        }
        Ok(last_turn + 1)
    }
}

impl Run<'_> {
    /// The schema the final answer must match, if any: the task's own, else the bundle's.
    pub(super) fn output_schema(&self) -> Option<&OutputSchema> {
        self.task_output_schema
            .as_ref()
            .or(self.h.bundle.output_schema.as_ref())
    }

    /// Checks a final answer against the output schema ([`output::check_answer`]).
    pub(super) fn check_answer(&self, text: &str) -> AnswerCheck {
        let refused = self.count_new(output::is_refused_answer) as u32;
        let limit = self.h.bundle.harness.limits.output_retries;
        output::check_answer(self.output_schema(), text, refused, limit)
    }
}
