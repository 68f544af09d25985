//! Criterion benchmarks of the Hub's run-event store (`agen_hub::store::Db` over sled): the
//! durable path of every run event — append-if-absent (with the attempt fence check) followed
//! by one flush for the batch (group commit) — for batches of 1, 16 and 128 events, reported
//! in events/s; plus the append alone and a resent (duplicate) batch, to show what the flush
//! costs and that a resend after a reconnect is cheap.
//!
//! Invariants: runs only under `cargo bench`; the store lives in a temporary folder removed at
//! the end; every timed append uses fresh keys (a new run id per iteration) unless the case is
//! the duplicate one, which checks that nothing was appended.

use std::sync::Arc;
use std::time::Duration;

use agen_hub::model::RunEventRec;
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

fn append_all(db: &Db, events: &[RunEventRec], expect: Append) {
    for ev in events {
        let got = db.append_run_event(ev).expect("append a run event");
        assert_eq!(got, expect, "appending {}/{}", ev.run_id, ev.seq);
    }
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
                batch(run, 128)
            },
            |events| append_all(&db, &events, Append::Appended),
            criterion::BatchSize::SmallInput,
        )
    });
    run += 1;
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
