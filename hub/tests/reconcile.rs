//! Run reconciliation over the real wire protocol: the Hub compares the runs a Nest reports
//! (`run_attempts` in every heartbeat) with its leases. A leased run the Nest does not hold
//! (its `AssignRun` never arrived) is dispatched again; a run the Nest executes that the Hub
//! did not assign is cancelled at once; a run that does not start within the run start
//! deadline is dispatched again.

mod support;

use std::time::Duration;

use agen_proto::v1 as pb;
use pb::hub_message::Msg as Hub;
use support::*;

async fn one_instance(
    opts: agen_hub::HubOptions,
    dir: &std::path::Path,
) -> (TestHub, Api, FakeNest, pb::PlaceInstance) {
    one_instance_with(opts, dir, None).await
}

/// [`one_instance`] whose bundle has this `x-agen/harness.json`.
async fn one_instance_with(
    opts: agen_hub::HubOptions,
    dir: &std::path::Path,
    harness: Option<&str>,
) -> (TestHub, Api, FakeNest, pb::PlaceInstance) {
    let hub = TestHub::start_with(opts).await;
    let mut api = hub.client().await;
    let bundle = dir.join("hello");
    write_bundle(&bundle, "hi");
    if let Some(h) = harness {
        std::fs::write(bundle.join("x-agen/harness.json"), h).expect("write harness.json");
    }
    let (mut nest, _) = FakeNest::connect(&hub, "nest-a", &[], vec![]).await;
    let up = upload(&mut api, &bundle).await.expect("upload");
    api.create_deployment(pb::CreateDeploymentRequest {
        namespace: "default".into(),
        name: "hello".into(),
        bundle_digest: up.digest,
        replicas: 1,
        selector: Default::default(),
        concurrency: 1,
        ..Default::default()
    })
    .await
    .expect("create deployment");
    let place = nest.accept_placement().await;
    (hub, api, nest, place)
}

async fn submit(api: &mut Api) -> pb::Task {
    api.submit_task(pb::SubmitTaskRequest {
        namespace: "default".into(),
        deployment: "hello".into(),
        input: "job".into(),
        ..Default::default()
    })
    .await
    .expect("submit")
    .into_inner()
}

#[tokio::test]
async fn a_run_the_nest_does_not_hold_is_dispatched_again_and_an_unassigned_one_is_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(&dir.path().join("hub"), Duration::from_secs(10));
    let (_hub, mut api, mut nest, place) = one_instance(opts, dir.path()).await;
    let task = submit(&mut api).await;
    let first = nest.next_assign().await;
    assert_eq!(
        (first.task_id.as_str(), first.attempt),
        (task.task_id.as_str(), 1)
    );
    // The assignment is lost on the way: the Nest's reports do not list it.
    if let Ok(mut running) = nest.running.lock() {
        for r in running.iter_mut() {
            r.run_attempts.clear();
        }
    }
    let again = tokio::time::timeout(Duration::from_secs(15), nest.next_assign())
        .await
        .expect("the run is dispatched again within 15 s");
    assert_eq!(
        (
            again.run_id.as_str(),
            again.attempt,
            again.instance_id.as_str()
        ),
        (first.run_id.as_str(), 2, place.instance_id.as_str()),
        "the same run, the next attempt"
    );

    // The Nest says its instance executes a run the Hub never assigned: cancelled at once.
    if let Ok(mut running) = nest.running.lock() {
        for r in running.iter_mut() {
            r.run_attempts.push(pb::ActiveRun {
                run_id: "run-not-from-this-hub".into(),
                attempt: 1,
            });
        }
    }
    let cancel = nest
        .next_matching(|m| match m {
            Hub::CancelRun(c) if c.run_id == "run-not-from-this-hub" => Some(c),
            _ => None,
        })
        .await;
    assert_eq!(cancel.instance_id, place.instance_id);
}

#[tokio::test]
async fn a_run_that_does_not_start_within_the_deadline_is_dispatched_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(&dir.path().join("hub"), Duration::from_secs(10));
    opts.run_start_deadline = Duration::from_secs(1);
    let (_hub, mut api, mut nest, _place) = one_instance(opts, dir.path()).await;
    let task = submit(&mut api).await;
    let first = nest.next_assign().await;
    // Held by the Nest (it is in its reports) but no event ever comes.
    let again = tokio::time::timeout(Duration::from_secs(10), nest.next_assign())
        .await
        .expect("dispatched again after the start deadline");
    assert_eq!(
        (again.run_id.as_str(), again.attempt),
        (first.run_id.as_str(), 2)
    );
    let t = api
        .get_task(pb::GetTaskRequest {
            namespace: "default".into(),
            task_id: task.task_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(t.attempt, 2);
}

#[tokio::test]
async fn the_bundles_max_attempts_bounds_the_instance_failures_a_run_survives() {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(&dir.path().join("hub"), Duration::from_secs(10));
    let (_hub, mut api, mut nest, place) =
        one_instance_with(opts, dir.path(), Some(r#"{"limits": {"maxAttempts": 2}}"#)).await;
    let task = submit(&mut api).await;
    for attempt in 1..=2u32 {
        let run = nest.next_assign().await;
        assert_eq!(run.attempt, attempt);
        nest.send(pb::nest_message::Msg::RunEvents(pb::RunEvents {
            instance_id: place.instance_id.clone(),
            events: vec![pb::RunEvent {
                run_id: run.run_id.clone(),
                attempt,
                seq: 1,
                task_id: run.task_id.clone(),
                at_ms: 1,
                kind: "run.interrupted".into(),
                json: serde_json::json!({"reason": "the instance process died", "cause": "instance_died"}).to_string(),
                sync: true,
            }],
        }))
        .await;
    }
    let t = eventually("the task to fail", Duration::from_secs(10), || {
        let mut api = api.clone();
        let id = task.task_id.clone();
        async move {
            let t = api
                .get_task(pb::GetTaskRequest {
                    namespace: "default".into(),
                    task_id: id,
                })
                .await
                .ok()?
                .into_inner();
            (task_state(&t) == pb::TaskState::Failed).then_some(t)
        }
    })
    .await;
    let error = t.outcome.unwrap().error;
    assert!(
        error.contains("giving up after 2 failed attempts"),
        "{error}"
    );
}
