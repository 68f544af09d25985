//! Per-tool limits (`x-agen/config.json` `tools.<name>` `timeout`, `retries`, `backoff`, and
//! whole-server entries `ledger.*`) end to end: `agen run` on a bundle whose server is the real
//! Python MCP SDK ledger server (`tests/peers/servers/ledger_server.py`, which logs every call
//! it receives and sleeps only on the first call of each tool), driven by the scripted model.

use std::path::Path;

use agen_tests::{mcp_json, write_bundle, FakeModel, Peers};
use serde_json::{json, Value};

/// How often the ledger server received a call of `tool`.
fn calls(log: &Path, tool: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["tool"] == tool)
        .count()
}

/// The tool results the model was sent in its second request: (call id, content).
fn tool_results(requests: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(requests).expect("the model recorded its requests");
    let second: Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .nth(1)
        .expect("a second model request");
    second["body"]["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap_or_default().to_string(),
                m["content"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_per_tool_timeout_cuts_one_tool_only_and_retries_only_an_idempotent_one() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("ledger.jsonl");
    let requests = tmp.path().join("model-requests.jsonl");
    // Three calls at once, each sleeping 2 s on its first call.
    let script = json!({"record": requests, "steps": [
        {"tool_calls": [
            {"name": "ledger_lookup", "arguments": {"key": "a", "seconds": 2}},
            {"name": "ledger_put", "arguments": {"key": "k", "value": "v", "seconds": 2}},
            {"name": "ledger_charge", "arguments": {"amount": 5, "seconds": 2}}
        ]},
        {"reply": "done"}
    ]});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let dir = tmp.path().join("bundle");
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
                format!("---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou bill customers.\n", model.base_url()),
            ),
            (
                "x-agen/config.json",
                json!({"tools": {
                    // The whole server: 1 s.
                    "ledger.*": {"timeout": "1s"},
                    // Its own entry wins: lookup may take 30 s.
                    "ledger_lookup": {"timeout": "30s"},
                    // Idempotent: retried after its first call timed out.
                    "ledger.put": {"retries": 2, "backoff": "100ms"},
                    // Side-effecting: its retries are never used.
                    "ledger.charge": {"retries": 2, "backoff": "100ms"}
                }})
                .to_string(),
            ),
        ],
    )
    .unwrap();
    let out = std::process::Command::new(agen_tests::agen_bin())
        .args(["run", dir.to_str().unwrap(), "go"])
        .env("XDG_STATE_HOME", tmp.path().join("state"))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("agen run starts");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "done");

    // In the order asked (the harness gives calls ids of its own).
    let results: Vec<String> = tool_results(&requests)
        .into_iter()
        .map(|(_, c)| c)
        .collect();
    assert_eq!(results.len(), 3, "{results:?}");
    assert!(results[0].contains("value of a"), "{results:?}");
    assert!(results[1].contains("stored k"), "{results:?}");
    // The side-effecting charge may have run: `effect_unknown`, never "cancelled".
    assert_eq!(
        results[2],
        "effect_unknown: the call to ledger_charge was interrupted before its result was recorded; it may or may not have taken effect. Check before calling it again. (no answer within 1s)",
        "{results:?}"
    );
    // lookup ran once, within its own 30 s; put timed out once and its retry answered; the
    // side-effecting charge was cut at the server's 1 s and never sent again.
    assert_eq!(
        [
            calls(&log, "lookup"),
            calls(&log, "put"),
            calls(&log, "charge")
        ],
        [1, 2, 1]
    );
}

#[test]
fn a_bad_per_tool_limit_is_refused_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("bundle");
    write_bundle(
        &dir,
        &[
            ("mcp.json", mcp_json(&[])),
            (
                "x-agen/agent.md",
                "---\nmodel: openai/fake-model\nbaseUrl: http://127.0.0.1:9/v1\n---\nx\n".into(),
            ),
            (
                "x-agen/config.json",
                json!({"tools": {"ledger.*": {"retries": 11}}}).to_string(),
            ),
        ],
    )
    .unwrap();
    let out = std::process::Command::new(agen_tests::agen_bin())
        .args(["run", dir.to_str().unwrap(), "go"])
        .env("XDG_STATE_HOME", tmp.path().join("state"))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("agen run starts");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(
            "x-agen/config.json: tools.ledger.*.retries: 11 is over the limit of 10 retries"
        ),
        "{stderr}"
    );
}
