//! Live updates as server-sent events, fed by the Hub's own watch streams (`WatchTask`,
//! `WatchTasks`, `WatchDeployments`, `WatchNests`) called as the session's principal: they
//! hold a place among the token's open streams like any other client's, and end when the
//! token is revoked. No list is polled: each event follows a change the Hub's stream sent.
//! The browser's `EventSource` reconnects by itself (after a Hub restart too): a task's
//! events carry their task event seq as the event id, so it resumes after the last one it
//! saw; a list's stream starts with the list as it is.

use std::convert::Infallible;
use std::time::Duration;

use agen_proto::v1 as pb;
use axum::extract::{Path, Query};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};

use super::{api, view, ApiErr, Caller};

/// How soon the browser reconnects after the stream ended.
const RETRY: Duration = Duration::from_millis(500);

fn json_event(name: &str, value: &impl serde::Serialize) -> Event {
    Event::default()
        .event(name)
        .retry(RETRY)
        .json_data(value)
        .unwrap_or_else(|_| {
            Event::default()
                .event("error")
                .data("cannot encode the event")
        })
}

/// The end of a stream: why, as an `end` event (the page stops or reconnects).
fn end_event(status: tonic::Status) -> Event {
    Event::default().event("end").retry(RETRY).data(
        serde_json::to_string(&view::ApiError {
            error: status.message().to_string(),
        })
        .unwrap_or_default(),
    )
}

type Events = std::pin::Pin<Box<dyn Stream<Item = Result<Event, Infallible>> + Send>>;

fn sse(events: Events) -> Response {
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response()
}

/// `GET /ui/api/tasks/{namespace}/{task}/live`: the task's events (`task` events with the
/// task's snapshot), from the one after `Last-Event-ID` (all of them on a first connect), and
/// the model's answer as it streams (`delta` events, never stored: no id).
pub async fn task(
    c: Caller,
    Path((namespace, task_id)): Path<(String, String)>,
) -> Result<Response, ApiErr> {
    let from_seq = c
        .header("last-event-id")
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |seen| seen + 1);
    let stream = c
        .api()
        .watch_task(c.req(pb::WatchTaskRequest {
            namespace,
            task_id,
            from_seq,
            deltas: true,
        }))
        .await?
        .into_inner();
    let events: Events = Box::pin(stream.scan(false, |ended, item| {
        if *ended {
            return std::future::ready(None);
        }
        let event = match item {
            Ok(e) if e.delta.is_some() => json_event("delta", &view::TaskEvent::from(&e)),
            Ok(e) => json_event("task", &view::TaskEvent::from(&e)).id(e.seq.to_string()),
            Err(status) => {
                *ended = true;
                end_event(status)
            }
        };
        std::future::ready(Some(Ok(event)))
    }));
    Ok(sse(events))
}

/// `GET /ui/api/live/tasks?…` (the query of `/ui/api/tasks`): a `tasks` event with the page
/// now and at every change of it (`WatchTasks`).
pub async fn tasks(c: Caller, Query(q): Query<api::TaskQuery>) -> Result<Response, ApiErr> {
    let req = api::list_request(c.session(), q);
    let stream = c.api().watch_tasks(c.req(req)).await?.into_inner();
    let events: Events = Box::pin(stream.map(|item| {
        Ok(match item {
            Ok(page) => json_event("tasks", &view::TaskPage::from(&page)),
            Err(status) => end_event(status),
        })
    }));
    Ok(sse(events))
}

/// `GET /ui/api/live/approvals?namespace`: an `approvals` event with every waiting call now
/// and whenever they change: `WatchTasks` of the waiting tasks says when to read
/// `ListApprovals` again (a call asked or decided changes a waiting task).
pub async fn approvals(c: Caller, Query(q): Query<api::NsQuery>) -> Result<Response, ApiErr> {
    let namespace = api::namespace_for(c.session(), q.namespace.as_deref());
    let waiting = pb::ListTasksRequest {
        namespace: namespace.clone(),
        state: "waiting".into(),
        page_size: crate::core::tasks::MAX_PAGE_SIZE,
        ..Default::default()
    };
    let changes = c.api().watch_tasks(c.req(waiting)).await?.into_inner();
    let c = std::sync::Arc::new(c);
    let events: Events = Box::pin(
        changes
            .then(move |item| {
                let (c, namespace) = (c.clone(), namespace.clone());
                async move {
                    item?;
                    let list = pb::ListApprovalsRequest {
                        namespace,
                        deployment: String::new(),
                    };
                    c.api().list_approvals(c.req(list)).await
                }
            })
            .scan((false, None), |(ended, last), item| {
                if *ended {
                    return std::future::ready(None);
                }
                let event = match item {
                    Ok(r) => {
                        let now: Vec<view::Approval> = r
                            .into_inner()
                            .approvals
                            .iter()
                            .map(view::Approval::from)
                            .collect();
                        let text = serde_json::to_string(&now).unwrap_or_default();
                        if last.as_ref() == Some(&text) {
                            return std::future::ready(Some(None));
                        }
                        *last = Some(text);
                        json_event("approvals", &now)
                    }
                    Err(status) => {
                        *ended = true;
                        end_event(status)
                    }
                };
                std::future::ready(Some(Some(event)))
            })
            .filter_map(|e| std::future::ready(e.map(Ok))),
    );
    Ok(sse(events))
}

/// `GET /ui/api/live/fleet`: a `deployments` event at every change of the deployments (and a
/// `nests` event at every change of the Nests, for the cluster admin).
pub async fn fleet(c: Caller) -> Result<Response, ApiErr> {
    let mut client = c.api();
    let deployments = client
        .watch_deployments(c.req(pb::ListDeploymentsRequest {
            namespace: String::new(),
            all_namespaces: true,
        }))
        .await?
        .into_inner()
        .map(|item| match item {
            Ok(list) => json_event(
                "deployments",
                &list
                    .deployments
                    .iter()
                    .map(view::Deployment::from)
                    .collect::<Vec<_>>(),
            ),
            Err(status) => end_event(status),
        });
    let events: Events = if *c.principal() == crate::tokens::Principal::ClusterAdmin {
        let nests = client
            .watch_nests(c.req(pb::ListNestsRequest::default()))
            .await?
            .into_inner()
            .map(|item| match item {
                Ok(list) => json_event(
                    "nests",
                    &list.nests.iter().map(view::Nest::from).collect::<Vec<_>>(),
                ),
                Err(status) => end_event(status),
            });
        Box::pin(futures::stream::select(deployments, nests).map(Ok))
    } else {
        Box::pin(deployments.map(Ok))
    };
    Ok(sse(events))
}
