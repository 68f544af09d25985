//! Delegates end to end: `call_agent` / `start_agent` on a fleet. Deployment `caller` lists
//! `helper` in `x-agen/config.json` `delegates`; `helper`'s only tool server is
//! `meta_server.py` (records each call's `_meta`), so the tests see which task and tree a
//! child's tool call belongs to. Each deployment has its own scripted fake model.
//!
//! What they prove: the child is a task of its own with `parent_task_id`, listed by
//! `agen tasks --parent` and shown by `agen query`; its tool calls carry the root run's
//! `rootRunId`; the caller gets its result; `start_agent` returns at once and the child
//! outlives the caller; cancelling the caller cancels the child; an unknown delegate and a
//! call past `maxDelegationDepth` are tool errors; a killed caller instance resumes and waits
//! for the same child (never a second one).

use std::path::{Path, PathBuf};
use std::time::Duration;

use agen_tests::{mcp_json, wait_for, write_bundle, FakeModel, HubProcess, NestProcess, Peers};
use serde_json::{json, Value};

struct Tree {
    _tmp: tempfile::TempDir,
    hub: HubProcess,
    nest: NestProcess,
    _models: Vec<FakeModel>,
    /// `meta_server.py`'s log of the helper's tool calls.
    log: PathBuf,
}

/// A Hub, one Nest, and deployments `caller` (following `caller_steps`; its delegates,
/// harness and concurrency as given) and, when `helper_steps` is set, `helper`.
fn tree(
    caller_steps: Value,
    helper_steps: Option<Value>,
    config: Value,
    harness: Value,
    concurrency: u32,
) -> Tree {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    let log = tmp.path().join("meta.jsonl");
    let mut models = Vec::new();
    let mut deploy = |name: &str, steps: Value, files: Vec<(&str, String)>, concurrency: u32| {
        let model = FakeModel::start(
            &tmp.path().join(format!("model-{name}")),
            &json!({"steps": steps}),
        )
        .unwrap();
        let dir = tmp.path().join(name);
        let mut all = vec![(
            "x-agen/agent.md",
            format!(
                "---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou are {name}.\n",
                model.base_url()
            ),
        )];
        all.extend(files);
        write_bundle(&dir, &all).unwrap();
        let concurrency = concurrency.to_string();
        let out = hub
            .cli(&[
                "deploy",
                dir.to_str().unwrap(),
                "--name",
                name,
                "--concurrency",
                &concurrency,
                "--wait",
            ])
            .unwrap();
        assert!(
            out.status.success(),
            "deploy {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        models.push(model);
    };
    if let Some(steps) = helper_steps {
        deploy(
            "helper",
            steps,
            vec![(
                "mcp.json",
                mcp_json(&[(
                    "meta",
                    json!({"command": Peers::python(), "args": [Peers::script("servers/meta_server.py")], "env": {"META_LOG": log}}),
                )]),
            )],
            1,
        );
    }
    deploy(
        "caller",
        caller_steps,
        vec![
            ("x-agen/config.json", config.to_string()),
            ("x-agen/harness.json", harness.to_string()),
        ],
        concurrency,
    );
    Tree {
        _tmp: tmp,
        hub,
        nest,
        _models: models,
        log,
    }
}

/// `caller` delegating to `helper`.
fn caller_and_helper(caller_steps: Value, helper_steps: Value) -> Tree {
    tree(
        caller_steps,
        Some(helper_steps),
        json!({"delegates": [{"deployment": "helper", "description": "echoes what it is told"}]}),
        json!({}),
        1,
    )
}

impl Tree {
    fn submit(&self, deployment: &str, input: &str) -> String {
        let out = self.hub.cli(&["submit", deployment, input]).unwrap();
        assert!(
            out.status.success(),
            "submit: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    fn query(&self, task: &str) -> Value {
        self.hub.cli_json(&["query", task, "-o", "json"]).unwrap()
    }

    fn wait(&self, task: &str) -> Value {
        let out = self
            .hub
            .cli(&["wait", task, "-o", "json", "--timeout", "120s"])
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "wait printed no JSON: {}\nhub log:\n{}\nnest log:\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.hub.proc.log_text(),
                self.nest.proc.log_text()
            )
        })
    }

    fn children(&self, task: &str) -> Vec<Value> {
        match self
            .hub
            .cli_json(&["tasks", "--parent", task, "-o", "json"])
            .unwrap()
        {
            Value::Array(a) => a,
            other => panic!("tasks printed {other}"),
        }
    }

    /// The one child of `task`, once it exists.
    fn wait_child(&self, task: &str) -> Value {
        wait_for("the child task", Duration::from_secs(60), || {
            self.children(task).into_iter().next()
        })
        .unwrap()
    }

    fn meta_events(&self) -> Vec<Value> {
        meta_events(&self.log)
    }

    fn wait_meta(&self, tool: &str, event: &str) {
        wait_for(&format!("{tool} {event}"), Duration::from_secs(60), || {
            self.meta_events()
                .iter()
                .any(|e| e["tool"] == tool && e["event"] == event)
                .then_some(())
        })
        .unwrap();
    }
}

pub(crate) fn meta_events(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn call_agent(agent: &str, input: &str) -> Value {
    json!({"tool_calls": [{"name": "call_agent", "arguments": {"agent": agent, "input": input}}]})
}

#[test]
fn call_agent_runs_the_delegate_as_a_child_task_and_returns_its_result() {
    let t = caller_and_helper(
        json!([call_agent("helper", "say hello"), {"reply_template": "caller got: {{last_tool_result}}"}]),
        json!([
            {"tool_calls": [{"name": "meta_echo", "arguments": {"text": "hello from helper"}}]},
            {"reply_template": "helper says {{last_tool_result}}"}
        ]),
    );
    let task = t.submit("caller", "ask the helper");
    let done = t.wait(&task);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(
        done["outcome"]["result"],
        "caller got: helper says hello from helper"
    );

    let children = t.children(&task);
    assert_eq!(children.len(), 1, "one child: {children:?}");
    let child = &children[0];
    assert_eq!(
        (&child["deployment"], &child["state"], &child["parent_task"]),
        (&json!("helper"), &json!("succeeded"), &json!(task))
    );
    let child_id = child["task"].as_str().unwrap();
    let root = done["run_id"].as_str().unwrap();
    assert_eq!(done["root_run_id"], root, "the caller is the root");

    // The child's tool call belongs to the child's task and to the caller's tree.
    let calls: Vec<Value> = t
        .meta_events()
        .into_iter()
        .filter(|e| e["tool"] == "echo")
        .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let meta = &calls[0]["meta"];
    assert_eq!(meta["agen/rootRunId"], root, "{meta}");
    assert_eq!(meta["agen/taskId"], child_id, "{meta}");
    assert_eq!(meta["agen/deployment"], "helper", "{meta}");
    assert_ne!(meta["agen/runId"], root, "the child has a run of its own");

    // The trace nests the child's run under the caller's call_agent span, and the child's
    // tool call under the child's run.
    let trace = t.hub.cli_json(&["trace", &task, "-o", "json"]).unwrap();
    let spans = trace["spans"].as_array().unwrap();
    let by_name = |name: &str| {
        spans
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no span {name}: {trace}"))
    };
    let call = by_name("tool call_agent");
    let child_root = by_name("task helper");
    assert_eq!(child_root["parent_span_id"], call["span_id"], "{trace}");
    assert_eq!(
        by_name("tool meta.echo")["parent_span_id"],
        child_root["span_id"],
        "{trace}"
    );
    let traceparent = meta["traceparent"].as_str().unwrap();
    assert!(
        traceparent.contains(by_name("tool meta.echo")["span_id"].as_str().unwrap()),
        "{traceparent}"
    );

    // agen query shows both ends of the edge.
    assert_eq!(t.query(&task)["children"], json!([child_id]));
    let q = t.query(child_id);
    assert_eq!(
        (&q["parent_task"], &q["root_run_id"]),
        (&json!(task), &json!(root))
    );
}

#[test]
fn a_failed_child_is_a_tool_error_naming_it() {
    // The helper's model answers with a provider error: the child fails.
    let t = caller_and_helper(
        json!([call_agent("helper", "fail"), {"reply_template": "caller got: {{last_tool_result}}"}]),
        json!([{"status": 500, "body": "model broken"}]),
    );
    let task = t.submit("caller", "ask the helper");
    let done = t.wait(&task);
    assert_eq!(done["state"], "succeeded", "{done}");
    let child = t.children(&task).remove(0);
    assert_eq!(child["state"], "failed", "{child}");
    let result = done["outcome"]["result"].as_str().unwrap();
    let named = format!(
        "caller got: call_agent: task {} on helper failed:",
        child["task"].as_str().unwrap()
    );
    assert!(result.starts_with(&named), "{result}");
}

#[test]
fn start_agent_returns_the_child_at_once_and_the_child_outlives_its_parent() {
    let t = caller_and_helper(
        json!([
            {"tool_calls": [{"name": "start_agent", "arguments": {"agent": "helper", "input": "take your time"}}]},
            {"reply_template": "started {{last_tool_result}}"}
        ]),
        json!([
            {"tool_calls": [{"name": "meta_slow", "arguments": {"seconds": 3}}]},
            {"reply": "helper finished"}
        ]),
    );
    let task = t.submit("caller", "start the helper");
    let done = t.wait(&task);
    assert_eq!(done["state"], "succeeded", "{done}");
    let child = t.children(&task).remove(0);
    let child_id = child["task"].as_str().unwrap().to_owned();
    let result = done["outcome"]["result"].as_str().unwrap();
    assert!(result.contains(&child_id), "the id is returned: {result}");
    assert_ne!(
        t.query(&child_id)["state"],
        "succeeded",
        "the caller did not wait for it"
    );
    let child_done = t.wait(&child_id);
    assert_eq!(
        (&child_done["state"], &child_done["outcome"]["result"]),
        (&json!("succeeded"), &json!("helper finished"))
    );
}

#[test]
fn cancelling_the_caller_cancels_its_child() {
    let t = caller_and_helper(
        json!([call_agent("helper", "wait a minute"), {"reply": "never"}]),
        json!([
            {"tool_calls": [{"name": "meta_slow", "arguments": {"seconds": 60}}]},
            {"reply": "never"}
        ]),
    );
    let task = t.submit("caller", "ask the helper");
    let child = t.wait_child(&task);
    t.wait_meta("slow", "started");
    let out = t.hub.cli(&["cancel", &task]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let child_done = t.wait(child["task"].as_str().unwrap());
    assert_eq!(child_done["state"], "cancelled", "{child_done}");
    assert_eq!(t.wait(&task)["state"], "cancelled");
    t.wait_meta("slow", "cancelled");
}

#[test]
fn an_unknown_delegate_is_a_tool_error_the_model_can_act_on() {
    let t = tree(
        json!([call_agent("nobody", "hi"), {"reply_template": "{{last_tool_result}}"}]),
        None,
        json!({"delegates": ["helper"]}),
        json!({}),
        1,
    );
    let task = t.submit("caller", "ask nobody");
    let done = t.wait(&task);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(
        done["outcome"]["result"],
        "call_agent: `nobody` is not one of this agent's delegates (x-agen/config.json delegates); call one of: helper"
    );
    assert!(t.children(&task).is_empty(), "nothing was started");
}

#[test]
fn a_call_past_max_delegation_depth_is_a_tool_error() {
    // `caller` delegates to itself; with maxDelegationDepth 1 its child may not delegate again.
    let t = tree(
        json!([call_agent("caller", "go deeper"), {"reply_template": "got: {{last_tool_result}}"}]),
        None,
        json!({"delegates": ["caller"]}),
        json!({"limits": {"maxDelegationDepth": 1}}),
        2,
    );
    let task = t.submit("caller", "go deep");
    let done = t.wait(&task);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(
        done["outcome"]["result"],
        "got: got: call_agent to caller was not run: it would make the delegation tree 2 deep, over limits.maxDelegationDepth of 1 (x-agen/harness.json); do this part yourself or answer with what you have"
    );
    let child = t.children(&task).remove(0);
    assert!(
        t.children(child["task"].as_str().unwrap()).is_empty(),
        "the child started no grandchild"
    );
}

/// The pid of the `agen instance` process on `nest` that runs bundle `digest` (an instance's
/// identity is never on its command line; it runs in its bundle's folder,
/// `<nest data>/bundles/<hex>/`).
fn instance_pid(nest: &NestProcess, digest: &str) -> Option<u32> {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest).to_owned();
    nest.descendants().into_iter().find(|pid| {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let is_instance = String::from_utf8_lossy(&cmd).split('\0').nth(1) == Some("instance");
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
        is_instance && cwd.to_string_lossy().contains(&hex)
    })
}

#[test]
fn a_killed_caller_resumes_and_gets_the_result_of_the_same_child() {
    let t = caller_and_helper(
        json!([call_agent("helper", "work a while"), {"reply_template": "caller got: {{last_tool_result}}"}]),
        json!([
            {"tool_calls": [{"name": "meta_slow", "arguments": {"seconds": 6}}]},
            {"reply": "helper finished"}
        ]),
    );
    let task = t.submit("caller", "ask the helper");
    let child = t.wait_child(&task);
    t.wait_meta("slow", "started");
    let digest = t.query(&task)["bundle_digest"].as_str().unwrap().to_owned();
    let pid = instance_pid(&t.nest, &digest).expect("the caller's instance runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();

    let done = t.wait(&task);
    assert_eq!(done["state"], "succeeded", "{done}");
    // Resumed after the kill, or (when the kill landed after the run gave its slot back
    // while it waited) when the child ended: a later attempt either way.
    assert!(done["attempt"].as_u64().unwrap() >= 2, "resumed: {done}");
    assert_eq!(done["outcome"]["result"], "caller got: helper finished");
    let children = t.children(&task);
    assert_eq!(children.len(), 1, "never a second child: {children:?}");
    assert_eq!(children[0]["task"], child["task"]);
    assert_eq!(
        children[0]["attempt"], 1,
        "the child ran once: {children:?}"
    );
    let started = t
        .meta_events()
        .iter()
        .filter(|e| e["tool"] == "slow" && e["event"] == "started")
        .count();
    assert_eq!(started, 1, "the child's tool ran once");
}

#[test]
fn a_hub_killed_while_the_child_runs_loses_neither_the_child_nor_the_result() {
    let mut t = caller_and_helper(
        json!([call_agent("helper", "work a while"), {"reply_template": "caller got: {{last_tool_result}}"}]),
        json!([
            {"tool_calls": [{"name": "meta_slow", "arguments": {"seconds": 6}}]},
            {"reply": "helper finished"}
        ]),
    );
    let task = t.submit("caller", "ask the helper");
    let child = t.wait_child(&task);
    t.wait_meta("slow", "started");
    t.hub.proc.kill9();
    t.hub.restart().unwrap();

    let done = t.wait(&task);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["outcome"]["result"], "caller got: helper finished");
    let children = t.children(&task);
    assert_eq!(children.len(), 1, "never a second child: {children:?}");
    assert_eq!(children[0]["task"], child["task"]);
    let started = t
        .meta_events()
        .iter()
        .filter(|e| e["tool"] == "slow" && e["event"] == "started")
        .count();
    assert_eq!(started, 1, "the child's tool ran once");
}

#[test]
fn the_callers_tool_timeout_cancels_the_child_and_names_it() {
    let t = tree(
        json!([call_agent("helper", "take forever"), {"reply_template": "{{last_tool_result}}"}]),
        Some(json!([
            {"tool_calls": [{"name": "meta_slow", "arguments": {"seconds": 60}}]},
            {"reply": "never"}
        ])),
        json!({"delegates": ["helper"]}),
        json!({"limits": {"toolTimeout": "4s"}}),
        1,
    );
    let task = t.submit("caller", "ask the helper");
    let done = t.wait(&task);
    assert_eq!(done["state"], "succeeded", "{done}");
    let child = t.children(&task).remove(0);
    let child_id = child["task"].as_str().unwrap();
    assert_eq!(
        done["outcome"]["result"],
        format!("call_agent: task {child_id} on helper did not finish within 4s (limits.toolTimeout) and was cancelled")
    );
    assert_eq!(t.wait(child_id)["state"], "cancelled");
}

#[test]
fn a_one_slot_deployment_that_delegates_to_itself_completes() {
    // The caller's only slot is free while it waits: the child (on the same deployment, one
    // level deeper, where a further call_agent is past maxDelegationDepth) runs meanwhile.
    let t = tree(
        json!([call_agent("caller", "inner"), {"reply_template": "got: {{last_tool_result}}"}]),
        None,
        json!({"delegates": ["caller"]}),
        json!({"limits": {"maxDelegationDepth": 1}}),
        1,
    );
    let task = t.submit("caller", "outer");
    let done = t.wait(&task);
    assert_eq!(done["state"], "succeeded", "{done}");
    let result = done["outcome"]["result"].as_str().unwrap_or_default();
    assert!(
        result.starts_with("got: got: "),
        "the child's answer came back: {result}"
    );
    assert!(
        done["attempt"].as_u64().unwrap() >= 2,
        "the caller resumed: {done}"
    );
    let children = t.children(&task);
    assert_eq!(children.len(), 1, "one child: {children:?}");
    assert_eq!(children[0]["state"], "succeeded", "{children:?}");
}

#[test]
fn permissions_apply_to_call_agent_by_name() {
    let t = tree(
        json!([call_agent("helper", "hi"), {"reply_template": "{{last_tool_result}}"}]),
        None,
        json!({"delegates": ["helper"], "permissions": {"deny": ["call_agent"]}}),
        json!({}),
        1,
    );
    let task = t.submit("caller", "ask the helper");
    let done = t.wait(&task);
    assert_eq!(
        done["outcome"]["result"],
        "tool call_agent was not run: the bundle's permissions deny it (x-agen/config.json `permissions`); do not call it again, answer with the tools you have"
    );
    assert!(t.children(&task).is_empty(), "nothing was started");
}

/// `agen run DIR PROMPT` with stdin not a terminal: (exit code, stdout, stderr).
fn agen_run(dir: &Path, state: &Path, prompt: &str) -> (i32, String, String) {
    let out = std::process::Command::new(agen_tests::agen_bin())
        .args(["run", dir.to_str().unwrap(), prompt])
        .env("XDG_STATE_HOME", state)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("agen run starts");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn agen_run_runs_a_local_bundle_delegate_in_process_and_a_fleet_one_says_it_needs_a_fleet() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("meta.jsonl");
    let helper_model = FakeModel::start(
        &tmp.path().join("model-helper"),
        &json!({"steps": [
            {"tool_calls": [{"name": "meta_echo", "arguments": {"text": "local hello"}}]},
            {"reply_template": "helper says {{last_tool_result}}"}
        ]}),
    )
    .unwrap();
    let caller_model = FakeModel::start(
        &tmp.path().join("model-caller"),
        &json!({"steps": [
            {"tool_calls": [
                {"name": "call_agent", "arguments": {"agent": "helper", "input": "say hello"}, "id": "c1"},
                {"name": "call_agent", "arguments": {"agent": "remote", "input": "say hello"}, "id": "c2"}
            ]},
            {"reply_template": "caller got: {{last_tool_result}}"}
        ], "record": tmp.path().join("caller-requests.jsonl")}),
    )
    .unwrap();
    let agent = |m: &FakeModel, name: &str| {
        format!(
            "---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou are {name}.\n",
            m.base_url()
        )
    };
    write_bundle(
        &tmp.path().join("helper"),
        &[
            ("x-agen/agent.md", agent(&helper_model, "helper")),
            (
                "mcp.json",
                mcp_json(&[(
                    "meta",
                    json!({"command": Peers::python(), "args": [Peers::script("servers/meta_server.py")], "env": {"META_LOG": log}}),
                )]),
            ),
        ],
    )
    .unwrap();
    let caller = tmp.path().join("caller");
    write_bundle(
        &caller,
        &[
            ("x-agen/agent.md", agent(&caller_model, "caller")),
            (
                "x-agen/config.json",
                json!({"delegates": [{"deployment": "helper", "bundle": "../helper"}, "remote"]})
                    .to_string(),
            ),
            (
                "x-agen/harness.json",
                json!({"parallelToolCalls": false}).to_string(),
            ),
        ],
    )
    .unwrap();
    let (code, stdout, stderr) = agen_run(&caller, &tmp.path().join("state"), "ask the helper");
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(
        stdout.starts_with("caller got: call_agent: could not start a task on remote: delegate `remote` needs a fleet"),
        "{stdout}"
    );
    let told: Vec<Value> = meta_events(&tmp.path().join("caller-requests.jsonl"));
    let last = told.last().unwrap();
    let results: Vec<&Value> = last["body"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| &m["content"])
        .collect();
    assert_eq!(results[0], "helper says local hello", "{results:?}");

    let calls = meta_events(&log);
    assert_eq!(calls.len(), 1, "{calls:?}");
    let meta = &calls[0]["meta"];
    assert_ne!(
        meta["agen/runId"], meta["agen/rootRunId"],
        "a child run: {meta}"
    );
    assert_eq!(meta["agen/deployment"], "helper", "{meta}");
}
