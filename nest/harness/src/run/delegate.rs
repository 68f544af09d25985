//! Delegates: `call_agent(agent, input, conversation_key?)` runs a task on a deployment the
//! bundle lists in `x-agen/config.json` `delegates` as a child task of this run and returns
//! its result; `start_agent(…)` (fleet only) starts it and returns its task id at once. Who
//! runs the child is the harness's [`Delegator`] (the instance's Nest → the Hub); without one a
//! call says it needs a fleet.
//!
//! Invariants: a delegate call is side-effecting for the ledger (`tool.started` is durable
//! before the child is asked for) and its child's client request id is the call's idempotency
//! key (`<run id>:<the call's position in the run>`), the same on every resume, so a resumed
//! call finds its child again instead of starting a second one: that is why the
//! [`ToolPolicy`](super::ToolPolicy) of a delegate call is retry-safe and never
//! `effect_unknown`. A call to an agent that is not a listed delegate, or one past
//! `limits.maxDelegationDepth`, is a tool error the model can act on and starts nothing.
//! A delegate that is a remote A2A agent is called by [`super::remote`] instead (no child task,
//! no delegation depth: the remote agent's work is not part of this tree).

use std::time::{Duration, Instant};

use agen_contract::run::{RunState, RunSuspended, ToolCompleted, ToolFailure, WaitingFor};
use agen_shared::bundle::Delegate;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::harness::Harness;
use super::state::Run;
use super::tools::CallResult;
use super::{RunAssignment, RunEventBody};
use crate::model::{ToolCall, ToolSpec};
use crate::redact::traced_arguments;

pub const BUILTIN_CALL_AGENT: &str = "call_agent";
pub const BUILTIN_START_AGENT: &str = "start_agent";

/// How long one wait for a child asks its delegator for, before asking again.
const WAIT_STEP: Duration = Duration::from_secs(30);

/// A child task to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildRequest {
    /// `None`: the caller's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    pub deployment: String,
    pub input: String,
    #[serde(default)]
    pub conversation_key: String,
    /// The call's `agen/idempotencyKey`: the child's client request id.
    pub idempotency_key: String,
    /// The call's span in the caller's trace: the child's spans nest under it.
    #[serde(default)]
    pub parent_span_id: String,
}

/// How a child task ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildEnd {
    pub state: RunState,
    /// Its final answer, or what went wrong.
    pub result: String,
    /// Ids of the artifacts it saved.
    #[serde(default)]
    pub artifacts: Vec<String>,
}

/// Who runs child tasks: the fleet instance asks its Nest (which asks the Hub); a trait so the
/// loop knows neither.
#[async_trait::async_trait]
pub trait Delegator: Send + Sync {
    /// Starts the child of `parent`'s call (or finds the one its idempotency key already
    /// made); returns its task id.
    async fn start(&self, parent: &RunAssignment, child: ChildRequest) -> Result<String, String>;
    /// Waits up to `wait` for the child to end; `None` when it is still running.
    async fn wait(
        &self,
        parent: &RunAssignment,
        task_id: &str,
        wait: Duration,
    ) -> Result<Option<ChildEnd>, String>;
    /// Cancels the child.
    async fn cancel(
        &self,
        parent: &RunAssignment,
        task_id: &str,
        reason: &str,
    ) -> Result<(), String>;
    /// Whether children may outlive the call (`start_agent`): only in a fleet.
    fn detached(&self) -> bool;
    /// How long a `call_agent` waits in place for its child before the run gives its instance
    /// slot back and is resumed when the child ends (`None`: it waits in place). The fleet's
    /// delegator suspends, so that an agent can delegate to its own 1-slot deployment.
    fn suspend_after(&self) -> Option<Duration> {
        None
    }
}

/// The delegate's name as the model gives it: its deployment, or `namespace/deployment`.
fn delegate_name(d: &Delegate) -> String {
    match &d.namespace {
        Some(ns) => format!("{ns}/{}", d.deployment),
        None => d.deployment.clone(),
    }
}

/// The delegate tools `h` offers (none without delegates).
pub(super) fn specs(h: &Harness) -> Vec<ToolSpec> {
    let delegates = &h.bundle.config.delegates;
    if delegates.is_empty() {
        return Vec::new();
    }
    let list: Vec<String> = delegates
        .iter()
        .map(|d| {
            let remote = if d.is_remote() {
                " (remote agent; call_agent only)"
            } else {
                ""
            };
            match &d.description {
                Some(text) => format!("- {}{remote} — {text}", delegate_name(d)),
                None => format!("- {}{remote}", delegate_name(d)),
            }
        })
        .collect();
    let names: Vec<String> = delegates.iter().map(delegate_name).collect();
    let parameters = json!({"type": "object", "properties": {
        "agent": {"type": "string", "enum": names, "description": "the delegate to run"},
        "input": {"type": "string", "description": "the task for it, as you would write it to a colleague"},
        "conversation_key": {"type": "string", "description": "optional: tasks with one key continue one conversation with that agent"}
    }, "required": ["agent", "input"]});
    let mut specs = vec![ToolSpec {
        name: BUILTIN_CALL_AGENT.into(),
        description: format!(
            "Run a task on another agent and wait for its answer (and the ids of the artifacts it saved). Agents:\n{}",
            list.join("\n")
        ),
        parameters: parameters.clone(),
    }];
    if h.delegator.as_ref().is_some_and(|d| d.detached()) {
        specs.push(ToolSpec {
            name: BUILTIN_START_AGENT.into(),
            description: format!(
                "Start a task on another agent and return its task id at once, without waiting; the task goes on after this run ends. Agents:\n{}",
                list.join("\n")
            ),
            parameters,
        });
    }
    specs
}

impl Harness {
    /// Whether `model_name` is a delegate tool this harness offers.
    pub(super) fn is_delegate_tool(&self, model_name: &str) -> bool {
        !self.bundle.config.delegates.is_empty()
            && (model_name == BUILTIN_CALL_AGENT
                || (model_name == BUILTIN_START_AGENT
                    && self.delegator.as_ref().is_some_and(|d| d.detached())))
    }
}

fn text_arg<'a>(call: &'a ToolCall, key: &str) -> Option<&'a str> {
    call.arguments.get(key).and_then(Value::as_str)
}

impl Run<'_> {
    /// `call_agent` (`wait`) or `start_agent`.
    pub(super) async fn delegate_call(&self, call: &ToolCall, wait: bool) -> CallResult {
        let tool = call.name.as_str();
        let started_at = Instant::now();
        let delegates = &self.h.bundle.config.delegates;
        let agent = text_arg(call, "agent").unwrap_or_default();
        let names: Vec<String> = delegates.iter().map(delegate_name).collect();
        let Some(delegate) = delegates
            .iter()
            .find(|d| delegate_name(d) == agent || d.deployment == agent)
        else {
            return self
                .refuse(call, ToolFailure::BadArguments, format!(
                    "{tool}: `{agent}` is not one of this agent's delegates (x-agen/config.json delegates); call one of: {}",
                    names.join(", ")
                ))
                .await;
        };
        let input = match text_arg(call, "input") {
            Some(s) if !s.trim().is_empty() => s.to_string(),
            _ => {
                return self
                    .refuse(
                        call,
                        ToolFailure::BadArguments,
                        format!("{tool} needs `input`: the task for {agent}, as text"),
                    )
                    .await
            }
        };
        let conversation_key = text_arg(call, "conversation_key")
            .unwrap_or_default()
            .to_string();
        if let Some(remote) = &delegate.a2a {
            if !wait {
                return self
                    .refuse(call, ToolFailure::BadArguments, format!(
                        "{tool} cannot start remote agent {agent}: it is an A2A agent outside the fleet; use call_agent to run a task on it and wait for the answer"
                    ))
                    .await;
            }
            return self
                .remote_call(call, delegate, remote, input, conversation_key)
                .await;
        }
        let max = self.h.bundle.harness.limits.max_delegation_depth;
        let depth = self.req.delegation_depth + 1;
        if depth > max {
            return self
                .refuse(call, ToolFailure::Limit, format!(
                    "{tool} to {agent} was not run: it would make the delegation tree {depth} deep, over limits.maxDelegationDepth of {max} (x-agen/harness.json); do this part yourself or answer with what you have"
                ))
                .await;
        }
        let Some(delegator) = self.h.delegator.clone() else {
            return self
                .refuse(call, ToolFailure::Failed, format!(
                    "{tool} to {agent} cannot run here: delegate `{}` needs a fleet (deploy both agents to a Hub); answer without it",
                    delegate.deployment
                ))
                .await;
        };
        if let Some(refused) = self.spend_tool_call(call).await {
            return refused;
        }

        let mut started = self.started(call, tool, true);
        if self.h.bundle.harness.trace_tool_arguments {
            started.arguments = Some(traced_arguments(
                &call.arguments,
                &self.h.redactor,
                &self.h.bundle.harness.sensitive_fields,
            ));
        }
        if let Err(e) = self.emit(RunEventBody::ToolStarted(started), true).await {
            // No child is asked for before the call's start is durable.
            return CallResult::error(format!("{tool} was not called: {e}"));
        }
        let child = ChildRequest {
            namespace: delegate.namespace.clone(),
            deployment: delegate.deployment.clone(),
            input,
            conversation_key,
            idempotency_key: self.idempotency_key(&call.id),
            parent_span_id: self.span_of(&call.id),
        };
        self.activity(format!("starting a task on {agent}")).await;
        let task_id = match delegator.start(self.req, child).await {
            Ok(id) => id,
            Err(e) => {
                let content = format!("{tool}: could not start a task on {agent}: {e}");
                return self
                    .record_failure(call, ToolFailure::Failed, content, started_at)
                    .await;
            }
        };
        if !wait {
            let content = json!({"task_id": task_id, "agent": agent}).to_string();
            return self.record_result(call, content, started_at).await;
        }
        self.activity(format!("waiting for task {task_id} on {agent}"))
            .await;
        let timeout = self.h.bundle.harness.limits.tool_timeout;
        // A resumed wait keeps the deadline the first attempt's wait was given.
        let deadline = match super::replay::wait_deadline(&self.req.replay, &call.id) {
            Some(ms) => {
                let left = (ms - crate::artifacts::now_ms()).max(0) as u64;
                (Instant::now() + Duration::from_millis(left)).min(started_at + timeout)
            }
            None => started_at + timeout,
        };
        let waiting = Instant::now();
        let end = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let reason = format!(
                    "the calling run's toolTimeout of {} ran out",
                    agen_shared::duration::format_duration(timeout)
                );
                if let Err(e) = delegator.cancel(self.req, &task_id, &reason).await {
                    tracing::warn!(run_id = %self.req.run_id, task = %task_id, "cannot cancel a timed-out child: {e}");
                }
                let content = format!(
                    "{tool}: task {task_id} on {agent} did not finish within {} (limits.toolTimeout) and was cancelled",
                    agen_shared::duration::format_duration(timeout)
                );
                return self
                    .record_failure(call, ToolFailure::Timeout, content, started_at)
                    .await;
            }
            let step = match delegator.suspend_after() {
                Some(s) => left.min(WAIT_STEP).min(s.saturating_sub(waiting.elapsed())),
                None => left.min(WAIT_STEP),
            };
            if step.is_zero() {
                // Still running after the wait in place: give the slot back. The Hub resumes
                // this run when the child ends, or cancels the child at the deadline.
                self.suspend(RunSuspended {
                    waiting_for: WaitingFor::Child {
                        call_id: call.id.clone(),
                        task_id: task_id.clone(),
                    },
                    deadline_ms: crate::artifacts::now_ms() + left.as_millis() as i64,
                    on_deadline: format!(
                        "the calling run's toolTimeout of {} ran out",
                        agen_shared::duration::format_duration(timeout)
                    ),
                });
                return CallResult::error(format!(
                    "{tool}: task {task_id} on {agent} is still running; the run gave its slot back while it waits"
                ));
            }
            let asked = tokio::select! {
                r = delegator.wait(self.req, &task_id, step) => r,
                _ = self.cancel.cancelled() => {
                    // Not a result: a resume waits for the same child again; a cancelled
                    // task cancels its children at the Hub.
                    let content = format!("{tool}: the run was cancelled while task {task_id} on {agent} ran");
                    let _ = self
                        .emit(self.failed(call, tool, &content, ToolFailure::Cancelled, 0), false)
                        .await;
                    return CallResult::error(content);
                }
            };
            match asked {
                Ok(Some(end)) => break end,
                Ok(None) => {}
                Err(e) => {
                    // The Nest may be reconnecting: ask again shortly, within the deadline.
                    tracing::info!(run_id = %self.req.run_id, task = %task_id, "waiting for a child failed, asking again: {e}");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1).min(left)) => {}
                        _ = self.cancel.cancelled() => {}
                    }
                }
            }
        };
        match end.state {
            RunState::Succeeded => {
                let mut content = end.result;
                if !end.artifacts.is_empty() {
                    content.push_str(&format!(
                        "\n\n(task {task_id} saved artifacts: {})",
                        end.artifacts.join(", ")
                    ));
                }
                self.record_result(call, content, started_at).await
            }
            state => {
                let how = if state == RunState::Cancelled {
                    "was cancelled"
                } else {
                    "failed"
                };
                let content = format!("{tool}: task {task_id} on {agent} {how}: {}", end.result);
                self.record_failure(call, ToolFailure::Failed, content, started_at)
                    .await
            }
        }
    }

    /// The call's idempotency key: the run id and the call's position in the run (the same on
    /// every resume, different for every other call).
    pub(super) fn idempotency_key(&self, call_id: &str) -> String {
        match self.call_position(call_id) {
            Some(n) => format!("{}:{n}", self.req.run_id),
            None => format!("{}:{call_id}", self.req.run_id),
        }
    }

    /// Counts the call against `limits.maxToolCalls`; the refusal when the limit is spent.
    pub(super) async fn spend_tool_call(&self, call: &ToolCall) -> Option<CallResult> {
        let limit = self.h.bundle.harness.limits.max_tool_calls;
        let n = self
            .tool_calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        if n <= limit {
            return None;
        }
        let tool = &call.name;
        Some(
            self.refuse(call, ToolFailure::Limit, format!(
                "the run's limit of {limit} tool calls is spent (limits.maxToolCalls); {tool} was not called; answer with what you have"
            ))
            .await,
        )
    }

    /// A call refused before anything was sent: recorded (not durable) and answered.
    pub(super) async fn refuse(
        &self,
        call: &ToolCall,
        reason: ToolFailure,
        content: String,
    ) -> CallResult {
        let _ = self
            .emit(self.failed(call, &call.name, &content, reason, 0), false)
            .await;
        CallResult::error(content)
    }

    /// A failure after the start: durable before the model sees it.
    pub(super) async fn record_failure(
        &self,
        call: &ToolCall,
        reason: ToolFailure,
        content: String,
        started_at: Instant,
    ) -> CallResult {
        let ms = started_at.elapsed().as_millis() as u64;
        self.durable(self.failed(call, &call.name, &content, reason, ms))
            .await;
        CallResult::error(content)
    }

    /// The result after the start: durable before the model sees it.
    pub(super) async fn record_result(
        &self,
        call: &ToolCall,
        content: String,
        started_at: Instant,
    ) -> CallResult {
        let body = RunEventBody::ToolCompleted(ToolCompleted {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            result: content.clone(),
            is_error: false,
            duration_ms: started_at.elapsed().as_millis() as u64,
            keen_result: None,
        });
        self.durable(body).await;
        CallResult::ok(content)
    }

    async fn durable(&self, body: RunEventBody) {
        if let Err(e) = self.emit(body, true).await {
            tracing::warn!(run_id = %self.req.run_id, "delegate result not durable: {e}");
            if !matches!(e, super::SinkError::Fenced) {
                self.lose_log(format!(
                    "the run stopped: the result of a delegate call could not be recorded in the run log ({e})"
                ));
            }
        }
    }
}
