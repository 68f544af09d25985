//! The A2A methods on one deployment: `SendMessage` (a task, or the next task of a
//! conversation: `contextId` is the conversation key; `messageId` the client request id, so a
//! resent message finds its task), `SendStreamingMessage` and `SubscribeToTask` (handed to
//! `stream.rs`), `GetTask` and `CancelTask` (`ListTasks` is [`super::list`]).
//!
//! A message naming a task (`taskId`) that is queued or running continues it: an Agen task
//! takes no input while it runs, so the message runs as the next task of the task's context
//! (after it, seeing its messages), labelled [`view::CONTINUES_LABEL`]; the answer is the named
//! task, whose history shows the message and then the answer to it. A message naming a task that
//! waits for an approval is refused (`agen approve` answers it), and one naming an ended task
//! too (a new message in its context continues the conversation).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use sha2::{Digest, Sha256};

use super::types::*;
use super::{rpc_error, view, A2a, REQUEST_ID_PREFIX};
use crate::core::tasks::TaskSpec;
use crate::model::{TaskRec, TaskState as AgenState};
use crate::tokens::Principal;

/// How long `CancelTask` waits for a running task to end.
const CANCEL_WAIT: Duration = Duration::from_secs(10);
/// Longest message id used as it is in the client request id (longer ones are hashed).
const MAX_MESSAGE_ID: usize = 150;

/// One JSON-RPC call on `namespace/deployment` by an authorized caller.
pub struct Call {
    pub a: Arc<A2a>,
    pub principal: Principal,
    /// The HTTP peer address (`ip:port`; empty when unknown), for the audit record.
    pub peer: String,
    pub namespace: String,
    pub deployment: String,
    /// The interface URL the caller reached the deployment at.
    pub interface_url: String,
    /// The W3C `traceparent` header, if any (ignored when invalid).
    pub traceparent: String,
    /// The sha256 of the token's secret when the request came: a stream ends when it changes
    /// (rotation), as when the token is revoked or expires.
    pub secret: Option<String>,
    /// The place of an SSE stream among the open ones (`core::streams`), held while it runs.
    pub _stream_permit: Option<Arc<crate::core::streams::StreamPermit>>,
}

pub fn invalid(message: String) -> RpcError {
    RpcError {
        code: codes::INVALID_PARAMS,
        message,
    }
}

pub(super) fn unsupported(message: String) -> RpcError {
    RpcError {
        code: codes::UNSUPPORTED_OPERATION,
        message,
    }
}

/// The task's text from a message's parts: text parts as they are, data parts as JSON.
fn input_of(m: &Message) -> Result<String, RpcError> {
    let mut pieces = Vec::new();
    for (i, p) in m.parts.iter().enumerate() {
        if let Some(t) = &p.text {
            pieces.push(t.clone());
        } else if let Some(d) = &p.data {
            pieces.push(d.to_string());
        } else if let Some(raw) = &p.raw {
            // Bytes that are UTF-8 text are taken as text; binary content is not.
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(raw.trim())
                .map_err(|e| invalid(format!("message.parts[{i}].raw: not base64: {e}")))?;
            let text = String::from_utf8(bytes).map_err(|_| RpcError {
                code: codes::CONTENT_TYPE_NOT_SUPPORTED,
                message: format!(
                    "message.parts[{i}]: binary content ({}) is not accepted; send text, UTF-8 file content or data parts",
                    p.media_type.as_deref().unwrap_or("no media type")
                ),
            })?;
            pieces.push(text);
        } else if p.url.is_some() {
            return Err(RpcError {
                code: codes::CONTENT_TYPE_NOT_SUPPORTED,
                message: format!(
                    "message.parts[{i}]: file parts by URL are not accepted; send the content as text, raw UTF-8 or data parts"
                ),
            });
        }
    }
    let input = pieces.join("\n");
    if input.trim().is_empty() {
        return Err(invalid(
            "message.parts: expected at least one non-empty text or data part".into(),
        ));
    }
    Ok(input)
}

/// A request's `historyLength`: absent is all, negative is refused.
pub fn history_length(n: Option<i64>) -> Result<Option<usize>, RpcError> {
    match n {
        None => Ok(None),
        Some(n) if n < 0 => Err(invalid(format!(
            "historyLength: expected 0 or more messages, got {n}"
        ))),
        Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
    }
}

fn short_hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    hex::encode(&h.finalize()[..16])
}

impl Call {
    /// The task `id` of this deployment.
    pub fn task(&self, id: &str) -> Result<TaskRec, RpcError> {
        let t = self
            .a
            .core
            .get_task(&self.namespace, id)
            .map_err(|e| rpc_error(e, codes::TASK_NOT_FOUND))?;
        if t.deployment != self.deployment {
            return Err(RpcError {
                code: codes::TASK_NOT_FOUND,
                message: format!(
                    "task {id} not found on deployment {}/{}",
                    t.namespace, self.deployment
                ),
            });
        }
        Ok(t)
    }

    fn view(&self, t: &TaskRec) -> Result<Task, RpcError> {
        view::task(&self.a.core, t).map_err(|e| rpc_error(e, codes::TASK_NOT_FOUND))
    }

    /// Stores the task a message asks for (or finds the one it already made).
    pub(super) async fn submit(&self, req: SendMessageRequest) -> Result<TaskRec, RpcError> {
        let m = &req.message;
        if m.message_id.trim().is_empty() {
            return Err(invalid(
                "message.messageId: expected the message's id, got an empty string".into(),
            ));
        }
        if req
            .configuration
            .as_ref()
            .is_some_and(|c| c.task_push_notification_config.is_some())
        {
            return Err(RpcError {
                code: codes::PUSH_NOT_SUPPORTED,
                message: "configuration.taskPushNotificationConfig: the Agen Hub sends no push notifications; stream with SendStreamingMessage instead".into(),
            });
        }
        let mut labels = std::collections::BTreeMap::new();
        let continued = match m.task_id.as_deref().filter(|t| !t.is_empty()) {
            Some(task_id) => Some(self.continued(task_id, m.context_id.as_deref())?),
            None => None,
        };
        let input = input_of(m)?;
        let lim = &self.a.core.opts.limits;
        lim.check_input(&input)
            .map_err(|e| rpc_error(e, codes::INVALID_PARAMS))?;
        // A message without a context starts one, named after the message so that a resent
        // message finds the same conversation (and so the same task).
        let conversation_key = match (
            &continued,
            m.context_id.as_deref().filter(|c| !c.is_empty()),
        ) {
            (Some(t), _) => {
                labels.insert(view::CONTINUES_LABEL.to_string(), t.task_id.clone());
                t.conversation_key.clone()
            }
            (None, Some(c)) => c.to_string(),
            (None, None) => format!(
                "a2a-{}",
                short_hash(&[&self.namespace, &self.deployment, &m.message_id])
            ),
        };
        lim.check_conversation_key(&conversation_key)
            .map_err(|e| invalid(format!("message.contextId: {e}")))?;
        let client_request_id = if m.message_id.len() <= MAX_MESSAGE_ID {
            format!("{REQUEST_ID_PREFIX}{}", m.message_id)
        } else {
            format!("{REQUEST_ID_PREFIX}sha256:{}", short_hash(&[&m.message_id]))
        };
        let traceparent = match crate::trace::parse_traceparent(&self.traceparent) {
            Some(_) => self.traceparent.trim().to_string(),
            None => String::new(),
        };
        let submitted = self
            .a
            .core
            .submit_task(TaskSpec {
                namespace: self.namespace.clone(),
                deployment: self.deployment.clone(),
                input,
                labels,
                conversation_key,
                client_request_id,
                parent: None,
                tool_overrides: Default::default(),
                traceparent,
                budget: Default::default(),
                webhooks: Vec::new(),
                double_texting: None,
                output_schema: String::new(),
            })
            .await
            .map_err(|e| rpc_error(e, codes::INVALID_PARAMS));
        let outcome = submitted.as_ref().map(|_| ()).map_err(Clone::clone);
        self.a
            .audit(
                &self.peer,
                &self.principal,
                &self.namespace,
                "A2A.SendMessage",
                &self.deployment,
                &outcome,
            )
            .await;
        let submitted = submitted?;
        // A message that continues a task is answered with that task (its history shows the
        // message, and the answer to it once its run ends).
        match continued {
            Some(t) => self.task(&t.task_id),
            None => Ok(submitted),
        }
    }

    /// The task a message naming `task_id` (and maybe `context_id`) continues, when it may.
    fn continued(&self, task_id: &str, context_id: Option<&str>) -> Result<TaskRec, RpcError> {
        let t = self.task(task_id)?;
        let ctx = view::context_id(&t);
        if let Some(c) = context_id.filter(|c| !c.is_empty() && *c != ctx) {
            return Err(invalid(format!(
                "message.contextId {:?} is not the context of task {task_id} ({ctx:?}); send the task's contextId or none",
                crate::limits::cut(c, crate::limits::ECHO_BYTES)
            )));
        }
        match t.state {
            AgenState::Waiting => Err(unsupported(format!(
                "task {task_id} is waiting for an approval ({}); a message cannot answer it: approve or deny it with `agen approve {task_id}` or `agen deny {task_id}`",
                t.activity
            ))),
            s if s.is_terminal() => Err(unsupported(format!(
                "task {task_id} has ended ({}); continue the conversation with a new message that has contextId {ctx:?} and no taskId",
                s.as_str()
            ))),
            _ if t.conversation_key.is_empty() => Err(unsupported(format!(
                "task {task_id} belongs to no conversation (it was submitted without one), so it cannot be continued; send a new message"
            ))),
            _ => Ok(t),
        }
    }

    /// Waits until task `id` satisfies `done` or `within` passes; returns it as it is then.
    async fn wait_for(
        &self,
        id: &str,
        within: Duration,
        done: impl Fn(&TaskRec) -> bool,
    ) -> Result<TaskRec, RpcError> {
        let mut updates = self.a.core.subscribe();
        let deadline = tokio::time::Instant::now() + within;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut open = true;
        loop {
            let t = self.task(id)?;
            if done(&t) || tokio::time::Instant::now() >= deadline {
                return Ok(t);
            }
            tokio::select! {
                r = updates.recv(), if open => {
                    // A closed broadcast (the Hub stopping) leaves the re-reads.
                    open = !matches!(r, Err(tokio::sync::broadcast::error::RecvError::Closed));
                }
                _ = tick.tick() => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// `SendMessage`: the task once it finished or needs input (at once with
    /// `returnImmediately`).
    pub async fn send_message(
        self,
        req: SendMessageRequest,
    ) -> Result<SendMessageResponse, RpcError> {
        let at_once = req
            .configuration
            .as_ref()
            .is_some_and(|c| c.return_immediately);
        let t = self.submit(req).await?;
        let t = if at_once {
            t
        } else {
            self.wait_for(&t.task_id, self.a.opts.send_wait, |t| {
                t.state.is_terminal() || t.state == AgenState::Waiting
            })
            .await?
        };
        Ok(SendMessageResponse::Task(self.view(&t)?))
    }

    /// `GetTask`: the task with at most `historyLength` history messages, the newest.
    pub fn get_task(self, req: TaskIdRequest) -> Result<Task, RpcError> {
        let history_length = history_length(req.history_length)?;
        let t = self.task(&req.id)?;
        view::shaped(
            &self.a.core,
            &t,
            view::Shape {
                history_length,
                artifacts: true,
            },
        )
        .map_err(|e| rpc_error(e, codes::TASK_NOT_FOUND))
    }

    /// `CancelTask`: the task once its cancellation took effect (or after [`CANCEL_WAIT`]).
    pub async fn cancel_task(self, req: TaskIdRequest) -> Result<Task, RpcError> {
        let t = self.task(&req.id)?;
        let result = if t.state.is_terminal() {
            Err(RpcError {
                code: codes::TASK_NOT_CANCELABLE,
                message: format!(
                    "task {} has already ended ({}); there is nothing to cancel",
                    t.task_id,
                    t.state.as_str()
                ),
            })
        } else {
            self.a
                .core
                .cancel_task(
                    &self.namespace,
                    &t.task_id,
                    &format!(
                        "cancelled over A2A by token {}",
                        self.principal.token_name()
                    ),
                )
                .await
                .map(|_| ())
                .map_err(|e| rpc_error(e, codes::TASK_NOT_FOUND))
        };
        self.a
            .audit(
                &self.peer,
                &self.principal,
                &self.namespace,
                "A2A.CancelTask",
                &t.task_id,
                &result,
            )
            .await;
        result?;
        let t = self
            .wait_for(&t.task_id, CANCEL_WAIT, |t| t.state.is_terminal())
            .await?;
        self.view(&t)
    }
}
