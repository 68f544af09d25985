//! The SSE stream of `SendStreamingMessage` and `SubscribeToTask`: the task first, then a
//! status update each time its state or what it says changes (progress, the approval it waits
//! for, the result) and an artifact update for each artifact it saves, until it ends. Updates
//! come from the Hub's task update broadcast, with a periodic re-read so that a lagging
//! subscriber misses nothing but intermediate steps; the stream ends at once if the caller's
//! token is revoked, rotated or expires. A streaming call that cannot start (bad params, no such
//! task, an ended task) is answered with a stream of one error event ([`failed`]).
//! The model's answer streams too: each coalesced piece of a turn is an artifact update of
//! artifact `stream-<attempt>-<turn>` with `append: true`; a reset sends it again with
//! `append: false` and the turn's new beginning (A2A's "replace"), so the artifact's text after
//! the last replace is what that turn answered. These are not the task's stored artifacts.

use std::collections::HashSet;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive};
use serde_json::Value;
use tokio::sync::broadcast;
use tokio_stream::wrappers::ReceiverStream;

use super::methods::{unsupported, Call};
use super::types::*;
use super::view;
use crate::model::TaskRec;
use crate::model::TaskUpdate;

/// The SSE response of a streaming method.
pub type Sse = axum::response::sse::Sse<
    axum::response::sse::KeepAliveStream<ReceiverStream<Result<Event, Infallible>>>,
>;

/// How often the task is re-read even without an update.
const REREAD: Duration = Duration::from_secs(1);

fn event<T: serde::Serialize>(id: &Value, r: T) -> Event {
    let body = RpcResponse::ok(id.clone(), r);
    let json = serde_json::to_string(&body).unwrap_or_else(|e| {
        format!(r#"{{"jsonrpc":"2.0","error":{{"code":-32603,"message":"cannot encode: {e}"}}}}"#)
    });
    Event::default().data(json)
}

fn error_event(id: &Value, e: RpcError) -> Event {
    let json = serde_json::to_string(&RpcResponse::err(id.clone(), e)).unwrap_or_default();
    Event::default().event("error").data(json)
}

/// A stream of one error event: how a streaming method that cannot start answers, so that a
/// client reading SSE reads the JSON-RPC error where it reads events.
pub fn failed(id: &Value, e: RpcError) -> Sse {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(1);
    // The channel has room for the one event; the sender then drops, ending the stream.
    let _ = tx.try_send(Ok(error_event(id, e)));
    axum::response::sse::Sse::new(ReceiverStream::new(rx)).keep_alive(KeepAlive::default())
}

/// What a status update compares: the state and its message text.
fn said(s: &TaskStatus) -> (TaskState, Option<Vec<Part>>) {
    (s.state, s.message.as_ref().map(|m| m.parts.clone()))
}

/// Streams task `first` (as read after `updates` was subscribed) until it ends.
pub fn follow(
    call: Call,
    first: TaskRec,
    mut updates: broadcast::Receiver<std::sync::Arc<TaskUpdate>>,
    id: Value,
) -> Sse {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(32);
    tokio::spawn(async move {
        let core = call.a.core.clone();
        let task_id = first.task_id.clone();
        let first_view = match view::task(&core, &first) {
            Ok(v) => v,
            Err(e) => {
                let _ = tx
                    .send(Ok(error_event(
                        &id,
                        super::rpc_error(e, codes::TASK_NOT_FOUND),
                    )))
                    .await;
                return;
            }
        };
        let mut sent_artifacts: HashSet<String> = first_view
            .artifacts
            .iter()
            .map(|a| a.artifact_id.clone())
            .collect();
        let mut last = said(&first_view.status);
        let ended = first_view.status.state.is_terminal();
        if tx
            .send(Ok(event(&id, StreamResponse::Task(first_view))))
            .await
            .is_err()
            || ended
        {
            return;
        }
        let mut tick = tokio::time::interval(REREAD);
        let mut revocations = call.a.tokens.revocations();
        let mut deltas = crate::core::deltas::DeltaFollower::new(&core, &task_id, true);
        let mut started: HashSet<(u32, u32)> = HashSet::new();
        loop {
            let t = tokio::select! {
                _ = tx.closed() => return,
                frames = deltas.next() => {
                    let ctx = view::context_id(&first);
                    match send_frames(&tx, &id, &task_id, &ctx, &mut started, frames).await {
                        true => continue,
                        false => return,
                    }
                }
                // A token revoked or rotated: checked below at once.
                _ = revocations.changed() => match call_task(&call, &task_id) {
                    Some(t) => t,
                    None => return,
                },
                u = updates.recv() => match u {
                    Ok(u) if u.task_id == task_id => u.task.clone(),
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(_)) => match call_task(&call, &task_id) {
                        Some(t) => t,
                        None => return,
                    },
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick() => match call_task(&call, &task_id) {
                    Some(t) => t,
                    None => return,
                },
            };
            if let Err(e) = call
                .a
                .tokens
                .still_valid_with(&call.principal, call.secret.as_deref())
            {
                let _ = tx
                    .send(Ok(error_event(
                        &id,
                        RpcError {
                            code: codes::INVALID_REQUEST,
                            message: e.to_string(),
                        },
                    )))
                    .await;
                return;
            }
            let ctx = view::context_id(&t);
            // The answer's pieces so far before anything that may end the stream.
            if !send_frames(&tx, &id, &task_id, &ctx, &mut started, deltas.drain()).await {
                return;
            }
            // Artifacts before the status that may end the stream.
            match view::artifacts(&core, &t) {
                Ok(all) => {
                    for a in all {
                        if sent_artifacts.insert(a.artifact_id.clone()) {
                            let ev = TaskArtifactUpdateEvent {
                                task_id: task_id.clone(),
                                context_id: ctx.clone(),
                                artifact: a,
                                append: false,
                                last_chunk: true,
                            };
                            if tx
                                .send(Ok(event(&id, StreamResponse::ArtifactUpdate(ev))))
                                .await
                                .is_err()
                            {
                                return;
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, %task_id, "cannot read the task's artifacts for its A2A stream")
                }
            }
            let status = view::status(&t);
            let now = said(&status);
            if now != last {
                last = now;
                let ended = status.state.is_terminal();
                let ev = TaskStatusUpdateEvent {
                    task_id: task_id.clone(),
                    context_id: ctx,
                    status,
                };
                if tx
                    .send(Ok(event(&id, StreamResponse::StatusUpdate(ev))))
                    .await
                    .is_err()
                    || ended
                {
                    return;
                }
            }
        }
    });
    axum::response::sse::Sse::new(ReceiverStream::new(rx)).keep_alive(KeepAlive::default())
}

/// Sends streamed answer pieces as artifact updates (see the module doc); false when the
/// client is gone.
async fn send_frames(
    tx: &tokio::sync::mpsc::Sender<Result<Event, Infallible>>,
    id: &Value,
    task_id: &str,
    ctx: &str,
    started: &mut HashSet<(u32, u32)>,
    frames: Vec<agen_contract::run::TurnDelta>,
) -> bool {
    for d in frames {
        let fresh = started.insert((d.attempt, d.turn));
        let ev = TaskArtifactUpdateEvent {
            task_id: task_id.to_string(),
            context_id: ctx.to_string(),
            artifact: Artifact {
                artifact_id: format!("stream-{}-{}", d.attempt, d.turn),
                name: "answer (streaming)".into(),
                description: None,
                parts: vec![Part {
                    text: Some(d.text),
                    ..Default::default()
                }],
            },
            append: !(fresh || d.reset),
            last_chunk: false,
        };
        if tx
            .send(Ok(event(id, StreamResponse::ArtifactUpdate(ev))))
            .await
            .is_err()
        {
            return false;
        }
    }
    true
}

/// The task as stored now; `None` (ending the stream) when it is gone.
fn call_task(call: &Call, task_id: &str) -> Option<TaskRec> {
    match call.a.core.get_task(&call.namespace, task_id) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(error = %e, %task_id, "the task of an A2A stream cannot be read");
            None
        }
    }
}

/// The streaming methods of a call (the others are in `methods.rs`).
impl Call {
    /// `SendStreamingMessage`: the task, then its status and artifact updates until it ends.
    pub async fn send_streaming(
        self,
        req: SendMessageRequest,
        id: serde_json::Value,
    ) -> Result<Sse, RpcError> {
        let updates = self.a.core.subscribe();
        let t = self.submit(req).await?;
        Ok(follow(self, t, updates, id))
    }

    /// `SubscribeToTask`: the task as it is, then its updates until it ends.
    pub fn subscribe(self, req: TaskIdRequest, id: serde_json::Value) -> Result<Sse, RpcError> {
        let updates = self.a.core.subscribe();
        let t = self.task(&req.id)?;
        if t.state.is_terminal() {
            return Err(unsupported(format!(
                "task {} has ended ({}); there is nothing to subscribe to: read it with GetTask",
                t.task_id,
                t.state.as_str()
            )));
        }
        Ok(follow(self, t, updates, id))
    }
}
