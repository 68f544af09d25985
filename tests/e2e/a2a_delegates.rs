//! Remote A2A agents as delegates, end to end: the remote agent is a REAL PyPI `a2a-sdk` 1.3
//! server (`tests/peers/servers/a2a_agent.py`, JSON-RPC binding, plain HTTP on 127.0.0.1) that
//! checks the bearer token and logs each SendMessage's `messageId`; the caller is a deployment
//! on a fleet (or `agen run`) whose scripted fake model calls `call_agent`.
//!
//! What they prove: `call_agent` fetches the card, sends the call's `agen/idempotencyKey` as the
//! `messageId`, polls the task and returns its reply and artifact text; the token comes from the
//! run's secrets (the Hub's store, the Nest's or `agen run`'s environment) and never shows in
//! the run log; a wrong token, an
//! unreachable agent, a bad card and a failed or rejected remote task are tool errors naming the
//! agent and why; a caller killed while the remote task works resumes, polls the same remote
//! task, and the remote agent saw exactly one SendMessage.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agen_tests::{
    free_port, wait_for, write_bundle, FakeModel, HubProcess, NestProcess, Peers, Proc,
};
use serde_json::{json, Value};

const TOKEN: &str = "tok-right-8c1f";

/// The a2a-sdk agent.
struct RemoteAgent {
    _proc: Proc,
    port: u16,
    /// One line per SendMessage received: its messageId.
    log: PathBuf,
    /// One line per CancelTask received: its task id.
    cancels: PathBuf,
}

impl RemoteAgent {
    fn start(dir: &Path, sleep_s: u32) -> RemoteAgent {
        RemoteAgent::start_with(dir, sleep_s, 0)
    }

    /// `reply_delay_s`: each SendMessage's reply is held back that long after the task exists.
    fn start_with(dir: &Path, sleep_s: u32, reply_delay_s: u32) -> RemoteAgent {
        std::fs::create_dir_all(dir).unwrap();
        let port_file = dir.join("port");
        let log = dir.join("messages.log");
        let cancels = dir.join("cancels.log");
        let mut cmd = std::process::Command::new(Peers::python());
        cmd.arg(Peers::script("servers/a2a_agent.py"))
            .arg("--port-file")
            .arg(&port_file)
            .arg("--log")
            .arg(&log)
            .arg("--cancel-log")
            .arg(&cancels)
            .args(["--token", TOKEN, "--sleep", &sleep_s.to_string()])
            .args(["--reply-delay", &reply_delay_s.to_string()]);
        let proc = Proc::spawn("a2a-agent", cmd, &dir.join("agent.log")).unwrap();
        let port = wait_for("the a2a agent to listen", Duration::from_secs(30), || {
            std::fs::read_to_string(&port_file)
                .ok()?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", proc.log_text()));
        RemoteAgent {
            _proc: proc,
            port,
            log,
            cancels,
        }
    }

    fn card_url(&self) -> String {
        format!("http://127.0.0.1:{}/.well-known/agent-card.json", self.port)
    }

    fn message_ids(&self) -> Vec<String> {
        lines(&self.log)
    }

    fn cancelled_tasks(&self) -> Vec<String> {
        lines(&self.cancels)
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The caller's bundle: `delegates` and `harness.json` as given, secrets `REMOTE_TOKEN` and
/// `WRONG_TOKEN` from the environment and `HUB_TOKEN` from the Hub's secret store.
fn caller_bundle(dir: &Path, model: &FakeModel, delegates: Value, harness: Value) {
    write_bundle(
        dir,
        &[
            (
                "x-agen/agent.md",
                format!(
                    "---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou are the caller.\n",
                    model.base_url()
                ),
            ),
            (
                "x-agen/config.json",
                json!({"delegates": delegates}).to_string(),
            ),
            (
                "x-agen/secrets.json",
                json!({"REMOTE_TOKEN": {"source": "env"}, "WRONG_TOKEN": {"source": "env"}, "HUB_TOKEN": {"source": "platform"}})
                    .to_string(),
            ),
            ("x-agen/harness.json", harness.to_string()),
        ],
    )
    .unwrap();
}

fn remote(name: &str, url: &str, secret: &str) -> Value {
    json!({"name": name, "a2a": url, "description": "a remote helper", "token": format!("${{{secret}}}")})
}

fn call_agent(agent: &str, input: &str) -> Value {
    json!({"tool_calls": [{"name": "call_agent", "arguments": {"agent": agent, "input": input}}]})
}

/// A Hub (whose secret store holds `HUB_TOKEN`) and one Nest whose environment holds the
/// other tokens, with `caller` deployed.
struct Fleet {
    tmp: tempfile::TempDir,
    hub: HubProcess,
    nest: NestProcess,
    model: FakeModel,
    requests: PathBuf,
}

fn fleet(steps: Value, delegates: Value) -> Fleet {
    fleet_with(steps, delegates, json!({"parallelToolCalls": false}))
}

fn fleet_with(steps: Value, delegates: Value, harness: Value) -> Fleet {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub
        .nest(
            "solo",
            &[],
            &[("REMOTE_TOKEN", TOKEN), ("WRONG_TOKEN", "tok-wrong")],
        )
        .unwrap();
    let requests = tmp.path().join("caller-requests.jsonl");
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": steps, "record": requests}),
    )
    .unwrap();
    set_hub_secret(&hub, "HUB_TOKEN", TOKEN);
    let dir = tmp.path().join("caller");
    caller_bundle(&dir, &model, delegates, harness);
    let out = hub
        .cli(&[
            "deploy",
            dir.to_str().unwrap(),
            "--name",
            "caller",
            "--wait",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Fleet {
        tmp,
        hub,
        nest,
        model,
        requests,
    }
}

/// `agen secrets set NAME` with the value on stdin.
fn set_hub_secret(hub: &HubProcess, name: &str, value: &str) {
    use std::io::Write;
    let mut child = std::process::Command::new(agen_tests::agen_bin())
        .args(["secrets", "set", name])
        .env("AGEN_CONFIG", hub.dir.join("client.toml"))
        .env_remove("AGEN_HUB")
        .env_remove("AGEN_TOKEN")
        .env_remove("AGEN_NAMESPACE")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{value}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "secrets set: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Fleet {
    fn submit(&self, input: &str) -> String {
        let out = self.hub.cli(&["submit", "caller", input]).unwrap();
        assert!(
            out.status.success(),
            "submit: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    fn wait(&self, task: &str) -> Value {
        let out = self
            .hub
            .cli(&["wait", task, "-o", "json", "--timeout", "120s"])
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "wait printed no JSON: {}\nnest log:\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.nest.proc.log_text()
            )
        })
    }

    fn events(&self, task: &str) -> String {
        let out = self.hub.cli(&["trace", task, "--events"]).unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// The tool results the caller's model was given, from its last request.
fn tool_results(requests: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(requests).unwrap_or_default();
    let last: Value = text
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null);
    last["body"]["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["role"] == "tool")
                .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn call_agent_speaks_a2a_to_a_remote_agent_and_returns_its_reply_and_artifacts() {
    let tmp_agent = tempfile::tempdir().unwrap();
    let agent = RemoteAgent::start(tmp_agent.path(), 0);
    let url = agent.card_url();
    let f = fleet(
        json!([call_agent("pricing", "price 3 apples"), {"reply_template": "caller got: {{last_tool_result}}"}]),
        // The token from the Hub's secret store (the other tests take theirs from the Nest's
        // environment).
        json!([remote("pricing", &url, "HUB_TOKEN")]),
    );
    let task = f.submit("ask pricing");
    let done = f.wait(&task);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(
        done["outcome"]["result"],
        "caller got: remote says: price 3 apples\n\nartifact answer.txt:\nartifact: price 3 apples"
    );
    let run_id = done["run_id"].as_str().unwrap();
    assert_eq!(
        agent.message_ids(),
        vec![format!("{run_id}:0")],
        "one SendMessage, with the call's idempotency key as messageId"
    );
    let events = f.events(&task);
    assert!(events.contains("remote_task.started"), "{events}");
    assert!(!events.contains(TOKEN), "the token is not in the run log");
    assert!(
        !f.nest.proc.log_text().contains(TOKEN),
        "nor in the nest's log"
    );
}

#[test]
fn a_wrong_token_an_unreachable_agent_a_bad_card_and_a_failed_remote_task_are_tool_errors_naming_the_agent(
) {
    let tmp_agent = tempfile::tempdir().unwrap();
    let agent = RemoteAgent::start(tmp_agent.path(), 0);
    let url = agent.card_url();
    let closed = free_port();
    let bad_card = format!(
        "http://127.0.0.1:{}/nothing/.well-known/agent-card.json",
        agent.port
    );
    let f = fleet(
        json!([
            call_agent("wrongtoken", "hello"),
            call_agent("gone", "hello"),
            call_agent("badcard", "hello"),
            call_agent("pricing", "please FAIL"),
            call_agent("pricing", "please REJECT"),
            {"reply": "done"}
        ]),
        json!([
            remote("pricing", &url, "REMOTE_TOKEN"),
            remote("wrongtoken", &url, "WRONG_TOKEN"),
            remote(
                "gone",
                &format!("http://127.0.0.1:{closed}/.well-known/agent-card.json"),
                "REMOTE_TOKEN"
            ),
            remote("badcard", &bad_card, "REMOTE_TOKEN"),
        ]),
    );
    let task = f.submit("try them all");
    let done = f.wait(&task);
    assert_eq!(done["state"], "succeeded", "{done}");
    let results = tool_results(&f.requests);
    assert_eq!(results.len(), 5, "{results:?}");
    let expect = |i: usize, parts: &[&str]| {
        for p in parts {
            assert!(
                results[i].contains(p),
                "result {i} lacks {p:?}: {}",
                results[i]
            );
        }
    };
    expect(
        0,
        &[
            "call_agent to remote agent wrongtoken failed:",
            "refused the token (HTTP 401)",
        ],
    );
    expect(
        1,
        &[
            "call_agent to remote agent gone failed: cannot reach",
            &format!("127.0.0.1:{closed}"),
        ],
    );
    expect(
        2,
        &[
            "call_agent to remote agent badcard failed:",
            "answered HTTP 404",
        ],
    );
    expect(
        3,
        &[
            "call_agent to remote agent pricing: task ",
            "failed (TASK_STATE_FAILED): the remote agent could not do it",
        ],
    );
    expect(
        4,
        &["was rejected (TASK_STATE_REJECTED): the remote agent will not do that"],
    );
    assert!(
        results
            .iter()
            .all(|r| !r.contains(TOKEN) && !r.contains("tok-wrong")),
        "{results:?}"
    );
    // The wrong token and the unreachable agent sent nothing; the two tasks were sent once each.
    assert_eq!(agent.message_ids().len(), 2, "{:?}", agent.message_ids());

    // Deploy refuses a remote delegate over plain http to another host, or with an undeclared
    // token secret, naming the delegate and the fix.
    let deploy_error = |delegate: Value| {
        let dir = f.tmp.path().join("bad");
        let _ = std::fs::remove_dir_all(&dir);
        caller_bundle(&dir, &f.model, json!([delegate]), json!({}));
        let out = f
            .hub
            .cli(&["deploy", dir.to_str().unwrap(), "--name", "bad"])
            .unwrap();
        assert!(!out.status.success(), "deploy of a bad delegate succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = deploy_error(remote(
        "pricing",
        "http://agents.example.com/.well-known/agent-card.json",
        "REMOTE_TOKEN",
    ));
    assert!(
        err.contains("x-agen/config.json: delegates[0].a2a: delegate `pricing`: expected the https:// URL of its agent card")
            && err.contains("plain http would send the token in the clear to agents.example.com"),
        "{err}"
    );
    let err = deploy_error(remote("pricing", &url, "UNDECLARED"));
    assert!(
        err.contains("secret UNDECLARED used in x-agen/config.json delegates[0].token (delegate pricing) is not declared; add \"UNDECLARED\""),
        "{err}"
    );
}

#[test]
fn the_tool_timeout_cancels_the_remote_task_and_cancelling_the_caller_cancels_it_too() {
    let tmp_agent = tempfile::tempdir().unwrap();
    let agent = RemoteAgent::start(tmp_agent.path(), 30);
    let url = agent.card_url();
    let f = fleet_with(
        json!([call_agent("pricing", "take forever"), {"reply_template": "caller got: {{last_tool_result}}"}]),
        json!([remote("pricing", &url, "REMOTE_TOKEN")]),
        json!({"limits": {"toolTimeout": "3s"}}),
    );
    let task = f.submit("ask pricing");
    let done = f.wait(&task);
    assert_eq!(done["state"], "succeeded", "{done}");
    let result = done["outcome"]["result"].as_str().unwrap();
    assert!(
        result.starts_with("caller got: call_agent to remote agent pricing: task ")
            && result.ends_with(" did not finish within 3s (limits.toolTimeout) and was cancelled"),
        "{result}"
    );
    let cancelled = agent.cancelled_tasks();
    assert_eq!(
        cancelled.len(),
        1,
        "the timed-out task was cancelled once: {cancelled:?}"
    );
    assert!(
        result.contains(&cancelled[0]),
        "the error names the remote task: {result}"
    );

    // A cancelled caller cancels the remote task it waits for.
    let task = f.submit("ask pricing again");
    wait_for(
        "the caller to wait for the remote task",
        Duration::from_secs(60),
        || {
            let q = f.hub.cli_json(&["query", &task, "-o", "json"]).ok()?;
            q["activity"]
                .as_str()?
                .contains("waiting for task")
                .then_some(())
        },
    )
    .unwrap();
    let out = f.hub.cli(&["cancel", &task]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done = f.wait(&task);
    assert_eq!(done["state"], "cancelled", "{done}");
    wait_for(
        "the remote task to be cancelled",
        Duration::from_secs(30),
        || (agent.cancelled_tasks().len() == 2).then_some(()),
    )
    .unwrap();
    assert_eq!(agent.message_ids().len(), 2, "{:?}", agent.message_ids());
}

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
fn a_caller_killed_while_the_remote_task_works_resumes_and_polls_it_without_sending_twice() {
    let tmp_agent = tempfile::tempdir().unwrap();
    let agent = RemoteAgent::start(tmp_agent.path(), 8);
    let url = agent.card_url();
    let f = fleet(
        json!([call_agent("pricing", "price a slow thing"), {"reply_template": "caller got: {{last_tool_result}}"}]),
        json!([remote("pricing", &url, "REMOTE_TOKEN")]),
    );
    let task = f.submit("ask pricing");
    // The remote task is recorded in the run log (the activity after it says so) and works.
    wait_for(
        "the caller to wait for the remote task",
        Duration::from_secs(60),
        || {
            let q = f.hub.cli_json(&["query", &task, "-o", "json"]).ok()?;
            q["activity"]
                .as_str()?
                .contains("waiting for task")
                .then_some(())
        },
    )
    .unwrap();
    assert_eq!(agent.message_ids().len(), 1, "sent once before the kill");
    let q = f.hub.cli_json(&["query", &task, "-o", "json"]).unwrap();
    let digest = q["bundle_digest"].as_str().unwrap().to_owned();
    let pid = instance_pid(&f.nest, &digest).expect("the caller's instance runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();

    let done = f.wait(&task);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["attempt"], 2, "resumed once: {done}");
    assert_eq!(
        done["outcome"]["result"],
        "caller got: remote says: price a slow thing\n\nartifact answer.txt:\nartifact: price a slow thing"
    );
    let sent = agent.message_ids();
    assert_eq!(
        sent.len(),
        1,
        "the remote agent saw exactly one SendMessage: {sent:?}"
    );
    assert_eq!(sent[0], format!("{}:0", done["run_id"].as_str().unwrap()));
}

#[test]
fn a_caller_killed_before_it_learns_the_remote_task_id_finds_that_task_instead_of_sending_again() {
    let tmp_agent = tempfile::tempdir().unwrap();
    // The task exists at once, but SendMessage answers only 30 s later: the caller dies first.
    let agent = RemoteAgent::start_with(tmp_agent.path(), 2, 30);
    let url = agent.card_url();
    let f = fleet(
        json!([call_agent("pricing", "price a lost thing"), {"reply_template": "caller got: {{last_tool_result}}"}]),
        json!([remote("pricing", &url, "REMOTE_TOKEN")]),
    );
    let task = f.submit("ask pricing");
    wait_for("the SendMessage to arrive", Duration::from_secs(60), || {
        (!agent.message_ids().is_empty()).then_some(())
    })
    .unwrap();
    let q = f.hub.cli_json(&["query", &task, "-o", "json"]).unwrap();
    let digest = q["bundle_digest"].as_str().unwrap().to_owned();
    let pid = instance_pid(&f.nest, &digest).expect("the caller's instance runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();

    let done = f.wait(&task);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["attempt"], 2, "resumed once: {done}");
    assert_eq!(
        done["outcome"]["result"],
        "caller got: remote says: price a lost thing\n\nartifact answer.txt:\nartifact: price a lost thing"
    );
    let sent = agent.message_ids();
    assert_eq!(
        sent.len(),
        1,
        "the remote agent saw exactly one SendMessage: {sent:?}"
    );
    let events = f.events(&task);
    assert!(events.contains("remote_task.started"), "{events}");
}

#[test]
fn agen_run_calls_a_remote_agent_with_the_token_from_its_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let agent = RemoteAgent::start(&tmp.path().join("agent"), 0);
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [call_agent("pricing", "price 1 pear"), {"reply_template": "caller got: {{last_tool_result}}"}]}),
    )
    .unwrap();
    let dir = tmp.path().join("caller");
    caller_bundle(
        &dir,
        &model,
        json!([remote("pricing", &agent.card_url(), "REMOTE_TOKEN")]),
        json!({}),
    );
    let run = |token: Option<&str>| {
        let mut cmd = std::process::Command::new(agen_tests::agen_bin());
        cmd.args(["run", dir.to_str().unwrap(), "ask pricing"])
            .env("XDG_STATE_HOME", tmp.path().join("state"))
            .env("WRONG_TOKEN", "unused")
            .env_remove("REMOTE_TOKEN")
            .stdin(std::process::Stdio::null());
        if let Some(t) = token {
            cmd.env("REMOTE_TOKEN", t);
        }
        cmd.output().expect("agen run starts")
    };
    let out = run(Some(TOKEN));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.trim_end(),
        "caller got: remote says: price 1 pear\n\nartifact answer.txt:\nartifact: price 1 pear"
    );
    assert_eq!(agent.message_ids().len(), 1);

    let out = run(None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a missing token stops agen run");
    assert!(
        stderr.contains(
            "secret REMOTE_TOKEN used in x-agen/config.json delegates[0].token (delegate pricing) has no value: environment variable REMOTE_TOKEN is not set"
        ),
        "{stderr}"
    );
}
