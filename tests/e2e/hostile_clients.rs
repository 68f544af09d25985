//! Hostile clients (issue 41) on a real fleet: a model that repeats one tool-call id with other
//! arguments gets each call asked again (an approval decides one call).

use std::time::{Duration, Instant};

use agen_tests::{FakeModel, HubProcess};
use serde_json::{json, Value};

use crate::approvals::{deploy_asker, submit};

#[test]
fn a_model_repeating_one_call_id_with_other_arguments_is_asked_every_time() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("ran.txt");
    // Ten turns, each a `ws.run` with the same model id `dup` and its own command.
    let mut steps: Vec<Value> = (0..10)
        .map(|i| {
            json!({"tool_calls": [{"name": "ws_run", "id": "dup",
                "arguments": {"command": format!("echo ran-{i} >> {}", marker.display())}}]})
        })
        .collect();
    steps.push(json!({"reply": "done"}));
    let model = FakeModel::start(&tmp.path().join("model"), &json!({ "steps": steps })).unwrap();
    deploy_asker(&hub, &tmp.path().join("asker"), "asker", &model);
    let task = submit(&hub, "asker");

    // Approve the even calls, deny the odd ones, as each is asked.
    let mut asked: Vec<(String, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        assert!(
            Instant::now() < deadline,
            "task did not end; asked so far {asked:?}"
        );
        let pending = hub.cli_json(&["approvals", "-o", "json"]).unwrap();
        if let Some(p) = pending
            .as_array()
            .and_then(|a| a.iter().find(|a| a["task"] == task))
        {
            let call_id = p["call_id"].as_str().unwrap().to_string();
            let command = p["arguments"]["command"].as_str().unwrap().to_string();
            let n = asked.len();
            let verb = if n.is_multiple_of(2) {
                "approve"
            } else {
                "deny"
            };
            let out = hub.cli(&[verb, &task, &call_id]).unwrap();
            assert!(
                out.status.success(),
                "{verb}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            asked.push((call_id, command));
            continue;
        }
        let q = hub.cli_json(&["query", &task, "-o", "json"]).unwrap();
        if matches!(
            q["state"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        ) {
            assert_eq!(q["state"], "succeeded", "{q}");
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let ran: Vec<String> = std::fs::read_to_string(&marker)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    let approved: Vec<String> = (0..10).step_by(2).map(|i| format!("ran-{i}")).collect();
    let unasked = ran.iter().filter(|r| !approved.contains(r)).count();
    println!(
        "repeated call id x10: asked {}, ran {}, ran unasked {unasked}",
        asked.len(),
        ran.len()
    );
    assert_eq!(
        (asked.len(), ran.len(), unasked),
        (10, 5, 0),
        "ran: {ran:?}"
    );
    assert_eq!(ran, approved, "exactly the approved calls ran, in order");
    // Each call was asked with its own arguments, under an id of the run's own (never `dup`).
    for (i, (call_id, command)) in asked.iter().enumerate() {
        assert!(command.starts_with(&format!("echo ran-{i} ")), "{command}");
        assert_ne!(call_id, "dup");
    }
    let mut ids: Vec<&String> = asked.iter().map(|(id, _)| id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 10, "ten different call ids: {asked:?}");
}
