//! Structured output (`x-agen/agent.md` `outputSchema: schema.json`, `limits.outputRetries`)
//! end to end with the scripted model: on a fleet, answers that are not JSON or break the schema
//! are sent back with the schema error until one matches, the task's result is that JSON
//! (`agen query -o json` shows it parsed) and the OpenAI request carried the schema as
//! `response_format`; with `agen run`, a model that never matches fails the run naming the
//! schema error once its retries are spent.

use std::path::Path;
use std::time::Duration;

use agen_tests::{mcp_json, write_bundle, FakeModel, HubProcess};
use serde_json::{json, Value};

fn schema() -> Value {
    json!({"type": "object", "properties": {"city": {"type": "string"}, "temp": {"type": "number"}}, "required": ["city", "temp"]})
}

fn bundle(dir: &Path, model: &FakeModel, harness: Value) {
    write_bundle(
        dir,
        &[
            ("mcp.json", mcp_json(&[])),
            ("schema.json", schema().to_string()),
            ("x-agen/harness.json", harness.to_string()),
            (
                "x-agen/agent.md",
                format!("---\nname: weather\nmodel: openai/fake-model\nbaseUrl: {}\noutputSchema: schema.json\n---\nYou report the weather.\n", model.base_url()),
            ),
        ],
    )
    .unwrap();
}

fn requests(file: &Path) -> Vec<Value> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[test]
fn a_schema_violating_answer_is_retried_then_accepted_as_the_tasks_json_result() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let recorded = tmp.path().join("model-requests.jsonl");
    let script = json!({"record": recorded, "steps": [
        {"reply": "It is 3 degrees in Oslo."},
        {"reply": "{\"city\": \"Oslo\", \"temp\": \"cold\"}"},
        {"reply": "```json\n{\"city\": \"Oslo\", \"temp\": 3}\n```"}
    ]});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let dir = tmp.path().join("weather");
    bundle(&dir, &model, json!({}));
    let out = hub
        .cli(&[
            "deploy",
            dir.to_str().unwrap(),
            "--name",
            "weather",
            "--wait",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = hub.cli(&["submit", "weather", "Oslo?"]).unwrap();
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
    assert_eq!(
        q["outcome"]["result"],
        json!({"city": "Oslo", "temp": 3}),
        "{q}"
    );
    assert_eq!(q["outcome"]["response_type"], "json", "{q}");

    let sent = agen_tests::wait_for("three model requests", Duration::from_secs(10), || {
        let r = requests(&recorded);
        (r.len() >= 3).then_some(r)
    })
    .unwrap();
    assert_eq!(sent.len(), 3, "two refusals, one acceptance");
    // Native structured output: every request carries the schema.
    for r in &sent {
        assert_eq!(
            r["body"]["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema(), "strict": false}}),
            "{r}"
        );
    }
    let last_user = |r: &Value| {
        r["body"]["messages"]
            .as_array()
            .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        last_user(&sent[1]).contains("the answer is not JSON"),
        "{}",
        last_user(&sent[1])
    );
    assert!(
        last_user(&sent[2])
            .contains("the answer does not match outputSchema schema.json: at /temp:"),
        "{}",
        last_user(&sent[2])
    );
}

#[test]
fn a_run_that_never_matches_its_schema_fails_naming_the_schema_error() {
    let tmp = tempfile::tempdir().unwrap();
    let recorded = tmp.path().join("model-requests.jsonl");
    let script = json!({"record": recorded, "steps": [{"reply": "{\"city\": 7, \"temp\": 3}"}]});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let dir = tmp.path().join("weather");
    bundle(&dir, &model, json!({"limits": {"outputRetries": 1}}));
    let out = std::process::Command::new(agen_tests::agen_bin())
        .args(["run", dir.to_str().unwrap(), "Oslo?"])
        .env("XDG_STATE_HOME", tmp.path().join("state"))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("agen run starts");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(out.status.code(), Some(0), "{all}");
    assert!(
        all.contains("no valid answer after 2 tries (limits.outputRetries 1): the answer does not match outputSchema schema.json: at /city:"),
        "{all}"
    );
    assert_eq!(requests(&recorded).len(), 2, "one answer and one retry");
}

#[test]
fn a_tasks_own_output_schema_travels_with_it_and_its_result_is_that_json() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let recorded = tmp.path().join("model-requests.jsonl");
    let script = json!({"record": recorded, "steps": [
        {"reply": "{\"city\": \"Oslo\"}"},
        {"reply": "{\"city\": \"Oslo\", \"temp\": 3}"}
    ]});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    // A bundle with no outputSchema of its own: the schema comes with the task.
    let dir = tmp.path().join("plain");
    write_bundle(
        &dir,
        &[
            ("mcp.json", mcp_json(&[])),
            (
                "x-agen/agent.md",
                format!("---\nname: plain\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou report the weather.\n", model.base_url()),
            ),
        ],
    )
    .unwrap();
    let out = hub
        .cli(&["deploy", dir.to_str().unwrap(), "--name", "plain", "--wait"])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A schema that is not a JSON schema is refused at submit, naming the flag's field.
    let bad = tmp.path().join("bad.json");
    std::fs::write(&bad, r#"{"type": 7}"#).unwrap();
    let out = hub
        .cli(&[
            "submit",
            "plain",
            "Oslo?",
            "--output-schema",
            bad.to_str().unwrap(),
        ])
        .unwrap();
    assert!(!out.status.success(), "a broken schema is refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("output_schema_json: not a valid JSON schema"),
        "{err}"
    );

    let file = tmp.path().join("task-schema.json");
    std::fs::write(&file, schema().to_string()).unwrap();
    let out = hub
        .cli(&[
            "submit",
            "plain",
            "Oslo?",
            "--output-schema",
            file.to_str().unwrap(),
        ])
        .unwrap();
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
    assert_eq!(
        q["outcome"]["result"],
        json!({"city": "Oslo", "temp": 3}),
        "{q}"
    );
    assert_eq!(q["outcome"]["response_type"], "json", "{q}");
    let sent = requests(&recorded);
    assert_eq!(sent.len(), 2, "one refusal (no temp), one acceptance");
    for r in &sent {
        assert_eq!(
            r["body"]["response_format"]["json_schema"]["schema"],
            schema(),
            "{r}"
        );
    }
    let retry = sent[1]["body"]["messages"].to_string();
    assert!(
        retry.contains("the answer does not match outputSchema --output-schema: at /:"),
        "{retry}"
    );
}
