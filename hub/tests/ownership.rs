//! Run events are believed only from their owner (issue 11 item 2), tried as an attacker over
//! the real wire protocol (TLS, certificates from `Join`): a second Nest with its own valid
//! certificate sends events for a run it was not assigned, the right Nest relays them from
//! another instance, an event claims attempt 2^32−1, another names a task that does not
//! exist. Each is refused (acked `fenced`), never stored, moves neither the fence nor the
//! task, and the victim's own run finishes normally.

mod support;

use std::time::Duration;

use agen_proto::v1 as pb;
use pretty_assertions::assert_eq;
use support::*;

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
        ..Default::default()
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
    let run = victim.next_assign().await;
    let ack = send_events(
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
    let ack = send_events(
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
    let ack = send_events(
        &mut rogue,
        &place.instance_id,
        vec![event(&high, 1, "run.finished", pwned.clone())],
    )
    .await;
    refused += usize::from(ack.fenced);
    // 3. The same from the victim's own Nest: still not the assigned attempt.
    let ack = send_events(
        &mut victim,
        &place.instance_id,
        vec![event(&high, 2, "run.finished", pwned.clone())],
    )
    .await;
    refused += usize::from(ack.fenced);
    // 4. The right Nest, from an instance the run was not assigned to.
    let ack = send_events(
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
    let ack = send_events(
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
    let ack = send_events(
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
            deltas: false,
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

/// Uploads `content` as artifact `name` of `task_id` in `namespace`, as a Nest relays a save.
async fn put_artifact(
    nest: &mut NestApi,
    namespace: &str,
    task_id: &str,
    name: &str,
    content: &[u8],
) -> Result<pb::Artifact, tonic::Status> {
    let chunk = pb::ArtifactChunk {
        artifact: Some(pb::Artifact {
            artifact_id: agen_shared::bundle::digest(content),
            name: name.into(),
            media_type: "text/plain".into(),
            size: content.len() as u64,
            task_id: task_id.into(),
            created_at_ms: 0,
            namespace: namespace.into(),
        }),
        data: content.to_vec(),
    };
    nest.put_artifact(futures::stream::iter(vec![chunk]))
        .await
        .map(|r| r.into_inner())
}

async fn read_artifact(
    nest: &mut NestApi,
    namespace: &str,
    id: &str,
) -> Result<Vec<u8>, tonic::Status> {
    let mut stream = nest
        .read_artifact(pb::GetArtifactRequest {
            namespace: namespace.into(),
            artifact_id: id.into(),
        })
        .await?
        .into_inner();
    let mut bytes = Vec::new();
    while let Some(c) = stream.message().await? {
        bytes.extend_from_slice(&c.data);
    }
    Ok(bytes)
}

#[tokio::test]
async fn a_nest_saves_and_reads_artifacts_only_for_the_runs_it_was_assigned() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&dir.path().join("hub"), Duration::from_secs(10)).await;
    let mut api = hub.client().await;
    let bundle = dir.path().join("hello");
    write_bundle(&bundle, "hi");
    let (mut victim, _) = FakeNest::connect(&hub, "nest-victim", &[], vec![]).await;
    deploy(&mut api, &bundle, "hello", 1).await;
    let place = victim.accept_placement().await;
    let task = api
        .submit_task(pb::SubmitTaskRequest {
            namespace: "default".into(),
            deployment: "hello".into(),
            input: "write a report".into(),
            ..Default::default()
        })
        .await
        .expect("submit")
        .into_inner();
    let run = victim.next_assign().await;
    let mut victim_api = hub.nest_client_as("nest-victim").await;
    let saved = put_artifact(
        &mut victim_api,
        "default",
        &task.task_id,
        "report.md",
        b"ok",
    )
    .await
    .expect("the assigned nest saves for its run");

    // The attacker: a Nest of its own with a valid certificate, running nothing.
    let (_rogue, _) = FakeNest::connect(&hub, "nest-rogue", &[], vec![]).await;
    let mut rogue = hub.nest_client_as("nest-rogue").await;
    let mut refused = 0;
    let mut denied = |r: Result<(), tonic::Status>, what: &str| match r {
        Err(s) if s.code() == tonic::Code::PermissionDenied => refused += 1,
        other => panic!("{what}: expected PERMISSION_DENIED, got {other:?}"),
    };
    denied(
        put_artifact(&mut rogue, "default", &task.task_id, "x.md", b"pwned")
            .await
            .map(drop),
        "into the victim's task",
    );
    denied(
        put_artifact(&mut rogue, "fresh-ns", "task-ghost", "x.md", b"fill")
            .await
            .map(drop),
        "into a namespace nothing was deployed to",
    );
    denied(
        read_artifact(&mut rogue, "default", &saved.artifact_id)
            .await
            .map(drop),
        "reading the victim's namespace",
    );
    denied(
        put_artifact(&mut victim_api, "other", &task.task_id, "x.md", b"moved")
            .await
            .map(drop),
        "the right nest, another namespace",
    );
    assert_eq!(refused, 4, "every foreign save and read is refused");

    // The victim keeps working: it reads its own artifact.
    assert_eq!(
        read_artifact(&mut victim_api, "default", &saved.artifact_id)
            .await
            .expect("the assigned nest reads in its run's namespace"),
        b"ok"
    );
    let listed = |ns: &str| {
        let mut api = api.clone();
        let ns = ns.to_string();
        async move {
            api.list_artifacts(pb::ListArtifactsRequest {
                namespace: ns,
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner()
            .artifacts
            .len()
        }
    };
    assert_eq!(
        (
            listed("default").await,
            listed("fresh-ns").await,
            listed("other").await
        ),
        (1, 0, 0),
        "only the victim's artifact was stored"
    );

    // Once its run is over, even the victim's Nest may no longer save for it.
    let ack = send_events(
        &mut victim,
        &place.instance_id,
        vec![event(
            &run,
            1,
            "run.finished",
            serde_json::json!({"state": "succeeded", "result": "done", "response_type": "text"}),
        )],
    )
    .await;
    assert!(!ack.fenced);
    let late = put_artifact(
        &mut victim_api,
        "default",
        &task.task_id,
        "late.md",
        b"late",
    )
    .await;
    assert_eq!(
        late.map(|_| ()).map_err(|s| s.code()),
        Err(tonic::Code::PermissionDenied)
    );
}

#[tokio::test]
async fn a_run_finished_the_hub_cannot_read_ends_the_task_failed_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&dir.path().join("hub"), Duration::from_secs(10)).await;
    let mut api = hub.client().await;
    let bundle = dir.path().join("hello");
    write_bundle(&bundle, "hi");
    let (mut nest, _) = FakeNest::connect(&hub, "nest-a", &[], vec![]).await;
    deploy(&mut api, &bundle, "hello", 1).await;
    let place = nest.accept_placement().await;
    let task = api
        .submit_task(pb::SubmitTaskRequest {
            namespace: "default".into(),
            deployment: "hello".into(),
            input: "hi".into(),
            ..Default::default()
        })
        .await
        .expect("submit")
        .into_inner();
    let run = nest.next_assign().await;
    // Its own run, a state that is not one.
    let ack = send_events(
        &mut nest,
        &place.instance_id,
        vec![event(
            &run,
            1,
            "run.finished",
            serde_json::json!({"state": "half-done", "result": 7}),
        )],
    )
    .await;
    assert_eq!((ack.acked_seq, ack.fenced), (1, false));
    let t = get(&mut api, &task.task_id).await;
    assert_eq!(
        task_state(&t),
        pb::TaskState::Failed,
        "the run is over, never stuck"
    );
    let outcome = t.outcome.expect("an outcome");
    assert!(
        outcome
            .error
            .starts_with("the run's run.finished event could not be read"),
        "{outcome:?}"
    );
}
