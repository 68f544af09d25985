//! Issue 41 item 8, as the attacker: the smaller holes a bundle author or a namespace deployer
//! could use (a bundle raising its own delegation depth, …), each ending in counts.

use agen_tests::{free_port, write_bundle, FakeModel, HubProcess};
use serde_json::{json, Value};

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

/// "`agen hub --max-delegation-depth` (default 5) caps any bundle's value."
///
/// A bundle that delegates to itself and asks for `maxDelegationDepth` 50, on a Hub started
/// with `--max-delegation-depth 2`: the tree stops at depth 2 (3 tasks in all, 0 deeper), the
/// deepest call's refusal names the Hub's flag.
#[test]
fn a_bundle_cannot_raise_its_delegation_depth_past_the_hubs_cap() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start_with_args(
        tmp.path(),
        free_port(),
        "3s",
        &["--max-delegation-depth", "2"],
    )
    .unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!([
            {"tool_calls": [{"name": "call_agent", "arguments": {"agent": "deep", "input": "deeper"}}]},
            {"reply_template": "got: {{last_tool_result}}"}
        ]),
    )
    .unwrap();
    let dir = tmp.path().join("deep");
    write_bundle(
        &dir,
        &[
            (
                "x-agen/agent.md",
                format!(
                    "---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou delegate.\n",
                    model.base_url()
                ),
            ),
            (
                "x-agen/config.json",
                json!({"delegates": ["deep"]}).to_string(),
            ),
            (
                "x-agen/harness.json",
                json!({"limits": {"maxDelegationDepth": 50}}).to_string(),
            ),
        ],
    )
    .unwrap();
    let o = hub
        .cli(&[
            "deploy",
            dir.to_str().unwrap(),
            "--name",
            "deep",
            "--concurrency",
            "4",
            "--wait",
        ])
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = hub.cli(&["submit", "deep", "go"]).unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let task = text(&o.stdout).trim().to_string();
    let done = hub
        .cli_json(&["wait", &task, "-o", "json", "--timeout", "90s"])
        .unwrap();
    assert_eq!(done["state"], "succeeded", "{done}");
    let result = done["outcome"]["result"].as_str().unwrap_or_default();
    assert!(
        result.starts_with("got: got: got: ") && result.contains("--max-delegation-depth of 2"),
        "{result}"
    );
    let tasks: Vec<Value> = hub
        .cli_json(&["tasks", "-o", "json", "--limit", "0"])
        .unwrap()
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        tasks.len(),
        3,
        "the root and 2 levels of children: {tasks:?}"
    );
}

/// `agen ARGS --token TOKEN`.
fn as_token(hub: &HubProcess, token: &str, args: &[&str]) -> std::process::Output {
    let mut all: Vec<&str> = args.to_vec();
    all.extend_from_slice(&["--token", token]);
    hub.cli(&all).unwrap()
}

/// "rollback refuses a generation the caller could not deploy now."
///
/// The admin deploys `app` in namespace `a` delegating into namespace `b`, then a bundle that
/// delegates nowhere. A deployer of `a` (who may not submit in `b`) rolls back to the first
/// generation: refused with exit 5 naming RollbackDeployment and the delegate, the history
/// keeps its 2 generations (0 made by the attacker); a rollback by the admin goes through.
#[test]
fn a_rollback_to_a_generation_the_caller_could_not_deploy_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let model = FakeModel::start(&tmp.path().join("model"), &json!([{"reply": "hi"}])).unwrap();
    let agent = format!(
        "---\nname: app\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou help.\n",
        model.base_url()
    );
    let delegating = tmp.path().join("delegating");
    write_bundle(
        &delegating,
        &[
            ("x-agen/agent.md", agent.clone()),
            (
                "x-agen/config.json",
                json!({"delegates": [{"deployment": "vault", "namespace": "b"}]}).to_string(),
            ),
        ],
    )
    .unwrap();
    let plain = tmp.path().join("plain");
    write_bundle(&plain, &[("x-agen/agent.md", agent)]).unwrap();
    for dir in [&delegating, &plain] {
        let o = hub
            .cli(&[
                "deploy",
                dir.to_str().unwrap(),
                "--name",
                "app",
                "--namespace",
                "a",
            ])
            .unwrap();
        assert!(o.status.success(), "{}", text(&o.stderr));
    }
    let created = hub
        .cli_json(&[
            "tokens",
            "create",
            "--namespace",
            "a",
            "--role",
            "deployer",
            "--name",
            "a-deployer",
            "-o",
            "json",
        ])
        .unwrap();
    let deployer = created["secret"].as_str().unwrap().to_string();
    let generations = || -> usize {
        hub.cli_json(&["history", "app", "--namespace", "a", "-o", "json"])
            .unwrap()
            .as_array()
            .map_or(0, Vec::len)
    };
    assert_eq!(generations(), 2);

    let o = as_token(&hub, &deployer, &["rollback", "app", "--namespace", "a"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(
        err.contains("RollbackDeployment") && err.contains("`vault`"),
        "{err}"
    );
    assert_eq!(generations(), 2, "the refused rollback made no generation");

    let o = hub.cli(&["rollback", "app", "--namespace", "a"]).unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(generations(), 3);
}

/// "a child in another namespace appears in `GetTrace` as one opaque span (its id and state
/// only)."
///
/// `caller` in namespace `a` calls `vault` in namespace `b`. The admin's trace has the child's
/// own spans (`task vault`, its model turn); a viewer of `a` sees 0 of them and exactly 1
/// opaque span with the child's task id and state and nothing else.
#[test]
fn a_child_in_another_namespace_is_one_opaque_span_in_the_trace() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let caller_model = FakeModel::start(
        &tmp.path().join("model-caller"),
        &json!([
            {"tool_calls": [{"name": "call_agent", "arguments": {"agent": "b/vault", "input": "tell"}}]},
            {"reply_template": "got: {{last_tool_result}}"}
        ]),
    )
    .unwrap();
    let vault_model = FakeModel::start(
        &tmp.path().join("model-vault"),
        &json!([{"reply": "the vault says hi"}]),
    )
    .unwrap();
    let deploy = |name: &str, ns: &str, model: &FakeModel, config: Value| {
        let dir = tmp.path().join(name);
        write_bundle(
            &dir,
            &[
                (
                    "x-agen/agent.md",
                    format!(
                        "---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou are {name}.\n",
                        model.base_url()
                    ),
                ),
                ("x-agen/config.json", config.to_string()),
            ],
        )
        .unwrap();
        let o = hub
            .cli(&[
                "deploy",
                dir.to_str().unwrap(),
                "--name",
                name,
                "--namespace",
                ns,
                "--wait",
            ])
            .unwrap();
        assert!(o.status.success(), "deploy {name}: {}", text(&o.stderr));
    };
    deploy("vault", "b", &vault_model, json!({}));
    deploy(
        "caller",
        "a",
        &caller_model,
        json!({"delegates": [{"deployment": "vault", "namespace": "b"}]}),
    );
    let o = hub
        .cli(&["submit", "caller", "go", "--namespace", "a"])
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let task = text(&o.stdout).trim().to_string();
    let done = hub
        .cli_json(&[
            "wait",
            &task,
            "--namespace",
            "a",
            "-o",
            "json",
            "--timeout",
            "60s",
        ])
        .unwrap();
    assert_eq!(done["state"], "succeeded", "{done}");

    let names = |t: &Value| -> Vec<String> {
        t["spans"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_string())
            .collect()
    };
    let admin = hub
        .cli_json(&["trace", &task, "--namespace", "a", "-o", "json"])
        .unwrap();
    let admin_names = names(&admin);
    assert!(admin_names.contains(&"task vault".to_string()), "{admin}");

    let viewer = hub
        .cli_json(&[
            "tokens",
            "create",
            "--namespace",
            "a",
            "--role",
            "viewer",
            "--name",
            "a-viewer",
            "-o",
            "json",
        ])
        .unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let o = as_token(
        &hub,
        &viewer,
        &["trace", &task, "--namespace", "a", "-o", "json"],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    let seen: Value = serde_json::from_slice(&o.stdout).unwrap();
    let seen_names = names(&seen);
    assert_eq!(
        seen_names
            .iter()
            .filter(|n| n.as_str() == "task vault")
            .count(),
        0,
        "{seen}"
    );
    let opaque: Vec<&Value> = seen["spans"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == "delegated task (another namespace)")
        .collect();
    assert_eq!(opaque.len(), 1, "{seen}");
    let child_id = opaque[0]["attributes"]["task_id"].as_str().unwrap();
    assert_eq!(
        opaque[0]["attributes"].as_object().unwrap().len(),
        1,
        "{seen}"
    );
    assert_eq!(opaque[0]["status"], "succeeded");
    assert!(!seen.to_string().contains("the vault says hi"));
    // Everything else of the caller's trace is the same.
    assert_eq!(
        admin_names.len() - seen_names.len() + 1,
        admin["spans"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["attributes"]["task_id"] == child_id
                || s["parent_span_id"] == opaque[0]["span_id"])
            .count(),
        "the child's spans are replaced by one: {admin}"
    );
}

/// `agen nest ARGS` as root in a mount namespace of its own whose `/run` is a read-only tmpfs
/// (a host without a writable `/run`); stdout and stderr go to `log`.
fn nest_without_run(
    hub: &HubProcess,
    dir: &std::path::Path,
    extra: &[&str],
) -> std::process::Command {
    let mut script = format!(
        "mount -t tmpfs -o ro tmpfs /run && exec {} nest --hub {} --join-file {} --name norun --data-dir {}",
        agen_tests::agen_bin().display(),
        hub.url(),
        hub.dir.join("hub/join-token").display(),
        dir.display()
    );
    for e in extra {
        script.push(' ');
        script.push_str(e);
    }
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
    cmd
}

/// "without `/run` a Nest with separation on refuses to start and names `--run-root`."
///
/// As root (separation on) with `/run` read-only: the Nest exits 64 naming `--run-root`, and
/// joins 0 times; with `--run-root DIR` (private) it joins and keeps its run root in DIR; a
/// `--run-root` other users may write is refused too.
#[test]
fn a_separating_nest_without_run_refuses_to_start_and_names_run_root() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (instance separation)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let out = nest_without_run(&hub, &tmp.path().join("nest-a"), &[])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("--run-root") && err.contains("/run"), "{err}");

    let open = tmp.path().join("open-root");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let out = nest_without_run(
        &hub,
        &tmp.path().join("nest-b"),
        &["--run-root", open.to_str().unwrap()],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("other users may write"));
    assert_eq!(hub.nests().unwrap().len(), 0, "no nest joined");

    let private = tmp.path().join("run-root");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let cmd = nest_without_run(
        &hub,
        &tmp.path().join("nest-c"),
        &["--run-root", private.to_str().unwrap()],
    );
    let nest = agen_tests::Proc::spawn("norun", cmd, &tmp.path().join("nest-c.log")).unwrap();
    agen_tests::wait_for(
        "the nest to join",
        std::time::Duration::from_secs(30),
        || {
            hub.nests()
                .ok()?
                .iter()
                .any(|n| n["name"] == "norun" && n["state"] == "ready")
                .then_some(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}: {}", nest.log_text()));
    let roots: Vec<String> = std::fs::read_dir(&private)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        roots.len() == 1 && roots[0].starts_with("nest-"),
        "the run root is in --run-root: {roots:?}"
    );
}
