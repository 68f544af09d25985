//! MCP resources and prompts end to end with a real server (`library_server.py`, the Python MCP
//! SDK) and the scripted model through `agen run`: `agent.md` `systemPrompts:
//! [library/house_style]` puts the server's prompt in the system prompt; the
//! `list_resources`/`read_resource` built-ins list and read the server's resources; a bundle
//! whose permissions deny `read_resource` never offers it and its call never reaches the
//! server. On a fleet, `agen ps --all -o json` lists each instance's resources and a task
//! reads one.

use std::path::Path;
use std::process::{Command, Stdio};

use agen_tests::{mcp_json, write_bundle, FakeModel, HubProcess, Peers};
use serde_json::{json, Value};

const STYLE: &str = "House style: answer in haiku, never more than three lines.";

fn bundle(dir: &Path, model: &FakeModel, log: &Path, config: Value) {
    let server = json!({"command": Peers::python(), "args": [Peers::script("servers/library_server.py")], "env": {"LIBRARY_LOG": log}});
    write_bundle(
        dir,
        &[
            ("mcp.json", mcp_json(&[("library", server)])),
            ("x-agen/config.json", config.to_string()),
            (
                "x-agen/agent.md",
                format!("---\nname: writer\nmodel: openai/fake-model\nbaseUrl: {}\nsystemPrompts: [library/house_style]\n---\nYou write.\n", model.base_url()),
            ),
        ],
    )
    .unwrap();
}

fn run(dir: &Path, state: &Path) -> (Option<i32>, String) {
    let out = Command::new(agen_tests::agen_bin())
        .args(["run", dir.to_str().unwrap(), "write"])
        .env("XDG_STATE_HOME", state)
        .stdin(Stdio::null())
        .output()
        .expect("agen run starts");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), all)
}

fn lines(file: &Path) -> Vec<Value> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn tool_names(request: &Value) -> Vec<String> {
    request["body"]["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["function"]["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn tool_results(request: &Value) -> Vec<String> {
    request["body"]["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["role"] == "tool")
                .filter_map(|m| m["content"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_servers_prompt_joins_the_system_prompt_and_its_resources_are_listed_and_read() {
    let tmp = tempfile::tempdir().unwrap();
    let recorded = tmp.path().join("model-requests.jsonl");
    let script = json!({"record": recorded, "steps": [
        {"tool_calls": [{"name": "list_resources", "arguments": {}}]},
        {"tool_calls": [{"name": "read_resource", "arguments": {"server": "library", "uri": "library://style"}}]},
        {"reply": "done"}
    ]});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let log = tmp.path().join("library.jsonl");
    let dir = tmp.path().join("writer");
    bundle(&dir, &model, &log, json!({}));
    let (code, all) = run(&dir, &tmp.path().join("state"));
    assert_eq!(code, Some(0), "{all}");

    let sent = lines(&recorded);
    assert_eq!(sent.len(), 3, "{all}");
    // The prompt is part of the system prompt, after the agent.md body.
    let system = sent[0]["body"]["messages"][0].clone();
    assert_eq!(system["role"], "system", "{system}");
    assert!(
        system["content"]
            .as_str()
            .is_some_and(|s| s.starts_with("You write.") && s.contains(STYLE)),
        "{system}"
    );
    let names = tool_names(&sent[0]);
    assert!(
        names.contains(&"list_resources".to_string())
            && names.contains(&"read_resource".to_string()),
        "{names:?}"
    );
    let listed = tool_results(&sent[1]);
    assert_eq!(listed.len(), 1, "{listed:?}");
    let listed: Vec<Value> = listed[0]
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        listed
            .iter()
            .map(|r| (r["server"].as_str().unwrap(), r["uri"].as_str().unwrap()))
            .collect::<Vec<_>>(),
        vec![
            ("library", "library://style"),
            ("library", "library://secret")
        ]
    );
    let read = tool_results(&sent[2]);
    assert_eq!(
        read.last().map(String::as_str),
        Some(format!("# Style\n{STYLE}").as_str())
    );
    assert_eq!(lines(&log), vec![json!({"read": "library://style"})]);
}

#[test]
fn a_denied_read_resource_is_not_offered_and_never_reaches_the_server() {
    let tmp = tempfile::tempdir().unwrap();
    let recorded = tmp.path().join("model-requests.jsonl");
    let script = json!({"record": recorded, "steps": [
        {"tool_calls": [{"name": "read_resource", "arguments": {"server": "library", "uri": "library://secret"}}]},
        {"reply": "done"}
    ]});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let log = tmp.path().join("library.jsonl");
    let dir = tmp.path().join("writer");
    bundle(
        &dir,
        &model,
        &log,
        json!({"permissions": {"deny": ["read_resource"]}}),
    );
    let (code, all) = run(&dir, &tmp.path().join("state"));
    assert_eq!(code, Some(0), "{all}");
    let sent = lines(&recorded);
    assert_eq!(sent.len(), 2, "{all}");
    let names = tool_names(&sent[0]);
    assert!(names.contains(&"list_resources".to_string()), "{names:?}");
    assert!(!names.contains(&"read_resource".to_string()), "{names:?}");
    let refused = tool_results(&sent[1]);
    assert!(
        refused
            .iter()
            .any(|r| r.contains("tool read_resource was not run")),
        "{refused:?}"
    );
    assert_eq!(lines(&log), Vec::<Value>::new(), "the server read nothing");
}

#[test]
fn a_prompt_the_server_does_not_have_stops_the_run_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let model = FakeModel::start(&tmp.path().join("model"), &json!([{"reply": "done"}])).unwrap();
    let dir = tmp.path().join("writer");
    bundle(&dir, &model, &tmp.path().join("library.jsonl"), json!({}));
    let agent = dir.join("x-agen/agent.md");
    let text = std::fs::read_to_string(&agent)
        .unwrap()
        .replace("library/house_style", "library/no_such_prompt");
    std::fs::write(&agent, text).unwrap();
    let (code, all) = run(&dir, &tmp.path().join("state"));
    assert_ne!(code, Some(0), "{all}");
    assert!(
        all.contains("systemPrompts: tool server library has no prompt no_such_prompt"),
        "{all}"
    );
}

#[test]
fn a_fleet_instance_lists_its_servers_resources_in_ps_and_a_task_reads_one() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let recorded = tmp.path().join("model-requests.jsonl");
    let script = json!({"record": recorded, "steps": [
        {"tool_calls": [{"name": "read_resource", "arguments": {"server": "library", "uri": "library://style"}}]},
        {"reply_template": "{{last_tool_result}}"}
    ]});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let log = tmp.path().join("library.jsonl");
    let dir = tmp.path().join("writer");
    bundle(&dir, &model, &log, json!({}));
    let out = hub
        .cli(&[
            "deploy",
            dir.to_str().unwrap(),
            "--name",
            "writer",
            "--wait",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = agen_tests::wait_for(
        "the instance's resources",
        std::time::Duration::from_secs(30),
        || {
            let ps = hub.cli_json(&["ps", "--all", "-o", "json"]).ok()?;
            let inst = ps.as_array()?.first()?.clone();
            inst["resources"]
                .as_array()
                .filter(|r| !r.is_empty())
                .cloned()
        },
    )
    .unwrap();
    assert_eq!(
        listed,
        vec![
            json!({"server": "library", "uri": "library://style", "name": "style", "mime_type": "text/markdown"}),
            json!({"server": "library", "uri": "library://secret", "name": "secret", "mime_type": "text/plain"}),
        ]
    );
    let out = hub.cli(&["submit", "writer", "style?"]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let done = hub
        .cli_json(&["wait", &task, "-o", "json", "--timeout", "90s"])
        .unwrap();
    assert_eq!(done["state"], "succeeded", "{done}");
    let q = hub.cli_json(&["query", &task, "-o", "json"]).unwrap();
    assert_eq!(q["outcome"]["result"], format!("# Style\n{STYLE}"), "{q}");
    assert_eq!(lines(&log), vec![json!({"read": "library://style"})]);
}
