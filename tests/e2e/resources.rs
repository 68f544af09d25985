//! Resources per instance (README "Resources"): a deployment's `resources` are enforced on
//! the instance with its tool servers by the Nest's cgroups, and reserved by placement.
//!
//! The tool server is `tests/peers/servers/hog_server.py` (`grow`: allocates once, `spawn`:
//! starts sleeping processes until it cannot), which logs every call, so the tests count real
//! calls across the OOM kill and the resume.

use std::path::Path;
use std::time::Duration;

use agen_tests::{mcp_json, write_bundle, FakeModel, HubProcess, Peers};
use serde_json::{json, Value};

/// A bundle `name` with the hog server (its log at `log`) and `config` as x-agen/config.json.
fn hog_bundle(dir: &Path, model: &FakeModel, log: &Path, config: Value) {
    write_bundle(
        dir,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "hog",
                    json!({"command": Peers::python(), "args": [Peers::script("servers/hog_server.py")], "env": {"HOG_LOG": log}}),
                )]),
            ),
            (
                "x-agen/agent.md",
                format!(
                    "---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou use too much.\n",
                    model.base_url()
                ),
            ),
            ("x-agen/config.json", config.to_string()),
        ],
    )
    .unwrap();
}

fn deploy(hub: &HubProcess, dir: &Path, name: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["deploy", dir.to_str().unwrap(), "--name", name];
    args.extend_from_slice(extra);
    hub.cli(&args).unwrap()
}

fn calls(log: &Path, tool: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["tool"] == tool)
        .count()
}

fn healthy(l: &[Value], name: &str) -> bool {
    l.iter()
        .any(|i| i["deployment"] == name && i["state"] == "running" && i["healthy"] == true)
}

#[test]
fn a_tool_server_past_its_memory_limit_is_killed_said_by_ps_and_its_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("nest-a", &[], &[]).unwrap();
    let steps = json!([
        {"tool_calls": [{"name": "hog_grow", "arguments": {"mb": 600}}]},
        {"reply": "done"}
    ]);
    let model = FakeModel::start(&tmp.path().join("model"), &json!({"steps": steps})).unwrap();
    let log = tmp.path().join("hog.jsonl");
    let dir = tmp.path().join("bundle");
    hog_bundle(
        &dir,
        &model,
        &log,
        json!({"resources": {"memory": "300Mi", "pids": 200}}),
    );
    let out = deploy(&hub, &dir, "hog", &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Usage is reported: the group's memory and the tool server's own.
    let list = hub
        .wait_instances(
            "usage of the healthy instance",
            Duration::from_secs(90),
            |l| {
                l.iter().any(|i| {
                    i["deployment"] == "hog"
                        && i["healthy"] == true
                        && i["usage"]["memory_bytes"].as_u64().unwrap_or(0) > 0
                        && i["servers_usage"].as_array().is_some_and(|s| {
                            s.iter().any(|s| {
                                s["name"] == "hog" && s["memory_bytes"].as_u64().unwrap_or(0) > 0
                            })
                        })
                })
            },
        )
        .unwrap_or_else(|e| panic!("{e}\nnest log:\n{}", nest.proc.log_text()));
    let i = list.iter().find(|i| i["deployment"] == "hog").unwrap();
    assert!(i["usage"]["pids"].as_u64().unwrap_or(0) >= 2, "{i}");
    assert!(
        nest.proc
            .log_text()
            .contains("cgroup v1 (memory, cpu, cpuacct, pids)")
            || nest.proc.log_text().contains("cgroup v2"),
        "the start log says how limits are enforced:\n{}",
        nest.proc.log_text()
    );

    let out = hub.cli(&["submit", "hog", "grow"]).unwrap();
    let task = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let out = hub
        .cli(&["wait", &task, "-o", "json", "--timeout", "120s"])
        .unwrap();
    let t: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "wait: {}\nnest log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            nest.proc.log_text()
        )
    });
    assert_eq!(
        t["state"],
        "succeeded",
        "{t}\nnest log:\n{}",
        nest.proc.log_text()
    );
    assert_eq!(t["outcome"]["result"], "done", "{t}");
    assert_eq!(t["attempt"], 2, "resumed once: {t}");
    assert_eq!(calls(&log, "grow"), 2, "the killed call and its retry");

    // The killed instance keeps its count (its replacement, if listed first, has none).
    let list = hub.instances().unwrap();
    let killed: u64 = list
        .iter()
        .filter(|i| i["deployment"] == "hog")
        .map(|i| i["oom_kills"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(killed, 1, "{list:?}\nnest log:\n{}", nest.proc.log_text());
    let table = hub.cli(&["ps", "--all"]).unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("memory limit"), "{table}");
    assert!(
        nest.proc
            .log_text()
            .contains("was killed by its memory limit (300Mi, OOM)"),
        "{}",
        nest.proc.log_text()
    );
}

#[test]
fn a_fork_loop_is_bounded_by_pids_and_top_shows_the_tool_server() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("nest-a", &[], &[]).unwrap();
    let steps = json!([
        {"tool_calls": [{"name": "hog_spawn", "arguments": {"n": 300}}]},
        {"reply": "done"}
    ]);
    let record = tmp.path().join("model-requests.jsonl");
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": steps, "record": record}),
    )
    .unwrap();
    let log = tmp.path().join("hog.jsonl");
    let dir = tmp.path().join("bundle");
    hog_bundle(&dir, &model, &log, json!({}));
    // Flags over the bundle: 64 processes (threads count), half a CPU.
    let out = deploy(&hub, &dir, "forks", &["--pids", "64", "--cpu", "0.5"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = hub.cli_json(&["ps", "-o", "json"]).unwrap();
    let d = d
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "forks")
        .cloned()
        .unwrap();
    assert_eq!(
        d["resources"],
        json!({"cpu": "0.5", "memory": "256Mi (default, not a limit)", "pids": 64}),
        "{d}"
    );
    hub.wait_instances("healthy", Duration::from_secs(90), |l| healthy(l, "forks"))
        .unwrap_or_else(|e| panic!("{e}\nnest log:\n{}", nest.proc.log_text()));
    let out = hub.cli(&["submit", "forks", "spawn"]).unwrap();
    let task = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let t = hub
        .cli_json(&["wait", &task, "-o", "json", "--timeout", "90s"])
        .unwrap();
    assert_eq!(t["state"], "succeeded", "{t}");
    // The tool's answer, as the model got it.
    let requests = std::fs::read_to_string(&record).unwrap();
    let started: usize = requests
        .split("started ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no spawn result in {requests}"));
    assert!(started > 0 && started < 64, "started {started} of 300");
    // `agen top -o json` lists the instance and its tool server with their use.
    let top = hub
        .wait_instances("usage with the sleeps", Duration::from_secs(30), |l| {
            l.iter().any(|i| {
                i["deployment"] == "forks"
                    && i["usage"]["pids"].as_u64().unwrap_or(0) > started as u64
            })
        })
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!top.is_empty());
    let top = hub.cli_json(&["top", "-o", "json"]).unwrap();
    let row = top
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["deployment"] == "forks")
        .cloned()
        .unwrap();
    let server = row["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "hog")
        .cloned()
        .unwrap();
    assert!(
        server["pids"].as_u64().unwrap() > started as u64,
        "{server}"
    );
    assert!(row["usage"]["cpu_percent"].as_f64().is_some(), "{row}");
    let table = String::from_utf8_lossy(&hub.cli(&["top"]).unwrap().stdout).to_string();
    assert!(
        table.contains("TOOL SERVER") && table.contains("hog"),
        "{table}"
    );
}

#[test]
fn an_instance_bigger_than_any_nest_is_pending_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("nest-a", &[], &[]).unwrap();
    let model = FakeModel::start(&tmp.path().join("model"), &json!({"steps": []})).unwrap();
    let dir = tmp.path().join("bundle");
    hog_bundle(
        &dir,
        &model,
        &tmp.path().join("hog.jsonl"),
        json!({"resources": {"cpu": 0.25}}),
    );
    let out = deploy(
        &hub,
        &dir,
        "huge",
        &["--memory", "1Ti", "--wait", "--timeout", "5s"],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no nest is big enough"), "{stderr}");
    let list = hub.instances().unwrap();
    let i = list.iter().find(|i| i["deployment"] == "huge").unwrap();
    assert_eq!(i["state"], "pending");
    let msg = i["message"].as_str().unwrap();
    assert!(
        msg.starts_with("no nest is big enough: the instance reserves cpu 0.25, memory 1Ti and the largest matching nest has cpu "),
        "{msg}"
    );
    // A bad value is refused at the edge, naming the key and the fix.
    let out = deploy(&hub, &dir, "bad", &["--memory", "5 GB"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--memory") && stderr.contains("512Mi"),
        "{stderr}"
    );
    hog_bundle(
        &dir,
        &model,
        &tmp.path().join("hog.jsonl"),
        json!({"resources": {"cpu": 1000}}),
    );
    let out = deploy(&hub, &dir, "bad", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("x-agen/config.json")
            && stderr.contains("resources.cpu")
            && stderr.contains("expected 0.01 to 256 CPUs"),
        "{stderr}"
    );
}

#[test]
fn respread_moves_no_instance_to_a_nest_without_its_memory_and_does_once_there_is_room() {
    const MIB: u64 = 1 << 20;
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _a = hub.nest("nest-a", &[], &[]).unwrap();
    let _b = hub.nest("nest-b", &["role=big"], &[]).unwrap();
    let model = FakeModel::start(&tmp.path().join("model"), &json!({"steps": []})).unwrap();
    let dir = tmp.path().join("bundle");
    hog_bundle(&dir, &model, &tmp.path().join("hog.jsonl"), json!({}));
    // `big` reserves all of nest-b's memory but 128Mi: less than `web` reserves (256Mi).
    let nests = hub.nests().unwrap();
    let mem_b = nests.iter().find(|n| n["name"] == "nest-b").unwrap()["memory_bytes"]
        .as_u64()
        .unwrap();
    let big = format!("{}Mi", mem_b / MIB - 128);
    let out = deploy(
        &hub,
        &dir,
        "big",
        &[
            "--memory",
            &big,
            "--selector",
            "role=big",
            "--wait",
            "--timeout",
            "90s",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = deploy(
        &hub,
        &dir,
        "web",
        &["--replicas", "2", "--wait", "--timeout", "90s"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let web = |l: &[Value]| -> Vec<Value> {
        l.iter()
            .filter(|i| {
                i["deployment"] == "web" && !matches!(i["state"].as_str(), Some("stopped" | "lost"))
            })
            .cloned()
            .collect()
    };
    // Both replicas on nest-a; nest-b is emptier for `web` but has no room: over several
    // reconcile passes (bounded, 5 s) nothing is marked leaving and no replacement waits.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut passes = 0;
    while std::time::Instant::now() < deadline {
        let l = hub.instances().unwrap();
        let w = web(&l);
        assert_eq!(w.len(), 2, "{w:?}");
        for i in &w {
            assert_eq!(i["nest"], "nest-a", "{i}");
            assert_eq!(i["state"], "running", "{i}");
            assert!(
                !i["message"].as_str().unwrap_or("").contains("moving off"),
                "{i}"
            );
        }
        passes += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(passes >= 5, "{passes}");
    // Room on nest-b again: one replica moves there.
    let out = hub.cli(&["rm", "big", "--yes"]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    hub.wait_instances(
        "web spread over both nests",
        Duration::from_secs(120),
        |l| {
            let w: Vec<Value> = web(l)
                .into_iter()
                .filter(|i| i["state"] == "running" && i["healthy"] == true)
                .collect();
            w.len() == 2
                && w.iter().any(|i| i["nest"] == "nest-a")
                && w.iter().any(|i| i["nest"] == "nest-b")
        },
    )
    .unwrap();
}
