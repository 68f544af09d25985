//! The user API without traps (issue 21): `WatchTask` replays the task as it was after each
//! event, a reused `client_request_id` with another input is `ALREADY_EXISTS`, `ListTasks`
//! takes the `task_state` enum, and gzip-compressed requests are accepted. Real gRPC over TLS;
//! the Nest is driven by hand.

mod support;

use std::time::Duration;

use agen_proto::v1 as pb;
use pb::hub_message::Msg as Hub;
use pb::nest_message::Msg as Nest;
use pretty_assertions::assert_eq;
use support::*;

const TTL: Duration = Duration::from_secs(10);

fn submit_request(input: &str, request_id: &str) -> pb::SubmitTaskRequest {
    pb::SubmitTaskRequest {
        traceparent: String::new(),
        namespace: "default".into(),
        deployment: "hello".into(),
        input: input.into(),
        labels: Default::default(),
        conversation_key: String::new(),
        client_request_id: request_id.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_replayed_watch_shows_the_task_as_it_was_after_each_event() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&dir.path().join("hub"), TTL).await;
    let mut api = hub.client().await;
    let bundle = dir.path().join("hello");
    write_bundle(&bundle, "hi");
    let (mut nest, _) = FakeNest::connect(&hub, "nest-a", &[], vec![]).await;
    deploy(&mut api, &bundle, "hello", 1).await;
    let place = nest.accept_placement().await;

    let task = api
        .submit_task(submit_request("what time is it?", "req-1"))
        .await
        .unwrap()
        .into_inner();
    let run = nest.next_assign().await;
    nest.send(Nest::RunEvents(pb::RunEvents {
        instance_id: place.instance_id.clone(),
        events: vec![
            event(&run, 1, "tool.started", serde_json::json!({"tool": "time.get_current_time", "call_id": "c1"})),
            event(&run, 2, "task.progress", serde_json::json!({"step": "looking up", "done": 1, "total": 2})),
            event(&run, 3, "tool.completed", serde_json::json!({"tool": "time.get_current_time", "call_id": "c1"})),
            event(&run, 4, "run.finished", serde_json::json!({"state": "succeeded", "result": "It is noon.", "response_type": "text",
                "messages": [{"role": "user", "content": "what time is it?"}, {"role": "assistant", "content": "It is noon."}]})),
        ],
    }))
    .await;
    nest.next_matching(|m| match m {
        Hub::Ack(a) if a.acked_seq == 4 => Some(a),
        _ => None,
    })
    .await;

    // Watch after the end: every event replayed, each with the task as it was then.
    let mut watch = api
        .watch_task(pb::WatchTaskRequest {
            namespace: "default".into(),
            task_id: task.task_id.clone(),
            from_seq: 0,
            deltas: false,
        })
        .await
        .unwrap()
        .into_inner();
    let mut seen = Vec::new();
    while let Some(e) = tokio::time::timeout(Duration::from_secs(5), watch.message())
        .await
        .unwrap()
        .unwrap()
    {
        let t = e.task.expect("every event carries a task");
        seen.push((
            e.kind,
            task_state(&t),
            t.progress.map(|p| p.step).unwrap_or_default(),
            t.outcome.map(|o| o.result).unwrap_or_default(),
        ));
    }
    use pb::TaskState::{Queued, Running, Succeeded};
    let s = |k: &str, st, p: &str, r: &str| (k.to_string(), st, p.to_string(), r.to_string());
    assert_eq!(
        seen,
        vec![
            s("task.state", Queued, "", ""),
            s("task.state", Running, "", ""),
            s("tool.started", Running, "", ""),
            s("task.progress", Running, "looking up", ""),
            s("tool.completed", Running, "looking up", ""),
            s("run.finished", Running, "looking up", ""),
            s("task.state", Succeeded, "looking up", "It is noon."),
        ]
    );
}

#[tokio::test]
async fn request_ids_task_state_filter_and_gzip() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&dir.path().join("hub"), TTL).await;
    let mut api = hub.client().await;
    let bundle = dir.path().join("hello");
    write_bundle(&bundle, "hi");
    deploy(&mut api, &bundle, "hello", 0).await;

    let first = api
        .submit_task(submit_request("one", "req-7"))
        .await
        .unwrap()
        .into_inner();
    // The same request again is the same task ...
    let again = api
        .submit_task(submit_request("one", "req-7"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.task_id, first.task_id);
    // ... another input under the same request id is refused, naming the first task.
    let err = api
        .submit_task(submit_request("two", "req-7"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::AlreadyExists, "{}", err.message());
    assert!(err.message().contains(&first.task_id), "{}", err.message());

    // ListTasks by the enum; the deprecated string still works.
    let by_enum = |state: pb::TaskState| pb::ListTasksRequest {
        namespace: "default".into(),
        task_state: state as i32,
        ..Default::default()
    };
    let queued = api
        .list_tasks(by_enum(pb::TaskState::Queued))
        .await
        .unwrap()
        .into_inner()
        .tasks;
    assert_eq!(queued.len(), 1);
    let none = api
        .list_tasks(by_enum(pb::TaskState::Succeeded))
        .await
        .unwrap()
        .into_inner()
        .tasks;
    assert_eq!(none.len(), 0);
    let by_string = api
        .list_tasks(pb::ListTasksRequest {
            namespace: "default".into(),
            state: "queued".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .tasks;
    assert_eq!(by_string.len(), 1);

    // A gzip-compressed request (and a gzip-accepting client) is served.
    let mut gz = hub
        .client()
        .await
        .send_compressed(tonic::codec::CompressionEncoding::Gzip)
        .accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    let t = gz
        .submit_task(submit_request(&"compressible ".repeat(1000), "req-gz"))
        .await
        .expect("gzip request accepted")
        .into_inner();
    assert_eq!(t.input.len(), 13_000);
}
