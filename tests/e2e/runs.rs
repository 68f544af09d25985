//! Agent runs on the fleet (issue 3): the scripted fake model (over the real OpenAI HTTP
//! client) drives real MCP tools; tasks are submitted, watched, queried and cancelled through
//! the CLI; conversations continue; provider errors end the task with `response_type: error`.

use std::path::Path;
use std::time::Duration;

use agen_tests::{
    agen_bin, mcp_json, wait_for, write_bundle, FakeModel, HubProcess, NestProcess, Peers,
};
use serde_json::{json, Value};

/// A bundle whose model is the fake model and whose tools are `mcp-server-time` and our
/// workspace server (for `run`: slow commands).
fn bundle(dir: &Path, model: &FakeModel, harness: Value) {
    write_bundle(
        dir,
        &[
            (
                "mcp.json",
                mcp_json(&[
                    ("time", json!({"command": Peers::mcp_server_time(), "args": ["--local-timezone", "UTC"]})),
                    ("ws", json!({"command": "agen", "args": ["mcp", "workspace", "--root", "."]})),
                ]),
            ),
            (
                "x-agen/agent.md",
                format!("---\nname: runner\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou tell the time.\n", model.base_url()),
            ),
            ("x-agen/harness.json", harness.to_string()),
        ],
    )
    .expect("write bundle");
}

pub(crate) struct Fleet {
    _tmp: tempfile::TempDir,
    pub(crate) hub: HubProcess,
    _nest: NestProcess,
    pub(crate) model: FakeModel,
    pub(crate) bundle: std::path::PathBuf,
}

/// A Hub, one Nest and a fake model following `script`, with deployment `runner` ready.
pub(crate) fn fleet(script: Value, harness: Value) -> Fleet {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    let mut script = script;
    script["record"] = json!(tmp.path().join("model-requests.jsonl"));
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let dir = tmp.path().join("bundle");
    bundle(&dir, &model, harness);
    let out = hub
        .cli(&[
            "deploy",
            dir.to_str().unwrap(),
            "--name",
            "runner",
            "--wait",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Fleet {
        hub,
        _nest: nest,
        model,
        bundle: dir,
        _tmp: tmp,
    }
}

impl Fleet {
    pub(crate) fn submit(&self, args: &[&str]) -> String {
        let mut all = vec!["submit", "runner"];
        all.extend_from_slice(args);
        let out = self.hub.cli(&all).unwrap();
        assert!(
            out.status.success(),
            "submit: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// `agen wait TASK -o json` → (exit code, task JSON).
    pub(crate) fn wait(&self, task: &str) -> (i32, Value) {
        let out = self
            .hub
            .cli(&["wait", task, "-o", "json", "--timeout", "60s"])
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "wait printed no JSON: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code().unwrap_or(-1), v)
    }

    pub(crate) fn model_requests(&self) -> Vec<Value> {
        let path = self.hub.dir.join("model-requests.jsonl");
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

fn time_script() -> Value {
    json!({"steps": [
        {"tool_calls": [{"name": "time_get_current_time", "arguments": {"timezone": "UTC"}}]},
        {"reply_template": "The time is {{last_tool_result}}"}
    ]})
}

#[test]
fn a_task_uses_a_real_tool_and_answers_with_its_result() {
    let f = fleet(time_script(), json!({}));
    let task = f.submit(&["What time is it?"]);
    let (code, t) = f.wait(&task);
    assert_eq!(code, 0, "{t}");
    assert_eq!(t["task"], task.as_str());
    assert_eq!(t["state"], "succeeded");
    assert_eq!(t["outcome"]["response_type"], "text");
    let result = t["outcome"]["result"].as_str().unwrap();
    assert!(result.starts_with("The time is"), "{result}");
    assert!(
        result.contains("UTC") && result.contains("datetime"),
        "the tool's output is in the answer: {result}"
    );

    // `agen query` gives the same outcome without waiting.
    let q = f.hub.cli_json(&["query", &task, "-o", "json"]).unwrap();
    assert_eq!(q["state"], "succeeded");
    assert_eq!(q["outcome"]["result"], t["outcome"]["result"]);
    assert!(q.get("progress").is_some() && q.get("activity").is_some());

    // The model saw the tool under its model name, and the native tools field was sent.
    let reqs = f.model_requests();
    assert_eq!(reqs.len(), 2, "one request per turn");
    let tools = reqs[0]["body"]["tools"].to_string();
    assert!(tools.contains("time_get_current_time"), "{tools}");

    // The same bundle standalone gives the same answer.
    let out = std::process::Command::new(agen_bin())
        .arg("run")
        .arg(&f.bundle)
        .arg("What time is it?")
        .env("XDG_STATE_HOME", f.hub.dir.join("state"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "agen run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let standalone = String::from_utf8_lossy(&out.stdout);
    assert!(
        standalone.starts_with("The time is") && standalone.contains("datetime"),
        "{standalone}"
    );

    // Tasks list and trace.
    let tasks = f.hub.cli_json(&["tasks", "-o", "json"]).unwrap();
    assert_eq!(tasks[0]["task"], task.as_str());
    let trace = f.hub.cli(&["trace", &task]).unwrap();
    assert!(
        trace.status.success(),
        "{}",
        String::from_utf8_lossy(&trace.stderr)
    );
    let _ = &f.model;
}

#[test]
fn a_retried_submit_with_one_request_id_creates_one_task() {
    let f = fleet(json!({"steps": [{"reply": "ok"}]}), json!({}));
    let a = f.submit(&["hello", "--request-id", "req-42"]);
    let b = f.submit(&["hello", "--request-id", "req-42"]);
    assert_eq!(a, b);
    let (code, _) = f.wait(&a);
    assert_eq!(code, 0);
    let tasks = f.hub.cli_json(&["tasks", "-o", "json"]).unwrap();
    assert_eq!(tasks.as_array().unwrap().len(), 1);
}

#[test]
fn a_provider_error_fails_the_task_with_response_type_error_and_no_recall() {
    let f = fleet(
        json!({"steps": [{"status": 401, "body": "{\"error\": {\"message\": \"invalid api key\"}}"}]}),
        json!({}),
    );
    let task = f.submit(&["hello"]);
    let (code, t) = f.wait(&task);
    assert_ne!(code, 0, "agen wait exits non-zero when the task failed");
    assert_eq!(t["state"], "failed");
    assert_eq!(t["outcome"]["response_type"], "error");
    assert_eq!(
        f.model_requests().len(),
        1,
        "a 401 is neither retried nor recalled"
    );
}

#[test]
fn tasks_with_one_conversation_key_share_the_history() {
    let f = fleet(json!({"steps": [{"echo_history": true}]}), json!({}));
    let first = f.submit(&["my name is Ada", "--conversation", "c1"]);
    let second = f.submit(&["what is my name?", "--conversation", "c1"]);
    assert_eq!(f.wait(&first).0, 0);
    let (code, t) = f.wait(&second);
    assert_eq!(code, 0);
    let result = t["outcome"]["result"].as_str().unwrap();
    assert!(
        result.contains("my name is Ada") && result.contains("what is my name?"),
        "{result}"
    );
    // Another key starts afresh.
    let other = f.submit(&["hello", "--conversation", "c2"]);
    let (_, t) = f.wait(&other);
    assert!(!t["outcome"]["result"].as_str().unwrap().contains("Ada"));
}

#[test]
/// `ws.run` is side-effecting: cut off by its timeout after it was sent, it may have run, and
/// the model is told so (`effect_unknown`), never that it was not run.
fn a_tool_past_its_timeout_is_cut_off_and_the_model_told_it_may_have_run() {
    let script = json!({"steps": [
        {"tool_calls": [{"name": "ws_run", "arguments": {"command": "sleep 30; echo never"}}]},
        {"reply_template": "tool said: {{last_tool_result}}"}
    ]});
    let f = fleet(script, json!({"limits": {"toolTimeout": "1s"}}));
    let started = std::time::Instant::now();
    let task = f.submit(&["slow"]);
    let (code, t) = f.wait(&task);
    assert_eq!(code, 0, "{t}");
    let result = t["outcome"]["result"].as_str().unwrap();
    assert!(
        result.contains("effect_unknown") && result.contains("no answer within 1s"),
        "{result}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn cancelling_a_running_task_stops_it_and_its_tool_call() {
    let script = json!({"steps": [
        {"tool_calls": [{"name": "ws_run", "arguments": {"command": "sleep 47.5"}}]},
        {"reply": "done"}
    ]});
    let f = fleet(script, json!({}));
    let task = f.submit(&["slow"]);
    wait_for("the tool call to start", Duration::from_secs(30), || {
        sleepers().is_empty().then_some(()).is_none().then_some(())
    })
    .unwrap();
    let out = f.hub.cli(&["cancel", &task]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, t) = f.wait(&task);
    assert_ne!(code, 0);
    assert_eq!(t["state"], "cancelled");
    wait_for(
        "the tool's process to be gone",
        Duration::from_secs(15),
        || sleepers().is_empty().then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}", sleepers()));
}

/// Processes running `sleep 47.5` (the cancel test's tool call).
fn sleepers() -> Vec<u32> {
    processes_running("sleep 47.5")
}

/// Processes whose whole command line is `cmd` (a tool call's command, made unique per test).
pub(crate) fn processes_running(want: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.trim() == want {
            out.push(pid);
        }
    }
    out
}

/// A Hub, a Nest and a fake model; deployment `meta` whose only tool server is our
/// `meta_server.py` (records each call's `_meta` to `meta.jsonl`).
fn meta_fleet(
    script: Value,
    harness: Value,
) -> (
    tempfile::TempDir,
    HubProcess,
    NestProcess,
    FakeModel,
    std::path::PathBuf,
) {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let log = tmp.path().join("meta.jsonl");
    let dir = tmp.path().join("bundle");
    write_bundle(
        &dir,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "meta",
                    json!({"command": Peers::python(), "args": [Peers::script("servers/meta_server.py")], "env": {"META_LOG": log}}),
                )]),
            ),
            ("x-agen/agent.md", format!("---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nMeta.\n", model.base_url())),
            ("x-agen/harness.json", harness.to_string()),
        ],
    )
    .unwrap();
    let out = hub
        .cli(&["deploy", dir.to_str().unwrap(), "--name", "meta", "--wait"])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (tmp, hub, nest, model, log)
}

fn meta_events(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[test]
fn every_tool_call_carries_its_run_in_meta() {
    let script = json!({"steps": [
        {"tool_calls": [{"name": "meta_echo", "arguments": {"text": "hi"}}]},
        {"reply_template": "{{last_tool_result}}"}
    ]});
    let (_tmp, hub, _nest, _model, log) = meta_fleet(script, json!({}));
    let out = hub
        .cli(&[
            "submit",
            "meta",
            "go",
            "--conversation",
            "conv-key-1",
            "--label",
            "team=blue",
            "--label",
            "ticket=42",
        ])
        .unwrap();
    let task = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let t = hub.cli_json(&["wait", &task, "-o", "json"]).unwrap();
    assert_eq!(t["state"], "succeeded", "{t}");
    let calls: Vec<Value> = meta_events(&log)
        .into_iter()
        .filter(|e| e["tool"] == "echo")
        .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let meta = &calls[0]["meta"];
    assert_eq!(meta["agen/namespace"], "default");
    assert_eq!(meta["agen/deployment"], "meta");
    assert_eq!(meta["agen/taskId"], task.as_str());
    assert_eq!(meta["agen/runId"], t["run_id"]);
    assert_eq!(
        meta["agen/rootRunId"], t["run_id"],
        "a top-level run is its own root"
    );
    assert_eq!(meta["agen/conversationId"], t["conversation_id"]);
    assert_eq!(meta["agen/conversationKey"], "conv-key-1");
    assert_eq!(meta["agen/labels"], json!({"team": "blue", "ticket": "42"}));
    let tp = meta["traceparent"].as_str().unwrap();
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!(parts.len(), 4, "{tp}");
    assert_eq!(
        (parts[0], parts[1].len(), parts[2].len(), parts[3].len()),
        ("00", 32, 16, 2),
        "{tp}"
    );
    // The traceparent names this call's span in the trace GetTrace returns.
    let trace = hub.cli_json(&["trace", &task, "-o", "json"]).unwrap();
    assert_eq!(trace["trace_id"], parts[1], "{trace}");
    let span = trace["spans"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["span_id"] == parts[2])
        .unwrap_or_else(|| panic!("no span {} in {trace}", parts[2]));
    assert_eq!(span["name"], "tool meta.echo", "{span}");
}

/// `agen/idempotencyKey` on side-effecting calls (a tool without hints is side-effecting): the run
/// id and the call's position in the run, different for every call.
#[test]
fn side_effecting_calls_carry_an_idempotency_key_of_their_run_and_position() {
    let script = json!({"steps": [
        {"tool_calls": [{"name": "meta_echo", "arguments": {"text": "a"}}]},
        {"tool_calls": [{"name": "meta_echo", "arguments": {"text": "b"}}]},
        {"reply": "done"}
    ]});
    let (_tmp, hub, _nest, _model, log) = meta_fleet(script, json!({}));
    let out = hub.cli(&["submit", "meta", "go"]).unwrap();
    let task = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let t = hub.cli_json(&["wait", &task, "-o", "json"]).unwrap();
    assert_eq!(t["state"], "succeeded", "{t}");
    let run = t["run_id"].as_str().unwrap();
    let keys: Vec<Value> = meta_events(&log)
        .into_iter()
        .filter(|e| e["tool"] == "echo")
        .map(|e| e["meta"]["agen/idempotencyKey"].clone())
        .collect();
    assert_eq!(
        keys,
        vec![json!(format!("{run}:0")), json!(format!("{run}:1"))]
    );
}

#[test]
fn parallel_tool_calls_overlap_and_keep_their_order_unless_turned_off() {
    for (parallel, min_ms, max_ms) in [(true, 1400, 2900), (false, 2900, 8000)] {
        let tmp_record = tempfile::tempdir().unwrap();
        let record = tmp_record.path().join("requests.jsonl");
        let script = json!({"record": record, "steps": [
            {"tool_calls": [
                {"name": "meta_slow", "arguments": {"seconds": 1.5}},
                {"name": "meta_echo", "arguments": {"text": "second"}},
                {"name": "meta_slow", "arguments": {"seconds": 1.5}}
            ]},
            {"reply": "done"}
        ]});
        let (_tmp, hub, _nest, _model, _log) =
            meta_fleet(script, json!({"parallelToolCalls": parallel}));
        let out = hub.cli(&["submit", "meta", "go"]).unwrap();
        let task = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        let t = hub.cli_json(&["wait", &task, "-o", "json"]).unwrap();
        assert_eq!(t["state"], "succeeded");
        let ms = |k: &str| chrono_ms(t[k].as_str().unwrap());
        let took = ms("finished_at") - ms("started_at");
        assert!(
            took >= min_ms && took <= max_ms,
            "parallel={parallel}: the run took {took} ms"
        );
        // The model gets the results in the order it asked for them.
        let reqs: Vec<Value> = std::fs::read_to_string(&record)
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let msgs = reqs[1]["body"]["messages"].as_array().unwrap();
        let asked: Vec<&Value> = msgs
            .iter()
            .find(|m| m["role"] == "assistant")
            .and_then(|m| m["tool_calls"].as_array())
            .unwrap()
            .iter()
            .map(|c| &c["id"])
            .collect();
        let answered: Vec<&Value> = msgs
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| &m["tool_call_id"])
            .collect();
        assert_eq!(asked, answered, "parallel={parallel}");
        let texts: Vec<String> = msgs
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| m["content"].to_string())
            .collect();
        assert!(texts[1].contains("second"), "{texts:?}");
    }
}

/// Milliseconds since the epoch of an RFC 3339 time printed by the CLI.
fn chrono_ms(s: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(s)
        .expect("an RFC 3339 time")
        .timestamp_millis()
}
