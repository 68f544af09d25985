//! Store behaviour: persistence across reopen, append-if-absent and fencing of run events.

use std::sync::Arc;

use pretty_assertions::assert_eq;

use super::*;
use crate::model::RunEventRec;

fn open(dir: &std::path::Path) -> Db {
    Db::new(Arc::new(SledStore::open(dir).unwrap()))
}

/// Stores the deployment record `name` as `{"x": x}`.
fn put_deployment(db: &Db, name: &str, x: u32) {
    db.put_json(Table::Deployments, name, &serde_json::json!({ "x": x }))
        .unwrap();
}

fn ev(attempt: u32, seq: u64, kind: &str) -> RunEventRec {
    RunEventRec {
        run_id: "run-1".into(),
        attempt,
        seq,
        task_id: "task-1".into(),
        at_ms: 1,
        kind: kind.into(),
        json: "{}".into(),
    }
}

#[tokio::test]
async fn records_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = open(dir.path());
        put_deployment(&db, "default/a", 1);
        assert_eq!(db.raw().increment("tasks").unwrap(), 1);
        assert_eq!(db.raw().increment("tasks").unwrap(), 2);
        db.flush().await.unwrap();
    }
    let db = open(dir.path());
    let got: Option<serde_json::Value> = db.get_json(Table::Deployments, "default/a").unwrap();
    assert_eq!(got, Some(serde_json::json!({"x": 1})));
    assert_eq!(db.raw().increment("tasks").unwrap(), 3);
}

#[tokio::test]
async fn run_events_are_appended_once_and_older_attempts_are_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    db.set_run_attempt("run-1", 1).unwrap();
    assert_eq!(
        db.append_run_event(&ev(1, 1, "model.requested")).unwrap(),
        Append::Appended
    );
    assert_eq!(
        db.append_run_event(&ev(1, 1, "model.requested")).unwrap(),
        Append::Duplicate
    );
    assert_eq!(
        db.append_run_event(&ev(1, 2, "model.answered")).unwrap(),
        Append::Appended
    );
    // An attempt the Hub never issued is refused and does not raise the fence.
    assert_eq!(
        db.append_run_event(&ev(u32::MAX, 1, "run.finished"))
            .unwrap(),
        Append::Fenced
    );
    assert_eq!(db.run_attempt("run-1").unwrap(), 1);
    // The run is re-dispatched as attempt 2: attempt 1 is fenced from then on.
    db.set_run_attempt("run-1", 2).unwrap();
    assert_eq!(
        db.append_run_event(&ev(1, 3, "tool.started")).unwrap(),
        Append::Fenced
    );
    assert_eq!(
        db.append_run_event(&ev(2, 1, "model.requested")).unwrap(),
        Append::Appended
    );
    db.flush().await.unwrap();
    drop(db);
    let db = open(dir.path());
    let kinds: Vec<(u32, u64)> = db
        .run_events("run-1")
        .unwrap()
        .iter()
        .map(|e| (e.attempt, e.seq))
        .collect();
    assert_eq!(kinds, vec![(1, 1), (1, 2), (2, 1)]);
    assert_eq!(
        db.append_run_event(&ev(1, 4, "log")).unwrap(),
        Append::Fenced
    );
}

#[tokio::test]
async fn hot_run_events_are_written_after_their_task_events_and_a_batch_with_a_stored_one_writes_nothing(
) {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    db.set_run_attempt("run-1", 1).unwrap();
    let te = |seq: u64| {
        Some(crate::model::TaskEventRec {
            seq,
            at_ms: 1,
            kind: "activity".into(),
            json: "{}".into(),
            snapshot: None,
            source: None,
        })
    };
    let batch = vec![(ev(1, 1, "activity"), te(7)), (ev(1, 2, "activity"), te(8))];
    db.append_hot_run_events(&batch).unwrap();
    assert!(db.has_run_event("run-1", 1, 1).unwrap());
    assert!(db.has_run_event("run-1", 1, 2).unwrap());
    assert!(!db.has_run_event("run-1", 1, 3).unwrap());

    // A batch with one event stored already writes nothing, not even the new event or a
    // task event, and says why.
    let again = vec![
        (ev(1, 3, "activity"), te(9)),
        (ev(1, 2, "activity"), te(10)),
    ];
    let err = db.append_hot_run_events(&again).unwrap_err().to_string();
    assert!(err.contains("stored meanwhile"), "{err}");
    assert!(!db.has_run_event("run-1", 1, 3).unwrap());
    let task_id = batch[0].0.task_id.clone();
    assert_eq!(
        db.last_task_event(&task_id).unwrap().map(|e| e.seq),
        Some(8)
    );
    assert_eq!(db.run_events("run-1").unwrap().len(), 2);

    // A run event whose task event is stored already (before a crash) is written alone.
    db.append_hot_run_events(&[(ev(1, 3, "activity"), None)])
        .unwrap();
    assert!(db.has_run_event("run-1", 1, 3).unwrap());
    assert_eq!(
        db.last_task_event(&task_id).unwrap().map(|e| e.seq),
        Some(8)
    );
}

/// A flush is sled's flush and then an `fdatasync` of sled's log file: a store whose log file
/// cannot be synced fails the flush (and says so) instead of acknowledging writes as durable.
#[tokio::test]
async fn a_flush_is_not_durable_until_the_log_file_is_synced() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    put_deployment(&db, "default/a", 1);
    assert!(db.flush().await.is_ok(), "a store that works flushes");

    // The log file goes (sled keeps writing to the handle it has): the sync cannot happen.
    std::fs::rename(dir.path().join("db"), dir.path().join("db.gone")).unwrap();
    put_deployment(&db, "default/b", 2);
    let err = db.flush().await.unwrap_err().to_string();
    assert!(err.contains("fdatasync"), "the error names the sync: {err}");
    assert!(
        db.raw().broken().is_some(),
        "the store says it cannot write"
    );
}

/// Values over sled's blob threshold (~128 KiB) live in files of their own, which sled never
/// syncs; a flush syncs them, and they read back after a restart.
#[tokio::test]
async fn a_flush_covers_values_sled_keeps_in_blob_files() {
    let dir = tempfile::tempdir().unwrap();
    let big = "x".repeat(300 * 1024);
    {
        let db = open(dir.path());
        db.raw()
            .put(Table::Deployments, b"default/big", big.as_bytes())
            .unwrap();
        db.flush().await.unwrap();
        let blobs = std::fs::read_dir(dir.path().join("blobs")).unwrap().count();
        assert!(blobs > 0, "sled kept the value in a blob file");
    }
    let db = open(dir.path());
    let got = db.raw().get(Table::Deployments, b"default/big").unwrap();
    assert_eq!(got.as_deref(), Some(big.as_bytes()));
}

/// A store written before run and task events had a file of their own holds them in sled's
/// trees: opening it moves them into the event log (sled's trees are emptied only after the
/// log is synced), and every reader sees the same events as before.
#[tokio::test]
async fn events_sled_held_before_the_event_log_are_moved_into_it() {
    let dir = tempfile::tempdir().unwrap();
    {
        let old = sled::Config::new().path(dir.path()).open().unwrap();
        let runs = old.open_tree(Table::RunEvents.name()).unwrap();
        for seq in 1..=3 {
            let e = ev(1, seq, "activity");
            runs.insert(
                run_event_key(&e.run_id, e.attempt, e.seq),
                serde_json::to_vec(&e).unwrap(),
            )
            .unwrap();
        }
        let task_event = crate::model::TaskEventRec {
            seq: 4,
            at_ms: 1,
            kind: "activity".into(),
            json: "{}".into(),
            snapshot: None,
            source: None,
        };
        old.open_tree(Table::TaskEvents.name())
            .unwrap()
            .insert(
                task_event_key("task-1", 4),
                serde_json::to_vec(&task_event).unwrap(),
            )
            .unwrap();
        old.open_tree(Table::Deployments.name())
            .unwrap()
            .insert("default/a", &br#"{"x":1}"#[..])
            .unwrap();
        old.flush().unwrap();
    }
    for _ in 0..2 {
        // Twice: the second open finds nothing left to move and changes nothing.
        let db = open(dir.path());
        let seqs: Vec<u64> = db
            .run_events("run-1")
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, [1, 2, 3]);
        assert_eq!(
            db.last_task_event("task-1").unwrap().map(|e| e.seq),
            Some(4)
        );
        let got: Option<serde_json::Value> = db.get_json(Table::Deployments, "default/a").unwrap();
        assert_eq!(
            got,
            Some(serde_json::json!({"x": 1})),
            "other tables stay in sled"
        );
        db.close();
    }
    let old = sled::Config::new().path(dir.path()).open().unwrap();
    assert!(old.open_tree(Table::RunEvents.name()).unwrap().is_empty());
    assert!(old.open_tree(Table::TaskEvents.name()).unwrap().is_empty());
}

/// Hot events are written to the event log alone: a flush after them syncs that file and
/// leaves sled's log as it was.
#[tokio::test]
async fn a_flush_after_hot_events_alone_syncs_the_event_log_and_not_sled() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    db.set_run_attempt("run-1", 1).unwrap();
    db.flush().await.unwrap();
    let flushes = db.flushes();
    db.append_hot_run_events(&[(ev(1, 1, "activity"), None)])
        .unwrap();
    // sled's log goes: a flush that touched it would fail (see the test above).
    std::fs::rename(dir.path().join("db"), dir.path().join("db.gone")).unwrap();
    db.flush().await.unwrap();
    assert_eq!(db.flushes(), flushes + 1, "one flush, of the event log");
    db.close();
    std::fs::rename(dir.path().join("db.gone"), dir.path().join("db")).unwrap();
    let db = open(dir.path());
    assert!(db.has_run_event("run-1", 1, 1).unwrap());
}

/// What retention removes is dead weight in `events.log`; compacting the open store rewrites
/// it away while the store keeps working, and what is left reads back before and after a
/// reopen.
#[tokio::test]
async fn compacting_an_open_store_drops_removed_events_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join(event_log::FILE_NAME);
    let db = open(dir.path());
    assert!(
        !db.compact().unwrap(),
        "an empty log is not worth a rewrite"
    );
    let pad = "p".repeat(32 * 1024);
    for run in 0..300 {
        let mut e = ev(1, 1, "tool.started");
        e.run_id = format!("old-{run:03}");
        e.json = format!(r#"{{"pad":"{pad}"}}"#);
        db.set_run_attempt(&e.run_id, 1).unwrap();
        assert_eq!(db.append_run_event(&e).unwrap(), Append::Appended);
    }
    db.set_run_attempt("run-1", 1).unwrap();
    db.append_run_event(&ev(1, 1, "model.requested")).unwrap();
    db.flush().await.unwrap();
    for (k, _) in db.raw().scan(Table::RunEvents, b"old-").unwrap() {
        db.raw().remove(Table::RunEvents, &k).unwrap();
    }
    let before = std::fs::metadata(&log).unwrap().len();
    assert!(
        db.compact().unwrap(),
        "9 MiB removed against one event left"
    );
    let after = std::fs::metadata(&log).unwrap().len();
    assert!(after < 4096, "{before} bytes became {after}");
    assert_eq!(
        db.run_events("run-1").unwrap(),
        vec![ev(1, 1, "model.requested")]
    );
    // The store goes on: an append and a flush after the rewrite, both kept.
    db.append_run_event(&ev(1, 2, "model.answered")).unwrap();
    db.flush().await.unwrap();
    drop(db);
    let db = open(dir.path());
    assert_eq!(
        db.run_events("run-1").unwrap(),
        vec![ev(1, 1, "model.requested"), ev(1, 2, "model.answered")]
    );
    assert!(db.raw().scan(Table::RunEvents, b"old-").unwrap().is_empty());
}

/// What a full disk left behind when sled was opened on it: a snapshot begun and cut short.
/// sled 0.34 reads it as its newest snapshot and fails every open with `Read corrupted data`;
/// the store removes it first and opens with everything that was written.
#[tokio::test]
async fn a_snapshot_sled_never_finished_does_not_make_the_store_unreadable() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = open(dir.path());
        put_deployment(&db, "default/a", 7);
        db.flush().await.unwrap();
        db.close();
    }
    let cut_short = dir.path().join("snap.7FFFFFFFFFFFFFFF.generating");
    std::fs::write(&cut_short, b"partial snapshot").unwrap();
    let raw = sled::Config::new().path(dir.path()).open();
    assert!(
        raw.is_err(),
        "sled itself reads an unfinished snapshot (else this test proves nothing)"
    );
    drop(raw);
    let db = open(dir.path());
    let got: Option<serde_json::Value> = db.get_json(Table::Deployments, "default/a").unwrap();
    assert_eq!(got, Some(serde_json::json!({ "x": 7 })));
    assert!(!cut_short.exists());
}

/// An old unencrypted snapshot restores only when allowed; every restore starts the next store
/// epoch and marks the store restored until the Hub re-queued what was in flight.
#[tokio::test]
async fn a_restore_starts_a_new_epoch_and_reads_a_plain_snapshot_only_when_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("snapshot.key");
    sealed::SnapshotKey::create(&key_file).unwrap();
    let key = sealed::SnapshotKey::load(&key_file).unwrap();
    let source = open(&dir.path().join("source"));
    put_deployment(&source, "default/a", 1);
    let mut plain = Vec::new();
    snapshot::write(source.raw(), &dir.path().join("source"), &mut plain).unwrap();

    let into = dir.path().join("restored");
    let how = snapshot::Opening::default();
    let err = snapshot::restore(&plain[..], &into, how)
        .unwrap_err()
        .to_string();
    assert!(err.contains("--allow-unencrypted"), "{err}");
    assert!(!into.join("db").exists());
    let allowed = snapshot::Opening {
        key: None,
        allow_unencrypted: true,
    };
    snapshot::restore(&plain[..], &into, allowed).unwrap();
    let restored = open(&into.join("db"));
    assert_eq!(
        (
            restored.store_epoch().unwrap(),
            restored.restore_pending().unwrap()
        ),
        (1, 1)
    );
    restored.clear_restore_pending().unwrap();

    // A sealed snapshot of the restored store, restored again: the epoch after that.
    let mut sealed_bytes = Vec::new();
    snapshot::write_sealed(restored.raw(), &into, &mut sealed_bytes, &key).unwrap();
    restored.close();
    let sealed_how = snapshot::Opening {
        key: Some(&key),
        allow_unencrypted: false,
    };
    let counts = snapshot::verify(&sealed_bytes[..], sealed_how).unwrap();
    assert!(counts.records >= 2, "{counts:?}");
    let again = dir.path().join("again");
    snapshot::restore(&sealed_bytes[..], &again, sealed_how).unwrap();
    let db = open(&again.join("db"));
    assert_eq!(
        (db.store_epoch().unwrap(), db.restore_pending().unwrap()),
        (2, 2)
    );
    let got: Option<serde_json::Value> = db.get_json(Table::Deployments, "default/a").unwrap();
    assert_eq!(got, Some(serde_json::json!({ "x": 1 })));
}
