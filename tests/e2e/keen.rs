//! The Keen dialect end to end (issue 5): a scripted model that emits `<SYSTEM CALL>` text
//! blocks drives script tools, flow tools and MCP tools through `agen run` (the same harness as
//! the fleet) and on a fleet; results and failures come back exactly as the Keen guide says.

use std::path::Path;

use agen_tests::{agen_bin, mcp_json, write_bundle, FakeModel, HubProcess, Peers};
use serde_json::{json, Value};

const RECOVERY: &str = "No tool response. The tool call could not be completed; check the call and try again, or tell the user it cannot run right now.";

fn call(action: &str, tool: &str, context: &str) -> String {
    format!("I'll use the tool.\n\n<SYSTEM CALL>\n!*action\n{action}\n!*tool\n{tool}\n!*context\n{context}\n</SYSTEM CALL>\n")
}

/// A Keen bundle: script tools (timestamp, sensor, a runaway loop, a memory hog, an fs
/// prober), a flow tool whose `compute-stamp` node fails, and `mcp-server-time`.
fn keen_bundle(dir: &Path, model: &FakeModel) {
    write_bundle(
        dir,
        &[
            ("mcp.json", mcp_json(&[("time", json!({"command": Peers::mcp_server_time(), "args": ["--local-timezone", "UTC"]}))])),
            (
                "x-agen/agent.md",
                format!("---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou are helpful assistent.\n", model.base_url()),
            ),
            ("x-agen/harness.json", json!({"toolProtocol": "keen", "limits": {"scriptTimeout": "1s"}}).to_string()),
            (
                "keen-tools.json",
                json!([
                    {"name": "ToolTimestampScript", "type": "script", "entry": "tools/timestamp.js", "attempts": 20},
                    {"name": "Sensor", "type": "script", "entry": "tools/sensor.js", "attempts": 5},
                    {"name": "OneShot", "type": "script", "entry": "tools/timestamp.js", "attempts": 0},
                    {"name": "Spin", "type": "script", "entry": "tools/spin.js"},
                    {"name": "Hog", "type": "script", "entry": "tools/hog.js"},
                    {"name": "Prober", "type": "script", "entry": "tools/prober.js"},
                    {"name": "ToolTimestamp", "type": "flow", "entry": "Next-ToolCall", "attempts": 5}
                ])
                .to_string(),
            ),
            (
                "tools/timestamp.js",
                "module.exports = { exec(props, dictionary) { dictionary.result = 'The current timestamp is 2026-05-07T10:42:13Z'; } };\n".into(),
            ),
            (
                "tools/sensor.js",
                r#"module.exports = {
  async exec(props, dictionary) {
    if (!props.sensorID) {
      dictionary.result = 'You did not provide a sensorID. Please call again with !*context containing sensorID=<number>.';
      return;
    }
    if (props.sensorID === '300') {
      dictionary.result = 'Could not connect to sensor 300';
      dictionary.toolStatus = 'error';
      return;
    }
    dictionary.result = `Sensor ${props.sensorID} reads 21 degrees.`;
  }
};
"#
                .into(),
            ),
            ("tools/spin.js", "exports.exec = function () { for (;;) {} };\n".into()),
            ("tools/hog.js", "exports.exec = function () { const a = []; for (;;) { a.push('x'.repeat(1 << 20)); } };\n".into()),
            (
                "tools/prober.js",
                "exports.exec = function (props, dictionary) { const fs = require('fs'); dictionary.result = fs.readFileSync('/etc/passwd', 'utf8'); };\n".into(),
            ),
            ("tools/stamp.js", "exports.exec = function (props, dictionary) { dictionary.result = now(); };\n".into()),
            (
                "flows/Next.json",
                json!({"nodes": {
                    "ToolCall": {"type": "start", "next": "compute-stamp"},
                    "compute-stamp": {"type": "script", "entry": "tools/stamp.js", "next": "done"},
                    "done": {"type": "end"}
                }})
                .to_string(),
            ),
        ],
    )
    .expect("write bundle");
}

struct Standalone {
    tmp: tempfile::TempDir,
    model: FakeModel,
    bundle: std::path::PathBuf,
}

fn standalone(steps: Value) -> Standalone {
    let tmp = tempfile::tempdir().unwrap();
    let script = json!({"steps": steps, "record": tmp.path().join("requests.jsonl")});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let bundle = tmp.path().join("bundle");
    keen_bundle(&bundle, &model);
    Standalone { tmp, model, bundle }
}

impl Standalone {
    /// `agen run` → (exit code, stdout).
    fn run(&self, prompt: &str) -> (i32, String) {
        let out = std::process::Command::new(agen_bin())
            .arg("run")
            .arg(&self.bundle)
            .arg(prompt)
            .env("XDG_STATE_HOME", self.tmp.path().join("state"))
            .output()
            .unwrap();
        let _ = &self.model;
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(self.tmp.path().join("requests.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The text of the last user message of request `i`.
    fn last_user(&self, i: usize) -> String {
        let reqs = self.requests();
        let msgs = reqs[i]["body"]["messages"].as_array().unwrap().clone();
        msgs.iter()
            .rev()
            .find(|m| m["role"] == "user")
            .map(|m| m["content"].as_str().unwrap_or("").to_owned())
            .unwrap_or_default()
    }
}

#[test]
fn a_script_tool_answers_in_a_system_response_and_no_native_tools_are_sent() {
    let s = standalone(
        json!([{"reply": call("use tool", "ToolTimestampScript", "")}, {"reply": "It is 10:42."}]),
    );
    let (code, out) = s.run("What time is it?");
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.trim(), "It is 10:42.");
    let reqs = s.requests();
    assert!(
        reqs[0]["body"].get("tools").is_none(),
        "keen mode sends no tools field"
    );
    let system = reqs[0]["body"]["messages"][0]["content"].as_str().unwrap();
    for must in [
        "Your tools are:",
        "This tool is a script.",
        "This tool is a pipe.",
        "**Important:**",
        "**ERRORS:**",
        "time_get_current_time",
    ] {
        assert!(system.contains(must), "system prompt lacks {must:?}");
    }
    let answer = s.last_user(1);
    assert!(
        answer.starts_with("<SYSTEM RESPONSE>")
            && answer.contains("The current timestamp is 2026-05-07T10:42:13Z"),
        "{answer}"
    );
}

#[test]
fn soft_validation_coaches_a_corrected_retry_and_tool_status_error_is_a_script_error() {
    let s = standalone(json!([
        {"reply": call("use tool", "Sensor", "")},
        {"reply": call("use tool", "Sensor", "sensorID=100")},
        {"reply": call("use tool", "Sensor", "sensorID=300")},
        {"reply": "Sensor 100 reads 21 degrees; sensor 300 is unreachable."}
    ]));
    let (code, _) = s.run("Read sensors 100 and 300");
    assert_eq!(code, 0);
    assert!(s.last_user(1).contains("You did not provide a sensorID"));
    assert!(s.last_user(2).contains("Sensor 100 reads 21 degrees."));
    let err = s.last_user(3);
    assert!(
        err.starts_with("<SYSTEM SCRIPT ERROR>") && err.contains("Could not connect to sensor 300"),
        "{err}"
    );
}

#[test]
fn a_failing_flow_node_is_a_flow_error_naming_the_node() {
    let s = standalone(
        json!([{"reply": call("use tool flow", "ToolTimestamp", "")}, {"reply": "I could not get the timestamp."}]),
    );
    let (code, _) = s.run("What time is it?");
    assert_eq!(code, 0);
    let err = s.last_user(1);
    assert!(err.starts_with("<SYSTEM FLOW ERROR>"), "{err}");
    assert!(
        err.contains("ScriptNode \"compute-stamp\" threw:") && err.contains("now"),
        "{err}"
    );
}

#[test]
fn an_mcp_tool_is_called_through_the_text_protocol() {
    let s = standalone(json!([
        {"reply": call("use tool", "time_get_current_time", "{\"timezone\": \"UTC\"}")},
        {"reply": "done"}
    ]));
    assert_eq!(s.run("time?").0, 0);
    let r = s.last_user(1);
    assert!(
        r.starts_with("<SYSTEM RESPONSE>") && r.contains("datetime"),
        "{r}"
    );
}

#[test]
fn mistakes_and_sandbox_escapes_get_the_general_recovery_prompt() {
    let s = standalone(json!([
        {"reply": format!("```\n{}```\n", call("use tool", "ToolTimestampScript", ""))},
        {"reply": call("use tool", "NoSuchTool", "")},
        {"reply": call("use tool flow", "ToolTimestampScript", "")},
        {"reply": call("use tool", "Spin", "")},
        {"reply": call("use tool", "Hog", "")},
        {"reply": call("use tool", "Prober", "")},
        {"reply": call("use tool", "ToolTimestampScript", "")},
        {"reply": "finished"}
    ]));
    let started = std::time::Instant::now();
    let (code, out) = s.run("go");
    assert_eq!(code, 0, "{out}");
    for i in 1..=6 {
        assert_eq!(s.last_user(i).trim(), RECOVERY, "turn {i}");
    }
    // The engine kept serving after the runaway scripts.
    assert!(s.last_user(7).contains("The current timestamp is"));
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

#[test]
fn attempts_run_out_and_the_model_is_told_attempts_0() {
    let s = standalone(json!([
        {"reply": call("use tool", "OneShot", "")},
        {"reply": call("use tool", "OneShot", "")},
        {"reply": "ok"}
    ]));
    assert_eq!(s.run("go").0, 0);
    assert!(s.last_user(1).contains("The current timestamp is"));
    let second = s.last_user(2);
    assert!(second.contains("attempts 0"), "{second}");
    assert!(
        !second.contains("The current timestamp is"),
        "a spent tool is not dispatched again"
    );
}

#[test]
fn a_provider_error_in_keen_mode_is_not_recalled() {
    let s = standalone(json!([{"status": 500, "body": "upstream down"}]));
    let (code, _) = s.run("go");
    assert_ne!(code, 0);
    let n = s.requests().len();
    assert!((1..=5).contains(&n), "bounded retries only, no recall: {n}");
}

#[test]
fn a_keen_agent_runs_on_the_fleet() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [{"reply": call("use tool", "Spin", "")}, {"reply_template": "after: {{last_user}}"}]}),
    )
    .unwrap();
    let bundle = tmp.path().join("bundle");
    keen_bundle(&bundle, &model);
    let out = hub
        .cli(&[
            "deploy",
            bundle.to_str().unwrap(),
            "--name",
            "keen",
            "--wait",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for _ in 0..2 {
        // The runaway script is stopped and the instance keeps serving the next task.
        let out = hub
            .cli(&["submit", "keen", "go", "--wait", "-o", "json"])
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("No tool response."), "{stdout}");
        // While it waits, `agen wait` shows which tool is being called, then that the agent is
        // reading its result.
        let stderr = String::from_utf8_lossy(&out.stderr);
        let calling = stderr
            .find("running script tool Spin")
            .unwrap_or_else(|| panic!("{stderr}"));
        let reading = stderr
            .find("reading the result of Spin")
            .unwrap_or_else(|| panic!("{stderr}"));
        assert!(calling < reading, "{stderr}");
    }
}
