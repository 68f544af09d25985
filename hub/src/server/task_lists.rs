//! `ListTasks` (a page of a namespace's tasks, newest first, filtered) and `WatchTasks` (that
//! page now, and again whenever a task of the namespace changes: fed by the Hub's own task
//! updates, [`Core::subscribe`], not by a timer).
//!
//! Invariant: a `WatchTasks` stream holds a `WatchTask` place of its token
//! ([`StreamKind::WatchTask`]) while it is open and ends when the token is revoked, like
//! every watch.

use std::time::Duration;

use agen_proto::v1 as pb;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tonic::{Request, Status};

use super::agen_api::{check_namespace, AgenApi};
use super::auth::{authorize, Action};
use super::convert;
use crate::core::streams::StreamKind;
use crate::core::tasks::TaskFilter;
use crate::core::{namespace_or_default, Core};
use crate::limits;

type Stream_<T> =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send + 'static>>;

/// After a change, how long a watch lets more changes land before it reads the page again
/// (a burst of events is one read).
const SETTLE: Duration = Duration::from_millis(100);

/// The checked filter of a `ListTasks`/`WatchTasks` request.
fn filter(core: &Core, r: pb::ListTasksRequest) -> Result<TaskFilter, Status> {
    check_namespace(&r.namespace)?;
    if !r.deployment.is_empty() {
        limits::validate_name("deployment", &r.deployment)?;
    }
    limits::check_id("parent_task_id", &r.parent_task_id)?;
    if !r.label_key.is_empty() {
        core.opts.limits.check_labels(
            "label_key",
            &std::collections::BTreeMap::from([(r.label_key.clone(), r.label_value.clone())]),
        )?;
    }
    core.opts
        .limits
        .check_conversation_key(&r.conversation_key)?;
    Ok(TaskFilter {
        namespace: r.namespace,
        deployment: r.deployment,
        state: convert::task_state_filter(r.task_state, r.state),
        conversation_key: r.conversation_key,
        parent_task_id: r.parent_task_id,
        label_key: r.label_key,
        label_value: r.label_value,
        created_after_ms: r.created_after_ms,
        created_before_ms: r.created_before_ms,
        page_size: if r.page_size == 0 {
            r.limit
        } else {
            r.page_size
        },
        before_seq: convert::parse_page_token(&r.page_token)?,
    })
}

fn page(core: &Core, f: &TaskFilter) -> Result<pb::ListTasksResponse, Status> {
    let page = core.list_tasks(f)?;
    Ok(pb::ListTasksResponse {
        tasks: page.tasks.iter().map(convert::task_summary).collect(),
        next_page_token: page
            .next_before_seq
            .map(convert::page_token)
            .unwrap_or_default(),
        total: page.total,
    })
}

/// `ListTasks`.
pub fn list(
    core: &Core,
    request: Request<pb::ListTasksRequest>,
) -> Result<pb::ListTasksResponse, Status> {
    authorize(&request, &request.get_ref().namespace, Action::Read, "")?;
    let f = filter(core, request.into_inner())?;
    page(core, &f)
}

/// `WatchTasks`: the page now, then again each time it differs after a task of the
/// namespace changed, until the Hub stops, the client leaves or its token is revoked.
pub fn watch(
    api: &AgenApi,
    request: Request<pb::ListTasksRequest>,
) -> Result<Stream_<pb::ListTasksResponse>, Status> {
    let principal = authorize(&request, &request.get_ref().namespace, Action::Read, "")?;
    let core = api.core.clone();
    let f = filter(&core, request.into_inner())?;
    let permit = core.streams.open(StreamKind::WatchTask, &principal)?;
    // Subscribed before the first read: a change after it is heard.
    let mut updates = core.subscribe();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<pb::ListTasksResponse, Status>>(4);
    let stopping = core.stopping.clone();
    tokio::spawn(async move {
        let namespace = namespace_or_default(&f.namespace);
        let mut last: Option<pb::ListTasksResponse> = None;
        loop {
            match page(&core, &f) {
                Ok(now) if last.as_ref() != Some(&now) => {
                    if tx.send(Ok(now.clone())).await.is_err() {
                        return;
                    }
                    last = Some(now);
                }
                Ok(_) => {}
                Err(status) => {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
            }
            // Wait for a change of this namespace (a missed one, `Lagged`, counts as one).
            loop {
                let update = tokio::select! {
                    _ = stopping.cancelled() => return,
                    _ = tx.closed() => return,
                    u = updates.recv() => u,
                };
                match update {
                    Ok(u) if namespace_or_default(&u.task.namespace) == namespace => break,
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => break,
                    Err(RecvError::Closed) => return,
                }
            }
            tokio::select! {
                _ = stopping.cancelled() => return,
                _ = tx.closed() => return,
                _ = tokio::time::sleep(SETTLE) => {}
            }
            // What came meanwhile is in the read that follows.
            while !matches!(
                updates.try_recv(),
                Err(TryRecvError::Empty | TryRecvError::Closed)
            ) {}
        }
    });
    let stream = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok(super::auth::until_revoked(
        api.access.tokens.clone(),
        principal,
        stream,
        Some(permit),
    ))
}
