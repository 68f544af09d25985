//! Issue 41 item 8, as the attacker: the smaller holes a bundle author or a namespace deployer
//! could use (a bundle raising its own delegation depth, …), each ending in counts.

use agen_tests::{free_port, write_bundle, FakeModel, HubProcess};
use serde_json::{json, Value};

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

/// "`agen hub --max-delegation-depth` (default 5) caps any bundle's value."
///
/// A bundle that delegates to itself and asks for `maxDelegationDepth` 50, on a Hub started
/// with `--max-delegation-depth 2`: the tree stops at depth 2 (3 tasks in all, 0 deeper), the
/// deepest call's refusal names the Hub's flag.
#[test]
fn a_bundle_cannot_raise_its_delegation_depth_past_the_hubs_cap() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start_with_args(
        tmp.path(),
        free_port(),
        "3s",
        &["--max-delegation-depth", "2"],
    )
    .unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!([
            {"tool_calls": [{"name": "call_agent", "arguments": {"agent": "deep", "input": "deeper"}}]},
            {"reply_template": "got: {{last_tool_result}}"}
        ]),
    )
    .unwrap();
    let dir = tmp.path().join("deep");
    write_bundle(
        &dir,
        &[
            (
                "x-agen/agent.md",
                format!(
                    "---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou delegate.\n",
                    model.base_url()
                ),
            ),
            (
                "x-agen/config.json",
                json!({"delegates": ["deep"]}).to_string(),
            ),
            (
                "x-agen/harness.json",
                json!({"limits": {"maxDelegationDepth": 50}}).to_string(),
            ),
        ],
    )
    .unwrap();
    let o = hub
        .cli(&[
            "deploy",
            dir.to_str().unwrap(),
            "--name",
            "deep",
            "--concurrency",
            "4",
            "--wait",
        ])
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = hub.cli(&["submit", "deep", "go"]).unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let task = text(&o.stdout).trim().to_string();
    let done = hub
        .cli_json(&["wait", &task, "-o", "json", "--timeout", "90s"])
        .unwrap();
    assert_eq!(done["state"], "succeeded", "{done}");
    let result = done["outcome"]["result"].as_str().unwrap_or_default();
    assert!(
        result.starts_with("got: got: got: ") && result.contains("--max-delegation-depth of 2"),
        "{result}"
    );
    let tasks: Vec<Value> = hub
        .cli_json(&["tasks", "-o", "json", "--limit", "0"])
        .unwrap()
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        tasks.len(),
        3,
        "the root and 2 levels of children: {tasks:?}"
    );
}
