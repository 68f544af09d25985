//! A full disk, again and again (issue "the Hub's store never loses what it acknowledged"): the
//! Hub's data dir, then a Nest's, is a small tmpfs filled and freed 10 times in a row, 1–3 s
//! apart, with runs in flight. Counts at the end: tasks acknowledged, lost, stuck, charged 0, 1,
//! 2+ times, task events acknowledged before a fill and missing after, Nests lost, watchdog
//! pings during the longest full stretch. Root only (mount); CI holds the disk full ~8 s once,
//! `tests/soak/chaos.sh` 60 s (`AGEN_DISK_FULL_HOLD_SECS`).

use std::collections::BTreeMap;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agen_tests::{wait_for, HubProcess};

use crate::chaos::{assert_safe, fill, fleet_on, tail, Api, Fleet, Submitter, Tmpfs};

/// Fill-and-free rounds per data dir.
const ROUNDS: usize = 10;
/// How long the longest full stretch lasts in CI (`AGEN_DISK_FULL_HOLD_SECS` overrides).
const LONG_HOLD_SECS: u64 = 8;
/// The watchdog interval the Hub is given: systemd would kill it after this much silence.
const WATCHDOG: Duration = Duration::from_secs(3);

fn long_hold() -> Duration {
    Duration::from_secs(
        std::env::var("AGEN_DISK_FULL_HOLD_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(LONG_HOLD_SECS),
    )
}

/// 1–3 s, differing from round to round.
fn pause(round: usize) -> Duration {
    Duration::from_millis(1_000 + (round as u64 * 737) % 2_000)
}

/// A `NOTIFY_SOCKET` the test binds, and every datagram the Hub sent to it, with when.
struct NotifyListener {
    path: std::path::PathBuf,
    heard: Arc<Mutex<Vec<(Instant, String)>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl NotifyListener {
    fn bind(path: &Path) -> NotifyListener {
        let sock = UnixDatagram::bind(path).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let heard = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (h, s) = (heard.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(n) = sock.recv(&mut buf) {
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    h.lock().unwrap().push((Instant::now(), text));
                }
            }
        });
        NotifyListener {
            path: path.to_owned(),
            heard,
            stop,
        }
    }

    /// When each `WATCHDOG=1` arrived within `[from, to]`.
    fn pings(&self, from: Instant, to: Instant) -> Vec<Instant> {
        self.heard
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, m)| *at >= from && *at <= to && m.lines().any(|l| l == "WATCHDOG=1"))
            .map(|(at, _)| *at)
            .collect()
    }

    fn statuses(&self) -> Vec<String> {
        self.heard
            .lock()
            .unwrap()
            .iter()
            .flat_map(|(_, m)| m.lines().map(str::to_owned).collect::<Vec<_>>())
            .filter_map(|l| l.strip_prefix("STATUS=").map(str::to_owned))
            .collect()
    }
}

impl Drop for NotifyListener {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The longest silence between watchdog pings within `[from, to]` (from its ends too).
fn longest_silence(pings: &[Instant], from: Instant, to: Instant) -> Duration {
    let mut last = from;
    let mut longest = Duration::ZERO;
    for at in pings.iter().copied().chain([to]) {
        longest = longest.max(at.saturating_duration_since(last));
        last = at;
    }
    longest
}

/// `(seq, kind)` of every event of a finished task, as the Hub serves them (`WatchTask` from
/// seq 0 replays them and ends at the terminal state).
fn events(s: &Submitter, api: &mut Api, bearer: &str, task: &str) -> Vec<(u64, String)> {
    use tokio_stream::StreamExt;
    let mut req = tonic::Request::new(agen_proto::v1::WatchTaskRequest {
        namespace: "default".into(),
        task_id: task.into(),
        from_seq: 0,
        deltas: false,
    });
    req.metadata_mut()
        .insert("authorization", bearer.parse().unwrap());
    s.rt.block_on(async {
        let mut out = Vec::new();
        let Ok(resp) = api.watch_task(req).await else {
            return out;
        };
        let mut stream = resp.into_inner();
        while let Ok(Some(Ok(ev))) =
            tokio::time::timeout(Duration::from_secs(5), stream.next()).await
        {
            out.push((ev.seq, ev.kind));
        }
        out
    })
}

fn terminal(f: &Fleet, task: &str) -> bool {
    f.query(task)
        .and_then(|v| v["state"].as_str().map(str::to_owned))
        .is_some_and(|s| matches!(s.as_str(), "succeeded" | "failed" | "cancelled"))
}

/// What the fill loops end with besides the fleet's counts.
#[derive(Debug, Default)]
struct DiskCounts {
    rounds: usize,
    refused_unavailable: usize,
    events_checked: usize,
    events_lost: usize,
    nests_lost: usize,
}

#[test]
fn a_hub_whose_disk_fills_ten_times_heals_each_time_and_loses_nothing() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("fleet");
    let Some(_mount) = Tmpfs::mount(&root.join("hub"), "48m") else {
        panic!("cannot mount a tmpfs (root is needed)");
    };
    let notify = NotifyListener::bind(&tmp.path().join("notify.sock"));
    let watchdog_usec = WATCHDOG.as_micros().to_string();
    let env = [
        ("NOTIFY_SOCKET", notify.path.to_str().unwrap()),
        ("WATCHDOG_USEC", watchdog_usec.as_str()),
    ];
    let hub = HubProcess::start_with_env(&root, agen_tests::free_port(), "3s", &[], &env).unwrap();
    let mut f = fleet_on(hub, root.clone(), &["nest-a", "nest-b"], 2, 4, 0.8, 0);
    let instances_before: Vec<String> = ids(&f);
    let s = Submitter::new();
    let (mut api, bearer) = s.connect(&f.hub);
    let filler = f.hub.dir.join("hub/filler");
    let mut acknowledged = Vec::new();
    // Events of finished tasks as served before a fill: the same afterwards.
    let mut seen: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
    let mut c = DiskCounts::default();
    let mut longest_full = (Duration::ZERO, Instant::now(), Instant::now());
    let started = Instant::now();
    for round in 0..ROUNDS {
        for i in 0..3 {
            acknowledged.push(s.submit(&mut api, &bearer, &format!("round {round} task {i}")));
        }
        for t in &acknowledged {
            if !seen.contains_key(t) && terminal(&f, t) {
                seen.insert(t.clone(), events(&s, &mut api, &bearer, t));
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        fill(&filler);
        let full_at = Instant::now();
        let deadline = full_at + Duration::from_secs(30);
        let refused = loop {
            match s.try_submit(&mut api, &bearer, &format!("round {round} while full")) {
                Ok(id) => acknowledged.push(id),
                Err(status) => break status,
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: no write failed on a full disk"
            );
        };
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
        c.refused_unavailable += 1;
        wait_for("health NOT_SERVING", Duration::from_secs(10), || {
            (s.serving(&f.hub) == Some(false)).then_some(())
        })
        .unwrap();
        // Reads go on while the disk is full.
        assert!(
            f.query(&acknowledged[0]).is_some(),
            "round {round}: a read failed while the disk was full"
        );
        let hold = if round == ROUNDS / 2 {
            long_hold()
        } else {
            pause(round)
        };
        std::thread::sleep(hold);
        std::fs::remove_file(&filler).unwrap();
        let freed = Instant::now();
        if freed - full_at > longest_full.0 {
            longest_full = (freed - full_at, full_at, freed);
        }
        wait_for("health SERVING again", Duration::from_secs(15), || {
            (s.serving(&f.hub) == Some(true)).then_some(())
        })
        .unwrap_or_else(|e| panic!("round {round}: {e}; hub log:\n{}", tail(&f.hub_log(), 60)));
        eprintln!(
            "round {round}: full {:?}, serving again {:?} after space was freed",
            freed - full_at,
            freed.elapsed()
        );
        c.rounds += 1;
        std::thread::sleep(pause(round + 3));
    }
    let counts = f.settle(&acknowledged, Duration::from_secs(120));
    assert_safe(&f, &counts);
    assert_eq!(counts.terminal, counts.acknowledged, "{counts:?}");

    // Watchdog pings throughout: never a silence systemd would kill the Hub for, and pings
    // inside the longest full stretch.
    let pings = notify.pings(started, Instant::now());
    let silence = longest_silence(&pings, started, Instant::now());
    let (full_for, from, to) = longest_full;
    let pings_while_full = notify.pings(from, to).len();
    let statuses = notify.statuses();
    assert!(
        silence < WATCHDOG,
        "the watchdog went unfed for {silence:?} (interval {WATCHDOG:?})"
    );
    assert!(
        pings_while_full as u64 >= full_for.as_secs() / WATCHDOG.as_secs(),
        "{pings_while_full} watchdog pings in a full stretch of {full_for:?}"
    );
    assert!(
        statuses
            .iter()
            .any(|s| s.starts_with("not serving: hub store")),
        "no STATUS=not serving: {statuses:?}"
    );

    // Nothing acknowledged is lost: across the fills, and across a restart after the last.
    let before_restart: BTreeMap<String, Vec<(u64, String)>> = acknowledged
        .iter()
        .map(|t| (t.clone(), events(&s, &mut api, &bearer, t)))
        .collect();
    f.hub.proc.stop(Duration::from_secs(10));
    f.hub = HubProcess::start_with_env(&root, f.hub.port, "3s", &[], &env)
        .unwrap_or_else(|e| panic!("the hub does not restart after the last fill: {e:#}"));
    let (mut api, bearer) = s.connect(&f.hub);
    for (t, before) in &before_restart {
        let after = events(&s, &mut api, &bearer, t);
        let earlier = seen.get(t).unwrap_or(before);
        c.events_checked += before.len();
        c.events_lost += before.iter().filter(|e| !after.contains(e)).count();
        c.events_lost += earlier.iter().filter(|e| !after.contains(e)).count();
        let seqs: Vec<u64> = after.iter().map(|(seq, _)| *seq).collect();
        let contiguous: Vec<u64> = (1..=after.len() as u64).collect();
        assert_eq!(seqs, contiguous, "task {t}: its events have a gap");
    }
    c.nests_lost = f.hub_log().matches("lost: ").count();
    eprintln!(
        "disk full counts (hub): {c:?}, tasks {counts:?}, watchdog pings {} (while full {pings_while_full} in {full_for:?}, longest silence {silence:?})",
        pings.len()
    );
    assert_eq!(c.events_lost, 0, "{c:?}");
    assert_eq!(
        c.nests_lost,
        0,
        "a nest was lost for the hub's disk: {c:?}\n{}",
        tail(&f.hub_log(), 60)
    );
    assert_eq!(ids(&f), instances_before, "instances were replaced");
    assert!(
        !f.hub_log().contains("Read corrupted data"),
        "{}",
        tail(&f.hub_log(), 40)
    );
}

/// The ids of the running instances, sorted.
fn ids(f: &Fleet) -> Vec<String> {
    let mut ids: Vec<String> = f
        .hub
        .instances()
        .unwrap()
        .iter()
        .filter(|i| i["state"] == "running")
        .filter_map(|i| i["instance"].as_str().map(str::to_owned))
        .collect();
    ids.sort();
    ids
}

#[test]
fn a_nest_whose_disk_fills_ten_times_keeps_running_and_loses_nothing() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("fleet");
    let Some(_mount) = Tmpfs::mount(&root.join("nests/nest-a"), "48m") else {
        panic!("cannot mount a tmpfs (root is needed)");
    };
    let hub = HubProcess::start(&root).unwrap();
    let f = fleet_on(hub, root.clone(), &["nest-a"], 1, 4, 0.8, 0);
    let nest_pid = f.nests[0].proc.pid();
    let instances_before = ids(&f);
    let filler = f.nests[0].dir.join("filler");
    let mut acknowledged = Vec::new();
    let mut c = DiskCounts::default();
    for round in 0..ROUNDS {
        for i in 0..3 {
            acknowledged.push(f.submit(&format!("round {round} task {i}")));
        }
        std::thread::sleep(Duration::from_millis(300));
        fill(&filler);
        std::thread::sleep(pause(round));
        std::fs::remove_file(&filler).unwrap();
        c.rounds += 1;
        std::thread::sleep(pause(round + 3));
    }
    let counts = f.settle(&acknowledged, Duration::from_secs(120));
    c.nests_lost = f.hub_log().matches("lost: ").count();
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(nest_pid as i32), None).is_ok();
    eprintln!("disk full counts (nest): {c:?}, tasks {counts:?}, nest alive {alive}");
    assert_safe(&f, &counts);
    assert_eq!(counts.terminal, counts.acknowledged, "{counts:?}");
    assert_eq!(counts.succeeded, counts.acknowledged, "{counts:?}");
    assert!(
        alive,
        "the nest died: {}",
        tail(&f.nests[0].proc.log_text(), 40)
    );
    assert_eq!(c.nests_lost, 0, "{c:?}\n{}", tail(&f.hub_log(), 40));
    assert_eq!(ids(&f), instances_before, "instances were replaced");
}
