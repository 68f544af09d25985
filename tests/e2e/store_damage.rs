//! A Hub whose store lost acknowledged data, as the fault: bytes flipped in one record of a
//! task in flight in `db/events.log` of a stopped Hub. The real `agen hub` refuses to start
//! with exit code 65 (the file, the offset and the task named; `STATUS=` sent to systemd),
//! `agen hub verify` (both `--data-dir` placements; of the running Hub before, through
//! `VerifyStore`) exits 1 naming it, `agen hub repair` keeps
//! every other task and writes its report; the Hub then serves: the touched task ends
//! `failed` (`history_lost`), every other task in flight resumes and succeeds, and no charge
//! (a counting tool server's side effect) runs twice. (The store's own tests cover every other
//! fault position, cut tails, a deleted log and sled's files: `hub/src/store/integrity_tests.rs`.)

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agen_tests::{agen_bin, wait_for, HubProcess};

use crate::chaos::{assert_safe, fleet};

/// Where each task event of `task` starts in the event log (the file's format: the magic line
/// and a 24-byte header, then records `len crc op table key_len key value`).
fn task_event_offsets(log: &Path, task: &str) -> Vec<u64> {
    let bytes = std::fs::read(log).unwrap();
    let mut at = 18 + 24;
    let mut found = Vec::new();
    while at + 14 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let table = bytes[at + 9];
        let key_len = u32::from_le_bytes(bytes[at + 10..at + 14].try_into().unwrap()) as usize;
        let key = &bytes[at + 14..at + 14 + key_len];
        if table == 2 && key.starts_with(task.as_bytes()) {
            found.push(at as u64);
        }
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

#[test]
fn a_damaged_event_log_is_refused_with_65_and_repair_fails_only_the_touched_task() {
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

    // One record of the first task in flight, flipped.
    let touched = in_flight[0].clone();
    let log = data_dir.join("db").join("events.log");
    let offsets = task_event_offsets(&log, &touched);
    assert!(offsets.len() >= 2, "{touched} has {offsets:?}");
    let at = offsets[1];
    let mut bytes = std::fs::read(&log).unwrap();
    for b in &mut bytes[at as usize + 60..at as usize + 68] {
        *b ^= 0xa5;
    }
    std::fs::write(&log, &bytes).unwrap();

    let (code, stderr, notified) = start_refused(&data_dir, port);
    assert_eq!(code, Some(65), "stderr:\n{stderr}");
    for needle in [
        "events.log",
        &format!("at byte {at}"),
        touched.as_str(),
        "agen hub repair",
        "agen hub verify",
    ] {
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
        assert!(out.contains("DAMAGED") && out.contains(&touched), "{out}");
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
    assert!(
        text.contains(&format!("failed (history_lost): {touched}")),
        "{text}"
    );
    assert!(text.contains("4 tasks kept"), "{text}");
    let (code, out, _) = agen(&["hub", "verify", "--data-dir", dir_arg]);
    assert_eq!(code, Some(0), "after the repair: {out}");

    f.hub = HubProcess::start_on(&f.hub.dir, port, "3s").unwrap();
    let all: Vec<String> = finished.iter().chain(&in_flight).cloned().collect();
    let c = f.settle(&all, Duration::from_secs(120));
    assert_safe(&f, &c);
    let failed = f.query(&touched).unwrap();
    assert_eq!(failed["state"], "failed", "{failed}");
    assert!(
        failed.to_string().contains("history_lost"),
        "the touched task says why: {failed}"
    );
    // kept = before − touched: every other task succeeded, in flight ones by resuming.
    assert_eq!(c.succeeded, all.len() - 1, "{c:?}");
    eprintln!(
        "damaged event log: 1 refusal (exit 65), {} tasks kept, 1 failed history_lost, charged twice {}",
        c.succeeded, c.charged_2_or_more
    );
}
