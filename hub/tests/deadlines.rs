//! Task budgets at the Hub (issue 15 item 5): a task's timeout and token budget, its own or its
//! bundle's (`limits.taskTimeout`, `limits.maxTokens`), are kept on the task and sent with its
//! run; the deadline cancels the run through its Nest and ends the task failed with "deadline
//! exceeded"; the deadline is durable and fires after a Hub restart.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use agen_proto::v1 as pb;
use pb::hub_message::Msg as Hub;
use pretty_assertions::assert_eq;
use support::*;

const TTL: Duration = Duration::from_secs(10);

/// A Hub with deployment `hello` (bundle limits from `harness`) on one hand-driven Nest.
async fn fleet(
    dir: &std::path::Path,
    harness: &str,
) -> (TestHub, Api, FakeNest, pb::PlaceInstance) {
    let hub = TestHub::start(&dir.join("hub"), TTL).await;
    let mut api = hub.client().await;
    let bundle = dir.join("hello");
    write_bundle(&bundle, "hi");
    std::fs::write(bundle.join("x-agen/harness.json"), harness).unwrap();
    let (mut nest, _) = FakeNest::connect(&hub, "nest-a", &[], vec![]).await;
    deploy(&mut api, &bundle, "hello", 1).await;
    let place = nest.accept_placement().await;
    (hub, api, nest, place)
}

async fn submit(api: &mut Api, timeout_ms: u64, max_tokens: u64) -> pb::Task {
    api.submit_task(pb::SubmitTaskRequest {
        namespace: "default".into(),
        deployment: "hello".into(),
        input: "take your time".into(),
        timeout_ms,
        max_tokens,
        ..Default::default()
    })
    .await
    .expect("submit task")
    .into_inner()
}

async fn ended(api: &Api, task_id: &str, within: Duration) -> pb::Task {
    eventually("the task to end", within, || {
        let mut api = api.clone();
        let id = task_id.to_string();
        async move {
            let t = get(&mut api, &id).await;
            matches!(
                task_state(&t),
                pb::TaskState::Succeeded | pb::TaskState::Failed | pb::TaskState::Cancelled
            )
            .then_some(t)
        }
    })
    .await
}

fn assert_deadline_exceeded(t: &pb::Task) {
    assert_eq!(task_state(t), pb::TaskState::Failed, "{t:?}");
    let o = t.outcome.clone().unwrap_or_default();
    assert_eq!(o.response_type, "error", "{o:?}");
    assert!(o.result.starts_with("deadline exceeded"), "{o:?}");
}

#[tokio::test]
async fn a_task_past_its_deadline_has_its_run_cancelled_and_fails_with_deadline_exceeded() {
    let dir = tempfile::tempdir().unwrap();
    let (_hub, mut api, mut nest, place) = fleet(
        dir.path(),
        r#"{"limits": {"taskTimeout": "1h", "maxTokens": 5000}}"#,
    )
    .await;

    // The submit's own values win over the bundle's, and go with the run.
    let task = submit(&mut api, 1500, 1234).await;
    assert_eq!((task.timeout_ms, task.max_tokens), (1500, 1234));
    assert_eq!(task.deadline_ms, task.created_at_ms + 1500);
    let run = nest.next_assign().await;
    assert_eq!(run.max_tokens, 1234);

    // The deadline cancels the run through its Nest; the run stops as cancelled, the task
    // fails with "deadline exceeded" all the same.
    let cancel = nest
        .next_matching(|m| match m {
            Hub::CancelRun(c) => Some(c),
            _ => None,
        })
        .await;
    assert_eq!(cancel.run_id, run.run_id);
    assert!(cancel.reason.starts_with("deadline exceeded"), "{cancel:?}");
    send_events(
        &mut nest,
        &place.instance_id,
        vec![event(
            &run,
            1,
            "run.finished",
            serde_json::json!({"state": "cancelled", "result": "the run was cancelled", "response_type": "error"}),
        )],
    )
    .await;
    let t = ended(&api, &task.task_id, Duration::from_secs(10)).await;
    assert_deadline_exceeded(&t);

    // Without values of its own, a task takes the bundle's defaults.
    let task = submit(&mut api, 0, 0).await;
    assert_eq!((task.timeout_ms, task.max_tokens), (3_600_000, 5000));
    assert_eq!(task.deadline_ms, task.created_at_ms + 3_600_000);

    // A timeout past a year is refused, not cut.
    let err = api
        .submit_task(pb::SubmitTaskRequest {
            namespace: "default".into(),
            deployment: "hello".into(),
            input: "forever".into(),
            timeout_ms: u64::MAX,
            ..Default::default()
        })
        .await
        .expect_err("a timeout of u64::MAX ms");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().starts_with("timeout_ms: "), "{err:?}");
}

#[tokio::test]
async fn a_task_deadline_survives_a_hub_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut hub, mut api, mut nest, _place) = fleet(dir.path(), "{}").await;
    let task = submit(&mut api, 4000, 0).await;
    assert_eq!(task.max_tokens, 0, "no budget: none sent");
    nest.next_assign().await;
    drop(nest);
    hub.stop().await;

    let hub2 = TestHub::start_with(options(&dir.path().join("hub"), TTL)).await;
    let api = hub2.client().await;
    let t = get(&mut api.clone(), &task.task_id).await;
    assert_eq!(task_state(&t), pb::TaskState::Running);
    assert_eq!(
        (t.timeout_ms, t.deadline_ms),
        (4000, task.deadline_ms),
        "the deadline is kept"
    );
    // Its Nest is gone: the cancel's grace runs out, and the task fails for its deadline.
    let t = ended(&api, &task.task_id, Duration::from_secs(30)).await;
    assert_deadline_exceeded(&t);
    assert!(
        t.finished_at_ms >= task.deadline_ms,
        "not before the deadline: {} < {}",
        t.finished_at_ms,
        task.deadline_ms
    );
}

#[tokio::test]
async fn a_resumed_attempt_keeps_the_tasks_deadline_and_token_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (_hub, mut api, mut nest, place) = fleet(dir.path(), "{}").await;
    let task = submit(&mut api, 3_600_000, 777).await;
    let first = nest.next_assign().await;
    send_events(
        &mut nest,
        &place.instance_id,
        vec![event(
            &first,
            1,
            "run.interrupted",
            serde_json::json!({"reason": "the nest is shutting down", "cause": "nest_shutdown"}),
        )],
    )
    .await;
    let second = nest.next_assign().await;
    assert_eq!(
        (second.run_id.as_str(), second.attempt, second.max_tokens),
        (first.run_id.as_str(), first.attempt + 1, 777)
    );
    let t = get(&mut api, &task.task_id).await;
    assert_eq!(
        (t.timeout_ms, t.deadline_ms, t.max_tokens),
        (3_600_000, task.deadline_ms, 777)
    );
}
