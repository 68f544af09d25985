//! Criterion benchmarks of the Hub's run-event store (`agen_hub::store::Db` over sled): the
//! durable path of every run event — append-if-absent (with the attempt fence check) followed
//! by one flush for the batch (group commit) — for batches of 1, 16 and 128 events, reported
//! in events/s; plus the append alone and a resent (duplicate) batch, to show what the flush
//! costs and that a resend after a reconnect is cheap. The hot path (each run event written right
//! after its task event, `Db::append_hot_run_events`) is measured both ways: one call per event
//! against one for the whole batch, each followed by the batch's flush.
//!
//! Invariants: runs only under `cargo bench`; the store lives in a temporary folder removed at
//! the end; every timed append uses fresh keys (a new run id per iteration) unless the case is
//! the duplicate one, which checks that nothing was appended.

use std::sync::Arc;
use std::time::Duration;

use agen_hub::model::{RunEventRec, TaskEventRec};
use agen_hub::store::{Append, Db, SledStore};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// A realistic event body: a completed tool call with a short result.
const BODY: &str = r##"{"call_id":"call_0001","tool":"ws.read","result":{"text":"# Notes\n\nThe benchmark reads this file.\n","is_error":false},"duration_ms":3}"##;

fn batch(run: u64, n: usize) -> Vec<RunEventRec> {
    (0..n)
        .map(|seq| RunEventRec {
            run_id: format!("run-{run:012}"),
            attempt: 1,
            seq: seq as u64,
            task_id: format!("task-{run:012}"),
            at_ms: 1_764_000_000_000 + seq as i64,
            kind: "tool.completed".into(),
            json: BODY.into(),
        })
        .collect()
}

/// Records attempt 1 of `run` as its current attempt (the lease the fence checks).
fn leased(db: &Db, run: u64) {
    db.set_run_attempt(&format!("run-{run:012}"), 1)
        .expect("record the run's attempt");
}

fn append_all(db: &Db, events: &[RunEventRec], expect: Append) {
    for ev in events {
        let got = db.append_run_event(ev).expect("append a run event");
        assert_eq!(got, expect, "appending {}/{}", ev.run_id, ev.seq);
    }
}

/// Each event with the task event that records it (task event seqs from 1).
fn with_task_events(events: Vec<RunEventRec>) -> Vec<(RunEventRec, Option<TaskEventRec>)> {
    events
        .into_iter()
        .enumerate()
        .map(|(i, ev)| {
            let te = TaskEventRec {
                seq: i as u64 + 1,
                at_ms: ev.at_ms,
                kind: ev.kind.clone(),
                json: ev.json.clone(),
                snapshot: None,
                source: None,
            };
            (ev, Some(te))
        })
        .collect()
}

fn store_benches(c: &mut Criterion) {
    let tmp = tempfile::tempdir().expect("create a temporary folder for the benchmark store");
    let store = SledStore::open(&tmp.path().join("db")).expect("open the benchmark store");
    let db = Db::new(Arc::new(store));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build a tokio runtime");
    let mut run = 0u64;

    let mut group = c.benchmark_group("hub_run_events");
    for n in [1usize, 16, 128] {
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(BenchmarkId::new("append_flush", n), |b| {
            b.iter_batched(
                || {
                    run += 1;
                    leased(&db, run);
                    batch(run, n)
                },
                |events| {
                    append_all(&db, &events, Append::Appended);
                    rt.block_on(db.flush()).expect("flush the store");
                },
                criterion::BatchSize::SmallInput,
            )
        });
    }
    group.throughput(Throughput::Elements(128));
    group.bench_function(BenchmarkId::new("append_no_flush", 128), |b| {
        b.iter_batched(
            || {
                run += 1;
                leased(&db, run);
                batch(run, 128)
            },
            |events| append_all(&db, &events, Append::Appended),
            criterion::BatchSize::SmallInput,
        )
    });
    for n in [6usize, 16] {
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(BenchmarkId::new("hot_write_per_event_flush", n), |b| {
            b.iter_batched(
                || {
                    run += 1;
                    leased(&db, run);
                    with_task_events(batch(run, n))
                },
                |events| {
                    for one in events.chunks(1) {
                        db.append_hot_run_events(one).expect("append a hot event");
                    }
                    rt.block_on(db.flush()).expect("flush the store");
                },
                criterion::BatchSize::SmallInput,
            )
        });
        group.bench_function(BenchmarkId::new("hot_write_per_batch_flush", n), |b| {
            b.iter_batched(
                || {
                    run += 1;
                    leased(&db, run);
                    with_task_events(batch(run, n))
                },
                |events| {
                    db.append_hot_run_events(&events)
                        .expect("append a batch of hot events");
                    rt.block_on(db.flush()).expect("flush the store");
                },
                criterion::BatchSize::SmallInput,
            )
        });
    }
    run += 1;
    leased(&db, run);
    let stored = batch(run, 128);
    append_all(&db, &stored, Append::Appended);
    rt.block_on(db.flush()).expect("flush the store");
    group.bench_function(BenchmarkId::new("resend_duplicate", 128), |b| {
        b.iter(|| append_all(&db, &stored, Append::Duplicate))
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = store_benches
}
criterion_main!(benches);
