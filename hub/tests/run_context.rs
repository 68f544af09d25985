//! A run's context (history and replay) goes over `FetchRunContext`, never inside the Nest
//! stream (issue 14 item 3), tried over the real wire protocol (TLS, certificates from
//! `Join`): a conversation whose history is over 2 MiB arrives in chunks of at most 1 MiB while
//! its `AssignRun` stays small, and a rogue Nest with its own valid certificate, the right Nest
//! naming another instance, and the right Nest asking for another attempt are all refused.

mod support;

use std::time::Duration;

use agen_proto::v1 as pb;
use pb::hub_message::Msg as Hub;
use pretty_assertions::assert_eq;
use prost::Message;
use support::*;

/// A Hub, Nest `nest-victim` running one instance of `hello`, and the instance.
async fn one_instance(dir: &std::path::Path) -> (TestHub, Api, FakeNest, pb::PlaceInstance) {
    let hub = TestHub::start(&dir.join("hub"), Duration::from_secs(10)).await;
    let mut api = hub.client().await;
    let bundle = dir.join("hello");
    write_bundle(&bundle, "hi");
    let (mut nest, _) = FakeNest::connect(&hub, "nest-victim", &[], vec![]).await;
    deploy(&mut api, &bundle, "hello", 1).await;
    let place = nest.accept_placement().await;
    (hub, api, nest, place)
}

async fn submit_in(api: &mut Api, input: &str, key: &str) -> pb::Task {
    api.submit_task(pb::SubmitTaskRequest {
        namespace: "default".into(),
        deployment: "hello".into(),
        input: input.into(),
        conversation_key: key.into(),
        ..Default::default()
    })
    .await
    .expect("submit")
    .into_inner()
}

/// Finishes `run` (its first event) with `messages` for the conversation.
async fn finish(
    nest: &mut FakeNest,
    instance_id: &str,
    run: &pb::AssignRun,
    messages: serde_json::Value,
) {
    let ack = send_events(
        nest,
        instance_id,
        vec![event(
            run,
            1,
            "run.finished",
            serde_json::json!({"state": "succeeded", "result": "ok", "messages": messages}),
        )],
    )
    .await;
    assert!(!ack.fenced, "{ack:?}");
}

#[tokio::test]
async fn a_history_over_two_mib_arrives_in_chunks_while_the_assignment_stays_small() {
    let dir = tempfile::tempdir().unwrap();
    let (hub, mut api, mut nest, place) = one_instance(dir.path()).await;
    let long = "x".repeat(2_600_000);
    submit_in(&mut api, "tell me a long story", "story").await;
    let second = submit_in(&mut api, "and then?", "story").await;
    let run1 = nest.next_assign().await;
    finish(
        &mut nest,
        &place.instance_id,
        &run1,
        serde_json::json!([{"role": "user", "content": "tell me a long story"},
            {"role": "assistant", "content": long}]),
    )
    .await;
    let run2 = nest.next_assign().await;
    assert_eq!(run2.task_id, second.task_id);
    let on_the_stream = pb::HubMessage {
        msg: Some(Hub::AssignRun(run2.clone())),
    }
    .encoded_len();
    assert!(on_the_stream < 4096, "AssignRun is {on_the_stream} bytes");
    assert!(run2.context_by_fetch);

    let fetched = fetch_context(&hub, "nest-victim", &run2, &place.instance_id)
        .await
        .expect("the lease holder fetches its history");
    assert!(fetched.history.len() > 2 << 20, "{}", fetched.history.len());
    assert!(fetched.chunk_bytes.len() >= 3, "{:?}", fetched.chunk_bytes);
    assert!(
        fetched.chunk_bytes.iter().all(|b| *b <= 1 << 20),
        "{:?}",
        fetched.chunk_bytes
    );
    let history: Vec<serde_json::Value> = serde_json::from_str(&fetched.history).unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(
        history[1]["content"].as_str().map(str::len),
        Some(long.len())
    );
}

#[tokio::test]
async fn only_the_nest_holding_the_lease_may_fetch_a_runs_history() {
    let dir = tempfile::tempdir().unwrap();
    let (hub, mut api, mut nest, place) = one_instance(dir.path()).await;
    submit_in(&mut api, "my card is 4111", "secret-chat").await;
    submit_in(&mut api, "what is my card?", "secret-chat").await;
    let run1 = nest.next_assign().await;
    finish(
        &mut nest,
        &place.instance_id,
        &run1,
        serde_json::json!([{"role": "user", "content": "my card is 4111"},
            {"role": "assistant", "content": "noted"}]),
    )
    .await;
    let run2 = nest.next_assign().await;

    // The attacker: a Nest of its own, with a valid certificate from Join.
    let (_rogue, _) = FakeNest::connect(&hub, "nest-rogue", &[], vec![]).await;
    let mut refusals = Vec::new();
    // 1. The victim's run, attempt and instance, from the wrong Nest.
    refusals.push(fetch_context(&hub, "nest-rogue", &run2, &place.instance_id).await);
    // 2. The right Nest naming an instance the run was not assigned to.
    refusals.push(fetch_context(&hub, "nest-victim", &run2, "some-other-instance").await);
    // 3. The right Nest, an attempt the Hub never issued.
    let high = pb::AssignRun {
        attempt: 7,
        ..run2.clone()
    };
    refusals.push(fetch_context(&hub, "nest-victim", &high, &place.instance_id).await);
    // 4. The finished first run of the conversation (its task holds no lease any more).
    refusals.push(fetch_context(&hub, "nest-victim", &run1, &place.instance_id).await);
    // 5. A task that does not exist.
    let ghost = pb::AssignRun {
        task_id: "task-ghost".into(),
        ..run2.clone()
    };
    refusals.push(fetch_context(&hub, "nest-rogue", &ghost, &place.instance_id).await);

    let messages: Vec<String> = refusals
        .into_iter()
        .map(|r| {
            let s = r.expect_err("refused");
            assert_eq!(s.code(), tonic::Code::PermissionDenied, "{s:?}");
            assert!(!s.message().contains("4111"), "{}", s.message());
            s.message().to_string()
        })
        .collect();
    assert!(
        messages[0].contains("not to instance") && messages[0].contains("nest nest-rogue"),
        "{}",
        messages[0]
    );
    assert!(
        messages[1].contains("not to instance some-other-instance"),
        "{}",
        messages[1]
    );
    assert!(messages[2].contains("attempt 7 of run"), "{}", messages[2]);
    assert!(
        messages[3].contains("holds no lease now") || messages[3].contains("is not the run"),
        "{}",
        messages[3]
    );
    assert!(
        messages[4].contains("task task-ghost is unknown"),
        "{}",
        messages[4]
    );
    assert!(messages
        .iter()
        .all(|m| m.contains("only the nest holding a run's lease")));

    // The lease holder still gets it.
    let fetched = fetch_context(&hub, "nest-victim", &run2, &place.instance_id)
        .await
        .expect("the lease holder fetches its history");
    assert!(fetched.history.contains("my card is 4111"));
}

#[tokio::test]
async fn a_run_whose_context_could_not_be_fetched_is_handed_out_again_without_counting_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let (_hub, mut api, mut nest, place) = one_instance(dir.path()).await;
    let task = submit_in(&mut api, "hello", "chat").await;
    let run1 = nest.next_assign().await;
    assert!(
        run1.context_by_fetch,
        "a conversation key: the Nest fetches"
    );
    // What the Nest sends when every fetch failed (nest/src/run_context.rs).
    let ack = send_events(
        &mut nest,
        &place.instance_id,
        vec![event(
            &run1,
            1,
            "run.interrupted",
            serde_json::json!({"reason": "fetching the context of run r attempt 1 failed 4 times (last: Unavailable)",
                "cause": "context_unavailable"}),
        )],
    )
    .await;
    assert!(!ack.fenced, "{ack:?}");
    // Not the instance's failure: the same (still healthy) instance gets the next attempt.
    let run2 = nest.next_assign().await;
    assert_eq!(
        (
            run2.task_id.as_str(),
            run2.run_id.as_str(),
            run2.attempt,
            run2.instance_id.as_str(),
            run2.context_by_fetch
        ),
        (
            task.task_id.as_str(),
            run1.run_id.as_str(),
            2,
            place.instance_id.as_str(),
            true
        )
    );
}
