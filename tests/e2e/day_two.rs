//! Day two without footguns (issue 42): `agen deploy` keeps a scaled replica count, a rollback
//! to what runs is a no-op, `agen rm` asks first (and refuses without a terminal) and keeps the
//! history, `agen nests drain --wait` follows the drain, `agen init DIR` names the agent after
//! DIR.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use agen_tests::{agen_bin, HubProcess};
use serde_json::Value;

fn ok(hub: &HubProcess, args: &[&str]) -> String {
    let out = hub.cli(args).unwrap();
    assert!(
        out.status.success(),
        "agen {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `agen init DIR` with a model that needs no key (instances start; no task runs here).
fn init(dir: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(agen_bin())
        .args(["init", dir.to_str().unwrap()])
        .args([
            "--model",
            "openai/fake-model",
            "--base-url",
            "http://127.0.0.1:9/v1",
        ])
        .args(extra)
        .output()
        .unwrap()
}

fn running_ids(hub: &HubProcess, name: &str) -> Vec<String> {
    let mut ids: Vec<String> = hub
        .instances()
        .unwrap()
        .iter()
        .filter(|i| i["deployment"] == name && i["state"] == "running")
        .map(|i| i["instance"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

fn deployment(hub: &HubProcess, name: &str) -> Option<Value> {
    hub.cli_json(&["ps", "-o", "json"])
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .cloned()
}

fn history_changes(hub: &HubProcess, name: &str) -> Vec<(u64, String)> {
    hub.cli_json(&["history", name, "-o", "json"])
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["generation"].as_u64().unwrap(),
                r["change"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// `agen rm NAME` on a pseudo-terminal (util-linux `script`), answering `answer`.
fn rm_on_a_terminal(hub: &HubProcess, name: &str, answer: &str) -> std::process::Output {
    let cmd = format!("{} rm {name}", agen_bin().display());
    let mut child = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("AGEN_CONFIG", hub.dir.join("client.toml"))
        .env_remove("AGEN_HUB")
        .env_remove("AGEN_TOKEN")
        .env_remove("AGEN_NAMESPACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The question is asked before the answer is read; the terminal buffers what comes first.
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{answer}\n").as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn deploy_keeps_the_scale_rollback_to_what_runs_is_a_no_op_and_rm_asks_and_keeps_history() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();

    // `agen init DIR` names the agent after DIR; `--name` chooses; a bad name is usage.
    let dir = tmp.path().join("My Agent");
    let out = init(&dir, &[]);
    assert!(out.status.success(), "{out:?}");
    let md = std::fs::read_to_string(dir.join("x-agen/agent.md")).unwrap();
    assert!(md.contains("\nname: my-agent\n"), "{md}");
    let other = tmp.path().join("other");
    assert!(init(&other, &["--name", "chosen"]).status.success());
    let md = std::fs::read_to_string(other.join("x-agen/agent.md")).unwrap();
    assert!(md.contains("\nname: chosen\n"), "{md}");
    let bad = init(&tmp.path().join("bad"), &["--name", "Not OK!"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");

    // The README's own sequence: deploy (no --name), scale by the agent's name.
    let d = dir.to_str().unwrap();
    ok(&hub, &["deploy", d, "--wait"]);
    ok(&hub, &["scale", "my-agent", "3", "--wait"]);
    // A new version without --replicas keeps 3; --replicas still sets it.
    std::fs::write(dir.join("README.md"), "version two\n").unwrap();
    ok(&hub, &["deploy", d, "--wait"]);
    assert_eq!(deployment(&hub, "my-agent").unwrap()["replicas"], 3);
    assert_eq!(running_ids(&hub, "my-agent").len(), 3);
    ok(&hub, &["deploy", d, "--replicas", "2", "--wait"]);
    assert_eq!(deployment(&hub, "my-agent").unwrap()["replicas"], 2);

    // Rollback to the generation that runs now: nothing changes, and it says so.
    let ids = running_ids(&hub, "my-agent");
    let gen = deployment(&hub, "my-agent").unwrap()["generation"]
        .as_u64()
        .unwrap();
    let before = history_changes(&hub, "my-agent");
    let out = ok(
        &hub,
        &["rollback", "my-agent", "--to-generation", &gen.to_string()],
    );
    assert!(out.contains("already runs that"), "{out}");
    assert!(out.contains("nothing restarted"), "{out}");
    let v = hub
        .cli_json(&[
            "rollback",
            "my-agent",
            "--to-generation",
            &gen.to_string(),
            "-o",
            "json",
        ])
        .unwrap();
    assert_eq!(
        (v["changed"].clone(), v["generation"].clone()),
        (false.into(), gen.into())
    );
    assert_eq!(history_changes(&hub, "my-agent"), before);
    assert_eq!(running_ids(&hub, "my-agent"), ids, "no instance restarted");

    // rm without a terminal and without --yes refuses (2); on a terminal it asks.
    let out = hub.cli(&["rm", "my-agent"]).unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--yes"),
        "{out:?}"
    );
    let out = rm_on_a_terminal(&hub, "my-agent", "n");
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("remove deployment default/my-agent (2 replicas, generation"),
        "{said}"
    );
    assert!(deployment(&hub, "my-agent").is_some(), "a no keeps it");
    let out = rm_on_a_terminal(&hub, "my-agent", "y");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(deployment(&hub, "my-agent").is_none());

    // The history stays (until the task retention), its last row the removal.
    let mut want = before.clone();
    want.push((gen + 1, "removed".into()));
    assert_eq!(history_changes(&hub, "my-agent"), want);
    // Deployed again, the deployment goes on from there.
    ok(&hub, &["deploy", d, "--wait"]);
    want.push((gen + 2, "deploy".into()));
    assert_eq!(history_changes(&hub, "my-agent"), want);
    assert_eq!(deployment(&hub, "my-agent").unwrap()["replicas"], 1);
    ok(&hub, &["rm", "my-agent", "--yes"]);
    // A name that never existed is still not found.
    assert_eq!(hub.cli(&["rm", "ghost"]).unwrap().status.code(), Some(4));
}

#[test]
fn nests_drain_wait_follows_until_the_nest_is_empty_and_nests_shows_the_deadline() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _a = hub.nest("nest-a", &[], &[]).unwrap();
    let dir = tmp.path().join("drainee");
    assert!(init(&dir, &[]).status.success());
    ok(
        &hub,
        &["deploy", dir.to_str().unwrap(), "--replicas", "2", "--wait"],
    );
    let _b = hub.nest("nest-b", &[], &[]).unwrap();

    // Idle instances move at once; --wait returns only when none is left on nest-a.
    let out = hub
        .cli(&["nests", "drain", "nest-a", "--deadline", "10m", "--wait"])
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("nest nest-a: no instance left"), "{err}");
    let left_on_a = hub
        .instances()
        .unwrap()
        .iter()
        .filter(|i| i["nest"] == "nest-a" && i["state"] != "lost")
        .count();
    assert_eq!(left_on_a, 0);

    // The drain's deadline shows in the table and in JSON.
    let table = ok(&hub, &["nests"]);
    let row = table.lines().find(|l| l.starts_with("nest-a")).unwrap();
    assert!(row.contains("ready,cordoned,draining until"), "{table}");
    let a = hub
        .nests()
        .unwrap()
        .into_iter()
        .find(|n| n["name"] == "nest-a")
        .unwrap();
    assert!(a["draining_until"].is_string(), "{a}");
    let b = hub
        .nests()
        .unwrap()
        .into_iter()
        .find(|n| n["name"] == "nest-b")
        .unwrap();
    assert_eq!(b["draining_until"], Value::Null);
    hub.wait_instances("both replicas on nest-b", Duration::from_secs(60), |l| {
        l.iter()
            .filter(|i| i["nest"] == "nest-b" && i["state"] == "running")
            .count()
            == 2
    })
    .unwrap();
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn errors_name_their_cause_and_deploy_wait_stops_when_every_replica_cannot_start() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    // Instances run under uids of their own; the tool server's program is in a folder only
    // root may enter (the temp dir is 0700).
    let mut nest = hub
        .nest_with("sep", &[], &[], &["--run-uids", "62170-62179"])
        .unwrap();
    let private = tmp.path().join("private-bin");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let program = private.join("server.sh");
    std::fs::write(&program, "#!/bin/sh\nexec sleep 600\n").unwrap();
    std::fs::set_permissions(
        &program,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let dir = tmp.path().join("locked-out");
    assert!(init(&dir, &[]).status.success());
    std::fs::write(
        dir.join("mcp.json"),
        agen_tests::mcp_json(&[("tools", serde_json::json!({"command": program}))]),
    )
    .unwrap();

    // A tool server out of reach does not take the instance down (the tools guide: it runs with
    // fewer tools), so `deploy --wait` returns once it is ready and names the server that is not
    // connected with its cause: the uid, the path and the fix; `--require-all-servers` makes
    // that exit 1, long before the timeout.
    let started = std::time::Instant::now();
    let out = hub
        .cli(&[
            "deploy",
            dir.to_str().unwrap(),
            "--require-all-servers",
            "--timeout",
            "20s",
        ])
        .unwrap();
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(started.elapsed() < Duration::from_secs(60), "{err}");
    assert!(err.contains("tool server tools is not connected"), "{err}");
    assert!(err.contains("permission denied: uid 6217"), "{err}");
    assert!(err.contains(&private.display().to_string()), "{err}");
    assert!(err.contains("--run-as-self"), "{err}");
    assert!(!err.contains("does not exist"), "{err}");

    // The Hub answers that no Nest holding it is connected: not "cannot reach the Hub".
    nest.proc.kill9();
    hub.wait_instances("the instance's nest gone", Duration::from_secs(60), |l| {
        l.iter()
            .all(|i| i["state"] != "running" && i["state"] != "starting")
            && hub.nests().unwrap().iter().all(|n| n["state"] != "ready")
    })
    .unwrap();
    let out = hub.cli(&["logs", "locked-out"]).unwrap();
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(6), "{err}");
    assert!(err.contains("answered"), "{err}");
    assert!(!err.contains("cannot reach"), "{err}");

    // A bad token's hint once; a Hub certificate the CA file does not vouch for is 5; a
    // missing client config or CA file is 2; `agen run` with a bad bundle is 2.
    let out = hub.cli(&["ps", "--token", "not-the-token"]).unwrap();
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert_eq!(err.matches("--token").count(), 1, "{err}");
    let other_ca = tmp.path().join("other-ca.pem");
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=not-the-hub"])
        .arg("-keyout")
        .arg(tmp.path().join("other-ca.key"))
        .arg("-out")
        .arg(&other_ca)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let out = hub
        .cli(&["ps", "--ca-file", other_ca.to_str().unwrap()])
        .unwrap();
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(err.contains("not trusted"), "{err}");
    let out = hub
        .cli(&["ps", "--ca-file", "/nonexistent/ca.pem"])
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    let out = agen_tests::cli(&tmp.path().join("no-such-config.toml"), &["ps"]).unwrap();
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no Hub to talk to"), "{err}");
    let bad = tmp.path().join("bad-bundle");
    std::fs::create_dir_all(bad.join("x-agen")).unwrap();
    std::fs::write(
        bad.join("x-agen/agent.md"),
        "---\nmodel: nobody/x\n---\nhi\n",
    )
    .unwrap();
    let out = Command::new(agen_bin())
        .args(["run", bad.to_str().unwrap(), "hi"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
}

#[test]
fn agen_logs_keeps_a_tool_servers_stderr_with_rust_log_warn_on_the_nest() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("quiet", &[], &[("RUST_LOG", "warn")]).unwrap();
    let dir = tmp.path().join("chatty");
    assert!(init(&dir, &[]).status.success());
    std::fs::write(
        dir.join("mcp.json"),
        agen_tests::mcp_json(&[(
            "talker",
            serde_json::json!({"command": "/bin/sh", "args": ["-c", "echo talker-line-one >&2; echo talker-line-two >&2; exec sleep 600"]}),
        )]),
    )
    .unwrap();
    ok(&hub, &["deploy", dir.to_str().unwrap()]);
    let lines = agen_tests::wait_for(
        "both stderr lines in agen logs",
        Duration::from_secs(60),
        || {
            let out = hub
                .cli(&["logs", "chatty", "--server", "talker", "-o", "json"])
                .ok()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let n = ["talker-line-one", "talker-line-two"]
                .iter()
                .filter(|m| text.contains(*m))
                .count();
            (n == 2).then_some(text)
        },
    )
    .unwrap();
    assert_eq!(
        lines.lines().filter(|l| l.contains("talker-line-")).count(),
        2,
        "{lines}"
    );
}

/// `GET path` on a loopback port: (status code, body).
fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The classic text format, as `curl -H 'Accept: text/plain' … | promtool check metrics`.
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: x\r\naccept: text/plain\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (code, body.to_string())
}

/// `promtool ARGS` with `stdin`; panics with its output unless it succeeds.
fn promtool(args: &[&str], stdin: &str) -> String {
    let mut child = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian prometheus; tests/run.sh installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {args:?}: {text}\n--- input:\n{stdin}"
    );
    text
}

/// The value of the one sample line starting with `series` (name and labels as printed).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn metrics_an_operator_alerts_on_pass_promtool_and_health_needs_no_token() {
    let tmp = tempfile::tempdir().unwrap();
    let port = agen_tests::free_port();
    let mut hub = HubProcess::start_with_args(
        tmp.path(),
        agen_tests::free_port(),
        "3s",
        &["--metrics-listen", &format!("127.0.0.1:{port}")],
    )
    .unwrap();
    let nest_port = agen_tests::free_port();
    let mut nest = hub
        .nest(
            "metered",
            &[],
            &[(
                "AGEN_NEST_METRICS_LISTEN",
                &format!("127.0.0.1:{nest_port}"),
            )],
        )
        .unwrap();
    let dir = tmp.path().join("gauged");
    assert!(init(&dir, &[]).status.success());
    ok(
        &hub,
        &["deploy", dir.to_str().unwrap(), "--replicas", "2", "--wait"],
    );

    for p in [port, nest_port] {
        assert_eq!(http_get(p, "/healthz"), (200, "ok\n".into()));
        assert_eq!(http_get(p, "/readyz"), (200, "ready\n".into()));
    }
    let (code, hub_text) = http_get(port, "/metrics");
    assert_eq!(code, 200);
    let (code, nest_text) = http_get(nest_port, "/metrics");
    assert_eq!(code, 200);
    promtool(&["check", "metrics"], &hub_text);
    promtool(&["check", "metrics"], &nest_text);
    let version = env!("CARGO_PKG_VERSION");
    let want = [
        (
            format!("agen_build_info{{component=\"hub\",version=\"{version}\"}}"),
            1.0,
        ),
        ("agen_nests{state=\"ready\"}".to_string(), 1.0),
        ("agen_nests{state=\"lost\"}".to_string(), 0.0),
        (
            "agen_deployment_replicas_desired{namespace=\"default\",deployment=\"gauged\"}".into(),
            2.0,
        ),
        (
            "agen_deployment_replicas_ready{namespace=\"default\",deployment=\"gauged\"}".into(),
            2.0,
        ),
        ("agen_approvals_pending{namespace=\"default\"}".into(), 0.0),
    ];
    for (series, value) in &want {
        assert_eq!(
            sample(&hub_text, series),
            Some(*value),
            "{series}:\n{hub_text}"
        );
    }
    for text in [&hub_text, &nest_text] {
        let bare: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("deployment=\"") && !l.contains("namespace=\""))
            .collect();
        assert_eq!(
            bare,
            Vec::<&str>::new(),
            "series with deployment but no namespace"
        );
        assert!(sample(text, "process_resident_memory_bytes").unwrap() > 0.0);
        assert!(sample(text, "process_open_fds").unwrap() > 0.0);
        assert!(sample(text, "process_cpu_seconds_total").is_some());
    }
    assert_eq!(
        sample(
            &nest_text,
            &format!("agen_build_info{{component=\"nest\",version=\"{version}\"}}")
        ),
        Some(1.0)
    );

    // A Nest that went down before a Hub restart: its heartbeat age keeps growing after it.
    nest.proc.kill9();
    hub.restart().unwrap();
    let age = agen_tests::wait_for(
        "the heartbeat age of the dead nest past 2s",
        Duration::from_secs(30),
        || {
            let (_, text) = http_get(port, "/metrics");
            sample(&text, "agen_nest_heartbeat_age_seconds{nest=\"metered\"}").filter(|a| *a >= 2.0)
        },
    )
    .unwrap();
    assert!(age < 120.0, "{age}");
}

/// The alert rules of the README's operations section (between its `agen-alert-rules`
/// markers), as a Prometheus rule file.
fn readme_alert_rules() -> String {
    let readme = std::fs::read_to_string(agen_tests::workspace_root().join("README.md")).unwrap();
    let start = readme
        .find("<!-- agen-alert-rules -->")
        .expect("README has the alert rules");
    let block = &readme[start..];
    let block = &block[block.find("```yaml\n").unwrap() + 8..];
    block[..block.find("```").unwrap()].to_string()
}

#[test]
fn the_readmes_three_alert_rules_fire_in_promtool_test_rules() {
    let tmp = tempfile::tempdir().unwrap();
    let rules = tmp.path().join("agen-alerts.yml");
    std::fs::write(&rules, readme_alert_rules()).unwrap();
    promtool(&["check", "rules", rules.to_str().unwrap()], "");
    // Series as a Hub would expose them: a Nest silent since minute 0, a deployment with 1 of
    // 2 replicas ready, a task waiting for a person for 40 minutes.
    let tests = r#"
rule_files: [agen-alerts.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'agen_nest_heartbeat_age_seconds{nest="n1"}'
        values: '0+60x20'
      - series: 'agen_nest_heartbeat_age_seconds{nest="n2"}'
        values: '1+0x20'
      - series: 'agen_deployment_replicas_desired{namespace="default",deployment="hello"}'
        values: '2x20'
      - series: 'agen_deployment_replicas_ready{namespace="default",deployment="hello"}'
        values: '1x20'
      - series: 'agen_approvals_pending{namespace="default"}'
        values: '0 1x40'
    alert_rule_test:
      - eval_time: 15m
        alertname: AgenNestSilent
        exp_alerts:
          - exp_labels: {severity: page, nest: n1}
            exp_annotations:
              summary: "Nest n1 has not been heard from for over 5 minutes"
      - eval_time: 15m
        alertname: AgenDeploymentNotReady
        exp_alerts:
          - exp_labels: {severity: page, namespace: default, deployment: hello}
            exp_annotations:
              summary: "default/hello: 1 replicas ready, fewer than desired"
      - eval_time: 40m
        alertname: AgenApprovalsWaiting
        exp_alerts:
          - exp_labels: {severity: ticket, namespace: default}
            exp_annotations:
              summary: "1 task(s) in default wait for a person's decision"
      - eval_time: 5m
        alertname: AgenApprovalsWaiting
        exp_alerts: []
"#;
    let test_file = tmp.path().join("agen-alerts.test.yml");
    std::fs::write(&test_file, tests).unwrap();
    let out = promtool(&["test", "rules", test_file.to_str().unwrap()], "");
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn agen_audit_filters_by_token_action_and_outcome_and_follows_new_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let v = hub
        .cli_json(&[
            "tokens",
            "create",
            "--namespace",
            "team",
            "--role",
            "deployer",
            "--name",
            "team-deployer",
            "-o",
            "json",
        ])
        .unwrap();
    let secret = v["secret"].as_str().unwrap().to_owned();

    // Follow from now on, only ScaleDeployment calls that were not found.
    let mut follower = Command::new(agen_bin())
        .args(["audit", "-f", "-o", "json", "--action", "scaledeployment"])
        .args(["--outcome", "not_found"])
        .env("AGEN_CONFIG", hub.dir.join("client.toml"))
        .env_remove("AGEN_HUB")
        .env_remove("AGEN_TOKEN")
        .env_remove("AGEN_NAMESPACE")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = follower.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    // The namespace token scales a deployment that is not there (not_found), and removes
    // nothing; the admin scales another (not_found too) and is refused nothing.
    let out = hub
        .cli(&[
            "scale",
            "ghost-a",
            "2",
            "--namespace",
            "team",
            "--token",
            &secret,
        ])
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let out = hub.cli(&["scale", "ghost-b", "2"]).unwrap();
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let out = hub
        .cli(&[
            "secrets",
            "set",
            "K",
            "--namespace",
            "team",
            "--token",
            &secret,
            "--from-env",
            "PATH",
        ])
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    let mut followed: Vec<Value> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while followed.len() < 2 && std::time::Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(500)) {
            followed.push(serde_json::from_str(&line).unwrap());
        }
    }
    let _ = follower.kill();
    let _ = follower.wait();
    let mut targets: Vec<&str> = followed
        .iter()
        .map(|e| e["target"].as_str().unwrap())
        .collect();
    targets.sort();
    assert_eq!(targets, vec!["ghost-a", "ghost-b"], "{followed:?}");
    assert!(followed
        .iter()
        .all(|e| e["call"] == "ScaleDeployment" && e["outcome"] == "not_found"));

    // Filters: by token (name or id), by action and outcome.
    let by_token = hub
        .cli_json(&["audit", "--token-id", "team-deployer", "-o", "json"])
        .unwrap();
    let calls: Vec<&str> = by_token
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["call"].as_str().unwrap())
        .collect();
    assert_eq!(calls.len(), 2, "{by_token}");
    assert!(
        calls.contains(&"ScaleDeployment") && calls.contains(&"SetSecret"),
        "{calls:?}"
    );
    let ok_in_team = hub
        .cli_json(&[
            "audit",
            "--namespace",
            "team",
            "--outcome",
            "ok",
            "-o",
            "json",
        ])
        .unwrap();
    assert_eq!(
        ok_in_team
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["call"].as_str().unwrap())
            .collect::<Vec<_>>(),
        vec!["CreateToken", "SetSecret"],
        "{ok_in_team}"
    );
}
