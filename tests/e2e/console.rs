//! The web console (issue 44) in a real browser: one fleet (a Hub, a Nest, the scripted fake
//! model behind four deployments), then `tests/browser/console_test.py` drives Debian's
//! headless Chromium with Playwright through sign-in, live task pages, approvals (approve,
//! deny with a reason, a viewer's forged POST), the trace waterfall with a delegate child, XSS
//! payloads, axe-core and screenshots (saved in `target/console-screenshots/`).
//!
//! Ignored by default: it needs Chromium, Playwright and axe-core, which `tests/run.sh`
//! installs before it runs it (`cargo test -p agen-tests --test e2e -- --ignored console::`).

use std::path::{Path, PathBuf};
use std::process::Command;

use agen_tests::{agen_bin, mcp_json, workspace_root, write_bundle, FakeModel, HubProcess};
use serde_json::{json, Value};

const XSS_INPUT: &str = "<img src=x onerror=alert('input')><script>alert('input')</script>";
const XSS_ARG: &str = "<svg onload=alert('argument')>";
const XSS_ANSWER: &str = "<script>alert('answer')</script><img src=x onerror=alert('answer')>";
const XSS_LABEL: &str = "<iframe src=javascript:alert('label')>";
/// Streamed by the fake model a few characters at a time (markup in it stays text).
const STREAMED: &str =
    "The quick <b>brown</b> fox jumps over the lazy dog, slowly, piece by piece.";

fn browser_root() -> PathBuf {
    workspace_root().join("target/browser")
}

fn deploy(hub: &HubProcess, dir: &Path, name: &str, model: &FakeModel, files: Vec<(&str, String)>) {
    deploy_with(hub, dir, name, model, files, &[]);
}

/// [`deploy`] with more `agen deploy` flags (`--selector K=V`).
fn deploy_with(
    hub: &HubProcess,
    dir: &Path,
    name: &str,
    model: &FakeModel,
    files: Vec<(&str, String)>,
    flags: &[&str],
) {
    let mut all = vec![(
        "x-agen/agent.md",
        format!(
            "---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou are {name}.\n",
            model.base_url()
        ),
    )];
    all.extend(files);
    write_bundle(&dir.join(name), &all).unwrap();
    let folder = dir.join(name);
    let mut args = vec!["deploy", folder.to_str().unwrap(), "--name", name, "--wait"];
    args.extend_from_slice(flags);
    let out = hub.cli(&args).unwrap();
    assert!(
        out.status.success(),
        "deploy {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn workspace_server() -> String {
    mcp_json(&[(
        "ws",
        json!({"command": "agen", "args": ["mcp", "workspace", "--root", "."]}),
    )])
}

/// A model whose one run makes a trace of 1,000 spans: the run, 2 model turns (the first asks
/// for 997 `ws_list` calls at once) and 997 tool calls.
fn wide_model(models: &Path) -> FakeModel {
    FakeModel::start(
        &models.join("wide"),
        &json!({"steps": [
            {"tool_calls": (0..997).map(|_| json!({"name": "ws_list", "arguments": {"pattern": "*"}})).collect::<Vec<_>>()},
            {"reply": "listed"}
        ]}),
    )
    .unwrap()
}

fn wide_bundle() -> Vec<(&'static str, String)> {
    vec![
        ("mcp.json", workspace_server()),
        (
            "x-agen/harness.json",
            json!({"limits": {"maxToolCalls": 1000}}).to_string(),
        ),
    ]
}

fn ws_run(command: &str) -> Value {
    json!({"name": "ws_run", "arguments": {"command": command}})
}

#[test]
#[ignore = "needs Chromium, Playwright and axe-core: tests/run.sh installs them and runs it"]
fn the_web_console_works_in_a_real_browser() {
    let python = browser_root().join("venv/bin/python");
    let axe = browser_root().join("node_modules/axe-core/axe.min.js");
    assert!(
        python.exists() && axe.exists() && Path::new("/usr/bin/chromium").exists(),
        "the browser test needs /usr/bin/chromium, {} and {} (tests/run.sh installs them)",
        python.display(),
        axe.display()
    );
    let tmp = tempfile::tempdir().unwrap();
    let mut hub = HubProcess::start(tmp.path()).unwrap();
    let label = format!("note={XSS_LABEL}");
    let _nest = hub.nest("solo", &[label.as_str()], &[]).unwrap();
    let models = tmp.path().join("models");
    let bundles = tmp.path().join("bundles");

    let slow = FakeModel::start(
        &models.join("slow"),
        &json!({"steps": [{"reply": "all done", "delay_ms": 4000}]}),
    )
    .unwrap();
    deploy(&hub, &bundles, "slow", &slow, vec![]);

    let streamer = FakeModel::start(
        &models.join("streamer"),
        &json!({"steps": [{"reply": STREAMED, "chunk_chars": 4, "chunk_delay_ms": 250}]}),
    )
    .unwrap();
    deploy(&hub, &bundles, "streamer", &streamer, vec![]);

    let asker = FakeModel::start(
        &models.join("asker"),
        &json!({"steps": [
            {"tool_calls": [ws_run("echo ran")]},
            {"reply_template": "saw: {{last_tool_result}}"}
        ]}),
    )
    .unwrap();
    deploy(
        &hub,
        &bundles,
        "asker",
        &asker,
        vec![
            ("mcp.json", workspace_server()),
            (
                "x-agen/config.json",
                json!({"permissions": {"ask": ["ws.run"]}}).to_string(),
            ),
        ],
    );

    let helper = FakeModel::start(
        &models.join("helper"),
        &json!({"steps": [{"reply": "helper says hi"}]}),
    )
    .unwrap();
    // The deployment's selector carries the label payload too (the one Nest has that label).
    deploy_with(
        &hub,
        &bundles,
        "helper",
        &helper,
        vec![],
        &["--selector", &label],
    );
    let caller = FakeModel::start(
        &models.join("caller"),
        &json!({"steps": [
            {"tool_calls": [
                ws_run("echo one"),
                ws_run(&format!("echo \"{XSS_ARG}\"")),
                ws_run("echo three"),
            ]},
            {"tool_calls": [{"name": "call_agent", "arguments": {"agent": "helper", "input": "say hi"}}]},
            {"reply": XSS_ANSWER}
        ]}),
    )
    .unwrap();
    deploy(
        &hub,
        &bundles,
        "caller",
        &caller,
        vec![
            ("mcp.json", workspace_server()),
            (
                "x-agen/config.json",
                json!({"delegates": [{"deployment": "helper", "description": "says hi"}]})
                    .to_string(),
            ),
            // The conversation shows the calls' arguments (and so the payload in one).
            (
                "x-agen/harness.json",
                json!({"traceToolArguments": true}).to_string(),
            ),
        ],
    );

    // A trace of 1,000 spans: the run, 2 model turns, 997 tool calls.
    let wide = wide_model(&models);
    deploy(&hub, &bundles, "wide", &wide, wide_bundle());

    let viewer = hub
        .cli_json(&[
            "tokens",
            "create",
            "--namespace",
            "default",
            "--role",
            "viewer",
            "--name",
            "console-viewer",
            "-o",
            "json",
        ])
        .unwrap();
    let admin_token = std::fs::read_to_string(hub.dir.join("hub/admin-token")).unwrap();
    let screenshots = workspace_root().join("target/console-screenshots");
    let config = tmp.path().join("browser.json");
    std::fs::write(
        &config,
        serde_json::to_vec_pretty(&json!({
            "url": hub.url(),
            "agen": agen_bin(),
            "client_config": hub.dir.join("client.toml"),
            "admin_token": admin_token.trim(),
            "viewer_token": viewer["secret"],
            "screenshots": screenshots,
            "axe": axe,
            "xss_input": XSS_INPUT,
            "xss_arg": XSS_ARG,
            "xss_answer": XSS_ANSWER,
            "xss_label": XSS_LABEL,
            "streamed": STREAMED,
            "restart_request": tmp.path().join("restart-request"),
            "restart_done": tmp.path().join("restart-done"),
        }))
        .unwrap(),
    )
    .unwrap();
    // The script asks for a Hub restart by creating `restart_request`; it is told it is done
    // by `restart_done`.
    let request = tmp.path().join("restart-request");
    let done = tmp.path().join("restart-done");
    let log = tmp.path().join("browser.log");
    let mut child = Command::new(&python)
        .arg(workspace_root().join("tests/browser/console_test.py"))
        .arg(&config)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if request.exists() {
            std::fs::remove_file(&request).unwrap();
            hub.restart().unwrap();
            std::fs::write(&done, "").unwrap();
        }
        if started.elapsed() > std::time::Duration::from_secs(600) {
            let _ = child.kill();
            panic!("the browser test took over 10 minutes");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    let stdout = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        status.success() && stdout.contains("checks passed"),
        "the browser test failed:\n{stdout}\n{stderr}\nhub log (tail):\n{}",
        tail(&hub.proc.log_text(), 80)
    );
    println!("{stdout}");
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// One HTTP request to the Hub with curl (its CA trusted, cookies kept in `jar`): status,
/// response headers (lowercase names) and body.
fn http(
    hub: &HubProcess,
    jar: &Path,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, String, String) {
    let head = jar.with_extension(format!("head-{}", rand_suffix()));
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "-m",
        "30",
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "-X",
        method,
    ])
    .arg("--cacert")
    .arg(hub.dir.join("hub/tls/ca.pem"))
    .arg("-b")
    .arg(jar)
    .arg("-c")
    .arg(jar)
    .arg("-D")
    .arg(&head);
    for (k, v) in headers {
        cmd.args(["-H", &format!("{k}: {v}")]);
    }
    if let Some(b) = body {
        cmd.args(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    let out = cmd
        .arg(format!("{}{path}", hub.url()))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    let head_text = std::fs::read_to_string(&head)
        .unwrap_or_default()
        .to_ascii_lowercase();
    let _ = std::fs::remove_file(&head);
    (
        code.trim().parse().unwrap_or(0),
        head_text,
        body.to_string(),
    )
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn token(hub: &HubProcess, name: &str, role: &str) -> (String, String) {
    let v = hub
        .cli_json(&[
            "tokens",
            "create",
            "--namespace",
            "default",
            "--role",
            role,
            "--name",
            name,
            "-o",
            "json",
        ])
        .unwrap();
    (
        v["id"].as_str().unwrap().to_string(),
        v["secret"].as_str().unwrap().to_string(),
    )
}

fn sign_in(hub: &HubProcess, jar: &Path, secret: &str) -> Value {
    let (status, head, body) = http(
        hub,
        jar,
        "POST",
        "/ui/api/session",
        &[],
        Some(&json!({"token": secret}).to_string()),
    );
    assert_eq!(status, 200, "sign-in: {body}");
    let cookie = head
        .lines()
        .find(|l| l.starts_with("set-cookie: agen_session="))
        .unwrap_or_else(|| panic!("no session cookie in {head}"));
    for attr in ["httponly", "secure", "samesite=strict", "path=/ui"] {
        assert!(cookie.contains(attr), "{attr} missing: {cookie}");
    }
    assert!(!cookie.contains(secret), "the token is not the cookie");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn console_sessions_follow_their_token_survive_a_restart_and_refuse_forged_posts() {
    let tmp = tempfile::tempdir().unwrap();
    let mut hub = HubProcess::start(tmp.path()).unwrap();
    let jar = tmp.path().join("viewer.jar");

    // The page: served with a strict CSP, assets embedded.
    let (status, head, page) = http(&hub, &jar, "GET", "/ui/", &[], None);
    assert_eq!(status, 200);
    assert!(page.contains("/ui/assets/app.js"), "{page}");
    assert!(
        head.contains("content-security-policy: default-src 'none'; script-src 'self'"),
        "{head}"
    );
    let (status, head, _) = http(&hub, &jar, "GET", "/ui/assets/app.js", &[], None);
    assert!(status == 200 && head.contains("text/javascript"), "{head}");

    // Without a session the API answers 401; a wrong token does not sign in.
    assert_eq!(http(&hub, &jar, "GET", "/ui/api/tasks", &[], None).0, 401);
    let bad = json!({"token": "agen_nope_nope"}).to_string();
    assert_eq!(
        http(&hub, &jar, "POST", "/ui/api/session", &[], Some(&bad)).0,
        401
    );

    // A viewer signs in; it reads, but its decision is refused 403 with or without the CSRF
    // token, and both refusals are audited.
    let (viewer_id, viewer) = token(&hub, "console-viewer", "viewer");
    let me = sign_in(&hub, &jar, &viewer);
    assert_eq!(me["role"], "viewer", "{me}");
    let csrf = me["csrf"].as_str().unwrap().to_string();
    assert_eq!(http(&hub, &jar, "GET", "/ui/api/tasks", &[], None).0, 200);
    assert_eq!(http(&hub, &jar, "GET", "/ui/api/fleet", &[], None).0, 200);
    let decide =
        json!({"namespace": "default", "task_id": "t-none", "call_id": "", "approved": true})
            .to_string();
    let (status, _, body) = http(
        &hub,
        &jar,
        "POST",
        "/ui/api/approvals/decide",
        &[("X-CSRF-Token", &csrf)],
        Some(&decide),
    );
    assert_eq!(status, 403, "{body}");
    let (status, _, body) = http(
        &hub,
        &jar,
        "POST",
        "/ui/api/approvals/decide",
        &[],
        Some(&decide),
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("X-CSRF-Token"), "{body}");
    let audit = hub.cli_json(&["audit", "-o", "json"]).unwrap();
    let refused = |call: &str| {
        audit.as_array().unwrap().iter().any(|e| {
            e["call"] == call
                && e["outcome"] == "permission_denied"
                && e["token_id"] == viewer_id.as_str()
        })
    };
    assert!(refused("DecideApproval"), "{audit}");
    assert!(refused("Console.DecideApproval"), "{audit}");

    // The session is in the store: a restarted Hub knows it.
    hub.restart().unwrap();
    assert_eq!(http(&hub, &jar, "GET", "/ui/api/session", &[], None).0, 200);

    // A rotated token ends its session at once.
    hub.cli_json(&["tokens", "rotate", &viewer_id, "-o", "json"])
        .unwrap();
    assert_eq!(http(&hub, &jar, "GET", "/ui/api/session", &[], None).0, 401);

    // The admin token signs in too; sign-out needs the CSRF token and ends the session.
    let admin_jar = tmp.path().join("admin.jar");
    let admin = std::fs::read_to_string(hub.dir.join("hub/admin-token")).unwrap();
    let me = sign_in(&hub, &admin_jar, admin.trim());
    assert_eq!(me["role"], "cluster-admin", "{me}");
    assert_eq!(
        http(&hub, &admin_jar, "DELETE", "/ui/api/session", &[], None).0,
        403
    );
    let csrf = me["csrf"].as_str().unwrap().to_string();
    assert_eq!(
        http(
            &hub,
            &admin_jar,
            "DELETE",
            "/ui/api/session",
            &[("X-CSRF-Token", &csrf)],
            None
        )
        .0,
        204
    );
    assert_eq!(
        http(&hub, &admin_jar, "GET", "/ui/api/session", &[], None).0,
        401
    );
}

#[test]
fn tasks_are_listed_by_label_and_submission_time() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    // No Nest: the tasks stay queued, which is all a list needs.
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [{"reply": "hi"}]}),
    )
    .unwrap();
    let dir = tmp.path().join("bundles");
    write_bundle(
        &dir.join("lister"),
        &[(
            "x-agen/agent.md",
            format!(
                "---\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou list.\n",
                model.base_url()
            ),
        )],
    )
    .unwrap();
    let out = hub
        .cli(&[
            "deploy",
            dir.join("lister").to_str().unwrap(),
            "--name",
            "lister",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (input, label) in [("a", "team=red"), ("b", "team=blue"), ("c", "team=red")] {
        let out = hub
            .cli(&["submit", "lister", input, "--label", label])
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let count = |args: &[&str]| {
        let mut all = vec!["tasks", "-o", "json"];
        all.extend_from_slice(args);
        hub.cli_json(&all).unwrap().as_array().unwrap().len()
    };
    assert_eq!(count(&[]), 3);
    assert_eq!(count(&["--label", "team=red"]), 2);
    assert_eq!(count(&["--label", "team=blue"]), 1);
    assert_eq!(count(&["--label", "team"]), 3);
    assert_eq!(count(&["--label", "team=green"]), 0);
    assert_eq!(count(&["--since", "10m"]), 3);
    assert_eq!(count(&["--until", "10m"]), 0);
    assert_eq!(count(&["--since", "10m", "--label", "team=red"]), 2);
}

/// The figures of BENCHMARKS.md "The web console": the task list's first page with 100,000
/// tasks retained and a 1,000-span trace, measured in the browser by
/// `tests/browser/console_bench.py` (not a timed test: it prints what it measured), and
/// `ListTasks`'s first page over gRPC. The retained tasks are written by
/// `agen hub seed-tasks` into the stopped Hub's store.
#[test]
#[ignore = "a benchmark (minutes): cargo test -p agen-tests --test e2e -- --ignored --nocapture console::console_benchmark"]
fn console_benchmark() {
    let python = browser_root().join("venv/bin/python");
    let tmp = tempfile::tempdir().unwrap();
    let mut hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let bundles = tmp.path().join("bundles");
    let models = tmp.path().join("models");

    // One task whose trace has 1,000 spans: the run, 2 model turns, 997 tool calls.
    let wide = wide_model(&models);
    deploy(&hub, &bundles, "wide", &wide, wide_bundle());
    let out = hub.cli(&["submit", "wide", "go"]).unwrap();
    let task = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let done = hub
        .cli_json(&["wait", &task, "-o", "json", "--timeout", "600s"])
        .unwrap();
    assert_eq!(done["state"], "succeeded", "{done}");

    // The retained tasks: written into the stopped Hub's store, then the Hub starts on them.
    // `AGEN_CONSOLE_BENCH_TASKS` (read, never set) changes the count (default 100,000).
    let total: usize = std::env::var("AGEN_CONSOLE_BENCH_TASKS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    hub.proc.stop(std::time::Duration::from_secs(20));
    let seed = Command::new(agen_bin())
        .args([
            "hub",
            "seed-tasks",
            &total.to_string(),
            "--deployment",
            "many",
            "--data-dir",
        ])
        .arg(hub.dir.join("hub"))
        .output()
        .unwrap();
    assert!(
        seed.status.success(),
        "{}",
        String::from_utf8_lossy(&seed.stderr)
    );
    print!("{}", String::from_utf8_lossy(&seed.stdout));
    let started = std::time::Instant::now();
    hub.restart().unwrap();
    println!("the Hub started on them in {:?}", started.elapsed());

    // ListTasks's first page over gRPC (the Hub's part of the console's first page).
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        use agen_proto::v1 as pb;
        let channel = hub.channel().await.unwrap();
        let mut client = pb::agen_service_client::AgenServiceClient::new(channel);
        let token = std::fs::read_to_string(hub.dir.join("hub/admin-token")).unwrap();
        let mut times = Vec::new();
        for _ in 0..7 {
            let mut req = tonic::Request::new(pb::ListTasksRequest {
                page_size: 50,
                ..Default::default()
            });
            req.metadata_mut().insert(
                "authorization",
                format!("Bearer {}", token.trim()).parse().unwrap(),
            );
            let t = std::time::Instant::now();
            let page = client.list_tasks(req).await.unwrap().into_inner();
            times.push(t.elapsed());
            assert_eq!(page.tasks.len(), 50);
            assert!(page.total as usize > total, "{} retained", page.total);
        }
        times.sort();
        println!(
            "ListTasks first page of 50 of {} tasks over gRPC: median {:?}, worst {:?}",
            total + 1,
            times[times.len() / 2],
            times[times.len() - 1]
        );
    });

    let admin = std::fs::read_to_string(hub.dir.join("hub/admin-token")).unwrap();
    let config = tmp.path().join("bench.json");
    std::fs::write(
        &config,
        serde_json::to_vec(&json!({
            "url": hub.url(), "admin_token": admin.trim(), "wide_task": task,
        }))
        .unwrap(),
    )
    .unwrap();
    let out = Command::new(&python)
        .arg(workspace_root().join("tests/browser/console_bench.py"))
        .arg(&config)
        .output()
        .unwrap();
    println!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success());
}
