//! Approvals with edits (`agen approve TASK CALL --args FILE`) on a real fleet: a Hub, a Nest,
//! the scripted model and the Python MCP SDK ledger server (`tests/peers/servers/ledger_server.py`,
//! which logs every call it receives) with `ledger.charge` in `ask`. The run gives its slot back
//! while it waits; the person approves with other arguments; the resumed run sends the call with
//! those alone, exactly once, tells the model so, and the audit log and run log record the edit.

use std::time::Duration;

use agen_tests::{mcp_json, wait_for, write_bundle, FakeModel, HubProcess, Peers};
use serde_json::{json, Value};

use crate::approvals::{decide, pending_of, submit, wait_task};

#[test]
fn an_edited_approval_reaches_the_server_once_with_the_edited_arguments() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let log = tmp.path().join("ledger.jsonl");
    let requests = tmp.path().join("model-requests.jsonl");
    let script = json!({"record": requests, "steps": [
        {"tool_calls": [{"name": "ledger_charge", "arguments": {"amount": 500}}]},
        {"reply_template": "saw: {{last_tool_result}}"}
    ]});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let dir = tmp.path().join("biller");
    write_bundle(
        &dir,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "ledger",
                    json!({"command": Peers::python(), "args": [Peers::script("servers/ledger_server.py")], "env": {"LEDGER_LOG": log}}),
                )]),
            ),
            (
                "x-agen/agent.md",
                format!("---\nname: biller\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou bill customers.\n", model.base_url()),
            ),
            (
                "x-agen/config.json",
                json!({"permissions": {"ask": ["ledger.charge"]}}).to_string(),
            ),
        ],
    )
    .unwrap();
    let out = hub
        .cli(&[
            "deploy",
            dir.to_str().unwrap(),
            "--name",
            "biller",
            "--wait",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let task = submit(&hub, "biller");
    let pending = pending_of(&hub, &task);
    assert_eq!(pending["arguments"], json!({"amount": 500}), "{pending}");
    let call_id = pending["call_id"].as_str().unwrap().to_string();
    // The run gives its slot back while it waits: the decision reaches a resumed attempt.
    wait_for(
        "the run to give its slot back",
        Duration::from_secs(60),
        || {
            let q = hub.cli_json(&["query", &task, "-o", "json"]).ok()?;
            q["activity"]
                .as_str()
                .is_some_and(|a| a.contains("gave its slot back"))
                .then_some(())
        },
    )
    .unwrap();

    // Edits go with an approval only, and must be a JSON object.
    let args_file = tmp.path().join("edited.json");
    std::fs::write(&args_file, "[1, 2]").unwrap();
    let out = decide(
        &hub,
        &[
            "approve",
            &task,
            &call_id,
            "--args",
            args_file.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success(), "an array was taken as arguments");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("expected a JSON object"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&args_file, r#"{"amount": 3}"#).unwrap();
    let out = decide(
        &hub,
        &[
            "approve",
            &task,
            &call_id,
            "--args",
            args_file.to_str().unwrap(),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "approve --args: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(r#"with edited arguments {"amount":3}"#),
        "{stdout}"
    );

    let done = wait_task(&hub, &task);
    assert_eq!(done["state"], "succeeded", "{done}");
    let result = done["outcome"]["result"].as_str().unwrap_or_default();
    assert!(
        result.contains("approved this call with edited arguments") && result.contains("charged 3"),
        "the model is told: {result}"
    );

    // The server received the edited arguments, exactly once, and never the asked ones.
    let charges: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["tool"] == "charge")
        .map(|v| v["args"]["amount"].clone())
        .collect();
    assert_eq!(charges, vec![json!(3)]);

    // The audit log records the edit with the decision.
    let audit = hub.cli_json(&["audit", "-o", "json"]).unwrap();
    let decisions: Vec<&Value> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["call"] == "DecideApproval" && e["outcome"] == "ok")
        .collect();
    assert_eq!(decisions.len(), 1, "{audit:#}");
    assert!(
        decisions[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains(r#"approved with edited arguments {"amount":3}"#)),
        "{audit:#}"
    );

    // The run log records the edited arguments with the decision.
    let events = hub.cli(&["trace", &task, "--events"]).unwrap();
    let events = String::from_utf8_lossy(&events.stdout);
    let line = events
        .lines()
        .find(|l| l.contains("approval.decided"))
        .unwrap_or_else(|| panic!("no approval.decided in {events}"));
    assert!(
        line.contains(r#"with edited arguments {"amount":3}"#),
        "{line}"
    );
}
