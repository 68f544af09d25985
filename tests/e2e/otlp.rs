//! OpenTelemetry export (issue 22): a Hub started with `--otlp-endpoint` sends each finished
//! task's trace to a real OTLP/gRPC receiver (PyPI `grpcio` + `opentelemetry-proto`), with the
//! ids `agen trace` shows, the GenAI attributes, and the tool span the MCP server's `_meta`
//! `traceparent` named.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agen_tests::{
    free_port, mcp_json, wait_for, write_bundle, FakeModel, HubProcess, NestProcess, Peers, Proc,
};
use serde_json::{json, Value};

/// The receiver process, the file it writes spans to and its port.
fn receiver(dir: &Path) -> (Proc, PathBuf, u16) {
    let out = dir.join("spans.jsonl");
    let port_file = dir.join("otlp.port");
    let mut cmd = Command::new(Peers::python());
    cmd.arg(Peers::script("servers/otlp_receiver.py"))
        .arg(&out)
        .arg(&port_file);
    let proc = Proc::spawn("otlp", cmd, &dir.join("otlp.log")).unwrap();
    let port = wait_for("the OTLP receiver's port", Duration::from_secs(30), || {
        std::fs::read_to_string(&port_file)
            .ok()?
            .trim()
            .parse()
            .ok()
    })
    .unwrap();
    (proc, out, port)
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

struct Fleet {
    _tmp: tempfile::TempDir,
    _receiver: Proc,
    spans: PathBuf,
    hub: HubProcess,
    _nest: NestProcess,
    _model: FakeModel,
    meta_log: PathBuf,
}

fn fleet(script: Value, harness: Value) -> Fleet {
    let tmp = tempfile::tempdir().unwrap();
    let (receiver, spans, port) = receiver(tmp.path());
    let endpoint = format!("http://127.0.0.1:{port}");
    let hub = HubProcess::start_with_args(
        tmp.path(),
        free_port(),
        "3s",
        &["--otlp-endpoint", &endpoint],
    )
    .unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let meta_log = tmp.path().join("meta.jsonl");
    let dir = tmp.path().join("bundle");
    write_bundle(
        &dir,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "meta",
                    json!({"command": Peers::python(), "args": [Peers::script("servers/meta_server.py")], "env": {"META_LOG": meta_log}}),
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
    Fleet {
        _tmp: tmp,
        _receiver: receiver,
        spans,
        hub,
        _nest: nest,
        _model: model,
        meta_log,
    }
}

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

#[test]
fn a_finished_task_is_exported_over_otlp_with_its_trace_ids_and_genai_attributes() {
    let script = json!({"steps": [
        {"tool_calls": [{"name": "meta_echo", "arguments": {"text": "hi"}}]},
        {"reply": "done"}
    ]});
    let f = fleet(script, json!({"traceToolArguments": true}));
    let out = f.hub.cli(&["submit", "meta", "go"]).unwrap();
    let task = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let t = f.hub.cli_json(&["wait", &task, "-o", "json"]).unwrap();
    assert_eq!(t["state"], "succeeded", "{t}");
    let trace = f.hub.cli_json(&["trace", &task, "-o", "json"]).unwrap();
    let want = trace["spans"].as_array().unwrap().len();
    // Export is in the background: poll until the whole trace has arrived.
    let spans = wait_for("the exported trace", Duration::from_secs(30), || {
        let got = lines(&f.spans);
        (got.len() >= want).then_some(got)
    })
    .unwrap();
    assert_eq!(spans.len(), want, "one export per finished task: {spans:?}");
    let trace_id = trace["trace_id"].as_str().unwrap();
    for s in &spans {
        assert_eq!(s["trace_id"], trace_id, "{s}");
        assert_eq!(s["resource"]["service.name"], "agen-hub", "{s}");
        assert_eq!(attr(s, "agen.namespace"), "default", "{s}");
        assert_eq!(attr(s, "agen.deployment"), "meta", "{s}");
        assert_eq!(attr(s, "agen.task_id"), task.as_str(), "{s}");
        assert_eq!(attr(s, "agen.attempt"), 1, "{s}");
        assert!(s["end"].as_u64() >= s["start"].as_u64(), "{s}");
    }
    // The ids are GetTrace's.
    let mut ours: Vec<String> = trace["spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["span_id"].as_str().unwrap().to_string())
        .collect();
    let mut theirs: Vec<String> = spans
        .iter()
        .map(|s| s["span_id"].as_str().unwrap().to_string())
        .collect();
    ours.sort();
    theirs.sort();
    assert_eq!(ours, theirs);
    let roots: Vec<&Value> = spans.iter().filter(|s| s["parent_span_id"] == "").collect();
    assert_eq!(roots.len(), 1, "{spans:?}");
    let root = roots[0];
    assert_eq!(attr(root, "gen_ai.operation.name"), "invoke_agent");
    assert_eq!(root["status"]["code"], 1, "a succeeded run is ok: {root}");
    let chats: Vec<&Value> = spans
        .iter()
        .filter(|s| attr(s, "gen_ai.operation.name") == "chat")
        .collect();
    assert_eq!(chats.len(), 2, "two model turns: {spans:?}");
    for c in &chats {
        assert_eq!(c["parent_span_id"], root["span_id"], "{c}");
        assert_eq!(attr(c, "gen_ai.provider.name"), "openai", "{c}");
        assert_eq!(attr(c, "gen_ai.request.model"), "fake-model", "{c}");
        assert_eq!(attr(c, "gen_ai.usage.input_tokens"), 0, "{c}");
        assert_eq!(attr(c, "gen_ai.usage.output_tokens"), 0, "{c}");
        assert_eq!(c["name"], "chat fake-model");
    }
    let tools: Vec<&Value> = spans
        .iter()
        .filter(|s| attr(s, "gen_ai.operation.name") == "execute_tool")
        .collect();
    assert_eq!(tools.len(), 1, "{spans:?}");
    let tool = tools[0];
    assert_eq!(tool["parent_span_id"], root["span_id"], "{tool}");
    assert_eq!(attr(tool, "gen_ai.tool.name"), "meta.echo", "{tool}");
    assert!(
        attr(tool, "gen_ai.tool.call.id")
            .as_str()
            .is_some_and(|c| !c.is_empty()),
        "{tool}"
    );
    assert_eq!(tool["status"]["code"], 1, "{tool}");
    // traceToolArguments: the span carries them.
    let args: Value =
        serde_json::from_str(attr(tool, "gen_ai.tool.call.arguments").as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"text": "hi"}), "{tool}");
    // The tool server was told this span.
    let calls: Vec<Value> = lines(&f.meta_log)
        .into_iter()
        .filter(|e| e["tool"] == "echo")
        .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let tp = calls[0]["meta"]["traceparent"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        tp,
        format!(
            "00-{}-{}-01",
            tool["trace_id"].as_str().unwrap(),
            tool["span_id"].as_str().unwrap()
        )
    );
}

#[test]
fn a_callers_traceparent_makes_the_run_a_child_of_its_trace() {
    let script = json!({"steps": [
        {"tool_calls": [{"name": "meta_echo", "arguments": {"text": "hi"}}]},
        {"reply": "done"}
    ]});
    let f = fleet(script, json!({}));
    let (caller_trace, caller_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let tp = format!("00-{caller_trace}-{caller_span}-01");
    let out = f
        .hub
        .cli(&["submit", "meta", "go", "--traceparent", &tp])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let t = f.hub.cli_json(&["wait", &task, "-o", "json"]).unwrap();
    assert_eq!(t["state"], "succeeded", "{t}");
    let trace = f.hub.cli_json(&["trace", &task, "-o", "json"]).unwrap();
    assert_eq!(trace["trace_id"], caller_trace, "{trace}");
    let want = trace["spans"].as_array().unwrap().len();
    let spans = wait_for("the exported trace", Duration::from_secs(30), || {
        let got = lines(&f.spans);
        (got.len() >= want).then_some(got)
    })
    .unwrap();
    assert!(
        spans.iter().all(|s| s["trace_id"] == caller_trace),
        "{spans:?}"
    );
    let root = spans
        .iter()
        .find(|s| attr(s, "gen_ai.operation.name") == "invoke_agent")
        .unwrap();
    assert_eq!(root["parent_span_id"], caller_span, "{root}");
    let tool = spans
        .iter()
        .find(|s| attr(s, "gen_ai.operation.name") == "execute_tool")
        .unwrap();
    assert_eq!(tool["parent_span_id"], root["span_id"], "{tool}");
    let calls: Vec<Value> = lines(&f.meta_log)
        .into_iter()
        .filter(|e| e["tool"] == "echo")
        .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0]["meta"]["traceparent"],
        format!("00-{caller_trace}-{}-01", tool["span_id"].as_str().unwrap())
    );
    // A malformed traceparent is refused with the field named, and creates no task.
    let bad = f
        .hub
        .cli(&["submit", "meta", "go", "--traceparent", "00-nothex-01"])
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("traceparent"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let tasks = f.hub.cli_json(&["tasks", "-o", "json"]).unwrap();
    assert_eq!(tasks.as_array().map(Vec::len), Some(1), "{tasks}");
}
