//! The CLI as scripts use it (issue 21): every exit code of the contract, a closed pipe,
//! shell completions, `submit -o json`, plain tables when piped, `-o yaml`. Real Hub, real
//! Nest, the scripted fake model; the CLI is the shipped binary.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

use agen_tests::{agen_bin, free_port, mcp_json, write_bundle, FakeModel, HubProcess};
use serde_json::json;

/// A bundle with no tool servers whose model is the fake model.
fn bundle(dir: &Path, model: &FakeModel) {
    write_bundle(
        dir,
        &[
            ("mcp.json", mcp_json(&[])),
            (
                "x-agen/agent.md",
                format!(
                    "---\nname: cli-agent\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou answer.\n",
                    model.base_url()
                ),
            ),
        ],
    )
    .expect("write bundle");
}

fn code(out: &std::process::Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs the CLI against `hub` and returns (exit code, stdout, stderr).
fn run(hub: &HubProcess, args: &[&str]) -> (i32, String, String) {
    let out = hub.cli(args).unwrap();
    (code(&out), text(&out.stdout), text(&out.stderr))
}

fn deploy(hub: &HubProcess, dir: &Path, name: &str, extra: &[&str]) {
    let mut args = vec!["deploy", dir.to_str().unwrap(), "--name", name];
    args.extend_from_slice(extra);
    let (c, _, err) = run(hub, &args);
    assert_eq!(c, 0, "deploy {name}: {err}");
}

#[test]
fn every_exit_code_of_the_contract_is_what_scripts_get() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    // Every model call is refused: every task that runs fails.
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [{"status": 401, "body": "{\"error\": {\"message\": \"invalid api key\"}}"}]}),
    )
    .unwrap();
    let dir = tmp.path().join("bundle");
    bundle(&dir, &model);
    deploy(&hub, &dir, "failing", &["--wait"]);
    // Nothing matches this selector: its tasks stay queued.
    deploy(&hub, &dir, "parked", &["--selector", "zone=nowhere"]);

    let mut seen = Vec::new();
    let mut check = |what: &str, (c, _out, err): (i32, String, String), expected: i32| {
        seen.push((what.to_owned(), c));
        assert_eq!(c, expected, "{what}: exit {c}, stderr: {err}");
    };

    // 0 ok
    check("agen ps", run(&hub, &["ps"]), 0);
    // 1 task failed
    let (_, id, _) = run(&hub, &["submit", "failing", "hello"]);
    let id = id.trim().to_owned();
    check(
        "wait on a failed task",
        run(&hub, &["wait", &id, "--timeout", "60s"]),
        1,
    );
    check(
        "submit --wait on a failing deployment",
        run(&hub, &["submit", "failing", "again", "--wait"]),
        1,
    );
    // 2 usage
    check("a missing argument", run(&hub, &["submit", "failing"]), 2);
    check("an unknown flag", run(&hub, &["ps", "--no-such-flag"]), 2);
    check(
        "a bad deployment name",
        run(&hub, &["submit", "Not A Name", "hello"]),
        2,
    );
    // 7 wait timeout, then 3 cancelled
    let (_, queued, _) = run(&hub, &["submit", "parked", "hello"]);
    let queued = queued.trim().to_owned();
    check(
        "wait past its timeout",
        run(&hub, &["wait", &queued, "--timeout", "1s"]),
        7,
    );
    check("cancel", run(&hub, &["cancel", &queued]), 0);
    check(
        "wait on a cancelled task",
        run(&hub, &["wait", &queued, "--timeout", "30s"]),
        3,
    );
    // 4 not found
    check(
        "query an unknown task",
        run(&hub, &["query", "t-does-not-exist"]),
        4,
    );
    check(
        "wait on an unknown task",
        run(&hub, &["wait", "t-does-not-exist"]),
        4,
    );
    check("rm an unknown deployment", run(&hub, &["rm", "ghost"]), 4);
    check(
        "history of an unknown deployment",
        run(&hub, &["history", "ghost"]),
        4,
    );
    // 5 unauthenticated
    check(
        "a wrong token",
        run(&hub, &["ps", "--token", "not-the-token"]),
        5,
    );
    // 6 Hub unavailable
    let nobody = format!("https://127.0.0.1:{}", free_port());
    check("no Hub listening", run(&hub, &["ps", "--hub", &nobody]), 6);

    // The table is in `--help`.
    let (c, help, _) = run(&hub, &["--help"]);
    assert_eq!(c, 0);
    for line in [
        "0  ok",
        "1  task failed",
        "2  usage",
        "3  task cancelled",
        "4  not found",
        "5  unauthenticated or permission denied",
        "6  Hub unavailable",
        "7  wait timeout",
    ] {
        assert!(help.contains(line), "--help lacks {line:?}:\n{help}");
    }
    let wrong: Vec<_> = seen.iter().filter(|(_, c)| *c == 101).collect();
    assert_eq!(wrong.len(), 0, "no command panicked: {seen:?}");
}

/// Runs `agen ARGS` with stdout a pipe whose reader is already gone.
fn run_into_closed_pipe(config: &Path, args: &[&str]) -> (i32, String) {
    let mut child = Command::new(agen_bin())
        .args(args)
        .env("AGEN_CONFIG", config)
        .env_remove("AGEN_HUB")
        .env_remove("AGEN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    (status.code().unwrap_or(-1), err)
}

#[test]
fn a_closed_pipe_ends_quietly_with_exit_0_and_tables_are_plain_when_piped() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [{"reply": "ok"}]}),
    )
    .unwrap();
    let dir = tmp.path().join("bundle");
    bundle(&dir, &model);
    deploy(&hub, &dir, "parked", &["--selector", "zone=nowhere"]);
    for i in 0..30 {
        let (c, _, err) = run(&hub, &["submit", "parked", &format!("task {i}")]);
        assert_eq!(c, 0, "{err}");
    }
    let config = tmp.path().join("client.toml");
    let mut panics = 0;
    for args in [
        &["tasks"][..],
        &["tasks", "-o", "json"],
        &["ps", "--all"],
        &["nests"],
        &["completions", "bash"],
    ] {
        let (c, err) = run_into_closed_pipe(&config, args);
        if c == 101 || err.contains("panicked") {
            panics += 1;
        }
        assert_eq!(
            c, 0,
            "agen {args:?} into a closed pipe: exit {c}, stderr: {err}"
        );
        assert!(
            !err.contains("Broken pipe") && !err.contains("panicked"),
            "agen {args:?} is quiet about a closed pipe: {err}"
        );
    }
    assert_eq!(panics, 0);

    // Piped: plain columns, no box drawing, ids whole.
    let (c, out, _) = run(&hub, &["tasks"]);
    assert_eq!(c, 0);
    let boxes: Vec<char> = out
        .chars()
        .filter(|ch| ('\u{2500}'..='\u{257f}').contains(ch))
        .collect();
    assert_eq!(boxes.len(), 0, "no box borders when piped:\n{out}");
    let header = out.lines().next().unwrap_or("");
    assert!(header.starts_with("TASK"), "{out}");
    let tasks = hub.cli_json(&["tasks", "-o", "json"]).unwrap();
    for t in tasks.as_array().unwrap() {
        let id = t["task"].as_str().unwrap();
        assert!(
            out.lines().any(|l| l.split_whitespace().next() == Some(id)),
            "{id} starts a line of\n{out}"
        );
    }
}

#[test]
fn submit_json_is_an_object_yaml_works_and_completions_exist_for_three_shells() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [{"reply": "ok"}]}),
    )
    .unwrap();
    let dir = tmp.path().join("bundle");
    bundle(&dir, &model);
    deploy(&hub, &dir, "parked", &["--selector", "zone=nowhere"]);

    let v = hub
        .cli_json(&["submit", "parked", "hello", "-o", "json"])
        .unwrap();
    assert!(v.is_object(), "submit -o json prints an object: {v}");
    assert_eq!(v["deployment"], "parked");
    assert_eq!(v["state"], "queued");
    let id = v["task"].as_str().unwrap().to_owned();
    assert!(!id.is_empty(), "{v}");
    // Table output stays the id alone.
    let (c, out, _) = run(&hub, &["submit", "parked", "hello"]);
    assert_eq!(c, 0);
    assert_eq!(out.lines().count(), 1, "{out}");

    let (c, yaml, err) = run(&hub, &["query", &id, "-o", "yaml"]);
    assert_eq!(c, 0, "{err}");
    assert!(yaml.contains(&format!("task: {id}")), "{yaml}");
    assert!(yaml.contains("state: queued"), "{yaml}");
    assert!(
        !yaml.trim_start().starts_with('{'),
        "yaml, not json: {yaml}"
    );
    let (c, yaml, _) = run(&hub, &["tasks", "-o", "yaml"]);
    assert_eq!(c, 0);
    assert!(yaml.trim_start().starts_with("- "), "a yaml list: {yaml}");

    for (shell, marker) in [
        ("bash", "complete -F _agen"),
        ("zsh", "#compdef agen"),
        ("fish", "complete -c agen"),
    ] {
        let (c, script, err) = run(&hub, &["completions", shell]);
        assert_eq!(c, 0, "{shell}: {err}");
        assert!(script.contains(marker), "{shell} script lacks {marker:?}");
        for sub in ["deploy", "rollback", "history", "scale"] {
            assert!(script.contains(sub), "{shell} completes {sub}");
        }
    }
    let (c, _, _) = run(&hub, &["completions", "powershell-9000"]);
    assert_eq!(c, 2, "an unknown shell is a usage error");
}
