//! The event log on its own: what it reads back after a reopen, after a torn tail and after a
//! rewrite, and what it refuses.
#![allow(clippy::unwrap_used)]

use super::*;

fn put(log: &EventLog, table: Table, key: &str, value: &str) {
    log.write(&[Op::Put(table, key.as_bytes(), value.as_bytes())])
        .unwrap();
}

fn keys(log: &EventLog, table: Table, prefix: &str) -> Vec<String> {
    log.scan(table, prefix.as_bytes())
        .unwrap()
        .into_iter()
        .map(|(k, v)| {
            format!(
                "{}={}",
                String::from_utf8(k).unwrap(),
                String::from_utf8(v).unwrap()
            )
        })
        .collect()
}

#[test]
fn puts_and_removes_read_back_the_same_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = EventLog::open(dir.path()).unwrap();
        put(&log, Table::RunEvents, "run-1\0a", "1");
        put(&log, Table::RunEvents, "run-1\0b", "2");
        put(&log, Table::RunEvents, "run-2\0a", "3");
        put(&log, Table::TaskEvents, "run-1\0a", "task");
        put(&log, Table::RunEvents, "run-1\0a", "1 again");
        log.write(&[Op::Remove(Table::RunEvents, b"run-2\0a")])
            .unwrap();
        log.sync().unwrap();
    }
    let log = EventLog::open(dir.path()).unwrap();
    assert_eq!(
        keys(&log, Table::RunEvents, ""),
        ["run-1\0a=1 again", "run-1\0b=2"]
    );
    assert_eq!(keys(&log, Table::TaskEvents, "run-1\0"), ["run-1\0a=task"]);
    assert_eq!(
        log.last(Table::RunEvents, b"run-1\0")
            .unwrap()
            .map(|(_, v)| v),
        Some(b"2".to_vec())
    );
    assert_eq!(log.last(Table::RunEvents, b"run-2\0").unwrap(), None);
    assert_eq!(log.get(Table::RunEvents, b"run-2\0a").unwrap(), None);
}

#[test]
fn a_prefix_scan_stops_at_the_prefix_even_at_byte_255() {
    let dir = tempfile::tempdir().unwrap();
    let log = EventLog::open(dir.path()).unwrap();
    for key in [&b"a\xff"[..], b"a\xff\xff", b"b", b"a"] {
        log.write(&[Op::Put(Table::RunEvents, key, b"v")]).unwrap();
    }
    let got: Vec<Vec<u8>> = log
        .scan(Table::RunEvents, b"a\xff")
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(got, [b"a\xff".to_vec(), b"a\xff\xff".to_vec()]);
    assert_eq!(log.scan(Table::RunEvents, b"").unwrap().len(), 4);
}

#[test]
fn a_write_refused_by_its_check_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let log = EventLog::open(dir.path()).unwrap();
    put(&log, Table::RunEvents, "k1", "v");
    let ops = [
        Op::Put(Table::TaskEvents, b"t2", b"v"),
        Op::Put(Table::RunEvents, b"k1", b"v2"),
    ];
    let wrote = log
        .write_if(&ops, |stored| !stored(Table::RunEvents, b"k1"))
        .unwrap();
    assert!(!wrote);
    assert_eq!(log.get(Table::TaskEvents, b"t2").unwrap(), None);
    assert_eq!(
        log.get(Table::RunEvents, b"k1").unwrap(),
        Some(b"v".to_vec())
    );
}

/// A crash in the middle of a write leaves part of a record at the end of the file: opening
/// keeps every whole record before it and cuts the rest off, so the next write follows them.
#[test]
fn a_torn_tail_is_cut_off_and_every_whole_record_before_it_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    {
        let log = EventLog::open(dir.path()).unwrap();
        put(&log, Table::RunEvents, "k1", "one");
        put(&log, Table::RunEvents, "k2", "two");
    }
    let whole = std::fs::metadata(&path).unwrap().len();
    for cut in [1u64, 5, 9, 14] {
        // Every cut inside the last record: the header, the key, the value.
        let bytes = std::fs::read(&path).unwrap();
        let tmp = dir.path().join("cut");
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::write(tmp.join(FILE_NAME), &bytes[..(whole - cut) as usize]).unwrap();
        let log = EventLog::open(&tmp).unwrap();
        assert_eq!(
            keys(&log, Table::RunEvents, ""),
            ["k1=one"],
            "cut {cut} bytes"
        );
        put(&log, Table::RunEvents, "k3", "three");
        drop(log);
        let log = EventLog::open(&tmp).unwrap();
        assert_eq!(
            keys(&log, Table::RunEvents, ""),
            ["k1=one", "k3=three"],
            "cut {cut}"
        );
        std::fs::remove_dir_all(&tmp).unwrap();
    }
    // A flipped byte in the last record fails its checksum the same way.
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&path, &bytes).unwrap();
    let log = EventLog::open(dir.path()).unwrap();
    assert_eq!(keys(&log, Table::RunEvents, ""), ["k1=one"]);
}

#[test]
fn a_file_that_is_not_an_event_log_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    std::fs::write(&path, b"something else entirely").unwrap();
    let err = EventLog::open(dir.path()).err().unwrap().to_string();
    assert!(err.contains("is not an agen event log"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"something else entirely");
}

#[test]
fn dead_records_are_dropped_by_a_rewrite_once_they_outweigh_the_live_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    let big = "x".repeat(64 * 1024);
    // Live records over several of the rewrite's chunks, each with its own value.
    let live = |i: usize| format!("{i:04}{}", "y".repeat(50 * 1024));
    {
        let log = EventLog::open(dir.path()).unwrap();
        for i in 0..200 {
            put(&log, Table::TaskEvents, &format!("gone-{i:03}"), &big);
            if i % 4 == 0 {
                put(&log, Table::RunEvents, &format!("live-{i:03}"), &live(i));
            }
        }
        for i in 0..200 {
            log.write(&[Op::Remove(
                Table::TaskEvents,
                format!("gone-{i:03}").as_bytes(),
            )])
            .unwrap();
        }
        put(&log, Table::TaskEvents, "kept", "still here");
    }
    let before = std::fs::metadata(&path).unwrap().len();
    let log = EventLog::open(dir.path()).unwrap();
    let after = std::fs::metadata(&path).unwrap().len();
    assert!(
        before > 14 << 20 && after < 3 << 20,
        "{before} bytes became {after}"
    );
    let check = |log: &EventLog| {
        assert_eq!(keys(log, Table::TaskEvents, ""), ["kept=still here"]);
        let runs = log.scan(Table::RunEvents, b"live-").unwrap();
        assert_eq!(runs.len(), 50);
        for (k, v) in runs {
            let i: usize = std::str::from_utf8(&k[5..]).unwrap().parse().unwrap();
            assert!(v == live(i).as_bytes(), "live-{i:03} reads back whole");
        }
    };
    check(&log);
    put(&log, Table::RunEvents, "run2", "after");
    drop(log);
    let log = EventLog::open(dir.path()).unwrap();
    check(&log);
    assert_eq!(
        log.get(Table::RunEvents, b"run2").unwrap(),
        Some(b"after".to_vec())
    );
    assert!(!dir.path().join(format!("{FILE_NAME}.compacting")).exists());
}

#[test]
fn a_closed_log_refuses_reads_and_writes() {
    let dir = tempfile::tempdir().unwrap();
    let log = EventLog::open(dir.path()).unwrap();
    put(&log, Table::RunEvents, "k", "v");
    log.close();
    assert!(log.get(Table::RunEvents, b"k").is_err());
    assert!(log
        .write(&[Op::Put(Table::RunEvents, b"k2", b"v")])
        .is_err());
    assert!(log.sync().is_err());
}

/// Fills a log with 16 MiB of records that end up dead and a few live ones.
fn log_with_dead_weight(dir: &Path) -> EventLog {
    let log = EventLog::open(dir).unwrap();
    let big = "x".repeat(64 * 1024);
    for i in 0..256 {
        put(&log, Table::TaskEvents, &format!("gone-{i:03}"), &big);
    }
    for i in 0..256 {
        log.write(&[Op::Remove(
            Table::TaskEvents,
            format!("gone-{i:03}").as_bytes(),
        )])
        .unwrap();
    }
    for i in 0..20 {
        put(
            &log,
            Table::RunEvents,
            &format!("live-{i:02}"),
            &format!("v{i}"),
        );
    }
    log
}

#[test]
fn a_rewrite_while_the_log_runs_keeps_what_was_written_during_the_copy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    let log = log_with_dead_weight(dir.path());
    let before = std::fs::metadata(&path).unwrap().len();

    // The copy's view: the index and the end of the file now.
    let (old, tables, copied_upto) = {
        let inner = log.lock();
        (
            inner.file().unwrap(),
            [
                (Table::RunEvents, inner.run_events.clone()),
                (Table::TaskEvents, inner.task_events.clone()),
            ],
            inner.end,
        )
    };
    // Meanwhile: a new key, a replaced one, a removed one, and a key put then removed.
    put(&log, Table::RunEvents, "live-20", "new");
    put(&log, Table::RunEvents, "live-03", "replaced");
    log.write(&[Op::Remove(Table::RunEvents, b"live-07")])
        .unwrap();
    put(&log, Table::TaskEvents, "brief", "here and gone");
    log.write(&[Op::Remove(Table::TaskEvents, b"brief")])
        .unwrap();
    log.rewrite(&old, tables, copied_upto, &log.fresh_path())
        .unwrap();

    let expected: Vec<String> = (0..21)
        .filter(|i| *i != 7)
        .map(|i| match i {
            3 => "live-03=replaced".to_string(),
            20 => "live-20=new".to_string(),
            i => format!("live-{i:02}=v{i}"),
        })
        .collect();
    assert_eq!(keys(&log, Table::RunEvents, "live-"), expected);
    assert_eq!(keys(&log, Table::TaskEvents, ""), Vec::<String>::new());
    let after = std::fs::metadata(&path).unwrap().len();
    assert!(after < 64 * 1024, "{before} bytes became {after}");
    // Writes go to the new file, and all of it reads back after a reopen.
    put(&log, Table::TaskEvents, "later", "kept");
    drop(log);
    let log = EventLog::open(dir.path()).unwrap();
    assert_eq!(keys(&log, Table::RunEvents, "live-"), expected);
    assert_eq!(keys(&log, Table::TaskEvents, ""), ["later=kept"]);
    assert!(!log.fresh_path().exists());
}

#[test]
fn a_rewrite_racing_a_writer_loses_nothing_and_only_runs_when_worth_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = std::sync::Arc::new(log_with_dead_weight(dir.path()));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = std::thread::spawn({
        let (log, done) = (log.clone(), done.clone());
        move || {
            let mut n = 0u32;
            while !done.load(std::sync::atomic::Ordering::SeqCst) || n < 100 {
                put(
                    &log,
                    Table::RunEvents,
                    &format!("during-{n:06}"),
                    &n.to_string(),
                );
                if n.is_multiple_of(3) {
                    log.write(&[Op::Remove(
                        Table::RunEvents,
                        format!("during-{n:06}").as_bytes(),
                    )])
                    .unwrap();
                }
                n += 1;
            }
            n
        }
    });
    assert!(
        log.compact().unwrap(),
        "16 MiB dead against a few bytes live"
    );
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let n = writer.join().unwrap();
    assert!(!log.compact().unwrap(), "nothing left worth a rewrite");

    let check = |log: &EventLog| {
        let during = log.scan(Table::RunEvents, b"during-").unwrap();
        let expected: Vec<u32> = (0..n).filter(|i| !i.is_multiple_of(3)).collect();
        let got: Vec<u32> = during
            .iter()
            .map(|(k, v)| {
                let i: u32 = std::str::from_utf8(&k[7..]).unwrap().parse().unwrap();
                assert_eq!(
                    v,
                    i.to_string().as_bytes(),
                    "during-{i:06} reads back whole"
                );
                i
            })
            .collect();
        assert_eq!(got, expected, "every write made during the rewrite, once");
        assert_eq!(log.scan(Table::RunEvents, b"live-").unwrap().len(), 20);
        assert!(log.scan(Table::TaskEvents, b"gone-").unwrap().is_empty());
    };
    check(&log);
    log.sync().unwrap();
    drop(log);
    check(&EventLog::open(dir.path()).unwrap());
}

#[test]
fn a_rewrite_cut_short_by_a_crash_leaves_the_log_whole_and_its_copy_is_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let log = EventLog::open(dir.path()).unwrap();
        put(&log, Table::RunEvents, "k", "v");
    }
    // The copy a killed rewrite left: never renamed, so never the log.
    let copy = dir.path().join(format!("{FILE_NAME}.compacting"));
    std::fs::write(&copy, b"agen-hub-events 1\nhalf a rec").unwrap();
    let log = EventLog::open(dir.path()).unwrap();
    assert_eq!(keys(&log, Table::RunEvents, ""), ["k=v"]);
    assert!(!copy.exists());
}
