//! A side-effecting call cut off live is `effect_unknown` however it was cut off, and a
//! retry-safe one is sent again: the faults are real (a tool server killed -9 mid-call, a live
//! per-tool timeout), the executions are counted at the charge server
//! (`tests/peers/servers/charge_server.py`, one fsynced line per real execution) or the ledger
//! server, and what the model was told is read from the fake model's record of its requests.
//! Every campaign ends in counts (executed 0/1/2+) and asserts 2+ == 0 and that no executed call
//! was reported to the model as not run ("cannot run", "not connected", "cancelled").
//! `tests/soak/chaos.sh` runs longer campaigns (`AGEN_SOAK_TOOL_KILLS`,
//! `AGEN_SOAK_TOOL_TIMEOUTS`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agen_tests::{mcp_json, processes_under, wait_for, write_bundle, FakeModel, HubProcess, Peers};
use serde_json::{json, Value};

use super::chaos::{assert_safe, fleet_on_with_config, tail, wait_charges};

/// What an executed call must never be reported as.
const NOT_RUN_WORDS: [&str; 3] = ["cannot run", "not connected", "cancelled"];

/// Kills per `agen run` campaign and live timeouts in CI; the soak runs more.
const TOOL_KILLS: usize = 6;
const TOOL_TIMEOUTS: usize = 10;

fn from_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Every tool result the fake model was sent, in every request it recorded.
fn tool_messages(requests: &Path) -> Vec<String> {
    std::fs::read_to_string(requests)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .flat_map(|r| {
            r["body"]["messages"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Asserts that `message`, the result the model got for a call that executed, says it may
/// have run or is the tool's answer, and never that it was not run.
fn assert_told_maybe_ran(message: &str, context: &str) {
    for word in NOT_RUN_WORDS {
        assert!(
            !message.contains(word),
            "an executed call was reported with {word:?}: {message}\n{context}"
        );
    }
    assert!(
        message.starts_with("effect_unknown: the call to pay_charge was interrupted")
            || message == "charged 5",
        "{message}\n{context}"
    );
}

#[test]
fn a_live_timeout_of_a_side_effecting_call_tells_the_model_effect_unknown() {
    let n = from_env("AGEN_SOAK_TOOL_TIMEOUTS", TOOL_TIMEOUTS);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_owned();
    let hub = HubProcess::start(&root).unwrap();
    // Each charge takes 3 s; the tool's own timeout is 1 s: every call is cut off live after
    // the server charged.
    let f = fleet_on_with_config(
        hub,
        root.clone(),
        &["nest-a"],
        &[],
        1,
        u32::try_from(n).unwrap(),
        3.0,
        0,
        Some(json!({"tools": {"pay.charge": {"timeout": "1s"}}})),
    );
    let tasks: Vec<String> = (0..n)
        .map(|i| f.submit(&format!("charge customer {i}")))
        .collect();
    let c = f.settle(&tasks, Duration::from_secs(120));
    eprintln!(
        "live timeouts: executed 0/1/2+ = {}/{}/{}",
        c.charged_0, c.charged_1, c.charged_2_or_more
    );
    assert_safe(&f, &c);
    assert_eq!(
        (c.succeeded, c.charged_1),
        (n, n),
        "every task ran its charge once: {c:?}"
    );
    for t in &tasks {
        let q = f.query(t).unwrap();
        let result = q["outcome"]["result"].as_str().unwrap_or_default();
        assert_told_maybe_ran(result.trim_start_matches("paid: "), &format!("{q}"));
        assert!(result.ends_with("(no answer within 1s)"), "{result}");
        assert_eq!(q["attempt"], 1, "cut off live, not resumed: {q}");
    }
    let told = tool_messages(&root.join("model-requests.jsonl"));
    assert_eq!(told.len(), n, "{told:?}");
    for m in &told {
        assert_told_maybe_ran(m, "");
    }
}

#[test]
fn a_tool_server_killed_mid_call_in_a_fleet_never_makes_a_charge_look_not_run() {
    let rounds = from_env("AGEN_SOAK_TOOL_KILL_ROUNDS", 2);
    let per_round = 3;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_owned();
    let hub = HubProcess::start(&root).unwrap();
    let f = fleet_on_with_config(
        hub,
        root.clone(),
        &["nest-a"],
        &[],
        1,
        per_round,
        30.0,
        0,
        None,
    );
    let mut tasks = Vec::new();
    for round in 0..rounds {
        for i in 0..per_round {
            tasks.push(f.submit(&format!("charge customer {round}/{i}")));
        }
        wait_charges(&f, tasks.len());
        let servers: Vec<u32> = f.nests[0]
            .descendants()
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|c| String::from_utf8_lossy(&c).contains("charge_server.py"))
                    .unwrap_or(false)
            })
            .collect();
        assert_eq!(servers.len(), 1, "one charge server: {servers:?}");
        kill9(servers[0]);
    }
    let c = f.settle(&tasks, Duration::from_secs(180));
    eprintln!(
        "tool server kills (fleet): executed 0/1/2+ = {}/{}/{}",
        c.charged_0, c.charged_1, c.charged_2_or_more
    );
    assert_safe(&f, &c);
    assert_eq!(c.charged_1, tasks.len(), "{c:?}");
    for t in &tasks {
        let q = f.query(t).unwrap();
        let result = q["outcome"]["result"].as_str().unwrap_or_default();
        assert_eq!(q["state"], "succeeded", "{q}");
        assert_told_maybe_ran(result.trim_start_matches("paid: "), &format!("{q}"));
    }
    for m in tool_messages(&root.join("model-requests.jsonl")) {
        assert_told_maybe_ran(&m, &tail(&f.hub_log(), 40));
    }
}

fn kill9(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// A number in `0..n` that differs from call to call.
fn jitter(n: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    u64::from(nanos) % n.max(1)
}

/// The processes under `bundle` (cwd) whose command line names `script`.
fn server_pids(bundle: &Path, script: &str) -> Vec<u32> {
    processes_under(bundle)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(script))
                .unwrap_or(false)
        })
        .collect()
}

/// `agen run DIR go` with its state in `state`, killed (its process group) if it runs past
/// `limit`; returns its exit code and stderr.
struct Run(std::process::Child);

impl Run {
    fn start(dir: &Path, state: &Path) -> Run {
        use std::os::unix::process::CommandExt;
        let child = Command::new(agen_tests::agen_bin())
            .args(["run", dir.to_str().unwrap(), "go"])
            .env("XDG_STATE_HOME", state)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("agen run starts");
        Run(child)
    }

    fn finish(mut self, limit: Duration) -> (Option<i32>, String, String) {
        let deadline = Instant::now() + limit;
        while self.0.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let pgid = self.0.id();
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pgid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        use std::io::Read;
        let (mut stdout, mut stderr) = (String::new(), String::new());
        if let Some(mut o) = self.0.stdout.take() {
            let _ = o.read_to_string(&mut stdout);
        }
        if let Some(mut e) = self.0.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        let code = self.0.wait().ok().and_then(|s| s.code());
        (code, stdout, stderr)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.0.wait();
    }
}

#[test]
fn a_tool_server_killed_at_any_moment_reports_an_executed_charge_as_effect_unknown() {
    let trials = from_env("AGEN_SOAK_TOOL_KILLS", TOOL_KILLS);
    let tmp = tempfile::tempdir().unwrap();
    let mut executed = [0usize; 3];
    for trial in 0..trials {
        let root = tmp.path().join(format!("trial-{trial}"));
        let requests = root.join("model-requests.jsonl");
        let log = root.join("charges.jsonl");
        let script = json!({"record": requests, "steps": [
            {"tool_calls": [{"name": "pay_charge", "arguments": {"amount": 5, "seconds": 1.5}}]},
            {"reply": "done"}
        ]});
        let model = FakeModel::start(&root.join("model"), &script).unwrap();
        let dir = root.join("bundle");
        write_bundle(
            &dir,
            &[
                (
                    "mcp.json",
                    mcp_json(&[(
                        "pay",
                        json!({"command": Peers::python(), "args": [Peers::script("servers/charge_server.py")], "env": {"CHARGE_LOG": log}}),
                    )]),
                ),
                (
                    "x-agen/agent.md",
                    format!(
                        "---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou bill customers.\n",
                        model.base_url()
                    ),
                ),
            ],
        )
        .unwrap();
        let run = Run::start(&dir, &root.join("state"));
        let server = wait_for("the charge server", Duration::from_secs(30), || {
            server_pids(&dir, "charge_server.py").first().copied()
        })
        .unwrap();
        // One trial in three anywhere from its start (mostly before the call is sent), the
        // others once the charge ran, then at once (mid-call) or within 0-2 s (mid-call or
        // after its answer).
        if trial % 3 == 0 {
            std::thread::sleep(Duration::from_millis(jitter(2_500)));
        } else {
            wait_for("the charge", Duration::from_secs(30), || {
                a_charge_is_logged(&log).then_some(())
            })
            .unwrap();
            if trial % 3 == 2 {
                std::thread::sleep(Duration::from_millis(jitter(2_000)));
            }
        }
        kill9(server);
        let (code, stdout, stderr) = run.finish(Duration::from_secs(60));
        assert_eq!(code, Some(0), "trial {trial}: {stderr}");
        assert_eq!(stdout.trim(), "done", "trial {trial}: {stderr}");
        let n = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .count();
        executed[n.min(2)] += 1;
        if n > 0 {
            let told = tool_messages(&requests);
            assert_eq!(told.len(), 1, "trial {trial}: {told:?}");
            assert_told_maybe_ran(&told[0], &format!("trial {trial}"));
        }
    }
    eprintln!(
        "tool server kills (agen run): executed 0/1/2+ = {}/{}/{}",
        executed[0], executed[1], executed[2]
    );
    assert_eq!(executed[2], 0, "a charge ran twice");
}

#[test]
fn an_idempotent_call_cut_off_by_its_server_dying_is_sent_again_live_after_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("ledger.jsonl");
    let requests = tmp.path().join("model-requests.jsonl");
    let script = json!({"record": requests, "steps": [
        {"tool_calls": [{"name": "ledger_put", "arguments": {"key": "k", "value": "v", "seconds": 30}}]},
        {"reply": "done"}
    ]});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let dir = tmp.path().join("bundle");
    write_bundle(
        &dir,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "ledger",
                    json!({"command": Peers::python(), "args": [Peers::script("servers/ledger_server.py")], "env": {"LEDGER_LOG": log}}),
                )]),
            ),
            (
                "x-agen/agent.md",
                format!(
                    "---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou store things.\n",
                    model.base_url()
                ),
            ),
            // No `retries`: a call cut off by its server's death is sent again by default.
            (
                "x-agen/config.json",
                json!({"tools": {"ledger.put": {"backoff": "200ms"}}}).to_string(),
            ),
        ],
    )
    .unwrap();
    let puts = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"put\""))
            .count()
    };
    let run = Run::start(&dir, &tmp.path().join("state"));
    // The first put sleeps 30 s (the ledger server sleeps only on a tool's first call).
    wait_for("the first put", Duration::from_secs(30), || {
        (puts() == 1).then_some(())
    })
    .unwrap();
    let first = server_pids(&dir, "ledger_server.py");
    assert_eq!(first.len(), 1, "{first:?}");
    kill9(first[0]);
    let began = Instant::now();
    let (code, stdout, stderr) = run.finish(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.trim(), "done", "{stderr}");
    assert!(
        began.elapsed() < Duration::from_secs(20),
        "answered by the restarted server, not after the first call's 30 s"
    );
    // Sent twice (idempotent: harmless), answered the second time, in the same run.
    assert_eq!(puts(), 2);
    let told = tool_messages(&requests);
    assert_eq!(told, vec!["stored k".to_string()], "{stderr}");
}

/// A `url` server whose connection is lost mid-call (the server killed -9 while the charge
/// sleeps): the charge ran once and the model is told it may have run, never that it did not.
#[test]
fn a_lost_connection_to_a_url_server_mid_call_is_effect_unknown() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("charges.jsonl");
    let port_file = tmp.path().join("port");
    let requests = tmp.path().join("model-requests.jsonl");
    let mut server = Command::new(Peers::python())
        .arg(Peers::script("servers/charge_server.py"))
        .arg("--http")
        .arg(&port_file)
        .env("CHARGE_LOG", &log)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the charge server starts");
    let port = wait_for("the charge server's port", Duration::from_secs(30), || {
        std::fs::read_to_string(&port_file).ok()
    })
    .unwrap();
    let script = json!({"record": requests, "steps": [
        {"tool_calls": [{"name": "pay_charge", "arguments": {"amount": 5, "seconds": 30}}]},
        {"reply": "done"}
    ]});
    let model = FakeModel::start(&tmp.path().join("model"), &script).unwrap();
    let dir = tmp.path().join("bundle");
    write_bundle(
        &dir,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "pay",
                    json!({"url": format!("http://127.0.0.1:{}/mcp", port.trim())}),
                )]),
            ),
            (
                "x-agen/agent.md",
                format!(
                    "---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou bill customers.\n",
                    model.base_url()
                ),
            ),
        ],
    )
    .unwrap();
    let run = Run::start(&dir, &tmp.path().join("state"));
    let charged = wait_for("the charge", Duration::from_secs(30), || {
        a_charge_is_logged(&log).then_some(())
    });
    kill9(server.id());
    let _ = server.wait();
    charged.unwrap();
    let (code, stdout, stderr) = run.finish(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.trim(), "done", "{stderr}");
    let executed = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .count();
    eprintln!("url connection lost mid-call: executed {executed}");
    assert_eq!(executed, 1, "the charge ran once");
    let told = tool_messages(&requests);
    assert_eq!(told.len(), 1, "{told:?}\n{stderr}");
    assert_told_maybe_ran(&told[0], &stderr);
}

/// Whether the charge server has written (and fsynced) a whole line: it opens the log before it
/// writes, so the file existing is not yet a charge.
fn a_charge_is_logged(log: &std::path::Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|s| s.ends_with('\n'))
}
