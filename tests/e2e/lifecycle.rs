//! Day-2 operations (issue 21): deployment lifecycle (`agen deploy` named after the bundle,
//! `scale`, `history`, `rollback`, `rm`) on a real Hub and Nest, and restarts of `agen up`
//! that leave no debris behind.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use agen_tests::{
    agen_bin, cli, free_port, mcp_json, wait_for, write_bundle, FakeModel, HubProcess, Peers, Proc,
};
use serde_json::{json, Value};

/// A bundle with no tool servers (instances start in a moment); `prompt` makes versions.
fn bundle(dir: &Path, prompt: &str) {
    write_bundle(
        dir,
        &[
            ("mcp.json", mcp_json(&[])),
            (
                "x-agen/agent.md",
                format!(
                    "---\nname: life-agent\nmodel: openai/fake-model\nbaseUrl: http://127.0.0.1:9/v1\n---\n{prompt}\n"
                ),
            ),
        ],
    )
    .expect("write bundle");
}

fn ok(hub: &HubProcess, args: &[&str]) -> String {
    let out = hub.cli(args).unwrap();
    assert!(
        out.status.success(),
        "agen {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn history(hub: &HubProcess, name: &str) -> Vec<Value> {
    hub.cli_json(&["history", name, "-o", "json"])
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn digest(hub: &HubProcess, name: &str) -> String {
    let list = hub.cli_json(&["ps", "-o", "json"]).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {list}"))["bundle_digest"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn running_of(hub: &HubProcess, name: &str) -> Vec<Value> {
    hub.instances()
        .unwrap()
        .into_iter()
        .filter(|i| i["deployment"] == name && i["state"] == "running")
        .collect()
}

#[test]
fn deploy_scale_history_rollback_and_rm_without_the_bundle_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let dir = tmp.path().join("bundle");

    // No --name: the deployment is named after the bundle.
    bundle(&dir, "Version one.");
    ok(&hub, &["deploy", dir.to_str().unwrap(), "--wait"]);
    let d1 = digest(&hub, "life-agent");
    bundle(&dir, "Version two.");
    ok(&hub, &["deploy", dir.to_str().unwrap(), "--wait"]);
    let d2 = digest(&hub, "life-agent");
    assert_ne!(d1, d2);

    // Scale without the folder: the running instance stays, one more starts.
    std::fs::remove_dir_all(&dir).unwrap();
    let before: Vec<String> = running_of(&hub, "life-agent")
        .iter()
        .map(|i| i["instance"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(before.len(), 1);
    ok(&hub, &["scale", "life-agent", "2", "--wait"]);
    let after = running_of(&hub, "life-agent");
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(
        after.iter().any(|i| i["instance"] == before[0].as_str()),
        "scaling did not restart {}: {after:?}",
        before[0]
    );

    let h = history(&hub, "life-agent");
    let rows: Vec<(u64, String, u64, String, bool)> = h
        .iter()
        .map(|r| {
            (
                r["generation"].as_u64().unwrap(),
                r["bundle_digest"].as_str().unwrap().to_owned(),
                r["replicas"].as_u64().unwrap(),
                r["change"].as_str().unwrap().to_owned(),
                r["current"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            (1, d1.clone(), 1, "deploy".into(), false),
            (2, d2.clone(), 1, "deploy".into(), false),
            (3, d2.clone(), 2, "scale".into(), true),
        ]
    );
    for r in &h {
        let by = r["deployed_by"].as_str().unwrap();
        assert!(by.starts_with("admin (") && by.contains('@'), "{r}");
        assert!(r["created_at"].is_string(), "{r}");
    }
    let table = ok(&hub, &["history", "life-agent"]);
    assert!(table.starts_with("GENERATION"), "{table}");
    assert_eq!(table.lines().count(), 4, "{table}");

    // Rollback with no generation: back to the previous bundle, replicas kept.
    ok(&hub, &["rollback", "life-agent", "--wait"]);
    assert_eq!(digest(&hub, "life-agent"), d1);
    assert_eq!(running_of(&hub, "life-agent").len(), 2);
    // ... and to a named generation.
    let v = hub
        .cli_json(&[
            "rollback",
            "life-agent",
            "--to-generation",
            "2",
            "-o",
            "json",
        ])
        .unwrap();
    assert_eq!(v["bundle_digest"], d2.as_str());
    assert_eq!(v["generation"], 5);
    let h = history(&hub, "life-agent");
    let changes: Vec<&str> = h.iter().map(|r| r["change"].as_str().unwrap()).collect();
    assert_eq!(
        changes,
        vec![
            "deploy",
            "deploy",
            "scale",
            "rollback to generation 1",
            "rollback to generation 2"
        ]
    );
    let out = hub
        .cli(&["rollback", "life-agent", "--to-generation", "99"])
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "an unknown generation");

    // rm: the deployment and its instances go (its history stays: see day_two.rs).
    ok(&hub, &["rm", "life-agent", "--yes"]);
    assert_eq!(
        hub.cli_json(&["ps", "-o", "json"]).unwrap(),
        Value::Array(vec![])
    );
    hub.wait_instances(
        "the removed deployment's instances to end",
        Duration::from_secs(30),
        |l| !l.iter().any(|i| i["deployment"] == "life-agent"),
    )
    .unwrap();
    let lost = hub
        .instances()
        .unwrap()
        .iter()
        .filter(|i| i["state"] == "lost")
        .count();
    assert_eq!(lost, 0);
}

/// Waits until the Nest has re-registered and an instance started by this run of `agen up`
/// (created after `since`) is running: the fleet is really up, not just its stored records.
fn wait_for_fresh_instance(config: &Path, since: chrono::DateTime<chrono::Utc>) {
    let json = |args: &[&str]| -> Option<Vec<Value>> {
        let out = cli(config, args).ok()?;
        serde_json::from_slice::<Value>(&out.stdout)
            .ok()?
            .as_array()
            .cloned()
    };
    wait_for(
        "a fresh running instance on a ready Nest",
        Duration::from_secs(60),
        || {
            let nests = json(&["nests", "-o", "json"])?;
            if !nests.iter().all(|n| n["state"] == "ready") {
                return None;
            }
            json(&["ps", "--all", "-o", "json"])?
                .iter()
                .any(|i| {
                    i["state"] == "running"
                        && i["created_at"]
                            .as_str()
                            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                            .is_some_and(|t| t >= since)
                })
                .then_some(())
        },
    )
    .unwrap();
}

/// `agen up --deploy DIR` on a fixed port and data dir, its log appended to `log`.
fn start_up(data: &Path, config: &Path, port: u16, dir: &Path, log: &Path) -> Proc {
    let mut cmd = Command::new(agen_bin());
    cmd.args([
        "up",
        "--run-as-self",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--deploy",
    ])
    .arg(dir)
    .arg("--data-dir")
    .arg(data)
    .env("AGEN_CONFIG", config)
    .env("RUST_LOG", "info");
    Proc::spawn("agen up", cmd, log).unwrap()
}

#[test]
fn restarting_agen_up_three_times_leaves_no_lost_instances_and_rollouts_finish_in_seconds() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let config = tmp.path().join("config.toml");
    let log = tmp.path().join("up.log");
    let dir = tmp.path().join("debris");
    bundle(&dir, "Version one.");
    let port = free_port();
    let deployed = |n: usize| {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        (log.matches("agen up: deployed life-agent").count() >= n).then_some(())
    };
    for round in 1..=3 {
        let since = chrono::Utc::now();
        let mut up = start_up(&data, &config, port, &dir, &log);
        wait_for(
            &format!("agen up (start {round}) to deploy"),
            Duration::from_secs(90),
            || deployed(round),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", up.log_text()));
        wait_for_fresh_instance(&config, since);
        up.stop(Duration::from_secs(25));
    }
    let up = start_up(&data, &config, port, &dir, &log);
    wait_for(
        "agen up (start 4) to deploy",
        Duration::from_secs(90),
        || deployed(4),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", up.log_text()));

    let states = |list: &[Value]| -> Vec<String> {
        list.iter()
            .map(|i| i["state"].as_str().unwrap_or("").to_owned())
            .collect()
    };
    let ps = |args: &[&str]| -> Value {
        let out = cli(&config, args).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let list = ps(&["ps", "--all", "-o", "json"]);
    let list = list.as_array().unwrap();
    assert_eq!(
        states(list).iter().filter(|s| *s == "lost").count(),
        0,
        "no lost instance after three restarts: {list:?}"
    );

    // A rollout of a new version finishes in seconds, not after a 120 s timeout.
    bundle(&dir, "Version two.");
    let started = Instant::now();
    let out = cli(
        &config,
        &[
            "deploy",
            dir.to_str().unwrap(),
            "--wait",
            "--timeout",
            "45s",
        ],
    )
    .unwrap();
    assert!(
        out.status.success(),
        "rollout after restarts: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(45), "the rollout took {took:?}");
    let list = ps(&["ps", "--all", "-o", "json"]);
    let list = list.as_array().unwrap();
    let of_it: Vec<&Value> = list
        .iter()
        .filter(|i| i["deployment"] == "life-agent")
        .collect();
    let running = of_it.iter().filter(|i| i["state"] == "running").count();
    let lost = states(list).iter().filter(|s| *s == "lost").count();
    assert_eq!((running, lost), (1, 0), "{list:?}");
    let nests = ps(&["nests", "-o", "json"]);
    let nests = nests.as_array().unwrap();
    assert_eq!(nests.len(), 1, "one Nest, not one per restart: {nests:?}");
    assert_eq!(nests[0]["state"], "ready");
}

#[test]
fn a_nest_that_stops_gracefully_leaves_its_instances_stopped_not_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let mut nest = hub.nest("leaver", &[], &[]).unwrap();
    let dir = tmp.path().join("bundle");
    bundle(&dir, "Version one.");
    ok(&hub, &["deploy", dir.to_str().unwrap(), "--wait"]);
    let id = running_of(&hub, "life-agent")[0]["instance"]
        .as_str()
        .unwrap()
        .to_owned();

    nest.proc.stop(Duration::from_secs(25));
    // Well within the Nest ttl (3 s in the harness): the Hub was told, not left to guess.
    let list = hub
        .wait_instances(
            "the instance of the stopped nest to show as stopped",
            Duration::from_secs(10),
            |l| {
                l.iter()
                    .any(|i| i["instance"] == id.as_str() && i["state"] == "stopped")
            },
        )
        .unwrap();
    let lost = list.iter().filter(|i| i["state"] == "lost").count();
    assert_eq!(lost, 0, "{list:?}");
    assert!(
        nest.proc
            .log_text()
            .contains("told the hub this nest is leaving"),
        "{}",
        nest.proc.log_text()
    );
}

#[test]
fn a_nest_told_to_stop_lets_its_running_run_finish_and_takes_no_new_one() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("drainer", &[], &[]).unwrap();
    let (_model, log) = deploy_slowpoke(&hub, tmp.path());
    let first = ok(&hub, &["submit", "slowpoke", "one"]).trim().to_string();
    let slow_starts = || slow_starts(&log);
    wait_for("the slow call to start", Duration::from_secs(60), || {
        (slow_starts() == 1).then_some(())
    })
    .unwrap();

    // SIGTERM while the call runs: the Nest drains (the Hub sends it nothing new) and stops
    // only once its run finished.
    let stopping = std::thread::spawn(move || {
        let mut nest = nest;
        nest.proc.stop(Duration::from_secs(40));
        nest
    });
    std::thread::sleep(Duration::from_millis(1500));
    let second = ok(&hub, &["submit", "slowpoke", "two"]).trim().to_string();
    let nest = stopping.join().unwrap();

    let q = hub.cli_json(&["query", &first, "-o", "json"]).unwrap();
    assert_eq!(q["state"], "succeeded", "{q}\n{}", nest.proc.log_text());
    assert_eq!(
        q["attempt"], 1,
        "finished where it ran, never handed over: {q}"
    );
    assert_eq!(q["outcome"]["result"], "finished after the slow call");
    let log_text = nest.proc.log_text();
    assert!(
        log_text.contains("nest drained: every run finished"),
        "{log_text}"
    );
    assert!(
        log_text.contains("told the hub this nest is leaving"),
        "{log_text}"
    );
    let q2 = hub.cli_json(&["query", &second, "-o", "json"]).unwrap();
    assert_eq!(
        (q2["state"].as_str(), q2["attempt"].as_u64()),
        (Some("queued"), Some(0)),
        "a draining nest takes no new run: {q2}"
    );
    let (ran, lost) = (slow_starts(), usize::from(q["state"] != "succeeded"));
    assert_eq!((ran, lost), (1, 0), "the call ran once, nothing lost");
}

/// Deploys `slowpoke`, whose one tool call (`meta_slow`, read-only) takes 4 s; returns the
/// fake model and the tool server's log of calls.
fn deploy_slowpoke(hub: &HubProcess, tmp: &Path) -> (FakeModel, std::path::PathBuf) {
    let log = tmp.join("meta.jsonl");
    let model = FakeModel::start(
        &tmp.join("model"),
        &json!({"steps": [
            {"tool_calls": [{"name": "meta_slow", "arguments": {"seconds": 4}}]},
            {"reply": "finished after the slow call"}
        ]}),
    )
    .unwrap();
    let dir = tmp.join("slowpoke");
    write_bundle(
        &dir,
        &[
            (
                "x-agen/agent.md",
                format!(
                    "---\nname: slowpoke\nmodel: openai/fake-model\nbaseUrl: {}\n---\nBe slow.\n",
                    model.base_url()
                ),
            ),
            (
                "mcp.json",
                mcp_json(&[(
                    "meta",
                    json!({"command": Peers::python(), "args": [Peers::script("servers/meta_server.py")], "env": {"META_LOG": log}}),
                )]),
            ),
        ],
    )
    .unwrap();
    ok(hub, &["deploy", dir.to_str().unwrap(), "--wait"]);
    (model, log)
}

/// How often `meta_slow` started, by the tool server's log.
fn slow_starts(log: &Path) -> usize {
    crate::delegates::meta_events(log)
        .iter()
        .filter(|e| e["tool"] == "slow" && e["event"] == "started")
        .count()
}

#[test]
fn drain_with_a_deadline_lets_a_running_run_finish_then_moves_the_instance() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _a = hub.nest("a", &[], &[]).unwrap();
    let _b = hub.nest("b", &[], &[]).unwrap();
    ok(&hub, &["nests", "cordon", "b"]);
    let (_model, log) = deploy_slowpoke(&hub, tmp.path());
    ok(&hub, &["nests", "uncordon", "b"]);
    assert_eq!(running_of(&hub, "slowpoke")[0]["nest"], "a");
    let task = ok(&hub, &["submit", "slowpoke", "one"]).trim().to_string();
    wait_for("the slow call to start", Duration::from_secs(60), || {
        (slow_starts(&log) == 1).then_some(())
    })
    .unwrap();

    ok(&hub, &["nests", "drain", "a", "--deadline", "60s"]);
    let done = hub
        .cli_json(&["wait", &task, "-o", "json", "--timeout", "60s"])
        .unwrap();
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["attempt"], 1, "it finished where it ran: {done}");
    assert_eq!(done["nest"], "a", "{done}");
    wait_for("the instance to move to b", Duration::from_secs(60), || {
        running_of(&hub, "slowpoke")
            .iter()
            .any(|i| i["nest"] == "b" && i["healthy"] == true)
            .then_some(())
    })
    .unwrap();
    let (ran, lost) = (slow_starts(&log), usize::from(done["state"] != "succeeded"));
    assert_eq!((ran, lost), (1, 0), "the call ran once, nothing lost");
}

/// `agen nest` joined to `hub` with its data in `dir`, named `name` (or by default).
fn spawn_nest(hub: &HubProcess, dir: &Path, name: Option<&str>) -> Proc {
    std::fs::create_dir_all(dir).unwrap();
    let mut cmd = Command::new(agen_bin());
    cmd.args([
        "nest",
        "--hub",
        &hub.url(),
        "--join",
        &hub.join_token().unwrap(),
    ])
    .arg("--data-dir")
    .arg(dir)
    .arg("--run-as-self")
    .env("RUST_LOG", "info");
    if let Some(n) = name {
        cmd.args(["--name", n]);
    }
    let log = dir.with_extension("log");
    Proc::spawn("nest", cmd, &log).unwrap()
}

#[test]
fn nests_on_one_host_are_named_host_then_host_hash_and_a_held_name_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    let a_dir = tmp.path().join("nest-a");
    let b_dir = tmp.path().join("nest-b");
    let _a = spawn_nest(&hub, &a_dir, None);
    wait_for("the first nest", Duration::from_secs(30), || {
        hub.nests()
            .ok()?
            .iter()
            .any(|n| n["name"] == host.as_str())
            .then_some(())
    })
    .unwrap();
    let _b = spawn_nest(&hub, &b_dir, None);
    let expected_b = {
        use sha2::Digest;
        let d = sha2::Sha256::digest(b_dir.as_os_str().as_encoded_bytes());
        format!("{host}-{}", &hex::encode(d)[..6])
    };
    wait_for("the second nest", Duration::from_secs(30), || {
        hub.nests()
            .ok()?
            .iter()
            .any(|n| n["name"] == expected_b.as_str() && n["state"] == "ready")
            .then_some(())
    })
    .unwrap();

    // An explicit name held by a live Nest is refused, and says so.
    let c = spawn_nest(&hub, &tmp.path().join("nest-c"), Some(&host));
    wait_for(
        "the refusal in the third nest's log",
        Duration::from_secs(30),
        || {
            c.log_text()
                .contains("is held by the live nest")
                .then_some(())
        },
    )
    .unwrap();
    let nests = hub.nests().unwrap();
    let mut names: Vec<&str> = nests.iter().filter_map(|n| n["name"].as_str()).collect();
    names.sort();
    let mut want = vec![host.as_str(), expected_b.as_str()];
    want.sort();
    assert_eq!(names, want, "{nests:?}");
}

#[test]
fn cordon_keeps_placements_off_a_nest_and_drain_moves_its_instances_away() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _a = hub.nest("nest-a", &[], &[]).unwrap();
    let _b = hub.nest("nest-b", &[], &[]).unwrap();
    ok(&hub, &["nests", "cordon", "nest-b"]);
    let cordoned: Vec<(String, bool)> = hub
        .nests()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_owned(),
                n["cordoned"].as_bool().unwrap(),
            )
        })
        .collect();
    assert!(cordoned.contains(&("nest-b".into(), true)), "{cordoned:?}");
    assert!(cordoned.contains(&("nest-a".into(), false)), "{cordoned:?}");
    let table = ok(&hub, &["nests"]);
    assert!(table.contains("ready,cordoned"), "{table}");

    // Spread would put one replica on each Nest: the cordon keeps both on nest-a.
    let dir = tmp.path().join("bundle");
    bundle(&dir, "Version one.");
    ok(
        &hub,
        &["deploy", dir.to_str().unwrap(), "--replicas", "2", "--wait"],
    );
    let on = |nest: &str| {
        running_of(&hub, "life-agent")
            .iter()
            .filter(|i| i["nest"] == nest)
            .count()
    };
    assert_eq!((on("nest-a"), on("nest-b")), (2, 0));

    // Drain nest-a: its instances move to nest-b (uncordoned again).
    ok(&hub, &["nests", "uncordon", "nest-b"]);
    ok(&hub, &["nests", "drain", "nest-a"]);
    hub.wait_instances(
        "both replicas running on nest-b",
        Duration::from_secs(60),
        |l| {
            let running_b = l
                .iter()
                .filter(|i| i["nest"] == "nest-b" && i["state"] == "running")
                .count();
            let left_on_a = l.iter().filter(|i| i["nest"] == "nest-a").count();
            running_b == 2 && left_on_a == 0
        },
    )
    .unwrap();
    let a = hub
        .nests()
        .unwrap()
        .into_iter()
        .find(|n| n["name"] == "nest-a")
        .unwrap();
    assert_eq!(a["cordoned"], true, "a drained nest stays cordoned: {a}");
    let out = hub.cli(&["nests", "drain", "no-such-nest"]).unwrap();
    assert_eq!(out.status.code(), Some(4));
}
