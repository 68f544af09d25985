//! A data dir written by an earlier build opens and resumes (issue 36: moving the contract into
//! its own crate changed no encoding). `tests/fixtures/old-data-dir.tar.gz` holds a Hub's data
//! dir and a Nest's, both killed -9 by the build before the move: two finished tasks (one of
//! them approved), a task waiting for approval, a task whose run was inside a tool call when its
//! Nest died, and one that finished at the Nest while the Hub was down (its events were in the
//! Nest's outbox, which is kept in memory: it died with the Nest, and the Hub knows that run only
//! up to its tool call). The test opens them with today's build: the finished tasks read back as
//! they were, both interrupted runs resume and end, and the waiting call is approved and runs.
//!
//! `record_old_data_dir` (ignored) made the fixture; run it again only to renew it, with the
//! build whose data it should hold:
//! `cargo test -p agen-tests --test e2e -- --ignored old_data_dir::record --nocapture`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agen_tests::{
    agen_bin, mcp_json, wait_for, workspace_root, write_bundle, HubProcess, NestProcess, Proc,
};
use serde_json::{json, Value};

/// The models listen on their own loopback address, so the fixed ports the fixture's bundles
/// name cannot meet the port-0 listeners of other tests (those bind 127.0.0.1).
const MODEL_HOST: &str = "127.0.0.77";

fn fixture() -> PathBuf {
    workspace_root().join("tests/fixtures/old-data-dir.tar.gz")
}

/// A step that runs `command` in the workspace, then a reply naming what it saw.
fn script(command: &str) -> Value {
    json!({"steps": [
        {"tool_calls": [{"name": "ws_run", "arguments": {"command": command}}]},
        {"reply_template": "saw: {{last_tool_result}}"}
    ]})
}

/// The quick model (a call of 3 s) and the slow one (a call of 120 s).
fn scripts() -> [(&'static str, Value); 2] {
    [
        ("quick", script("sleep 3; echo done")),
        ("slow", script("sleep 120; echo slept")),
    ]
}

/// `agen fake-model` on `MODEL_HOST:port` (0: any), with its bound port.
fn model(dir: &Path, name: &str, script: &Value, port: u16) -> (Proc, u16) {
    let dir = dir.join(format!("model-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut script = script.clone();
    script["record"] = json!(dir.join("requests.jsonl"));
    let script_file = dir.join("script.json");
    std::fs::write(&script_file, script.to_string()).unwrap();
    let port_file = dir.join("port");
    let _ = std::fs::remove_file(&port_file);
    let mut cmd = Command::new(agen_bin());
    cmd.arg("fake-model")
        .arg("--script")
        .arg(&script_file)
        .args(["--listen", &format!("{MODEL_HOST}:{port}")])
        .arg("--port-file")
        .arg(&port_file);
    let proc = Proc::spawn(name, cmd, &dir.join("log")).unwrap();
    let bound = wait_for("the fake model to listen", Duration::from_secs(20), || {
        std::fs::read_to_string(&port_file)
            .ok()?
            .trim()
            .parse()
            .ok()
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", proc.log_text()));
    (proc, bound)
}

fn deploy(hub: &HubProcess, root: &Path, name: &str, port: u16, ask: bool) {
    let dir = root.join("bundles").join(name);
    let permissions = if ask {
        json!({"permissions": {"ask": ["ws.run"]}})
    } else {
        json!({"permissions": {"allow": ["ws.run"]}})
    };
    write_bundle(
        &dir,
        &[
            // The waiting call must outlive the fixture's age.
            (
                "x-agen/harness.json",
                json!({"limits": {"approvalTimeout": "100000h"}}).to_string(),
            ),
            (
                "mcp.json",
                mcp_json(&[(
                    "ws",
                    json!({"command": "agen", "args": ["mcp", "workspace", "--root", "."]}),
                )]),
            ),
            (
                "x-agen/agent.md",
                format!("---\nname: {name}\nmodel: openai/fake-model\nbaseUrl: http://{MODEL_HOST}:{port}/v1\n---\nYou are {name}.\n"),
            ),
            ("x-agen/config.json", permissions.to_string()),
        ],
    )
    .unwrap();
    let out = hub
        .cli(&["deploy", dir.to_str().unwrap(), "--name", name, "--wait"])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn submit(hub: &HubProcess, deployment: &str, input: &str) -> String {
    let out = hub.cli(&["submit", deployment, input]).unwrap();
    assert!(
        out.status.success(),
        "submit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn query(hub: &HubProcess, task: &str) -> Value {
    hub.cli_json(&["query", task, "-o", "json"]).unwrap()
}

fn wait_state(hub: &HubProcess, task: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    wait_for("the task's state", Duration::from_secs(120), || {
        last = hub.cli_json(&["query", task, "-o", "json"]).ok()?;
        pred(&last).then(|| last.clone())
    })
    .unwrap_or_else(|e| panic!("{e:#}\nlast: {last}\nhub log:\n{}", hub.proc.log_text()))
}

fn terminal(v: &Value) -> bool {
    matches!(
        v["state"].as_str(),
        Some("succeeded" | "failed" | "cancelled")
    )
}

fn pending_call(hub: &HubProcess, task: &str) {
    let p = wait_for("a pending approval", Duration::from_secs(120), || {
        let list = hub.cli_json(&["approvals", "-o", "json"]).ok()?;
        list.as_array()?.iter().find(|a| a["task"] == task).cloned()
    })
    .unwrap();
    assert_eq!(p["tool"], "ws.run", "{p}");
}

fn approve(hub: &HubProcess, task: &str) {
    let out = hub.cli(&["approve", task]).unwrap();
    assert!(
        out.status.success(),
        "approve: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "records tests/fixtures/old-data-dir.tar.gz with the build at hand"]
fn record_old_data_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("fixture");
    let mut hub = HubProcess::start(&root).unwrap();
    let mut nest = hub.nest("nest-a", &[], &[]).unwrap();
    let [(quick_name, quick), (slow_name, slow)] = scripts();
    let (mut quick_model, quick_port) = model(tmp.path(), quick_name, &quick, 0);
    let (mut slow_model, slow_port) = model(tmp.path(), slow_name, &slow, 0);
    deploy(&hub, tmp.path(), "asker", quick_port, true);
    deploy(&hub, tmp.path(), "quick", quick_port, false);
    deploy(&hub, tmp.path(), "slow", slow_port, false);

    let finished = submit(&hub, "quick", "finish");
    wait_state(&hub, &finished, |v| v["state"] == "succeeded");
    let approved = submit(&hub, "asker", "approve me");
    pending_call(&hub, &approved);
    approve(&hub, &approved);
    wait_state(&hub, &approved, |v| v["state"] == "succeeded");
    let waiting = submit(&hub, "asker", "wait for me");
    pending_call(&hub, &waiting);
    let in_flight = submit(&hub, "slow", "die in the call");
    wait_state(&hub, &in_flight, |v| v["state"] == "running");
    let outboxed = submit(&hub, "quick", "finish while the hub is down");
    wait_state(&hub, &outboxed, |v| v["state"] == "running");
    let history: Vec<Value> = [&finished, &approved]
        .iter()
        .map(|t| query(&hub, t))
        .collect();

    // The Hub dies; `outboxed` finishes at the Nest meanwhile (its events wait in the Nest's
    // outbox, which lives in the Nest's memory and dies with it), then the Nest dies.
    hub.proc.kill9();
    let requests = tmp.path().join("model-quick/requests.jsonl");
    wait_for(
        "outboxed's last model turn",
        Duration::from_secs(60),
        || {
            let n = std::fs::read_to_string(&requests).ok()?.lines().count();
            (n >= 7).then_some(())
        },
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    kill_group(&mut nest);
    quick_model.kill9();
    slow_model.kill9();

    let manifest = json!({
        "models": {"quick": quick_port, "slow": slow_port},
        "tasks": {"finished": finished, "approved": approved, "waiting": waiting,
                  "in_flight": in_flight, "outboxed": outboxed},
        "history": history,
    });
    std::fs::write(
        root.join("manifest.json"),
        serde_json::to_vec_pretty(&manifest).unwrap(),
    )
    .unwrap();
    for log in ["hub.log", "nest-nest-a.log"] {
        let _ = std::fs::remove_file(root.join(log));
    }
    std::fs::create_dir_all(fixture().parent().unwrap()).unwrap();
    let status = Command::new("tar")
        .arg("-czf")
        .arg(fixture())
        .arg("-C")
        .arg(tmp.path())
        .arg("fixture")
        .status()
        .unwrap();
    assert!(status.success());
    eprintln!(
        "recorded {} ({} bytes): {manifest}",
        fixture().display(),
        std::fs::metadata(fixture()).unwrap().len()
    );
}

/// SIGKILL to the Nest's whole process group (its instances and tool servers too).
fn kill_group(nest: &mut NestProcess) {
    let pid = nix::unistd::Pid::from_raw(nest.proc.pid() as i32);
    let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
    let _ = nest.proc.child.wait();
}

#[test]
fn a_data_dir_of_the_build_before_the_contract_crate_opens_and_its_runs_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(fixture())
        .arg("-C")
        .arg(tmp.path())
        .status()
        .unwrap();
    assert!(status.success(), "unpack {}", fixture().display());
    let root = tmp.path().join("fixture");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(root.join("manifest.json")).unwrap()).unwrap();
    let task = |k: &str| manifest["tasks"][k].as_str().unwrap().to_string();
    let mut models = Vec::new();
    for (name, script) in scripts() {
        let port = manifest["models"][name].as_u64().unwrap() as u16;
        models.push(model(tmp.path(), name, &script, port).0);
    }
    // The client config named the old Hub's port: the Hub writes it again.
    let _ = std::fs::remove_file(root.join("client.toml"));
    let hub = HubProcess::start(&root).unwrap();
    let _nest = hub.nest("nest-a", &[], &[]).unwrap();

    // What finished reads back as it was.
    for (i, t) in ["finished", "approved"].iter().enumerate() {
        let now = query(&hub, &task(t));
        assert_eq!(now, manifest["history"][i], "task {t} reads back unchanged");
    }
    // Both runs killed inside their call resume on a new attempt and end.
    for t in ["in_flight", "outboxed"] {
        let v = wait_state(&hub, &task(t), terminal);
        assert!(v["attempt"].as_u64().is_some_and(|a| a >= 2), "{t}: {v}");
    }
    // The waiting call asks again on its resume; approved, it runs and the task ends.
    let waiting = task("waiting");
    pending_call(&hub, &waiting);
    approve(&hub, &waiting);
    let done = wait_state(&hub, &waiting, terminal);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(
        done["outcome"]["result"]
            .as_str()
            .is_some_and(|r| r.contains("done")),
        "{done}"
    );
}
