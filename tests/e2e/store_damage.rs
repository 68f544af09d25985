//! A Hub whose store lost acknowledged data, as the fault, in `db/events.log` of a stopped Hub
//! with tasks finished and in flight: bytes flipped in one record of a task in flight, or the
//! last 4 KiB cut off. The real `agen hub` refuses to start with exit code 65 (the file, the
//! offset and the tasks named; `STATUS=` sent to systemd), `agen hub verify` (both
//! `--data-dir` placements; of the running Hub before, through `VerifyStore`) exits 1 naming
//! them, `agen hub repair` keeps every other task and writes its report; the Hub then serves:
//! the touched tasks end `failed` (`history_lost`), every other task succeeds (those in flight
//! by resuming), and no charge (a counting tool server's side effect) runs twice. (The store's
//! own tests cover every other fault position, more cuts, a deleted log and sled's files:
//! `hub/src/store/integrity_tests.rs`.)

use std::collections::BTreeSet;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agen_tests::{agen_bin, wait_for, HubProcess};

use crate::chaos::{assert_safe, fleet};

/// The records of the event log: where each starts and ends, and the task it belongs to (a
/// task event's key, a run event's `task_id`; the file's format: the magic line and a 24-byte
/// header, then records `len crc op table key_len key value`).
fn records(log: &Path) -> Vec<(u64, u64, String)> {
    let bytes = std::fs::read(log).unwrap();
    let mut at = 18 + 24;
    let mut found = Vec::new();
    while at + 14 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let table = bytes[at + 9];
        let key_len = u32::from_le_bytes(bytes[at + 10..at + 14].try_into().unwrap()) as usize;
        let key = &bytes[at + 14..at + 14 + key_len];
        let value = &bytes[at + 14 + key_len..at + 8 + len];
        let task = if table == 2 {
            String::from_utf8_lossy(key.split(|b| *b == 0).next().unwrap()).into_owned()
        } else {
            serde_json::from_slice::<serde_json::Value>(value).unwrap()["task_id"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        found.push((at as u64, (at + 8 + len) as u64, task));
        at += 8 + len;
    }
    found
}

/// Runs `agen hub` on `data_dir` until it exits (it must, refusing): its code, its stderr and
/// what it told systemd.
fn start_refused(data_dir: &Path, port: u16) -> (Option<i32>, String, String) {
    let sock_path = data_dir.parent().unwrap().join("notify.sock");
    let _ = std::fs::remove_file(&sock_path);
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_nonblocking(true).unwrap();
    let mut child = Command::new(agen_bin())
        .args(["hub", "--data-dir"])
        .arg(data_dir)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("NOTIFY_SOCKET", &sock_path)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the hub did not exit on a damaged store");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let mut notified = String::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = sock.recv(&mut buf) {
        notified.push_str(&String::from_utf8_lossy(&buf[..n]));
        notified.push('\n');
    }
    (status.code(), stderr, notified)
}

fn agen(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(agen_bin()).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What is done to the stopped Hub's event log.
enum Fault {
    /// 8 bytes of the second record of the first task in flight.
    Flip,
    /// The last 4 KiB.
    CutTail,
}

#[test]
fn a_damaged_event_log_is_refused_with_65_and_repair_fails_only_the_touched_task() {
    campaign(Fault::Flip);
}

#[test]
fn a_cut_event_log_is_refused_with_65_and_repair_fails_only_the_touched_tasks() {
    campaign(Fault::CutTail);
}

fn campaign(fault: Fault) {
    let mut f = fleet(&["n1"], 1, 4, 6.0, 0);
    let finished: Vec<String> = (0..2).map(|i| f.submit(&format!("done {i}"))).collect();
    let c = f.settle(&finished, Duration::from_secs(90));
    assert_eq!(c.succeeded, 2, "{c:?}");
    let in_flight: Vec<String> = (0..3).map(|i| f.submit(&format!("flying {i}"))).collect();
    wait_for("3 charges in flight", Duration::from_secs(60), || {
        let charges = f.charges();
        in_flight
            .iter()
            .all(|t| charges.contains_key(t))
            .then_some(())
    })
    .unwrap();
    let data_dir = f.hub.dir.join("hub");
    let port = f.hub.port;
    // While it runs, the Hub holds the store: verify asks it (VerifyStore, admin).
    let out = f
        .hub
        .cli(&["hub", "verify", "--data-dir", data_dir.to_str().unwrap()])
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("intact"), "{text}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("verified through it"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    f.hub.proc.stop(Duration::from_secs(20));

    let log = data_dir.join("db").join("events.log");
    let recs = records(&log);
    let (at, touched): (u64, BTreeSet<String>) = match fault {
        Fault::Flip => {
            let (start, _, task) = recs
                .iter()
                .filter(|(_, _, t)| *t == in_flight[0])
                .nth(1)
                .cloned()
                .expect("a second record of the task");
            let mut bytes = std::fs::read(&log).unwrap();
            for b in &mut bytes[start as usize + 60..start as usize + 68] {
                *b ^= 0xa5;
            }
            std::fs::write(&log, &bytes).unwrap();
            (start, BTreeSet::from([task]))
        }
        Fault::CutTail => {
            let len = std::fs::metadata(&log).unwrap().len();
            let cut = len - 4096;
            std::fs::OpenOptions::new()
                .write(true)
                .open(&log)
                .unwrap()
                .set_len(cut)
                .unwrap();
            // The tasks with records in the cut part, and every task in flight: any of them
            // may have had events there (which, the cut file cannot say).
            let mut touched: BTreeSet<String> = recs
                .iter()
                .filter(|(_, end, _)| *end > cut)
                .map(|(_, _, t)| t.clone())
                .collect();
            touched.extend(in_flight.iter().cloned());
            (cut, touched)
        }
    };

    let (code, stderr, notified) = start_refused(&data_dir, port);
    assert_eq!(code, Some(65), "stderr:\n{stderr}");
    let at_byte = format!("at byte {at}");
    let mut needles = vec![
        "events.log",
        at_byte.as_str(),
        "agen hub repair",
        "agen hub verify",
    ];
    needles.extend(touched.iter().map(String::as_str));
    for needle in needles {
        assert!(stderr.contains(needle), "{needle:?} not in:\n{stderr}");
    }
    assert!(
        notified.contains("STATUS=refusing to start"),
        "systemd was told: {notified:?}"
    );

    let dir_arg = data_dir.to_str().unwrap();
    for args in [
        ["hub", "verify", "--data-dir", dir_arg],
        ["hub", "--data-dir", dir_arg, "verify"],
    ] {
        let (code, out, err) = agen(&args);
        assert_eq!(code, Some(1), "{args:?}: {out}{err}");
        assert!(out.contains("DAMAGED"), "{out}");
        for t in &touched {
            assert!(out.contains(t.as_str()), "{t} not in {out}");
        }
    }
    let (code, out, err) = agen(&["hub", "repair", "--data-dir", dir_arg]);
    assert_eq!(code, Some(0), "{out}{err}");
    let report = std::fs::read_dir(&data_dir)
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with("repair-"))
        .expect("a repair report in the data dir")
        .path();
    let text = std::fs::read_to_string(&report).unwrap();
    let all: Vec<String> = finished.iter().chain(&in_flight).cloned().collect();
    let kept = all.len() - touched.len();
    for t in &touched {
        assert!(
            text.contains(&format!("failed (history_lost): {t}")),
            "{text}"
        );
    }
    assert!(text.contains(&format!("{kept} tasks kept")), "{text}");
    let (code, out, _) = agen(&["hub", "verify", "--data-dir", dir_arg]);
    assert_eq!(code, Some(0), "after the repair: {out}");

    f.hub = HubProcess::start_on(&f.hub.dir, port, "3s").unwrap();
    let c = f.settle(&all, Duration::from_secs(120));
    assert_safe(&f, &c);
    for t in &touched {
        let failed = f.query(t).unwrap();
        assert_eq!(failed["state"], "failed", "{failed}");
        assert!(
            failed.to_string().contains("history_lost"),
            "the touched task says why: {failed}"
        );
    }
    // kept = before − touched: every other task succeeded, those in flight by resuming.
    assert_eq!(c.succeeded, kept, "{c:?}");
    eprintln!(
        "damaged event log: 1 refusal (exit 65), {} tasks before, {} touched, {} kept and succeeded, charged twice {}",
        all.len(),
        touched.len(),
        c.succeeded,
        c.charged_2_or_more
    );
}

/// The event log deleted, sled's files deleted, sled's log cut in half, each in a copy of a
/// stopped Hub's data dir that holds 3 queued tasks: `agen hub` exits 65 naming the file,
/// `agen hub verify` exits 1, `agen hub repair` names the tasks it failed or lost in its report
/// and the Hub then starts.
#[test]
fn a_deleted_log_or_deleted_or_cut_sled_files_are_refused_with_65_and_repaired() {
    let tmp = tempfile::tempdir().unwrap();
    let mut hub = HubProcess::start(tmp.path()).unwrap();
    let bundle = tmp.path().join("bundle");
    agen_tests::write_bundle(
        &bundle,
        &[
            ("mcp.json", agen_tests::mcp_json(&[])),
            (
                "x-agen/agent.md",
                "---\nname: idle\nmodel: openai/fake-model\nbaseUrl: http://127.0.0.1:9\n---\nYou wait.\n"
                    .to_string(),
            ),
        ],
    )
    .unwrap();
    let out = hub.cli(&["deploy", bundle.to_str().unwrap()]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tasks: Vec<String> = (0..3)
        .map(|i| {
            let out = hub.cli(&["submit", "idle", &format!("t{i}")]).unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        })
        .collect();
    let port = hub.port;
    hub.proc.stop(Duration::from_secs(20));
    let pristine = tmp.path().join("hub");
    let mut refusals = 0;
    for (name, file) in [
        ("the event log deleted", "events.log"),
        ("sled's files deleted", "db"),
        ("sled's log cut in half", "db"),
    ] {
        let root = tmp.path().join(format!("fault-{refusals}"));
        std::fs::create_dir_all(&root).unwrap();
        let data_dir = root.join("hub");
        let copied = Command::new("cp")
            .arg("-a")
            .arg(&pristine)
            .arg(&data_dir)
            .status()
            .unwrap();
        assert!(copied.success());
        let db = data_dir.join("db");
        match name {
            "the event log deleted" => std::fs::remove_file(db.join("events.log")).unwrap(),
            "sled's files deleted" => {
                std::fs::remove_file(db.join("db")).unwrap();
                std::fs::remove_file(db.join("conf")).unwrap();
            }
            _ => {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(db.join("db"))
                    .unwrap();
                let len = f.metadata().unwrap().len();
                f.set_len(len / 2).unwrap();
            }
        }
        let (code, stderr, _) = start_refused(&data_dir, port);
        assert_eq!(code, Some(65), "{name}: {stderr}");
        refusals += 1;
        let named = db.join(file);
        assert!(
            stderr.contains(named.to_str().unwrap()),
            "{name}: {named:?} not in {stderr}"
        );
        let dir_arg = data_dir.to_str().unwrap();
        let (code, out, err) = agen(&["hub", "verify", "--data-dir", dir_arg]);
        assert_eq!(code, Some(1), "{name}: {out}{err}");
        let (code, out, err) = agen(&["hub", "repair", "--data-dir", dir_arg]);
        assert_eq!(code, Some(0), "{name}: {out}{err}");
        for t in &tasks {
            assert!(
                out.contains(t.as_str()),
                "{name}: {t} not in the repair's report:\n{out}"
            );
        }
        let (code, out, _) = agen(&["hub", "verify", "--data-dir", dir_arg]);
        assert_eq!(code, Some(0), "{name}: after the repair: {out}");
        let mut fresh = HubProcess::start_on(&root, port, "3s").unwrap();
        fresh.proc.stop(Duration::from_secs(20));
    }
    eprintln!("deleted or cut store files: 3 faults, {refusals} refused (exit 65), 0 served");
}
