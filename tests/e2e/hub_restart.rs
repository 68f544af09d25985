//! A Hub going away interrupts no run (issue 38, single Hub, local store): a real fleet (Hub,
//! two Nests, the fake model, the counting charge server) with many side-effecting runs in
//! flight while the Hub is killed -9 and restarted, or paused (SIGSTOP) past the old 2 s
//! self-fence, or stays down past the Nests' `--nest-lease`. Every test ends with counts from
//! the charge server's log and the Hub's tasks: lost, stuck, cancelled, charged twice, attempts,
//! `effect_unknown` outcomes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use agen_tests::{wait_for, HubProcess};

use crate::chaos::{assert_safe, fleet_on_with, tail, wait_charges, Counts, Fleet};

/// Runs in flight in the restart and pause tests: 2 instances × this many each.
const RUNS_PER_INSTANCE: u32 = 25;

/// What the Hub says of the tasks once they settled.
#[derive(Debug, Default, PartialEq)]
struct Outcomes {
    on_attempt_1: usize,
    effect_unknown: usize,
    cancelled: usize,
}

fn outcomes(f: &Fleet, tasks: &[String]) -> Outcomes {
    let mut o = Outcomes::default();
    for t in tasks {
        let Some(v) = f.query(t) else { continue };
        if v["attempt"].as_u64() == Some(1) {
            o.on_attempt_1 += 1;
        }
        if v["state"] == "cancelled" {
            o.cancelled += 1;
        }
        if v["outcome"]["result"]
            .as_str()
            .is_some_and(|r| r.contains("effect_unknown"))
        {
            o.effect_unknown += 1;
        }
    }
    eprintln!("outcomes: {o:?}");
    o
}

/// A Hub (nest ttl 3 s), Nests `nest-a` and `nest-b` with `nest_flags`, deployment `charge` of
/// 2 instances × `concurrency`, each charge taking `seconds`.
fn fleet(nest_flags: &[&str], concurrency: u32, seconds: f64) -> (tempfile::TempDir, Fleet) {
    fleet_with_hub(&[], nest_flags, concurrency, seconds)
}

/// [`fleet`] with more `agen hub` flags (kept across [`HubProcess::restart`]).
fn fleet_with_hub(
    hub_flags: &[&str],
    nest_flags: &[&str],
    concurrency: u32,
    seconds: f64,
) -> (tempfile::TempDir, Fleet) {
    let tmp = tempfile::tempdir().unwrap();
    let root: PathBuf = tmp.path().to_owned();
    let hub = HubProcess::start_with_args(&root, agen_tests::free_port(), "3s", hub_flags).unwrap();
    let f = fleet_on_with(
        hub,
        root,
        &["nest-a", "nest-b"],
        nest_flags,
        2,
        concurrency,
        seconds,
        0,
    );
    (tmp, f)
}

/// Submits `n` tasks and waits until every one of them is inside its charge.
fn in_flight(f: &Fleet, n: usize) -> Vec<String> {
    let tasks: Vec<String> = (0..n)
        .map(|i| f.submit(&format!("charge customer {i}")))
        .collect();
    wait_charges(f, n);
    tasks
}

/// Every task succeeded on its first attempt with its charge's real result: nothing lost,
/// stuck, cancelled, charged twice or turned into `effect_unknown`.
fn assert_uninterrupted(f: &Fleet, c: &Counts, o: &Outcomes, n: usize) {
    assert_safe(f, c);
    let context = || format!("{c:?} {o:?}\nhub log (tail):\n{}", tail(&f.hub_log(), 60));
    assert_eq!(c.succeeded, n, "every task succeeded: {}", context());
    assert_eq!(
        c.charged_1,
        n,
        "every charge ran exactly once: {}",
        context()
    );
    assert_eq!(o.cancelled, 0, "no task was cancelled: {}", context());
    assert_eq!(
        o.on_attempt_1,
        n,
        "every run stayed on attempt 1: {}",
        context()
    );
    assert_eq!(
        o.effect_unknown,
        0,
        "no completed charge became effect_unknown: {}",
        context()
    );
}

#[test]
fn a_hub_killed_and_restarted_with_runs_in_flight_interrupts_none_of_them() {
    let n = 2 * RUNS_PER_INSTANCE as usize;
    let (_tmp, mut f) = fleet(&[], RUNS_PER_INSTANCE, 3.0);
    let tasks = in_flight(&f, n);
    let killed = Instant::now();
    f.hub.proc.kill9();
    // Down for twice the old self-fence (disconnect grace 3 s − 1 s), well inside the lease.
    std::thread::sleep(Duration::from_secs(4));
    f.hub = HubProcess::start_on(&f.hub.dir, f.hub.port, &f.hub.nest_ttl.clone()).unwrap();
    eprintln!(
        "hub killed -9 and serving again after {:?}",
        killed.elapsed()
    );
    let c = f.settle(&tasks, Duration::from_secs(120));
    let o = outcomes(&f, &tasks);
    assert_uninterrupted(&f, &c, &o, n);
}

/// The same with the Hub's state in PostgreSQL (`--store postgres://…`): what the killed Hub
/// acknowledged is in the database, and the restarted Hub carries every run on.
#[test]
fn a_hub_on_postgres_killed_and_restarted_with_runs_in_flight_interrupts_none_of_them() {
    let n = 2 * RUNS_PER_INSTANCE as usize;
    let cluster = agen_tests::postgres::shared();
    let db = cluster.database("hub_restart");
    let url = cluster.url(&db);
    let (_tmp, mut f) = fleet_with_hub(&["--store", &url], &[], RUNS_PER_INSTANCE, 3.0);
    let tasks = in_flight(&f, n);
    f.hub.proc.kill9();
    std::thread::sleep(Duration::from_secs(4));
    let port = f.hub.port;
    f.hub = HubProcess::start_with_args(&f.hub.dir, port, "3s", &["--store", &url]).unwrap();
    let c = f.settle(&tasks, Duration::from_secs(120));
    let o = outcomes(&f, &tasks);
    assert_uninterrupted(&f, &c, &o, n);
    // The tasks are rows of the database, not files of the Hub's data dir.
    let stored: usize = cluster
        .psql(&db, "SELECT count(*) FROM agen_records WHERE tbl = 'tasks'")
        .parse()
        .unwrap();
    assert_eq!(stored, n, "every task is stored in PostgreSQL");
    assert!(
        !f.hub.dir.join("hub").join("db").exists(),
        "no local store was made"
    );
}

/// PostgreSQL crashes and stays down for 8 s under load: the Hub's store is broken meanwhile
/// (writes refused, health NOT_SERVING), the Nests keep their runs, and once the database is
/// back the Hub heals by itself, reloads what is durable and every task ends: 0 lost, 0
/// charged twice, 0 stuck, 0 cancelled.
#[test]
fn postgres_down_under_load_loses_nothing_and_the_hub_resumes_by_itself() {
    let n = 10;
    let cluster = agen_tests::postgres::Cluster::start(|_, _, _| String::new());
    let db = cluster.database("down");
    let url = cluster.url(&db);
    let (_tmp, f) = fleet_with_hub(&["--store", &url], &[], 5, 4.0);
    let tasks = in_flight(&f, n);
    cluster.crash_and_restart_after(Duration::from_secs(8));
    let c = f.settle(&tasks, Duration::from_secs(120));
    let o = outcomes(&f, &tasks);
    assert_safe(&f, &c);
    let context = || format!("{c:?} {o:?}\nhub log (tail):\n{}", tail(&f.hub_log(), 60));
    assert_eq!(c.succeeded, n, "every task succeeded: {}", context());
    assert_eq!(o.cancelled, 0, "no task was cancelled: {}", context());
    let log = f.hub_log();
    assert!(
        log.contains("unreachable"),
        "the Hub saw the database go: {}",
        context()
    );
    assert!(
        log.contains("hub store recovered"),
        "the Hub healed by itself: {}",
        context()
    );
}

#[test]
fn a_hub_paused_past_the_old_self_fence_interrupts_no_run() {
    let n = 2 * RUNS_PER_INSTANCE as usize;
    let (_tmp, f) = fleet(&[], RUNS_PER_INSTANCE, 3.0);
    let tasks = in_flight(&f, n);
    let pid = nix::unistd::Pid::from_raw(f.hub.proc.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // Four times the old fence (disconnect grace 3 s − 1 s), and past the Hub's nest ttl (3 s
    // + a heartbeat): neither the Nests nor the Hub may give up on the other for it.
    std::thread::sleep(Duration::from_secs(8));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let c = f.settle(&tasks, Duration::from_secs(120));
    let o = outcomes(&f, &tasks);
    assert_uninterrupted(&f, &c, &o, n);
    let fenced = f
        .nests
        .iter()
        .filter(|n| n.proc.log_text().contains("past the nest lease"))
        .count();
    assert_eq!(fenced, 0, "no nest stopped its runs");
}

#[test]
fn a_hub_down_past_the_nest_lease_has_its_runs_stopped_and_resumed_without_a_second_charge() {
    // Every charge is still running when the lease ends: its outcome is unknown.
    let n = 8;
    let (_tmp, mut f) = fleet(&["--nest-lease", "2s"], 4, 30.0);
    let tasks = in_flight(&f, n);
    f.hub.proc.kill9();
    for nest in &f.nests {
        wait_for(
            &format!("{} to stop its runs at the end of its lease", nest.name),
            Duration::from_secs(30),
            || {
                nest.proc
                    .log_text()
                    .contains("past the nest lease")
                    .then_some(())
            },
        )
        .unwrap();
    }
    f.hub = HubProcess::start_on(&f.hub.dir, f.hub.port, &f.hub.nest_ttl.clone()).unwrap();
    let c = f.settle(&tasks, Duration::from_secs(120));
    let o = outcomes(&f, &tasks);
    assert_safe(&f, &c);
    let context = || format!("{c:?} {o:?}\nhub log (tail):\n{}", tail(&f.hub_log(), 60));
    assert_eq!(
        c.succeeded,
        n,
        "every task was resumed and succeeded: {}",
        context()
    );
    assert_eq!(c.charged_1, n, "no charge ran twice: {}", context());
    assert_eq!(o.on_attempt_1, 0, "every run was resumed: {}", context());
    assert_eq!(
        o.effect_unknown,
        n,
        "a charge cut off by the lease is effect_unknown, never sent again: {}",
        context()
    );
}
