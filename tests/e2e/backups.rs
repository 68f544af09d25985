//! Backups that run themselves and can be trusted (issue "the Hub's store never loses what it
//! acknowledged", item 3): sealed snapshots on a schedule and on demand, refused when tampered
//! with, cut short or opened with another key, and a restore that never repeats a side effect
//! (a new store epoch: runs in flight at the snapshot resume, runs it never heard of are
//! fenced). Ends with counts from the counting tool server.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use agen_tests::{agen_bin, wait_for, HubProcess};

use crate::chaos::{fleet, tail};

fn agen(args: &[&str]) -> Output {
    Command::new(agen_bin())
        .args(args)
        .env_remove("AGEN_SNAPSHOT_KEY_FILE")
        .output()
        .unwrap()
}

#[track_caller]
fn succeeds(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `agen hub verify-snapshot FILE [--snapshot-key-file KEY]`: (exit code, stderr).
fn verify(file: &Path, key: Option<&Path>) -> (i32, String) {
    let mut args = vec!["hub", "verify-snapshot", s(file)];
    if let Some(k) = key {
        args.extend(["--snapshot-key-file", s(k)]);
    }
    let out = agen(&args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn snapshots_in(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "snapshot"))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

#[test]
fn scheduled_snapshots_are_sealed_kept_n_deep_and_refused_when_tampered_with() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("snapshot.key");
    succeeds(&agen(&["hub", "snapshot-key", "new", s(&key)]));
    let meta = std::fs::metadata(&key).unwrap();
    assert_eq!((meta.len(), meta.permissions().mode() & 0o777), (32, 0o600));
    let again = agen(&["hub", "snapshot-key", "new", s(&key)]);
    assert!(!again.status.success(), "a key is never replaced");
    let other = tmp.path().join("other.key");
    succeeds(&agen(&["hub", "snapshot-key", "new", s(&other)]));

    // A schedule without a dir or a key is a configuration error (exit 64).
    let out = agen(&[
        "hub",
        "--data-dir",
        s(&tmp.path().join("x")),
        "--snapshot-every",
        "1s",
    ]);
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = tmp.path().join("snapshots");
    let hub = HubProcess::start_with_args(
        tmp.path(),
        agen_tests::free_port(),
        "3s",
        &[
            "--snapshot-every",
            "1s",
            "--snapshot-keep",
            "2",
            "--snapshot-dir",
            s(&dir),
            "--snapshot-key-file",
            s(&key),
        ],
    )
    .unwrap();
    // Three snapshots written, two kept.
    let first = wait_for("two snapshots", Duration::from_secs(30), || {
        let found = snapshots_in(&dir);
        (found.len() == 2).then(|| found[0].clone())
    })
    .unwrap();
    wait_for("the oldest replaced", Duration::from_secs(30), || {
        (!first.exists()).then_some(())
    })
    .unwrap();
    let kept = snapshots_in(&dir);
    assert!(kept.len() <= 2, "{kept:?}");
    let newest = kept.last().unwrap().clone();
    assert_eq!(
        std::fs::metadata(&newest).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // On demand too; without a key it is refused before anything is written.
    let on_demand = tmp.path().join("now.snapshot");
    let out = hub.cli(&["hub", "snapshot", s(&on_demand)]).unwrap();
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!on_demand.exists());
    succeeds(
        &hub.cli(&[
            "hub",
            "snapshot",
            s(&on_demand),
            "--snapshot-key-file",
            s(&key),
        ])
        .unwrap(),
    );

    let mut refused = 0;
    for file in [&newest, &on_demand] {
        let bytes = std::fs::read(file).unwrap();
        let (code, err) = verify(file, Some(&key));
        assert_eq!(code, 0, "{err}");
        let cases: Vec<(&str, Vec<u8>, &Path, &str)> = vec![
            ("no key", bytes.clone(), file, "give its snapshot key"),
            ("another key", bytes.clone(), &other, "another snapshot key"),
            (
                "a flipped byte",
                {
                    let mut b = bytes.clone();
                    let mid = b.len() / 2;
                    b[mid] ^= 0x01;
                    b
                },
                &key,
                "tampered",
            ),
            (
                "cut short",
                bytes[..bytes.len() - 100].to_vec(),
                &key,
                "cut short",
            ),
            (
                "bytes appended",
                [bytes.clone(), b"x".to_vec()].concat(),
                &key,
                "after its last frame",
            ),
        ];
        for (what, content, with, expected) in cases {
            let bad = tmp.path().join("bad.snapshot");
            std::fs::write(&bad, &content).unwrap();
            let key_arg = (what != "no key").then_some(with);
            let (code, err) = verify(&bad, key_arg);
            assert_eq!(code, 1, "{what}: {err}");
            assert!(err.contains(expected), "{what}: {err}");
            refused += 1;
            // A restore of it is refused too, and writes no store.
            let into = tmp.path().join(format!("restore-{refused}"));
            let mut args = vec!["hub", "--data-dir", s(&into), "restore", s(&bad)];
            if let Some(k) = key_arg {
                args.extend(["--snapshot-key-file", s(k)]);
            }
            let out = agen(&args);
            assert!(!out.status.success(), "{what}: restored");
            assert!(!into.join("db").exists(), "{what}: a store was written");
        }
    }
    eprintln!(
        "snapshot counts: kept {}, verified 2, refused {refused}",
        kept.len()
    );
    assert_eq!(refused, 10);
}

#[test]
fn a_restored_hub_never_charges_twice() {
    let mut f = fleet(&["nest-a", "nest-b"], 2, 4, 2.0, 0);
    let key = f.root.join("snapshot.key");
    succeeds(&agen(&["hub", "snapshot-key", "new", s(&key)]));
    let snapshot = f.root.join("hub.snapshot");

    // One task is in the middle of its charge when the snapshot is taken.
    let in_flight = f.submit("charge before the snapshot");
    wait_for("the charge to start", Duration::from_secs(60), || {
        f.charges().contains_key(&in_flight).then_some(())
    })
    .unwrap();
    succeeds(
        &f.hub
            .cli(&[
                "hub",
                "snapshot",
                s(&snapshot),
                "--snapshot-key-file",
                s(&key),
            ])
            .unwrap(),
    );

    // Ten charges after it, run to the end; three more still running at the restore.
    let after: Vec<String> = (0..10).map(|i| f.submit(&format!("charge {i}"))).collect();
    let c = f.settle(&after, Duration::from_secs(120));
    assert_eq!(c.succeeded, 10, "{c:?}");
    let running: Vec<String> = (0..3)
        .map(|i| f.submit(&format!("late charge {i}")))
        .collect();
    wait_for("the late charges to start", Duration::from_secs(60), || {
        let charges = f.charges();
        running
            .iter()
            .all(|t| charges.contains_key(t))
            .then_some(())
    })
    .unwrap();
    f.settle(std::slice::from_ref(&in_flight), Duration::from_secs(60));

    // The Hub stops; the snapshot is restored into its data dir; the same Nests reconnect.
    f.hub.proc.stop(Duration::from_secs(10));
    let data_dir = f.hub.dir.join("hub");
    succeeds(&agen(&[
        "hub",
        "--data-dir",
        s(&data_dir),
        "restore",
        s(&snapshot),
        "--snapshot-key-file",
        s(&key),
    ]));
    f.hub = HubProcess::start_on(&f.hub.dir, f.hub.port, "3s").unwrap();
    wait_for("both nests back", Duration::from_secs(30), || {
        let n = f.hub.nests().ok()?;
        (n.iter().filter(|n| n["state"] == "ready").count() == 2).then_some(())
    })
    .unwrap();
    let c = f.settle(std::slice::from_ref(&in_flight), Duration::from_secs(90));
    assert_eq!(
        c.succeeded,
        1,
        "the task in flight at the snapshot resumes: {c:?}\n{}",
        tail(&f.hub_log(), 40)
    );
    // It resumed from what the snapshot holds: its charge was interrupted, so the model was
    // told `effect_unknown` instead of it being charged again.
    let resumed = f.query(&in_flight).unwrap();
    assert!(
        resumed.to_string().contains("effect_unknown"),
        "{resumed}\n{}",
        tail(&f.hub_log(), 40)
    );
    // Long enough for any wrong re-dispatch (a leased run not held is re-sent after 2 s).
    std::thread::sleep(Duration::from_secs(5));

    let charges = f.charges();
    let all: Vec<&String> = std::iter::once(&in_flight)
        .chain(&after)
        .chain(&running)
        .collect();
    let twice = all
        .iter()
        .filter(|t| charges.get(**t).copied().unwrap_or(0) > 1)
        .count();
    let once = all
        .iter()
        .filter(|t| charges.get(**t).copied().unwrap_or(0) == 1)
        .count();
    let unknown_after_restore = after
        .iter()
        .chain(&running)
        .filter(|t| f.query(t).is_none())
        .count();
    let log = f.hub_log();
    eprintln!(
        "restore counts: tasks {}, charged once {once}, charged twice {twice}, unknown to the restored hub {unknown_after_restore}",
        all.len()
    );
    assert_eq!(
        twice,
        0,
        "a charge ran twice: {charges:?}\n{}",
        tail(&log, 60)
    );
    assert_eq!(once, all.len(), "{charges:?}");
    assert_eq!(
        unknown_after_restore, 13,
        "tasks after the snapshot are not in it"
    );
    assert!(
        log.contains("restored from a snapshot") && log.contains("requeued=1"),
        "{}",
        tail(&log, 40)
    );
}
