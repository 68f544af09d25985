//! The fleet (issue 2): a Hub and Nests as real processes on loopback, deployments of bundles
//! whose tool servers are real third-party MCP servers, and what `agen ps` shows when things
//! die: Nests, tool servers, the Hub itself.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use agen_tests::{mcp_json, processes_under, wait_for, write_bundle, HubProcess, Peers};
use serde_json::{json, Value};

/// A bundle with two third-party servers (PyPI `mcp-server-time`, npm server-filesystem) and
/// one of ours (`agen mcp workspace`).
fn three_server_bundle(dir: &Path) {
    write_bundle(
        dir,
        &[
            (
                "mcp.json",
                mcp_json(&[
                    ("time", json!({"command": Peers::mcp_server_time(), "args": ["--local-timezone", "UTC"]})),
                    ("files", json!({"command": "node", "args": [Peers::node_server("server-filesystem"), "./data"]})),
                    ("workspace", json!({"command": "agen", "args": ["mcp", "workspace", "--root", "./data", "--no-run"]})),
                ]),
            ),
            ("data/readme.txt", "hello from the bundle\n".into()),
            ("x-agen/agent.md", "---\nname: fleet-test\nmodel: openai/gpt-4.1-mini\n---\nYou are a test agent.\n".into()),
        ],
    )
    .expect("write bundle");
}

fn ids(list: &[Value]) -> BTreeSet<String> {
    list.iter()
        .filter_map(|i| i["instance"].as_str().map(str::to_owned))
        .collect()
}

fn healthy_running(list: &[Value], deployment: &str) -> Vec<Value> {
    list.iter()
        .filter(|i| {
            i["deployment"] == deployment && i["state"] == "running" && i["healthy"] == true
        })
        .cloned()
        .collect()
}

/// Deploys and waits until `replicas` instances of `name` run healthy; returns `agen ps --all`.
fn deploy_healthy(hub: &HubProcess, dir: &Path, name: &str, replicas: usize) -> Vec<Value> {
    deploy(hub, dir, name, replicas as u32);
    hub.wait_instances(
        &format!("{replicas} healthy replicas of {name}"),
        Duration::from_secs(90),
        |l| healthy_running(l, name).len() == replicas,
    )
    .unwrap()
}

fn deploy(hub: &HubProcess, dir: &Path, name: &str, replicas: u32) {
    let out = hub
        .cli(&[
            "deploy",
            dir.to_str().expect("utf-8 path"),
            "--name",
            name,
            "--replicas",
            &replicas.to_string(),
        ])
        .expect("run agen deploy");
    assert!(
        out.status.success(),
        "agen deploy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn two_nests_run_two_healthy_replicas_with_real_tool_servers() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _a = hub.nest("nest-a", &["zone=a"], &[]).unwrap();
    let _b = hub.nest("nest-b", &["zone=b"], &[]).unwrap();
    let bundle = tmp.path().join("bundle");
    three_server_bundle(&bundle);
    deploy(&hub, &bundle, "fleet", 2);

    let list = hub
        .wait_instances("2 healthy replicas", Duration::from_secs(90), |l| {
            healthy_running(l, "fleet").len() == 2
        })
        .unwrap();
    let running = healthy_running(&list, "fleet");
    // Spread: one replica per Nest.
    let nests: BTreeSet<_> = running
        .iter()
        .map(|i| i["nest"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        nests,
        BTreeSet::from(["nest-a".to_owned(), "nest-b".to_owned()])
    );
    for i in &running {
        assert_eq!(i["namespace"], "default");
        assert_eq!(i["servers_not_connected"], json!([]), "{i}");
        let tools: Vec<&str> = i["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for t in [
            "time.get_current_time",
            "time.convert_time",
            "files.read_text_file",
            "workspace.read",
            "workspace.grep",
        ] {
            assert!(tools.contains(&t), "{t} missing from {tools:?}");
        }
        assert!(!tools.contains(&"workspace.run"), "--no-run leaves run out");
        // MCP tools only, not built-ins.
        assert_eq!(i["tools_loaded"].as_u64().unwrap() as usize, tools.len());
        assert!(tools.iter().all(|t| !t.starts_with("finish")));
    }
    assert_eq!(running[0]["tools_loaded"], running[1]["tools_loaded"]);

    // People get a table, and the deployment list shows the replicas ready.
    let out = hub.cli(&["ps", "--all"]).unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("fleet") && table.contains("nest-a") && table.contains("running"),
        "{table}"
    );
    let deployments = hub.cli_json(&["ps", "-o", "json"]).unwrap();
    assert_eq!(deployments[0]["name"], "fleet");
    assert_eq!(deployments[0]["ready_replicas"], 2);
}

#[test]
fn a_killed_nest_is_replaced_on_the_other_and_leaves_no_process() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let mut a = hub.nest("nest-a", &[], &[]).unwrap();
    let _b = hub.nest("nest-b", &[], &[]).unwrap();
    let bundle = tmp.path().join("bundle");
    three_server_bundle(&bundle);
    let before = deploy_healthy(&hub, &bundle, "fleet", 2);
    let on_a: Vec<String> = before
        .iter()
        .filter(|i| i["nest"] == "nest-a")
        .map(|i| i["instance"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(on_a.len(), 1);
    let pids_before = a.descendants();
    assert!(
        pids_before.len() >= 2,
        "instance and tool servers of nest-a: {pids_before:?}"
    );

    a.proc.kill9();
    // TTL is 3 s: the replacement runs on nest-b within TTL + a few seconds.
    let after = hub
        .wait_instances("the replacement on nest-b", Duration::from_secs(25), |l| {
            let r = healthy_running(l, "fleet");
            r.len() == 2 && r.iter().all(|i| i["nest"] == "nest-b")
        })
        .unwrap();
    assert!(
        ids(&healthy_running(&after, "fleet")).is_disjoint(&on_a.iter().cloned().collect()),
        "a new instance id"
    );
    let nests = hub.nests().unwrap();
    assert!(
        nests
            .iter()
            .any(|n| n["name"] == "nest-a" && n["state"] == "lost"),
        "{nests:?}"
    );
    wait_for(
        "every process of the dead nest to exit",
        Duration::from_secs(10),
        || a.descendants().is_empty().then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}: left running: {:?}", a.descendants()));
}

#[test]
fn a_killed_tool_server_makes_its_instance_unhealthy_and_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    let bundle = tmp.path().join("bundle");
    three_server_bundle(&bundle);
    let before = deploy_healthy(&hub, &bundle, "fleet", 1);
    let old = before[0]["instance"].as_str().unwrap().to_owned();
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
            let r = healthy_running(l, "fleet");
            r.len() == 1 && r[0]["instance"] != old.as_str()
        })
        .unwrap();
    assert_eq!(healthy_running(&after, "fleet").len(), 1);
}

#[test]
fn a_hub_restart_loses_nothing_and_duplicates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut hub = HubProcess::start(tmp.path()).unwrap();
    let _a = hub.nest("nest-a", &[], &[]).unwrap();
    let _b = hub.nest("nest-b", &[], &[]).unwrap();
    let bundle = tmp.path().join("bundle");
    three_server_bundle(&bundle);
    let before = deploy_healthy(&hub, &bundle, "fleet", 2);

    hub.restart().unwrap();
    wait_for("both nests to reconnect", Duration::from_secs(30), || {
        let n = hub.nests().ok()?;
        (n.iter().filter(|n| n["state"] == "ready").count() == 2).then_some(())
    })
    .unwrap();
    let deployments = hub.cli_json(&["ps", "-o", "json"]).unwrap();
    assert_eq!(
        deployments.as_array().unwrap().len(),
        1,
        "the deployment survived"
    );
    // Past the TTL, the same instances run: re-adopted, not duplicated.
    std::thread::sleep(Duration::from_secs(5));
    let after = hub
        .wait_instances(
            "the same 2 healthy replicas",
            Duration::from_secs(30),
            |l| healthy_running(l, "fleet").len() == 2,
        )
        .unwrap();
    assert_eq!(
        ids(&healthy_running(&after, "fleet")),
        ids(&healthy_running(&before, "fleet"))
    );
    assert_eq!(after.len(), 2, "no duplicate instance: {after:?}");
}

#[test]
fn tool_servers_see_a_cleared_environment_with_their_env_and_secrets() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub
        .nest(
            "solo",
            &[],
            &[
                ("AGEN_TEST_CANARY", "must-not-leak"),
                ("SERVICE_TOKEN", "s3cret-value"),
            ],
        )
        .unwrap();
    let bundle = tmp.path().join("bundle");
    let dump = tmp.path().join("env.json");
    let script = format!(
        "#!{}\nimport json, os\nfrom mcp.server.mcpserver import MCPServer\n\
         with open(os.environ['DUMP_TO'], 'w') as f:\n    json.dump(dict(os.environ), f)\n\
         app = MCPServer('envdump')\n\n@app.tool()\ndef env() -> str:\n    return json.dumps(dict(os.environ))\n\napp.run()\n",
        Peers::python().display()
    );
    write_bundle(
        &bundle,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "envdump",
                    json!({"command": "./envdump.py", "env": {"DUMP_TO": dump, "GREETING": "hi", "TOKEN": "Bearer ${SERVICE_TOKEN}"}}),
                )]),
            ),
            ("envdump.py", script),
            ("x-agen/secrets.json", json!({"SERVICE_TOKEN": {"source": "env", "var": "SERVICE_TOKEN"}}).to_string()),
            ("x-agen/agent.md", "---\nmodel: openai/gpt-4.1-mini\n---\nEnv test.\n".into()),
        ],
    )
    .unwrap();
    std::fs::set_permissions(
        bundle.join("envdump.py"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    deploy(&hub, &bundle, "envtest", 1);
    hub.wait_instances("a healthy instance", Duration::from_secs(60), |l| {
        healthy_running(l, "envtest").len() == 1
    })
    .unwrap();
    let env: serde_json::Map<String, Value> =
        serde_json::from_slice(&std::fs::read(&dump).expect("the server dumped its environment"))
            .unwrap();
    assert!(
        !env.contains_key("AGEN_TEST_CANARY"),
        "the Nest's environment leaked: {env:?}"
    );
    assert!(
        !env.contains_key("SERVICE_TOKEN"),
        "secrets arrive only where declared"
    );
    assert_eq!(env["GREETING"], "hi");
    assert_eq!(env["TOKEN"], "Bearer s3cret-value");
    assert_eq!(env["PYTHONUTF8"], "1");
    assert_eq!(env["PYTHONIOENCODING"], "utf-8");
    assert!(env["AGEN_BIN"].as_str().unwrap().ends_with("agen"));
    let allow = [
        "PATH", "HOME", "TMPDIR", "TEMP", "TMP", "LANG", "TZ", "USER", "LOGNAME", "SHELL", "TERM",
    ];
    for k in env.keys() {
        let ok = allow.contains(&k.as_str())
            || k.starts_with("LC_")
            || ["DUMP_TO", "GREETING", "TOKEN", "PYTHONUTF8", "PYTHONIOENCODING", "AGEN_BIN"].contains(&k.as_str())
            // set by the Python interpreter itself at startup
            || k == "LC_CTYPE";
        assert!(ok, "unexpected variable {k} in a tool server's environment");
    }
}

#[test]
fn bad_bundles_are_refused_before_anything_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let agent = (
        "x-agen/agent.md",
        "---\nmodel: openai/gpt-4.1-mini\n---\nHi.\n".to_owned(),
    );
    // (case, bundle files, what the error must name)
    type Case<'a> = (&'a str, Vec<(&'a str, String)>, &'a str);
    let cases: Vec<Case> = vec![
        ("bad-json", vec![("mcp.json", "{\"mcpServers\": {".into()), agent.clone()], "mcp.json"),
        (
            "unknown-server-shape",
            vec![("mcp.json", r#"{"mcpServers": {"x": {"image": "foo"}}}"#.into()), agent.clone()],
            "mcp.json",
        ),
        (
            "undeclared-secret",
            vec![
                ("mcp.json", r#"{"mcpServers": {"crm": {"url": "https://crm.example/mcp", "headers": {"Authorization": "Bearer ${CRM_TOKEN}"}}}}"#.into()),
                agent.clone(),
            ],
            "CRM_TOKEN",
        ),
        ("missing-agent-md", vec![("mcp.json", r#"{"mcpServers": {}}"#.into())], "x-agen/agent.md"),
        ("bad-front-matter", vec![("x-agen/agent.md", "---\nmodel: [unclosed\n---\nHi.\n".into())], "x-agen/agent.md"),
        (
            "bad-duration",
            vec![("x-agen/harness.json", r#"{"limits": {"toolTimeout": "ten minutes"}}"#.into()), agent.clone()],
            "toolTimeout",
        ),
    ];
    for (name, files, expected) in cases {
        let dir = tmp.path().join(name);
        write_bundle(&dir, &files).unwrap();
        let out = hub
            .cli(&["deploy", dir.to_str().unwrap(), "--name", name])
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: a bad bundle was accepted");
        assert!(
            stderr.contains(expected),
            "{name}: error should name {expected:?}, got: {stderr}"
        );
    }
    let deployments = hub.cli_json(&["ps", "-o", "json"]).unwrap();
    assert_eq!(deployments, json!([]), "nothing was deployed");
}

#[test]
fn redeploying_a_changed_bundle_rolls_instances_over() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _a = hub.nest("nest-a", &[], &[]).unwrap();
    let bundle = tmp.path().join("bundle");
    three_server_bundle(&bundle);
    let v1 = deploy_healthy(&hub, &bundle, "fleet", 2);
    let d1 = v1[0]["bundle_digest"].as_str().unwrap().to_owned();

    std::fs::write(bundle.join("data/readme.txt"), "version two\n").unwrap();
    deploy(&hub, &bundle, "fleet", 2);
    let v2 = hub
        .wait_instances(
            "2 healthy replicas of the new version, and nothing else",
            Duration::from_secs(90),
            |l| {
                let r = healthy_running(l, "fleet");
                r.len() == 2
                    && l.len() == 2
                    && r.iter()
                        .all(|i| i["bundle_digest"] != d1.as_str() && i["generation"] == 2)
            },
        )
        .unwrap();
    assert!(
        ids(&v1).is_disjoint(&ids(&v2)),
        "new instances run the new version"
    );
    let deployments = hub.cli_json(&["ps", "-o", "json"]).unwrap();
    assert_eq!(deployments[0]["generation"], 2);
    assert_ne!(deployments[0]["bundle_digest"], d1.as_str());
}

#[test]
fn an_unreachable_hub_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("client.toml");
    let url = format!("http://127.0.0.1:{}", agen_tests::free_port());
    let out = agen_tests::cli(&config, &["ps", "--hub", &url]).unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot reach the Hub at {url}")),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "errors go to stderr only");
    let out = agen_tests::cli(&config, &["nests"]).unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("no Hub to talk to"));
}

#[test]
fn a_returning_nest_gets_one_replica_back_and_a_running_task_still_succeeds() {
    // Each charge takes 20 s: the task runs through the whole move.
    let mut f = crate::chaos::fleet(&["nest-a", "nest-b"], 2, 1, 20.0, 0);
    let on = |l: &[Value], nest: &str| {
        healthy_running(l, "charge")
            .iter()
            .filter(|i| i["nest"] == nest)
            .count()
    };
    f.nests[1].proc.kill9();
    f.hub
        .wait_instances("both replicas on nest-a", Duration::from_secs(60), |l| {
            on(l, "nest-a") == 2
        })
        .unwrap();

    let task = f.submit("charge the customer");
    wait_for("the task to run on nest-a", Duration::from_secs(30), || {
        let t = f.query(&task)?;
        (t["state"] == "running" && t["nest"] == "nest-a").then_some(())
    })
    .unwrap();

    // nest-b comes back (same data dir, same identity): one replica moves to it.
    f.nests[1] = f.hub.nest("nest-b", &[], &[]).unwrap();
    let spread = f
        .hub
        .wait_instances("replicas 1+1 again", Duration::from_secs(60), |l| {
            on(l, "nest-a") == 1 && on(l, "nest-b") == 1
        })
        .unwrap();
    let t = f.query(&task).unwrap();
    assert_eq!(
        (t["state"].as_str(), t["attempt"].as_u64()),
        (Some("running"), Some(1)),
        "the task was still running its first attempt during the move: {t}"
    );
    let busy_kept = healthy_running(&spread, "charge")
        .iter()
        .any(|i| i["nest"] == "nest-a" && i["instance"] == t["instance"]);
    assert!(busy_kept, "the busy instance stayed: {spread:?} {t}");

    let c = f.settle(std::slice::from_ref(&task), Duration::from_secs(60));
    crate::chaos::assert_safe(&f, &c);
    assert_eq!((c.succeeded, c.charged_1), (1, 1), "{c:?}");
    let t = f.query(&task).unwrap();
    assert_eq!(t["attempt"], 1, "the move handed nothing over: {t}");
}

/// Kills (SIGKILL to its process group) the tool server `server` of `instance`, found in the
/// Nest's children registry.
fn kill_tool_server(nest: &agen_tests::NestProcess, instance: &str, server: &str) {
    let registry: Value =
        serde_json::from_slice(&std::fs::read(nest.dir.join("children.json")).unwrap()).unwrap();
    let pgid = registry["children"][format!("{instance}/{server}")]["pgid"]
        .as_i64()
        .unwrap_or_else(|| panic!("no {instance}/{server} in children.json: {registry}"));
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pgid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

#[test]
fn one_slots_crashes_never_delay_the_replacement_of_another() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    let bundle = tmp.path().join("bundle");
    write_bundle(
        &bundle,
        &[
            (
                "mcp.json",
                mcp_json(&[("time", json!({"command": Peers::mcp_server_time()}))]),
            ),
            (
                "x-agen/agent.md",
                "---\nmodel: openai/gpt-4.1-mini\n---\nTwo slots.\n".into(),
            ),
        ],
    )
    .unwrap();
    let start = deploy_healthy(&hub, &bundle, "slots", 2);
    let healthy = healthy_running(&start, "slots");
    let mut slot_a = healthy[0]["instance"].as_str().unwrap().to_owned();
    let slot_b = healthy[1]["instance"].as_str().unwrap().to_owned();
    let mut known: BTreeSet<String> = ids(&start);

    // Slot A crashes three times in a row (each replacement killed once it runs): its own
    // back-off grows (1 s, 2 s, 4 s).
    for round in 0..3 {
        kill_tool_server(&nest, &slot_a, "time");
        if round == 2 {
            break;
        }
        let list = hub
            .wait_instances(
                "slot A's replacement healthy",
                Duration::from_secs(60),
                |l| {
                    healthy_running(l, "slots")
                        .iter()
                        .any(|i| !known.contains(i["instance"].as_str().unwrap_or("")))
                },
            )
            .unwrap();
        slot_a = healthy_running(&list, "slots")
            .iter()
            .map(|i| i["instance"].as_str().unwrap().to_owned())
            .find(|id| !known.contains(id))
            .unwrap();
        known = known.union(&ids(&list)).cloned().collect();
    }
    wait_for(
        "slot A's third crash noticed",
        Duration::from_secs(30),
        || {
            hub.instances()
                .ok()?
                .iter()
                .all(|i| i["instance"] != slot_a.as_str() || i["healthy"] == false)
                .then_some(())
        },
    )
    .unwrap();
    let known: BTreeSet<String> = ids(&hub.instances().unwrap())
        .union(&known)
        .cloned()
        .collect();

    // Slot B's first crash, right after: its replacement is placed within 5 s.
    let killed = std::time::Instant::now();
    kill_tool_server(&nest, &slot_b, "time");
    let list = hub
        .wait_instances(
            "slot B's replacement placed",
            Duration::from_secs(60),
            |l| {
                l.iter().any(|i| {
                    !known.contains(i["instance"].as_str().unwrap_or(""))
                        && i["state"] != "pending"
                        && i["nest"] == "solo"
                })
            },
        )
        .unwrap();
    let took = killed.elapsed();
    eprintln!("slot B's replacement placed {took:?} after its tool server was killed (slot A crashed 3 times before)");
    assert!(
        took < Duration::from_secs(5),
        "slot B's replacement took {took:?}: {list:?}"
    );
}
