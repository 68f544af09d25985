//! `agen trace TASK --events` as a user reads a finished run's story: the states, each model
//! turn with its tokens and the calls it made, an MCP tool call with its recorded arguments
//! (`traceToolArguments`) and its result, a built-in call, the artifact, and the run's end, in order.

use std::time::Duration;

use agen_tests::{mcp_json, write_bundle, FakeModel, HubProcess, Peers};
use serde_json::{json, Value};

#[test]
fn agen_trace_events_tells_the_whole_story_of_a_run() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("storyteller", &[], &[]).unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [
            {"tool_calls": [{"name": "meta_echo", "arguments": {"text": "once upon"}}]},
            {"tool_calls": [{"name": "save_artifact", "arguments": {"name": "story.txt", "content": "once upon"}}]},
            {"reply": "the story is saved"}
        ]}),
    )
    .unwrap();
    let bundle = tmp.path().join("story");
    write_bundle(
        &bundle,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "meta",
                    json!({"command": Peers::python(), "args": [Peers::script("servers/meta_server.py")]}),
                )]),
            ),
            (
                "x-agen/harness.json",
                json!({"traceToolArguments": true}).to_string(),
            ),
            (
                "x-agen/agent.md",
                format!(
                    "---\nname: story\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou write.\n",
                    model.base_url()
                ),
            ),
        ],
    )
    .unwrap();
    let out = hub
        .cli(&["deploy", bundle.to_str().unwrap(), "--name", "story"])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    hub.wait_instances("story running", Duration::from_secs(60), |l| {
        l.iter()
            .any(|i| i["deployment"] == "story" && i["healthy"] == true)
    })
    .unwrap();
    let out = hub.cli(&["submit", "story", "Write a story."]).unwrap();
    assert!(
        out.status.success(),
        "submit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let out = hub
        .cli(&["wait", &task, "-o", "json", "--timeout", "60s"])
        .unwrap();
    let done: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("wait: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(done["state"], "succeeded", "{done}");

    let out = hub.cli(&["trace", &task, "--events"]).unwrap();
    assert!(
        out.status.success(),
        "trace --events: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let story = String::from_utf8_lossy(&out.stdout).into_owned();
    // Each part of the story, in the order it happened.
    let parts = [
        "queued",
        "running",
        "model.requested",
        "calls meta_echo",
        "tool.started",
        r#"meta.echo (call"#,
        r#"arguments {"text":"once upon"}"#,
        "tool.completed",
        "meta.echo ok in",
        "once upon",
        "calls save_artifact",
        "save_artifact (call",
        "artifact.saved",
        "story.txt sha256:",
        "save_artifact ok in",
        "run.finished",
        "succeeded: the story is saved",
    ];
    let mut from = 0;
    for part in parts {
        match story[from..].find(part) {
            Some(i) => from += i + part.len(),
            None => panic!("`{part}` missing after byte {from} in:\n{story}"),
        }
    }
    assert!(
        story.contains("tokens 0 in / 0 out"),
        "each turn's tokens:\n{story}"
    );
}
