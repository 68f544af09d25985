//! One model turn: `model.requested`, the request (its text streamed to the sink's `delta` as
//! it arrives, not durable), `model.answered` with the turn's new assistant message (never the
//! whole context); and the model as a Keen flow's `agent` nodes
//! see it.

use agen_contract::run::{ModelAnswered, ModelRequested};

use super::state::Run;
use super::{lock, Message, RunEnd, RunEventBody};
use crate::artifacts;
use crate::model::{ModelDelta, ModelError, ModelReply, ModelRequest, ToolSpec};

impl Run<'_> {
    /// Asks the model one turn; the reply's assistant message is added to the context.
    /// `Err` is the run's end (error or cancel).
    pub(super) async fn ask(
        &self,
        turn: u32,
        system: &str,
        tools: &std::sync::Arc<[ToolSpec]>,
    ) -> Result<ModelReply, RunEnd> {
        if self.cancel.is_cancelled() {
            return Err(self.cancelled_end());
        }
        // A safe point: no call is in flight between turns.
        let interrupt = self.sink().interrupt();
        if interrupt.as_ref().is_some_and(|t| t.is_cancelled()) {
            return Err(RunEnd::cancelled(super::INTERRUPTED));
        }
        if let Err(why) = self.budget.check(true) {
            tracing::info!(run_id = %self.req.run_id, "{why}");
            return Err(RunEnd::failed(why));
        }
        self.flush_progress(false).await;
        let activity = lock(&self.next_turn_activity)
            .take()
            .unwrap_or_else(|| format!("waiting for the model ({})", self.h.provider.describe()));
        let _ = self
            .emit(
                RunEventBody::ModelRequested(ModelRequested {
                    turn: Some(turn),
                    flow_agent: false,
                    activity: Some(activity),
                }),
                false,
            )
            .await;
        let request = ModelRequest {
            system: system.to_string(),
            messages: lock(&self.context).clone(),
            tools: tools.clone(),
            parallel_tool_calls: self.h.bundle.harness.parallel_tool_calls,
            output_schema: self.output_schema().map(|s| s.schema.clone()),
        };
        let sink = self.sink();
        let on_delta = |d: ModelDelta<'_>| sink.delta(turn, d);
        let asked = self.h.provider.complete(&request, &self.cancel, &on_delta);
        // A model request is a safe point too: nothing it does has an effect.
        let reply = match &interrupt {
            Some(t) => tokio::select! {
                r = asked => r,
                _ = t.cancelled() => {
                    tracing::info!(run_id = %self.req.run_id, turn, "run interrupted during a model request");
                    return Err(RunEnd::cancelled(super::INTERRUPTED));
                }
            },
            None => asked.await,
        };
        // The request shares the context: gone before the context grows, so that the push
        // below does not copy it.
        drop(request);
        let reply = match reply {
            Ok(r) => r,
            Err(ModelError::Cancelled) => return Err(self.cancelled_end()),
            Err(e) => {
                tracing::warn!(run_id = %self.req.run_id, "model error ends the run: {e}");
                return Err(RunEnd::failed(e.to_string()));
            }
        };
        self.budget.record(reply.usage, true);
        let mut reply = reply;
        self.own_call_ids(&mut reply);
        let message = reply.message();
        self.push(message.clone());
        let _ = self
            .emit(
                RunEventBody::ModelAnswered(ModelAnswered {
                    turn: Some(turn),
                    flow_agent: false,
                    message: Some(self.stored(&artifacts::elide_saved_content(&message))),
                    usage: reply.usage,
                    stop_reason: reply.stop_reason.clone(),
                    response_id: reply.id.clone(),
                    response_model: reply.model.clone(),
                    error: None,
                }),
                false,
            )
            .await;
        Ok(reply)
    }
}

impl Run<'_> {
    /// Gives the reply's tool calls ids of the run's own: `call_<n>`, `n` counting every tool
    /// call of the conversation from 1 (skipping an id the conversation already has). The
    /// model's ids are never used for identity (the ledger, approvals, traces, delegate runs
    /// key on the call id): a model that repeats an id must not make two calls one. A resumed
    /// run replays the logged message, so its ids stay the same on every attempt.
    fn own_call_ids(&self, reply: &mut ModelReply) {
        if reply.tool_calls.is_empty() {
            return;
        }
        let mut taken = std::collections::HashSet::new();
        for m in lock(&self.context).iter() {
            if let Message::Assistant { tool_calls, .. } = m {
                taken.extend(tool_calls.iter().map(|c| c.id.clone()));
            }
        }
        let mut n = taken.len();
        for call in &mut reply.tool_calls {
            call.id = loop {
                n += 1;
                let id = format!("call_{n}");
                if taken.insert(id.clone()) {
                    break id;
                }
            };
        }
    }
}

/// The bundle's model as a Keen flow's `agent` nodes see it: one request with the agent's
/// system prompt and the node's prompt (plus the flow's context), logged like any model turn.
pub(super) struct FlowModel<'r, 'h> {
    pub(super) run: &'r Run<'h>,
}

#[async_trait::async_trait]
impl crate::keen::FlowAgent for FlowModel<'_, '_> {
    async fn ask(&self, prompt: &str, context: &str) -> Result<(String, String), String> {
        let text = if context.trim().is_empty() {
            prompt.to_string()
        } else {
            format!("{prompt}\n\n{context}")
        };
        self.run.budget.check(false)?;
        let request = ModelRequest {
            system: self.run.h.system_prompt.clone(),
            messages: vec![Message::user(text)].into(),
            tools: Default::default(),
            parallel_tool_calls: false,
            output_schema: None,
        };
        let _ = self
            .run
            .emit(
                RunEventBody::ModelRequested(ModelRequested {
                    turn: None,
                    flow_agent: true,
                    activity: None,
                }),
                false,
            )
            .await;
        match self
            .run
            .h
            .provider
            .complete(&request, &self.run.cancel, &|_| {})
            .await
        {
            Ok(reply) => {
                self.run.budget.record(reply.usage, false);
                let _ = self
                    .run
                    .emit(
                        RunEventBody::ModelAnswered(ModelAnswered {
                            turn: None,
                            flow_agent: true,
                            message: Some(self.run.stored(&reply.message())),
                            usage: reply.usage,
                            stop_reason: None,
                            response_id: None,
                            response_model: None,
                            error: None,
                        }),
                        false,
                    )
                    .await;
                Ok((reply.text, "text".to_string()))
            }
            Err(ModelError::Cancelled) => Err("the run was cancelled".to_string()),
            Err(e) => Ok((e.to_string(), "error".to_string())),
        }
    }
}
