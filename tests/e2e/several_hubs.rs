//! Several Hubs on one PostgreSQL database (issue 38, items 1–2): one identity stored once in
//! the database however many Hubs start together; one leader at a time by the leader lease;
//! a follower that leads after the leader is killed -9 carries every side-effecting run on
//! (0 lost, 0 charged twice, 0 stuck, 0 cancelled, all on attempt 1); a deposed leader (paused
//! past its lease, then resumed) lands no write of its epoch in the database and stops; a
//! schedule fired by the leader keeps firing from the follower that leads after a kill -9 at a
//! fire time (no slot twice, none lost outside the failover window).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use agen_tests::postgres::Cluster;
use agen_tests::{agen_bin, free_port, wait_for, HubProcess, Proc};

use crate::chaos::{assert_safe, fleet_on_with, tail, wait_charges, Fleet};

/// The leader lease the tests run with (the default is 5 s).
pub(crate) const LEASE: &str = "3s";

/// A Hub of the group in `root` (data in `root/hub`), started but not waited for (metrics on
/// a port of its own, see [`metrics_port`]).
pub(crate) fn spawn_hub(root: &Path, url: &str, key: &Path) -> HubProcess {
    spawn_hub_at(root, url, key, free_port(), &[], "hub.log")
}

/// [`spawn_hub`] on `port` with more environment variables, logging to `root/log`.
pub(crate) fn spawn_hub_at(
    root: &Path,
    url: &str,
    key: &Path,
    port: u16,
    env: &[(&str, &str)],
    log: &str,
) -> HubProcess {
    std::fs::create_dir_all(root).unwrap();
    let extra: Vec<String> = [
        "--store",
        url,
        "--identity-key-file",
        &key.to_string_lossy(),
        "--leader-lease",
        LEASE,
        "--metrics-listen",
        "127.0.0.1:0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut cmd = Command::new(agen_bin());
    cmd.args(["hub", "--data-dir"])
        .arg(root.join("hub"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--nest-ttl", "3s"])
        .args(&extra)
        .env("AGEN_CONFIG", root.join("client.toml"))
        .env("RUST_LOG", "info")
        .envs(env.iter().copied());
    let proc = Proc::spawn("hub", cmd, &root.join(log)).unwrap();
    HubProcess {
        proc,
        dir: root.to_owned(),
        port,
        nest_ttl: "3s".into(),
        extra_args: extra,
        extra_env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        nest_hub: None,
        nest_env: Vec::new(),
    }
}

/// Whether `hub` leads (its log says it took the lease).
pub(crate) fn leads(hub: &HubProcess) -> bool {
    hub.proc.log_text().contains("hub leads")
}

fn identity_files(root: &Path) -> Vec<Vec<u8>> {
    [
        "tls/ca.pem",
        "tls/ca.key",
        "admin-token",
        "join-token",
        "secret.key",
    ]
    .iter()
    .map(|f| std::fs::read(root.join("hub").join(f)).unwrap_or_default())
    .collect()
}

pub(crate) fn epoch(cluster: &Cluster, db: &str) -> u64 {
    cluster
        .psql(db, "SELECT epoch FROM agen_leader WHERE id = 1")
        .parse()
        .unwrap()
}

/// `agen hub status --store URL`: (exit code, stdout).
fn hub_status(url: &str) -> (Option<i32>, String) {
    let out = Command::new(agen_bin())
        .args(["hub", "status", "--store", url])
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
}

/// A fresh identity key file (32 random bytes, as `agen hub` creates it).
pub(crate) fn key_file(dir: &Path) -> PathBuf {
    let path = dir.join("identity.key");
    let mut bytes = [0u8; 32];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").unwrap(),
        &mut bytes,
    )
    .unwrap();
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Three Hubs start at once on an empty database: one identity is stored and every data dir
/// holds it; exactly one Hub leads; killed -9, another leads within the lease and answers
/// with the same admin token and CA.
#[test]
fn three_hubs_started_together_share_one_identity_and_one_leader() {
    let cluster = agen_tests::postgres::shared();
    let db = cluster.database("ha_identity");
    let url = cluster.url(&db);
    let tmp = tempfile::tempdir().unwrap();
    let key = key_file(tmp.path());
    let mut hubs: Vec<HubProcess> = (0..3)
        .map(|i| spawn_hub(&tmp.path().join(format!("h{i}")), &url, &key))
        .collect();
    let leader = wait_for("one hub to lead", Duration::from_secs(30), || {
        hubs.iter().position(leads)
    })
    .unwrap();
    hubs[leader].wait_ready().unwrap();
    wait_for(
        "every hub to have the identity",
        Duration::from_secs(30),
        || {
            hubs.iter()
                .all(|h| h.proc.log_text().contains("hub follows") || leads(h))
                .then_some(())
        },
    )
    .unwrap();
    let rows = cluster.psql(&db, "SELECT count(*) FROM agen_identity");
    assert_eq!(rows, "1", "one identity row");
    let first = identity_files(&hubs[0].dir);
    assert!(
        first.iter().all(|f| !f.is_empty()),
        "identity files written"
    );
    for h in &hubs[1..] {
        assert_eq!(
            identity_files(&h.dir),
            first,
            "every hub has the same identity"
        );
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        hubs.iter().filter(|h| leads(h)).count(),
        1,
        "exactly one hub leads"
    );
    let before = epoch(cluster, &db);
    let status = hub_status(&url);
    assert_eq!(status.0, Some(0), "agen hub status: {}", status.1);
    assert!(
        status
            .1
            .contains(&format!("leader {} (epoch {before},", hubs[leader].url())),
        "agen hub status names the leader and its epoch: {}",
        status.1
    );

    // The leader dies: another takes the lease over within it and serves the same identity.
    hubs[leader].proc.kill9();
    let killed = Instant::now();
    let next = wait_for("a follower to lead", Duration::from_secs(20), || {
        hubs.iter()
            .enumerate()
            .position(|(i, h)| i != leader && leads(h))
    })
    .unwrap();
    hubs[next].wait_ready().unwrap();
    let took = killed.elapsed();
    eprintln!("a follower serves {took:?} after the leader was killed -9");
    assert!(took < Duration::from_secs(5), "took over in {took:?}");
    assert_eq!(epoch(cluster, &db), before + 1, "the epoch moved on by one");
    let status = hub_status(&url);
    assert!(
        status.1.contains(&format!(
            "leader {} (epoch {},",
            hubs[next].url(),
            before + 1
        )),
        "agen hub status names the new leader: {}",
        status.1
    );
    // The old leader's admin token works on the new one (one identity).
    let out = agen_tests::cli(&hubs[next].dir.join("client.toml"), &["nests"]).unwrap();
    assert!(out.status.success());
    let token = std::fs::read_to_string(hubs[leader].dir.join("hub/admin-token")).unwrap();
    let cfg = tmp.path().join("old-token.toml");
    std::fs::write(
        &cfg,
        format!(
            "hub = \"{}\"\nca_file = \"{}\"\ntoken = \"{}\"\n",
            hubs[next].url(),
            hubs[leader].dir.join("hub/tls/ca.pem").display(),
            token.trim()
        ),
    )
    .unwrap();
    let out = agen_tests::cli(&cfg, &["nests"]).unwrap();
    assert!(
        out.status.success(),
        "the first leader's token and CA work on the next: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Clients that know every Hub reach the leader, the dead one first in the list: by
    // `--hub` (AGEN_HUB) with commas, and by the config's `hubs`, which replaces `hub`.
    let all: Vec<String> = hubs.iter().map(|h| h.url()).collect();
    let dead_first = [all[leader].clone()]
        .into_iter()
        .chain(
            all.iter()
                .enumerate()
                .filter(|(i, _)| *i != leader)
                .map(|(_, u)| u.clone()),
        )
        .collect::<Vec<_>>();
    let out = agen_tests::cli(&cfg, &["nests", "--hub", &dead_first.join(",")]).unwrap();
    assert!(
        out.status.success(),
        "--hub URL1,URL2,URL3 finds the leader: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = dead_first
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    std::fs::write(
        &cfg,
        format!(
            "hub = \"{}\"\nhubs = [{listed}]\nca_file = \"{}\"\ntoken = \"{}\"\n",
            all[leader],
            hubs[leader].dir.join("hub/tls/ca.pem").display(),
            token.trim()
        ),
    )
    .unwrap();
    let out = agen_tests::cli(&cfg, &["nests"]).unwrap();
    assert!(
        out.status.success(),
        "the config's hubs replace its (dead) hub: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A leader stopped gracefully gives its lease up: the last follower leads well inside
    // the lease (3 s) instead of waiting for it to expire.
    let last = (0..3).find(|i| *i != leader && *i != next).unwrap();
    let stopping = Instant::now();
    hubs[next].proc.stop(Duration::from_secs(20));
    wait_for("the last follower to lead", Duration::from_secs(20), || {
        leads(&hubs[last]).then_some(())
    })
    .unwrap();
    let took = stopping.elapsed();
    eprintln!("the last follower led {took:?} after the leader was stopped");
    assert!(
        hubs[next]
            .proc
            .log_text()
            .contains("gave the leader lease up"),
        "the stopped leader gave its lease up"
    );
    assert_eq!(epoch(cluster, &db), before + 2);
}

/// Hub A leads, B follows; a fleet whose Nests know both. Returns the fleet (on A), B.
pub(crate) fn group(tmp: &Path, url: &str, runs: u32, seconds: f64) -> (Fleet, HubProcess) {
    let key = key_file(tmp);
    let a_root = tmp.join("a");
    let mut a = spawn_hub(&a_root, url, &key);
    wait_for("hub a to lead", Duration::from_secs(30), || {
        leads(&a).then_some(())
    })
    .unwrap();
    a.wait_ready().unwrap();
    let b = spawn_hub(&tmp.join("b"), url, &key);
    wait_for("hub b to follow", Duration::from_secs(30), || {
        b.proc.log_text().contains("hub follows").then_some(())
    })
    .unwrap();
    a.nest_hub = Some(format!("{},{}", a.url(), b.url()));
    let f = fleet_on_with(a, a_root, &["nest-a", "nest-b"], &[], 2, runs, seconds, 0);
    (f, b)
}

/// Every task of `tasks` as the Hub reports it: (on attempt 1, cancelled, effect_unknown).
pub(crate) fn outcomes(f: &Fleet, tasks: &[String]) -> (usize, usize, usize) {
    let (mut first, mut cancelled, mut unknown) = (0, 0, 0);
    for t in tasks {
        let Some(v) = f.query(t) else { continue };
        first += usize::from(v["attempt"].as_u64() == Some(1));
        cancelled += usize::from(v["state"] == "cancelled");
        unknown += usize::from(
            v["outcome"]["result"]
                .as_str()
                .is_some_and(|r| r.contains("effect_unknown")),
        );
    }
    (first, cancelled, unknown)
}

/// Trials of the leader-kill test (`AGEN_HA_TRIALS` overrides; `tests/soak/` runs more).
fn trials() -> usize {
    std::env::var("AGEN_HA_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// The leader is killed -9 with 20 side-effecting runs in flight: the follower leads within
/// 5 s, the Nests find it, and every task succeeds on attempt 1 with its charge run once.
#[test]
fn leader_killed_with_side_effecting_runs_in_flight_a_follower_carries_every_run_on() {
    let n = 20;
    let cluster = agen_tests::postgres::shared();
    for trial in 0..trials() {
        let db = cluster.database("ha_failover");
        let url = cluster.url(&db);
        let tmp = tempfile::tempdir().unwrap();
        let (mut f, b) = group(tmp.path(), &url, 10, 3.0);
        let tasks: Vec<String> = (0..n)
            .map(|i| f.submit(&format!("charge customer {i}")))
            .collect();
        wait_charges(&f, n);
        f.hub.proc.kill9();
        let killed = Instant::now();
        wait_for("the follower to lead", Duration::from_secs(20), || {
            leads(&b).then_some(())
        })
        .unwrap();
        let led = killed.elapsed();
        b.wait_ready().unwrap();
        eprintln!("trial {trial}: the follower led {led:?} after the kill");
        f.hub = b;
        let c = f.settle(&tasks, Duration::from_secs(120));
        let (first, cancelled, unknown) = outcomes(&f, &tasks);
        assert_safe(&f, &c);
        let context = || format!("{c:?}\nhub log (tail):\n{}", tail(&f.hub_log(), 60));
        assert!(led < Duration::from_secs(5), "led after {led:?}");
        assert_eq!(c.succeeded, n, "every task succeeded: {}", context());
        assert_eq!(c.charged_1, n, "every charge ran once: {}", context());
        assert_eq!(cancelled, 0, "none cancelled: {}", context());
        assert_eq!(first, n, "every run stayed on attempt 1: {}", context());
        assert_eq!(unknown, 0, "none effect_unknown: {}", context());
    }
}

/// Every record written under `epoch`, as digests of (table, key, value).
fn written_under(cluster: &Cluster, db: &str, epoch: u64) -> BTreeSet<String> {
    cluster
        .psql(
            db,
            &format!(
                "SELECT md5(tbl || encode(key, 'hex') || encode(value, 'hex')) FROM agen_records WHERE epoch = {epoch}"
            ),
        )
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The leader is paused (SIGSTOP) past its lease while runs are in flight; the follower leads
/// and carries them on; the old leader resumed (SIGCONT) lands no write of its epoch in the
/// database (asserted on the rows), stops with exit 75, and no charge runs twice.
#[test]
fn a_deposed_leader_resumed_after_its_lease_writes_nothing() {
    let n = 10;
    let cluster = agen_tests::postgres::shared();
    let db = cluster.database("ha_deposed");
    let url = cluster.url(&db);
    let tmp = tempfile::tempdir().unwrap();
    let (mut f, b) = group(tmp.path(), &url, 5, 4.0);
    let old = epoch(cluster, &db);
    let tasks: Vec<String> = (0..n)
        .map(|i| f.submit(&format!("charge customer {i}")))
        .collect();
    wait_charges(&f, n);
    let pid = nix::unistd::Pid::from_raw(f.hub.proc.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    wait_for("the follower to lead", Duration::from_secs(20), || {
        leads(&b).then_some(())
    })
    .unwrap();
    b.wait_ready().unwrap();
    assert_eq!(
        epoch(cluster, &db),
        old + 1,
        "the follower took epoch {}",
        old + 1
    );
    let before = written_under(cluster, &db, old);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let mut a = std::mem::replace(&mut f.hub, b);
    let status = wait_for("the deposed hub to stop", Duration::from_secs(30), || {
        a.proc.child.try_wait().ok().flatten()
    })
    .unwrap();
    let a_log = a.proc.log_text();
    let c = f.settle(&tasks, Duration::from_secs(120));
    let after = written_under(cluster, &db, old);
    let landed: Vec<&String> = after.difference(&before).collect();
    assert!(
        landed.is_empty(),
        "{} writes of the old epoch landed after it was deposed\nold hub log (tail):\n{}",
        landed.len(),
        tail(&a_log, 40)
    );
    assert_eq!(
        status.code(),
        Some(75),
        "the deposed hub stopped with exit 75: {}",
        tail(&a_log, 40)
    );
    assert_safe(&f, &c);
    let (first, cancelled, _) = outcomes(&f, &tasks);
    assert_eq!(c.succeeded, n, "every task succeeded: {c:?}");
    assert_eq!(c.charged_1, n, "every charge ran once: {c:?}");
    assert_eq!(cancelled, 0, "none cancelled");
    assert_eq!(first, n, "every run stayed on attempt 1");
    a.proc.kill9();
}

/// The fencing itself, at the store: Hub A leads and writes; once Hub B took the lease over,
/// every write A attempts (a thread writing in a loop across the takeover) is refused by the
/// database, A knows it is deposed and cannot renew, and no row of A's epoch appears after
/// the takeover.
#[test]
fn writes_of_an_old_epoch_are_refused_by_the_database_from_the_takeover_on() {
    use agen_hub::store::{PgStore, Store, Table};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let cluster = agen_tests::postgres::shared();
    let db = cluster.database("ha_fence");
    let url = cluster.url(&db);
    let a = Arc::new(PgStore::open(&url).unwrap());
    let b = PgStore::open(&url).unwrap();
    let lease = Duration::from_secs(1);
    let old = a.take_lease("a", "https://a", lease).unwrap().unwrap();
    a.put(Table::Tasks, b"before", b"1").unwrap();
    assert_eq!(
        b.take_lease("b", "https://b", lease).unwrap(),
        None,
        "a leads"
    );
    // A writes as fast as it can while B waits for the lease to expire and takes it.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (a, stop) = (a.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut ok = 0u32;
            let mut i = 0u32;
            while !stop.load(Ordering::SeqCst) && i < 100_000 {
                if a.put(Table::Tasks, format!("w{i}").as_bytes(), b"x")
                    .is_ok()
                {
                    ok += 1;
                }
                i += 1;
            }
            ok
        })
    };
    let new = wait_for("b to take the lease", Duration::from_secs(10), || {
        b.take_lease("b", "https://b", lease).unwrap()
    })
    .unwrap();
    assert_eq!(new, old + 1);
    let at_takeover = written_under(cluster, &db, old);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let ok = writer.join().unwrap();
    let after = written_under(cluster, &db, old);
    assert_eq!(
        after, at_takeover,
        "no write of epoch {old} landed after the takeover"
    );
    assert_eq!(
        after.len() as u32,
        ok + 1,
        "every row of epoch {old} is a write A was told succeeded"
    );
    assert!(a.deposed(), "a knows it is deposed");
    assert!(
        a.put(Table::Tasks, b"late", b"x").is_err(),
        "a late write is refused"
    );
    assert!(!a.renew_lease("a", old, lease).unwrap(), "a cannot renew");
    assert!(a.heal().is_err(), "healing does not undo the fence");
    b.put(Table::Tasks, b"by-b", b"1").unwrap();
    assert_eq!(
        cluster.psql(
            &db,
            "SELECT epoch FROM agen_records WHERE key = 'by-b'::bytea"
        ),
        new.to_string()
    );
    assert_eq!(
        cluster.psql(
            &db,
            "SELECT count(*) FROM agen_records WHERE key = 'late'::bytea"
        ),
        "0"
    );
}

/// A `*/2 * * * * *` schedule fired by leader A; A is killed -9 at a fire time and follower B,
/// taking the lead, reads the schedule and its last slot from the database and fires on: no
/// slot has two tasks, the slots A fired keep their one task, every slot outside the failover
/// window (from just before the kill to just after B answered) fired, and the window's slots
/// fired at most one task together (catch-up latest).
#[test]
fn a_schedule_keeps_firing_across_a_leader_kill_9_each_slot_once() {
    use crate::limits::{api, runtime};
    use crate::triggers::{create, deploy_idle, fired_at, sleep_to_slot};
    let cluster = agen_tests::postgres::shared();
    let db = cluster.database("ha_schedules");
    let url = cluster.url(&db);
    let tmp = tempfile::tempdir().unwrap();
    let key = key_file(tmp.path());
    let mut a = spawn_hub(&tmp.path().join("a"), &url, &key);
    wait_for("hub a to lead", Duration::from_secs(30), || {
        leads(&a).then_some(())
    })
    .unwrap();
    a.wait_ready().unwrap();
    let b = spawn_hub(&tmp.path().join("b"), &url, &key);
    wait_for("hub b to follow", Duration::from_secs(30), || {
        b.proc.log_text().contains("hub follows").then_some(())
    })
    .unwrap();
    deploy_idle(&a, &tmp.path().join("bundle"));
    let id = create(&a, "*/2 * * * * *", "UTC")["schedule_id"]
        .as_str()
        .unwrap()
        .to_string();
    let rt = runtime();
    let mut on_a = rt.block_on(api(&a));
    wait_for("two slots fired by a", Duration::from_secs(20), || {
        (rt.block_on(fired_at(&mut on_a, &id)).len() >= 2).then_some(())
    })
    .unwrap();
    let slot = sleep_to_slot(0);
    let at_kill = rt.block_on(fired_at(&mut on_a, &id));
    let killed = chrono::Utc::now();
    a.proc.kill9();
    wait_for("hub b to lead", Duration::from_secs(20), || {
        leads(&b).then_some(())
    })
    .unwrap();
    b.wait_ready().unwrap();
    let up = chrono::Utc::now();
    let mut on_b = rt.block_on(api(&b));
    let mut after = BTreeMap::new();
    wait_for("two slots fired by b", Duration::from_secs(30), || {
        after = rt.block_on(fired_at(&mut on_b, &id));
        (after.keys().filter(|s| **s > up).count() >= 2).then_some(())
    })
    .unwrap();
    let ms = chrono::Duration::milliseconds;
    let window = |t: chrono::DateTime<chrono::Utc>| t > killed - ms(500) && t <= up + ms(500);
    let twice = after.values().filter(|t| t.len() > 1).count();
    let by_b = after
        .values()
        .filter(|c| c[0] > killed.timestamp_millis())
        .count();
    let (first, last) = (*after.keys().next().unwrap(), *after.keys().last().unwrap());
    let (mut lost, mut lost_outside, mut t) = (0, 0, first);
    while t <= last {
        if !after.contains_key(&t) {
            lost += 1;
            lost_outside += usize::from(!window(t));
        }
        t += ms(2000);
    }
    // Fired late for the window: by B, more than a pass after its time.
    let caught_up = after
        .iter()
        .filter(|(s, c)| {
            **s <= up && c[0] > killed.timestamp_millis() && c[0] - s.timestamp_millis() > 700
        })
        .count();
    eprintln!(
        "kill at slot {slot} ({killed}), b answered {up} ({:?} later): slots fired by a {}, by b {by_b}, twice {twice}, lost in the window {}, lost outside it {lost_outside}, caught up {caught_up}",
        (up - killed).to_std().unwrap_or_default(),
        at_kill.len(),
        lost - lost_outside,
    );
    assert_eq!((twice, lost_outside), (0, 0), "{after:?}");
    assert!(caught_up <= 1, "{after:?}");
    for (s, created) in &at_kill {
        assert_eq!(after.get(s), Some(created), "slot {s} kept its one task");
    }
    assert!(by_b >= 2, "{after:?}");
    let per_window = (up - killed).num_milliseconds() / 2000 + 2;
    assert!(i64::try_from(lost).unwrap() <= per_window, "{after:?}");
    drop(b);
}
