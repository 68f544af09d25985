//! The tool-server host against real MCP servers: third-party ones (PyPI `mcp-server-time`, npm
//! `@modelcontextprotocol/server-filesystem`) and our own small Python servers in
//! `tests/peers/servers/`. Peers must be installed by `tests/peers/install.sh` (into
//! `target/peers`); a missing peer fails the test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agen_harness::mcp::{CallError, Interruption, LaunchContext, NotSent, ServerProblem, ToolHost};
use agen_shared::bundle::Bundle;
use pretty_assertions::assert_eq;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

const AGEN_BIN: &str = "/opt/agen-test/bin/agen";
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .expect("nest/harness/ is two levels inside the repo")
        .to_path_buf()
}

fn peer(rel: &str) -> String {
    let p = repo().join("target/peers").join(rel);
    assert!(
        p.exists(),
        "{} is missing: run tests/peers/install.sh",
        p.display()
    );
    p.to_string_lossy().into_owned()
}

fn python() -> String {
    peer("venv/bin/python")
}

fn our_server(file: &str) -> String {
    repo()
        .join("tests/peers/servers")
        .join(file)
        .to_string_lossy()
        .into_owned()
}

/// A bundle folder with `mcp.json` = `servers`, a minimal `x-agen/agent.md`, and
/// `x-agen/secrets.json` declaring `secrets` (source env).
struct TestBundle {
    dir: tempfile::TempDir,
}

impl TestBundle {
    fn new(servers: Value, secrets: &[&str]) -> TestBundle {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("x-agen")).expect("x-agen dir");
        std::fs::write(
            dir.path().join("mcp.json"),
            json!({ "mcpServers": servers }).to_string(),
        )
        .expect("mcp.json");
        std::fs::write(
            dir.path().join("x-agen/agent.md"),
            "---\nname: tools-test\nmodel: openai/gpt-4.1-mini\n---\nYou test tools.\n",
        )
        .expect("agent.md");
        if !secrets.is_empty() {
            let decls: Map<String, Value> = secrets
                .iter()
                .map(|s| (s.to_string(), json!({"source": "env", "var": s})))
                .collect();
            std::fs::write(
                dir.path().join("x-agen/secrets.json"),
                Value::Object(decls).to_string(),
            )
            .expect("secrets.json");
        }
        TestBundle { dir }
    }

    fn load(&self) -> Bundle {
        Bundle::load(self.dir.path()).expect("test bundle loads")
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

fn ctx() -> LaunchContext {
    let mut c = LaunchContext::new(AGEN_BIN);
    c.start_timeout = Duration::from_secs(60);
    c
}

async fn start(bundle: &TestBundle, ctx: LaunchContext) -> ToolHost {
    ToolHost::start(&bundle.load(), ctx).await
}

async fn call(
    host: &ToolHost,
    name: &str,
    args: Value,
) -> Result<agen_harness::mcp::ToolOutput, CallError> {
    host.call(
        name,
        args,
        Map::new(),
        CALL_TIMEOUT,
        CancellationToken::new(),
    )
    .await
}

/// Polls `f` every 50 ms until it returns `Some`, or panics after `limit`.
async fn eventually<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `pid` is a live process (a zombie, killed but not yet reaped, is not).
fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the command name in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

fn meta_log_events(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn third_party_servers_load_and_answer() {
    let data = tempfile::tempdir().expect("data dir");
    std::fs::write(
        data.path().join("hello.txt"),
        "hello from the filesystem server",
    )
    .expect("write");
    let data_dir = data.path().canonicalize().expect("canonical data dir");
    let bundle = TestBundle::new(
        json!({
            "time": {"command": peer("venv/bin/mcp-server-time"), "args": ["--local-timezone", "UTC"]},
            "files": {
                "command": "node",
                "args": [peer("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"), data_dir],
            },
        }),
        &[],
    );
    let host = start(&bundle, ctx()).await;

    let status = host.status();
    assert_eq!(status.not_connected, vec![], "every server connects");
    let names: Vec<String> = host.tools().iter().map(|t| t.qualified_name()).collect();
    assert!(
        names.contains(&"time.get_current_time".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"time.convert_time".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"files.list_directory".to_string()),
        "{names:?}"
    );
    let time_tools = names.iter().filter(|n| n.starts_with("time.")).count();
    let file_tools = names.iter().filter(|n| n.starts_with("files.")).count();
    assert_eq!(time_tools, 2, "{names:?}");
    assert!(
        file_tools >= 10,
        "server-filesystem has a dozen tools, got {names:?}"
    );
    assert_eq!(status.tools_loaded as usize, names.len());
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "tools are sorted by qualified name");

    let now = call(&host, "time.get_current_time", json!({"timezone": "UTC"}))
        .await
        .expect("time call");
    assert!(!now.is_error && now.text.contains("UTC"), "{now:?}");
    let by_model_name = call(
        &host,
        "time_get_current_time",
        json!({"timezone": "Europe/Paris"}),
    )
    .await
    .expect("call");
    assert!(
        by_model_name.text.contains("Europe/Paris"),
        "{by_model_name:?}"
    );

    let listing = call(
        &host,
        "files_list_directory",
        json!({"path": data_dir.to_string_lossy()}),
    )
    .await
    .expect("fs call");
    assert!(listing.text.contains("hello.txt"), "{listing:?}");

    let unknown = call(&host, "files.no_such_tool", json!({})).await;
    assert!(
        matches!(unknown, Err(CallError::NotSent(NotSent::UnknownTool(_)))),
        "{unknown:?}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_servers_get_a_cleared_environment_and_run_in_the_bundle() {
    let bundle = TestBundle::new(
        json!({
            "env": {
                "command": python(),
                "args": ["env_server.py"],
                "env": {"DECLARED": "plain value", "CRM_AUTH": "Bearer ${CRM_TOKEN}"},
            },
            // A relative command found in the bundle runs from there.
            "local": {"command": "./server.sh"},
        }),
        &["CRM_TOKEN"],
    );
    std::fs::copy(
        our_server("env_server.py"),
        bundle.path().join("env_server.py"),
    )
    .expect("copy server");
    let script = bundle.path().join("server.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\nexec '{}' env_server.py\n", python()),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");

    let mut host_env: Vec<(String, String)> = std::env::vars().collect();
    host_env.push(("AGEN_CANARY".into(), "leaked".into()));
    host_env.push(("AWS_SECRET_ACCESS_KEY".into(), "host-credential".into()));
    host_env.push(("LC_MESSAGES".into(), "C".into()));
    let mut ctx = ctx();
    ctx.host_env = Some(host_env);
    ctx.secrets = BTreeMap::from([("CRM_TOKEN".to_string(), "s3cr3t".to_string())]);
    let host = start(&bundle, ctx).await;
    assert_eq!(host.status().not_connected, vec![]);

    let out = call(&host, "env.environment", json!({}))
        .await
        .expect("environment call");
    let env: BTreeMap<String, String> = serde_json::from_str(&out.text).expect("env json");
    assert_eq!(
        env.get("AGEN_CANARY"),
        None,
        "the canary must not reach the server"
    );
    assert_eq!(env.get("AWS_SECRET_ACCESS_KEY"), None);
    assert_eq!(env.get("DECLARED").map(String::as_str), Some("plain value"));
    assert_eq!(
        env.get("CRM_AUTH").map(String::as_str),
        Some("Bearer s3cr3t")
    );
    assert_eq!(env.get("PYTHONUTF8").map(String::as_str), Some("1"));
    assert_eq!(
        env.get("PYTHONIOENCODING").map(String::as_str),
        Some("utf-8")
    );
    assert_eq!(env.get("AGEN_BIN").map(String::as_str), Some(AGEN_BIN));
    assert_eq!(env.get("LC_MESSAGES").map(String::as_str), Some("C"));
    assert!(env.contains_key("PATH"));
    let expected_keys = [
        "DECLARED",
        "CRM_AUTH",
        "PYTHONUTF8",
        "PYTHONIOENCODING",
        "AGEN_BIN",
    ];
    let unexpected: Vec<&String> = env
        .keys()
        .filter(|k| {
            !(agen_harness::mcp::ALLOWED_ENV.contains(&k.as_str())
                || k.starts_with("LC_")
                || expected_keys.contains(&k.as_str()))
        })
        .collect();
    assert_eq!(
        unexpected,
        Vec::<&String>::new(),
        "only allowlisted and declared variables"
    );

    let cwd = call(&host, "env_cwd", json!({})).await.expect("cwd call");
    assert_eq!(
        PathBuf::from(cwd.text),
        bundle.path().canonicalize().expect("canonical")
    );
    let local = call(&host, "local.cwd", json!({}))
        .await
        .expect("relative command server answers");
    assert_eq!(
        PathBuf::from(local.text),
        bundle.path().canonicalize().expect("canonical")
    );

    let info = host
        .tools()
        .into_iter()
        .find(|t| t.qualified_name() == "env.cwd")
        .expect("env.cwd listed");
    assert!(
        info.read_only && info.idempotent,
        "annotations are read: {info:?}"
    );
    let info = host
        .tools()
        .into_iter()
        .find(|t| t.qualified_name() == "env.environment")
        .expect("listed");
    assert!(info.read_only && !info.idempotent, "{info:?}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_secret_leaves_the_server_not_connected_without_leaking_values() {
    let bundle = TestBundle::new(
        json!({"env": {"command": python(), "args": [our_server("env_server.py")], "env": {"TOKEN": "${CRM_TOKEN}"}}}),
        &["CRM_TOKEN"],
    );
    let host = start(&bundle, ctx()).await;
    let status = host.status();
    assert_eq!(status.tools_loaded, 0);
    assert_eq!(status.not_connected.len(), 1, "{status:?}");
    assert_eq!(status.not_connected[0].server, "env");
    assert!(
        status.not_connected[0]
            .reason
            .starts_with("env TOKEN: secret CRM_TOKEN has no value"),
        "{status:?}"
    );
    let err = call(&host, "env.environment", json!({})).await;
    assert!(
        matches!(err, Err(CallError::NotSent(NotSent::NotConnected(ref s))) if s == "env"),
        "{err:?}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meta_passes_through_to_the_server() {
    let log = tempfile::tempdir().expect("log dir");
    let log_file = log.path().join("meta.jsonl");
    let bundle = TestBundle::new(
        json!({"meta": {"command": python(), "args": [our_server("meta_server.py")], "env": {"META_LOG": log_file}}}),
        &[],
    );
    let host = start(&bundle, ctx()).await;
    let meta = json!({
        "agen/namespace": "default",
        "agen/runId": "run-1",
        "agen/rootRunId": "run-0",
        "agen/labels": {"team": "blue"},
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    });
    let Value::Object(meta_map) = meta.clone() else {
        unreachable!()
    };
    let out = host
        .call(
            "meta.echo",
            json!({"text": "hi"}),
            meta_map,
            CALL_TIMEOUT,
            CancellationToken::new(),
        )
        .await
        .expect("echo");
    assert_eq!(out.text, "hi");
    let events = meta_log_events(&log_file);
    assert_eq!(events.len(), 1, "{events:?}");
    let seen = events[0]["meta"].as_object().expect("meta recorded");
    for (k, v) in meta.as_object().expect("object") {
        assert_eq!(seen.get(k), Some(v), "_meta key {k}: {seen:?}");
    }
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_and_cancel_stop_a_slow_call_and_tell_the_server() {
    let log = tempfile::tempdir().expect("log dir");
    let log_file = log.path().join("meta.jsonl");
    let bundle = TestBundle::new(
        json!({"meta": {"command": python(), "args": [our_server("meta_server.py")], "env": {"META_LOG": log_file}}}),
        &[],
    );
    let host = start(&bundle, ctx()).await;

    let began = Instant::now();
    let timed_out = host
        .call(
            "meta.slow",
            json!({"seconds": 60}),
            Map::new(),
            Duration::from_millis(700),
            CancellationToken::new(),
        )
        .await;
    assert!(
        matches!(
            timed_out,
            Err(CallError::Interrupted {
                cause: Interruption::Timeout(_),
                ..
            })
        ),
        "{timed_out:?}"
    );
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "timeout is prompt: {:?}",
        began.elapsed()
    );
    eventually(
        Duration::from_secs(10),
        "the server to see the cancellation after a timeout",
        || {
            let n = meta_log_events(&log_file)
                .iter()
                .filter(|e| e["event"] == "cancelled")
                .count();
            (n == 1).then_some(())
        },
    )
    .await;

    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        trigger.cancel();
    });
    let began = Instant::now();
    let cancelled = host
        .call(
            "meta_slow",
            json!({"seconds": 60}),
            Map::new(),
            CALL_TIMEOUT,
            cancel,
        )
        .await;
    assert!(
        matches!(
            cancelled,
            Err(CallError::Interrupted {
                cause: Interruption::Cancelled,
                ..
            })
        ),
        "{cancelled:?}"
    );
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "cancel is prompt: {:?}",
        began.elapsed()
    );
    eventually(
        Duration::from_secs(10),
        "the server to see the cancellation",
        || {
            let n = meta_log_events(&log_file)
                .iter()
                .filter(|e| e["event"] == "cancelled")
                .count();
            (n == 2).then_some(())
        },
    )
    .await;

    // The server is still fine, and parallel calls to it all answer.
    let calls = (0..5).map(|i| {
        let host = host.clone();
        async move { call(&host, "meta.echo", json!({"text": format!("call {i}")})).await }
    });
    let outs = futures::future::join_all(calls).await;
    let texts: Vec<String> = outs.into_iter().map(|o| o.expect("echo").text).collect();
    assert_eq!(
        texts,
        (0..5).map(|i| format!("call {i}")).collect::<Vec<_>>()
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_fails_to_start_is_reported_with_its_stderr() {
    let bundle = TestBundle::new(
        json!({
            "boom": {"command": python(), "args": ["-c", "import sys; sys.stderr.write('boom-marker\\n'); sys.exit(1)"]},
            "ghost": {"command": "no-such-mcp-server-xyz"},
            "good": {"command": python(), "args": [our_server("env_server.py")]},
        }),
        &[],
    );
    let host = start(&bundle, ctx()).await;
    let status = host.status();
    let mut problems = status.not_connected.clone();
    problems.sort_by(|a, b| a.server.cmp(&b.server));
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert_eq!(
        problems[0],
        ServerProblem {
            server: "boom".into(),
            reason: "exited with status 1: boom-marker".into()
        }
    );
    assert_eq!(problems[1].server, "ghost");
    assert!(
        problems[1]
            .reason
            .starts_with("command no-such-mcp-server-xyz not found"),
        "{problems:?}"
    );
    assert_eq!(status.tools_loaded, 2, "the good server still loads");
    assert!(host.tools().iter().all(|t| t.server == "good"));
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_misses_its_start_deadline() {
    let bundle = TestBundle::new(
        json!({"mute": {"command": python(), "args": ["-c", "import sys, time; print('warming up', file=sys.stderr, flush=True); time.sleep(60)"]}}),
        &[],
    );
    let mut ctx = ctx();
    ctx.start_timeout = Duration::from_secs(4);
    let began = Instant::now();
    let host = start(&bundle, ctx).await;
    assert!(
        began.elapsed() < Duration::from_secs(15),
        "{:?}",
        began.elapsed()
    );
    let status = host.status();
    assert_eq!(status.not_connected.len(), 1);
    assert_eq!(
        status.not_connected[0].reason,
        "did not answer initialize and tools/list within 4s: warming up"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_reported_by_died() {
    let bundle = TestBundle::new(
        json!({
            "env": {"command": python(), "args": [our_server("env_server.py")]},
            "crash": {"command": python(), "args": [our_server("crash_server.py")]},
        }),
        &[],
    );
    let host = start(&bundle, ctx()).await;
    assert_eq!(host.status().not_connected, vec![]);
    let pids = host.server_pids();
    let env_pid = pids["env"];

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(env_pid).expect("pid")),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9 the env server");
    let death = tokio::time::timeout(Duration::from_secs(10), host.died())
        .await
        .expect("died() resolves");
    assert_eq!(death.server, "env");
    assert!(
        death.reason.starts_with("was killed by signal 9 (SIGKILL)"),
        "{death:?}"
    );

    let status = host.status();
    assert_eq!(status.not_connected, vec![death.clone()]);
    assert!(
        host.tools().iter().all(|t| t.server == "crash"),
        "a dead server's tools are gone"
    );
    let err = call(&host, "env.environment", json!({})).await;
    assert!(
        matches!(err, Err(CallError::NotSent(NotSent::NotConnected(ref s))) if s == "env"),
        "{err:?}"
    );
    assert_eq!(
        call(&host, "crash.ping", json!({}))
            .await
            .expect("other server lives")
            .text,
        "pong"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_exits_mid_call_fails_the_call_and_is_reported_with_its_last_words() {
    let bundle = TestBundle::new(
        json!({"crash": {"command": python(), "args": [our_server("crash_server.py")]}}),
        &[],
    );
    let host = start(&bundle, ctx()).await;
    // The call was sent: it may have run, so it is interrupted (lost), never "not connected".
    let err = call(&host, "crash.crash", json!({"code": 7})).await;
    assert!(
        matches!(err, Err(CallError::Interrupted { ref server, cause: Interruption::Lost(_) }) if server == "crash"),
        "{err:?}"
    );
    assert!(err.as_ref().is_err_and(CallError::may_have_run));
    let death = tokio::time::timeout(Duration::from_secs(10), host.died())
        .await
        .expect("died() resolves");
    assert_eq!(
        death,
        ServerProblem {
            server: "crash".into(),
            reason: "exited with status 7: crash-marker: exiting with 7".into()
        }
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_died_is_restarted_on_demand_and_answers_again() {
    let bundle = TestBundle::new(
        json!({"crash": {"command": python(), "args": [our_server("crash_server.py")]}}),
        &[],
    );
    let host = start(&bundle, ctx()).await;
    let before = host.server_pids()["crash"];
    let err = call(&host, "crash.crash", json!({"code": 7})).await;
    assert!(err.as_ref().is_err_and(CallError::may_have_run), "{err:?}");
    tokio::time::timeout(Duration::from_secs(10), host.died())
        .await
        .expect("died() resolves");
    // Not restarted by itself: a call before the restart is refused, never sent.
    let refused = call(&host, "crash.ping", json!({})).await;
    assert!(
        matches!(refused, Err(CallError::NotSent(NotSent::NotConnected(_)))),
        "{refused:?}"
    );
    host.restart("crash").await.expect("restarted");
    let after = host.server_pids()["crash"];
    assert_ne!(before, after, "a new process");
    assert_eq!(
        call(&host, "crash.ping", json!({}))
            .await
            .expect("pong")
            .text,
        "pong"
    );
    // A living server is left alone; a server the bundle does not start is refused.
    host.restart("crash").await.expect("alive");
    assert_eq!(host.server_pids()["crash"], after);
    assert!(host.restart("nobody").await.is_err());
    host.shutdown().await;
    assert!(
        host.restart("crash").await.is_err(),
        "no restart after shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_every_server_process_and_is_not_a_death() {
    let bundle = TestBundle::new(
        json!({
            "env": {"command": python(), "args": [our_server("env_server.py")]},
            // A server that ignores SIGTERM and has a child of its own.
            "stubborn": {"command": "sh", "args": ["-c", &format!(
                "trap '' TERM; sleep 300 & echo $! > sleep.pid; exec '{}' '{}'", python(), our_server("env_server.py")
            )]},
        }),
        &[],
    );
    let host = start(&bundle, ctx()).await;
    assert_eq!(host.status().not_connected, vec![]);
    let mut pids: Vec<u32> = host.server_pids().into_values().collect();
    assert_eq!(pids.len(), 2);
    let sleep_pid = std::fs::read_to_string(bundle.path().join("sleep.pid")).expect("sleep.pid");
    pids.push(sleep_pid.trim().parse().expect("a pid"));
    assert!(pids.iter().all(|p| process_alive(*p)));
    let began = Instant::now();
    host.shutdown().await;
    assert!(
        began.elapsed() < Duration::from_secs(10),
        "{:?}",
        began.elapsed()
    );
    eventually(
        Duration::from_secs(5),
        "every server process and its child to be gone",
        || pids.iter().all(|p| !process_alive(*p)).then_some(()),
    )
    .await;
    let death = tokio::time::timeout(Duration::from_millis(500), host.died()).await;
    assert!(death.is_err(), "a shutdown is not a death: {death:?}");
}

/// A Python MCP server on streamable HTTP, killed (its group) on drop.
struct HttpServer {
    child: tokio::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl HttpServer {
    async fn start() -> HttpServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let port_file = dir.path().join("port");
        let child = tokio::process::Command::new(python())
            .arg(our_server("http_server.py"))
            .arg(&port_file)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("start http_server.py");
        let port = eventually(Duration::from_secs(30), "http_server.py to listen", || {
            std::fs::read_to_string(&port_file)
                .ok()
                .filter(|p| !p.is_empty())
        })
        .await;
        HttpServer {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
            _dir: dir,
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_servers_get_their_headers_with_secrets_substituted() {
    let http = HttpServer::start().await;
    let bundle = TestBundle::new(
        json!({
            "remote": {"url": http.url, "headers": {"Authorization": "Bearer ${CRM_TOKEN}", "X-Team": "blue"}},
            "unreachable": {"url": "http://127.0.0.1:1/mcp"},
        }),
        &["CRM_TOKEN"],
    );
    let mut ctx = ctx();
    ctx.secrets = BTreeMap::from([("CRM_TOKEN".to_string(), "s3cr3t".to_string())]);
    ctx.start_timeout = Duration::from_secs(15);
    let host = start(&bundle, ctx).await;

    let status = host.status();
    assert_eq!(status.tools_loaded, 1, "{status:?}");
    assert_eq!(status.not_connected.len(), 1, "{status:?}");
    assert_eq!(status.not_connected[0].server, "unreachable");
    assert!(!status.not_connected[0].reason.is_empty());

    let out = call(&host, "remote_headers", json!({}))
        .await
        .expect("headers call");
    let headers: BTreeMap<String, String> = serde_json::from_str(&out.text).expect("headers json");
    assert_eq!(
        headers.get("authorization").map(String::as_str),
        Some("Bearer s3cr3t"),
        "{headers:?}"
    );
    assert_eq!(
        headers.get("x-team").map(String::as_str),
        Some("blue"),
        "{headers:?}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paginated_tool_lists_are_followed_and_results_are_rendered_as_text() {
    let bundle = TestBundle::new(
        json!({"paged": {"command": python(), "args": [our_server("paged_server.py")]}}),
        &[],
    );
    let host = start(&bundle, ctx()).await;
    let names: Vec<String> = host.tools().iter().map(|t| t.qualified_name()).collect();
    assert_eq!(
        names,
        ["mixed", "t0", "t1", "t2", "t3", "t4", "t5", "t6"]
            .map(|t| format!("paged.{t}"))
            .to_vec(),
        "all three pages"
    );
    let tools = host.tools();
    let t0 = &tools[1];
    assert_eq!(
        (t0.read_only, t0.idempotent, t0.description.as_str()),
        (true, false, "tool number 0")
    );
    assert_eq!(
        t0.input_schema,
        json!({"type": "object", "properties": {"x": {"type": "integer"}}})
    );
    assert_eq!((tools[2].read_only, tools[2].idempotent), (false, true));

    let out = call(&host, "paged_t6", json!({"x": 6}))
        .await
        .expect("t6 on the last page answers");
    assert_eq!(out.text, r#"{"arguments": {"x": 6}, "tool": "t6"}"#);
    let mixed = call(&host, "paged.mixed", Value::Null)
        .await
        .expect("mixed");
    assert_eq!(mixed.text, "{\"n\":1}\n[image: image/png, 4 bytes]");
    let bad = call(&host, "paged.t1", json!([1, 2])).await;
    assert!(
        matches!(bad, Err(CallError::NotSent(NotSent::BadArguments { .. }))),
        "{bad:?}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_host_kills_its_servers() {
    let bundle = TestBundle::new(
        json!({"env": {"command": python(), "args": [our_server("env_server.py")]}}),
        &[],
    );
    let host = start(&bundle, ctx()).await;
    let pids: Vec<u32> = host.server_pids().into_values().collect();
    assert_eq!(pids.len(), 1);
    drop(host);
    eventually(Duration::from_secs(5), "the server to be gone", || {
        pids.iter().all(|p| !process_alive(*p)).then_some(())
    })
    .await;
}

/// Nothing is dropped or shut down here: only `PR_SET_PDEATHSIG` can stop the server when the
/// thread that spawned it ends (as when the host process dies).
#[test]
fn servers_die_with_the_thread_that_spawned_them() {
    let bundle = TestBundle::new(
        json!({"env": {"command": python(), "args": [our_server("env_server.py")]}}),
        &[],
    );
    let bundle_dir = bundle.path().to_path_buf();
    let pids = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let pids = rt.block_on(async {
            let host = ToolHost::start(&Bundle::load(&bundle_dir).expect("bundle"), ctx()).await;
            let pids = host.server_pids();
            std::mem::forget(host);
            pids
        });
        std::mem::forget(rt);
        pids
    })
    .join()
    .expect("spawning thread");
    assert_eq!(pids.len(), 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.values().any(|p| process_alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "the server outlived the thread that spawned it"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(bundle);
}
