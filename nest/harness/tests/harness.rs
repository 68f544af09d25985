//! The agent harness end to end inside one process: real provider clients over real HTTP
//! against the scripted fake model (served on 127.0.0.1:0), real MCP servers (PyPI
//! `mcp-server-time` and our test servers under `tests/peers/servers/`) through `ToolHost`.
//!
//! Needs the test peers: `tests/peers/install.sh` (or `python3 -m venv target/peers/venv &&
//! target/peers/venv/bin/pip install mcp mcp-server-time`).

#![allow(clippy::unwrap_used)] // a test: a panic is a failure with its message

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agen_fake_model::{FakeModel, Script, Step};
use agen_harness::mcp::{LaunchContext, ToolHost};
use agen_harness::{
    Harness, RunAssignment as RunRequest, RunEventBody, RunEventSink, RunOutcome, RunState,
    SinkError,
};
use agen_shared::bundle::Bundle;
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------------------------
// Fixtures

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .expect("nest/harness/ is two levels inside the repo")
        .to_path_buf()
}

/// The peers' Python; the test fails (it does not skip) when the peers are not installed.
fn python() -> String {
    let p = repo_root().join("target/peers/venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run tests/peers/install.sh first",
        p.display()
    );
    p.display().to_string()
}

fn peer_server(name: &str) -> String {
    repo_root()
        .join("tests/peers/servers")
        .join(name)
        .display()
        .to_string()
}

/// A bundle written into a temp folder.
struct TestBundle {
    dir: tempfile::TempDir,
}

impl TestBundle {
    /// `agent.md` with `model` and `base_url`, plus `files` (path → content).
    fn new(model: &str, base_url: &str, files: &[(&str, String)]) -> TestBundle {
        let dir = tempfile::tempdir().expect("temp dir");
        let agent_md = format!(
            "---\nmodel: {model}\nbaseUrl: {base_url}\n---\nYou are a test agent. Be brief.\n"
        );
        let mut all = vec![("x-agen/agent.md", agent_md)];
        all.extend(files.iter().cloned());
        // An explicit agent.md in `files` wins.
        for (path, content) in all.iter().rev() {
            let p = dir.path().join(path);
            if p.exists() {
                continue;
            }
            std::fs::create_dir_all(p.parent().expect("has a parent")).expect("mkdir");
            std::fs::write(&p, content).expect("write bundle file");
        }
        TestBundle { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn load(&self) -> Bundle {
        Bundle::load(self.path()).unwrap_or_else(|e| panic!("test bundle does not load: {e}"))
    }
}

fn mcp_json(servers: Value) -> (&'static str, String) {
    ("mcp.json", json!({"mcpServers": servers}).to_string())
}

fn time_server() -> Value {
    json!({"command": python(), "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]})
}

fn slow_server() -> Value {
    json!({"command": python(), "args": [peer_server("slow_server.py")]})
}

fn meta_server(log: &Path) -> Value {
    json!({"command": python(), "args": [peer_server("meta_server.py")], "env": {"META_LOG": log.display().to_string()}})
}

/// Every event a run emitted, in order, with its `sync` flag.
#[derive(Default)]
struct MemorySink {
    events: Mutex<Vec<(String, Value, bool)>>,
}

impl MemorySink {
    fn kinds(&self) -> Vec<String> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .map(|(k, _, _)| k.clone())
            .collect()
    }
    fn of_kind(&self, kind: &str) -> Vec<(Value, bool)> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _, _)| k == kind)
            .map(|(_, v, s)| (v.clone(), *s))
            .collect()
    }
}

#[async_trait::async_trait]
impl RunEventSink for MemorySink {
    async fn emit(&self, body: RunEventBody, sync: bool) -> Result<(), SinkError> {
        let (kind, json) = (body.kind().to_string(), body.to_json());
        self.events
            .lock()
            .unwrap()
            .push((kind.to_string(), json, sync));
        Ok(())
    }
}

/// A loaded bundle with its tool servers running and a harness over them (the harness holds
/// the tool host; dropping the agent stops the servers).
struct Agent {
    harness: Harness,
}

impl Agent {
    async fn start(bundle: &TestBundle) -> Agent {
        Agent::start_with_secrets(bundle, BTreeMap::new()).await
    }

    async fn start_with_secrets(bundle: &TestBundle, secrets: BTreeMap<String, String>) -> Agent {
        let bundle = Arc::new(bundle.load());
        let mut ctx = LaunchContext::new("/nonexistent/agen");
        ctx.secrets = secrets.clone();
        let host = ToolHost::start(&bundle, ctx).await;
        assert_eq!(
            host.status().not_connected,
            vec![],
            "every test tool server starts"
        );
        let harness = Harness::new(
            bundle,
            Arc::new(host.clone()),
            &secrets,
            reqwest::Client::new(),
        )
        .expect("harness builds");
        Agent { harness }
    }

    async fn run(&self, req: RunRequest) -> (RunOutcome, Arc<MemorySink>) {
        let sink = Arc::new(MemorySink::default());
        let outcome = self
            .harness
            .run(req, sink.clone(), CancellationToken::new())
            .await;
        (outcome, sink)
    }
}

fn request(input: &str) -> RunRequest {
    RunRequest {
        trace_id: String::new(),
        run_id: "run-1".into(),
        attempt: 1,
        task_id: "task-1".into(),
        namespace: "default".into(),
        deployment: "helper".into(),
        input: input.into(),
        labels: BTreeMap::new(),
        conversation_id: "conv-1".into(),
        conversation_key: String::new(),
        root_run_id: "run-1".into(),
        delegation_depth: 0,
        history: Vec::new(),
        replay: Vec::new(),
        tool_overrides: Default::default(),
        max_tokens: None,
        output_schema: None,
    }
}

async fn fake(steps: Vec<Step>) -> FakeModel {
    FakeModel::start(Script::steps(steps), "127.0.0.1:0".parse().unwrap())
        .await
        .expect("fake model binds")
}

/// The tool messages of an outcome, as `(name, content)`.
fn tool_messages(outcome: &RunOutcome) -> Vec<(String, String)> {
    outcome
        .messages
        .iter()
        .map(|m| m.to_json())
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_string(),
                m["content"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Lines of a JSONL file, polled until `done` holds or the deadline passes.
async fn wait_for_lines(path: &Path, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let lines: Vec<Value> = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if done(&lines) {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what} in {}: {lines:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The loop

#[tokio::test]
async fn scripted_model_calls_the_time_server_and_answers_with_its_result() {
    let model = fake(vec![
        Step::call("time_get_current_time", json!({"timezone": "UTC"})),
        Step::template("The time is {{last_tool_result}}"),
    ])
    .await;
    let bundle = TestBundle::new(
        "openai/gpt-4.1-mini",
        &model.openai_base_url(),
        &[mcp_json(json!({"time": time_server()}))],
    );
    let agent = Agent::start(&bundle).await;

    let (outcome, sink) = agent.run(request("What time is it in UTC?")).await;

    assert_eq!(
        (outcome.state, outcome.response_type.as_str()),
        (RunState::Succeeded, "text"),
        "{outcome:?}"
    );
    assert!(
        outcome.result.starts_with("The time is {"),
        "{}",
        outcome.result
    );
    assert!(
        outcome.result.contains("\"timezone\": \"UTC\""),
        "the tool's output is in the answer: {}",
        outcome.result
    );

    // The model was offered the MCP tool under its model name, and finish.
    let first = &model.requests()[0]["body"];
    let offered: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        offered.contains(&"time_get_current_time") && offered.contains(&"finish"),
        "{offered:?}"
    );
    assert_eq!(
        first["messages"][0],
        json!({"role": "system", "content": "You are a test agent. Be brief."})
    );

    // The run's new messages: the user input, the call, its result, the answer.
    let roles: Vec<String> = outcome
        .messages
        .iter()
        .map(|m| m.to_json()["role"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(roles, vec!["user", "assistant", "tool", "assistant"]);

    // Four events per tool round and no `activity` events: what the run is doing rides on
    // model.requested and tool.started.
    assert_eq!(
        sink.kinds(),
        vec![
            "model.requested",
            "model.answered",
            "tool.started",
            "tool.completed",
            "model.requested",
            "model.answered",
            "run.finished"
        ]
    );
    let requested = sink.of_kind("model.requested");
    assert!(
        requested[0].0["activity"]
            .as_str()
            .is_some_and(|a| a.starts_with("waiting for the model (")),
        "the model request says what the run waits for: {}",
        requested[0].0
    );
    // model.answered holds the turn's delta, not the context.
    let answered = sink.of_kind("model.answered");
    assert_eq!(
        answered[0].0["message"]["tool_calls"][0]["name"],
        "time_get_current_time"
    );
    assert!(answered[0].0.get("messages").is_none());
    // mcp-server-time marks its tools readOnlyHint: not side-effecting, so not synced.
    let started = sink.of_kind("tool.started");
    assert_eq!(
        (
            started[0].0["tool"].clone(),
            started[0].0["side_effect"].clone(),
            started[0].1
        ),
        (json!("time.get_current_time"), json!(false), false)
    );
    let finished = sink.of_kind("run.finished");
    assert_eq!(finished[0].0["state"], "succeeded");
    assert!(finished[0].1, "run.finished is durable");
}

#[tokio::test]
async fn finish_ends_the_run_with_its_result() {
    let model = fake(vec![
        Step::call("finish", json!({"result": "all done"})),
        Step::reply("never sent"),
    ])
    .await;
    let bundle = TestBundle::new("openai/m", &model.openai_base_url(), &[]);
    let agent = Agent::start(&bundle).await;
    let (outcome, _) = agent.run(request("do it")).await;
    assert_eq!(
        (outcome.state, outcome.result.as_str()),
        (RunState::Succeeded, "all done")
    );
    assert_eq!(model.requests().len(), 1);
    assert_eq!(
        tool_messages(&outcome),
        vec![("finish".to_string(), "finished".to_string())]
    );
}

#[tokio::test]
async fn parallel_calls_take_the_time_of_one_and_come_back_in_the_order_asked() {
    let steps = || {
        vec![
            Step::calls(vec![
                ("slow_sleep", json!({"seconds": 1.0, "label": "first"})),
                ("slow_sleep", json!({"seconds": 0.5, "label": "second"})),
            ]),
            Step::reply("both slept"),
        ]
    };
    let expected = vec![
        ("slow_sleep".to_string(), "first slept 1.0s".to_string()),
        ("slow_sleep".to_string(), "second slept 0.5s".to_string()),
    ];

    let model = fake(steps()).await;
    let bundle = TestBundle::new(
        "openai/m",
        &model.openai_base_url(),
        &[mcp_json(json!({"slow": slow_server()}))],
    );
    let agent = Agent::start(&bundle).await;
    let t = Instant::now();
    let (outcome, _) = agent.run(request("sleep twice")).await;
    let parallel = t.elapsed();
    assert_eq!(outcome.state, RunState::Succeeded, "{outcome:?}");
    assert_eq!(
        tool_messages(&outcome),
        expected,
        "results in the order asked, not the order finished"
    );
    assert!(
        parallel < Duration::from_millis(1450),
        "parallel calls took {parallel:?}"
    );
    assert_eq!(
        model.requests()[0]["body"]["parallel_tool_calls"],
        json!(true)
    );

    let model = fake(steps()).await;
    let bundle = TestBundle::new(
        "openai/m",
        &model.openai_base_url(),
        &[
            mcp_json(json!({"slow": slow_server()})),
            (
                "x-agen/harness.json",
                json!({"parallelToolCalls": false}).to_string(),
            ),
        ],
    );
    let agent = Agent::start(&bundle).await;
    let t = Instant::now();
    let (outcome, _) = agent.run(request("sleep twice")).await;
    let sequential = t.elapsed();
    assert_eq!(tool_messages(&outcome), expected);
    assert!(
        sequential >= Duration::from_millis(1500),
        "sequential calls took {sequential:?}"
    );
    assert_eq!(
        model.requests()[0]["body"]["parallel_tool_calls"],
        json!(false)
    );
}

#[tokio::test]
async fn max_turns_ends_the_run_with_a_clear_outcome() {
    let model = fake(vec![Step::call(
        "slow_sleep",
        json!({"seconds": 0, "label": "again"}),
    )])
    .await;
    let bundle = TestBundle::new(
        "openai/m",
        &model.openai_base_url(),
        &[
            mcp_json(json!({"slow": slow_server()})),
            (
                "x-agen/harness.json",
                json!({"limits": {"maxTurns": 2}}).to_string(),
            ),
        ],
    );
    let agent = Agent::start(&bundle).await;
    let (outcome, _) = agent.run(request("loop forever")).await;
    assert_eq!(
        (outcome.state, outcome.response_type.as_str()),
        (RunState::Failed, "error")
    );
    assert!(
        outcome.result.contains("after 2 model turns")
            && outcome.result.contains("limits.maxTurns"),
        "{}",
        outcome.result
    );
    assert_eq!(model.requests().len(), 2);
}

#[tokio::test]
async fn an_unknown_tool_is_reported_to_the_model_not_fatal() {
    let model = fake(vec![
        Step::call("nope_missing", json!({})),
        Step::template("{{last_tool_result}}"),
    ])
    .await;
    let bundle = TestBundle::new("openai/m", &model.openai_base_url(), &[]);
    let agent = Agent::start(&bundle).await;
    let (outcome, _) = agent.run(request("x")).await;
    assert_eq!(outcome.state, RunState::Succeeded);
    assert_eq!(
        outcome.result,
        "unknown tool `nope_missing`; the available tools are: finish, read_artifact, save_artifact"
    );
}

// ---------------------------------------------------------------------------------------------
// Provider errors

#[tokio::test]
async fn a_401_ends_the_run_as_an_error_response_without_retrying() {
    let model = fake(vec![Step::status(401, "invalid api key")]).await;
    let bundle = TestBundle::new("openai/m", &model.openai_base_url(), &[]);
    let agent = Agent::start(&bundle).await;
    let (outcome, sink) = agent.run(request("hi")).await;
    assert_eq!(
        (outcome.state, outcome.response_type.as_str()),
        (RunState::Failed, "error")
    );
    assert!(
        outcome.result.contains("answered 401") && outcome.result.contains("invalid api key"),
        "{}",
        outcome.result
    );
    assert!(
        outcome.result.contains("check apiKey"),
        "the message says what to fix: {}",
        outcome.result
    );
    assert_eq!(model.requests().len(), 1, "a 401 is not retried");
    assert!(sink.of_kind("tool.started").is_empty());
    assert_eq!(sink.of_kind("run.finished")[0].0["response_type"], "error");
}

#[tokio::test]
async fn server_errors_are_retried_within_the_bound_then_end_the_run() {
    let model = fake(vec![Step::status(500, "upstream is down")]).await;
    let bundle = TestBundle::new("openai/m", &model.openai_base_url(), &[]);
    let agent = Agent::start(&bundle).await;
    let (outcome, _) = agent.run(request("hi")).await;
    assert_eq!(
        (outcome.state, outcome.response_type.as_str()),
        (RunState::Failed, "error")
    );
    assert!(
        outcome.result.contains("answered 500 after 4 tries"),
        "{}",
        outcome.result
    );
    assert_eq!(model.requests().len(), 4, "4 tries in all");
}

#[tokio::test]
async fn a_transient_503_is_retried_and_the_run_succeeds() {
    let mut flaky = Step::status(503, "busy");
    flaky.times = Some(1);
    flaky.then = Some(Box::new(Step::reply("fine now")));
    let model = fake(vec![flaky]).await;
    let bundle = TestBundle::new("openai/m", &model.openai_base_url(), &[]);
    let agent = Agent::start(&bundle).await;
    let (outcome, _) = agent.run(request("hi")).await;
    assert_eq!(
        (outcome.state, outcome.result.as_str()),
        (RunState::Succeeded, "fine now")
    );
    assert_eq!(model.requests().len(), 2);
}

#[tokio::test]
async fn an_unreachable_provider_is_an_error_response() {
    // Bind and drop a listener: nothing listens on that port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let bundle = TestBundle::new("openai/m", &format!("http://127.0.0.1:{port}/v1"), &[]);
    let agent = Agent::start(&bundle).await;
    let (outcome, _) = agent.run(request("hi")).await;
    assert_eq!(
        (outcome.state, outcome.response_type.as_str()),
        (RunState::Failed, "error")
    );
    assert!(
        outcome
            .result
            .contains("could not be reached after 4 tries"),
        "{}",
        outcome.result
    );
}

// ---------------------------------------------------------------------------------------------
// Timeouts and cancellation

#[tokio::test]
async fn a_tool_past_its_timeout_is_cancelled_and_the_model_is_told() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("meta.jsonl");
    let model = fake(vec![
        Step::call("meta_slow", json!({"seconds": 30})),
        Step::template("{{last_tool_result}}"),
    ])
    .await;
    let bundle = TestBundle::new(
        "openai/m",
        &model.openai_base_url(),
        &[
            mcp_json(json!({"meta": meta_server(&log)})),
            (
                "x-agen/harness.json",
                json!({"limits": {"toolTimeout": "1s"}}).to_string(),
            ),
        ],
    );
    let agent = Agent::start(&bundle).await;
    let t = Instant::now();
    let (outcome, sink) = agent.run(request("sleep long")).await;
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "the run did not wait for the tool: {:?}",
        t.elapsed()
    );
    assert_eq!(outcome.state, RunState::Succeeded);
    // `slow` is side-effecting (no readOnlyHint) and was sent: it may have run, so the model is
    // told `effect_unknown` in the resume's words, never "timed out and was cancelled".
    assert_eq!(
        outcome.result,
        "effect_unknown: the call to meta_slow was interrupted before its result was recorded; it may or may not have taken effect. Check before calling it again. (no answer within 1s)"
    );
    let failed = sink.of_kind("tool.failed");
    assert_eq!(failed[0].0["reason"], "effect_unknown");
    wait_for_lines(&log, "the server's cancelled record", |l| {
        l.iter().any(|e| e["event"] == "cancelled")
    })
    .await;
}

#[tokio::test]
async fn cancelling_a_run_stops_its_running_tool_call() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("meta.jsonl");
    let model = fake(vec![
        Step::call("meta_slow", json!({"seconds": 60})),
        Step::reply("never"),
    ])
    .await;
    let bundle = TestBundle::new(
        "openai/m",
        &model.openai_base_url(),
        &[mcp_json(json!({"meta": meta_server(&log)}))],
    );
    let agent = Arc::new(Agent::start(&bundle).await);
    let cancel = CancellationToken::new();
    let sink = Arc::new(MemorySink::default());
    let run = tokio::spawn({
        let (agent, cancel, sink) = (agent.clone(), cancel.clone(), sink.clone());
        async move { agent.harness.run(request("sleep"), sink, cancel).await }
    });
    wait_for_lines(&log, "the tool's start", |l| {
        l.iter().any(|e| e["event"] == "started")
    })
    .await;
    let t = Instant::now();
    cancel.cancel();
    let outcome = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("the run ends promptly")
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(3));
    assert_eq!(outcome.state, RunState::Cancelled);
    // A side-effecting call cut off by the cancel may have run.
    assert_eq!(sink.of_kind("tool.failed")[0].0["reason"], "effect_unknown");
    assert_eq!(sink.of_kind("run.finished")[0].0["state"], "cancelled");
    assert_eq!(
        model.requests().len(),
        1,
        "the model is not asked again after a cancel"
    );
    // Every call has an answer in the history.
    assert_eq!(tool_messages(&outcome).len(), 1);
    wait_for_lines(&log, "the server's cancelled record", |l| {
        l.iter().any(|e| e["event"] == "cancelled")
    })
    .await;
}

#[tokio::test]
async fn cancelling_during_a_model_request_ends_the_run_cancelled() {
    let mut slow = Step::reply("too late");
    slow.delay_ms = Some(30_000);
    let model = fake(vec![slow]).await;
    let bundle = TestBundle::new("openai/m", &model.openai_base_url(), &[]);
    let agent = Agent::start(&bundle).await;
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        c.cancel();
    });
    let t = Instant::now();
    let outcome = agent
        .harness
        .run(request("hi"), Arc::new(MemorySink::default()), cancel)
        .await;
    assert_eq!(outcome.state, RunState::Cancelled);
    assert!(t.elapsed() < Duration::from_secs(5));
}

// ---------------------------------------------------------------------------------------------
// What tool servers are told

#[tokio::test]
async fn every_mcp_call_carries_the_meta_keys() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("meta.jsonl");
    let model = fake(vec![
        Step::calls(vec![
            ("meta_echo", json!({"text": "one"})),
            ("meta_echo", json!({"text": "two"})),
        ]),
        Step::reply("ok"),
    ])
    .await;
    let bundle = TestBundle::new(
        "openai/m",
        &model.openai_base_url(),
        &[mcp_json(json!({"meta": meta_server(&log)}))],
    );
    let agent = Agent::start(&bundle).await;
    let mut req = request("echo");
    req.run_id = "run-7".into();
    req.root_run_id = "run-1".into();
    req.task_id = "task-7".into();
    req.namespace = "team-a".into();
    req.deployment = "echoer".into();
    req.conversation_id = "conv-9".into();
    req.conversation_key = "ticket-42".into();
    req.labels = BTreeMap::from([
        ("customer".to_string(), "acme".to_string()),
        ("tier".to_string(), "gold".to_string()),
    ]);
    let (outcome, _) = agent.run(req).await;
    assert_eq!(outcome.state, RunState::Succeeded);

    let lines = wait_for_lines(&log, "two echo calls", |l| l.len() >= 2).await;
    let traceparent = regex::Regex::new("^00-([0-9a-f]{32})-([0-9a-f]{16})-01$").unwrap();
    let mut spans = Vec::new();
    let mut traces = Vec::new();
    for line in &lines {
        let mut meta = line["meta"].as_object().expect("meta recorded").clone();
        let tp = meta
            .remove("traceparent")
            .and_then(|v| v.as_str().map(str::to_string))
            .expect("traceparent present");
        let caps = traceparent
            .captures(&tp)
            .unwrap_or_else(|| panic!("traceparent {tp} is W3C"));
        traces.push(caps[1].to_string());
        spans.push(caps[2].to_string());
        // A side-effecting call (echo has no hints) carries its idempotency key.
        let key = meta
            .remove("agen/idempotencyKey")
            .and_then(|v| v.as_str().map(str::to_string))
            .expect("agen/idempotencyKey on a side-effecting call");
        assert!(key.starts_with("run-7:"), "{key}");
        // Servers may add their own keys (e.g. a progress token); ours are all there and right.
        let ours: serde_json::Map<String, Value> = meta
            .into_iter()
            .filter(|(k, _)| k.starts_with("agen/"))
            .collect();
        assert_eq!(
            Value::Object(ours),
            json!({
                "agen/namespace": "team-a", "agen/deployment": "echoer", "agen/taskId": "task-7",
                "agen/runId": "run-7", "agen/rootRunId": "run-1",
                "agen/conversationId": "conv-9", "agen/conversationKey": "ticket-42",
                "agen/labels": {"customer": "acme", "tier": "gold"}
            })
        );
    }
    assert_eq!(traces[0], traces[1], "one trace per run");
    assert_ne!(spans[0], spans[1], "a fresh span per call");
}

// ---------------------------------------------------------------------------------------------
// Skills

#[tokio::test]
async fn load_skill_returns_the_skill_and_preloaded_skills_are_in_the_system_prompt() {
    let model = fake(vec![
        Step::call("load_skill", json!({"name": "pricing"})),
        Step::template("{{last_tool_result}}"),
    ])
    .await;
    let skill = |name: &str, description: &str, body: &str| {
        (
            format!("skills/{name}/SKILL.md"),
            format!("---\nname: {name}\ndescription: {description}\n---\n{body}\n"),
        )
    };
    let (p_path, p_text) = skill(
        "pricing",
        "How to quote prices",
        "Quote prices in EUR, VAT included.",
    );
    let (t_path, t_text) = skill("tone", "How to write", "Write like a friendly librarian.");
    let agent_md = format!(
        "---\nmodel: openai/m\nbaseUrl: {}\npreloadSkills: [tone]\n---\nYou quote prices.\n",
        model.openai_base_url()
    );
    let bundle = TestBundle::new(
        "openai/m",
        &model.openai_base_url(),
        &[
            ("x-agen/agent.md", agent_md),
            (p_path.as_str(), p_text),
            (t_path.as_str(), t_text),
        ],
    );
    let agent = Agent::start(&bundle).await;
    let (outcome, _) = agent.run(request("how much?")).await;
    assert_eq!(
        (outcome.state, outcome.result.as_str()),
        (RunState::Succeeded, "Quote prices in EUR, VAT included.")
    );

    let body = &model.requests()[0]["body"];
    assert_eq!(
        body["messages"][0]["content"],
        "You quote prices.\n\n# Skill: tone\n\nWrite like a friendly librarian."
    );
    let load_skill = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "load_skill")
        .expect("load_skill offered");
    assert_eq!(
        load_skill["function"]["description"],
        "Load a skill: returns its instructions. Available skills:\n- pricing — How to quote prices\n- tone — How to write"
    );
}

// ---------------------------------------------------------------------------------------------
// Anthropic

#[tokio::test]
async fn the_anthropic_client_runs_a_tool_round_against_the_messages_api() {
    let model = fake(vec![
        Step::call("time_get_current_time", json!({"timezone": "UTC"})),
        Step::template("Anthropic says: {{last_tool_result}}"),
    ])
    .await;
    let agent_md = format!(
        "---\nmodel: anthropic/claude-sonnet-4-5\nbaseUrl: {}\napiKey: ${{ANTHROPIC_KEY}}\nmaxTokens: 512\n---\nYou tell the time.\n",
        model.anthropic_base_url()
    );
    let bundle = TestBundle::new(
        "unused/x",
        "http://unused",
        &[
            ("x-agen/agent.md", agent_md),
            (
                "x-agen/secrets.json",
                json!({"ANTHROPIC_KEY": {"source": "env", "var": "TEST_ANTHROPIC_KEY"}})
                    .to_string(),
            ),
            mcp_json(json!({"time": time_server()})),
        ],
    );
    let secrets = BTreeMap::from([("ANTHROPIC_KEY".to_string(), "sk-test-123".to_string())]);
    let agent = Agent::start_with_secrets(&bundle, secrets).await;
    let (outcome, _) = agent.run(request("time?")).await;
    assert_eq!(outcome.state, RunState::Succeeded, "{outcome:?}");
    assert!(
        outcome.result.starts_with("Anthropic says: {") && outcome.result.contains("UTC"),
        "{}",
        outcome.result
    );

    let reqs = model.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0]["path"], "/v1/messages");
    assert_eq!(reqs[0]["headers"]["x-api-key"], "sk-test-123");
    assert_eq!(reqs[0]["headers"]["anthropic-version"], "2023-06-01");
    assert_eq!(reqs[0]["body"]["system"], "You tell the time.");
    assert_eq!(reqs[0]["body"]["max_tokens"], 512);
    let tool = reqs[0]["body"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "time_get_current_time")
        .expect("tool offered");
    assert!(tool["input_schema"].is_object());
    // The second request carries the tool_use and its tool_result.
    let second = reqs[1]["body"]["messages"].as_array().unwrap();
    assert_eq!(second[1]["content"][0]["type"], "tool_use");
    assert_eq!(second[2]["content"][0]["type"], "tool_result");
    assert_eq!(
        second[2]["content"][0]["tool_use_id"],
        second[1]["content"][0]["id"]
    );
}

#[tokio::test]
async fn an_anthropic_401_is_an_error_response() {
    let model = fake(vec![Step::status(401, "invalid x-api-key")]).await;
    let bundle = TestBundle::new("anthropic/claude-x", &model.anthropic_base_url(), &[]);
    let agent = Agent::start(&bundle).await;
    let (outcome, _) = agent.run(request("hi")).await;
    assert_eq!(
        (outcome.state, outcome.response_type.as_str()),
        (RunState::Failed, "error")
    );
    assert!(
        outcome.result.contains("anthropic") && outcome.result.contains("invalid x-api-key"),
        "{}",
        outcome.result
    );
    assert_eq!(model.requests().len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Conversations

#[tokio::test]
async fn a_second_run_of_a_conversation_sees_the_first_runs_history() {
    let echo = Step {
        echo_history: true,
        ..Default::default()
    };
    let model = fake(vec![Step::reply("nice to meet you"), echo]).await;
    let bundle = TestBundle::new("openai/m", &model.openai_base_url(), &[]);
    let agent = Agent::start(&bundle).await;
    let (first, _) = agent.run(request("my name is Ada")).await;
    assert_eq!(
        first
            .messages
            .iter()
            .map(|m| m.to_json())
            .collect::<Vec<_>>(),
        vec![
            json!({"role": "user", "content": "my name is Ada"}),
            json!({"role": "assistant", "content": "nice to meet you"})
        ]
    );

    let mut second = request("what is my name?");
    second.history = first.messages.clone();
    let (outcome, _) = agent.run(second).await;
    assert_eq!(
        outcome.result,
        "user messages: my name is Ada | what is my name?"
    );
}

// ---------------------------------------------------------------------------------------------
// The standalone run log and `agen run`'s bundle errors

#[tokio::test]
async fn the_sled_run_log_keeps_every_event_in_order() {
    use agen_harness::run_log::SledRunLog;
    let model = fake(vec![Step::reply("logged")]).await;
    let bundle = TestBundle::new("openai/m", &model.openai_base_url(), &[]);
    let agent = Agent::start(&bundle).await;
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(SledRunLog::open(&dir.path().join("run-1"), "run-1", 1).unwrap());
    let outcome = agent
        .harness
        .run(request("hi"), log.clone(), CancellationToken::new())
        .await;
    assert_eq!(outcome.result, "logged");
    drop(log);
    let events = SledRunLog::read_all(&dir.path().join("run-1")).unwrap();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e.kind())
        .filter(|k| *k != "activity")
        .collect();
    assert_eq!(
        kinds,
        vec!["model.requested", "model.answered", "run.finished"]
    );
    assert_eq!(
        events.last().unwrap().to_json(),
        json!({"state": "succeeded", "result": "logged", "response_type": "text"})
    );
}

#[tokio::test]
async fn agen_run_exits_2_on_a_bad_bundle() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("x-agen")).unwrap();
    std::fs::write(
        dir.path().join("x-agen/agent.md"),
        "---\nmodel: nobody/x\n---\nhi\n",
    )
    .unwrap();
    let code = agen_harness::standalone::run_cli(dir.path().to_path_buf(), "hi".into(), None)
        .await
        .unwrap();
    assert_eq!(
        code, 2,
        "bad input is usage (2), as the CLI's exit code table says"
    );
    let platform = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(platform.path().join("x-agen")).unwrap();
    std::fs::write(
        platform.path().join("x-agen/agent.md"),
        "---\nmodel: openai/m\napiKey: ${KEY}\n---\nhi\n",
    )
    .unwrap();
    std::fs::write(
        platform.path().join("x-agen/secrets.json"),
        r#"{"KEY": {"source": "platform"}}"#,
    )
    .unwrap();
    let code = agen_harness::standalone::run_cli(platform.path().to_path_buf(), "hi".into(), None)
        .await
        .unwrap();
    assert_eq!(code, 2);
}

// ---------------------------------------------------------------------------------------------
// The Keen dialect seam

#[tokio::test]
async fn keen_mode_sends_no_tools_and_returns_results_as_system_responses() {
    let call = "<SYSTEM CALL>\n!*action\nuse tool\n!*tool\ntime_get_current_time\n!*context\n{\"timezone\": \"UTC\"}\n</SYSTEM CALL>\n";
    let model = fake(vec![
        Step::reply(call),
        Step::template("Keen says: {{last_user}}"),
    ])
    .await;
    let bundle = TestBundle::new(
        "openai/m",
        &model.openai_base_url(),
        &[
            mcp_json(json!({"time": time_server()})),
            (
                "x-agen/harness.json",
                json!({"toolProtocol": "keen"}).to_string(),
            ),
        ],
    );
    let agent = Agent::start(&bundle).await;
    let (outcome, sink) = agent.run(request("time?")).await;
    assert_eq!(outcome.state, RunState::Succeeded, "{outcome:?}");
    assert!(
        outcome
            .result
            .starts_with("Keen says: <SYSTEM RESPONSE>\n{")
            && outcome.result.contains("UTC"),
        "{}",
        outcome.result
    );
    let reqs = model.requests();
    assert!(
        reqs[0]["body"].get("tools").is_none(),
        "keen mode sends no tools field"
    );
    let system = reqs[0]["body"]["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.starts_with("You are a test agent. Be brief.\n\n")
            && system.contains("time_get_current_time"),
        "{system}"
    );
    assert_eq!(sink.of_kind("tool.completed").len(), 1);
}

// ---------------------------------------------------------------------------------------------
// Resuming from the run log of an earlier attempt

#[tokio::test]
async fn a_resumed_run_reuses_answered_turns_and_never_repeats_an_interrupted_side_effect() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("meta.jsonl");
    // Step 0 would be the first turn; a resume must not ask it again.
    let model = fake(vec![
        Step::reply("turn 1 asked again"),
        Step::reply("resumed answer"),
    ])
    .await;
    let bundle = TestBundle::new(
        "openai/m",
        &model.openai_base_url(),
        &[mcp_json(
            json!({"meta": meta_server(&log), "time": time_server()}),
        )],
    );
    let agent = Agent::start(&bundle).await;
    let ev = |kind: &str, json: Value| RunEventBody::from_parts(kind, json).unwrap();
    let mut req = request("do three things");
    req.attempt = 2;
    req.replay = vec![
        ev("model.requested", json!({"turn": 1})),
        ev(
            "model.answered",
            json!({"turn": 1, "message": {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "name": "meta_echo", "arguments": {"text": "charge the card"}},
                {"id": "c2", "name": "time_get_current_time", "arguments": {"timezone": "UTC"}},
                {"id": "c3", "name": "meta_echo", "arguments": {"text": "already done"}}
            ]}}),
        ),
        ev(
            "tool.started",
            json!({"call_id": "c1", "tool": "meta.echo", "side_effect": true}),
        ),
        ev(
            "tool.started",
            json!({"call_id": "c2", "tool": "time.get_current_time", "side_effect": false}),
        ),
        ev(
            "tool.started",
            json!({"call_id": "c3", "tool": "meta.echo", "side_effect": true}),
        ),
        ev(
            "tool.completed",
            json!({"call_id": "c3", "tool": "meta.echo", "result": "recorded result", "is_error": false}),
        ),
    ];
    let (outcome, sink) = agent.run(req).await;
    assert_eq!(
        (outcome.state, outcome.result.as_str()),
        (RunState::Succeeded, "resumed answer")
    );

    let reqs = model.requests();
    assert_eq!(reqs.len(), 1, "the answered turn is not asked again");
    let tools: Vec<Value> = reqs[0]["body"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .cloned()
        .collect();
    assert_eq!(tools.len(), 3);
    assert!(
        tools[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("effect_unknown:"),
        "{}",
        tools[0]
    );
    assert!(
        tools[1]["content"]
            .as_str()
            .unwrap()
            .contains("\"timezone\": \"UTC\""),
        "a read-only call is run again: {}",
        tools[1]
    );
    assert_eq!(tools[2]["content"], "recorded result");
    assert!(
        !log.exists() || std::fs::read_to_string(&log).unwrap().is_empty(),
        "no side-effecting call was repeated"
    );
    let unknown = sink.of_kind("tool.failed");
    assert_eq!(
        (unknown[0].0["reason"].clone(), unknown[0].1),
        (json!("effect_unknown"), true)
    );
}

#[tokio::test]
async fn a_resumed_keen_run_reuses_its_turns_and_results_and_never_repeats_a_side_effect() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("meta.jsonl");
    let echo = |text: &str| {
        format!("<SYSTEM CALL>\n!*action\nuse tool\n!*tool\nmeta_echo\n!*context\n{{\"text\": \"{text}\"}}\n</SYSTEM CALL>\n")
    };
    // Steps 0 and 1 would be the answered turns; a resume must not ask them again.
    let model = fake(vec![
        Step::reply("turn 1 asked again"),
        Step::reply("turn 2 asked again"),
        Step::template("Keen says: {{last_user}}"),
    ])
    .await;
    let bundle = TestBundle::new(
        "openai/m",
        &model.openai_base_url(),
        &[
            mcp_json(json!({"meta": meta_server(&log)})),
            (
                "x-agen/harness.json",
                json!({"toolProtocol": "keen"}).to_string(),
            ),
        ],
    );
    let agent = Agent::start(&bundle).await;
    let ev = |kind: &str, json: Value| RunEventBody::from_parts(kind, json).unwrap();
    let mut req = request("charge twice");
    req.attempt = 2;
    req.replay = vec![
        ev("model.requested", json!({"turn": 1})),
        ev(
            "model.answered",
            json!({"turn": 1, "message": {"role": "assistant", "content": echo("first charge")}}),
        ),
        ev(
            "tool.started",
            json!({"call_id": "keen_1", "tool": "meta.echo", "side_effect": true}),
        ),
        ev(
            "tool.completed",
            json!({"call_id": "keen_1", "tool": "meta.echo", "result": "recorded result", "is_error": false}),
        ),
        ev("model.requested", json!({"turn": 2})),
        ev(
            "model.answered",
            json!({"turn": 2, "message": {"role": "assistant", "content": echo("second charge")}}),
        ),
        ev(
            "tool.started",
            json!({"call_id": "keen_2", "tool": "meta.echo", "side_effect": true}),
        ),
    ];
    let (outcome, sink) = agent.run(req).await;
    assert_eq!(outcome.state, RunState::Succeeded, "{outcome:?}");
    assert!(
        outcome
            .result
            .starts_with("Keen says: <SYSTEM SCRIPT ERROR>\neffect_unknown: the call to meta_echo was interrupted"),
        "{}",
        outcome.result
    );
    let reqs = model.requests();
    assert_eq!(reqs.len(), 1, "the answered turns are not asked again");
    let users: Vec<String> = reqs[0]["body"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(users.len(), 3, "{users:?}");
    assert_eq!(
        users[1], "<SYSTEM RESPONSE>\nrecorded result\n</SYSTEM RESPONSE>",
        "the recorded result is reused"
    );
    assert!(
        !log.exists() || std::fs::read_to_string(&log).unwrap().is_empty(),
        "no side-effecting call was repeated"
    );
    let unknown = sink.of_kind("tool.failed");
    assert_eq!(
        (unknown[0].0["reason"].clone(), unknown[0].1),
        (json!("effect_unknown"), true)
    );
}

// ---------------------------------------------------------------------------------------------
// Progress (fleet runs)

#[tokio::test]
async fn report_progress_is_rate_limited_and_the_latest_report_is_never_lost() {
    let model = fake(vec![
        Step::call(
            "report_progress",
            json!({"step": "reading page 1", "done": 1, "total": 3}),
        ),
        Step::call(
            "report_progress",
            json!({"step": "reading page 2", "done": 2, "total": 3}),
        ),
        Step::call(
            "report_progress",
            json!({"step": "reading page 3", "done": 3, "total": 3}),
        ),
        Step::reply("read all 3 pages"),
    ])
    .await;
    let bundle = TestBundle::new("openai/m", &model.openai_base_url(), &[]);
    let bundle = Arc::new(bundle.load());
    let host = ToolHost::start(&bundle, LaunchContext::new("/nonexistent/agen")).await;
    let harness = Harness::new(
        bundle,
        Arc::new(host),
        &BTreeMap::new(),
        reqwest::Client::new(),
    )
    .unwrap()
    .with_progress(true);
    let sink = Arc::new(MemorySink::default());
    let outcome = harness
        .run(request("read"), sink.clone(), CancellationToken::new())
        .await;
    assert_eq!(outcome.result, "read all 3 pages");
    let offered: Vec<String> = model.requests()[0]["body"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        offered.contains(&"report_progress".to_string()),
        "{offered:?}"
    );
    let steps: Vec<Value> = sink
        .of_kind("task.progress")
        .into_iter()
        .map(|(v, _)| v["step"].clone())
        .collect();
    assert_eq!(
        steps,
        vec![json!("reading page 1")],
        "one event per 10 s, the run's end included (issue 43: the guide's \"at most one every 10 seconds\")"
    );
    // Each held-back report still reaches the task at once, as `progress.latest`.
    let latest: Vec<Value> = sink
        .of_kind("progress.latest")
        .into_iter()
        .map(|(v, _)| v["step"].clone())
        .collect();
    assert_eq!(
        latest,
        vec![json!("reading page 2"), json!("reading page 3")]
    );
}

// ---------------------------------------------------------------------------------------------
// The run log as the ledger

/// A run log whose disk is gone for results: `tool.completed` never becomes durable.
struct LosesResults;

#[async_trait::async_trait]
impl RunEventSink for LosesResults {
    async fn emit(&self, body: RunEventBody, sync: bool) -> Result<(), SinkError> {
        // Refused whether or not it is waited for: a sink that knows it cannot take a side
        // effect's result says so, and the run must stop.
        let _ = sync;
        if body.kind() == "tool.completed" {
            return Err(SinkError::Unavailable("disk full".into()));
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_side_effecting_result_that_cannot_be_recorded_stops_the_run_before_the_model_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = fake(vec![
        Step::call("meta_echo", json!({"text": "charge"})),
        Step::reply("charged"),
    ])
    .await;
    let bundle = TestBundle::new(
        "openai/m",
        &model.openai_base_url(),
        &[mcp_json(
            json!({"meta": meta_server(&dir.path().join("m.jsonl"))}),
        )],
    );
    let agent = Agent::start(&bundle).await;
    let outcome = agent
        .harness
        .run(
            request("charge"),
            Arc::new(LosesResults),
            CancellationToken::new(),
        )
        .await;
    assert_eq!(
        (outcome.state, outcome.response_type.as_str()),
        (RunState::Failed, "error")
    );
    assert_eq!(outcome.result, "the run stopped: the result of meta.echo could not be recorded in the run log (run log unavailable: disk full)");
    assert_eq!(
        model.requests().len(),
        1,
        "the model never saw the unrecorded result"
    );
}
