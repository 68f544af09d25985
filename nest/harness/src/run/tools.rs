//! Tool routing: one call goes to a built-in, to its MCP server or to a host tool; the
//! [`ToolPolicy`] decides whether a tool is side-effecting and whether an interrupted call may be
//! sent again; MCP and host calls carry `_meta` and their results go through secret redaction.
//!
//! The ledger costs one durable wait per side effect: its "started" is acknowledged durable
//! before the call is sent; its "completed" (or "failed") is streamed. Why that is enough: a
//! run's events keep their seq order on every hop (the sink queues them in seq order, the Nest
//! relays and resends them in order, the Hub appends them in order and acks cumulatively), so an
//! ack of any later event — the next "started", `run.finished` — covers the "completed" before
//! it, and everything the model did with the result comes after it in the log. A crash before
//! the "completed" is durable leaves the "started" alone: the call is `effect_unknown` on
//! resume and is never sent again.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use agen_contract::run::{trace, ToolCompleted, ToolFailed, ToolFailure, ToolStarted};
use agen_shared::bundle::Bundle;
use serde_json::Value;

use super::approval::edited_note;
use super::builtin_names::{
    BUILTIN_FINISH, BUILTIN_LOAD_SKILL, BUILTIN_READ_ARTIFACT, BUILTIN_REPORT_PROGRESS,
    BUILTIN_SAVE_ARTIFACT,
};
use super::delegate::BUILTIN_CALL_AGENT;
use super::host::{self, CallMeta, Registered, ToolContext};
use super::replay::effect_unknown_message;
use super::state::Run;
use super::tool_limits::{retry_activity, ToolLimits};
use super::{RunEventBody, SinkError};
use crate::mcp::{CallError, Interruption, NotSent, ToolInfo};
use crate::model::ToolCall;
use crate::redact::traced_arguments;

/// What the ledger needs to know of a tool: the one place this is decided (server hints,
/// overridden by `x-agen/config.json` `tools.<name>.sideEffect` / `.idempotent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolPolicy {
    /// "started" must be durable before the call is sent; never repeated blindly.
    pub side_effect: bool,
    /// Sending it twice does no more than sending it once.
    pub idempotent: bool,
}

impl ToolPolicy {
    /// Built-ins, Keen scripts (no IO) and tools the harness does not know are never
    /// side-effecting for the ledger.
    pub const HARMLESS: ToolPolicy = ToolPolicy {
        side_effect: false,
        idempotent: true,
    };

    /// The policy of a host tool of `bundle`: its hints, overridden by `tools.<name>`.
    pub fn of_host(bundle: &Bundle, spec: &super::HostToolSpec) -> ToolPolicy {
        let over = bundle.config.tool_override(&spec.name);
        ToolPolicy {
            side_effect: over.and_then(|o| o.side_effect).unwrap_or(!spec.read_only),
            idempotent: over.and_then(|o| o.idempotent).unwrap_or(spec.idempotent),
        }
    }

    /// `call_agent`/`start_agent`: the start of a child is durable before it is asked for, and
    /// sending the call again finds the same child (its client request id is the call's
    /// idempotency key), so an interrupted call is waited for again, never `effect_unknown`.
    pub const DELEGATE: ToolPolicy = ToolPolicy {
        side_effect: true,
        idempotent: true,
    };

    /// The policy of an MCP tool of `bundle`.
    pub fn of(bundle: &Bundle, tool: &ToolInfo) -> ToolPolicy {
        let over = bundle.config.tool_override(&tool.qualified_name());
        ToolPolicy {
            side_effect: over.and_then(|o| o.side_effect).unwrap_or(!tool.read_only),
            idempotent: over.and_then(|o| o.idempotent).unwrap_or(tool.idempotent),
        }
    }

    /// Whether an interrupted call may simply be sent again.
    pub fn retry_safe(self) -> bool {
        !self.side_effect || self.idempotent
    }
}

/// The result of one tool call, as the model will see it.
pub(super) struct CallResult {
    pub content: String,
    pub is_error: bool,
    /// The tool could not be reached or did not answer (timeout, cancel, server gone).
    pub unreachable: bool,
    /// `finish` was called with this result.
    pub finish: Option<String>,
}

impl CallResult {
    pub fn ok(content: impl Into<String>) -> CallResult {
        CallResult {
            content: content.into(),
            is_error: false,
            unreachable: false,
            finish: None,
        }
    }

    pub fn error(content: impl Into<String>) -> CallResult {
        CallResult {
            content: content.into(),
            is_error: true,
            unreachable: false,
            finish: None,
        }
    }
}

impl Run<'_> {
    /// The policy of the tool the model calls `model_name`.
    pub(super) fn policy_of_model_name(&self, model_name: &str) -> ToolPolicy {
        if let Some(tool) = self.h.host_tools.get(model_name) {
            return ToolPolicy::of_host(&self.h.bundle, &tool.spec);
        }
        match self.h.mcp_tools.get(model_name) {
            Some(tool) => ToolPolicy::of(&self.h.bundle, tool),
            None if self.h.is_delegate_tool(model_name) => ToolPolicy::DELEGATE,
            None => ToolPolicy::HARMLESS,
        }
    }

    /// Runs one turn's calls, concurrently unless `parallelToolCalls` is false; results in
    /// the order asked.
    pub(super) async fn run_calls(&self, calls: &[ToolCall]) -> Vec<CallResult> {
        // A turn with a call that needs approval runs its calls one at a time, in order.
        let asks = calls.iter().any(|c| self.needs_approval(&c.name));
        if self.h.bundle.harness.parallel_tool_calls && calls.len() > 1 && !asks {
            futures::future::join_all(calls.iter().map(|c| self.run_call(c))).await
        } else {
            let mut out = Vec::with_capacity(calls.len());
            for c in calls {
                out.push(self.run_call(c).await);
            }
            out
        }
    }

    pub(super) async fn run_call(&self, call: &ToolCall) -> CallResult {
        if self.cancel.is_cancelled() {
            return CallResult::error(format!(
                "tool {} was not run: the run was cancelled",
                call.name
            ));
        }
        if !self.offers(&call.name) {
            return CallResult::error(self.refuse_denied(call).await);
        }
        if self.needs_approval(&call.name) {
            match self.approve(call).await {
                Err(refusal) => return CallResult::error(refusal),
                Ok(Some(arguments)) => {
                    let edited = ToolCall {
                        arguments: arguments.clone(),
                        ..call.clone()
                    };
                    let mut r = self.dispatch(&edited).await;
                    r.content = format!("{}\n\n{}", edited_note(&arguments), r.content);
                    return r;
                }
                Ok(None) => {}
            }
        }
        self.dispatch(call).await
    }

    /// Sends an allowed (and, if it had to be, approved) call where its name points.
    async fn dispatch(&self, call: &ToolCall) -> CallResult {
        match call.name.as_str() {
            // Built-ins are spans of the trace like any call (`save_artifact` records its own).
            BUILTIN_FINISH => {
                let t = self.builtin_started(call).await;
                let r = self.finish_call(call);
                self.builtin_done(call, t, r).await
            }
            BUILTIN_LOAD_SKILL if !self.h.bundle.skills.is_empty() => {
                let t = self.builtin_started(call).await;
                let r = self.load_skill(call).await;
                self.builtin_done(call, t, r).await
            }
            BUILTIN_REPORT_PROGRESS if self.h.progress => {
                let t = self.builtin_started(call).await;
                let r = self.report_progress(call).await;
                self.builtin_done(call, t, r).await
            }
            BUILTIN_SAVE_ARTIFACT => self.save_artifact(call).await,
            BUILTIN_READ_ARTIFACT => {
                let t = self.builtin_started(call).await;
                let r = self.read_artifact(call).await;
                self.builtin_done(call, t, r).await
            }
            name if self.h.is_delegate_tool(name) => {
                self.delegate_call(call, name == BUILTIN_CALL_AGENT).await
            }
            name => match (self.h.host_tools.get(name), self.h.mcp_tools.get(name)) {
                (Some(tool), _) => self.call_tool(call, Target::Host(tool)).await,
                (None, Some(tool)) => self.call_tool(call, Target::Mcp(tool)).await,
                (None, None) => {
                    let mut names: Vec<String> =
                        self.offered_specs().into_iter().map(|s| s.name).collect();
                    names.sort();
                    let content = format!(
                        "unknown tool `{name}`; the available tools are: {}",
                        names.join(", ")
                    );
                    let _ = self
                        .emit(
                            self.failed(call, name, &content, ToolFailure::UnknownTool, 0),
                            false,
                        )
                        .await;
                    CallResult::error(content)
                }
            },
        }
    }

    /// The `tool.started` of a built-in call (streamed: a built-in has no side effect to
    /// make durable first); returns when it started.
    async fn builtin_started(&self, call: &ToolCall) -> Instant {
        let _ = self
            .emit(
                RunEventBody::ToolStarted(self.started(call, &call.name, false)),
                false,
            )
            .await;
        Instant::now()
    }

    /// The `tool.completed` of a built-in call, with its result as the model gets it.
    async fn builtin_done(&self, call: &ToolCall, started: Instant, r: CallResult) -> CallResult {
        let _ = self
            .emit(
                RunEventBody::ToolCompleted(ToolCompleted {
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    result: r.content.clone(),
                    is_error: r.is_error,
                    duration_ms: started.elapsed().as_millis() as u64,
                    keen_result: None,
                }),
                false,
            )
            .await;
        r
    }

    /// A `tool.failed` event for `call`.
    pub(super) fn failed(
        &self,
        call: &ToolCall,
        tool: &str,
        error: &str,
        reason: ToolFailure,
        duration_ms: u64,
    ) -> RunEventBody {
        RunEventBody::ToolFailed(ToolFailed {
            call_id: call.id.clone(),
            tool: tool.to_string(),
            error: error.to_string(),
            reason,
            duration_ms,
            keen_result: None,
            keen_text: None,
        })
    }

    /// A `tool.started` event for `call` (its span id is the one `_meta.traceparent` names).
    pub(super) fn started(&self, call: &ToolCall, tool: &str, side_effect: bool) -> ToolStarted {
        ToolStarted {
            call_id: call.id.clone(),
            tool: tool.to_string(),
            model_name: Some(call.name.clone()),
            side_effect,
            // Every call (built-ins too) records its arguments when the bundle asks.
            arguments: self.h.bundle.harness.trace_tool_arguments.then(|| {
                traced_arguments(
                    &call.arguments,
                    &self.h.redactor,
                    &self.h.bundle.harness.sensitive_fields,
                )
            }),
            keen_kind: None,
            span_id: Some(self.span_of(&call.id)),
        }
    }

    pub(super) fn span_of(&self, call_id: &str) -> String {
        trace::tool_span_id(self.req.run_id.as_str(), self.req.attempt, call_id)
    }

    /// Calls an MCP or a host tool through the ledger: the call-count limit, `tool.started`
    /// (durable first when side-effecting), the call with `_meta`, a timeout and the run's
    /// cancel, redaction, and the recorded result.
    async fn call_tool(&self, call: &ToolCall, target: Target<'_>) -> CallResult {
        let (qualified, policy) = match target {
            Target::Mcp(tool) => (tool.qualified_name(), ToolPolicy::of(&self.h.bundle, tool)),
            Target::Host(tool) => (
                tool.spec.name.clone(),
                ToolPolicy::of_host(&self.h.bundle, &tool.spec),
            ),
        };
        let side_effect = policy.side_effect;
        let limits = ToolLimits::of(&self.h.bundle, &qualified, policy);
        let started_at = Instant::now();

        let arguments = match &call.arguments {
            Value::Object(o) => o.clone(),
            other => {
                let content = format!(
                    "the arguments of {} must be a JSON object, got: {other}",
                    call.name
                );
                let _ = self
                    .emit(
                        self.failed(call, &qualified, &content, ToolFailure::BadArguments, 0),
                        false,
                    )
                    .await;
                return CallResult::error(content);
            }
        };
        let limit = self.h.bundle.harness.limits.max_tool_calls;
        let n = self.tool_calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n > limit {
            let content = format!("the run's limit of {limit} tool calls is spent (limits.maxToolCalls); {} was not called; answer with what you have", call.name);
            let _ = self
                .emit(
                    self.failed(call, &qualified, &content, ToolFailure::Limit, 0),
                    false,
                )
                .await;
            return CallResult::error(content);
        }

        // `tool.started` also says what the task is doing now ("calling TOOL"): no `activity`
        // event of its own follows it.
        let started = self.started(call, &qualified, side_effect);
        if let Err(e) = self
            .emit(RunEventBody::ToolStarted(started), side_effect)
            .await
        {
            // A side-effecting call is never sent before its start is durable.
            return CallResult::error(format!("tool {qualified} was not called: {e}"));
        }

        let timeout = match target {
            Target::Mcp(tool) => call_timeout(limits.timeout, &tool.input_schema, &arguments),
            Target::Host(_) => limits.timeout,
        };
        // Sent while the run is cancelled, the call would be cut off at once: it is not sent.
        if self.cancel.is_cancelled() {
            let content = format!("tool {qualified} was not run: the run was cancelled");
            let _ = self
                .emit(
                    self.failed(call, &qualified, &content, ToolFailure::Cancelled, 0),
                    false,
                )
                .await;
            return CallResult::error(content);
        }
        let mut retries = 0;
        // The first attempt that may have reached the server: a later attempt that was never
        // sent (its server could not be restarted) does not make the call "not run".
        let mut maybe_ran: Option<CallError> = None;
        let result = loop {
            let result = self
                .send(call, target, arguments.clone(), side_effect, timeout)
                .await;
            let result = match result {
                Err(e) if !e.may_have_run() && maybe_ran.is_some() => {
                    break Err(maybe_ran.take().unwrap_or(e))
                }
                other => other,
            };
            let wait = match &result {
                Err(e) => limits.retry_after(e, retries),
                Ok(_) => None,
            };
            let (wait, e) = match (wait, result) {
                (Some(wait), Err(e)) => (wait, e),
                (_, result) => break result,
            };
            retries += 1;
            self.activity(retry_activity(
                &qualified,
                &e,
                retries,
                limits.allowed(&e),
                wait,
            ))
            .await;
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.cancel.cancelled() => break Err(e),
            }
            // A server that died is started again (as it was at the start) before the resend.
            if let (
                Target::Mcp(tool),
                CallError::Interrupted {
                    cause: Interruption::Lost(_),
                    ..
                },
            ) = (target, &e)
            {
                if let Err(why) = self.h.tools.restart(&tool.server).await {
                    tracing::warn!(run_id = %self.req.run_id, tool = %qualified, "not sent again: its server could not be restarted: {why}");
                    break Err(e);
                }
            }
            if e.may_have_run() && maybe_ran.is_none() {
                maybe_ran = Some(e);
            }
        };
        let duration_ms = started_at.elapsed().as_millis() as u64;
        let (body, out) = match result {
            Ok(o) => {
                // A tool that echoes a secret (a header, a DSN) does not leak it into the run
                // log, the trace or the model's context.
                let text = self.h.redactor.redact(&o.text);
                let text = self.bounded_tool_result(&qualified, text).await;
                (
                    RunEventBody::ToolCompleted(ToolCompleted {
                        call_id: call.id.clone(),
                        tool: qualified.clone(),
                        result: text.clone(),
                        is_error: o.is_error,
                        duration_ms,
                        keen_result: None,
                    }),
                    CallResult {
                        content: text,
                        is_error: o.is_error,
                        unreachable: false,
                        finish: None,
                    },
                )
            }
            Err(e) => {
                let (reason, content) = failure_text(&e, &qualified, &call.name, policy);
                let content = self.h.redactor.redact(&content);
                // `effect_unknown` is told as the resume tells it (a Keen script error), not
                // as a tool that could not be reached.
                let unreachable = reason != ToolFailure::EffectUnknown
                    && matches!(
                        e,
                        CallError::Interrupted { .. }
                            | CallError::NotSent(
                                NotSent::NotConnected(_) | NotSent::Timeout(_) | NotSent::Cancelled
                            )
                    );
                (
                    self.failed(call, &qualified, &content, reason, duration_ms),
                    CallResult {
                        content,
                        is_error: true,
                        unreachable,
                        finish: None,
                    },
                )
            }
        };
        // "completed" is streamed, never waited for: the sink keeps a run's events in seq order
        // on every hop and the Hub acks cumulatively, so nothing after it (the next model turn,
        // the next side effect's "started", which is waited for, or run.finished) can be
        // durable unless it is. A crash before it is durable leaves "started" alone in the
        // ledger: the call is effect_unknown on resume, never repeated.
        let recorded = if side_effect {
            self.emit_streamed(body).await
        } else {
            self.emit(body, false).await
        };
        if let Err(e) = recorded {
            tracing::warn!(run_id = %self.req.run_id, tool = %qualified, "tool result not durable: {e}");
            // The model must not act on a side-effecting result the ledger does not hold.
            if matches!(e, SinkError::Fenced) {
                self.cancel.cancel();
            } else {
                self.lose_log(format!(
                    "the run stopped: the result of {qualified} could not be recorded in the run log ({e})"
                ));
            }
        }
        out
    }

    /// Sends one attempt of a ledgered call to its server or host tool.
    async fn send(
        &self,
        call: &ToolCall,
        target: Target<'_>,
        arguments: serde_json::Map<String, Value>,
        side_effect: bool,
        timeout: Duration,
    ) -> Result<crate::mcp::ToolOutput, CallError> {
        match target {
            Target::Mcp(tool) => {
                self.h
                    .tools
                    .call_tool(
                        tool,
                        arguments,
                        self.call_meta(&call.id, side_effect).to_map(),
                        timeout,
                        self.cancel.clone(),
                    )
                    .await
            }
            Target::Host(tool) => {
                let cx = ToolContext {
                    call_id: call.id.clone(),
                    meta: self.call_meta(&call.id, side_effect),
                    cancel: self.cancel.child_token(),
                };
                host::call(tool, arguments, cx, timeout).await
            }
        }
    }

    /// `_meta` of a call: the work it belongs to and the call's span in the run's trace.
    fn call_meta(&self, call_id: &str, side_effect: bool) -> CallMeta {
        let r = self.req;
        CallMeta {
            namespace: r.namespace.clone(),
            deployment: r.deployment.clone(),
            task_id: r.task_id.to_string(),
            run_id: r.run_id.to_string(),
            root_run_id: r.root_run_id().to_string(),
            conversation_id: r.conversation_id.clone(),
            conversation_key: r.conversation_key.clone(),
            labels: r.labels.clone(),
            traceparent: trace::traceparent(&self.trace_id, &self.span_of(call_id)),
            idempotency_key: side_effect.then(|| self.idempotency_key(call_id)),
        }
    }
}

/// Why a call produced no result, and what the model is told. A side-effecting call that may
/// have reached its server (a timeout, a cancel, a server that died, a lost connection) is
/// `effect_unknown` in the words a resume uses, however it was cut off; only a call that never
/// left this process says it was not run. A retry-safe call cut off by a cancel stays
/// `cancelled` (no result: a resume sends it again).
fn failure_text(
    e: &CallError,
    qualified: &str,
    model_name: &str,
    policy: ToolPolicy,
) -> (ToolFailure, String) {
    let retried_on_resume = policy.retry_safe();
    match e {
        CallError::Interrupted {
            cause: Interruption::Cancelled,
            ..
        } if retried_on_resume => (
            ToolFailure::Cancelled,
            format!("tool {qualified} was cancelled with the run"),
        ),
        CallError::Interrupted { cause, .. } if policy.side_effect => (
            ToolFailure::EffectUnknown,
            format!("{} ({cause})", effect_unknown_message(model_name)),
        ),
        CallError::Interrupted { cause, .. } => match cause {
            Interruption::Timeout(d) => (
                ToolFailure::Timeout,
                format!(
                    "tool {qualified} timed out after {} and was cancelled",
                    agen_shared::duration::format_duration(*d)
                ),
            ),
            Interruption::Cancelled => (
                ToolFailure::Cancelled,
                format!("tool {qualified} was cancelled with the run"),
            ),
            Interruption::Lost(why) => (
                ToolFailure::Failed,
                format!("tool {qualified} got no answer: {why}"),
            ),
        },
        CallError::NotSent(n) => match n {
            NotSent::NotConnected(server) => (
                ToolFailure::Failed,
                format!("tool {qualified} cannot run: its server {server} is not connected"),
            ),
            NotSent::UnknownTool(_) => (
                ToolFailure::UnknownTool,
                format!("tool {qualified} is not available on its server"),
            ),
            NotSent::BadArguments { .. } => {
                (ToolFailure::Failed, format!("tool {qualified} failed: {n}"))
            }
            NotSent::Cancelled => (
                ToolFailure::Cancelled,
                format!("tool {qualified} was not run: the run was cancelled"),
            ),
            NotSent::Timeout(d) => (
                ToolFailure::Timeout,
                format!(
                    "tool {qualified} was not run: its server did not take the call within {}",
                    agen_shared::duration::format_duration(*d)
                ),
            ),
        },
        CallError::Failed { message, .. } => (
            ToolFailure::Failed,
            format!("tool {qualified} failed: {message}"),
        ),
    }
}

/// What a ledgered call goes to.
#[derive(Clone, Copy)]
enum Target<'a> {
    Mcp(&'a ToolInfo),
    Host(&'a Registered),
}

/// Slack a call gets past the time it asked its server for, so the server's own timeout
/// answers first.
const ASKED_TIMEOUT_GRACE: Duration = Duration::from_secs(10);

/// How long an MCP call may take: `limits.toolTimeout`, or longer when the call asks its
/// server for more with a `timeout` argument (seconds) that the tool's schema documents with a
/// `maximum` (the workspace `run`: up to 15 minutes): the asked time, capped at that maximum,
/// plus a grace.
fn call_timeout(
    limit: Duration,
    schema: &Value,
    arguments: &serde_json::Map<String, Value>,
) -> Duration {
    let maximum = schema
        .pointer("/properties/timeout/maximum")
        .and_then(Value::as_f64)
        .filter(|m| m.is_finite() && *m > 0.0);
    let asked = arguments.get("timeout").and_then(Value::as_f64);
    match (maximum, asked) {
        (Some(max), Some(asked)) if asked > 0.0 => {
            let secs = asked.min(max).min(86_400.0);
            limit.max(Duration::from_secs_f64(secs) + ASKED_TIMEOUT_GRACE)
        }
        _ => limit,
    }
}

#[cfg(test)]
mod call_timeout_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_call_may_ask_up_to_the_maximum_its_tool_documents() {
        let limit = Duration::from_secs(600);
        let schema = json!({"properties": {"timeout": {"type": "integer", "maximum": 900}}});
        let args = |v: Value| v.as_object().cloned().unwrap_or_default();
        let check = |schema: &Value, a: Value, secs: u64| {
            assert_eq!(
                call_timeout(limit, schema, &args(a.clone())),
                Duration::from_secs(secs),
                "{a}"
            );
        };
        check(&schema, json!({"timeout": 900}), 910);
        check(&schema, json!({"timeout": 5000}), 910);
        check(&schema, json!({"timeout": 60}), 600);
        check(&schema, json!({}), 600);
        check(&schema, json!({"timeout": "900"}), 600);
        check(
            &json!({"properties": {"timeout": {"type": "integer"}}}),
            json!({"timeout": 900}),
            600,
        );
    }
}
