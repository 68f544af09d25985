//! Double texting end to end: a second message to a conversation whose task still runs, in
//! each mode (`agen submit --double-texting MODE`, or the bundle's `doubleTexting`), with a
//! slow scripted model and the ledger server's side-effecting `charge`, whose real calls are
//! counted.

use std::path::PathBuf;
use std::time::Duration;

use agen_tests::{mcp_json, wait_for, write_bundle, FakeModel, HubProcess, NestProcess, Peers};
use serde_json::{json, Value};

struct Chat {
    tmp: tempfile::TempDir,
    hub: HubProcess,
    _nest: NestProcess,
    _model: FakeModel,
    log: PathBuf,
}

/// A Hub, a Nest, the fake model following `steps`, deployment `chat` (the ledger server's
/// tools; `config` as its `x-agen/config.json` when set), healthy.
fn chat(steps: Value, config: Option<Value>) -> Chat {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    let script = json!({"steps": steps, "record": tmp.path().join("model-requests.jsonl")});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let log = tmp.path().join("ledger.jsonl");
    let dir = tmp.path().join("bundle");
    let mut files = vec![
        (
            "mcp.json",
            mcp_json(&[(
                "ledger",
                json!({"command": Peers::python(), "args": [Peers::script("servers/ledger_server.py")], "env": {"LEDGER_LOG": log}}),
            )]),
        ),
        (
            "x-agen/agent.md",
            format!(
                "---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou bill customers.\n",
                model.base_url()
            ),
        ),
    ];
    if let Some(c) = config {
        files.push(("x-agen/config.json", c.to_string()));
    }
    write_bundle(&dir, &files).unwrap();
    let out = hub
        .cli(&["deploy", dir.to_str().unwrap(), "--name", "chat"])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    hub.wait_instances("the replica healthy", Duration::from_secs(90), |l| {
        l.iter()
            .any(|i| i["deployment"] == "chat" && i["state"] == "running" && i["healthy"] == true)
    })
    .unwrap();
    Chat {
        tmp,
        hub,
        _nest: nest,
        _model: model,
        log,
    }
}

impl Chat {
    fn submit(&self, input: &str, extra: &[&str]) -> std::process::Output {
        let mut args = vec!["submit", "chat", input, "--conversation", "c1"];
        args.extend_from_slice(extra);
        self.hub.cli(&args).unwrap()
    }

    fn submit_ok(&self, input: &str, extra: &[&str]) -> String {
        let out = self.submit(input, extra);
        assert!(
            out.status.success(),
            "submit: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    fn wait(&self, task: &str) -> Value {
        let out = self
            .hub
            .cli(&["wait", task, "-o", "json", "--timeout", "90s"])
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "wait printed no JSON: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// Real calls of `charge` the ledger server received.
    fn charges(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["tool"] == "charge")
            .count()
    }

    fn wait_charges(&self, n: usize) {
        wait_for("the charge to start", Duration::from_secs(60), || {
            (self.charges() >= n).then_some(())
        })
        .unwrap();
    }

    /// The messages of the model request the fake model received last.
    fn last_request_messages(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.tmp.path().join("model-requests.jsonl")).unwrap();
        let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        last["body"]["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

#[test]
fn enqueue_runs_the_second_message_after_the_first_in_the_same_conversation() {
    let c = chat(
        json!([
            {"tool_calls": [{"name": "ledger_charge", "arguments": {"amount": 1, "seconds": 2}}]},
            {"echo_history": true},
            {"echo_history": true}
        ]),
        None,
    );
    let a = c.submit_ok("first", &[]);
    c.wait_charges(1);
    let b = c.submit_ok("second", &[]);
    let (ta, tb) = (c.wait(&a), c.wait(&b));
    assert_eq!(ta["state"], "succeeded", "{ta}");
    assert_eq!(ta["outcome"]["result"], "user messages: first");
    assert_eq!(tb["state"], "succeeded", "{tb}");
    assert_eq!(tb["outcome"]["result"], "user messages: first | second");
    assert!(
        tb["started_at_ms"].as_i64() >= ta["finished_at_ms"].as_i64(),
        "in order: {ta} {tb}"
    );
    assert_eq!(c.charges(), 1);
}

#[test]
fn reject_from_the_bundle_refuses_a_second_message_naming_the_running_task() {
    let c = chat(
        json!([
            {"tool_calls": [{"name": "ledger_charge", "arguments": {"amount": 1, "seconds": 2}}]},
            {"echo_history": true},
            {"echo_history": true}
        ]),
        Some(json!({"doubleTexting": "reject"})),
    );
    let a = c.submit_ok("first", &[]);
    c.wait_charges(1);
    let out = c.submit("second", &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&a) && err.contains("reject"),
        "names the running task: {err}"
    );
    // The submit's own mode wins over the bundle's.
    let b = c.submit_ok("second", &["--double-texting", "enqueue"]);
    assert_eq!(c.wait(&a)["state"], "succeeded");
    assert_eq!(
        c.wait(&b)["outcome"]["result"],
        "user messages: first | second"
    );
    assert_eq!(c.charges(), 1);
}

#[test]
fn interrupt_lets_the_side_effecting_call_finish_then_stops_before_the_next_turn() {
    let c = chat(
        json!([
            {"tool_calls": [{"name": "ledger_charge", "arguments": {"amount": 1, "seconds": 3}}]},
            {"echo_history": true}
        ]),
        None,
    );
    let a = c.submit_ok("first", &[]);
    // The charge is inside its call (it sleeps 3 s) when the second message comes.
    c.wait_charges(1);
    let b = c.submit_ok("second", &["--double-texting", "interrupt"]);
    let (ta, tb) = (c.wait(&a), c.wait(&b));
    assert_eq!(ta["state"], "cancelled", "{ta}");
    assert_eq!(ta["outcome"]["error"], "interrupted", "{ta}");
    assert_eq!(tb["state"], "succeeded", "{tb}");
    assert_eq!(tb["outcome"]["result"], "user messages: first | second");
    assert_eq!(c.charges(), 1, "the charge ran once");
    let tool_results: Vec<Value> = c
        .last_request_messages()
        .into_iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].clone())
        .collect();
    assert_eq!(
        tool_results,
        vec![json!("charged 1")],
        "the call finished and stayed in the conversation"
    );
}

#[test]
fn rollback_removes_the_running_tasks_turns_but_keeps_its_completed_charge_as_a_note() {
    let c = chat(
        json!([
            {"tool_calls": [{"name": "ledger_charge", "arguments": {"amount": 5}}]},
            {"echo_history": true, "delay_ms": 4000}
        ]),
        None,
    );
    let a = c.submit_ok("first", &[]);
    c.wait_charges(1);
    // Let the charge complete; the second turn is slow.
    wait_for("the slow turn", Duration::from_secs(30), || {
        let t = c.hub.cli_json(&["query", &a, "-o", "json"]).ok()?;
        t["activity"]
            .as_str()?
            .contains("waiting for the model")
            .then_some(())
    })
    .unwrap();
    let b = c.submit_ok("second", &["--double-texting", "rollback"]);
    let (ta, tb) = (c.wait(&a), c.wait(&b));
    assert_eq!(ta["state"], "cancelled", "{ta}");
    assert_eq!(tb["state"], "succeeded", "{tb}");
    assert_eq!(
        tb["outcome"]["result"], "user messages: second",
        "the first message is gone"
    );
    assert_eq!(c.charges(), 1, "the charge is not repeated");
    let messages = c.last_request_messages();
    let note = messages
        .iter()
        .find(|m| m["role"] == "assistant")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        note.contains("rolled back")
            && note.contains("ledger_charge")
            && note.contains("charged 5"),
        "the completed charge stays as a note: {messages:?}"
    );
    assert!(
        !messages.iter().any(|m| m["role"] == "tool"),
        "its turns are removed: {messages:?}"
    );
}
