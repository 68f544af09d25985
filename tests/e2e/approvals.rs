//! Fleet approvals (issue 15) on a real fleet: a Hub, a Nest, the scripted fake model and our
//! real workspace MCP server with `ws.run` in `ask`. The run waits for a person's decision
//! (`agen approve` / `agen deny`; after a moment in place it gives its slot back, see
//! `suspend.rs`); a decision is taken once; a viewer cannot decide; an instance killed while
//! its run waits asks again on the resume and runs the call once.

use std::path::Path;
use std::time::Duration;

use agen_tests::{mcp_json, wait_for, write_bundle, FakeModel, HubProcess, NestProcess};
use serde_json::{json, Value};

/// A deployment `name` on `agen mcp workspace` with `ws.run` in `ask`.
pub(crate) fn deploy_asker(hub: &HubProcess, dir: &Path, name: &str, model: &FakeModel) {
    deploy_asker_with(hub, dir, name, model, json!({}));
}

/// [`deploy_asker`] with `x-agen/harness.json`.
pub(crate) fn deploy_asker_with(
    hub: &HubProcess,
    dir: &Path,
    name: &str,
    model: &FakeModel,
    harness: Value,
) {
    write_bundle(
        dir,
        &[
            ("x-agen/harness.json", harness.to_string()),
            (
                "mcp.json",
                mcp_json(&[("ws", json!({"command": "agen", "args": ["mcp", "workspace", "--root", "."]}))]),
            ),
            (
                "x-agen/agent.md",
                format!("---\nname: {name}\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou are {name}.\n", model.base_url()),
            ),
            ("x-agen/config.json", json!({"permissions": {"ask": ["ws.run"]}}).to_string()),
        ],
    )
    .expect("write bundle");
    let out = hub
        .cli(&["deploy", dir.to_str().unwrap(), "--name", name, "--wait"])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fake model that calls `ws_run` (appending to `marker`) and then answers with what it saw.
pub(crate) fn model(dir: &Path, marker: &Path) -> FakeModel {
    let script = json!({"steps": [
        {"tool_calls": [{"name": "ws_run", "arguments": {"command": format!("echo ran >> {}", marker.display())}}]},
        {"reply_template": "saw: {{last_tool_result}}"}
    ]});
    FakeModel::start(&dir.join("model"), &script).unwrap()
}

pub(crate) fn executions(marker: &Path) -> usize {
    std::fs::read_to_string(marker)
        .unwrap_or_default()
        .lines()
        .count()
}

pub(crate) fn submit(hub: &HubProcess, deployment: &str) -> String {
    let out = hub.cli(&["submit", deployment, "go"]).unwrap();
    assert!(
        out.status.success(),
        "submit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The pending approval of `task`, once `agen approvals -o json` lists it.
pub(crate) fn pending_of(hub: &HubProcess, task: &str) -> Value {
    wait_for("a pending approval", Duration::from_secs(60), || {
        let list = hub.cli_json(&["approvals", "-o", "json"]).ok()?;
        list.as_array()?.iter().find(|a| a["task"] == task).cloned()
    })
    .unwrap()
}

pub(crate) fn wait_task(hub: &HubProcess, task: &str) -> Value {
    hub.cli_json(&["wait", task, "-o", "json", "--timeout", "90s"])
        .unwrap()
}

pub(crate) fn decide(hub: &HubProcess, args: &[&str]) -> std::process::Output {
    hub.cli(args).expect("run agen")
}

#[test]
fn approve_runs_the_call_once_and_deny_tells_the_model_on_a_real_fleet() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("run-executions.txt");
    let model = model(tmp.path(), &marker);
    deploy_asker(&hub, &tmp.path().join("asker"), "asker", &model);

    // Approve: the task waits for a person, then the call runs once.
    let task = submit(&hub, "asker");
    let pending = pending_of(&hub, &task);
    assert_eq!(pending["tool"], "ws.run", "{pending}");
    assert_eq!(pending["deployment"], "asker", "{pending}");
    assert!(
        pending["arguments"]["command"]
            .as_str()
            .is_some_and(|c| c.starts_with("echo ran")),
        "{pending}"
    );
    let call_id = pending["call_id"].as_str().unwrap().to_string();
    let q = hub.cli_json(&["query", &task, "-o", "json"]).unwrap();
    assert_eq!(q["state"], "waiting", "{q}");
    assert_eq!(q["approvals"][0]["call_id"], call_id.as_str(), "{q}");
    assert_eq!(executions(&marker), 0, "nothing runs before a decision");

    // A viewer reads approvals but cannot decide.
    let viewer = hub
        .cli_json(&[
            "tokens",
            "create",
            "--namespace",
            "default",
            "--role",
            "viewer",
            "--name",
            "dash",
            "-o",
            "json",
        ])
        .unwrap();
    let viewer = viewer["secret"].as_str().unwrap().to_string();
    let out = decide(&hub, &["approve", &task, "--token", &viewer]);
    assert!(!out.status.success(), "a viewer approved");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("permission denied"), "{err}");
    assert_eq!(executions(&marker), 0, "a refused decision changes nothing");

    let out = decide(&hub, &["approve", &task]);
    assert!(
        out.status.success(),
        "approve: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Deciding twice is refused and changes nothing.
    let out = decide(&hub, &["deny", &task, &call_id, "--reason", "too late"]);
    assert!(!out.status.success(), "a second decision was taken");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already decided"), "{err}");

    let done = wait_task(&hub, &task);
    assert_eq!(done["state"], "succeeded", "{done}");
    let result = done["outcome"]["result"].as_str().unwrap_or_default();
    assert!(!result.contains("denied"), "{result}");
    assert_eq!(
        executions(&marker),
        1,
        "approved: the call ran exactly once"
    );

    // Deny with a reason: the model is told, the call never runs, the task goes on.
    let task = submit(&hub, "asker");
    pending_of(&hub, &task);
    let out = decide(&hub, &["deny", &task, "--reason", "not on a Friday"]);
    assert!(
        out.status.success(),
        "deny: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done = wait_task(&hub, &task);
    assert_eq!(done["state"], "succeeded", "{done}");
    let result = done["outcome"]["result"].as_str().unwrap_or_default();
    assert!(
        result.contains("denied by a person: not on a Friday"),
        "{result}"
    );
    let left = hub.cli_json(&["approvals", "-o", "json"]).unwrap();
    assert_eq!(left, json!([]), "nothing left pending");
    assert_eq!(
        executions(&marker),
        1,
        "a denied call never reaches the server"
    );
}

#[test]
fn an_approval_is_audited_and_traced_with_the_deciding_tokens_name() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("run-executions.txt");
    let model = model(tmp.path(), &marker);
    deploy_asker(&hub, &tmp.path().join("asker"), "asker", &model);
    let token = hub
        .cli_json(&[
            "tokens",
            "create",
            "--namespace",
            "default",
            "--role",
            "submitter",
            "--name",
            "release-bot",
            "-o",
            "json",
        ])
        .unwrap();
    let secret = token["secret"].as_str().unwrap().to_string();
    let token_id = token["id"].as_str().unwrap_or_default().to_string();

    let task = submit(&hub, "asker");
    pending_of(&hub, &task);
    let out = decide(&hub, &["approve", &task, "--token", &secret]);
    assert!(
        out.status.success(),
        "approve: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done = wait_task(&hub, &task);
    assert_eq!(done["state"], "succeeded", "{done}");

    // The audit log: the decision, under the token's name.
    let audit = hub.cli_json(&["audit", "-o", "json"]).unwrap();
    let decisions: Vec<&Value> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["call"] == "DecideApproval")
        .collect();
    assert_eq!(decisions.len(), 1, "{audit:#}");
    let d = decisions[0];
    assert_eq!(
        (&d["token_name"], &d["target"], &d["outcome"]),
        (&json!("release-bot"), &json!(task), &json!("ok")),
        "{d}"
    );

    // The run log and the trace: `by` is the token's name (not the admin, not the id).
    let events = hub.cli(&["trace", &task, "--events"]).unwrap();
    let events = String::from_utf8_lossy(&events.stdout);
    let line = events
        .lines()
        .find(|l| l.contains("approval.decided"))
        .unwrap_or_else(|| panic!("no approval.decided in {events}"));
    assert!(line.contains("approved by release-bot"), "{line}");
    assert!(!line.contains("by release-bot ("), "only the name: {line}");
    let trace = hub.cli_json(&["trace", &task, "-o", "json"]).unwrap();
    let span = trace["spans"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "approval ws.run"))
        .unwrap_or_else(|| panic!("no approval span in {trace:#}"));
    assert_eq!(span["attributes"]["by"], "release-bot", "{span}");
    assert_eq!(span["attributes"]["approved"], "true", "{span}");
    if !token_id.is_empty() {
        assert!(!line.contains(&token_id), "{line}");
        assert_ne!(span["attributes"]["by"], json!(token_id), "{span}");
    }
    assert_eq!(executions(&marker), 1);
}

/// The `agen instance` processes of a Nest.
pub(crate) fn instance_pids(nest: &NestProcess) -> Vec<u32> {
    nest.descendants()
        .into_iter()
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmd).split('\0').nth(1) == Some("instance")
        })
        .collect()
}

#[test]
fn an_instance_killed_while_its_run_waits_asks_again_and_runs_the_call_once() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("run-executions.txt");
    let model = model(tmp.path(), &marker);
    deploy_asker(&hub, &tmp.path().join("asker"), "asker", &model);

    let task = submit(&hub, "asker");
    let first = pending_of(&hub, &task);
    let pids = instance_pids(&nest);
    assert_eq!(pids.len(), 1, "one instance: {pids:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9 the instance");
    // Killed while it waited in place, the run resumes and asks again (same call id); killed
    // after it gave its slot back, nothing of it was on the instance. It waits either way.
    let resumed = wait_for("the run to wait again", Duration::from_secs(90), || {
        let q = hub.cli_json(&["query", &task, "-o", "json"]).ok()?;
        let again =
            q["attempt"].as_u64()? >= 2 || q["activity"].as_str()?.contains("gave its slot back");
        (again && q["state"] == "waiting").then_some(q)
    })
    .unwrap();
    assert_eq!(
        resumed["approvals"][0]["call_id"], first["call_id"],
        "{resumed}"
    );
    assert_eq!(executions(&marker), 0, "nothing ran while waiting");

    let out = decide(&hub, &["approve", &task]);
    assert!(
        out.status.success(),
        "approve: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done = wait_task(&hub, &task);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(executions(&marker), 1, "the call ran exactly once");
}

#[test]
fn always_approves_the_tool_for_the_rest_of_the_task_and_the_timeout_denies() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("run-executions.txt");
    let run = json!({"name": "ws_run", "arguments": {"command": format!("echo ran >> {}", marker.display())}});
    let script = json!({"steps": [
        {"tool_calls": [run]},
        {"tool_calls": [run]},
        {"reply_template": "saw: {{last_tool_result}}"}
    ]});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    deploy_asker(&hub, &tmp.path().join("always"), "always", &model);

    let task = submit(&hub, "always");
    pending_of(&hub, &task);
    let out = decide(&hub, &["approve", &task, "--always"]);
    assert!(
        out.status.success(),
        "approve --always: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done = wait_task(&hub, &task);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(executions(&marker), 2, "the second call needed no approval");

    // A 2 s approvalTimeout denies an undecided call with a reason saying so.
    let model = FakeModel::start(
        &tmp.path().join("model2"),
        &json!({"steps": [
            {"tool_calls": [run]},
            {"reply_template": "saw: {{last_tool_result}}"}
        ]}),
    )
    .unwrap();
    deploy_asker_with(
        &hub,
        &tmp.path().join("hurried"),
        "hurried",
        &model,
        json!({"limits": {"approvalTimeout": "2s"}}),
    );
    let task = submit(&hub, "hurried");
    pending_of(&hub, &task);
    let done = wait_task(&hub, &task);
    assert_eq!(done["state"], "succeeded", "{done}");
    let result = done["outcome"]["result"].as_str().unwrap_or_default();
    assert!(
        result.contains("no one decided within limits.approvalTimeout (2s)"),
        "{result}"
    );
    assert_eq!(executions(&marker), 2, "a timed-out call never runs");
    let left = hub.cli_json(&["approvals", "-o", "json"]).unwrap();
    assert_eq!(left, json!([]), "a timed-out call is no longer pending");
    let out = decide(&hub, &["approve", &task]);
    assert!(!out.status.success(), "a timed-out task's call was decided");
}
