//! Permissions through the harness, as the model meets them: the scripted fake model over real
//! HTTP, a real MCP server (`tests/peers/servers/meta_server.py`, one line per real execution)
//! and a real Keen script tool. A table per dialect: what is offered, what a call to a denied
//! tool gets, and that it never reaches the server.
//!
//! Needs the test peers: `tests/peers/install.sh`.

#![allow(clippy::unwrap_used)] // a test: a panic is a failure with its message

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agen_contract::run::ToolFailure;
use agen_fake_model::{FakeModel, Script, Step};
use agen_harness::mcp::{LaunchContext, ToolHost};
use agen_harness::{
    ApproveAll, Approver, Harness, RunAssignment, RunEventBody, RunEventSink, RunOutcome, RunState,
    SinkError,
};
use agen_shared::bundle::{Bundle, Permissions};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .expect("nest/harness/ is two levels inside the repo")
        .to_path_buf()
}

fn python() -> String {
    let p = repo_root().join("target/peers/venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run tests/peers/install.sh first",
        p.display()
    );
    p.display().to_string()
}

#[derive(Default)]
struct MemorySink {
    events: Mutex<Vec<RunEventBody>>,
}

impl MemorySink {
    /// `(tool, reason)` of every `tool.failed`.
    fn failures(&self) -> Vec<(String, ToolFailure)> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                RunEventBody::ToolFailed(f) => Some((f.tool.clone(), f.reason)),
                _ => None,
            })
            .collect()
    }
}

#[async_trait::async_trait]
impl RunEventSink for MemorySink {
    async fn emit(&self, body: RunEventBody, _sync: bool) -> Result<(), SinkError> {
        self.events.lock().unwrap().push(body);
        Ok(())
    }
}

fn request() -> RunAssignment {
    RunAssignment {
        run_id: "run-1".into(),
        attempt: 1,
        task_id: "task-1".into(),
        namespace: "default".into(),
        deployment: "perms".into(),
        input: "go".into(),
        labels: BTreeMap::new(),
        conversation_id: "conv-1".into(),
        conversation_key: String::new(),
        root_run_id: "run-1".into(),
        delegation_depth: 0,
        history: Vec::new(),
        replay: Vec::new(),
        trace_id: String::new(),
        tool_overrides: Default::default(),
        max_tokens: None,
        output_schema: None,
    }
}

/// A bundle with the meta server as `m` (tools `echo`, `slow`), one skill, `permissions`, and
/// (for Keen) a registered script tool `Stamp`.
fn write_bundle(dir: &Path, base_url: &str, permissions: &Value, keen: bool, log: &Path) {
    let server = json!({"command": python(), "args": [repo_root().join("tests/peers/servers/meta_server.py").display().to_string()], "env": {"META_LOG": log.display().to_string()}});
    let mut files = vec![
        (
            "x-agen/agent.md",
            format!("---\nmodel: openai/m\nbaseUrl: {base_url}\n---\nYou are a test agent.\n"),
        ),
        ("mcp.json", json!({"mcpServers": {"m": server}}).to_string()),
        (
            "x-agen/config.json",
            json!({"permissions": permissions}).to_string(),
        ),
        (
            "skills/notes/SKILL.md",
            "---\nname: notes\ndescription: how to take notes\n---\nWrite them down.\n".into(),
        ),
    ];
    if keen {
        files.push((
            "x-agen/harness.json",
            json!({"toolProtocol": "keen"}).to_string(),
        ));
        files.push((
            "keen-tools.json",
            json!([{"name": "Stamp", "type": "script", "entry": "tools/stamp.js"}]).to_string(),
        ));
        files.push((
            "tools/stamp.js",
            "module.exports = { exec(props, dictionary) { dictionary.result = 'stamped'; } };\n"
                .into(),
        ));
    }
    for (path, content) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
}

/// How many times the meta server really ran `echo`.
fn echo_runs(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"echo\""))
        .count()
}

struct Ran {
    outcome: RunOutcome,
    sink: Arc<MemorySink>,
    requests: Vec<Value>,
    echo_runs: usize,
    /// The meta server's log: one JSON line per execution event.
    calls: String,
}

/// Runs one run of a bundle with `permissions` against `steps`.
async fn run(permissions: Value, keen: bool, steps: Vec<Step>) -> Ran {
    run_with(permissions, keen, steps, None).await
}

/// [`run`] with an approver for `ask` calls (`None`: the harness's default).
async fn run_with(
    permissions: Value,
    keen: bool,
    steps: Vec<Step>,
    approver: Option<Arc<dyn Approver>>,
) -> Ran {
    run_full(permissions, keen, steps, approver, Permissions::default()).await
}

/// [`run_with`] for a task with tool `overrides`.
async fn run_full(
    permissions: Value,
    keen: bool,
    steps: Vec<Step>,
    approver: Option<Arc<dyn Approver>>,
    overrides: Permissions,
) -> Ran {
    let model = FakeModel::start(Script::steps(steps), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls.jsonl");
    let bundle_dir = dir.path().join("bundle");
    write_bundle(
        &bundle_dir,
        &model.openai_base_url(),
        &permissions,
        keen,
        &log,
    );
    let bundle = Arc::new(Bundle::load(&bundle_dir).unwrap_or_else(|e| panic!("bundle: {e}")));
    let host = ToolHost::start(&bundle, LaunchContext::new("/nonexistent/agen")).await;
    assert!(
        host.status().not_connected.is_empty(),
        "the meta server starts"
    );
    let harness = Harness::new(
        bundle,
        Arc::new(host.clone()),
        &BTreeMap::new(),
        reqwest::Client::new(),
    )
    .unwrap();
    let harness = match approver {
        Some(a) => harness.with_approver(a),
        None => harness,
    };
    let sink = Arc::new(MemorySink::default());
    let req = RunAssignment {
        tool_overrides: overrides,
        ..request()
    };
    let outcome = harness
        .run(req, sink.clone(), CancellationToken::new())
        .await;
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    Ran {
        outcome,
        sink,
        requests: model.requests(),
        echo_runs: echo_runs(&log),
        calls,
    }
}

/// The tool names of the first native request.
fn offered_native(requests: &[Value]) -> Vec<String> {
    requests[0]["body"]["tools"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The tools the Keen tools section of the system prompt lists.
fn offered_keen(requests: &[Value]) -> Vec<String> {
    let system = requests[0]["body"]["messages"][0]["content"]
        .as_str()
        .unwrap();
    let list = system
        .split("Your tools are: ")
        .nth(1)
        .unwrap_or("")
        .lines()
        .next()
        .unwrap_or("");
    let mut names: Vec<String> = list
        .split(", ")
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    names.sort();
    names
}

const BUILTINS: [&str; 3] = ["finish", "read_artifact", "save_artifact"];

fn with_builtins(tools: &[&str]) -> Vec<String> {
    let mut all: Vec<String> = tools.iter().map(|s| s.to_string()).collect();
    all.extend(BUILTINS.iter().map(|s| s.to_string()));
    all
}

#[tokio::test]
async fn native_permissions_decide_what_is_offered_and_a_denied_call_never_reaches_the_server() {
    // (permissions, offered besides the never-gated built-ins, echo allowed)
    let table: Vec<(Value, Vec<&str>, bool)> = vec![
        (json!({}), vec!["m_echo", "m_slow", "load_skill"], true),
        (
            json!({"deny": ["m.echo"]}),
            vec!["m_slow", "load_skill"],
            false,
        ),
        (
            json!({"deny": ["m_echo"]}),
            vec!["m_slow", "load_skill"],
            false,
        ),
        (json!({"deny": ["m.*"]}), vec!["load_skill"], false),
        (json!({"deny": ["*"]}), vec![], false),
        (
            json!({"deny": ["load_skill"]}),
            vec!["m_echo", "m_slow"],
            true,
        ),
        (json!({"allow": ["m.slow"]}), vec!["m_slow"], false),
        (
            json!({"allow": ["m_*", "load_skill"]}),
            vec!["m_echo", "m_slow", "load_skill"],
            true,
        ),
        (
            json!({"allow": ["*"], "deny": ["m.slow"]}),
            vec!["m_echo", "load_skill"],
            true,
        ),
    ];
    for (permissions, offered, allowed) in table {
        let ran = run(
            permissions.clone(),
            false,
            vec![
                Step::call("m_echo", json!({"text": "hi"})),
                Step::template("saw: {{last_tool_result}}"),
            ],
        )
        .await;
        let mut expected = offered.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // MCP tools first (sorted), then the built-ins in their fixed order.
        let mcp: Vec<String> = expected
            .iter()
            .filter(|s| s.starts_with("m_"))
            .cloned()
            .collect();
        let skill = expected.iter().any(|s| s == "load_skill");
        expected = mcp;
        expected.extend(["finish", "save_artifact", "read_artifact"].map(String::from));
        if skill {
            expected.push("load_skill".into());
        }
        assert_eq!(
            offered_native(&ran.requests),
            expected,
            "offered with {permissions}"
        );
        assert_eq!(
            ran.outcome.state,
            RunState::Succeeded,
            "{permissions}: {:?}",
            ran.outcome
        );
        if allowed {
            assert_eq!(ran.echo_runs, 1, "{permissions}: echo runs once");
            assert_eq!(ran.outcome.result, "saw: hi");
            assert_eq!(ran.sink.failures(), vec![]);
        } else {
            assert_eq!(
                ran.echo_runs, 0,
                "{permissions}: a denied call never reaches the server"
            );
            assert!(
                ran.outcome
                    .result
                    .starts_with("saw: tool m_echo was not run: the bundle's permissions deny it"),
                "{permissions}: {}",
                ran.outcome.result
            );
            assert_eq!(
                ran.sink.failures(),
                vec![("m.echo".to_string(), ToolFailure::Denied)]
            );
        }
    }
}

#[tokio::test]
async fn builtins_are_never_gated_even_by_a_deny_all() {
    let ran = run(
        json!({"deny": ["*"], "allow": ["nothing.at_all"]}),
        false,
        vec![
            Step::call("save_artifact", json!({"name": "n", "content": "kept"})),
            Step::call("finish", json!({"result": "finished anyway"})),
        ],
    )
    .await;
    assert_eq!(
        offered_native(&ran.requests),
        vec!["finish", "save_artifact", "read_artifact"]
    );
    assert_eq!(ran.outcome.state, RunState::Succeeded);
    assert_eq!(ran.outcome.result, "finished anyway");
    assert_eq!(ran.sink.failures(), vec![]);
}

fn keen_call(tool: &str, context: &str) -> String {
    format!(
        "<SYSTEM CALL>\n!*action\nuse tool\n!*tool\n{tool}\n!*context\n{context}\n</SYSTEM CALL>\n"
    )
}

#[tokio::test]
async fn keen_permissions_decide_the_tools_section_and_a_denied_call_is_refused() {
    // (permissions, offered besides the never-gated built-ins, the call, whether it runs)
    type Row<'a> = (Value, Vec<&'a str>, (&'a str, &'a str), bool);
    let table: Vec<Row> = vec![
        (
            json!({}),
            vec!["Stamp", "load_skill", "m_echo", "m_slow"],
            ("Stamp", ""),
            true,
        ),
        (
            json!({"deny": ["Stamp"]}),
            vec!["load_skill", "m_echo", "m_slow"],
            ("Stamp", ""),
            false,
        ),
        (
            json!({"deny": ["St*"]}),
            vec!["load_skill", "m_echo", "m_slow"],
            ("Stamp", ""),
            false,
        ),
        (
            json!({"deny": ["m.echo"]}),
            vec!["Stamp", "load_skill", "m_slow"],
            ("m_echo", "{\"text\": \"hi\"}"),
            false,
        ),
        (
            json!({"deny": ["m_echo"]}),
            vec!["Stamp", "load_skill", "m_slow"],
            ("m_echo", "{\"text\": \"hi\"}"),
            false,
        ),
        (
            json!({"allow": ["Stamp"]}),
            vec!["Stamp"],
            ("m_echo", "{\"text\": \"hi\"}"),
            false,
        ),
        (
            json!({"allow": ["m.echo"]}),
            vec!["m_echo"],
            ("m_echo", "{\"text\": \"hi\"}"),
            true,
        ),
        (json!({"deny": ["*"]}), vec![], ("Stamp", ""), false),
    ];
    for (permissions, offered, (tool, context), runs) in table {
        let ran = run(
            permissions.clone(),
            true,
            vec![
                Step::reply(keen_call(tool, context)),
                Step::template("saw: {{last_user}}"),
            ],
        )
        .await;
        let mut expected = with_builtins(&offered);
        expected.sort();
        assert_eq!(
            offered_keen(&ran.requests),
            expected,
            "offered with {permissions}"
        );
        assert_eq!(
            ran.outcome.state,
            RunState::Succeeded,
            "{permissions}: {:?}",
            ran.outcome
        );
        let result = &ran.outcome.result;
        if runs {
            assert!(
                !result.contains("permissions deny"),
                "{permissions}: {result}"
            );
            assert_eq!(ran.sink.failures(), vec![]);
        } else {
            assert!(
                result.contains(&format!(
                    "tool {tool} was not run: the bundle's permissions deny it"
                )),
                "{permissions}: {result}"
            );
            let gated = if tool == "m_echo" { "m.echo" } else { tool };
            assert_eq!(
                ran.sink.failures(),
                vec![(gated.to_string(), ToolFailure::Denied)]
            );
        }
        let expected_echo = usize::from(runs && tool == "m_echo");
        assert_eq!(
            ran.echo_runs, expected_echo,
            "{permissions}: echo executions"
        );
    }
}

#[tokio::test]
async fn an_ask_call_without_an_approver_is_denied_and_never_reaches_the_server() {
    let ran = run(
        json!({"ask": ["m.echo"]}),
        false,
        vec![
            Step::call("m_echo", json!({"text": "hi"})),
            Step::template("saw: {{last_tool_result}}"),
        ],
    )
    .await;
    assert!(
        offered_native(&ran.requests).contains(&"m_echo".to_string()),
        "an ask tool is offered"
    );
    assert_eq!(ran.echo_runs, 0);
    assert!(
        ran.outcome.result.starts_with(
            "saw: tool m_echo was not run: it needs approval and was denied: no one to approve"
        ),
        "{}",
        ran.outcome.result
    );
    assert_eq!(
        ran.sink.failures(),
        vec![("m.echo".to_string(), ToolFailure::Denied)]
    );
}

#[tokio::test]
async fn a_turn_with_an_ask_call_runs_its_calls_one_at_a_time_in_order() {
    let ran = run_with(
        json!({"ask": ["m.echo"]}),
        false,
        vec![
            Step::calls(vec![
                ("m_slow", json!({"seconds": 0.3})),
                ("m_echo", json!({"text": "approved"})),
                ("m_slow", json!({"seconds": 0.3})),
            ]),
            Step::template("saw: {{last_tool_result}}"),
        ],
        Some(Arc::new(ApproveAll)),
    )
    .await;
    assert_eq!(ran.outcome.state, RunState::Succeeded, "{:?}", ran.outcome);
    let order: Vec<String> = ran
        .calls
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            format!(
                "{} {}",
                v["tool"].as_str().unwrap(),
                v["event"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        order,
        vec![
            "slow started",
            "slow finished",
            "echo called",
            "slow started",
            "slow finished"
        ],
        "one at a time, in the order asked"
    );
    assert_eq!(ran.sink.failures(), vec![]);
}

#[tokio::test]
async fn task_overrides_narrow_the_bundle_and_never_widen_it() {
    let steps = || {
        vec![
            Step::call("m_echo", json!({"text": "hi"})),
            Step::template("saw: {{last_tool_result}}"),
        ]
    };
    // An override deny closes a tool the bundle allows.
    let deny = Permissions {
        deny: vec!["m_echo".into()],
        ..Permissions::default()
    };
    let ran = run_full(json!({}), false, steps(), None, deny).await;
    assert!(!offered_native(&ran.requests).contains(&"m_echo".to_string()));
    assert_eq!(ran.echo_runs, 0);
    assert!(
        ran.outcome
            .result
            .starts_with("saw: tool m_echo was not run: this task's tool overrides deny it"),
        "{}",
        ran.outcome.result
    );
    // An override allow list is intersected with the bundle's.
    let allow = Permissions {
        allow: vec!["m.slow".into()],
        ..Permissions::default()
    };
    let ran = run_full(json!({}), false, steps(), None, allow).await;
    assert_eq!(
        offered_native(&ran.requests),
        with_builtins_native(&["m_slow"])
    );
    assert_eq!(ran.echo_runs, 0);
    // An override allow of a tool the bundle denies has no effect.
    let widen = Permissions {
        allow: vec!["m.echo".into()],
        ..Permissions::default()
    };
    let ran = run_full(json!({"deny": ["m.echo"]}), false, steps(), None, widen).await;
    assert!(!offered_native(&ran.requests).contains(&"m_echo".to_string()));
    assert_eq!(ran.echo_runs, 0);
    assert!(
        ran.outcome
            .result
            .contains("the bundle's permissions deny it"),
        "{}",
        ran.outcome.result
    );
}

/// Native order: MCP tools, then finish, save_artifact, read_artifact (no skill offered).
fn with_builtins_native(mcp: &[&str]) -> Vec<String> {
    let mut all: Vec<String> = mcp.iter().map(|s| s.to_string()).collect();
    all.extend(["finish", "save_artifact", "read_artifact"].map(String::from));
    all
}
