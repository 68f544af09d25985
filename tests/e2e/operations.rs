//! Day-2 operations of the Hub (issue 21, items 1, 4 and 5) through the shipped `agen`
//! binary: task retention, snapshot and restore, ended Nests and instances hidden after a
//! while, and `agen nests -w`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agen_tests::{
    agen_bin, free_port, mcp_json, wait_for, write_bundle, FakeModel, HubProcess, Proc,
};
use serde_json::{json, Value};

/// A bundle with no tool servers whose model is the fake model.
fn bundle(dir: &Path, model: &FakeModel) {
    write_bundle(
        dir,
        &[
            ("mcp.json", mcp_json(&[])),
            (
                "x-agen/agent.md",
                format!(
                    "---\nname: ops-agent\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou answer.\n",
                    model.base_url()
                ),
            ),
        ],
    )
    .expect("write bundle");
}

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

/// Deploys a fake-model agent as `ops` and returns its model (kept alive by the caller).
fn deploy_ops(hub: &HubProcess, dir: &Path, replies: usize) -> FakeModel {
    let steps: Vec<Value> = (0..replies)
        .map(|i| json!({"reply": format!("answer {i}")}))
        .collect();
    let model = FakeModel::start(&dir.join("model"), &json!({ "steps": steps })).unwrap();
    let b = dir.join("bundle");
    bundle(&b, &model);
    ok(
        hub,
        &["deploy", b.to_str().unwrap(), "--name", "ops", "--wait"],
    );
    model
}

/// Submits and waits; returns the task id.
fn finished_task(hub: &HubProcess, input: &str) -> String {
    let v = hub
        .cli_json(&["submit", "ops", input, "--wait", "-o", "json"])
        .unwrap();
    assert_eq!(v["state"], "succeeded", "{v}");
    v["task_id"].as_str().unwrap().to_owned()
}

fn query_code(hub: &HubProcess, id: &str) -> i32 {
    hub.cli(&["query", id, "-o", "json"])
        .unwrap()
        .status
        .code()
        .unwrap_or(-1)
}

#[test]
fn retention_removes_an_old_finished_task_and_keeps_a_young_one() {
    let tmp = tempfile::tempdir().unwrap();
    let hub =
        HubProcess::start_with_args(tmp.path(), free_port(), "3s", &["--task-retention", "5s"])
            .unwrap();
    let _nest = hub.nest("keeper", &[], &[]).unwrap();
    let _model = deploy_ops(&hub, tmp.path(), 4);
    let old = finished_task(&hub, "old");
    let old_done = Instant::now();
    // Young enough to outlive the old one by about three seconds.
    while old_done.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let young = finished_task(&hub, "young");
    assert_eq!(
        query_code(&hub, &old),
        0,
        "the old task is kept until its retention"
    );

    wait_for(
        "the old task to be removed",
        Duration::from_secs(20),
        || (query_code(&hub, &old) == 4).then_some(()),
    )
    .unwrap();
    let kept = query_code(&hub, &young);
    let listed = hub.cli_json(&["tasks", "-o", "json"]).unwrap();
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["task_id"].as_str())
        .collect();
    let counts = (
        ids.contains(&old.as_str()) as u32,
        ids.contains(&young.as_str()) as u32,
    );
    assert_eq!(
        kept, 0,
        "the young task is still served when the old one is gone"
    );
    assert_eq!(
        counts,
        (0, 1),
        "agen tasks lists the young task only: {listed}"
    );
    assert!(
        hub.proc
            .log_text()
            .contains("removed finished tasks past their retention"),
        "the sweep logs what it removed"
    );
}

/// `agen secrets set NAME` with the value on stdin.
fn set_secret(hub: &HubProcess, name: &str, value: &str) {
    use std::io::Write;
    let mut child = Command::new(agen_bin())
        .args(["secrets", "set", name])
        .env("AGEN_CONFIG", hub.dir.join("client.toml"))
        .env_remove("AGEN_HUB")
        .env_remove("AGEN_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
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
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_snapshot_restored_into_a_fresh_data_dir_serves_the_old_tasks_and_secrets() {
    let tmp = tempfile::tempdir().unwrap();
    let first = tmp.path().join("first");
    let mut hub = HubProcess::start(&first).unwrap();
    let mut nest = hub.nest("snap", &[], &[]).unwrap();
    let _model = deploy_ops(&hub, &first, 2);
    let task = finished_task(&hub, "remember me");
    let result = hub.cli_json(&["query", &task, "-o", "json"]).unwrap();
    set_secret(&hub, "API_KEY", "s3cret-value");

    let file = tmp.path().join("hub.snapshot");
    let key = tmp.path().join("snapshot.key");
    ok(&hub, &["hub", "snapshot-key", "new", key.to_str().unwrap()]);
    ok(
        &hub,
        &[
            "hub",
            "snapshot",
            file.to_str().unwrap(),
            "--snapshot-key-file",
            key.to_str().unwrap(),
        ],
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the snapshot holds the secret key: private");
    nest.proc.stop(Duration::from_secs(10));
    hub.proc.stop(Duration::from_secs(10));

    // A fresh data dir, restored offline, then served by a new Hub.
    let second = tmp.path().join("second");
    let out = Command::new(agen_bin())
        .args(["hub", "--data-dir"])
        .arg(second.join("hub"))
        .arg("restore")
        .arg(&file)
        .arg("--snapshot-key-file")
        .arg(&key)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in ["secret.key", "admin-token", "tls/ca.key"] {
        assert_eq!(
            std::fs::read(first.join("hub").join(f)).unwrap(),
            std::fs::read(second.join("hub").join(f)).unwrap(),
            "{f} restored"
        );
    }
    let restored = HubProcess::start(&second).unwrap();
    let again = restored.cli_json(&["query", &task, "-o", "json"]).unwrap();
    assert_eq!(again["state"], "succeeded");
    assert_eq!(
        again["outcome"]["result"], result["outcome"]["result"],
        "{again}"
    );
    assert!(
        again["outcome"]["result"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{again}"
    );
    let secrets = restored.cli_json(&["secrets", "ls", "-o", "json"]).unwrap();
    assert!(
        secrets.to_string().contains("API_KEY"),
        "the secret is listed: {secrets}"
    );
    // The old store's records are all there: its deployment too.
    let ps = restored.cli_json(&["ps", "-o", "json"]).unwrap();
    assert!(ps.to_string().contains("\"ops\""), "{ps}");

    // A restore into the data dir of a running Hub is refused (sled's lock), nothing replaced.
    let out = Command::new(agen_bin())
        .args(["hub", "--data-dir"])
        .arg(second.join("hub"))
        .arg("restore")
        .arg(&file)
        .arg("--snapshot-key-file")
        .arg(&key)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a restore under a running Hub must fail"
    );
}

#[test]
fn a_lost_nest_and_its_instance_are_hidden_after_a_while_and_still_shown_on_request() {
    let tmp = tempfile::tempdir().unwrap();
    let hub =
        HubProcess::start_with_args(tmp.path(), free_port(), "1s", &["--hide-ended-after", "2s"])
            .unwrap();
    let mut nest = hub.nest("fleeting", &[], &[]).unwrap();
    let _model = deploy_ops(&hub, tmp.path(), 1);
    ok(&hub, &["nests", "revoke", "fleeting"]);
    nest.proc.kill9();

    let names = |args: &[&str]| -> Vec<String> {
        hub.cli_json(args)
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                v["name"]
                    .as_str()
                    .or(v["nest"].as_str())
                    .unwrap_or("")
                    .to_owned()
            })
            .collect()
    };
    wait_for("the nest to be hidden", Duration::from_secs(30), || {
        names(&["nests", "-o", "json"]).is_empty().then_some(())
    })
    .unwrap();
    let all = hub.cli_json(&["nests", "--all", "-o", "json"]).unwrap();
    let shown: Vec<&Value> = all.as_array().unwrap().iter().collect();
    assert_eq!(shown.len(), 1, "--all still shows it: {all}");
    assert_eq!(shown[0]["state"], "lost");
    assert_eq!(shown[0]["revoked"], true, "its revocation is kept: {all}");

    // Its replacement waits (pending) for a Nest; the lost one is hidden.
    wait_for(
        "its lost instance to be hidden",
        Duration::from_secs(30),
        || {
            let list = hub.instances().ok()?;
            (!list.is_empty() && list.iter().all(|i| i["state"] != "lost")).then_some(())
        },
    )
    .unwrap();
    let ended = hub
        .cli_json(&["ps", "--all", "--ended", "-o", "json"])
        .unwrap();
    let states: Vec<&str> = ended
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["state"].as_str())
        .filter(|s| *s == "lost")
        .collect();
    assert_eq!(states, ["lost"], "--ended shows the lost instance: {ended}");
}

#[test]
fn nests_watch_prints_a_new_table_when_a_nest_joins_and_when_it_is_cordoned() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let mut watcher = Command::new(agen_bin())
        .args(["nests", "-w"])
        .env("AGEN_CONFIG", hub.dir.join("client.toml"))
        .env_remove("AGEN_HUB")
        .env_remove("AGEN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let lines = lines.clone();
        let out = watcher.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(l);
            }
        })
    };
    let seen = |needle: &str| -> usize {
        lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    };
    wait_for("the first table", Duration::from_secs(10), || {
        (seen("no nests have joined") == 1).then_some(())
    })
    .unwrap();
    let _nest = hub.nest("watched", &[], &[]).unwrap();
    wait_for("a table with the nest", Duration::from_secs(10), || {
        (seen("watched") >= 1).then_some(())
    })
    .unwrap();
    ok(&hub, &["nests", "cordon", "watched"]);
    wait_for("a table with the cordon", Duration::from_secs(10), || {
        (seen("cordoned") >= 1).then_some(())
    })
    .unwrap();
    // Piped: every table starts with its header line.
    let headers = seen("NAME");
    assert!(
        headers >= 2,
        "a new table per change: {:?}",
        lines.lock().unwrap()
    );

    // Ctrl-C ends it with exit 0.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(watcher.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = watcher.wait().unwrap();
    reader.join().unwrap();
    assert_eq!(status.code(), Some(0), "Ctrl-C ends the watch with exit 0");
}

#[test]
fn nests_watch_with_json_output_prints_one_json_document_per_line() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let mut watcher = Command::new(agen_bin())
        .args(["nests", "-w", "-o", "json"])
        .env("AGEN_CONFIG", hub.dir.join("client.toml"))
        .env_remove("AGEN_HUB")
        .env_remove("AGEN_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let lines = lines.clone();
        let out = watcher.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(l);
            }
        })
    };
    let _nest = hub.nest("jsonl", &[], &[]).unwrap();
    wait_for("a document with the nest", Duration::from_secs(10), || {
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("jsonl"))
            .then_some(())
    })
    .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(watcher.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    assert_eq!(watcher.wait().unwrap().code(), Some(0));
    reader.join().unwrap();
    let lines = lines.lock().unwrap();
    assert!(
        lines.len() >= 2,
        "the empty list, then the list with the nest: {lines:?}"
    );
    for line in lines.iter() {
        let doc: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("every line is one JSON document ({e}): {line:?}"));
        assert!(doc.is_array(), "each document is the whole list: {line}");
    }
}

/// Collects the datagrams sent to a `NOTIFY_SOCKET` bound by the test.
struct NotifySocket {
    path: std::path::PathBuf,
    got: Arc<Mutex<Vec<String>>>,
}

impl NotifySocket {
    fn bind(dir: &Path) -> NotifySocket {
        let path = dir.join("notify.sock");
        let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let sink = got.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            while let Ok(n) = sock.recv(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                sink.lock().unwrap().extend(text.lines().map(str::to_owned));
            }
        });
        NotifySocket { path, got }
    }

    fn count(&self, prefix: &str) -> usize {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with(prefix))
            .count()
    }

    /// Waits for `at_least` lines starting with `prefix` from `sender` (whose log the failure shows).
    fn wait(&self, prefix: &str, at_least: usize, sender: &Proc) {
        wait_for(prefix, Duration::from_secs(20), || {
            (self.count(prefix) >= at_least).then_some(())
        })
        .unwrap_or_else(|e| {
            panic!(
                "{e}: got {:?}; {} log:\n{}",
                self.got.lock().unwrap(),
                sender.name,
                sender.log_text()
            )
        });
    }
}

fn sigterm(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

#[test]
fn the_hub_and_a_nest_speak_the_systemd_notify_protocol_and_the_nest_starts_without_its_hub() {
    let tmp = tempfile::tempdir().unwrap();
    // A Hub to take a join token from; it is stopped before the Nest starts.
    let mut first = HubProcess::start(&tmp.path().join("first")).unwrap();
    let join = first.dir.join("hub/join-token");
    let hub_url = first.url();
    first.proc.stop(Duration::from_secs(10));

    let hub_sock = NotifySocket::bind(tmp.path());
    let port = free_port();
    let mut cmd = Command::new(agen_bin());
    cmd.args(["hub", "--data-dir"])
        .arg(tmp.path().join("second"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("AGEN_CONFIG", tmp.path().join("second.toml"))
        .env("NOTIFY_SOCKET", &hub_sock.path)
        .env("WATCHDOG_USEC", "1000000");
    let mut hub = Proc::spawn("hub", cmd, &tmp.path().join("hub.log")).unwrap();
    hub_sock.wait("READY=1", 1, &hub);
    hub_sock.wait("STATUS=listening at https://127.0.0.1:", 1, &hub);
    hub_sock.wait("STATUS=serving; 0 nests ready", 1, &hub);
    // 1s watchdog: a pet every half second from the reconcile loop.
    hub_sock.wait("WATCHDOG=1", 3, &hub);
    sigterm(hub.pid());
    // The TLS listener ends on the same token as tonic's shutdown signal; STOPPING=1 must come
    // whichever of the two the server sees first.
    hub_sock.wait("STOPPING=1", 1, &hub);
    let status = hub.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "a SIGTERMed Hub stops cleanly");

    // The Nest's Hub is down: it is ready anyway and says why it waits.
    let nest_dir = tmp.path().join("nest");
    std::fs::create_dir_all(&nest_dir).unwrap();
    let nest_sock = NotifySocket::bind(&nest_dir);
    let mut cmd = Command::new(agen_bin());
    cmd.args(["nest", "--hub", &hub_url, "--join-file"])
        .arg(&join)
        .args(["--name", "alone", "--data-dir"])
        .arg(nest_dir.join("data"))
        .env("NOTIFY_SOCKET", &nest_sock.path)
        .env("WATCHDOG_USEC", "1000000");
    let mut nest = Proc::spawn("nest", cmd, &tmp.path().join("nest.log")).unwrap();
    nest_sock.wait("READY=1", 1, &nest);
    nest_sock.wait("STATUS=Hub unreachable, retrying", 1, &nest);
    nest_sock.wait("WATCHDOG=1", 3, &nest);
    sigterm(nest.pid());
    nest_sock.wait("STOPPING=1", 1, &nest);
    let status = nest.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "a SIGTERMed Nest stops cleanly");
}
