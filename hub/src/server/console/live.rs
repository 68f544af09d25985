//! Live updates as server-sent events, fed by the Hub's own watch streams (`WatchTask`,
//! `WatchDeployments`, `WatchNests`) called as the session's principal: they hold a place
//! among the token's open streams like any other client's, and end when the token is
//! revoked. Each event's id is its task event seq, so the browser's `EventSource`, which
//! reconnects by itself (after a Hub restart too), resumes after the last event it saw.

use std::convert::Infallible;
use std::time::Duration;

use agen_proto::v1 as pb;
use axum::extract::Path;
use axum::http::{Extensions, HeaderMap};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};

use super::{view, ApiErr, Shared};

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

/// `GET /ui/api/tasks/{namespace}/{task}/live`: the task's events (`task` events with the
/// task's snapshot), from the one after `Last-Event-ID` (all of them on a first connect).
pub async fn task(
    state: Shared,
    headers: HeaderMap,
    ext: Extensions,
    Path((namespace, task_id)): Path<(String, String)>,
) -> Result<Response, ApiErr> {
    let c = &state.0;
    let s = c.session(&headers, &ext)?;
    let from_seq = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |seen| seen + 1);
    let stream = c
        .client()
        .watch_task(c.req(
            &s,
            pb::WatchTaskRequest {
                namespace,
                task_id,
                from_seq,
                // The page shows finished turns; streamed deltas are for `agen wait --stream`.
                deltas: false,
            },
        ))
        .await?
        .into_inner();
    let events: Events = Box::pin(stream.scan(false, |ended, item| {
        if *ended {
            return std::future::ready(None);
        }
        let event = match item {
            Ok(e) => json_event("task", &view::TaskEvent::from(&e)).id(e.seq.to_string()),
            Err(status) => {
                *ended = true;
                end_event(status)
            }
        };
        std::future::ready(Some(Ok(event)))
    }));
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response())
}

/// `GET /ui/api/live/fleet`: a `deployments` event at every change of the deployments (and a
/// `nests` event at every change of the Nests, for the cluster admin).
pub async fn fleet(state: Shared, headers: HeaderMap, ext: Extensions) -> Result<Response, ApiErr> {
    let c = &state.0;
    let s = c.session(&headers, &ext)?;
    let mut client = c.client();
    let deployments = client
        .watch_deployments(c.req(
            &s,
            pb::ListDeploymentsRequest {
                namespace: String::new(),
                all_namespaces: true,
            },
        ))
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
    let events: Events = if s.principal == crate::tokens::Principal::ClusterAdmin {
        let nests = client
            .watch_nests(c.req(&s, pb::ListNestsRequest::default()))
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
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
        .into_response())
}
