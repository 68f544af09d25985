//! Delegate calls are made only by the run that holds the lease, tried as an attacker over the
//! real wire protocol (TLS, certificates from `Join`): a second Nest with its own valid
//! certificate, the right Nest naming another instance or an old attempt, and the right run
//! naming a deployment its bundle does not list are all refused and start nothing; the right
//! run asking twice with one idempotency key gets one child.

mod support;

use std::time::Duration;

use agen_proto::v1 as pb;
use pb::hub_message::Msg as Hub;
use pretty_assertions::assert_eq;
use support::*;

async fn deploy(api: &mut Api, dir: &std::path::Path, name: &str, concurrency: u32) {
    let up = upload(api, dir).await.expect("upload");
    api.create_deployment(pb::CreateDeploymentRequest {
        namespace: "default".into(),
        name: name.into(),
        bundle_digest: up.digest,
        replicas: 1,
        selector: Default::default(),
        concurrency,
        ..Default::default()
    })
    .await
    .expect("create deployment");
}

/// The run the Hub assigns next for `task_id` on `nest`, named as the parent of delegate calls.
async fn assigned_parent(nest: &mut FakeNest, task_id: &str, instance_id: &str) -> pb::ChildParent {
    let run = nest
        .next_matching(|m| match m {
            Hub::AssignRun(r) if r.task_id == task_id => Some(r),
            _ => None,
        })
        .await;
    pb::ChildParent {
        task_id: task_id.into(),
        run_id: run.run_id,
        attempt: run.attempt,
        instance_id: instance_id.into(),
    }
}

async fn submit(api: &mut Api, deployment: &str, input: &str) -> pb::Task {
    api.submit_task(pb::SubmitTaskRequest {
        namespace: "default".into(),
        deployment: deployment.into(),
        input: input.into(),
        ..Default::default()
    })
    .await
    .expect("submit")
    .into_inner()
}

fn start(parent: &pb::ChildParent, deployment: &str, key: &str) -> pb::StartChildRequest {
    pb::StartChildRequest {
        parent: Some(parent.clone()),
        namespace: String::new(),
        deployment: deployment.into(),
        input: "help me".into(),
        conversation_key: String::new(),
        idempotency_key: key.into(),
        parent_span_id: String::new(),
    }
}

#[tokio::test]
async fn only_the_lease_holder_starts_children_and_only_to_listed_delegates_once_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&dir.path().join("hub"), Duration::from_secs(10)).await;
    let mut api = hub.client().await;
    let caller = dir.path().join("caller");
    write_bundle(&caller, "you delegate");
    std::fs::write(
        caller.join("x-agen/config.json"),
        r#"{"delegates": ["helper"]}"#,
    )
    .unwrap();
    let helper = dir.path().join("helper");
    write_bundle(&helper, "you help");
    let (mut victim, _) = FakeNest::connect(&hub, "nest-victim", &[], vec![]).await;
    deploy(&mut api, &caller, "caller", 1).await;
    let place = victim.accept_placement().await;
    let task = submit(&mut api, "caller", "delegate it").await;
    let parent = assigned_parent(&mut victim, &task.task_id, &place.instance_id).await;
    deploy(&mut api, &helper, "helper", 1).await;
    let key = format!("{}:0", parent.run_id);

    let mut refused = Vec::new();
    // 1. A Nest of its own, with a valid certificate, naming the victim's run exactly.
    let mut rogue = hub.nest_client_as("nest-rogue").await;
    refused.push(rogue.start_child(start(&parent, "helper", &key)).await);
    let mut owner = hub.nest_client_as("nest-victim").await;
    // 2. The right Nest, another instance.
    let other_instance = pb::ChildParent {
        instance_id: "inst-other".into(),
        ..parent.clone()
    };
    refused.push(
        owner
            .start_child(start(&other_instance, "helper", &key))
            .await,
    );
    // 3. The right Nest and instance, an attempt the Hub did not issue.
    let old_attempt = pb::ChildParent {
        attempt: parent.attempt + 1,
        ..parent.clone()
    };
    refused.push(owner.start_child(start(&old_attempt, "helper", &key)).await);
    // 4. The right run, a deployment its bundle does not list.
    refused.push(owner.start_child(start(&parent, "caller", &key)).await);
    let codes: Vec<tonic::Code> = refused
        .iter()
        .map(|r| {
            r.as_ref()
                .map(|_| tonic::Code::Ok)
                .unwrap_or_else(|s| s.code())
        })
        .collect();
    assert_eq!(codes, vec![tonic::Code::PermissionDenied; 4]);

    // The right run, twice with one key: one child.
    let first = owner
        .start_child(start(&parent, "helper", &key))
        .await
        .expect("the lease holder starts a child")
        .into_inner();
    let again = owner
        .start_child(start(&parent, "helper", &key))
        .await
        .expect("asked again")
        .into_inner();
    assert_eq!(first.task_id, again.task_id);
    let children = api
        .list_tasks(pb::ListTasksRequest {
            namespace: "default".into(),
            parent_task_id: task.task_id.clone(),
            ..Default::default()
        })
        .await
        .expect("list children")
        .into_inner()
        .tasks;
    assert_eq!(children.len(), 1, "{children:?}");
    assert_eq!(
        (
            children[0].task_id.as_str(),
            children[0].parent_task_id.as_str(),
            children[0].deployment.as_str()
        ),
        (first.task_id.as_str(), task.task_id.as_str(), "helper")
    );
    let all = api
        .list_tasks(pb::ListTasksRequest {
            namespace: "default".into(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .tasks;
    assert_eq!(all.len(), 2, "the caller and its one child, nothing else");
}

/// The Hub enforces `limits.maxDelegationDepth` itself: a harness that skips the check (here a
/// hand-driven Nest) still cannot grow the tree past it; the refused call starts nothing.
#[tokio::test]
async fn the_hub_refuses_a_child_deeper_than_max_delegation_depth_even_when_the_harness_asks() {
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&dir.path().join("hub"), Duration::from_secs(10)).await;
    let mut api = hub.client().await;
    let selfish = dir.path().join("selfish");
    write_bundle(&selfish, "you delegate to yourself");
    std::fs::write(
        selfish.join("x-agen/config.json"),
        r#"{"delegates": ["selfish"]}"#,
    )
    .unwrap();
    std::fs::write(
        selfish.join("x-agen/harness.json"),
        r#"{"limits": {"maxDelegationDepth": 1}}"#,
    )
    .unwrap();
    let (mut nest, _) = FakeNest::connect(&hub, "nest-a", &[], vec![]).await;
    // Two slots: the child runs on the same instance while the root waits for it.
    deploy(&mut api, &selfish, "selfish", 2).await;
    let place = nest.accept_placement().await;
    let root = submit(&mut api, "selfish", "go deep").await;
    let parent = assigned_parent(&mut nest, &root.task_id, &place.instance_id).await;
    let mut owner = hub.nest_client_as("nest-a").await;
    let child = owner
        .start_child(start(&parent, "selfish", &format!("{}:0", parent.run_id)))
        .await
        .expect("depth 1 is within the limit")
        .into_inner();
    let child_parent = assigned_parent(&mut nest, &child.task_id, &place.instance_id).await;
    let refused = owner
        .start_child(start(
            &child_parent,
            "selfish",
            &format!("{}:0", child_parent.run_id),
        ))
        .await
        .expect_err("depth 2 is over the limit");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused
            .message()
            .contains("over limits.maxDelegationDepth of 1"),
        "{}",
        refused.message()
    );
    let all = api
        .list_tasks(pb::ListTasksRequest {
            namespace: "default".into(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner()
        .tasks;
    assert_eq!(all.len(), 2, "the root and its one child, no grandchild");
}
