//! `agen bench fleet` at a tiny size (issue 39): 20 simulated Nests (real mTLS clients with
//! certificates of their own) × 5 instances against a real `agen hub` the command starts, 40
//! tasks whose runs each make one side-effecting call, and the Nest holding the most runs
//! killed mid-run. The JSON report must show every task succeeded, none lost, no side effect
//! run twice, the killed Nest's instances placed again and its runs resumed elsewhere. The big
//! runs are in BENCHMARKS.md.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agen_tests::agen_bin;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::Deserialize;

/// The parts of the report this test reads (the command's `-o json`).
#[derive(Debug, Deserialize)]
struct Report {
    join: Join,
    placement: Placement,
    tasks: Tasks,
    kill: Kill,
    queries: Queries,
}

#[derive(Debug, Deserialize)]
struct Join {
    registered: usize,
    all_ready_seconds: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct Placement {
    replicas: u32,
    placed: u64,
    all_ready_seconds: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct Tasks {
    submitted: usize,
    succeeded: usize,
    lost: usize,
    twice: usize,
    executed: usize,
    effect_unknown: u64,
    dispatches: u64,
    submit_to_start_p99_ms: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct Kill {
    nests_killed: usize,
    instances_affected: usize,
    runs_in_flight: usize,
    runs_resumed: usize,
    replaced_seconds: Option<f64>,
    resumed_finished_seconds: Option<f64>,
    returned_seconds: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct Queries {
    agen_nests_ms: Option<f64>,
    agen_ps_all_ms: Option<f64>,
    list_tasks_first_page_ms: Option<f64>,
}

/// Kills the simulator's process group (its Hub included) unless it ended.
struct Group(u32);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = killpg(Pid::from_raw(self.0 as i32), Signal::SIGKILL);
    }
}

#[test]
fn the_fleet_simulator_kills_a_nest_mid_run_and_every_task_succeeds_with_no_effect_run_twice() {
    let tmp = tempfile::tempdir().unwrap();
    let stdout = tmp.path().join("report.json");
    let stderr = tmp.path().join("bench.log");
    let mut child = Command::new(agen_bin())
        .args([
            "bench",
            "fleet",
            "--nests",
            "20",
            "--instances-per-nest",
            "5",
        ])
        .args(["--tasks", "40", "--task-rate", "40", "--run-time", "2s"])
        .args([
            "--kill-percent",
            "5",
            "--hold",
            "2s",
            "--timeout",
            "60s",
            "-o",
            "json",
        ])
        // The simulator's folder (Hub data, Nest identities) lands in the test's.
        .env("TMPDIR", tmp.path())
        .env("AGEN_CONFIG", tmp.path().join("client.toml"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let _group = Group(child.id());
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "agen bench fleet did not end within 120 s; its log:\n{}",
            std::fs::read_to_string(&stderr).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let log = std::fs::read_to_string(&stderr).unwrap_or_default();
    assert!(
        status.success(),
        "agen bench fleet failed ({status}):\n{log}"
    );
    let text = std::fs::read_to_string(&stdout).unwrap();
    let r: Report = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}\n{log}"));

    assert_eq!(r.join.registered, 20, "{text}");
    assert!(r.join.all_ready_seconds.is_some(), "{text}");
    assert_eq!(
        (r.placement.replicas, r.placement.placed),
        (100, 100),
        "{text}"
    );
    assert!(r.placement.all_ready_seconds.is_some(), "{text}");

    // Every task succeeded, none lost, no side effect made twice; each made once unless a
    // resumed attempt found it started and not ended (reported effect_unknown, not redone).
    let t = &r.tasks;
    assert_eq!(
        (t.submitted, t.succeeded, t.lost, t.twice),
        (40, 40, 0, 0),
        "{text}"
    );
    assert!(
        t.executed <= 40 && t.executed as u64 + t.effect_unknown >= 40,
        "{text}"
    );
    assert!(
        t.dispatches >= 40 && t.submit_to_start_p99_ms.is_some(),
        "{text}"
    );

    // The Nest with the most runs was killed mid-run: its instances were placed again, its
    // runs resumed elsewhere and finished, and it came back.
    let k = &r.kill;
    assert_eq!((k.nests_killed, k.instances_affected), (1, 5), "{text}");
    assert!(k.runs_in_flight >= 1, "{text}");
    assert_eq!(k.runs_resumed, k.runs_in_flight, "{text}");
    assert!(k.replaced_seconds.is_some(), "{text}");
    assert!(k.resumed_finished_seconds.is_some(), "{text}");
    assert!(k.returned_seconds.is_some(), "{text}");

    let q = &r.queries;
    assert!(
        q.agen_nests_ms.is_some()
            && q.agen_ps_all_ms.is_some()
            && q.list_tasks_first_page_ms.is_some(),
        "{text}"
    );
}

/// A Hub started with a low soft open-file limit raises it to the hard one (each Nest holds a
/// connection; the units set `LimitNOFILE`).
#[test]
fn the_hub_raises_its_soft_open_file_limit_to_the_hard_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("prlimit");
    cmd.arg("--nofile=256:")
        .arg(agen_bin())
        .args(["hub", "--data-dir"])
        .arg(tmp.path().join("hub"))
        .args(["--listen", "127.0.0.1:0"])
        .env("AGEN_CONFIG", tmp.path().join("client.toml"));
    let hub = agen_tests::Proc::spawn("hub", cmd, &tmp.path().join("hub.log")).unwrap();
    agen_tests::wait_for("the hub to listen", Duration::from_secs(60), || {
        tmp.path().join("hub/client.toml").exists().then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {}", hub.log_text()));
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", hub.pid())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    // "Max open files  SOFT  HARD  files"
    let (soft, hard) = (f[3], f[4]);
    assert_eq!(soft, hard, "{line}");
    assert_ne!(soft, "256", "{line}");
}
