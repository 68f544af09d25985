//! The store's check at open, as the fault: bytes flipped at chosen places of `events.log`,
//! its tail cut, the file deleted, sled's files deleted or cut, a task's events gone. Each
//! either opens with every acknowledged record, or is refused naming the file, the offset and
//! the tasks touched; a repair then keeps every whole record and opens.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use pretty_assertions::assert_eq;

use super::*;
use crate::model::TaskEventRec;
use crate::store::{task_event_key, Db, SledStore, Store};

fn task_id(i: usize) -> String {
    format!("task-{i:032x}")
}

fn run_id(i: usize) -> String {
    format!("run-{i:032x}")
}

/// One task event record in the log: whose, and where.
#[derive(Debug, Clone)]
struct Rec {
    task: String,
    start: u64,
    end: u64,
}

const TASKS: usize = 6;
const EVENTS: u64 = 5;

/// A store of [`TASKS`] tasks with [`EVENTS`] task events each, written in turns (as runs in
/// flight interleave); tasks 0 and 1 have finished, the rest are in flight. Flushed and
/// closed, as a Hub that stopped.
async fn store(dir: &Path) -> Vec<Rec> {
    let db = Db::new(Arc::new(SledStore::open(dir).unwrap()));
    let log = dir.join(FILE_NAME);
    let mut recs = Vec::new();
    for seq in 1..=EVENTS {
        for i in 0..TASKS {
            let start = std::fs::metadata(&log).unwrap().len();
            let ev = TaskEventRec {
                seq,
                at_ms: seq as i64,
                kind: "tool.started".into(),
                json: format!(r#"{{"call_id":"c{seq}","run":"{}"}}"#, run_id(i)),
                snapshot: None,
                source: None,
            };
            db.raw()
                .put(
                    Table::TaskEvents,
                    &task_event_key(&task_id(i), seq),
                    &serde_json::to_vec(&ev).unwrap(),
                )
                .unwrap();
            let end = std::fs::metadata(&log).unwrap().len();
            recs.push(Rec {
                task: task_id(i),
                start,
                end,
            });
            let state = if i < 2 && seq == EVENTS {
                "succeeded"
            } else {
                "running"
            };
            let rec = serde_json::json!({
                "task_id": task_id(i),
                "run_id": run_id(i),
                "next_event_seq": seq + 1,
                "state": state,
            });
            db.put_json(Table::Tasks, &task_id(i), &rec).unwrap();
        }
        db.flush().await.unwrap();
    }
    db.close();
    recs
}

fn in_flight() -> BTreeSet<String> {
    (2..TASKS).map(task_id).collect()
}

fn refused(dir: &Path) -> Report {
    match SledStore::open(dir) {
        Err(StoreError::Damaged(report)) => *report,
        Err(e) => panic!("refused with another error: {e}"),
        Ok(_) => panic!("a damaged store was opened"),
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn flip(file: &Path, at: u64, n: usize) {
    let mut bytes = std::fs::read(file).unwrap();
    for b in &mut bytes[at as usize..at as usize + n] {
        *b ^= 0xa5;
    }
    std::fs::write(file, bytes).unwrap();
}

fn task_events(db: &Db) -> usize {
    db.raw().scan(Table::TaskEvents, b"").unwrap().len()
}

/// A store-level repair, with the tasks it names failed as the core does it
/// (`Core::fail_history_lost`: state failed, reason `history_lost`).
async fn repair(dir: &Path) -> Report {
    let (store, before) = SledStore::open_for_repair(dir).unwrap();
    let db = Db::new(Arc::new(store));
    for id in before.affected() {
        let rec = serde_json::json!({
            "task_id": id,
            "run_id": "",
            "next_event_seq": 1,
            "state": "failed",
            "outcome": {"error": format!("{HISTORY_LOST}: the test repaired it")},
        });
        db.put_json(Table::Tasks, &id, &rec).unwrap();
    }
    db.flush().await.unwrap();
    db.close();
    before
}

/// After a repair the store opens, holding every record but those in `lost`.
async fn repaired_keeps(dir: &Path, lost: usize) -> Report {
    let before = repair(dir).await;
    let db = Db::new(Arc::new(SledStore::open(dir).unwrap()));
    assert_eq!(task_events(&db), TASKS * EVENTS as usize - lost);
    db.close();
    let after = verify_stopped(dir.parent().unwrap()).unwrap();
    assert!(after.intact(), "{}", after.render());
    before
}

#[tokio::test]
async fn a_store_that_stopped_opens_and_verifies_intact() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    store(&dir).await;
    let report = verify_stopped(tmp.path()).unwrap();
    assert!(report.intact(), "{}", report.render());
    assert_eq!(report.records, (TASKS * EVENTS as usize) as u64);
    let db = Db::new(Arc::new(SledStore::open(&dir).unwrap()));
    assert_eq!(task_events(&db), TASKS * EVENTS as usize);
    db.close();
}

/// Eight bytes flipped in a record anywhere (its length, its checksum, its key or value; the
/// first record, one in the middle, the last) or in the header: refused, naming the offset
/// and the task whose record it was; a repair keeps every other record.
#[tokio::test]
async fn flipped_bytes_anywhere_are_refused_with_the_offset_and_the_task() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let recs = store(&dir).await;
    let mid = &recs[recs.len() / 2];
    let last = &recs[recs.len() - 1];
    let first = &recs[0];
    let cases: Vec<(&str, u64, usize, Option<&Rec>)> = vec![
        ("the header", 20, 4, None),
        ("the first record's value", first.end - 12, 8, Some(first)),
        ("the first record's length", first.start, 2, Some(first)),
        ("a middle record's length", mid.start + 1, 2, Some(mid)),
        ("a middle record's checksum", mid.start + 5, 2, Some(mid)),
        ("a middle record's key", mid.start + 16, 8, Some(mid)),
        ("a middle record's value", mid.end - 20, 8, Some(mid)),
        (
            "a record at a quarter",
            recs[recs.len() / 4].start + 30,
            8,
            Some(&recs[recs.len() / 4]),
        ),
        ("the last record's value", last.end - 9, 8, Some(last)),
        ("the last record's checksum", last.start + 4, 4, Some(last)),
    ];
    let mut refusals = 0;
    for (i, (what, at, n, rec)) in cases.iter().enumerate() {
        let case = tmp.path().join(format!("case-{i}"));
        copy_dir(&dir, &case.join("db"));
        let db_dir = case.join("db");
        flip(&db_dir.join(FILE_NAME), *at, *n);
        let report = refused(&db_dir);
        refusals += 1;
        let problem = &report.problems[0];
        assert_eq!(problem.file, db_dir.join(FILE_NAME), "{what}");
        match rec {
            Some(rec) => {
                assert_eq!(
                    problem.offset,
                    Some(rec.start),
                    "{what}: {}",
                    report.render()
                );
                assert_eq!(
                    report.affected(),
                    BTreeSet::from([rec.task.clone()]),
                    "{what}: {}",
                    report.render()
                );
                assert!(
                    report.refusal().contains(&rec.task)
                        && report.refusal().contains("agen hub repair")
                        && report.refusal().contains(&format!("at byte {}", rec.start)),
                    "{what}: {}",
                    report.refusal()
                );
                let before = repaired_keeps(&db_dir, 1).await;
                assert_eq!(before.affected(), BTreeSet::from([rec.task.clone()]));
            }
            None => {
                assert_eq!(problem.offset, Some(0), "{what}");
                assert_eq!(report.affected(), in_flight(), "{what}");
                repaired_keeps(&db_dir, 0).await;
            }
        }
    }
    eprintln!(
        "flipped bytes: {} positions, {refusals} refused, 0 served",
        cases.len()
    );
    assert_eq!(refusals, cases.len());
}

/// The tail cut off by 1 byte up to half the file: refused, naming where the file now ends
/// and the tasks in flight (any of them may have had events there).
#[tokio::test]
async fn a_cut_tail_of_an_acknowledged_log_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    let recs = store(&dir).await;
    let len = std::fs::metadata(dir.join(FILE_NAME)).unwrap().len();
    let mut refusals = 0;
    for cut in [1, 7, 100, 1000, len / 4, len / 2] {
        let case = tmp.path().join(format!("cut-{cut}"));
        let db_dir = case.join("db");
        copy_dir(&dir, &db_dir);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(db_dir.join(FILE_NAME))
            .unwrap();
        file.set_len(len - cut).unwrap();
        drop(file);
        let report = refused(&db_dir);
        refusals += 1;
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.offset == Some(len - cut) && p.what.contains("tail was cut")),
            "cut {cut}: {}",
            report.render()
        );
        // Every task with a record in the cut part is named.
        let touched: BTreeSet<String> = recs
            .iter()
            .filter(|r| r.end > len - cut)
            .map(|r| r.task.clone())
            .collect();
        assert!(
            report.affected().is_superset(&touched),
            "cut {cut}: {}",
            report.render()
        );
        let lost = recs.iter().filter(|r| r.end > len - cut).count();
        repaired_keeps(&db_dir, lost).await;
    }
    eprintln!("cut tails: 6 cuts, {refusals} refused, 0 served");
}

/// What a kill -9 leaves (records past the last sync, the last one cut short) opens by itself
/// and keeps every record the syncs covered.
#[tokio::test]
async fn a_torn_tail_past_the_last_sync_is_cut_and_the_store_opens() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    store(&dir).await;
    {
        let db = Db::new(Arc::new(SledStore::open(&dir).unwrap()));
        for i in 0..3u64 {
            db.raw()
                .put(
                    Table::TaskEvents,
                    &task_event_key("task-late", i + 1),
                    b"{}",
                )
                .unwrap();
        }
        // No flush and no close: the process is gone.
    }
    let file = dir.join(FILE_NAME);
    let len = std::fs::metadata(&file).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(len - 3).unwrap();
    drop(f);
    let report = verify_stopped(tmp.path()).unwrap();
    assert!(report.intact(), "{}", report.render());
    assert!(
        report.notes.iter().any(|n| n.contains("torn")),
        "{report:?}"
    );
    let db = Db::new(Arc::new(SledStore::open(&dir).unwrap()));
    assert_eq!(task_events(&db), TASKS * EVENTS as usize + 2);
    db.close();
}

#[tokio::test]
async fn a_deleted_log_is_refused_while_sled_knows_events() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    store(&dir).await;
    std::fs::remove_file(dir.join(FILE_NAME)).unwrap();
    let report = refused(&dir);
    assert!(
        report.problems[0].what.contains("missing"),
        "{}",
        report.render()
    );
    assert_eq!(report.affected(), (0..TASKS).map(task_id).collect());
    assert!(!dir.join(FILE_NAME).exists(), "the refusal made no new log");
    assert!(!verify_stopped(tmp.path()).unwrap().intact());
    let before = repair(&dir).await;
    assert_eq!(before.affected().len(), TASKS);
    let after = verify_stopped(tmp.path()).unwrap();
    assert!(after.intact(), "{}", after.render());
}

/// sled's files deleted, or cut, while `events.log` remains: refused (sled lost writes).
#[tokio::test]
async fn sled_files_deleted_or_cut_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    store(&dir).await;
    let sled_db = dir.join("db");
    let len = std::fs::metadata(&sled_db).unwrap().len();
    let mut refusals = 0;
    for (what, case) in [
        ("deleted", 0u64),
        ("cut by 1 byte", 1),
        ("cut in half", len / 2),
    ] {
        let root = tmp.path().join(format!("sled-{case}"));
        let db_dir = root.join("db");
        copy_dir(&dir, &db_dir);
        if case == 0 {
            for name in ["db", "conf"] {
                std::fs::remove_file(db_dir.join(name)).unwrap();
            }
        } else {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(db_dir.join("db"))
                .unwrap();
            f.set_len(len - case).unwrap();
        }
        let report = refused(&db_dir);
        refusals += 1;
        assert!(
            report.problems.iter().any(|p| p.file == db_dir.join("db")),
            "{what}: {}",
            report.render()
        );
        assert!(
            report.affected().is_superset(&in_flight()),
            "{what}: {}",
            report.render()
        );
        // Refused again on the next start (nothing was made to look whole meanwhile).
        refused(&db_dir);
    }
    eprintln!("sled files: 3 faults, {refusals} refused, 0 served");
}

/// A task sled knows whose events are gone from the log (a middle one, then its last ones):
/// refused, naming the task.
#[tokio::test]
async fn a_task_missing_events_sled_counts_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    store(&dir).await;
    {
        let db = Db::new(Arc::new(SledStore::open(&dir).unwrap()));
        db.raw()
            .remove(Table::TaskEvents, &task_event_key(&task_id(3), 2))
            .unwrap();
        db.raw()
            .remove(Table::TaskEvents, &task_event_key(&task_id(4), EVENTS))
            .unwrap();
        db.flush().await.unwrap();
        db.close();
    }
    let report = refused(&dir);
    assert_eq!(
        report.affected(),
        BTreeSet::from([task_id(3), task_id(4)]),
        "{}",
        report.render()
    );
}

/// A log written before the header existed is read with the old rules and rewritten with one.
#[tokio::test]
async fn a_log_without_a_header_is_brought_to_the_new_format() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("db");
    SledStore::open(&dir).unwrap().close();
    let mut bytes = super::super::event_log::MAGIC_V1.to_vec();
    for seq in 1..=3u64 {
        let key = task_event_key("task-old", seq);
        let payload_len = 6 + key.len() + 2;
        let start = bytes.len();
        bytes.extend_from_slice(&(payload_len as u32).to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        bytes.push(1);
        bytes.push(2);
        bytes.extend_from_slice(&(key.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&key);
        bytes.extend_from_slice(b"{}");
        let crc = crc32fast::hash(&bytes[start + 8..]);
        bytes[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }
    std::fs::write(dir.join(FILE_NAME), &bytes).unwrap();
    let db = Db::new(Arc::new(SledStore::open(&dir).unwrap()));
    assert_eq!(task_events(&db), 3);
    db.close();
    let now = std::fs::read(dir.join(FILE_NAME)).unwrap();
    assert!(now.starts_with(super::super::event_log::MAGIC));
    assert!(verify_stopped(tmp.path()).unwrap().intact());
}
