//! The Hub over its real gRPC wire protocol (TLS, tokens): health and reflection, the API,
//! a hand-driven Nest stream (register, placement, loss, restart and re-adoption), and tasks
//! (dispatch, run events and acks, idempotent submit, cancel, conversations, watch).

mod support;

use std::time::Duration;

use agen_proto::v1 as pb;
use pb::hub_message::Msg as Hub;
use pb::nest_message::Msg as Nest;
use pretty_assertions::assert_eq;
use support::*;

const TTL: Duration = Duration::from_secs(10);

#[tokio::test]
async fn health_and_reflection_need_no_token_but_the_api_does() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(dir.path(), TTL).await;
    let channel = hub.channel().await;

    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "agen.v1.AgenService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    use tonic_reflection::pb::v1::{
        server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        ServerReflectionRequest,
    };
    let mut reflection = ServerReflectionClient::new(channel.clone());
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(futures::stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("expected a service list")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        names.contains(&"agen.v1.AgenService".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_string()),
        "{names:?}"
    );
    // The internal Nest protocol is not advertised to a caller without a Nest certificate.
    assert!(
        !names.contains(&"agen.v1.NestService".to_string()),
        "{names:?}"
    );

    let mut anonymous = pb::agen_service_client::AgenServiceClient::new(channel.clone());
    let err = anonymous
        .list_nests(pb::ListNestsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert!(err.message().contains("admin token"), "{}", err.message());

    let mut wrong = pb::agen_service_client::AgenServiceClient::with_interceptor(
        channel.clone(),
        Bearer::new("nope"),
    );
    assert_eq!(
        wrong
            .list_nests(pb::ListNestsRequest::default())
            .await
            .unwrap_err()
            .code(),
        tonic::Code::Unauthenticated
    );

    // The join token is for Nests only.
    let mut nest_token = pb::agen_service_client::AgenServiceClient::with_interceptor(
        channel,
        Bearer::new(&hub.join_token),
    );
    assert_eq!(
        nest_token
            .list_nests(pb::ListNestsRequest::default())
            .await
            .unwrap_err()
            .code(),
        tonic::Code::Unauthenticated
    );

    let mut api = hub.client().await;
    assert_eq!(
        api.list_nests(pb::ListNestsRequest::default())
            .await
            .unwrap()
            .into_inner()
            .nests,
        vec![]
    );
}

#[tokio::test]
async fn join_token_pins_the_hub_ca() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(dir.path(), TTL).await;
    let token = agen_shared::tls::JoinToken::parse(&hub.join_token).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("join-token"))
            .unwrap()
            .trim(),
        hub.join_token
    );
    let pem = agen_nest::hub_client::fetch_pinned_ca(&hub.url, &token.ca_sha256)
        .await
        .unwrap();
    assert_eq!(
        pem.trim(),
        std::fs::read_to_string(&hub.ca_file).unwrap().trim()
    );
}

#[tokio::test]
async fn plaintext_is_refused_off_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(dir.path(), TTL);
    opts.insecure_plaintext = true;
    opts.listen = "0.0.0.0:0".parse().unwrap();
    let err = agen_hub::start(opts, Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("only allowed on a loopback"), "{err}");
}

#[tokio::test]
async fn upload_deploy_and_list_with_clear_errors_for_bad_requests() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&dir.path().join("hub"), TTL).await;
    let mut api = hub.client().await;
    let bundle = dir.path().join("hello");
    write_bundle(&bundle, "You are helpful.");

    let first = upload(&mut api, &bundle).await.unwrap();
    assert!(!first.already_present);
    let again = upload(&mut api, &bundle).await.unwrap();
    assert!(again.already_present);
    assert_eq!(again.digest, first.digest);

    let d = deploy(&mut api, &bundle, "hello", 2).await;
    assert_eq!(
        (
            d.name.as_str(),
            d.replicas,
            d.generation,
            d.agent_name.as_str()
        ),
        ("hello", 2, 1, "hello")
    );
    let list = api
        .list_deployments(pb::ListDeploymentsRequest {
            namespace: "default".into(),
            all_namespaces: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.deployments.len(), 1);

    // The same spec again is no new generation; a changed bundle is.
    assert_eq!(deploy(&mut api, &bundle, "hello", 2).await.generation, 1);
    write_bundle(&bundle, "You are very helpful.");
    assert_eq!(deploy(&mut api, &bundle, "hello", 2).await.generation, 2);

    // Pending placements are visible with the reason.
    let pending = eventually("pending instances", Duration::from_secs(5), || {
        let mut api = api.clone();
        async move {
            let list = instances(&mut api, "hello").await;
            (list.len() == 2
                && list
                    .iter()
                    .all(|i| state(i) == pb::InstanceState::Pending && !i.message.is_empty()))
            .then_some(list)
        }
    })
    .await;
    assert!(
        pending[0].message.contains("waiting for a ready nest"),
        "{}",
        pending[0].message
    );

    // A broken bundle is refused with the bundle's own error.
    let broken = dir.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("mcp.json"), "{}").unwrap();
    let err = upload(&mut api, &broken).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("x-agen/agent.md"),
        "{}",
        err.message()
    );

    // A wrong digest is refused.
    let bytes = agen_shared::bundle::pack(&bundle).unwrap();
    let mut chunk = pb::BundleChunk {
        digest: format!("sha256:{}", "0".repeat(64)),
        total_size: bytes.len() as u64,
        data: bytes,
    };
    let err = api
        .upload_bundle(futures::stream::iter(vec![chunk.clone()]))
        .await
        .unwrap_err();
    assert!(
        err.message().contains("not the announced"),
        "{}",
        err.message()
    );
    chunk.total_size = 65 * 1024 * 1024;
    let err = api
        .upload_bundle(futures::stream::iter(vec![chunk]))
        .await
        .unwrap_err();
    assert!(err.message().contains("64 MiB"), "{}", err.message());

    async fn create(api: &mut Api, name: &str, digest: &str, replicas: u32) -> tonic::Status {
        api.create_deployment(pb::CreateDeploymentRequest {
            namespace: "default".into(),
            name: name.into(),
            bundle_digest: digest.into(),
            replicas,
            selector: Default::default(),
            concurrency: 0,
            ..Default::default()
        })
        .await
        .unwrap_err()
    }
    let cases = [
        (
            "",
            first.digest.as_str(),
            1,
            tonic::Code::InvalidArgument,
            "name: expected a name",
        ),
        (
            "x",
            first.digest.as_str(),
            1001,
            tonic::Code::InvalidArgument,
            "replicas: 1001 is too many",
        ),
        ("x", "", 1, tonic::Code::InvalidArgument, "bundle_digest"),
        (
            "x",
            "sha256:abc",
            1,
            tonic::Code::FailedPrecondition,
            "is not uploaded",
        ),
        (
            "Bad Name",
            first.digest.as_str(),
            1,
            tonic::Code::InvalidArgument,
            "not a valid name",
        ),
    ];
    for (name, digest, replicas, code, text) in cases {
        let err = create(&mut api, name, digest, replicas).await;
        assert_eq!(err.code(), code, "{name}: {}", err.message());
        assert!(err.message().contains(text), "{name}: {}", err.message());
    }
    let err = api
        .get_deployment(pb::GetDeploymentRequest {
            namespace: "default".into(),
            name: "x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (tonic::Code::NotFound, "deployment default/x not found")
    );
    let err = api
        .list_tasks(pb::ListTasksRequest {
            state: "done".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        err.message()
            .starts_with("state: `done` is not a task state"),
        "{}",
        err.message()
    );

    api.delete_deployment(pb::DeleteDeploymentRequest {
        namespace: "default".into(),
        name: "hello".into(),
    })
    .await
    .unwrap();
    eventually("instances gone", Duration::from_secs(5), || {
        let mut api = api.clone();
        async move { instances(&mut api, "hello").await.is_empty().then_some(()) }
    })
    .await;
}

#[tokio::test]
async fn a_nest_registers_gets_placements_spread_and_reports_them_running() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&dir.path().join("hub"), TTL).await;
    let mut api = hub.client().await;
    let bundle = dir.path().join("hello");
    write_bundle(&bundle, "hi");

    let (mut a, registered) = FakeNest::connect(&hub, "nest-a", &[("zone", "x")], vec![]).await;
    assert_eq!(registered.nest_id, "nest-a");
    assert_eq!(registered.stop_instances, Vec::<String>::new());
    let (mut b, _) = FakeNest::connect(&hub, "nest-b", &[("zone", "y")], vec![]).await;

    deploy(&mut api, &bundle, "hello", 2).await;
    let pa = a.accept_placement().await;
    let pb_ = b.accept_placement().await;
    assert_eq!(
        (pa.deployment.as_str(), pa.generation, pa.concurrency),
        ("hello", 1, 1)
    );
    assert_ne!(pa.instance_id, pb_.instance_id);

    let list = eventually("two running instances", Duration::from_secs(5), || {
        let mut api = api.clone();
        async move {
            let list = instances(&mut api, "hello").await;
            (list.len() == 2
                && list
                    .iter()
                    .all(|i| state(i) == pb::InstanceState::Running && i.healthy))
            .then_some(list)
        }
    })
    .await;
    let mut nests: Vec<&str> = list.iter().map(|i| i.nest_name.as_str()).collect();
    nests.sort();
    assert_eq!(nests, vec!["nest-a-name", "nest-b-name"]);
    assert_eq!(list[0].tools_loaded, 2);

    let nest_list = api
        .list_nests(pb::ListNestsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .nests;
    assert_eq!(nest_list.len(), 2);
    assert!(nest_list
        .iter()
        .all(|n| n.state == pb::NestState::Ready as i32 && n.capacity == 32 && n.instances == 1));

    // A selector places only on matching Nests.
    let up = upload(&mut api, &bundle).await.unwrap();
    api.create_deployment(pb::CreateDeploymentRequest {
        namespace: "default".into(),
        name: "zoned".into(),
        bundle_digest: up.digest,
        replicas: 1,
        selector: [("zone".to_string(), "y".to_string())].into(),
        concurrency: 0,
        ..Default::default()
    })
    .await
    .unwrap();
    let placed = b.accept_placement().await;
    assert_eq!(placed.deployment, "zoned");

    // Deployment shows ready replicas.
    let got = api
        .get_deployment(pb::GetDeploymentRequest {
            namespace: "default".into(),
            name: "hello".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.deployment.unwrap().ready_replicas, 2);
    assert_eq!(got.instances.len(), 2);
}

#[tokio::test]
async fn a_lost_nest_has_its_instances_replaced_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&dir.path().join("hub"), Duration::from_secs(2)).await;
    let mut api = hub.client().await;
    let bundle = dir.path().join("hello");
    write_bundle(&bundle, "hi");

    let (mut a, _) = FakeNest::connect(&hub, "nest-a", &[], vec![]).await;
    deploy(&mut api, &bundle, "hello", 1).await;
    let first = a.accept_placement().await;
    let (mut b, _) = FakeNest::connect(&hub, "nest-b", &[], vec![]).await;

    a.go_silent();
    let replacement = b.accept_placement().await;
    assert_ne!(replacement.instance_id, first.instance_id);

    let list = eventually(
        "replacement running, old one lost",
        Duration::from_secs(5),
        || {
            let mut api = api.clone();
            async move {
                let list = instances(&mut api, "hello").await;
                let running = list.iter().any(|i| {
                    state(i) == pb::InstanceState::Running && i.nest_name == "nest-b-name"
                });
                running.then_some(list)
            }
        },
    )
    .await;
    let old = list.iter().find(|i| i.instance_id == first.instance_id);
    if let Some(old) = old {
        assert_eq!(state(old), pb::InstanceState::Lost);
        assert!(old.message.contains("no heartbeat"), "{}", old.message);
    }
    let nests = api
        .list_nests(pb::ListNestsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .nests;
    let a_state = nests.iter().find(|n| n.nest_id == "nest-a").unwrap().state;
    assert_eq!(a_state, pb::NestState::Lost as i32);
}

#[tokio::test]
async fn a_hub_restart_keeps_state_and_readopts_instances_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let hub_dir = dir.path().join("hub");
    let mut hub = TestHub::start(&hub_dir, Duration::from_secs(3)).await;
    let mut api = hub.client().await;
    let bundle = dir.path().join("hello");
    write_bundle(&bundle, "hi");
    let (mut a, _) = FakeNest::connect(&hub, "nest-a", &[], vec![]).await;
    deploy(&mut api, &bundle, "hello", 2).await;
    let p1 = a.accept_placement().await;
    let p2 = a.accept_placement().await;
    eventually("both running", Duration::from_secs(5), || {
        let mut api = api.clone();
        async move {
            let list = instances(&mut api, "hello").await;
            (list
                .iter()
                .filter(|i| state(i) == pb::InstanceState::Running)
                .count()
                == 2)
                .then_some(())
        }
    })
    .await;
    let reports = a.running.lock().unwrap().clone();
    drop(a);
    hub.stop().await;

    let mut hub2 = TestHub::start_with(options(&hub_dir, Duration::from_secs(3))).await;
    assert_eq!(hub2.admin_token, hub.admin_token);
    assert_eq!(hub2.join_token, hub.join_token);
    let mut api = hub2.client().await;
    let deployments = api
        .list_deployments(pb::ListDeploymentsRequest {
            namespace: "default".into(),
            all_namespaces: false,
        })
        .await
        .unwrap()
        .into_inner()
        .deployments;
    assert_eq!(deployments.len(), 1);
    let before = instances(&mut api, "hello").await;
    assert_eq!(before.len(), 2, "instances survive the restart");

    // The Nest comes back with what it runs, plus one instance the Hub never placed.
    let mut stray = reports[0].clone();
    stray.instance_id = "stray-1".into();
    let mut with_stray = reports.clone();
    with_stray.push(stray);
    let (mut a, registered) = FakeNest::connect(&hub2, "nest-a", &[], with_stray).await;
    assert_eq!(registered.stop_instances, vec!["stray-1".to_string()]);
    a.running
        .lock()
        .unwrap()
        .retain(|r| r.instance_id != "stray-1");

    // Well past the reconcile window: still exactly the two original instances, nothing placed.
    let mut expected = vec![p1.instance_id.clone(), p2.instance_id.clone()];
    expected.sort();
    let deadline = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < deadline {
        let mut ids: Vec<String> = instances(&mut api, "hello")
            .await
            .into_iter()
            .map(|i| i.instance_id)
            .collect();
        ids.sort();
        assert_eq!(ids, expected);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    while let Ok(m) = tokio::time::timeout(Duration::from_millis(300), a.next()).await {
        assert!(
            matches!(&m, Hub::Stop(s) if s.instance_id == "stray-1"),
            "only the stray is stopped, nothing placed: {m:?}"
        );
    }
    hub2.stop().await;
}

#[tokio::test]
async fn an_unhealthy_instance_is_replaced_with_a_new_id_and_back_off() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&dir.path().join("hub"), TTL).await;
    let mut api = hub.client().await;
    let bundle = dir.path().join("hello");
    write_bundle(&bundle, "hi");
    let (mut a, _) = FakeNest::connect(&hub, "nest-a", &[], vec![]).await;
    deploy(&mut api, &bundle, "hello", 1).await;
    let first = a.accept_placement().await;

    let mut report = a.running.lock().unwrap()[0].clone();
    report.state = pb::InstanceState::Unhealthy as i32;
    report.healthy = false;
    report.message = "tool server time exited: status 1".into();
    a.running.lock().unwrap().clear();
    a.send(Nest::Instance(report)).await;

    let stop = a
        .next_matching(|m| match m {
            Hub::Stop(s) => Some(s),
            _ => None,
        })
        .await;
    assert_eq!(stop.instance_id, first.instance_id);
    assert!(
        stop.reason.contains("tool server time exited"),
        "{}",
        stop.reason
    );
    let replacement = a
        .next_matching(|m| match m {
            Hub::Place(p) => Some(p),
            _ => None,
        })
        .await;
    assert_ne!(replacement.instance_id, first.instance_id);

    // Failing again: the next replacement waits, and says why.
    a.report_running(&replacement).await;
    let mut report = a.running.lock().unwrap()[0].clone();
    report.state = pb::InstanceState::Unhealthy as i32;
    report.healthy = false;
    report.message = "tool server time exited: status 1".into();
    a.running.lock().unwrap().clear();
    a.send(Nest::Instance(report)).await;
    let pending = eventually(
        "a pending replacement with its back-off",
        Duration::from_secs(5),
        || {
            let mut api = api.clone();
            async move {
                instances(&mut api, "hello").await.into_iter().find(|i| {
                    state(i) == pb::InstanceState::Pending
                        && i.message.starts_with("replacement back-off")
                })
            }
        },
    )
    .await;
    assert_eq!(
        pending.message,
        "replacement back-off 2s: tool server time exited: status 1"
    );
}

/// Sets up a Hub, a Nest running one instance of `hello`, and returns them.
async fn submit(api: &mut Api, input: &str, conversation: &str, request_id: &str) -> pb::Task {
    api.submit_task(pb::SubmitTaskRequest {
        traceparent: String::new(),
        namespace: "default".into(),
        deployment: "hello".into(),
        input: input.into(),
        labels: [("team".to_string(), "a".to_string())].into(),
        conversation_key: conversation.into(),
        client_request_id: request_id.into(),
        ..Default::default()
    })
    .await
    .expect("submit task")
    .into_inner()
}

#[tokio::test]
async fn a_task_runs_from_submit_to_succeeded_through_run_events_and_acks() {
    let dir = tempfile::tempdir().unwrap();
    let (_hub, mut api, mut nest, place) = fleet_with_one_instance(dir.path(), 0).await;

    let task = submit(&mut api, "what time is it?", "", "req-1").await;
    assert_eq!(task_state(&task), pb::TaskState::Queued);
    // A retried submit returns the same task.
    assert_eq!(
        submit(&mut api, "what time is it?", "", "req-1")
            .await
            .task_id,
        task.task_id
    );

    let run = nest.next_assign().await;
    assert_eq!(
        (run.task_id.as_str(), run.attempt, run.instance_id.as_str()),
        (task.task_id.as_str(), 1, place.instance_id.as_str())
    );
    assert_eq!(run.root_run_id, run.run_id);
    // No conversation key, a first attempt: nothing to fetch, and nothing inside the stream.
    assert_eq!(
        (run.context_by_fetch, run.history_json.as_str()),
        (false, "")
    );
    assert_eq!(run.labels.get("team").map(String::as_str), Some("a"));

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

    let ack = send_events(
        &mut nest,
        &place.instance_id,
        vec![
            event(&run, 1, "model.requested", serde_json::json!({})),
            event(&run, 2, "model.answered", serde_json::json!({})),
            event(
                &run,
                3,
                "tool.started",
                serde_json::json!({"tool": "time.get_current_time", "call_id": "c1"}),
            ),
            event(
                &run,
                4,
                "task.progress",
                serde_json::json!({"step": "looking up", "done": 1, "total": 2}),
            ),
        ],
    )
    .await;
    assert_eq!((ack.acked_seq, ack.fenced), (4, false));
    let running = get(&mut api, &task.task_id).await;
    assert_eq!(task_state(&running), pb::TaskState::Running);
    assert_eq!(running.activity, "calling time.get_current_time");
    assert_eq!(
        running
            .progress
            .as_ref()
            .map(|p| (p.step.as_str(), p.done, p.total)),
        Some(("looking up", Some(1), Some(2)))
    );

    // A resend is harmless: acked again, stored once.
    let ack = send_events(
        &mut nest,
        &place.instance_id,
        vec![event(
            &run,
            4,
            "task.progress",
            serde_json::json!({"step": "looking up"}),
        )],
    )
    .await;
    assert_eq!(ack.acked_seq, 4);

    // A report held back from task.progress (within 10 s of the last) shows at once.
    let ack = send_events(
        &mut nest,
        &place.instance_id,
        vec![event(
            &run,
            5,
            "progress.latest",
            serde_json::json!({"step": "almost there", "done": 2, "total": 2}),
        )],
    )
    .await;
    assert_eq!(ack.acked_seq, 5);
    let latest = get(&mut api, &task.task_id).await;
    assert_eq!(
        latest.progress.as_ref().map(|p| (p.step.as_str(), p.done)),
        Some(("almost there", Some(2)))
    );

    let ack = send_events(
        &mut nest,
        &place.instance_id,
        vec![
            event(&run, 6, "tool.completed", serde_json::json!({"tool": "time.get_current_time", "call_id": "c1"})),
            event(
                &run,
                7,
                "run.finished",
                serde_json::json!({"state": "succeeded", "result": "It is noon.", "response_type": "text",
                    "messages": [{"role": "user", "content": "what time is it?"}, {"role": "assistant", "content": "It is noon."}]}),
            ),
        ],
    )
    .await;
    assert_eq!(ack.acked_seq, 7);
    let done = get(&mut api, &task.task_id).await;
    assert_eq!(task_state(&done), pb::TaskState::Succeeded);
    let outcome = done.outcome.unwrap();
    assert_eq!(
        (outcome.result.as_str(), outcome.response_type.as_str()),
        ("It is noon.", "text")
    );

    // Watch replays every event and ends after the terminal state.
    let mut kinds = Vec::new();
    while let Some(e) = tokio::time::timeout(Duration::from_secs(5), watch.message())
        .await
        .unwrap()
        .unwrap()
    {
        kinds.push(e.kind);
    }
    assert_eq!(
        kinds,
        vec![
            "task.state",
            "task.state",
            "model.requested",
            "model.answered",
            "tool.started",
            "task.progress",
            "progress.latest",
            "tool.completed",
            "run.finished",
            "task.state"
        ]
    );

    let trace = api
        .get_trace(pb::GetTraceRequest {
            namespace: "default".into(),
            task_id: task.task_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let spans: Vec<(String, String)> = trace
        .spans
        .iter()
        .map(|s| (s.name.clone(), s.status.clone()))
        .collect();
    assert_eq!(
        spans,
        vec![
            ("task hello".to_string(), "succeeded".to_string()),
            ("model turn 1".to_string(), "ok".to_string()),
            ("tool time.get_current_time".to_string(), "ok".to_string()),
        ]
    );

    let listed = api
        .list_tasks(pb::ListTasksRequest {
            namespace: "default".into(),
            state: "succeeded".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.tasks.len(), 1);
    let arts = api
        .list_artifacts(pb::ListArtifactsRequest {
            namespace: "default".into(),
            task_id: task.task_id.clone(),
        })
        .await
        .unwrap();
    assert!(arts.into_inner().artifacts.is_empty());
}

/// `agen query`'s activity follows the run's events: a model request names what the run waits
/// for (no `activity` event of its own), a model answer is "thinking", a tool's start is
/// "calling TOOL"; the first event of an attempt (the full path) and the later ones (the hot
/// path) read it alike.
#[tokio::test]
async fn a_tasks_activity_is_what_its_runs_latest_event_says() {
    let dir = tempfile::tempdir().unwrap();
    let (_hub, mut api, mut nest, place) = fleet_with_one_instance(dir.path(), 0).await;
    let task = submit(&mut api, "what time is it?", "", "").await;
    let run = nest.next_assign().await;
    let steps = [
        (
            "model.requested",
            serde_json::json!({"turn": 1, "activity": "waiting for the model (fake m1)"}),
            "waiting for the model (fake m1)",
        ),
        ("model.answered", serde_json::json!({"turn": 1}), "thinking"),
        (
            "tool.started",
            serde_json::json!({"tool": "time.now", "call_id": "c1"}),
            "calling time.now",
        ),
        (
            "tool.completed",
            serde_json::json!({"tool": "time.now", "call_id": "c1"}),
            "calling time.now",
        ),
        (
            "model.requested",
            serde_json::json!({"turn": 2, "activity": "reading the result of time.now"}),
            "reading the result of time.now",
        ),
        (
            "model.requested",
            serde_json::json!({"turn": 3}),
            "waiting for the model",
        ),
    ];
    for (i, (kind, body, activity)) in steps.into_iter().enumerate() {
        let seq = i as u64 + 1;
        let ack = send_events(
            &mut nest,
            &place.instance_id,
            vec![event(&run, seq, kind, body)],
        )
        .await;
        assert_eq!((ack.acked_seq, ack.fenced), (seq, false));
        assert_eq!(
            get(&mut api, &task.task_id).await.activity,
            activity,
            "after {kind} {seq}"
        );
    }
}

#[tokio::test]
async fn a_conversation_runs_in_order_and_carries_its_history() {
    let dir = tempfile::tempdir().unwrap();
    let (hub, mut api, mut nest, place) = fleet_with_one_instance(dir.path(), 4).await;
    let first = submit(&mut api, "my name is Ada", "chat-1", "").await;
    let second = submit(&mut api, "what is my name?", "chat-1", "").await;
    assert_eq!(first.conversation_id, second.conversation_id);

    let run1 = nest.next_assign().await;
    assert_eq!(run1.task_id, first.task_id);
    // The second task waits for the first although the instance has free slots.
    assert_eq!(
        task_state(&get(&mut api, &second.task_id).await),
        pb::TaskState::Queued
    );
    send_events(
        &mut nest,
        &place.instance_id,
        vec![event(&run1, 1, "run.finished", serde_json::json!({"state": "succeeded", "result": "Hi Ada",
            "messages": [{"role": "user", "content": "my name is Ada"}, {"role": "assistant", "content": "Hi Ada"}]}))],
    )
    .await;
    let run2 = nest.next_assign().await;
    assert_eq!(run2.task_id, second.task_id);
    // The history is fetched over FetchRunContext, never carried in the stream.
    assert_eq!(
        (run2.context_by_fetch, run2.history_json.as_str()),
        (true, "")
    );
    let fetched = fetch_context(&hub, &nest.nest_id, &run2, &place.instance_id)
        .await
        .expect("the lease holder fetches the history");
    let history: serde_json::Value = serde_json::from_str(&fetched.history).unwrap();
    assert_eq!(history[1]["content"], "Hi Ada");
    assert_eq!(fetched.replay, "", "a first attempt has nothing to replay");
}

#[tokio::test]
async fn cancel_stops_queued_tasks_at_once_and_running_ones_through_the_nest() {
    let dir = tempfile::tempdir().unwrap();
    let (_hub, mut api, mut nest, place) = fleet_with_one_instance(dir.path(), 0).await;
    let running = submit(&mut api, "long job", "", "").await;
    let queued = submit(&mut api, "another", "", "").await;
    let run = nest.next_assign().await;
    assert_eq!(run.task_id, running.task_id);

    let cancelled = api
        .cancel_task(pb::CancelTaskRequest {
            namespace: "default".into(),
            task_id: queued.task_id.clone(),
            reason: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(task_state(&cancelled), pb::TaskState::Cancelled);

    api.cancel_task(pb::CancelTaskRequest {
        namespace: "default".into(),
        task_id: running.task_id.clone(),
        reason: "changed my mind".into(),
    })
    .await
    .unwrap();
    let cancel = nest
        .next_matching(|m| match m {
            Hub::CancelRun(c) => Some(c),
            _ => None,
        })
        .await;
    assert_eq!(
        (
            cancel.run_id.as_str(),
            cancel.instance_id.as_str(),
            cancel.reason.as_str()
        ),
        (
            run.run_id.as_str(),
            place.instance_id.as_str(),
            "changed my mind"
        )
    );
    send_events(
        &mut nest,
        &place.instance_id,
        vec![event(
            &run,
            1,
            "run.finished",
            serde_json::json!({"state": "cancelled", "result": ""}),
        )],
    )
    .await;
    let t = get(&mut api, &running.task_id).await;
    assert_eq!(task_state(&t), pb::TaskState::Cancelled);
    assert_eq!(t.outcome.unwrap().error, "changed my mind");
}

#[tokio::test]
async fn a_run_whose_nest_is_lost_is_redispatched_with_the_next_attempt_and_old_events_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&dir.path().join("hub"), Duration::from_secs(2)).await;
    let mut api = hub.client().await;
    let bundle = dir.path().join("hello");
    write_bundle(&bundle, "hi");
    let (mut a, _) = FakeNest::connect(&hub, "nest-a", &[], vec![]).await;
    deploy(&mut api, &bundle, "hello", 1).await;
    let pa = a.accept_placement().await;
    let task = submit(&mut api, "job", "", "").await;
    let run1 = a.next_assign().await;
    send_events(
        &mut a,
        &pa.instance_id,
        vec![event(&run1, 1, "model.requested", serde_json::json!({}))],
    )
    .await;

    let (mut b, _) = FakeNest::connect(&hub, "nest-b", &[], vec![]).await;
    a.go_silent();
    b.accept_placement().await;
    let run2 = b.next_assign().await;
    assert_eq!(
        (run2.task_id.as_str(), run2.run_id.as_str(), run2.attempt),
        (task.task_id.as_str(), run1.run_id.as_str(), 2)
    );
    assert_eq!(
        (run2.context_by_fetch, run2.replay_json.as_str()),
        (true, "")
    );
    let pb_instance = run2.instance_id.clone();
    let fetched = fetch_context(&hub, "nest-b", &run2, &pb_instance)
        .await
        .expect("the new lease holder fetches the replay");
    let replay: serde_json::Value = serde_json::from_str(&fetched.replay).unwrap();
    assert_eq!(replay[0]["kind"], "model.requested");
    assert_eq!(
        (replay[0]["attempt"].as_u64(), replay[0]["seq"].as_u64()),
        (Some(1), Some(1))
    );
    // The Nest that lost the run holds a valid certificate but no lease any more.
    let refused = fetch_context(&hub, "nest-a", &run2, &pb_instance)
        .await
        .expect_err("the old holder is refused");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("not to instance")
            && refused.message().contains("on nest nest-a"),
        "{}",
        refused.message()
    );

    // The old attempt is fenced.
    let ack = send_events(
        &mut b,
        &pa.instance_id,
        vec![event(&run1, 2, "model.answered", serde_json::json!({}))],
    )
    .await;
    assert!(ack.fenced);
}

#[tokio::test]
async fn a_run_whose_instance_process_died_is_redispatched_until_five_attempts_then_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (_hub, mut api, mut nest, place) = fleet_with_one_instance(dir.path(), 0).await;
    let task = submit(&mut api, "job", "", "").await;
    let first = nest.next_assign().await;
    assert_eq!(
        (first.attempt, first.instance_id.as_str()),
        (1, place.instance_id.as_str())
    );
    let mut runs = Vec::new();
    for attempt in 1..=5u32 {
        let run = pb::AssignRun {
            attempt,
            ..first.clone()
        };
        // The instance asks the model, then its process dies: the Nest says so.
        let ack = send_events(
            &mut nest,
            &place.instance_id,
            vec![
                event(&run, 1, "model.requested", serde_json::json!({"turn": 1})),
                event(
                    &run,
                    2,
                    "run.interrupted",
                    serde_json::json!({"reason": "the instance process was killed by SIGKILL during the run"}),
                ),
            ],
        )
        .await;
        assert!(!ack.fenced);
        runs.push(run);
        if attempt < 5 {
            // The same run is dispatched again with the next attempt (the assignment may
            // come before the ack, which `send_events` skips: look at the task).
            eventually("the next attempt", Duration::from_secs(10), || {
                let mut api = api.clone();
                let id = task.task_id.clone();
                let (run_id, instance_id) = (first.run_id.clone(), place.instance_id.clone());
                async move {
                    let t = get(&mut api, &id).await;
                    (t.attempt == attempt + 1
                        && task_state(&t) == pb::TaskState::Running
                        && t.run_id == run_id
                        && t.instance_id == instance_id)
                        .then_some(())
                }
            })
            .await;
        }
    }
    // A late event of attempt 1 is fenced.
    let ack = send_events(
        &mut nest,
        &place.instance_id,
        vec![event(&runs[0], 3, "model.answered", serde_json::json!({}))],
    )
    .await;
    assert!(ack.fenced);
    // The fifth failure is the last (`limits.maxAttempts` 5): the task fails and says why.
    let t = get(&mut api, &task.task_id).await;
    assert_eq!(task_state(&t), pb::TaskState::Failed);
    assert_eq!(t.attempt, 5);
    let error = t.outcome.unwrap().error;
    assert!(
        error.starts_with("the run's instance failed 5 times (last: the instance process was killed by SIGKILL during the run); giving up after 5 failed attempts"),
        "{error}"
    );
}

#[tokio::test]
async fn a_rollover_drains_a_running_run_and_a_resumed_run_stays_on_its_bundle_version_even_when_its_instances_are_gone(
) {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&dir.path().join("hub"), Duration::from_secs(2)).await;
    let mut api = hub.client().await;
    let bundle = dir.path().join("hello");
    write_bundle(&bundle, "version one");
    let (mut a, _) = FakeNest::connect(&hub, "nest-a", &[], vec![]).await;
    deploy(&mut api, &bundle, "hello", 1).await;
    let old = a.accept_placement().await;
    let task = submit(&mut api, "job", "", "").await;
    let run1 = a.next_assign().await;
    assert_eq!(run1.bundle_digest, old.bundle_digest);

    // Version two rolls out while the run is in flight: the old instance is not stopped.
    write_bundle(&bundle, "version two");
    deploy(&mut api, &bundle, "hello", 1).await;
    let new = a
        .next_matching(|m| match m {
            Hub::Place(p) => Some(p),
            Hub::Stop(s) => panic!("the instance running a run was stopped: {s:?}"),
            _ => None,
        })
        .await;
    assert_ne!(new.bundle_digest, old.bundle_digest);
    a.report_running(&new).await;

    // The instance process dies: the run resumes on the old version, not the new instance.
    send_events(
        &mut a,
        &old.instance_id,
        vec![
            event(&run1, 1, "model.requested", serde_json::json!({"turn": 1})),
            event(
                &run1,
                2,
                "run.interrupted",
                serde_json::json!({"reason": "killed"}),
            ),
        ],
    )
    .await;
    // (The assignment may come before the ack, which `send_events` skips: look at the task.)
    let resumed = eventually("the run to resume", Duration::from_secs(10), || {
        let mut api = api.clone();
        let id = task.task_id.clone();
        async move {
            let t = get(&mut api, &id).await;
            (t.attempt == 2 && task_state(&t) == pb::TaskState::Running).then_some(t)
        }
    })
    .await;
    assert_eq!(
        (resumed.instance_id.as_str(), resumed.bundle_digest.as_str()),
        (old.instance_id.as_str(), old.bundle_digest.as_str()),
        "the resumed run is on the old version's instance, not the new one"
    );

    // The Nest dies: no instance of version one is left, so the Hub places one (not a
    // replica) on the next Nest to resume the run on its own version.
    a.go_silent();
    let (mut b, _) = FakeNest::connect(&hub, "nest-b", &[], vec![]).await;
    let mut old_again = None;
    for _ in 0..2 {
        let p = b.accept_placement().await;
        if p.bundle_digest == old.bundle_digest {
            old_again = Some(p);
        }
    }
    let old_again = old_again.expect("an instance of version one was placed for the resume");
    let resumed = eventually("the run to resume on b", Duration::from_secs(15), || {
        let mut api = api.clone();
        let id = task.task_id.clone();
        async move {
            let t = get(&mut api, &id).await;
            (t.attempt == 3 && task_state(&t) == pb::TaskState::Running).then_some(t)
        }
    })
    .await;
    assert_eq!(
        (resumed.instance_id.as_str(), resumed.bundle_digest.as_str()),
        (old_again.instance_id.as_str(), old.bundle_digest.as_str()),
        "the run resumed on its own version, never on the new one ({})",
        new.bundle_digest
    );

    // Once the run is over, the instance placed for it stops.
    let run3 = b
        .next_matching(|m| match m {
            Hub::AssignRun(r) if r.attempt == 3 => Some(r),
            _ => None,
        })
        .await;
    send_events(
        &mut b,
        &old_again.instance_id,
        vec![event(
            &run3,
            1,
            "run.finished",
            serde_json::json!({"state": "succeeded", "result": "done", "response_type": "text"}),
        )],
    )
    .await;
    let stop = b
        .next_matching(|m| match m {
            Hub::Stop(s) if s.instance_id == old_again.instance_id => Some(s),
            _ => None,
        })
        .await;
    assert_eq!(stop.instance_id, old_again.instance_id);
}

#[tokio::test]
async fn scaling_restarts_nothing_and_a_new_bundle_rolls_instances_over() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&dir.path().join("hub"), TTL).await;
    let mut api = hub.client().await;
    let bundle = dir.path().join("hello");
    write_bundle(&bundle, "hi");
    let (mut a, _) = FakeNest::connect(&hub, "nest-a", &[], vec![]).await;
    deploy(&mut api, &bundle, "hello", 1).await;
    let first = a.accept_placement().await;

    // Scale up: one more instance, the first one untouched.
    assert_eq!(deploy(&mut api, &bundle, "hello", 2).await.generation, 2);
    let second = a.next().await;
    let Hub::Place(second) = second else {
        panic!("expected a placement, got {second:?}")
    };
    a.report_running(&second).await;
    eventually("two ready replicas", Duration::from_secs(5), || {
        let mut api = api.clone();
        async move {
            let d = api
                .get_deployment(pb::GetDeploymentRequest {
                    namespace: "default".into(),
                    name: "hello".into(),
                })
                .await
                .ok()?;
            (d.into_inner().deployment?.ready_replicas == 2).then_some(())
        }
    })
    .await;

    // A new bundle: new instances first, old ones stopped once the new ones run.
    write_bundle(&bundle, "hello again");
    let d = deploy(&mut api, &bundle, "hello", 2).await;
    assert_eq!(d.generation, 3);
    let mut stopped = Vec::new();
    let mut placed = Vec::new();
    while stopped.len() < 2 {
        match a.next().await {
            Hub::Place(p) => {
                assert_eq!(
                    (p.generation, p.bundle_digest.as_str()),
                    (3, d.bundle_digest.as_str())
                );
                a.report_running(&p).await;
                placed.push(p.instance_id);
            }
            Hub::Stop(s) => {
                assert!(!placed.contains(&s.instance_id));
                assert!(
                    placed.len() > stopped.len(),
                    "an old instance stops only once a new one runs"
                );
                a.running
                    .lock()
                    .unwrap()
                    .retain(|r| r.instance_id != s.instance_id);
                stopped.push(s.instance_id);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    stopped.sort();
    let mut old = vec![first.instance_id, second.instance_id];
    old.sort();
    assert_eq!(stopped, old);
    let list = eventually(
        "only the new generation is left",
        Duration::from_secs(5),
        || {
            let mut api = api.clone();
            async move {
                let list = instances(&mut api, "hello").await;
                (list.len() == 2
                    && list
                        .iter()
                        .all(|i| i.generation == 3 && state(i) == pb::InstanceState::Running))
                .then_some(list)
            }
        },
    )
    .await;
    assert_eq!(list.len(), 2);
}

/// Every seq and kind a task's stored history has, read through `WatchTask` from the start.
async fn history(api: &mut Api, task_id: &str) -> Vec<(u64, String)> {
    let mut watch = api
        .watch_task(pb::WatchTaskRequest {
            namespace: "default".into(),
            task_id: task_id.into(),
            from_seq: 0,
            deltas: false,
        })
        .await
        .expect("watch task")
        .into_inner();
    let mut out = Vec::new();
    while let Ok(Ok(Some(e))) =
        tokio::time::timeout(Duration::from_millis(500), watch.message()).await
    {
        out.push((e.seq, e.kind));
    }
    out
}

/// Hot run events (model, tool, progress of a started run) are written once, with their task
/// event, and the task record is not rewritten for each: a Hub restart derives what the task is
/// doing from its newest event, and the events written after it never overwrite one before.
#[tokio::test]
async fn a_hub_restart_derives_a_running_task_from_its_hot_events_and_loses_none() {
    let dir = tempfile::tempdir().unwrap();
    let (mut hub, mut api, mut nest, place) = fleet_with_one_instance(dir.path(), 0).await;
    let task = submit(&mut api, "look it up", "", "").await;
    let run = nest.next_assign().await;
    let ack = send_events(
        &mut nest,
        &place.instance_id,
        vec![
            event(&run, 1, "model.requested", serde_json::json!({})),
            event(&run, 2, "model.answered", serde_json::json!({})),
            event(
                &run,
                3,
                "tool.started",
                serde_json::json!({"tool": "time.now", "call_id": "c1"}),
            ),
            event(
                &run,
                4,
                "task.progress",
                serde_json::json!({"step": "halfway", "done": 1, "total": 2}),
            ),
        ],
    )
    .await;
    assert_eq!(ack.acked_seq, 4);
    let before = history(&mut api, &task.task_id).await;
    drop(nest);
    hub.stop().await;

    let hub2 = TestHub::start_with(options(&dir.path().join("hub"), TTL)).await;
    let mut api = hub2.client().await;
    let t = get(&mut api, &task.task_id).await;
    assert_eq!(task_state(&t), pb::TaskState::Running);
    assert_eq!(
        t.progress
            .as_ref()
            .map(|p| (p.step.as_str(), p.done, p.total)),
        Some(("halfway", Some(1), Some(2)))
    );
    assert_eq!(history(&mut api, &task.task_id).await, before);

    // A new event after the restart takes the next seq: nothing stored is overwritten.
    api.cancel_task(pb::CancelTaskRequest {
        namespace: "default".into(),
        task_id: task.task_id.clone(),
        reason: "enough".into(),
    })
    .await
    .unwrap();
    // Its Nest is gone: the cancel grace runs out and the task ends cancelled with a new event.
    let n = before.len();
    let after = eventually("the cancel's event", Duration::from_secs(15), || {
        let mut api = api.clone();
        let id = task.task_id.clone();
        async move {
            let h = history(&mut api, &id).await;
            (h.len() > n).then_some(h)
        }
    })
    .await;
    assert_eq!(&after[..n], &before[..], "earlier events unchanged");
    let seqs: Vec<u64> = after.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        seqs,
        (1..=after.len() as u64).collect::<Vec<_>>(),
        "{after:?}"
    );
    let kinds: Vec<&str> = before.iter().map(|(_, k)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "task.state",
            "task.state",
            "model.requested",
            "model.answered",
            "tool.started",
            "task.progress"
        ]
    );
}

/// The store keeps a prefix of its writes, and a hot run event's task event is written just
/// before it: a Hub killed between the two leaves the task event alone. The run event was never
/// acked, so the Nest resends it after the restart: it is stored then, and the task records it
/// once (the task event that survived), never twice.
#[tokio::test]
async fn a_run_event_whose_task_event_alone_survived_a_crash_is_recorded_once_when_resent() {
    use agen_hub::model::{RunEventRef, TaskEventRec};
    use agen_hub::store::{task_event_key, Db, SledStore, Table};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let (mut hub, mut api, mut nest, place) = fleet_with_one_instance(dir.path(), 0).await;
    let task = submit(&mut api, "look it up", "", "").await;
    let run = nest.next_assign().await;
    let ack = send_events(
        &mut nest,
        &place.instance_id,
        vec![
            event(&run, 1, "model.requested", serde_json::json!({})),
            event(&run, 2, "model.answered", serde_json::json!({})),
        ],
    )
    .await;
    assert_eq!(ack.acked_seq, 2);
    let reports = nest.running.lock().unwrap().clone();
    drop(nest);
    hub.stop().await;

    // What the crash left: the task event of run event 3, written as the Hub writes it, and
    // not run event 3 itself.
    let started = serde_json::json!({"tool": "time.now", "call_id": "c1"}).to_string();
    let orphan_seq = {
        let db = Db::new(Arc::new(
            SledStore::open(&dir.path().join("hub").join("db")).unwrap(),
        ));
        let last = db
            .last_task_event(&task.task_id)
            .unwrap()
            .expect("the task's events");
        let mut snapshot = last.snapshot.clone().expect("a snapshot");
        snapshot.activity = "calling time.now".into();
        let orphan = TaskEventRec {
            seq: last.seq + 1,
            at_ms: last.at_ms + 1,
            kind: "tool.started".into(),
            json: started.clone(),
            snapshot: Some(snapshot),
            source: Some(RunEventRef {
                run_id: run.run_id.clone(),
                attempt: run.attempt,
                seq: 3,
            }),
        };
        db.raw()
            .put(
                Table::TaskEvents,
                &task_event_key(&task.task_id, orphan.seq),
                &serde_json::to_vec(&orphan).unwrap(),
            )
            .unwrap();
        assert!(!db.has_run_event(&run.run_id, run.attempt, 3).unwrap());
        db.flush().await.unwrap();
        db.close();
        orphan.seq
    };

    let mut hub2 = TestHub::start_with(options(&dir.path().join("hub"), TTL)).await;
    let mut api = hub2.client().await;
    let (mut nest, _) = FakeNest::connect(&hub2, "nest-a", &[], reports).await;
    let mut resent = event(&run, 3, "tool.started", serde_json::json!({}));
    resent.json = started;
    let ack = send_events(
        &mut nest,
        &place.instance_id,
        vec![
            resent,
            event(
                &run,
                4,
                "tool.completed",
                serde_json::json!({"call_id": "c1"}),
            ),
        ],
    )
    .await;
    assert_eq!(ack.acked_seq, 4, "the resent event and the next are stored");

    let h = history(&mut api, &task.task_id).await;
    let kinds: Vec<&str> = h.iter().map(|(_, k)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "task.state",
            "task.state",
            "model.requested",
            "model.answered",
            "tool.started",
            "tool.completed"
        ],
        "{h:?}"
    );
    let seqs: Vec<u64> = h.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (1..=h.len() as u64).collect::<Vec<_>>());
    assert_eq!(
        h[4].0, orphan_seq,
        "the surviving task event is the one kept"
    );
    assert_eq!(
        get(&mut api, &task.task_id).await.activity,
        "calling time.now"
    );
    hub2.stop().await;
}

/// The Hub knows which run events of an attempt are stored without asking the store while
/// they come in order; an owner that sends one past a gap, then the missing ones, then resends
/// them all (before and after a Hub restart, when the Hub knows nothing and asks the store)
/// has each stored and recorded exactly once.
#[tokio::test]
async fn run_events_past_a_gap_and_resent_are_each_recorded_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut hub, mut api, mut nest, place) = fleet_with_one_instance(dir.path(), 0).await;
    let task = submit(&mut api, "look it up", "", "").await;
    let run = nest.next_assign().await;
    let kinds = [
        "model.requested",
        "model.answered",
        "tool.started",
        "task.progress",
        "tool.completed",
        "activity",
    ];
    let ev = |seq: u64| {
        let body = match kinds[seq as usize - 1] {
            "tool.started" | "tool.completed" => {
                serde_json::json!({"tool": "time.now", "call_id": "c1"})
            }
            "task.progress" => serde_json::json!({"step": "halfway"}),
            "activity" => serde_json::json!({"activity": "wrapping up"}),
            _ => serde_json::json!({}),
        };
        event(&run, seq, kinds[seq as usize - 1], body)
    };
    let batches: [&[u64]; 4] = [&[1, 2, 3], &[6], &[4, 5], &[2, 3, 4, 5, 6]];
    for batch in batches {
        let ack = send_events(
            &mut nest,
            &place.instance_id,
            batch.iter().map(|s| ev(*s)).collect(),
        )
        .await;
        assert!(!ack.fenced, "{batch:?} was fenced");
    }
    let stored_order = [
        "task.state",
        "task.state",
        "model.requested",
        "model.answered",
        "tool.started",
        "activity",
        "task.progress",
        "tool.completed",
    ];
    let recorded = |h: Vec<(u64, String)>| h.into_iter().map(|(_, k)| k).collect::<Vec<_>>();
    assert_eq!(
        recorded(history(&mut api, &task.task_id).await),
        stored_order,
        "each event once, in the order it was stored"
    );

    let reports = nest.running.lock().unwrap().clone();
    drop(nest);
    hub.stop().await;
    let mut hub2 = TestHub::start_with(options(&dir.path().join("hub"), TTL)).await;
    let mut api = hub2.client().await;
    let (mut nest, _) = FakeNest::connect(&hub2, "nest-a", &[], reports).await;
    let ack = send_events(&mut nest, &place.instance_id, (1..=6).map(ev).collect()).await;
    assert_eq!((ack.acked_seq, ack.fenced), (6, false));
    assert_eq!(
        recorded(history(&mut api, &task.task_id).await),
        stored_order,
        "a resend after the restart stores nothing again"
    );
    hub2.stop().await;
}
