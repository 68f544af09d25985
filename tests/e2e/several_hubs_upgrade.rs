//! The zero-downtime upgrade (issue 38, README "Upgrading without downtime"): two Hubs and two
//! Nests of an "older build" (this tree speaking the protocol minor before its own, through
//! `AGEN_PROTOCOL_VERSION`) are upgraded to this build while side-effecting tasks keep coming
//! and running: the follower Hub first, then the leader (stopped gracefully, it gives its lease
//! up), then each Nest drained (SIGTERM: its runs finish) and started again on the new build.
//! Ends in counts: 0 lost, 0 charged twice, 0 stuck, 0 cancelled, 0 effect_unknown (a run
//! dispatched in the old leader's last instant may run as attempt 2; see the assertion).

use std::process::Command;
use std::time::Duration;

use agen_shared::version::Protocol;
use agen_tests::{agen_bin, free_port, wait_for, NestProcess, Proc};

use crate::chaos::{assert_safe, fleet_on_with, tail, wait_charges, Fleet};
use crate::several_hubs::{key_file, leads, outcomes, spawn_hub_at};

/// The protocol the "older build" speaks: the minor before this build's.
fn older() -> String {
    let p = Protocol::CURRENT;
    assert!(p.minor > 0, "the test needs a protocol minor above 0");
    format!("{}.{}", p.major, p.minor - 1)
}

/// `n` tasks submitted now.
fn submit(f: &Fleet, tag: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| f.submit(&format!("charge customer {tag}-{i}")))
        .collect()
}

/// Every Nest `agen nests` shows with its protocol.
fn nest_protocols(f: &Fleet) -> Vec<(String, String, String)> {
    let nests = f.hub.cli_json(&["nests", "-o", "json"]).unwrap();
    let mut out: Vec<(String, String, String)> = nests
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let s = |k: &str| n[k].as_str().unwrap_or_default().to_owned();
            (s("name"), s("state"), s("protocol_version"))
        })
        .collect();
    out.sort();
    out
}

/// Drains `nest` (SIGTERM: its runs finish, no new ones come) and starts it again on this
/// build, same name and data dir; returns once the Hub shows it ready on the new protocol.
fn upgrade_nest(f: &Fleet, nest: &mut NestProcess, hubs: &str, join: &std::path::Path) {
    nest.proc.stop(Duration::from_secs(40));
    let mut cmd = Command::new(agen_bin());
    cmd.args(["nest", "--hub", hubs, "--join-file"])
        .arg(join)
        .args(["--name", &nest.name, "--run-as-self", "--data-dir"])
        .arg(&nest.dir)
        .env("RUST_LOG", "info");
    let log = f.root.join(format!("nest-{}-new.log", nest.name));
    nest.proc = Proc::spawn(&nest.name, cmd, &log).unwrap();
    let current = Protocol::CURRENT.to_string();
    wait_for(
        &format!("nest {} on the new build", nest.name),
        Duration::from_secs(60),
        || {
            nest_protocols(f)
                .iter()
                .any(|(n, s, p)| *n == nest.name && s == "ready" && *p == current)
                .then_some(())
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\nnest log:\n{}", tail(&nest.proc.log_text(), 40)));
}

#[test]
fn hubs_then_nests_upgraded_one_by_one_interrupt_no_run() {
    let old = older();
    let old_env = [("AGEN_PROTOCOL_VERSION", old.as_str())];
    let cluster = agen_tests::postgres::shared();
    let db = cluster.database("ha_upgrade");
    let url = cluster.url(&db);
    let tmp = tempfile::tempdir().unwrap();
    let key = key_file(tmp.path());
    let (a_root, b_root) = (tmp.path().join("a"), tmp.path().join("b"));
    let (a_port, b_port) = (free_port(), free_port());

    // The older build: A leads, B follows, two Nests that know both.
    let mut a = spawn_hub_at(&a_root, &url, &key, a_port, &old_env, "hub.log");
    wait_for("hub a to lead", Duration::from_secs(30), || {
        leads(&a).then_some(())
    })
    .unwrap();
    a.wait_ready().unwrap();
    let mut b = spawn_hub_at(&b_root, &url, &key, b_port, &old_env, "hub.log");
    wait_for("hub b to follow", Duration::from_secs(30), || {
        b.proc.log_text().contains("hub follows").then_some(())
    })
    .unwrap();
    let hubs = format!("{},{}", a.url(), b.url());
    a.nest_hub = Some(hubs.clone());
    a.nest_env = vec![("AGEN_PROTOCOL_VERSION".into(), old.clone())];
    let join = a_root.join("hub/join-token");
    let mut f = fleet_on_with(a, a_root.clone(), &["nest-a", "nest-b"], &[], 2, 4, 1.0, 0);
    assert!(
        nest_protocols(&f).iter().all(|(_, _, p)| *p == old),
        "the nests speak the older protocol {old}"
    );
    let mut tasks = submit(&f, "before", 4);
    wait_charges(&f, 4);

    // 1. The follower: stopped, started on the new build.
    b.proc.stop(Duration::from_secs(20));
    let b_new = spawn_hub_at(&b_root, &url, &key, b_port, &[], "hub-new.log");
    wait_for("the new hub b to follow", Duration::from_secs(30), || {
        b_new.proc.log_text().contains("hub follows").then_some(())
    })
    .unwrap();
    tasks.extend(submit(&f, "hub-b", 4));
    wait_charges(&f, 6);

    // 2. The leader, with runs in flight: it gives its lease up, the new B leads at once.
    f.hub.proc.stop(Duration::from_secs(30));
    wait_for("the new hub b to lead", Duration::from_secs(20), || {
        leads(&b_new).then_some(())
    })
    .unwrap();
    b_new.wait_ready().unwrap();
    let old_a = std::mem::replace(&mut f.hub, b_new);
    let a_new = spawn_hub_at(&a_root, &url, &key, a_port, &[], "hub-new.log");
    wait_for("the new hub a to follow", Duration::from_secs(30), || {
        a_new.proc.log_text().contains("hub follows").then_some(())
    })
    .unwrap();
    drop(old_a);
    tasks.extend(submit(&f, "hub-a", 4));

    // 3. The Nests, one by one: drained (their runs finish) and started on the new build.
    let mut nests = std::mem::take(&mut f.nests);
    for (i, nest) in nests.iter_mut().enumerate() {
        upgrade_nest(&f, nest, &hubs, &join);
        tasks.extend(submit(&f, &format!("nest-{i}"), 3));
    }
    f.nests = nests;

    let c = f.settle(&tasks, Duration::from_secs(180));
    let (first, cancelled, unknown) = outcomes(&f, &tasks);
    let context = || format!("{c:?}\nhub log (tail):\n{}", tail(&f.hub_log(), 60));
    assert_safe(&f, &c);
    let total = tasks.len();
    assert_eq!((c.lost, c.stuck), (0, 0), "{}", context());
    assert_eq!(c.succeeded, total, "every task succeeded: {}", context());
    assert_eq!(c.charged_1, total, "every charge ran once: {}", context());
    assert_eq!(
        (cancelled, unknown),
        (0, 0),
        "none cancelled or effect_unknown: {}",
        context()
    );
    // Known gap: a run the old leader dispatched in its last instant before its graceful stop
    // can be dispatched again by the next leader as attempt 2 (its attempt 1 never started on
    // the Nest, so nothing ran twice: charged once, asserted above). Seen 1 in 18.
    eprintln!("upgrade: {first} of {total} runs stayed on attempt 1");
    assert!(
        first + 2 >= total,
        "at most the runs dispatched at the leader's stop moved on: {}",
        context()
    );
    let current = Protocol::CURRENT.to_string();
    assert!(
        nest_protocols(&f)
            .iter()
            .filter(|(_, s, _)| s == "ready")
            .all(|(_, _, p)| *p == current),
        "every ready nest speaks {current}: {:?}",
        nest_protocols(&f)
    );
    drop(a_new);
}
