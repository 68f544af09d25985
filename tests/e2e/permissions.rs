//! Permissions on a real fleet (issue 15): a Hub, a Nest, the scripted fake model and our real
//! workspace MCP server. `deny: ["ws.run"]` keeps `ws_run` out of what the model is offered
//! and a call to it anyway is refused and never runs; the same bundle without the deny runs it
//! (so the test can fail).

use std::path::Path;

use agen_tests::{mcp_json, write_bundle, FakeModel, HubProcess};
use serde_json::{json, Value};

/// A bundle named `name` on `agen mcp workspace`, with `permissions`.
fn bundle(dir: &Path, name: &str, model: &FakeModel, permissions: Value) {
    write_bundle(
        dir,
        &[
            (
                "mcp.json",
                mcp_json(&[("ws", json!({"command": "agen", "args": ["mcp", "workspace", "--root", "."]}))]),
            ),
            (
                "x-agen/agent.md",
                format!("---\nname: {name}\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou are {name}.\n", model.base_url()),
            ),
            ("x-agen/config.json", json!({"permissions": permissions}).to_string()),
        ],
    )
    .expect("write bundle");
}

/// Lines of the marker file the `run` command appends to.
fn executions(marker: &Path) -> usize {
    std::fs::read_to_string(marker)
        .unwrap_or_default()
        .lines()
        .count()
}

/// The tool names of the first model request whose system prompt is `You are {name}.`.
fn offered_to(requests_file: &Path, name: &str) -> Vec<String> {
    let system = format!("You are {name}.");
    let text = std::fs::read_to_string(requests_file).unwrap_or_default();
    let request: Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|r| r["body"]["messages"][0]["content"] == system.as_str())
        .unwrap_or_else(|| panic!("no model request of {name} in {text}"));
    request["body"]["tools"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t["function"]["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn submit_and_wait(hub: &HubProcess, deployment: &str) -> Value {
    let out = hub.cli(&["submit", deployment, "go"]).unwrap();
    assert!(
        out.status.success(),
        "submit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task = String::from_utf8(out.stdout).unwrap().trim().to_string();
    hub.cli_json(&["wait", &task, "-o", "json", "--timeout", "90s"])
        .unwrap()
}

#[test]
fn a_denied_workspace_run_is_not_offered_and_never_runs_on_a_real_fleet() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("run-executions.txt");
    let requests = tmp.path().join("model-requests.jsonl");
    let script = json!({"record": requests, "steps": [
        {"tool_calls": [{"name": "ws_run", "arguments": {"command": format!("echo ran >> {}", marker.display())}}]},
        {"reply_template": "saw: {{last_tool_result}}"}
    ]});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    for (name, permissions) in [("closed", json!({"deny": ["ws.run"]})), ("open", json!({}))] {
        let dir = tmp.path().join(name);
        bundle(&dir, name, &model, permissions);
        let out = hub
            .cli(&["deploy", dir.to_str().unwrap(), "--name", name, "--wait"])
            .unwrap();
        assert!(
            out.status.success(),
            "deploy {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let closed = submit_and_wait(&hub, "closed");
    assert_eq!(closed["state"], "succeeded", "{closed}");
    let result = closed["outcome"]["result"].as_str().unwrap_or_default();
    assert!(
        result.starts_with("saw: tool ws_run was not run: the bundle's permissions deny it"),
        "{result}"
    );
    let offered = offered_to(&requests, "closed");
    assert!(
        !offered.iter().any(|t| t == "ws_run"),
        "ws_run offered: {offered:?}"
    );
    assert!(
        offered.iter().any(|t| t == "ws_read"),
        "ws_read not offered: {offered:?}"
    );
    assert_eq!(
        executions(&marker),
        0,
        "a denied run call never reaches the server"
    );

    let open = submit_and_wait(&hub, "open");
    assert_eq!(open["state"], "succeeded", "{open}");
    assert!(offered_to(&requests, "open").iter().any(|t| t == "ws_run"));
    assert_eq!(
        executions(&marker),
        1,
        "without the deny, the same call runs once"
    );
}

/// A task's overrides only narrow (issue 15 item 5): `--deny-tool ws.run` on a bundle that allows
/// everything keeps `ws_run` from the model and from running for that task alone; an
/// `--allow-tool` naming a tool the bundle denies is reported as a warning and changes nothing.
#[test]
fn a_tasks_tool_overrides_narrow_the_bundle_and_a_widening_is_only_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("run-executions.txt");
    let requests = tmp.path().join("model-requests.jsonl");
    let script = json!({"record": requests, "steps": [
        {"tool_calls": [{"name": "ws_run", "arguments": {"command": format!("echo ran >> {}", marker.display())}}]},
        {"reply_template": "saw: {{last_tool_result}}"}
    ]});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    for (name, permissions) in [("open", json!({})), ("closed", json!({"deny": ["ws.run"]}))] {
        let dir = tmp.path().join(name);
        bundle(&dir, name, &model, permissions);
        let out = hub
            .cli(&["deploy", dir.to_str().unwrap(), "--name", name, "--wait"])
            .unwrap();
        assert!(
            out.status.success(),
            "deploy {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let submit = |deployment: &str, flags: &[&str]| {
        let mut args = vec!["submit", deployment, "go", "--wait", "-o", "json"];
        args.extend_from_slice(flags);
        let out = hub.cli(&args).unwrap();
        let t: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("submit: {}", String::from_utf8_lossy(&out.stderr)));
        (t, String::from_utf8_lossy(&out.stderr).into_owned())
    };

    let (narrowed, _) = submit("open", &["--deny-tool", "ws.run"]);
    assert_eq!(narrowed["state"], "succeeded", "{narrowed}");
    assert!(
        narrowed["outcome"]["result"]
            .as_str()
            .unwrap_or_default()
            .contains("not run"),
        "{narrowed}"
    );
    assert!(!offered_to(&requests, "open").iter().any(|t| t == "ws_run"));
    assert_eq!(narrowed["tool_overrides"]["deny"], json!(["ws.run"]));
    assert_eq!(executions(&marker), 0, "the task's deny held");

    let (widened, stderr) = submit("closed", &["--allow-tool", "ws.run"]);
    assert_eq!(widened["state"], "succeeded", "{widened}");
    let warnings = widened["warnings"].as_array().cloned().unwrap_or_default();
    assert_eq!(warnings.len(), 1, "{widened}");
    assert!(
        warnings[0].as_str().unwrap().contains("only narrow"),
        "{warnings:?}"
    );
    assert!(
        stderr.contains("warning: tool override allow `ws.run` has no effect"),
        "{stderr}"
    );
    assert_eq!(
        executions(&marker),
        0,
        "an override cannot open what the bundle denies"
    );
}

/// Runs `agen run DIR go EXTRA...` under a pseudo-terminal (python's `pty`), answering
/// `answer` to the first `[y/N]`; returns (exit code, everything the terminal showed).
fn agen_run_in_pty(dir: &Path, state: &Path, extra: &[&str], answer: &str) -> (i32, String) {
    let driver = r#"
import os, pty, select, sys
answer = sys.argv[1].encode()
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
buf, answered = b"", False
while True:
    r, _, _ = select.select([fd], [], [], 60)
    if not r:
        break
    try:
        data = os.read(fd, 4096)
    except OSError:
        break
    if not data:
        break
    buf += data
    if not answered and b"[y/N]" in buf:
        os.write(fd, answer + b"\n")
        answered = True
_, status = os.waitpid(pid, 0)
sys.stdout.buffer.write(buf)
sys.exit(os.waitstatus_to_exitcode(status))
"#;
    let mut cmd = std::process::Command::new("python3");
    cmd.args(["-c", driver, answer])
        .arg(agen_tests::agen_bin())
        .args(["run", dir.to_str().unwrap(), "go"])
        .args(extra)
        .env("XDG_STATE_HOME", state);
    let out = cmd.output().expect("python3 runs the pty driver");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `agen run` with stdin not a terminal: (exit code, stdout, stderr).
fn agen_run_headless(dir: &Path, state: &Path, extra: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(agen_tests::agen_bin())
        .args(["run", dir.to_str().unwrap(), "go"])
        .args(extra)
        .env("XDG_STATE_HOME", state)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("agen run starts");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn agen_run_asks_on_its_terminal_and_denies_without_one() {
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("run-executions.txt");
    let state = tmp.path().join("state");
    let script = json!({"steps": [
        {"tool_calls": [{"name": "ws_run", "arguments": {"command": format!("echo ran >> {}", marker.display())}}]},
        {"reply_template": "saw: {{last_tool_result}}"}
    ]});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let dir = tmp.path().join("asker");
    bundle(&dir, "asker", &model, json!({"ask": ["ws.run"]}));

    // No terminal: denied, never run.
    let (code, stdout, stderr) = agen_run_headless(&dir, &state, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(
            "it needs approval and was denied: no one to approve (standalone, not a terminal)"
        ),
        "{stdout}\n{stderr}"
    );
    assert_eq!(executions(&marker), 0);

    // A terminal that says no: shown the tool and its arguments, never run.
    let (code, screen) = agen_run_in_pty(&dir, &state, &[], "n");
    assert_eq!(code, 0, "{screen}");
    assert!(
        screen.contains("wants to call ws.run with arguments:") && screen.contains("echo ran >>"),
        "{screen}"
    );
    assert!(
        screen.contains("denied by a person at the terminal"),
        "{screen}"
    );
    assert_eq!(executions(&marker), 0);

    // A terminal that says yes: run once.
    let (code, screen) = agen_run_in_pty(&dir, &state, &[], "y");
    assert_eq!(code, 0, "{screen}");
    assert!(!screen.contains("was not run"), "{screen}");
    assert_eq!(executions(&marker), 1);

    // --approve-all: no terminal needed, says so at start, runs.
    let (code, stdout, stderr) = agen_run_headless(&dir, &state, &["--approve-all"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("--approve-all: every call that needs approval"),
        "{stderr}"
    );
    assert!(!stdout.contains("was not run"), "{stdout}");
    assert_eq!(executions(&marker), 2);
}
