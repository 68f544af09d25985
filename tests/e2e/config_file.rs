//! The daemons' configuration (issue 42, item 4) through the shipped `agen` binary: a config
//! file sets flags, a variable wins over it and a flag over both (`agen hub config` shows each
//! value's source), an unknown key exits 64 naming it, and SIGHUP changes the log level and
//! the task retention of a running Hub without a restart while a run is in flight.

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use agen_tests::{agen_bin, free_port, mcp_json, wait_for, write_bundle, FakeModel, HubProcess};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

/// `agen ARGS` with `env` and nothing of the test's own Agen variables.
fn agen(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(agen_bin());
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("AGEN_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied()).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The line of `key` in `agen hub config`'s output.
fn line_of<'a>(config: &'a str, key: &str) -> &'a str {
    config
        .lines()
        .find(|l| l.starts_with(&format!("{key} = ")))
        .unwrap_or_else(|| panic!("no {key} in:\n{config}"))
}

#[test]
fn a_config_file_sets_a_flag_env_overrides_the_file_and_a_flag_overrides_env() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("hub.toml");
    std::fs::write(
        &file,
        "nest-ttl = \"7s\"\nmax-labels = 9\nstore = \"postgres://agen:hunter2@db/agen\"\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();

    let out = agen(&["hub", "--config", f, "config"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let config = text(&out.stdout);
    assert_eq!(
        line_of(&config, "nest-ttl"),
        "nest-ttl = \"7s\"  # file, AGEN_HUB_NEST_TTL"
    );
    assert_eq!(
        line_of(&config, "max-labels"),
        "max-labels = 9  # file, AGEN_HUB_MAX_LABELS"
    );
    assert_eq!(
        line_of(&config, "heartbeat-interval"),
        "heartbeat-interval = \"2s\"  # default, AGEN_HUB_HEARTBEAT_INTERVAL"
    );
    assert!(
        !config.contains("hunter2"),
        "a secret is never printed:\n{config}"
    );

    let env = [("AGEN_HUB_NEST_TTL", "5s")];
    let out = agen(&["hub", "--config", f, "config"], &env);
    assert_eq!(
        line_of(&text(&out.stdout), "nest-ttl"),
        "nest-ttl = \"5s\"  # environment, AGEN_HUB_NEST_TTL"
    );
    let out = agen(&["hub", "--config", f, "--nest-ttl", "3s", "config"], &env);
    assert_eq!(
        line_of(&text(&out.stdout), "nest-ttl"),
        "nest-ttl = \"3s\"  # flag, AGEN_HUB_NEST_TTL"
    );
    // The file may also come from the variable.
    let out = agen(&["hub", "config"], &[("AGEN_HUB_CONFIG", f)]);
    assert_eq!(
        line_of(&text(&out.stdout), "max-labels"),
        "max-labels = 9  # file, AGEN_HUB_MAX_LABELS"
    );
    // The Nest: the Hub URL from the file, the join token never printed.
    let nest_file = tmp.path().join("nest.toml");
    std::fs::write(
        &nest_file,
        "hub = \"https://hub.example:7443\"\nlabel = [\"zone=eu-1\"]\njoin = \"agen1.secret\"\n",
    )
    .unwrap();
    let out = agen(
        &["nest", "--config", nest_file.to_str().unwrap(), "config"],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let config = text(&out.stdout);
    assert_eq!(
        line_of(&config, "label"),
        "label = [\"zone=eu-1\"]  # file, AGEN_NEST_LABEL"
    );
    assert_eq!(
        line_of(&config, "hub"),
        "hub = \"https://hub.example:7443\"  # file, AGEN_HUB"
    );
    assert!(!config.contains("agen1.secret"), "{config}");
}

#[test]
fn an_unknown_config_key_stops_the_daemons_with_exit_64_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("bad.toml");
    std::fs::write(&file, "retention = \"3d\"\n").unwrap();
    let data = tmp.path().join("data");
    for daemon in ["hub", "nest"] {
        let out = agen(
            &[
                daemon,
                "--config",
                file.to_str().unwrap(),
                "--data-dir",
                data.to_str().unwrap(),
            ],
            &[],
        );
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "agen {daemon}: {err}");
        assert!(
            err.contains("unknown key `retention`") && err.contains("bad.toml"),
            "agen {daemon}: {err}"
        );
    }
    assert!(!data.exists(), "nothing was started");
}

fn bundle(dir: &Path, model: &FakeModel) {
    write_bundle(
        dir,
        &[
            ("mcp.json", mcp_json(&[])),
            (
                "x-agen/agent.md",
                format!(
                    "---\nname: cfg-agent\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou answer.\n",
                    model.base_url()
                ),
            ),
        ],
    )
    .unwrap();
}

/// A failed TLS handshake: the Hub logs it at debug only.
fn bad_handshake(port: u16) {
    if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
        let _ = s.write_all(b"this is not TLS\r\n\r\n");
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
}

#[test]
fn sighup_changes_the_log_level_and_the_task_retention_with_a_run_in_flight() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("hub.toml");
    std::fs::write(
        &file,
        "log-level = \"info\"\ntask-retention = \"1h\"\nmax-labels = 64\n",
    )
    .unwrap();
    let hub = HubProcess::start_with_args(
        tmp.path(),
        free_port(),
        "3s",
        &["--config", file.to_str().unwrap()],
    )
    .unwrap();
    // Long before the reload: not logged at info.
    bad_handshake(hub.port);
    let _nest = hub.nest("cfg", &[], &[]).unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        // Every answer takes 5 s: the second task is in flight during the reload.
        &json!({"steps": [{"reply_template": "answer to {{last_user}}", "delay_ms": 5000}]}),
    )
    .unwrap();
    let b = tmp.path().join("bundle");
    bundle(&b, &model);
    let out = hub
        .cli(&["deploy", b.to_str().unwrap(), "--name", "cfg", "--wait"])
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let old = hub
        .cli_json(&["submit", "cfg", "old", "--wait", "-o", "json"])
        .unwrap();
    assert_eq!(old["state"], "succeeded", "{old}");
    let old = old["task_id"].as_str().unwrap().to_owned();
    let slow = text(&hub.cli(&["submit", "cfg", "slow"]).unwrap().stdout)
        .trim()
        .to_owned();
    let last = std::cell::RefCell::new(String::new());
    wait_for("the slow run to start", Duration::from_secs(30), || {
        let out = hub.cli(&["query", &slow, "-o", "json"]).ok()?;
        *last.borrow_mut() = format!("{}{}", text(&out.stdout), text(&out.stderr));
        let q: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        (q["state"] == "running").then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {}", last.borrow()));
    // Its end is awaited from now on (retention may remove it soon after it ends).
    let waiter = {
        let (dir, slow) = (tmp.path().join("client.toml"), slow.clone());
        std::thread::spawn(move || agen_tests::cli(&dir, &["wait", &slow, "-o", "json"]).unwrap())
    };

    std::fs::write(
        &file,
        "log-level = \"debug\"\ntask-retention = \"3s\"\nmax-labels = 32\n",
    )
    .unwrap();
    let hub_pid = hub.proc.pid();
    kill(Pid::from_raw(hub_pid as i32), Signal::SIGHUP).unwrap();
    wait_for("the reload to be logged", Duration::from_secs(20), || {
        hub.proc
            .log_text()
            .contains("applied without a restart")
            .then_some(())
    })
    .unwrap();
    let log = hub.proc.log_text();
    assert!(
        log.contains("applied without a restart: log-level info -> debug; task-retention 1h -> 3s"),
        "{log}"
    );
    assert!(
        log.contains("changed but applied only at a restart: max-labels 64 -> 32"),
        "{log}"
    );
    let before = log.matches("tls handshake failed").count();
    assert_eq!(before, 0, "at info the failed handshake is not logged");
    bad_handshake(hub.port);
    wait_for("a debug line", Duration::from_secs(10), || {
        (hub.proc.log_text().matches("tls handshake failed").count() > 0).then_some(())
    })
    .unwrap();

    // The new retention removes the old task; the run in flight is not interrupted.
    wait_for(
        "the old task to be removed",
        Duration::from_secs(30),
        || {
            let out = hub.cli(&["query", &old, "-o", "json"]).ok()?;
            (out.status.code() == Some(4)).then_some(())
        },
    )
    .unwrap();
    let waited = waiter.join().unwrap();
    let done: serde_json::Value = serde_json::from_slice(&waited.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&waited.stderr)));
    // One attempt: the run that was in flight during the reload was never interrupted.
    assert_eq!(
        (
            done["state"].as_str(),
            done["attempt"].as_u64(),
            done["outcome"]["result"].as_str()
        ),
        (Some("succeeded"), Some(1), Some("answer to slow")),
        "{done}"
    );
    assert_eq!(hub.proc.pid(), hub_pid);
    let mut hub = hub;
    assert!(
        hub.proc.child.try_wait().unwrap().is_none(),
        "the Hub still runs"
    );
}
