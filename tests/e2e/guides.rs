//! The two user guides, word for word (issue 43): each test is named after the sentence of the
//! Agen tools guide or the Keen tooling guide it checks, quoted in its doc comment, and runs it
//! through the public surface (the CLI against a real Hub and Nest, the scripted fake model).

use std::time::Duration;

use agen_tests::{mcp_json, processes_under, wait_for, write_bundle, FakeModel, HubProcess, Peers};
use serde_json::{json, Value};

/// An agent.md on the fake model.
fn agent(name: &str, model: &FakeModel) -> String {
    format!(
        "---\nname: {name}\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou are {name}.\n",
        model.base_url()
    )
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

fn submit(hub: &HubProcess, deployment: &str) -> String {
    let out = hub.cli(&["submit", deployment, "go"]).unwrap();
    assert!(out.status.success(), "submit: {}", text(&out.stderr));
    text(&out.stdout).trim().to_string()
}

fn of<'a>(list: &'a [Value], deployment: &str) -> Vec<&'a Value> {
    list.iter()
        .filter(|i| i["deployment"] == deployment)
        .collect()
}

/// The broken server's words on stderr before it exits, never answering `initialize`.
const BROKEN: &str =
    "import sys; sys.stderr.write('ModuleNotFoundError: no module named crm_marker\\n'); sys.exit(3)";

/// "agen ps --all (and GetDeployment / ListInstances) shows how many tools each instance loaded
/// and any tool server that is not connected. If an agent “has no tools”, check that first" and
/// "If a server dies, the instance reports itself unhealthy and is replaced."
///
/// A server that never completes `initialize` leaves the instance running (healthy, the other
/// server's tools loaded) with that server and its cause in `servers_not_connected`; `deploy
/// --wait` succeeds and prints it, or fails with exit 1 under `--require-all-servers`; a task
/// runs; a connected server that dies makes the instance unhealthy and replaced, and the
/// replacement shows the server that is not connected too. A task that cannot run says why it
/// is queued.
#[test]
fn agen_ps_all_shows_how_many_tools_each_instance_loaded_and_any_tool_server_that_is_not_connected()
{
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [{"reply": "done"}]}),
    )
    .unwrap();
    let bundle = tmp.path().join("bundle");
    write_bundle(
        &bundle,
        &[
            (
                "mcp.json",
                mcp_json(&[
                    ("time", json!({"command": Peers::mcp_server_time()})),
                    (
                        "broken",
                        json!({"command": Peers::python(), "args": ["-c", BROKEN]}),
                    ),
                ]),
            ),
            ("x-agen/agent.md", agent("half", &model)),
        ],
    )
    .unwrap();
    let out = hub
        .cli(&[
            "deploy",
            bundle.to_str().unwrap(),
            "--name",
            "half",
            "--wait",
        ])
        .unwrap();
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "deploy --wait: {stderr}");
    assert!(
        stderr.contains("tool server broken is not connected: ") && stderr.contains("crm_marker"),
        "deploy --wait prints the server and its cause: {stderr}"
    );

    let list = hub.instances().unwrap();
    let half = of(&list, "half");
    assert_eq!(half.len(), 1, "{list:?}");
    let i = half[0];
    assert_eq!(i["state"], "running", "{i}");
    assert_eq!(i["healthy"], true, "{i}");
    assert_eq!(i["servers_not_connected"], json!(["broken"]), "{i}");
    assert!(
        i["server_errors"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("crm_marker"),
        "{i}"
    );
    assert!(
        i["tools_loaded"].as_u64().unwrap() >= 2,
        "time's tools: {i}"
    );
    let table = text(&hub.cli(&["ps", "--all"]).unwrap().stdout);
    assert!(
        table.contains("broken: ") && table.contains("crm_marker"),
        "{table}"
    );

    // The instance takes tasks with the tools it has.
    let task = submit(&hub, "half");
    let done = hub
        .cli_json(&["wait", &task, "-o", "json", "--timeout", "60s"])
        .unwrap();
    assert_eq!(done["state"], "succeeded", "{done}");

    // --require-all-servers: the same deployment fails the command, exit 1, naming the server.
    let out = hub
        .cli(&[
            "deploy",
            bundle.to_str().unwrap(),
            "--name",
            "half",
            "--require-all-servers",
        ])
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("tool server broken is not connected")
            && stderr.contains("--require-all-servers"),
        "{stderr}"
    );

    // A connected server that dies: unhealthy, replaced; the replacement shows `broken` too.
    let old = i["instance"].as_str().unwrap().to_owned();
    let time_server = processes_under(&nest.dir)
        .into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains("mcp-server-time"))
                .unwrap_or(false)
        })
        .expect("the time server runs under the nest");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(time_server as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let after = hub
        .wait_instances("a healthy replacement", Duration::from_secs(60), |l| {
            of(l, "half").iter().any(|i| {
                i["instance"] != old.as_str()
                    && i["healthy"] == true
                    && i["servers_not_connected"] == json!(["broken"])
            })
        })
        .unwrap();
    let table = text(&hub.cli(&["ps", "--all"]).unwrap().stdout);
    let new = of(&after, "half")
        .into_iter()
        .find(|i| i["instance"] != old.as_str())
        .unwrap()["instance"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        table
            .lines()
            .any(|l| l.contains(&new) && l.contains("broken: ") && l.contains("crm_marker")),
        "NOT CONNECTED on the replacement: {table}"
    );

    // A task nothing can run says why it is queued.
    let nowhere = tmp.path().join("nowhere");
    write_bundle(&nowhere, &[("x-agen/agent.md", agent("nowhere", &model))]).unwrap();
    let out = hub
        .cli(&[
            "deploy",
            nowhere.to_str().unwrap(),
            "--name",
            "nowhere",
            "--selector",
            "zone=none",
        ])
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let task = submit(&hub, "nowhere");
    let last = std::cell::RefCell::new(Value::Null);
    let q = wait_for("a queued task's reason", Duration::from_secs(20), || {
        let q = hub.cli_json(&["query", &task, "-o", "json"]).ok()?;
        *last.borrow_mut() = q.clone();
        q["activity"]
            .as_str()?
            .contains("queued: no instance of deployment nowhere is ready (instance nowhere-")
            .then_some(q)
    })
    .unwrap_or_else(|e| panic!("{e}: {}", last.borrow()));
    assert_eq!(q["state"], "queued", "{q}");
}

/// "${NAME} in env values and headers is replaced with the secret NAME, which must be declared
/// in x-agen/secrets.json."
///
/// Anywhere else it is not replaced: `${NAME}` in `args` is refused at deploy, naming the
/// argument and suggesting `env` (substituting would put the secret on a command line every
/// user of the host can read); a url server whose headers hold a secret is refused over plain
/// http to another host (as an A2A card is). Refused before anything is uploaded: exit 2.
#[test]
fn name_in_env_values_and_headers_is_replaced_with_the_secret_name() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("client.toml");
    let secrets = json!({"CRM_TOKEN": {"source": "platform"}}).to_string();
    let cases = [
        (
            json!({"command": "crm-server", "args": ["--verbose", "--token=${CRM_TOKEN}"]}),
            vec![
                "mcp.json: mcpServers.crm.args[1]: holds `${CRM_TOKEN}`",
                r#""env": {"CRM_TOKEN": "${CRM_TOKEN}"}"#,
            ],
        ),
        (
            json!({"url": "http://crm.example/mcp", "headers": {"Authorization": "Bearer ${CRM_TOKEN}"}}),
            vec![
                "mcp.json: mcpServers.crm.url:",
                "would send the secret in header Authorization in the clear",
                "use an https:// URL",
            ],
        ),
    ];
    for (i, (server, expected)) in cases.iter().enumerate() {
        let dir = tmp.path().join(format!("b{i}"));
        write_bundle(
            &dir,
            &[
                ("mcp.json", mcp_json(&[("crm", server.clone())])),
                ("x-agen/secrets.json", secrets.clone()),
                (
                    "x-agen/agent.md",
                    "---\nmodel: openai/gpt-4.1-mini\n---\nCRM.\n".into(),
                ),
            ],
        )
        .unwrap();
        let out = agen_tests::cli(
            &config,
            &[
                "deploy",
                dir.to_str().unwrap(),
                "--hub",
                "http://127.0.0.1:1",
            ],
        )
        .unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        for e in expected {
            assert!(stderr.contains(e), "{e:?} missing from: {stderr}");
        }
    }
    // The same header over https, and over http to this machine, deploy past validation (to
    // the unreachable Hub: exit 6, not 2).
    for url in ["https://crm.example/mcp", "http://127.0.0.1:9/mcp"] {
        let dir = tmp.path().join("fine");
        write_bundle(
            &dir,
            &[
                (
                    "mcp.json",
                    mcp_json(&[(
                        "crm",
                        json!({"url": url, "headers": {"Authorization": "Bearer ${CRM_TOKEN}"}}),
                    )]),
                ),
                ("x-agen/secrets.json", secrets.clone()),
                (
                    "x-agen/agent.md",
                    "---\nmodel: openai/gpt-4.1-mini\n---\nCRM.\n".into(),
                ),
            ],
        )
        .unwrap();
        let out = agen_tests::cli(
            &config,
            &[
                "deploy",
                dir.to_str().unwrap(),
                "--hub",
                "http://127.0.0.1:1",
            ],
        )
        .unwrap();
        assert_eq!(out.status.code(), Some(6), "{}", text(&out.stderr));
    }
}

/// A Hub, one Nest and a deployment `name` of `files` (plus an agent.md on `model`), ready.
fn fleet_with(
    tmp: &std::path::Path,
    name: &str,
    model: &FakeModel,
    files: &[(&str, String)],
) -> (HubProcess, agen_tests::NestProcess) {
    let hub = HubProcess::start(tmp).unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    deploy_ready(&hub, tmp, name, model, files);
    (hub, nest)
}

/// Deploys `name` (`files` plus an agent.md on `model`) and waits until it is ready.
fn deploy_ready(
    hub: &HubProcess,
    tmp: &std::path::Path,
    name: &str,
    model: &FakeModel,
    files: &[(&str, String)],
) {
    let dir = tmp.join(format!("bundle-{name}"));
    let mut all: Vec<(&str, String)> = files.to_vec();
    if !files.iter().any(|(p, _)| *p == "x-agen/agent.md") {
        all.push(("x-agen/agent.md", agent(name, model)));
    }
    write_bundle(&dir, &all).unwrap();
    let out = hub
        .cli(&["deploy", dir.to_str().unwrap(), "--name", name, "--wait"])
        .unwrap();
    assert!(out.status.success(), "deploy {name}: {}", text(&out.stderr));
}

/// `agen trace TASK --events -o json`: one JSON object per event.
fn events(hub: &HubProcess, task: &str) -> Vec<Value> {
    let out = hub.cli(&["trace", task, "--events", "-o", "json"]).unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not JSON: {l}")))
        .collect()
}

/// "Only the latest call is kept on the task; each call is also a rate-limited task.progress
/// event (at most one every 10 seconds), so the event log has the history even though the task
/// does not."
///
/// Three reports within a second and the run's end: one `task.progress` (the first), the later
/// two as `progress.latest` (the task shows the latest), and no second `task.progress` at the
/// end. `agen trace --events -o json` prints one JSON object per event.
#[test]
fn each_call_is_also_a_rate_limited_task_progress_event_at_most_one_every_10_seconds() {
    let tmp = tempfile::tempdir().unwrap();
    let step = |n: u32| json!({"tool_calls": [{"name": "report_progress", "arguments": {"step": format!("page {n}"), "done": n, "total": 3}}]});
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [step(1), step(2), step(3), {"reply": "read 3 pages"}]}),
    )
    .unwrap();
    let (hub, _nest) = fleet_with(tmp.path(), "reader", &model, &[]);
    let task = submit(&hub, "reader");
    let done = hub
        .cli_json(&["wait", &task, "-o", "json", "--timeout", "60s"])
        .unwrap();
    assert_eq!(done["state"], "succeeded", "{done}");
    let all = events(&hub, &task);
    let of_kind = |k: &str| -> Vec<Value> {
        all.iter()
            .filter(|e| e["kind"] == k)
            .map(|e| e["body"]["step"].clone())
            .collect()
    };
    assert_eq!(of_kind("task.progress"), vec![json!("page 1")], "{all:?}");
    assert_eq!(
        of_kind("progress.latest"),
        vec![json!("page 2"), json!("page 3")],
        "{all:?}"
    );
    assert!(all
        .iter()
        .all(|e| e["seq"].is_u64() && e["kind"].is_string()));
    let q = hub.cli_json(&["query", &task, "-o", "json"]).unwrap();
    assert_eq!(q["progress"]["step"], "page 3", "{q}");
}

/// A Hub, a Nest, deployment `helper` (its one tool server `meta_server.py` records each
/// call's `_meta` in `log`, its model calls `meta_echo` then answers) and `caller` (its model
/// calls `call_agent` on `helper`, then answers with the result).
struct Delegation {
    hub: HubProcess,
    _nest: agen_tests::NestProcess,
    _models: Vec<FakeModel>,
    log: std::path::PathBuf,
}

fn delegation(tmp: &std::path::Path, caller_harness: Value) -> Delegation {
    let hub = HubProcess::start(tmp).unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    let log = tmp.join("meta.jsonl");
    let helper_model = FakeModel::start(
        &tmp.join("model-helper"),
        &json!({"steps": [
            {"tool_calls": [{"name": "meta_echo", "arguments": {"text": "from the child"}}]},
            {"reply_template": "helper saw: {{last_tool_result}}"}
        ]}),
    )
    .unwrap();
    deploy_ready(
        &hub,
        tmp,
        "helper",
        &helper_model,
        &[(
            "mcp.json",
            mcp_json(&[(
                "meta",
                json!({"command": Peers::python(), "args": [Peers::script("servers/meta_server.py")], "env": {"META_LOG": log}}),
            )]),
        )],
    );
    let caller_model = FakeModel::start(
        &tmp.join("model-caller"),
        &json!({"steps": [
            {"tool_calls": [{"name": "call_agent", "arguments": {"agent": "helper", "input": "go"}}]},
            {"reply_template": "caller got: {{last_tool_result}}"}
        ]}),
    )
    .unwrap();
    deploy_ready(
        &hub,
        tmp,
        "caller",
        &caller_model,
        &[
            (
                "x-agen/config.json",
                json!({"delegates": [{"deployment": "helper", "description": "echoes"}]})
                    .to_string(),
            ),
            ("x-agen/harness.json", caller_harness.to_string()),
        ],
    );
    Delegation {
        hub,
        _nest: nest,
        _models: vec![helper_model, caller_model],
        log,
    }
}

impl Delegation {
    /// Submits to `caller` with `args`, waits for it; returns (parent task, child task).
    fn run(&self, args: &[&str]) -> (Value, Value) {
        let mut all = vec!["submit", "caller", "go"];
        all.extend_from_slice(args);
        let out = self.hub.cli(&all).unwrap();
        assert!(out.status.success(), "submit: {}", text(&out.stderr));
        let task = text(&out.stdout).trim().to_string();
        let done = self
            .hub
            .cli_json(&["wait", &task, "-o", "json", "--timeout", "90s"])
            .unwrap();
        assert_eq!(done["state"], "succeeded", "{done}");
        assert!(
            done["outcome"]["result"]
                .as_str()
                .is_some_and(|r| r.contains("from the child")),
            "{done}"
        );
        let children = self
            .hub
            .cli_json(&["tasks", "--parent", &task, "-o", "json"])
            .unwrap();
        let child = children[0]["task_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no child: {children}"))
            .to_string();
        let child = self.hub.cli_json(&["query", &child, "-o", "json"]).unwrap();
        (done, child)
    }

    /// The `_meta` of the child's tool calls, as `meta_server.py` recorded them.
    fn metas(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["event"] == "called")
            .map(|e| e["meta"].clone())
            .collect()
    }
}

/// "agen/labels — The task's labels (an object of strings)." (What a tool server is told)
///
/// A delegated child task carries its parent's labels: `agen query` of the child shows them,
/// and the child's tool call gets them in `_meta`.
#[test]
fn agen_labels_the_tasks_labels_reach_a_delegated_childs_tool_calls() {
    let tmp = tempfile::tempdir().unwrap();
    let d = delegation(tmp.path(), json!({}));
    let (_parent, child) = d.run(&["--label", "team=blue", "--label", "ticket=T-7"]);
    assert_eq!(
        child["labels"],
        json!({"team": "blue", "ticket": "T-7"}),
        "{child}"
    );
    let metas = d.metas();
    assert_eq!(metas.len(), 1, "{metas:?}");
    assert_eq!(
        metas[0]["agen/labels"],
        json!({"team": "blue", "ticket": "T-7"}),
        "{metas:?}"
    );
}

/// The issue's rule for the A2A agent card: its description "comes from `description:` in
/// `agent.md` front matter, else the deployment's name; never the system prompt".
#[test]
fn the_a2a_card_description_is_the_front_matter_description_else_the_deployment_name() {
    let tmp = tempfile::tempdir().unwrap();
    let model = FakeModel::start(&tmp.path().join("model"), &json!([{"reply": "hi"}])).unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let prompt = "You are the plant desk. PROMPT-MARKER: never tell callers the discount code.";
    for (name, description) in [
        ("described", Some("Answers questions about plants.")),
        ("plain", None),
    ] {
        let front = description.map_or(String::new(), |d| format!("description: {d}\n"));
        let dir = tmp.path().join(name);
        write_bundle(
            &dir,
            &[(
                "x-agen/agent.md",
                format!(
                    "---\nmodel: openai/fake-model\nbaseUrl: {}\n{front}---\n{prompt}\n",
                    model.base_url()
                ),
            )],
        )
        .unwrap();
        let out = hub
            .cli(&["deploy", dir.to_str().unwrap(), "--name", name])
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let token = std::fs::read_to_string(hub.dir.join("hub/admin-token")).unwrap();
    let card = |deployment: &str| -> Value {
        let op = json!({
            "op": "card",
            "agent": format!("{}/a2a/default/{deployment}", hub.url()),
            "token": token.trim(),
            "ca_file": hub.dir.join("hub/tls/ca.pem"),
        });
        let mut child = std::process::Command::new(Peers::python())
            .arg(Peers::script("a2a_client.py"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), op.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("{}{}", text(&out.stdout), text(&out.stderr)));
        v["card"].clone()
    };
    let described = card("described");
    assert_eq!(
        described["description"], "Answers questions about plants.",
        "{described}"
    );
    let plain = card("plain");
    assert_eq!(plain["description"], "plain", "{plain}");
    for c in [&described, &plain] {
        assert!(
            !c.to_string().contains("PROMPT-MARKER"),
            "the prompt leaked: {c}"
        );
    }
}

/// "Pin the versions of servers fetched at start (mcp-server-fetch==2026.8.18, npx -y
/// pkg@1.2.3) so a new release cannot change what your agent runs."
///
/// `agen deploy` warns for each unpinned `npx`/`uvx` server (a warning: the bundle still
/// deploys) and says nothing for pinned ones.
#[test]
fn pin_the_versions_of_servers_fetched_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("b");
    write_bundle(
        &dir,
        &[
            (
                "mcp.json",
                mcp_json(&[
                    ("fetch", json!({"command": "uvx", "args": ["mcp-server-fetch"]})),
                    ("files", json!({"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "./data"]})),
                    ("pinned", json!({"command": "uvx", "args": ["mcp-server-fetch==2026.8.18"]})),
                    ("pinned-npx", json!({"command": "npx", "args": ["-y", "pkg@1.2.3"]})),
                ]),
            ),
            ("x-agen/agent.md", "---\nmodel: openai/gpt-4.1-mini\n---\nFetch.\n".into()),
        ],
    )
    .unwrap();
    let out = agen_tests::cli(
        &tmp.path().join("client.toml"),
        &[
            "deploy",
            dir.to_str().unwrap(),
            "--hub",
            "http://127.0.0.1:1",
        ],
    )
    .unwrap();
    let stderr = text(&out.stderr);
    // Past validation (the warning does not refuse): the unreachable Hub's exit code.
    assert_eq!(out.status.code(), Some(6), "{stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("warning: "))
        .collect();
    assert_eq!(warnings.len(), 2, "{stderr}");
    assert!(
        warnings[0].contains("mcpServers.fetch: `uvx mcp-server-fetch`")
            && warnings[0].contains("pin a version (e.g. `mcp-server-fetch==1.2.3`)"),
        "{stderr}"
    );
    assert!(
        warnings[1].contains("mcpServers.files: `npx @modelcontextprotocol/server-filesystem`"),
        "{stderr}"
    );
}

/// `agen trace TASK -o json`.
fn trace(hub: &HubProcess, task: &str) -> Value {
    hub.cli_json(&["trace", task, "-o", "json"]).unwrap()
}

fn span<'a>(t: &'a Value, name: &str) -> Vec<&'a Value> {
    t["spans"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == name)
        .collect()
}

/// "Each tool call is a span in the run's trace (agen trace <task-id>) with its duration and
/// status."
///
/// Every call, built-ins included: `load_skill`, `report_progress`, `read_artifact`, `finish`,
/// a call of a tool that does not exist and a call the permissions deny each have a span (the
/// last two with status `error` and their reason), with their arguments under
/// `traceToolArguments: true`.
#[test]
fn each_tool_call_is_a_span_in_the_runs_trace_with_its_duration_and_status() {
    let tmp = tempfile::tempdir().unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [
            {"tool_calls": [
                {"name": "load_skill", "arguments": {"name": "greet"}},
                {"name": "report_progress", "arguments": {"step": "greeting"}},
                {"name": "read_artifact", "arguments": {"id": "sha256:0000000000000000000000000000000000000000000000000000000000000000"}},
                {"name": "nosuch_tool", "arguments": {}},
                {"name": "ws_write", "arguments": {"path": "x.txt", "content": "no"}}
            ]},
            {"tool_calls": [{"name": "finish", "arguments": {"result": "greeted"}}]}
        ]}),
    )
    .unwrap();
    let (hub, _nest) = fleet_with(
        tmp.path(),
        "spans",
        &model,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "ws",
                    json!({"command": "agen", "args": ["mcp", "workspace", "--root", ".", "--no-run"]}),
                )]),
            ),
            (
                "skills/greet/SKILL.md",
                "---\nname: greet\ndescription: how to greet\n---\nSay hello.\n".into(),
            ),
            (
                "x-agen/config.json",
                json!({"permissions": {"deny": ["ws.write"]}}).to_string(),
            ),
            (
                "x-agen/harness.json",
                json!({"traceToolArguments": true}).to_string(),
            ),
        ],
    );
    let task = submit(&hub, "spans");
    let done = hub
        .cli_json(&["wait", &task, "-o", "json", "--timeout", "60s"])
        .unwrap();
    assert_eq!(done["outcome"]["result"], "greeted", "{done}");
    let t = trace(&hub, &task);
    let one = |name: &str| -> Value {
        let found = span(&t, name);
        assert_eq!(found.len(), 1, "{name} in {t}");
        found[0].clone()
    };
    let skill = one("tool load_skill");
    assert_eq!(skill["status"], "ok", "{skill}");
    assert_eq!(
        skill["attributes"]["arguments"], r#"{"name":"greet"}"#,
        "{skill}"
    );
    assert_eq!(one("tool report_progress")["status"], "ok");
    assert_eq!(
        one("tool read_artifact")["status"],
        "error",
        "no such artifact"
    );
    assert_eq!(one("tool finish")["status"], "ok");
    let unknown = one("tool nosuch_tool");
    assert_eq!(unknown["status"], "error", "{unknown}");
    assert_eq!(unknown["attributes"]["reason"], "unknown_tool", "{unknown}");
    let denied = one("tool ws.write");
    assert_eq!(denied["status"], "error", "{denied}");
    assert_eq!(denied["attributes"]["reason"], "denied", "{denied}");
    let root = t["spans"][0]["span_id"].clone();
    for s in t["spans"].as_array().unwrap().iter().skip(1) {
        assert_eq!(s["parent_span_id"], root, "{s}");
        assert_ne!(s["status"], "unfinished", "{s}");
    }
}

/// "Each tool call is a span in the run's trace (agen trace <task-id>) with its duration and
/// status." — for a call that waits for approval and is denied.
///
/// The approval is one span (`approval ws.run`, status `denied`, with who and why) across the
/// run giving its slot back and resuming: no second approval span, nothing `unfinished`, and
/// the call that never went out is not a span of its own.
#[test]
fn a_denied_approval_is_one_span_with_the_denial() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("ran.txt");
    let model = crate::approvals::model(tmp.path(), &marker);
    crate::approvals::deploy_asker(&hub, &tmp.path().join("asker"), "asker", &model);
    let task = crate::approvals::submit(&hub, "asker");
    let pending = crate::approvals::pending_of(&hub, &task);
    let call_id = pending["call_id"].as_str().unwrap().to_string();
    // Past SUSPEND_AFTER the run gives its slot back; the decision resumes it.
    wait_for(
        "the run to give its slot back",
        Duration::from_secs(30),
        || {
            let q = hub.cli_json(&["query", &task, "-o", "json"]).ok()?;
            (q["instance"].is_null() || q["instance"] == "").then_some(())
        },
    )
    .unwrap();
    let out = crate::approvals::decide(&hub, &["deny", &task, &call_id, "--reason", "not today"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let done = crate::approvals::wait_task(&hub, &task);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(crate::approvals::executions(&marker), 0);
    let t = trace(&hub, &task);
    let approvals = span(&t, "approval ws.run");
    assert_eq!(approvals.len(), 1, "{t}");
    assert_eq!(approvals[0]["status"], "denied", "{t}");
    assert_eq!(approvals[0]["attributes"]["approved"], "false", "{t}");
    assert_eq!(approvals[0]["attributes"]["reason"], "not today", "{t}");
    assert!(span(&t, "tool ws.run").is_empty(), "{t}");
    for s in t["spans"].as_array().unwrap() {
        assert_ne!(s["status"], "unfinished", "{s}");
    }
}

fn keen_call(action: &str, tool: &str, context: &str) -> String {
    format!("I'll use the tool.\n\n<SYSTEM CALL>\n!*action\n{action}\n!*tool\n{tool}\n!*context\n{context}\n</SYSTEM CALL>\n")
}

/// "Arguments are not recorded by default because they may hold personal data; set
/// "traceToolArguments": true in x-agen/harness.json to record them (secrets redacted, up to 4
/// KiB each)." — for Keen script and flow tools, whose argument is the call's `!*context`.
#[test]
fn trace_tool_arguments_records_keen_script_and_flow_arguments() {
    let tmp = tempfile::tempdir().unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [
            {"reply": keen_call("use tool", "Stamp", "zone=UTC")},
            {"reply": keen_call("use tool flow", "FlowStamp", "zone=CET")},
            {"reply": "done"}
        ]}),
    )
    .unwrap();
    let (hub, _nest) = fleet_with(
        tmp.path(),
        "keen",
        &model,
        &[
            (
                "x-agen/harness.json",
                json!({"toolProtocol": "keen", "traceToolArguments": true}).to_string(),
            ),
            (
                "keen-tools.json",
                json!([
                    {"name": "Stamp", "type": "script", "entry": "tools/stamp.js"},
                    {"name": "FlowStamp", "type": "flow", "entry": "Next-ToolCall"}
                ])
                .to_string(),
            ),
            (
                "tools/stamp.js",
                "exports.exec = function (props, dictionary) { dictionary.result = 'stamped'; };\n"
                    .into(),
            ),
            (
                "flows/Next.json",
                json!({"nodes": {
                    "ToolCall": {"type": "start", "next": "stamp"},
                    "stamp": {"type": "script", "entry": "tools/stamp.js", "next": "done"},
                    "done": {"type": "end"}
                }})
                .to_string(),
            ),
        ],
    );
    let task = submit(&hub, "keen");
    let done = hub
        .cli_json(&["wait", &task, "-o", "json", "--timeout", "60s"])
        .unwrap();
    assert_eq!(done["state"], "succeeded", "{done}");
    let t = trace(&hub, &task);
    for (name, context) in [("tool Stamp", "zone=UTC"), ("tool FlowStamp", "zone=CET")] {
        let s = span(&t, name);
        assert_eq!(s.len(), 1, "{name}: {t}");
        let args: Value =
            serde_json::from_str(s[0]["attributes"]["arguments"].as_str().unwrap_or("null"))
                .unwrap();
        assert_eq!(args, json!({"context": context}), "{t}");
    }
}

/// "traceparent — The W3C trace context of the tool call's span." (What a tool server is told)
/// — for a delegated child: one task tree is one trace.
///
/// The child's tool call carries the parent's trace id, and its span id is a span of the
/// parent's `agen trace` (the one OTLP exports, built the same way), whose chain of parents
/// runs from the child's tool span through the child's run span to the parent's `call_agent`
/// span.
#[test]
fn a_delegated_childs_traceparent_is_in_its_parents_trace() {
    let tmp = tempfile::tempdir().unwrap();
    let d = delegation(tmp.path(), json!({}));
    let (parent, child) = d.run(&[]);
    let t = trace(&d.hub, parent["task_id"].as_str().unwrap());
    let metas = d.metas();
    assert_eq!(metas.len(), 1, "{metas:?}");
    let tp = metas[0]["traceparent"].as_str().unwrap().to_string();
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!(parts.len(), 4, "{tp}");
    assert_eq!(parts[1], t["trace_id"].as_str().unwrap(), "{tp} vs {t}");
    let by_id = |id: &str| -> Value {
        t["spans"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["span_id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("span {id} not in {t}"))
    };
    let tool = by_id(parts[2]);
    assert_eq!(tool["name"], "tool meta.echo", "{tool}");
    let child_root = by_id(tool["parent_span_id"].as_str().unwrap());
    assert_eq!(
        child_root["attributes"]["task_id"], child["task_id"],
        "{child_root}"
    );
    let call = by_id(child_root["parent_span_id"].as_str().unwrap());
    assert_eq!(call["name"], "tool call_agent", "{call}");
    assert_eq!(call["parent_span_id"], t["spans"][0]["span_id"], "{call}");
    // The child's own trace is the same trace.
    let ct = trace(&d.hub, child["task_id"].as_str().unwrap());
    assert_eq!(ct["trace_id"], t["trace_id"], "{ct}");
    assert_eq!(ct["spans"][0]["parent_span_id"], call["span_id"], "{ct}");
}

/// Keen guide: "A path that fails validation does not throw — the engine routes a general "no
/// tool response" failure back to the agent", and among the failures answered that way: "a flow
/// tool's entry is missing".
///
/// A bundle whose script path breaks the rule and whose flow is missing deploys (each is a
/// warning naming the entry), and a call to either gives the agent the general recall.
#[test]
fn a_path_that_fails_validation_does_not_throw_the_agent_gets_no_tool_response() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [
            {"reply": keen_call("use tool", "Outside", "")},
            {"reply": keen_call("use tool flow", "Gone", "")},
            {"reply_template": "last: {{last_user}}"}
        ]}),
    )
    .unwrap();
    let dir = tmp.path().join("keen");
    write_bundle(
        &dir,
        &[
            ("x-agen/agent.md", agent("keen", &model)),
            (
                "x-agen/harness.json",
                json!({"toolProtocol": "keen"}).to_string(),
            ),
            (
                "keen-tools.json",
                json!([
                    {"name": "Outside", "type": "script", "entry": "scripts/outside.js"},
                    {"name": "Gone", "type": "flow", "entry": "Gone-Start"}
                ])
                .to_string(),
            ),
            (
                "scripts/outside.js",
                "exports.exec = function (p, d) { d.result = 'should never run'; };\n".into(),
            ),
        ],
    )
    .unwrap();
    let out = hub
        .cli(&["deploy", dir.to_str().unwrap(), "--name", "keen", "--wait"])
        .unwrap();
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: keen-tools.json: [0].entry: script entry `scripts/outside.js` must start with `tools/`")
            && stderr.contains("warning: keen-tools.json: [1].entry: flow file flows/Gone.json does not exist")
            && stderr.contains("no tool response"),
        "{stderr}"
    );
    let task = submit(&hub, "keen");
    let done = hub
        .cli_json(&["wait", &task, "-o", "json", "--timeout", "60s"])
        .unwrap();
    assert_eq!(done["state"], "succeeded", "{done}");
    let requests_saw_recall = done["outcome"]["result"]
        .as_str()
        .unwrap_or_default()
        .contains("No tool response.");
    assert!(requests_saw_recall, "{done}");
    let result = done["outcome"]["result"].as_str().unwrap();
    assert!(!result.contains("should never run"), "{done}");
}

/// Workspace: "run stops a command after 2 minutes (--run-timeout); a call may ask for up to 15
/// minutes." with "Every call has the run's limits.toolTimeout (10 minutes by default)".
///
/// A `run` call that asks for longer than `limits.toolTimeout` gets the time it asked for (up
/// to the maximum the tool's schema documents): here toolTimeout is 2 s and the call asks for
/// 8 s to run a 3-second command, which completes.
#[test]
fn a_call_may_ask_for_up_to_15_minutes() {
    let tmp = tempfile::tempdir().unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [
            {"tool_calls": [{"name": "ws_run", "arguments": {"command": "sleep 3; echo slept", "timeout": 8}}]},
            {"reply_template": "{{last_tool_result}}"}
        ]}),
    )
    .unwrap();
    let (hub, _nest) = fleet_with(
        tmp.path(),
        "slow",
        &model,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "ws",
                    json!({"command": "agen", "args": ["mcp", "workspace", "--root", "."]}),
                )]),
            ),
            (
                "x-agen/harness.json",
                json!({"limits": {"toolTimeout": "2s"}}).to_string(),
            ),
        ],
    );
    let task = submit(&hub, "slow");
    let done = hub
        .cli_json(&["wait", &task, "-o", "json", "--timeout", "60s"])
        .unwrap();
    assert_eq!(done["state"], "succeeded", "{done}");
    let result = done["outcome"]["result"].as_str().unwrap_or_default();
    assert!(result.contains("slept"), "{done}");
}

/// `agen run` honours `RUST_LOG` (the issue: "RUST_LOG is ignored (no logging is set up)"):
/// with it, the harness logs to stderr (the tool server connecting, the run and its log
/// folder); without it, stderr carries none of that.
#[test]
fn agen_run_logs_to_stderr_under_rust_log() {
    let tmp = tempfile::tempdir().unwrap();
    let model = FakeModel::start(&tmp.path().join("model"), &json!([{"reply": "hi"}])).unwrap();
    let dir = tmp.path().join("b");
    write_bundle(
        &dir,
        &[
            (
                "mcp.json",
                mcp_json(&[("ws", json!({"command": "agen", "args": ["mcp", "workspace", "--root", ".", "--no-run"]}))]),
            ),
            ("x-agen/agent.md", agent("b", &model)),
        ],
    )
    .unwrap();
    let run = |rust_log: Option<&str>| {
        let mut cmd = std::process::Command::new(agen_tests::agen_bin());
        cmd.arg("run")
            .arg(&dir)
            .arg("hello")
            .env("XDG_STATE_HOME", tmp.path().join("state"))
            .env_remove("RUST_LOG");
        if let Some(v) = rust_log {
            cmd.env("RUST_LOG", v);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), "hi");
        text(&out.stderr)
    };
    let logged = run(Some("info"));
    assert!(
        logged.contains("tool server connected") && logged.contains("standalone run"),
        "{logged}"
    );
    let quiet = run(None);
    assert!(!quiet.contains("tool server connected"), "{quiet}");
}
