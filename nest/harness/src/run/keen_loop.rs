//! The Keen dialect's loop: no native tools; the tools section is in the system prompt; each
//! reply is parsed for one `<SYSTEM CALL>` block; results go back as user prompts. A resumed
//! run replays its log: answered turns go through the same decisions (so the ledger of calls is
//! rebuilt) without asking the model, recorded results are reused (exact Keen result kind), an
//! interrupted side-effecting native call is `effect_unknown`.

use std::time::Instant;

use agen_contract::run::{
    KeenResult, KeenToolKind, ToolCompleted, ToolFailed, ToolFailure, ToolStarted,
};
use serde_json::Value;

use super::replay::{effect_unknown_message, Replay};
use super::state::Run;
use super::turn::FlowModel;
use super::{lock, Message, RunEnd, RunEventBody};
use crate::model::ToolCall;

impl Run<'_> {
    /// The Keen text protocol: no native tools; the tools section is in the system prompt;
    /// each reply is parsed for one `<SYSTEM CALL>` block; results go back as user prompts.
    pub(super) async fn keen_loop(&self) -> RunEnd {
        use crate::keen::{
            parse_reply, recall_prompt, Decision, KeenRun, ToolResult, ToolTable, ToolTarget,
        };

        let keen = self.h.keen.as_deref();
        let mut table = ToolTable::from_bundle(keen);
        table.retain(|name| self.offers(name));
        for spec in self.offered_specs() {
            table.add_native(
                &spec.name,
                &spec.description,
                &crate::keen::native_context_hint(&spec.parameters),
            );
        }
        let section = crate::keen::tools_section(&table.specs());
        let system = if section.is_empty() {
            self.h.system_prompt.clone()
        } else {
            format!("{}\n\n{section}", self.h.system_prompt)
        };
        let limits = &self.h.bundle.harness.limits;
        let script_limits = crate::keen::ScriptLimits {
            timeout: limits.script_timeout,
            memory_bytes: (limits.script_memory_mb as usize).saturating_mul(1024 * 1024),
            ..Default::default()
        };
        let mut ledger = KeenRun::new(limits.max_tool_calls);
        let max_turns = limits.max_turns.max(1);
        // A resumed run replays the log: answered turns go through the same decisions (so the
        // ledger of calls is rebuilt) without asking the model, recorded results are reused.
        let mut replay = Replay::from_events(&self.req.replay);
        if let Some(end) = replay.finished.take() {
            return end;
        }
        if let Some(last) = replay.turns.keys().next_back() {
            self.activity(format!(
                "resuming at turn {} (attempt {})",
                last + 1,
                self.req.attempt
            ))
            .await;
        }
        for turn in 1..=max_turns {
            let reply_text = if let Some(message) = replay.turns.remove(&turn) {
                let text = match &message {
                    Message::Assistant { content, .. } => content.clone(),
                    _ => String::new(),
                };
                self.push(message);
                text
            } else {
                match self.ask(turn, &system, &Default::default()).await {
                    Ok(r) => r.text,
                    Err(end) => return end,
                }
            };
            let parsed = parse_reply(&reply_text);
            if let crate::keen::ParsedReply::Call(call) = &parsed {
                if !self.offers(&call.tool) {
                    let refusal = self
                        .refuse_denied_keen(&format!("keen_{turn}"), &call.tool)
                        .await;
                    self.push(Message::user(recall_prompt(
                        &ToolResult::ScriptError(refusal),
                        None,
                    )));
                    continue;
                }
                if self.is_keen_tool(&call.tool) && self.needs_approval(&call.tool) {
                    let asked = ToolCall {
                        id: format!("keen_{turn}"),
                        name: call.tool.clone(),
                        arguments: Value::String(call.context.clone()),
                    };
                    let refusal = match self.approve(&asked).await {
                        Ok(None) => None,
                        // A Keen call's arguments are its text context: edits are not taken.
                        Ok(Some(_)) => Some(format!("tool {} was not run: a person approved it with edited arguments, which a Keen tool cannot take; call it again with the arguments you need", call.tool)),
                        Err(refusal) => Some(refusal),
                    };
                    if let Some(refusal) = refusal {
                        self.push(Message::user(recall_prompt(
                            &ToolResult::ScriptError(refusal),
                            None,
                        )));
                        continue;
                    }
                }
            }
            let dispatch = match ledger.decide(&parsed, &table) {
                Decision::Answer => return RunEnd::answer(reply_text),
                Decision::Stop { log } => {
                    tracing::warn!(run_id = %self.req.run_id, "{log}");
                    return RunEnd::failed(format!("the run reached its limit of {} tool calls (limits.maxToolCalls in x-agen/harness.json)", limits.max_tool_calls));
                }
                Decision::Recall { prompt, log } => {
                    tracing::info!(run_id = %self.req.run_id, "{log}");
                    self.push(Message::user(prompt));
                    continue;
                }
                Decision::Dispatch(d) => d,
            };
            let call_id = format!("keen_{turn}");
            let replayed = self.keen_replayed(&mut replay, &call_id, &dispatch).await;
            let result: ToolResult = match (replayed, &dispatch.target) {
                (Some(r), _) => r,
                (None, ToolTarget::Native { arguments }) => {
                    let call = ToolCall {
                        id: call_id,
                        name: dispatch.tool.clone(),
                        arguments: Value::Object(arguments.clone()),
                    };
                    let r = self.run_call(&call).await;
                    if let Some(result) = r.finish {
                        return RunEnd::answer(result);
                    }
                    if r.unreachable {
                        ToolResult::TechnicalError(r.content)
                    } else if r.is_error {
                        ToolResult::ScriptError(r.content)
                    } else {
                        ToolResult::Answer(r.content)
                    }
                }
                (None, ToolTarget::Script { entry }) => {
                    let Some(keen) = keen else {
                        return RunEnd::failed("keen script tool without keen-tools.json");
                    };
                    let _ = self
                        .emit(
                            self.keen_started(
                                &call_id,
                                &dispatch.tool,
                                KeenToolKind::Script,
                                &dispatch.context,
                            ),
                            false,
                        )
                        .await;
                    self.activity(format!("running script tool {}", dispatch.tool))
                        .await;
                    let started = Instant::now();
                    let outcome = crate::keen::run_script_tool(
                        &keen.script_root,
                        entry,
                        &dispatch.context,
                        &script_limits,
                    )
                    .await;
                    let result = self
                        .bounded_keen_result(&dispatch.tool, ToolResult::from(outcome))
                        .await;
                    self.keen_tool_event(&call_id, &dispatch.tool, &result, started)
                        .await;
                    result
                }
                (
                    None,
                    ToolTarget::Flow {
                        controller,
                        start_node,
                    },
                ) => {
                    let Some(keen) = keen else {
                        return RunEnd::failed("keen flow tool without keen-tools.json");
                    };
                    let _ = self
                        .emit(
                            self.keen_started(
                                &call_id,
                                &dispatch.tool,
                                KeenToolKind::Flow,
                                &dispatch.context,
                            ),
                            false,
                        )
                        .await;
                    self.activity(format!("running flow tool {}", dispatch.tool))
                        .await;
                    let started = Instant::now();
                    let agent = FlowModel { run: self };
                    // Each script node has its own limit; the flow as a whole gets the
                    // run's tool timeout, like any other tool call.
                    let tool_timeout = self.h.bundle.harness.limits.tool_timeout;
                    let result = match tokio::time::timeout(
                        tool_timeout,
                        crate::keen::run_flow(
                            keen,
                            controller,
                            start_node,
                            &dispatch.context,
                            &agent,
                            &script_limits,
                        ),
                    )
                    .await
                    {
                        Ok(outcome) => ToolResult::from(outcome),
                        Err(_) => ToolResult::NoResponse(format!(
                            "flow {} ran past the tool timeout of {tool_timeout:?}",
                            dispatch.tool
                        )),
                    };
                    let result = self.bounded_keen_result(&dispatch.tool, result).await;
                    self.keen_tool_event(&call_id, &dispatch.tool, &result, started)
                        .await;
                    result
                }
            };
            if self.cancel.is_cancelled() {
                return self.cancelled_end();
            }
            if !matches!(result, ToolResult::Answer(_)) {
                tracing::info!(run_id = %self.req.run_id, tool = %dispatch.tool, "keen: {}", result.log_detail());
            }
            self.push(Message::user(recall_prompt(
                &result,
                dispatch.attempts_left,
            )));
            *lock(&self.next_turn_activity) =
                Some(format!("reading the result of {}", dispatch.tool));
        }
        self.max_turns_end()
    }

    /// The result of a Keen call the log of an earlier attempt already settles: its recorded
    /// result, or `effect_unknown` for an interrupted side-effecting native call (not sent
    /// again). `None`: run the call (never started, or read-only, idempotent, script, flow).
    async fn keen_replayed(
        &self,
        replay: &mut Replay,
        call_id: &str,
        dispatch: &crate::keen::ToolDispatch,
    ) -> Option<crate::keen::ToolResult> {
        // `finish` is run again (its recorded result is not the run's end).
        if dispatch.tool == super::builtin_names::BUILTIN_FINISH {
            return None;
        }
        if let Some(r) = replay.results.remove(call_id) {
            return Some(r.to_keen());
        }
        let side_effect = replay.started.remove(call_id)?;
        let native = matches!(dispatch.target, crate::keen::ToolTarget::Native { .. });
        if !side_effect || !native || self.policy_of_model_name(&dispatch.tool).retry_safe() {
            return None;
        }
        let content = effect_unknown_message(&dispatch.tool);
        let _ = self
            .emit(
                RunEventBody::ToolFailed(ToolFailed {
                    call_id: call_id.to_string(),
                    tool: dispatch.tool.clone(),
                    error: content.clone(),
                    reason: ToolFailure::EffectUnknown,
                    duration_ms: 0,
                    keen_result: None,
                    keen_text: None,
                }),
                true,
            )
            .await;
        Some(crate::keen::ToolResult::ScriptError(content))
    }

    /// A script's or flow's result within the recorded tool result limit (see `cut`), like an
    /// MCP tool's.
    async fn bounded_keen_result(
        &self,
        tool: &str,
        result: crate::keen::ToolResult,
    ) -> crate::keen::ToolResult {
        use crate::keen::ToolResult;
        match result {
            ToolResult::Answer(t) => ToolResult::Answer(self.bounded_tool_result(tool, t).await),
            ToolResult::ScriptError(t) => {
                ToolResult::ScriptError(self.bounded_tool_result(tool, t).await)
            }
            ToolResult::FlowError(t) => {
                ToolResult::FlowError(self.bounded_tool_result(tool, t).await)
            }
            ToolResult::TechnicalError(t) => {
                ToolResult::TechnicalError(self.bounded_tool_result(tool, t).await)
            }
            ToolResult::NoResponse(t) => ToolResult::NoResponse(t),
        }
    }

    async fn keen_tool_event(
        &self,
        call_id: &str,
        tool: &str,
        result: &crate::keen::ToolResult,
        started: Instant,
    ) {
        use crate::keen::ToolResult;
        let duration_ms = started.elapsed().as_millis() as u64;
        let completed = |text: &str, is_error: bool, keen_result: Option<KeenResult>| {
            RunEventBody::ToolCompleted(ToolCompleted {
                call_id: call_id.to_string(),
                tool: tool.to_string(),
                result: text.to_string(),
                is_error,
                duration_ms,
                keen_result,
            })
        };
        let failed = |keen_result: KeenResult, keen_text: Option<String>| {
            RunEventBody::ToolFailed(ToolFailed {
                call_id: call_id.to_string(),
                tool: tool.to_string(),
                error: result.log_detail(),
                reason: ToolFailure::Failed,
                duration_ms,
                keen_result: Some(keen_result),
                keen_text,
            })
        };
        let body = match result {
            ToolResult::Answer(text) => completed(text, false, None),
            ToolResult::ScriptError(text) => completed(text, true, Some(KeenResult::ScriptError)),
            ToolResult::FlowError(text) => completed(text, true, Some(KeenResult::FlowError)),
            ToolResult::TechnicalError(text) => {
                failed(KeenResult::TechnicalError, Some(text.clone()))
            }
            ToolResult::NoResponse(_) => failed(KeenResult::NoResponse, None),
        };
        let _ = self.emit(body, false).await;
    }

    /// Runs one turn's calls, concurrently unless `parallelToolCalls` is false; results in
    /// A script's or flow's `tool.started`; with `traceToolArguments` its arguments are the
    /// call's `!*context` (`{"context": "..."}`, redacted and capped like any call's).
    fn keen_started(
        &self,
        call_id: &str,
        tool: &str,
        kind: KeenToolKind,
        context: &str,
    ) -> RunEventBody {
        RunEventBody::ToolStarted(ToolStarted {
            call_id: call_id.to_string(),
            tool: tool.to_string(),
            model_name: None,
            side_effect: false,
            arguments: self.h.bundle.harness.trace_tool_arguments.then(|| {
                crate::redact::traced_arguments(
                    &serde_json::json!({ "context": context }),
                    &self.h.redactor,
                    &self.h.bundle.harness.sensitive_fields,
                )
            }),
            keen_kind: Some(kind),
            span_id: Some(agen_contract::run::trace::tool_span_id(
                self.req.run_id.as_str(),
                self.req.attempt,
                call_id,
            )),
        })
    }
}
