//! The Hub's group commit, driven by a fake Nest speaking the real protocol over TLS: a Nest
//! that sends waited-for run events back to back, without waiting for acks, gets every ack in
//! order, and far fewer store flushes than batches serve them (the stream's read loop stores a
//! batch and reads on while the flush is in flight). One test in this file: the fsync counter
//! is per process.

mod support;

use std::time::Duration;

use agen_proto::v1 as pb;
use agen_proto::v1::hub_message::Msg as Hub;
use support::*;

const BATCHES: u64 = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waited_for_events_sent_back_to_back_are_acked_in_order_and_share_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let (_hub, mut api, mut nest, place) = fleet_with_one_instance(dir.path(), 0).await;
    api.submit_task(pb::SubmitTaskRequest {
        namespace: "default".into(),
        deployment: "hello".into(),
        input: "write a lot".into(),
        ..Default::default()
    })
    .await
    .expect("submit");
    let run = nest.next_assign().await;

    let fsyncs_before = agen_hub::metrics::store_fsyncs();
    for seq in 1..=BATCHES {
        let mut e = event(
            &run,
            seq,
            "tool.started",
            serde_json::json!({"tool": "ws.write", "call_id": format!("c{seq}")}),
        );
        e.sync = true;
        nest.send(pb::nest_message::Msg::RunEvents(pb::RunEvents {
            instance_id: place.instance_id.clone(),
            events: vec![e],
        }))
        .await;
    }
    let mut last = 0;
    let mut acks = 0;
    while last < BATCHES {
        let ack = nest
            .next_matching(|m| match m {
                Hub::Ack(a) => Some(a),
                _ => None,
            })
            .await;
        assert!(!ack.fenced, "{ack:?}");
        assert!(
            ack.acked_seq > last,
            "acks are cumulative and in order: {} after {last}",
            ack.acked_seq
        );
        last = ack.acked_seq;
        acks += 1;
    }
    let fsyncs = agen_hub::metrics::store_fsyncs() - fsyncs_before;
    eprintln!("{BATCHES} batches: {acks} acks, {fsyncs} store flushes");
    assert!(
        fsyncs < BATCHES / 2,
        "{BATCHES} waited-for batches sent back to back took {fsyncs} flushes: the read loop waits for each flush"
    );
    // Every acked event is stored: the task's history has each of them once.
    let finished = event(
        &run,
        BATCHES + 1,
        "run.finished",
        serde_json::json!({"state": "succeeded", "result": "done", "response_type": "text", "messages": []}),
    );
    let ack = send_events(&mut nest, &place.instance_id, vec![finished]).await;
    assert_eq!(ack.acked_seq, BATCHES + 1);
    let mut watch = api
        .watch_task(pb::WatchTaskRequest {
            namespace: "default".into(),
            task_id: run.task_id.clone(),
            from_seq: 0,
            deltas: false,
        })
        .await
        .expect("watch")
        .into_inner();
    let mut started = 0;
    while let Some(e) = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("the watch ends after the terminal state")
        .expect("watch stream")
    {
        started += usize::from(e.kind == "tool.started");
    }
    assert_eq!(started as u64, BATCHES, "lost {}", BATCHES - started as u64);
}
