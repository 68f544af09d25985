//! Replicas spread again when a lost Nest returns, over the real gRPC wire with hand-driven
//! Nests: one instance moves (its replacement placed first), and a run in progress on the
//! crowded Nest is neither cancelled nor handed over.

mod support;

use std::time::Duration;

use agen_proto::v1 as pb;
use pb::hub_message::Msg as Hub;
use pretty_assertions::assert_eq;
use support::*;

#[tokio::test]
async fn a_returning_nest_gets_one_replica_back_without_dropping_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&dir.path().join("hub"), Duration::from_secs(2)).await;
    let mut api = hub.client().await;
    let bundle = dir.path().join("hello");
    write_bundle(&bundle, "hi");

    let (mut a, _) = FakeNest::connect(&hub, "nest-a", &[], vec![]).await;
    let (mut b, _) = FakeNest::connect(&hub, "nest-b", &[], vec![]).await;
    deploy(&mut api, &bundle, "hello", 2).await;
    let a1 = a.accept_placement().await;
    b.accept_placement().await;

    // nest-b is lost: its replica is replaced on nest-a.
    b.go_silent();
    let a2 = a.accept_placement().await;
    assert_ne!(a1.instance_id, a2.instance_id);
    eventually(
        "both replicas running on nest-a",
        Duration::from_secs(10),
        || {
            let mut api = api.clone();
            async move {
                let list = instances(&mut api, "hello").await;
                let on_a = list
                    .iter()
                    .filter(|i| {
                        state(i) == pb::InstanceState::Running
                            && i.healthy
                            && i.nest_name == "nest-a-name"
                    })
                    .count();
                (on_a == 2).then_some(())
            }
        },
    )
    .await;

    // A run in progress on nest-a.
    let task = api
        .submit_task(pb::SubmitTaskRequest {
            namespace: "default".into(),
            deployment: "hello".into(),
            input: "long job".into(),
            ..Default::default()
        })
        .await
        .expect("submit")
        .into_inner();
    let run = a.next_assign().await;
    send_events(
        &mut a,
        &run.instance_id,
        vec![event(&run, 1, "model.requested", serde_json::json!({}))],
    )
    .await;

    // nest-b returns: exactly one replica is placed on it.
    drop(b);
    let (mut b, _) = FakeNest::connect(&hub, "nest-b", &[], vec![]).await;
    let moved_to_b = b.accept_placement().await;

    // Once it runs, the idle instance on nest-a stops; the busy one is left alone.
    let (mut cancels, mut stops_of_busy) = (0, 0);
    let stopped = loop {
        match a.next().await {
            Hub::CancelRun(c) if c.run_id == run.run_id => cancels += 1,
            Hub::Stop(s) if s.instance_id == run.instance_id => stops_of_busy += 1,
            Hub::Stop(s) => break s,
            Hub::Place(p) => panic!("no new placement on the crowded nest-a: {p:?}"),
            _ => {}
        }
    };
    let idle = if run.instance_id == a1.instance_id {
        &a2.instance_id
    } else {
        &a1.instance_id
    };
    assert_eq!(&stopped.instance_id, idle);

    // The run finishes where it was: same attempt, accepted, task succeeded.
    let ack = send_events(
        &mut a,
        &run.instance_id,
        vec![event(
            &run,
            2,
            "run.finished",
            serde_json::json!({"state": "succeeded", "result": "done"}),
        )],
    )
    .await;
    assert!(!ack.fenced, "the run in progress was fenced by the move");
    let done = get(&mut api, &task.task_id).await;
    assert_eq!(task_state(&done), pb::TaskState::Succeeded);
    assert_eq!(run.attempt, 1);

    let list = instances(&mut api, "hello").await;
    let mut placed: Vec<(String, String)> = list
        .iter()
        .filter(|i| state(i) == pb::InstanceState::Running)
        .map(|i| (i.nest_name.clone(), i.instance_id.clone()))
        .collect();
    placed.sort();
    assert_eq!(
        placed,
        vec![
            ("nest-a-name".to_string(), run.instance_id.clone()),
            ("nest-b-name".to_string(), moved_to_b.instance_id.clone()),
        ]
    );
    // Counts: nothing cancelled, the busy instance never stopped, one move.
    assert_eq!((cancels, stops_of_busy), (0, 0));
}
