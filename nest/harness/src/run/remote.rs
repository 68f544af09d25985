//! `call_agent` to a remote A2A agent (a delegate with `"a2a": <card URL>`): the call fetches the
//! card, sends the input as one A2A message whose `messageId` is the call's
//! `agen/idempotencyKey`, records the remote task in the run log (`remote_task.started`), polls
//! it (`GetTask`) until it ends, and returns its reply text (status message and artifacts' text).
//!
//! Invariants: `tool.started` is durable before the message is sent and `remote_task.started`
//! is durable before the task is waited for, so a resume finds the remote task in the log and
//! polls it instead of sending again. A crash between the send and that record is covered too:
//! the message's `contextId` is the call's own (its idempotency key, or the call's
//! `conversation_key`), so a resume that finds a `tool.started` and no record first asks the
//! agent (`ListTasks` of that context) for a task holding its `messageId`, and sends only when
//! there is none (an agent without `ListTasks` gets the same `messageId` again). The bearer token comes from
//! the run's resolved secrets ([`RemoteAgents`]) and goes only into request headers: never into
//! an event, an error or a log line. Every failure is a tool error naming the agent and why.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use agen_contract::run::{RemoteTaskStarted, ToolFailure};
use agen_shared::bundle::{delegate_token_with_secrets, Bundle, Delegate, RemoteAgent};

use super::a2a_client::{message_text, reply_text, A2aClient, A2aError, Task, TaskState};
use super::state::Run;
use super::tools::CallResult;
use super::RunEventBody;
use crate::model::ToolCall;

/// Polling a remote task starts this often and slows down to [`POLL_MAX`].
const POLL_MIN: Duration = Duration::from_millis(200);
const POLL_MAX: Duration = Duration::from_secs(2);
/// How long a remote agent may stay unreachable while its task is polled.
const UNREACHABLE_GRACE: Duration = Duration::from_secs(60);

/// The remote delegates' tokens (resolved from the run's secrets).
#[derive(Default)]
pub(crate) struct RemoteAgents {
    /// By delegate name: the token, none, or why it has no value.
    tokens: BTreeMap<String, Result<Option<String>, String>>,
}

impl RemoteAgents {
    /// Resolves each remote delegate's token of `bundle` from `secrets`.
    pub(crate) fn resolve(&mut self, bundle: &Bundle, secrets: &BTreeMap<String, String>) {
        self.tokens = bundle
            .config
            .delegates
            .iter()
            .filter(|d| d.is_remote())
            .map(|d| {
                let token = delegate_token_with_secrets(d, secrets).map_err(|e| e.to_string());
                (d.deployment.clone(), token)
            })
            .collect();
    }

    /// A client for the agent whose card is at `card_url` (its token goes to that origin
    /// only; no redirect is followed).
    fn client(&self, card_url: &str) -> Result<A2aClient, String> {
        A2aClient::for_card(card_url)
    }

    fn token(&self, name: &str) -> Result<Option<String>, String> {
        self.tokens.get(name).cloned().unwrap_or(Ok(None))
    }
}

/// How a wait for a remote task ended, other than with the task.
enum Stop {
    Failed(ToolFailure, String),
    Cancelled,
}

impl Run<'_> {
    /// `call_agent` to the remote A2A agent `delegate` (the call's checks are done).
    pub(super) async fn remote_call(
        &self,
        call: &ToolCall,
        delegate: &Delegate,
        remote: &RemoteAgent,
        input: String,
        conversation_key: String,
    ) -> CallResult {
        let tool = call.name.as_str();
        let agent = delegate.deployment.as_str();
        let started_at = Instant::now();
        if let Some(refused) = self.spend_tool_call(call).await {
            return refused;
        }
        let setup = self
            .h
            .remote
            .token(agent)
            .map_err(|e| format!("{tool} to {agent}: its token has no value: {e}"))
            .and_then(|token| Ok((token, self.h.remote.client(&remote.card_url)?)));
        let (token, client) = match setup {
            Ok(s) => s,
            Err(e) => return self.refuse(call, ToolFailure::Failed, e).await,
        };
        let token = token.as_deref();

        if let Err(e) = self
            .emit(
                RunEventBody::ToolStarted(self.started(call, tool, true)),
                true,
            )
            .await
        {
            // Nothing is sent before the call's start is durable.
            return CallResult::error(format!("{tool} was not called: {e}"));
        }
        let fail = |e: A2aError| format!("{tool} to remote agent {agent} failed: {e}");

        let (endpoint, task_id, task) = match self.recorded_remote_task(&call.id) {
            Some(r) => {
                self.activity(format!("waiting again for task {} on {agent}", r.task_id))
                    .await;
                (r.endpoint, r.task_id, None)
            }
            None => {
                self.activity(format!("sending the task to remote agent {agent}"))
                    .await;
                let endpoint = match client.endpoint(&remote.card_url, token).await {
                    Ok(e) => e,
                    Err(e) => {
                        return self
                            .record_failure(call, ToolFailure::Failed, fail(e), started_at)
                            .await
                    }
                };
                let key = self.idempotency_key(&call.id);
                let context = if conversation_key.is_empty() {
                    key.clone()
                } else {
                    conversation_key
                };
                let found = self
                    .sent_before(&client, &endpoint, token, &context, &key, &call.id)
                    .await;
                let sent = match found {
                    Some(task) => Ok(super::a2a_client::SendMessageResponse {
                        task: Some(task),
                        message: None,
                    }),
                    None => {
                        client
                            .send_message(&endpoint, token, &key, &context, &input)
                            .await
                    }
                };
                let reply = match sent {
                    Ok(r) => r,
                    Err(e) => {
                        return self
                            .record_failure(call, ToolFailure::Failed, fail(e), started_at)
                            .await
                    }
                };
                let Some(task) = reply.task else {
                    // An agent that answers at once, with no task.
                    let text = reply.message.as_ref().map(message_text).unwrap_or_default();
                    return self
                        .record_result(call, self.h.redactor.redact(&text), started_at)
                        .await;
                };
                let record = RemoteTaskStarted {
                    call_id: call.id.clone(),
                    agent: agent.to_string(),
                    task_id: task.id.clone(),
                    endpoint: endpoint.clone(),
                };
                if let Err(e) = self
                    .emit(RunEventBody::RemoteTaskStarted(record), true)
                    .await
                {
                    tracing::warn!(run_id = %self.req.run_id, task = %task.id, "the remote task is not recorded; a resume will ask the agent for it by its messageId: {e}");
                }
                (endpoint, task.id.clone(), Some(task))
            }
        };
        self.activity(format!(
            "waiting for task {task_id} on remote agent {agent}"
        ))
        .await;
        let waited = self
            .wait_remote(&client, &endpoint, token, &task_id, task, started_at)
            .await;
        let task = match waited {
            Ok(t) => t,
            Err(Stop::Cancelled) => {
                // Not a result: a resume waits for the same remote task again.
                let content =
                    format!("{tool}: the run was cancelled while task {task_id} on {agent} ran");
                let _ = self
                    .emit(
                        self.failed(call, tool, &content, ToolFailure::Cancelled, 0),
                        false,
                    )
                    .await;
                return CallResult::error(content);
            }
            Err(Stop::Failed(reason, why)) => {
                let content = format!("{tool} to remote agent {agent}: task {task_id} {why}");
                return self.record_failure(call, reason, content, started_at).await;
            }
        };
        let text = self.h.redactor.redact(&reply_text(&task));
        match task.status.state {
            TaskState::Completed => self.record_result(call, text, started_at).await,
            state => {
                let how = match state {
                    TaskState::Rejected => "was rejected",
                    TaskState::Canceled => "was cancelled",
                    _ => "failed",
                };
                let content = format!(
                    "{tool} to remote agent {agent}: task {task_id} {how} ({}): {}",
                    state.as_str(),
                    if text.is_empty() {
                        "no reason given"
                    } else {
                        &text
                    }
                );
                self.record_failure(call, ToolFailure::Failed, content, started_at)
                    .await
            }
        }
    }

    /// The remote task that an earlier attempt's message `key` made, when that attempt started
    /// call `call_id` but did not record a remote task (it died in between).
    async fn sent_before(
        &self,
        client: &A2aClient,
        endpoint: &str,
        token: Option<&str>,
        context: &str,
        key: &str,
        call_id: &str,
    ) -> Option<Task> {
        let started_before = self
            .req
            .replay
            .iter()
            .any(|ev| matches!(ev, RunEventBody::ToolStarted(s) if s.call_id == call_id));
        if !started_before {
            return None;
        }
        match client.find_task(endpoint, token, context, key).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(run_id = %self.req.run_id, call_id, "cannot ask the remote agent whether an earlier attempt's message reached it; sending it again with the same messageId: {e}");
                None
            }
        }
    }

    /// The remote task an earlier attempt recorded for call `call_id`.
    fn recorded_remote_task(&self, call_id: &str) -> Option<RemoteTaskStarted> {
        self.req.replay.iter().rev().find_map(|ev| match ev {
            RunEventBody::RemoteTaskStarted(r) if r.call_id == call_id => Some(r.clone()),
            _ => None,
        })
    }

    /// Polls task `task_id` until it ends (terminal), stops for input, the call's
    /// `toolTimeout` runs out (the task is cancelled) or the run is cancelled.
    async fn wait_remote(
        &self,
        client: &A2aClient,
        endpoint: &str,
        token: Option<&str>,
        task_id: &str,
        mut known: Option<Task>,
        started_at: Instant,
    ) -> Result<Task, Stop> {
        let timeout = self.h.bundle.harness.limits.tool_timeout;
        let deadline = started_at + timeout;
        let mut pause = POLL_MIN;
        let mut unreachable_since: Option<Instant> = None;
        loop {
            if let Some(task) = known.take() {
                if task.status.state.is_terminal() {
                    return Ok(task);
                }
                if task.status.state.is_interrupted() {
                    let said = task.status.message.as_ref().map(message_text);
                    return Err(Stop::Failed(
                        ToolFailure::Failed,
                        format!(
                            "stopped in {}, asking for something call_agent cannot give{}",
                            task.status.state.as_str(),
                            said.map(|s| format!(": {}", self.h.redactor.redact(&s)))
                                .unwrap_or_default()
                        ),
                    ));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                if let Err(e) = client.cancel_task(endpoint, token, task_id).await {
                    tracing::warn!(run_id = %self.req.run_id, task = %task_id, "cannot cancel a timed-out remote task: {e}");
                }
                return Err(Stop::Failed(
                    ToolFailure::Timeout,
                    format!(
                        "did not finish within {} (limits.toolTimeout) and was cancelled",
                        agen_shared::duration::format_duration(timeout)
                    ),
                ));
            }
            tokio::select! {
                _ = tokio::time::sleep(pause.min(left)) => {}
                _ = self.cancel.cancelled() => {
                    if !self.is_fenced() {
                        if let Err(e) = client.cancel_task(endpoint, token, task_id).await {
                            tracing::warn!(run_id = %self.req.run_id, task = %task_id, "cannot cancel the remote task of a cancelled run: {e}");
                        }
                    }
                    return Err(Stop::Cancelled);
                }
            }
            pause = (pause * 2).min(POLL_MAX);
            match client.get_task(endpoint, token, task_id).await {
                Ok(task) => {
                    unreachable_since = None;
                    known = Some(task);
                }
                Err(e) if e.is_transient() => {
                    let since = *unreachable_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= UNREACHABLE_GRACE {
                        return Err(Stop::Failed(
                            ToolFailure::Failed,
                            format!(
                                "could not be asked about for {}: {e}",
                                agen_shared::duration::format_duration(UNREACHABLE_GRACE)
                            ),
                        ));
                    }
                    tracing::info!(run_id = %self.req.run_id, task = %task_id, "polling a remote task failed, asking again: {e}");
                }
                Err(e) => {
                    return Err(Stop::Failed(
                        ToolFailure::Failed,
                        format!("could not be asked about: {e}"),
                    ))
                }
            }
        }
    }
}
