//! One test suite for the Hub's [`Store`], run against both stores: the local store (sled and
//! the event log, in a temp dir) and the PostgreSQL store (a database of its own in the shared
//! test server). Each generic test takes a [`Backend`] that opens the same store again, so
//! "survives a reopen" means the same for both; then the PostgreSQL store's own promises: its
//! schema version, and the refusal of a schema newer than the binary.

use std::sync::Arc;

use agen_hub::model::{RunEventRec, TaskEventRec};
use agen_hub::store::{Append, Db, PairRow, PgStore, SledStore, Store, Table};
use agen_tests::postgres;
use pretty_assertions::assert_eq;

/// Opens one store, again and again (the previous handle is dropped first).
trait Backend {
    fn open(&self) -> Db;
}

struct Local(tempfile::TempDir);

impl Backend for Local {
    fn open(&self) -> Db {
        // sled's flusher thread lets go of the file lock a moment after the last handle is
        // dropped: a reopen in the same process waits for it (bounded).
        let path = self.0.path().join("db");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match SledStore::open(&path) {
                Ok(store) => return Db::new(Arc::new(store)),
                Err(e)
                    if e.to_string().contains("could not acquire lock")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => panic!("the local store does not open again: {e}"),
            }
        }
    }
}

struct Pg(String);

impl Backend for Pg {
    fn open(&self) -> Db {
        Db::new(Arc::new(PgStore::open(&self.0).unwrap()))
    }
}

fn local() -> Local {
    Local(tempfile::tempdir().unwrap())
}

fn pg(stem: &str) -> Pg {
    let cluster = postgres::shared();
    Pg(cluster.url(&cluster.database(stem)))
}

fn ev(run: &str, attempt: u32, seq: u64) -> RunEventRec {
    RunEventRec {
        run_id: run.into(),
        attempt,
        seq,
        task_id: format!("task-of-{run}"),
        at_ms: 1,
        kind: "activity".into(),
        json: "{}".into(),
    }
}

fn te(seq: u64) -> Option<TaskEventRec> {
    Some(TaskEventRec {
        seq,
        at_ms: 1,
        kind: "activity".into(),
        json: "{}".into(),
        snapshot: None,
        source: None,
    })
}

/// Records, removals, counters and run events written and flushed are there after a reopen,
/// in key order by prefix.
async fn records_survive_a_reopen(b: &impl Backend) {
    {
        let db = b.open();
        for (k, x) in [("ns/b", 2), ("ns/a", 1), ("other/c", 3), ("ns/gone", 9)] {
            db.put_json(Table::Deployments, k, &serde_json::json!({ "x": x }))
                .unwrap();
        }
        db.remove(Table::Deployments, "ns/gone").unwrap();
        assert_eq!(db.raw().increment("tasks").unwrap(), 1);
        assert_eq!(db.raw().increment("tasks").unwrap(), 2);
        db.set_run_attempt("run-1", 1).unwrap();
        assert_eq!(
            db.append_run_event(&ev("run-1", 1, 1)).unwrap(),
            Append::Appended
        );
        db.flush().await.unwrap();
    }
    let db = b.open();
    let got: Vec<serde_json::Value> = db.list_json(Table::Deployments, b"ns/").unwrap();
    assert_eq!(
        got,
        vec![serde_json::json!({"x": 1}), serde_json::json!({"x": 2})]
    );
    let all: Vec<serde_json::Value> = db.list_json(Table::Deployments, b"").unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(db.raw().increment("tasks").unwrap(), 3);
    assert_eq!(db.run_attempt("run-1").unwrap(), 1);
    assert_eq!(db.run_events("run-1").unwrap().len(), 1);
}

/// A run event is appended once; an older attempt is fenced, an attempt never issued refused.
async fn run_events_are_appended_once_and_fenced(b: &impl Backend) {
    let db = b.open();
    db.set_run_attempt("run-1", 2).unwrap();
    assert_eq!(
        db.append_run_event(&ev("run-1", 2, 1)).unwrap(),
        Append::Appended
    );
    assert_eq!(
        db.append_run_event(&ev("run-1", 2, 1)).unwrap(),
        Append::Duplicate
    );
    assert_eq!(
        db.append_run_event(&ev("run-1", 1, 2)).unwrap(),
        Append::Fenced
    );
    assert_eq!(
        db.append_run_event(&ev("run-1", 3, 1)).unwrap(),
        Append::Fenced
    );
    assert_eq!(db.run_attempt("run-1").unwrap(), 2);
    assert!(db.has_run_event("run-1", 2, 1).unwrap());
    assert!(!db.has_run_event("run-1", 1, 2).unwrap());
}

/// Hot run events go in after their task events; a batch with a stored one writes nothing.
async fn hot_batches_write_all_or_nothing_when_one_is_stored(b: &impl Backend) {
    let db = b.open();
    db.set_run_attempt("run-1", 1).unwrap();
    db.append_hot_run_events(&[(ev("run-1", 1, 1), te(7)), (ev("run-1", 1, 2), te(8))])
        .unwrap();
    let err = db
        .append_hot_run_events(&[(ev("run-1", 1, 3), te(9)), (ev("run-1", 1, 2), te(10))])
        .unwrap_err()
        .to_string();
    assert!(err.contains("stored meanwhile"), "{err}");
    assert!(!db.has_run_event("run-1", 1, 3).unwrap());
    assert_eq!(
        db.last_task_event("task-of-run-1").unwrap().map(|e| e.seq),
        Some(8)
    );
    db.append_hot_run_events(&[(ev("run-1", 1, 3), None)])
        .unwrap();
    let seqs: Vec<u64> = db
        .run_events("run-1")
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, vec![1, 2, 3]);
}

/// Binary keys: prefixes ending in 0xff, `last` by prefix, insert-if-absent, the raw pairs.
async fn binary_keys_scan_and_last_by_prefix(b: &impl Backend) {
    let db = b.open();
    let s = db.raw();
    for k in [&b"a\xff\x01"[..], b"a\xff\xff", b"a\xff", b"b", b"a"] {
        s.put(Table::Approvals, k, k).unwrap();
    }
    let keys = |p: &[u8]| -> Vec<Vec<u8>> {
        s.scan(Table::Approvals, p)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    };
    assert_eq!(
        keys(b"a\xff"),
        vec![
            b"a\xff".to_vec(),
            b"a\xff\x01".to_vec(),
            b"a\xff\xff".to_vec()
        ]
    );
    assert_eq!(keys(b"").len(), 5);
    assert_eq!(
        s.last(Table::Approvals, b"a").unwrap().map(|(k, _)| k),
        Some(b"a\xff\xff".to_vec())
    );
    assert_eq!(s.last(Table::Approvals, b"c").unwrap(), None);
    // Tables are apart: the same key in another table is another record.
    assert!(s.insert_if_absent(Table::Tokens, b"b", b"1").unwrap());
    assert!(!s.insert_if_absent(Table::Tokens, b"b", b"2").unwrap());
    assert_eq!(s.get(Table::Tokens, b"b").unwrap(), Some(b"1".to_vec()));
    assert_eq!(s.get(Table::Approvals, b"b").unwrap(), Some(b"b".to_vec()));
    s.insert_pairs_in_order(
        Table::Audit,
        Table::Nests,
        &[PairRow {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            before: Some((b"n".to_vec(), b"w".to_vec())),
        }],
    )
    .unwrap();
    assert_eq!(s.get(Table::Nests, b"n").unwrap(), Some(b"w".to_vec()));
    s.remove(Table::Approvals, b"a").unwrap();
    assert_eq!(s.get(Table::Approvals, b"a").unwrap(), None);
}

/// A flush with nothing written since the last one syncs nothing; the store is not broken.
async fn a_flush_with_nothing_new_syncs_nothing(b: &impl Backend) {
    let db = b.open();
    db.raw().put(Table::Counters, b"x", b"1").unwrap();
    assert!(db.raw().flush().await.unwrap());
    assert!(!db.raw().flush().await.unwrap());
    assert_eq!(db.broken(), None);
    assert_eq!(db.heal().unwrap(), false);
}

/// Instantiates each generic test for both stores.
macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod local_store {
            $(#[tokio::test]
            async fn $name() {
                super::$name(&super::local()).await;
            })*
        }
        mod postgres_store {
            $(#[tokio::test]
            async fn $name() {
                super::$name(&super::pg(stringify!($name))).await;
            })*
        }
    };
}

both!(
    records_survive_a_reopen,
    run_events_are_appended_once_and_fenced,
    hot_batches_write_all_or_nothing_when_one_is_stored,
    binary_keys_scan_and_last_by_prefix,
    a_flush_with_nothing_new_syncs_nothing,
);

/// The schema is versioned: a new database is migrated to this build's version (recorded in
/// `schema_migrations`), and one with a newer version is refused naming both versions, by the
/// store and by `agen hub` and `agen hub migrate` (exit 2).
#[test]
fn a_schema_newer_than_the_binary_is_refused_naming_both_versions() {
    let cluster = postgres::shared();
    let name = cluster.database("newer");
    let url = cluster.url(&name);
    let check = |url: &str| {
        std::process::Command::new(agen_tests::agen_bin())
            .args(["hub", "migrate", "--check", "--store", url])
            .output()
            .unwrap()
    };
    let before = check(&url);
    assert_eq!(
        before.status.code(),
        Some(1),
        "an empty database needs migrating"
    );
    drop(PgStore::open(&url).unwrap());
    let latest = agen_hub::store::pg::migrate::latest();
    assert_eq!(
        cluster.psql(&name, "SELECT max(version) FROM schema_migrations"),
        latest.to_string()
    );
    assert_eq!(check(&url).status.code(), Some(0));

    let newer = latest + 1;
    cluster.psql(
        &name,
        &format!("INSERT INTO schema_migrations (version, name) VALUES ({newer}, 'future')"),
    );
    let err = PgStore::open(&url).err().expect("refused").to_string();
    assert!(
        err.contains(&format!(
            "schema version {newer}, newer than this agen build knows ({latest})"
        )),
        "{err}"
    );
    let out = check(&url);
    assert_eq!(out.status.code(), Some(2));
    let tmp = tempfile::tempdir().unwrap();
    let hub = std::process::Command::new(agen_tests::agen_bin())
        .args(["hub", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(tmp.path().join("hub"))
        .args(["--store", &url])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&hub.stderr);
    assert!(!hub.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("schema version {newer}"))
            && stderr.contains(&format!("({latest})")),
        "{stderr}"
    );
    assert!(!stderr.contains("password"), "{stderr}");
}

/// Acknowledged = committed: every write a flush covered is in the database after PostgreSQL
/// crashes (`-m immediate`, its WAL writer slowed to 10 s so that nothing but the flush writes
/// the WAL out), and the store reconnects by itself once the server is back.
#[tokio::test]
async fn what_a_flush_covered_survives_a_crash_of_postgresql() {
    let cluster = postgres::Cluster::start(|_, _, _| " -c wal_writer_delay=10s".to_owned());
    let name = cluster.database("crash");
    let db = Db::new(Arc::new(PgStore::open(&cluster.url(&name)).unwrap()));
    let n = 300;
    for i in 0..n {
        db.raw()
            .put(Table::Tasks, format!("task-{i:04}").as_bytes(), b"{}")
            .unwrap();
    }
    db.flush().await.unwrap();
    cluster.crash_and_restart();
    // The first call after the crash finds its connection gone: the store is broken (writes
    // refused) until a heal reaches the server again, as the Hub's heal loop does once a
    // second; bounded retries.
    let err = db.raw().scan(Table::Tasks, b"task-");
    if err.is_err() {
        assert!(
            db.broken().is_some(),
            "a failed call marks the store broken"
        );
        assert!(
            db.raw().put(Table::Tasks, b"later", b"{}").is_err(),
            "no write while broken"
        );
    }
    let mut healed = false;
    for _ in 0..50 {
        if db.heal().is_ok() {
            healed = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(healed, "the store healed once the server was back");
    assert_eq!(db.broken(), None);
    let stored = db.raw().scan(Table::Tasks, b"task-").unwrap().len();
    assert_eq!(stored, n, "every flushed write survived the crash");
    let lost: usize = cluster
        .psql(
            &name,
            "SELECT count(*) FROM agen_records WHERE tbl = 'tasks'",
        )
        .parse()
        .unwrap();
    assert_eq!(lost, n);
}

/// `agen hub migrate --from DATA_DIR --to postgres://…` copies a stopped Hub's store into an
/// empty database (every table, the event log's run and task events too), again with no change,
/// and `--to DATA_DIR` back into a local store that holds the same records; a destination that
/// was not empty is refused by its counts.
#[tokio::test]
async fn a_local_store_moves_into_postgresql_and_back_with_every_record() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, back) = (tmp.path().join("src"), tmp.path().join("back"));
    {
        let db = Db::new(Arc::new(SledStore::open(&src.join("db")).unwrap()));
        db.put_json(
            Table::Deployments,
            "default/a",
            &serde_json::json!({"x": 1}),
        )
        .unwrap();
        db.put_json(Table::Tokens, "tok-1", &serde_json::json!({"name": "ci"}))
            .unwrap();
        db.raw().increment("tasks").unwrap();
        db.set_run_attempt("run-1", 1).unwrap();
        db.append_hot_run_events(&[(ev("run-1", 1, 1), te(1)), (ev("run-1", 1, 2), te(2))])
            .unwrap();
        db.flush().await.unwrap();
        db.close();
    }
    let cluster = postgres::shared();
    let name = cluster.database("moved");
    let url = cluster.url(&name);
    let migrate = |from: &str, to: &str| {
        let out = std::process::Command::new(agen_tests::agen_bin())
            .args(["hub", "migrate", "--from", from, "--to", to])
            .output()
            .unwrap();
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let src_s = src.to_string_lossy().into_owned();
    for round in 0..2 {
        let (code, out) = migrate(&src_s, &url);
        assert_eq!(code, Some(0), "round {round}: {out}");
        assert!(out.contains("every table's counts agree"), "{out}");
        assert!(out.contains("run_events"), "{out}");
    }
    let count = |tbl: &str| -> usize {
        cluster
            .psql(
                &name,
                &format!("SELECT count(*) FROM agen_records WHERE tbl = '{tbl}'"),
            )
            .parse()
            .unwrap()
    };
    assert_eq!(
        (
            count("deployments"),
            count("tokens"),
            count("run_events"),
            count("task_events")
        ),
        (1, 1, 2, 2)
    );
    let (code, out) = migrate(&url, &back.to_string_lossy());
    assert_eq!(code, Some(0), "{out}");
    let (a, b) = (
        SledStore::open(&src.join("db")).unwrap(),
        SledStore::open(&back.join("db")).unwrap(),
    );
    for table in Table::ALL {
        let strip = |rows: Vec<(Vec<u8>, Vec<u8>)>| -> Vec<(Vec<u8>, Vec<u8>)> {
            rows.into_iter()
                .filter(|(k, _)| k != b"store_flushes")
                .collect()
        };
        assert_eq!(
            strip(a.scan(table, b"").unwrap()),
            strip(b.scan(table, b"").unwrap()),
            "table {}",
            table.name()
        );
    }
    drop((a, b));
    // A destination holding other records is refused by its counts.
    cluster.psql(
        &name,
        "INSERT INTO agen_records (tbl, key, value) VALUES ('deployments', 'x', '{}')",
    );
    let (code, out) = migrate(&src_s, &url);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("deployments") && out.contains("was not empty"),
        "{out}"
    );
}
