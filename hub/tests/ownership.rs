//! Run events are believed only from their owner (issue 11 item 2), tried as an attacker over
//! the real wire protocol (TLS, certificates from `Join`): a second Nest with its own valid
//! certificate sends events for a run it was not assigned, the right Nest relays them from
//! another instance, an event claims attempt 2^32−1, another names a task that does not
//! exist. Each is refused (acked `fenced`), never stored, moves neither the fence nor the
//! task, and the victim's own run finishes normally.

mod support;

use std::time::Duration;

use agen_proto::v1 as pb;
use pb::hub_message::Msg as Hub;
use pb::nest_message::Msg as Nest;
use pretty_assertions::assert_eq;
use support::*;

fn event(run: &pb::AssignRun, seq: u64, kind: &str, json: serde_json::Value) -> pb::RunEvent {
    pb::RunEvent {
        run_id: run.run_id.clone(),
        attempt: run.attempt,
        seq,
        task_id: run.task_id.clone(),
        at_ms: 1_000 + seq as i64,
        kind: kind.into(),
        json: json.to_string(),
        sync: true,
    }
}

async fn send(
    nest: &mut FakeNest,
    instance_id: &str,
    events: Vec<pb::RunEvent>,
) -> pb::RunEventsAck {
    nest.send(Nest::RunEvents(pb::RunEvents {
        instance_id: instance_id.into(),
        events,
    }))
    .await;
    nest.next_matching(|m| match m {
        Hub::Ack(a) => Some(a),
        _ => None,
    })
    .await
}

async fn get(api: &mut Api, task_id: &str) -> pb::Task {
    api.get_task(pb::GetTaskRequest {
        namespace: "default".into(),
        task_id: task_id.into(),
    })
    .await
    .expect("get task")
    .into_inner()
}

#[tokio::test]
async fn a_second_nest_with_its_own_certificate_cannot_move_a_run_it_was_not_assigned() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&dir.path().join("hub"), Duration::from_secs(10)).await;
    let mut api = hub.client().await;
    let bundle = dir.path().join("hello");
    write_bundle(&bundle, "hi");
    let (mut victim, _) = FakeNest::connect(&hub, "nest-victim", &[], vec![]).await;
    let up = upload(&mut api, &bundle).await.expect("upload");
    api.create_deployment(pb::CreateDeploymentRequest {
        namespace: "default".into(),
        name: "hello".into(),
        bundle_digest: up.digest,
        replicas: 1,
        selector: Default::default(),
        concurrency: 1,
    })
    .await
    .expect("create deployment");
    let place = victim.accept_placement().await;
    let task = api
        .submit_task(pb::SubmitTaskRequest {
            namespace: "default".into(),
            deployment: "hello".into(),
            input: "what is the answer?".into(),
            ..Default::default()
        })
        .await
        .expect("submit")
        .into_inner();
    let run = victim
        .next_matching(|m| match m {
            Hub::AssignRun(r) => Some(r),
            _ => None,
        })
        .await;
    let ack = send(
        &mut victim,
        &place.instance_id,
        vec![event(&run, 1, "model.requested", serde_json::json!({}))],
    )
    .await;
    assert_eq!((ack.acked_seq, ack.fenced), (1, false));

    // The attacker: a Nest of its own, with a valid certificate from Join.
    let (mut rogue, _) = FakeNest::connect(&hub, "nest-rogue", &[], vec![]).await;
    let pwned =
        serde_json::json!({"state": "succeeded", "result": "pwned", "response_type": "text"});
    let mut refused = 0;
    // 1. The victim's run, attempt and instance, from the wrong Nest.
    let ack = send(
        &mut rogue,
        &place.instance_id,
        vec![event(&run, 2, "run.finished", pwned.clone())],
    )
    .await;
    refused += usize::from(ack.fenced);
    // 2. An attempt the Hub never issued, to raise the fence over the real one.
    let high = pb::AssignRun {
        attempt: u32::MAX,
        ..run.clone()
    };
    let ack = send(
        &mut rogue,
        &place.instance_id,
        vec![event(&high, 1, "run.finished", pwned.clone())],
    )
    .await;
    refused += usize::from(ack.fenced);
    // 3. The same from the victim's own Nest: still not the assigned attempt.
    let ack = send(
        &mut victim,
        &place.instance_id,
        vec![event(&high, 2, "run.finished", pwned.clone())],
    )
    .await;
    refused += usize::from(ack.fenced);
    // 4. The right Nest, from an instance the run was not assigned to.
    let ack = send(
        &mut victim,
        "some-other-instance",
        vec![event(&run, 2, "run.finished", pwned.clone())],
    )
    .await;
    refused += usize::from(ack.fenced);
    // 5. A task that does not exist (never stored, however many).
    let ghost = pb::AssignRun {
        task_id: "task-ghost".into(),
        run_id: "run-ghost".into(),
        ..run.clone()
    };
    let ack = send(
        &mut rogue,
        &place.instance_id,
        vec![event(&ghost, 1, "model.requested", serde_json::json!({}))],
    )
    .await;
    refused += usize::from(ack.fenced);
    assert_eq!(refused, 5, "every forged event is refused");

    let t = get(&mut api, &task.task_id).await;
    assert_eq!(
        (task_state(&t), t.attempt, t.outcome.is_none()),
        (pb::TaskState::Running, 1, true),
        "nothing moved the task"
    );

    // The victim's own run finishes normally: its fence was not raised.
    let ack = send(
        &mut victim,
        &place.instance_id,
        vec![event(
            &run,
            2,
            "run.finished",
            serde_json::json!({"state": "succeeded", "result": "42", "response_type": "text"}),
        )],
    )
    .await;
    assert_eq!((ack.acked_seq, ack.fenced), (2, false));
    let t = get(&mut api, &task.task_id).await;
    assert_eq!(task_state(&t), pb::TaskState::Succeeded);
    assert_eq!(t.outcome.map(|o| o.result), Some("42".to_string()));

    // Nothing of the attacker was stored: the task's events are the victim's alone.
    let mut watch = api
        .watch_task(pb::WatchTaskRequest {
            namespace: "default".into(),
            task_id: task.task_id.clone(),
            from_seq: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut stored = Vec::new();
    while let Some(e) = tokio::time::timeout(Duration::from_secs(5), watch.message())
        .await
        .unwrap()
        .unwrap()
    {
        stored.push(e.json);
    }
    assert!(
        stored.iter().all(|j| !j.contains("pwned")),
        "no forged event was stored: {stored:?}"
    );
    let trace = api
        .get_trace(pb::GetTraceRequest {
            namespace: "default".into(),
            task_id: task.task_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(format!("{trace:?}").contains("model turn 1"));
}
