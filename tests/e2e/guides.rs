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
