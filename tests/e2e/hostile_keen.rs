//! Keen scripts that attack the engine, through `agen run` (the instance's harness): a
//! backtracking RegExp, a huge native loop and a 10,000-deep object on `dictionary`. Each is
//! answered with the recovery prompt within its limit plus about a second; afterwards the
//! process uses no CPU and has no script process left; and the next tool call still works.

use std::time::{Duration, Instant};

use agen_tests::{agen_bin, wait_for, write_bundle, FakeModel};
use serde_json::{json, Value};

const RECOVERY: &str = "No tool response. The tool call could not be completed; check the call and try again, or tell the user it cannot run right now.";

fn call(tool: &str) -> String {
    format!("<SYSTEM CALL>\n!*action\nuse tool\n!*tool\n{tool}\n!*context\n\n</SYSTEM CALL>\n")
}

/// utime + stime of `pid` and every thread, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Direct children of `pid`.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

#[test]
fn runaway_keen_scripts_are_answered_within_their_limit_and_leave_no_cpu_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let record = tmp.path().join("requests.jsonl");
    // The last model turn waits 4 s: the window in which the process must sit idle.
    let steps = json!([
        {"reply": call("Backtrack")},
        {"reply": call("Scan")},
        {"reply": call("Deep")},
        {"reply": call("Stamp")},
        {"reply": "finished", "delay_ms": 4000}
    ]);
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": steps, "record": record}),
    )
    .unwrap();
    let bundle = tmp.path().join("bundle");
    write_bundle(
        &bundle,
        &[
            ("x-agen/agent.md", format!("---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou are helpful.\n", model.base_url())),
            ("x-agen/harness.json", json!({"toolProtocol": "keen", "limits": {"scriptTimeout": "1s"}}).to_string()),
            (
                "keen-tools.json",
                json!([
                    {"name": "Backtrack", "type": "script", "entry": "tools/backtrack.js"},
                    {"name": "Scan", "type": "script", "entry": "tools/scan.js"},
                    {"name": "Deep", "type": "script", "entry": "tools/deep.js"},
                    {"name": "Stamp", "type": "script", "entry": "tools/stamp.js"}
                ])
                .to_string(),
            ),
            ("tools/backtrack.js", "exports.exec = function (p, d) { d.result = String(/^(a+)+$/.test('a'.repeat(27) + '!')); };\n".into()),
            ("tools/scan.js", "exports.exec = function (p, d) { d.result = String(new Array(2e8).indexOf(1)); };\n".into()),
            (
                "tools/deep.js",
                "exports.exec = function (p, d) { const o = {}; let c = o; for (let i = 0; i < 10000; i++) { c.x = {}; c = c.x; } d.deep = o; d.result = 'deep'; };\n".into(),
            ),
            ("tools/stamp.js", "exports.exec = function (p, d) { d.result = 'stamp ok'; };\n".into()),
        ],
    )
    .unwrap();

    let started = Instant::now();
    let child = std::process::Command::new(agen_bin())
        .arg("run")
        .arg(&bundle)
        .arg("go")
        .env("XDG_STATE_HOME", tmp.path().join("state"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let requests = || -> Vec<Value> {
        std::fs::read_to_string(&record)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    // The fifth model request is the one that waits: every script has been answered by then.
    wait_for("the last model turn", Duration::from_secs(60), || {
        (requests().len() >= 5).then_some(())
    })
    .unwrap();
    let answered = started.elapsed();
    // Inside the idle window: no CPU, no script process left.
    let before = cpu_ticks(pid).expect("cpu of agen run");
    std::thread::sleep(Duration::from_millis(2000)); // measuring an interval, not waiting for readiness
    let after = cpu_ticks(pid).expect("cpu of agen run");
    let leftovers: Vec<String> = children(pid)
        .into_iter()
        .map(cmdline)
        .filter(|c| c.contains("keen-script"))
        .collect();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let last_user = |i: usize| -> String {
        let reqs = requests();
        let msgs = reqs[i]["body"]["messages"].as_array().unwrap().clone();
        msgs.iter()
            .rev()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    for i in 1..=3 {
        assert_eq!(last_user(i).trim(), RECOVERY, "turn {i}");
    }
    assert!(last_user(4).contains("stamp ok"), "{}", last_user(4));
    // Three runaway scripts at a 1 s limit: answered within 3 × (1 s + ~1 s) plus start-up.
    assert!(
        answered < Duration::from_secs(10),
        "answered after {answered:?}"
    );
    // At most a few ticks (10 ms each) of housekeeping in 2 s.
    assert!(
        after - before <= 20,
        "agen run used {} ticks while idle",
        after - before
    );
    assert_eq!(leftovers, Vec::<String>::new());
}
