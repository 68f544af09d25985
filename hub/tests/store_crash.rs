//! A process killed (SIGKILL) in the middle of the Hub's hot run-event writes (plain ordered
//! writes, each task event just before its run event): after every crash the reopened store
//! holds a prefix of what was written — each run event with its task event, at most one task
//! event without its run event (the row being written at the kill, whose run event its Nest
//! resends), a run's events without a gap — and everything a returned flush covered.
//!
//! The writer is this test's own executable, run again with [`WRITER_DIR`] set: it appends
//! batches of hot events (of ~2 KiB each, so that a batch is one sizeable write to the event
//! log, `db/events.log`) of fresh runs through `Db::append_hot_run_events`, flushes after every
//! [`FLUSH_EVERY`] batches and prints `durable <run> <seq>` once the flush returned, until it is
//! killed. After each batch it saves the run's task record in sled with the count of its task
//! events (`next_event_seq`), as the Hub does, so the store's check at open compares them.
//! Beside it a second thread writes and removes scratch records (dead weight) and compacts the
//! event log whenever that is worth it, printing `compacted`: kills land in the middle of
//! rewrites too, and the same checks hold. No crash makes the store refuse to open (only a
//! torn tail past the last sync is ever left, and it is cut).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use agen_hub::model::{RunEventRec, TaskEventRec};
use agen_hub::store::{Db, SledStore, Table};

const WRITER_DIR: &str = "AGEN_TEST_HOT_WRITER_DIR";
const WRITER_FIRST_RUN: &str = "AGEN_TEST_HOT_WRITER_FIRST_RUN";
const TEST: &str = "a_process_killed_mid_write_leaves_every_hot_run_event_with_its_task_event";
/// Crashes per test run.
const CRASHES: u64 = 20;
/// Runs each writer starts at most (numbered from its first run on).
const RUNS_PER_WRITER: u64 = 1_000;
/// Events per batch, batches per run.
const BATCH: u64 = 6;
const BATCHES: u64 = 4;
/// Batches between two flushes.
const FLUSH_EVERY: u64 = 8;

fn run_id(run: u64) -> String {
    format!("run-{run:08}")
}

fn task_id(run: u64) -> String {
    format!("task-{run:08}")
}

/// The writer: fresh runs from `first`, batch after batch, a flush after each, until killed.
fn writer(dir: &Path, first: u64) {
    let db = Db::new(Arc::new(SledStore::open(dir).expect("open the store")));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    compact_meanwhile(db.clone());
    let mut out = std::io::stdout();
    let pad = "x".repeat(2048);
    let mut batches = 0u64;
    for run in first..first + RUNS_PER_WRITER {
        db.set_run_attempt(&run_id(run), 1).expect("attempt");
        for b in 0..BATCHES {
            let events: Vec<(RunEventRec, Option<TaskEventRec>)> = (1..=BATCH)
                .map(|i| {
                    let seq = b * BATCH + i;
                    let json = format!(r#"{{"call_id":"c{seq}","tool":"ws.read","pad":"{pad}"}}"#);
                    let ev = RunEventRec {
                        run_id: run_id(run),
                        attempt: 1,
                        seq,
                        task_id: task_id(run),
                        at_ms: seq as i64,
                        kind: "tool.started".into(),
                        json: json.clone(),
                    };
                    let te = TaskEventRec {
                        seq,
                        at_ms: seq as i64,
                        kind: "tool.started".into(),
                        json,
                        snapshot: None,
                        source: None,
                    };
                    (ev, Some(te))
                })
                .collect();
            db.append_hot_run_events(&events).expect("append");
            // The task record after its events, as the Hub writes it (sled buffers it).
            let record = serde_json::json!({
                "task_id": task_id(run),
                "run_id": run_id(run),
                "next_event_seq": (b + 1) * BATCH + 1,
                "state": "running",
            });
            db.put_json(Table::Tasks, &task_id(run), &record)
                .expect("task record");
            batches += 1;
            if batches.is_multiple_of(FLUSH_EVERY) {
                rt.block_on(db.flush()).expect("flush");
                writeln!(out, "durable {run} {}", (b + 1) * BATCH).expect("stdout");
                out.flush().expect("stdout");
            }
        }
    }
}

/// Until the process is killed: 10 MiB of scratch records written and removed, then a
/// compaction (a rewrite of the event log while the writer goes on), again and again.
fn compact_meanwhile(db: Db) {
    std::thread::spawn(move || {
        let pad = vec![b'y'; 64 * 1024];
        for round in 0u64.. {
            let key = |i: u32| format!("scratch\0{round:08}\0{i:04}").into_bytes();
            for i in 0..160 {
                db.raw()
                    .put(Table::RunEvents, &key(i), &pad)
                    .expect("scratch");
            }
            for i in 0..160 {
                db.raw().remove(Table::RunEvents, &key(i)).expect("scratch");
            }
            if db.compact().expect("compact") {
                let mut out = std::io::stdout();
                writeln!(out, "compacted").expect("stdout");
                out.flush().expect("stdout");
            }
        }
    });
}

/// What one crash left, checked against what the writer said was durable.
#[derive(Debug, Default)]
struct Counts {
    runs: u64,
    run_events: u64,
    /// A run event without its task event.
    run_event_alone: u64,
    /// A task event without its run event (the kill came between the two writes).
    task_event_alone: u64,
    /// A run whose stored seqs are not 1..=n.
    gaps: u64,
    /// Events a returned flush covered that are not in the store.
    lost_durable: u64,
    /// Opens the store refused as damaged.
    refusals: u64,
}

fn check(dir: &Path, first: u64, durable: Option<(u64, u64)>) -> Counts {
    let mut c = Counts::default();
    let store = match SledStore::open(dir) {
        Ok(store) => store,
        Err(agen_hub::store::StoreError::Damaged(report)) => {
            eprintln!("refused after a crash: {}", report.render());
            c.refusals = 1;
            return c;
        }
        Err(e) => panic!("reopen the store: {e}"),
    };
    let db = Db::new(Arc::new(store));
    for run in first..first + RUNS_PER_WRITER {
        let events = db.run_events(&run_id(run)).expect("run events");
        let mut prefix = task_id(run).into_bytes();
        prefix.push(0);
        let task_events: Vec<TaskEventRec> = db
            .list_json(Table::TaskEvents, &prefix)
            .expect("task events");
        if events.is_empty() && task_events.is_empty() {
            break;
        }
        c.runs += 1;
        c.run_events += events.len() as u64;
        let run_seqs: BTreeSet<u64> = events.iter().map(|e| e.seq).collect();
        let task_seqs: BTreeSet<u64> = task_events.iter().map(|e| e.seq).collect();
        c.run_event_alone += run_seqs.difference(&task_seqs).count() as u64;
        c.task_event_alone += task_seqs.difference(&run_seqs).count() as u64;
        if run_seqs.iter().copied().ne(1..=run_seqs.len() as u64) {
            c.gaps += 1;
        }
        if let Some((d_run, d_seq)) = durable {
            let must = match run.cmp(&d_run) {
                std::cmp::Ordering::Less => BATCHES * BATCH,
                std::cmp::Ordering::Equal => d_seq,
                std::cmp::Ordering::Greater => 0,
            };
            c.lost_durable += (1..=must).filter(|s| !run_seqs.contains(s)).count() as u64;
        }
    }
    c
}

#[test]
fn a_process_killed_mid_write_leaves_every_hot_run_event_with_its_task_event() {
    if let Ok(dir) = std::env::var(WRITER_DIR) {
        let first = std::env::var(WRITER_FIRST_RUN)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        writer(Path::new(&dir), first);
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("db");
    let me = std::env::current_exe().expect("the test executable");
    let mut total = Counts::default();
    let compactions = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for crash in 0..CRASHES {
        let first = crash * RUNS_PER_WRITER;
        let mut child = Command::new(&me)
            .args(["--exact", TEST, "--nocapture", "--test-threads", "1"])
            .env(WRITER_DIR, &dir)
            .env(WRITER_FIRST_RUN, first.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the writer");
        let stdout = child.stdout.take().expect("the writer's stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        let compacted = compactions.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line == "compacted" {
                    compacted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    continue;
                }
                let mut parts = line.split_whitespace();
                if parts.next() == Some("durable") {
                    let run = parts.next().and_then(|v| v.parse::<u64>().ok());
                    let seq = parts.next().and_then(|v| v.parse::<u64>().ok());
                    if let (Some(run), Some(seq)) = (run, seq) {
                        let _ = tx.send((run, seq));
                    }
                }
            }
        });
        // Wait for the first durable batch, then kill at a moment that differs per crash.
        let first_durable = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the writer made a batch durable");
        std::thread::sleep(Duration::from_millis(30 + 37 * crash));
        child.kill().expect("SIGKILL the writer");
        let _ = child.wait();
        reader.join().expect("the reader thread");
        let durable = rx.try_iter().last().unwrap_or(first_durable);
        let c = check(&dir, first, Some(durable));
        eprintln!("crash {crash}: last durable {durable:?}, {c:?}");
        assert_eq!(
            c.refusals, 0,
            "crash {crash}: the store refused to open after a kill -9"
        );
        assert!(c.runs > 0, "crash {crash}: the writer wrote nothing: {c:?}");
        assert!(
            c.task_event_alone <= 1,
            "crash {crash}: more than the row being written at the kill is half written: {c:?}"
        );
        total.runs += c.runs;
        total.run_events += c.run_events;
        total.run_event_alone += c.run_event_alone;
        total.task_event_alone += c.task_event_alone;
        total.gaps += c.gaps;
        total.lost_durable += c.lost_durable;
        total.refusals += c.refusals;
    }
    let compactions = compactions.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!("after {CRASHES} crashes: {total:?}, {compactions} compactions of the event log");
    assert!(compactions > 0, "the writers never compacted the event log");
    assert_eq!(total.run_event_alone, 0, "{total:?}");
    assert_eq!(total.gaps, 0, "{total:?}");
    assert_eq!(total.lost_durable, 0, "{total:?}");
    assert_eq!(total.refusals, 0, "kill -9 x{CRASHES}: {total:?}");
}
