//! API tokens, the audit log and Nest identities (issues 13 and 11), tried as the people and
//! programs they are meant to stop: a viewer that submits, a namespace-A token that reads
//! namespace B, a revoked or expired token holding a `WatchTask` open, a rogue Nest that joins
//! with a live Nest's id, a revoked join token, a revoked Nest, and anyone reading command
//! lines and logs for the join token. Real Hub, real Nest, real CLI, real gRPC over TLS.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use agen_proto::v1 as pb;
use agen_tests::{agen_bin, wait_for, write_bundle, FakeModel, HubProcess};
use serde_json::{json, Value};

/// A bundle named `name` whose model is `model` (no tool servers: built-ins only).
fn bundle(dir: &Path, name: &str, model: &FakeModel) {
    write_bundle(
        dir,
        &[
            ("mcp.json", json!({"mcpServers": {}}).to_string()),
            (
                "x-agen/agent.md",
                format!(
                    "---\nname: {name}\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou keep notes.\n",
                    model.base_url()
                ),
            ),
        ],
    )
    .expect("write bundle");
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: exit {:?}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn json_of(out: &Output, what: &str) -> Value {
    serde_json::from_str(&ok(out, what)).unwrap_or_else(|e| panic!("{what}: not JSON: {e}"))
}

/// Asserts that `out` is the documented permission exit (5) and says `needle`.
fn refused(out: &Output, what: &str, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{what}: {err}");
    assert!(
        err.contains(needle),
        "{what}: expected `{needle}` in: {err}"
    );
}

/// `agen ARGS --token TOKEN` against `hub`.
fn as_token(hub: &HubProcess, token: &str, args: &[&str]) -> Output {
    let mut all: Vec<&str> = args.to_vec();
    all.extend_from_slice(&["--token", token]);
    hub.cli(&all).expect("run agen")
}

/// Creates an API token with the admin token; returns (id, secret).
fn api_token(
    hub: &HubProcess,
    ns: &str,
    role: &str,
    name: &str,
    extra: &[&str],
) -> (String, String) {
    let mut args = vec![
        "tokens",
        "create",
        "--namespace",
        ns,
        "--role",
        role,
        "--name",
        name,
        "-o",
        "json",
    ];
    args.extend_from_slice(extra);
    let v = json_of(&hub.cli(&args).unwrap(), "tokens create");
    (
        v["id"].as_str().unwrap().to_owned(),
        v["secret"].as_str().unwrap().to_owned(),
    )
}

fn deploy(hub: &HubProcess, dir: &Path, ns: &str, name: &str) {
    let out = hub
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
    ok(&out, "deploy");
}

fn submit(hub: &HubProcess, ns: &str, deployment: &str, input: &str) -> String {
    ok(
        &hub.cli(&["submit", deployment, input, "--namespace", ns])
            .unwrap(),
        "submit",
    )
}

fn wait_done(hub: &HubProcess, ns: &str, task: &str) -> Value {
    let out = hub
        .cli(&[
            "wait",
            task,
            "--namespace",
            ns,
            "-o",
            "json",
            "--timeout",
            "60s",
        ])
        .unwrap();
    json_of(&out, "wait")
}

#[test]
fn a_namespace_token_reaches_only_its_namespace_and_only_as_far_as_its_role() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [
            {"tool_calls": [{"name": "save_artifact", "arguments": {"name": "note.txt", "content": "a private note"}}]},
            {"reply": "noted"}
        ]}),
    )
    .unwrap();
    let dir = tmp.path().join("bundle");
    bundle(&dir, "notes", &model);
    deploy(&hub, &dir, "a", "notes");
    deploy(&hub, &dir, "b", "notes");
    let task_b = submit(&hub, "b", "notes", "the secret plan of b");
    assert_eq!(wait_done(&hub, "b", &task_b)["state"], "succeeded");
    let secret_file = tmp.path().join("b-secret");
    std::fs::write(&secret_file, "b-value").unwrap();
    ok(
        &hub.cli(&[
            "secrets",
            "set",
            "B_ONLY_SECRET",
            "--from-file",
            secret_file.to_str().unwrap(),
            "--namespace",
            "b",
        ])
        .unwrap(),
        "secrets set",
    );

    let (_, viewer) = api_token(&hub, "a", "viewer", "dash", &[]);
    let (_, submitter) = api_token(&hub, "a", "submitter", "ci-bot", &[]);
    let (_, a_admin) = api_token(&hub, "a", "admin", "a-admin", &[]);

    // A viewer reads its namespace but cannot submit.
    let out = as_token(
        &hub,
        &viewer,
        &["submit", "notes", "hi", "--namespace", "a"],
    );
    refused(
        &out,
        "viewer submit",
        "needs role submitter (or higher) in namespace `a`",
    );
    ok(
        &as_token(&hub, &viewer, &["tasks", "--namespace", "a", "-o", "json"]),
        "viewer tasks",
    );

    // Nothing of namespace B, whichever way it is asked for.
    let tries: Vec<Vec<&str>> = vec![
        vec!["tasks", "--namespace", "b", "-o", "json"],
        vec!["query", &task_b, "--namespace", "b", "-o", "json"],
        vec!["wait", &task_b, "--namespace", "b", "-o", "json"],
        vec!["trace", &task_b, "--namespace", "b"],
        vec!["artifacts", "ls", "--namespace", "b", "-o", "json"],
        vec!["secrets", "ls", "--namespace", "b", "-o", "json"],
        vec!["ps", "--all", "--namespace", "b", "-o", "json"],
        vec!["ps", "--namespace", "b", "-o", "json"],
        vec!["submit", "notes", "x", "--namespace", "b"],
    ];
    for args in &tries {
        for token in [&viewer, &submitter, &a_admin] {
            let out = as_token(&hub, token, args);
            refused(&out, &args.join(" "), "in namespace `b`");
            let all = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                !all.contains("secret plan") && !all.contains("B_ONLY_SECRET"),
                "{all}"
            );
        }
    }
    // Naming B's task under its own namespace finds nothing either.
    let out = as_token(&hub, &viewer, &["query", &task_b, "--namespace", "a"]);
    assert!(!out.status.success());
    assert!(!String::from_utf8_lossy(&out.stdout).contains("secret plan"));
    // A list across namespaces is cut down to the token's own.
    let all = json_of(
        &as_token(&hub, &viewer, &["ps", "--all", "-o", "json"]),
        "ps --all",
    );
    let namespaces: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["namespace"].as_str().unwrap())
        .collect();
    assert!(
        !namespaces.is_empty() && namespaces.iter().all(|n| *n == "a"),
        "{all}"
    );
    // Nests and join tokens are the cluster admin's.
    refused(
        &as_token(&hub, &a_admin, &["nests"]),
        "nests",
        "cluster admin",
    );
    refused(
        &as_token(&hub, &a_admin, &["tokens", "create", "--join"]),
        "join token",
        "cluster admin",
    );
    refused(
        &as_token(
            &hub,
            &a_admin,
            &["tokens", "create", "--namespace", "b", "--role", "viewer"],
        ),
        "token for b",
        "namespace `b`",
    );

    // A deployer of A deploys into A, but not a bundle that delegates into B.
    let (_, deployer) = api_token(&hub, "a", "deployer", "a-deployer", &[]);
    let delegating = tmp.path().join("delegating");
    bundle(&delegating, "caller", &model);
    std::fs::write(
        delegating.join("x-agen/config.json"),
        json!({"delegates": [{"deployment": "notes", "namespace": "b"}]}).to_string(),
    )
    .unwrap();
    let out = as_token(
        &hub,
        &deployer,
        &[
            "deploy",
            delegating.to_str().unwrap(),
            "--name",
            "caller",
            "--namespace",
            "a",
        ],
    );
    refused(
        &out,
        "deploy delegating into b",
        "delegates to deployment `notes` in namespace `b` needs role submitter",
    );
    ok(
        &as_token(
            &hub,
            &deployer,
            &[
                "deploy",
                dir.to_str().unwrap(),
                "--name",
                "notes2",
                "--namespace",
                "a",
            ],
        ),
        "deployer deploy",
    );

    // The submitter submits; the run works.
    let task_a = ok(
        &as_token(
            &hub,
            &submitter,
            &["submit", "notes", "note this", "--namespace", "a"],
        ),
        "submitter submit",
    );
    assert_eq!(wait_done(&hub, "a", &task_a)["state"], "succeeded");

    // `tokens ls` shows no secret, and an admin of A sees A's tokens only.
    let listed = ok(
        &hub.cli(&["tokens", "ls", "-o", "json"]).unwrap(),
        "tokens ls",
    );
    for s in [&viewer, &submitter, &a_admin] {
        let secret_part = s.rsplit('_').next().unwrap();
        assert!(!listed.contains(secret_part), "tokens ls shows a secret");
    }
    let a_list = json_of(
        &as_token(&hub, &a_admin, &["tokens", "ls", "-o", "json"]),
        "a ls",
    );
    let a_names: Vec<&str> = a_list
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(a_names, vec!["dash", "ci-bot", "a-admin", "a-deployer"]);

    // The audit log names who deployed, who submitted and who was refused.
    let audit = json_of(&hub.cli(&["audit", "-o", "json"]).unwrap(), "audit");
    let entries = audit.as_array().unwrap();
    let has = |call: &str, token: &str, ns: &str, target: &str, outcome: &str| {
        entries.iter().any(|e| {
            e["call"] == call
                && e["token_name"] == token
                && e["namespace"] == ns
                && e["target"] == target
                && e["outcome"] == outcome
        })
    };
    assert!(
        has("CreateDeployment", "admin", "a", "notes", "ok"),
        "{audit:#}"
    );
    assert!(
        has("CreateDeployment", "admin", "b", "notes", "ok"),
        "{audit:#}"
    );
    assert!(has("SubmitTask", "ci-bot", "a", "notes", "ok"), "{audit:#}");
    assert!(
        has("SubmitTask", "dash", "a", "notes", "permission_denied"),
        "{audit:#}"
    );
    assert!(
        has("SetSecret", "admin", "b", "B_ONLY_SECRET", "ok"),
        "{audit:#}"
    );
    // Reads are not audited; an admin of A reads A's entries only.
    assert!(!entries.iter().any(|e| e["call"] == "ListTasks"));
    let a_audit = json_of(
        &as_token(&hub, &a_admin, &["audit", "-o", "json"]),
        "a audit",
    );
    assert!(a_audit
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["namespace"] == "a"));
    refused(
        &as_token(&hub, &submitter, &["audit"]),
        "submitter audit",
        "needs role admin",
    );
    // And the Hub's log carries the same as structured lines.
    let log = strip_ansi(&hub.proc.log_text());
    assert!(
        log.lines().any(|l| l.contains("audit record")
            && l.contains("token_name=ci-bot")
            && l.contains("call=SubmitTask")
            && l.contains("outcome=ok")),
        "no audit line for the submit in the hub log"
    );
    assert!(
        !log.contains("served without an authorization check"),
        "an AgenService call skipped authorize"
    );
}

/// `text` without ANSI escape sequences (log lines may be coloured).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Starts `agen wait TASK` with `token`, its stderr in `log`.
fn spawn_wait(hub: &HubProcess, token: &str, task: &str, log: &Path) -> std::process::Child {
    Command::new(agen_bin())
        .args(["wait", task, "--namespace", "a", "--token", token])
        .env("AGEN_CONFIG", hub.dir.join("client.toml"))
        .env_remove("AGEN_TOKEN")
        .env_remove("AGEN_NAMESPACE")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// Waits until `agen wait` has printed the task's state (its stream is open).
fn wait_attached(log: &Path) {
    wait_for(
        "agen wait to follow the task",
        Duration::from_secs(20),
        || {
            std::fs::read_to_string(log)
                .ok()
                .filter(|t| t.contains("running"))
                .map(|_| ())
        },
    )
    .unwrap();
}

/// Exit code of `child` within `within`.
fn exits_within(child: &mut std::process::Child, within: Duration) -> i32 {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("agen wait was still attached after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn revoked_and_expired_tokens_are_refused_at_once_even_on_a_running_watch() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    // The model takes five minutes to answer: the task stays running throughout.
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [{"reply": "late", "delay_ms": 300000}]}),
    )
    .unwrap();
    let dir = tmp.path().join("bundle");
    bundle(&dir, "slow", &model);
    deploy(&hub, &dir, "a", "slow");
    let task = submit(&hub, "a", "slow", "take your time");

    // Revoked while `agen wait` follows the task.
    let (id_revoked, revoked) = api_token(&hub, "a", "viewer", "watcher", &[]);
    let log = tmp.path().join("wait-revoked.log");
    let mut waiter = spawn_wait(&hub, &revoked, &task, &log);
    wait_attached(&log);
    ok(
        &hub.cli(&["tokens", "revoke", &id_revoked]).unwrap(),
        "revoke",
    );
    let code = exits_within(&mut waiter, Duration::from_secs(20));
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(code, 5, "{text}");
    assert!(text.contains("was revoked"), "{text}");
    refused(
        &as_token(&hub, &revoked, &["tasks", "--namespace", "a"]),
        "revoked tasks",
        "was revoked",
    );

    // Expiring while `agen wait` follows the task.
    let (_, expiring) = api_token(&hub, "a", "viewer", "brief", &["--expires", "8s"]);
    let log = tmp.path().join("wait-expired.log");
    let mut waiter = spawn_wait(&hub, &expiring, &task, &log);
    wait_attached(&log);
    let code = exits_within(&mut waiter, Duration::from_secs(30));
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(code, 5, "{text}");
    assert!(text.contains("expired"), "{text}");
    refused(
        &as_token(&hub, &expiring, &["tasks", "--namespace", "a"]),
        "expired tasks",
        "expired",
    );

    // A rotated token keeps its id and scope; the old secret stops working.
    let (id, old) = api_token(&hub, "a", "viewer", "rotating", &[]);
    let rotated = json_of(
        &hub.cli(&["tokens", "rotate", &id, "-o", "json"]).unwrap(),
        "rotate",
    );
    assert_eq!(rotated["id"], id.as_str());
    assert_eq!(rotated["namespace"], "a");
    let new = rotated["secret"].as_str().unwrap();
    refused(
        &as_token(&hub, &old, &["tasks", "--namespace", "a"]),
        "old",
        "not a token",
    );
    ok(
        &as_token(&hub, new, &["tasks", "--namespace", "a"]),
        "rotated",
    );

    // The task itself was never disturbed.
    let q = json_of(
        &hub.cli(&["query", &task, "--namespace", "a", "-o", "json"])
            .unwrap(),
        "query",
    );
    assert_eq!(q["state"], "running", "{q}");
    ok(
        &hub.cli(&["cancel", &task, "--namespace", "a"]).unwrap(),
        "cancel",
    );

    // A Hub restart forgets none of it.
    let mut hub = hub;
    hub.restart().unwrap();
    refused(
        &as_token(&hub, &revoked, &["tasks", "--namespace", "a"]),
        "revoked after restart",
        "was revoked",
    );
    refused(
        &as_token(&hub, &old, &["tasks", "--namespace", "a"]),
        "old after restart",
        "not a token",
    );
    ok(
        &as_token(&hub, new, &["tasks", "--namespace", "a"]),
        "rotated after restart",
    );
    let audit = json_of(&hub.cli(&["audit", "-o", "json"]).unwrap(), "audit");
    assert!(
        audit
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["call"] == "RevokeToken" && e["target"] == id_revoked.as_str()),
        "{audit:#}"
    );
}

/// Calls `NestService.Join` as a rogue would: the Hub's CA pinned, `token` as the bearer, a
/// fresh key, and whatever nest id it likes.
fn join(hub: &HubProcess, token: &str, nest_id: &str) -> Result<pb::JoinResponse, tonic::Status> {
    join_with(hub, Some(token), nest_id, None)
}

/// `NestService.Join` with an optional bearer and, optionally, as the Nest whose data dir is
/// `nest_dir` (its own key for the CSR and its certificate for mutual TLS).
fn join_with(
    hub: &HubProcess,
    token: Option<&str>,
    nest_id: &str,
    nest_dir: Option<&Path>,
) -> Result<pb::JoinResponse, tonic::Status> {
    use agen_proto::v1::nest_service_client::NestServiceClient;
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    agen_shared::tls::install_crypto_provider();
    let ca = std::fs::read_to_string(hub.dir.join("hub/tls/ca.pem")).unwrap();
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
    let csr_pem = match nest_dir {
        Some(dir) => {
            let key = std::fs::read_to_string(dir.join("nest.key")).unwrap();
            let cert = std::fs::read_to_string(dir.join("nest.crt")).unwrap();
            tls = tls.identity(Identity::from_pem(cert, &key));
            agen_shared::tls::nest_csr_for_key(&key, nest_id).unwrap()
        }
        None => agen_shared::tls::nest_key_and_csr(nest_id).unwrap().1,
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let channel = Endpoint::from_shared(hub.url())
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut req = tonic::Request::new(pb::JoinRequest {
            nest_id: nest_id.into(),
            name: "rogue".into(),
            csr_pem,
        });
        if let Some(token) = token {
            req.metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        NestServiceClient::new(channel)
            .join(req)
            .await
            .map(|r| r.into_inner())
    })
}

fn nest_state(hub: &HubProcess, name: &str) -> String {
    hub.nests()
        .unwrap()
        .iter()
        .find(|n| n["name"] == name)
        .map(|n| n["state"].as_str().unwrap_or("").to_owned())
        .unwrap_or_default()
}

#[test]
fn a_nest_is_who_its_key_says_and_join_tokens_and_nests_can_be_revoked() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let mut victim = hub.nest("victim", &[], &[]).unwrap();
    let victim_id = std::fs::read_to_string(victim.dir.join("node-id"))
        .unwrap()
        .trim()
        .to_owned();
    let boot = hub.join_token().unwrap();

    // Join with a live Nest's id and a valid join token: refused, and the victim stays.
    let err = join(&hub, &boot, &victim_id).unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("cannot take over"),
        "{}",
        err.message()
    );
    assert_eq!(nest_state(&hub, "victim"), "ready");
    // Without a join token, a Join for a new id is refused; the Nest itself renews its own
    // certificate with its own key and certificate, no token needed.
    assert_eq!(
        join_with(&hub, None, "fresh-0", None).unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    let renewed = join_with(&hub, None, &victim_id, Some(&victim.dir)).unwrap();
    assert!(agen_shared::tls::nest_cert_is_current(
        &renewed.cert_pem,
        &renewed.ca_pem,
        &victim_id
    ));
    // The bootstrap token still joins new Nests (no expiry, unlimited uses).
    join(&hub, &boot, "fresh-1").unwrap();

    // A join token with one use joins once; a revoked one never.
    let once = json_of(
        &hub.cli(&[
            "tokens", "create", "--join", "--uses", "1", "--name", "one", "-o", "json",
        ])
        .unwrap(),
        "create join",
    );
    let once = once["secret"].as_str().unwrap().to_owned();
    join(&hub, &once, "fresh-2").unwrap();
    let err = join(&hub, &once, "fresh-3").unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert!(err.message().contains("used 1 of 1"), "{}", err.message());
    let revoked = json_of(
        &hub.cli(&[
            "tokens",
            "create",
            "--join",
            "--expires",
            "1h",
            "-o",
            "json",
        ])
        .unwrap(),
        "create join",
    );
    ok(
        &hub.cli(&["tokens", "revoke", revoked["id"].as_str().unwrap()])
            .unwrap(),
        "revoke join",
    );
    let err = join(&hub, revoked["secret"].as_str().unwrap(), "fresh-4").unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert!(err.message().contains("was revoked"), "{}", err.message());
    let listed = ok(&hub.cli(&["tokens", "ls", "-o", "json"]).unwrap(), "ls");
    assert!(!listed.contains(boot.rsplit('.').next().unwrap()));
    assert!(!listed.contains(once.rsplit('.').next().unwrap()));

    // A revoked Nest is cut off at once and refused when it comes back.
    let rogue = hub.nest("rogue", &[], &[]).unwrap();
    ok(
        &hub.cli(&["nests", "revoke", "rogue"]).unwrap(),
        "nests revoke",
    );
    wait_for("the revoked nest to drop", Duration::from_secs(30), || {
        (nest_state(&hub, "rogue") != "ready").then_some(())
    })
    .unwrap();
    wait_for(
        "the revoked nest to be refused",
        Duration::from_secs(20),
        || rogue.proc.log_text().contains("was revoked").then_some(()),
    )
    .unwrap();
    assert_ne!(nest_state(&hub, "rogue"), "ready");
    let listed = hub.nests().unwrap();
    let revoked_flag = |name: &str| {
        listed
            .iter()
            .find(|n| n["name"] == name)
            .map(|n| n["revoked"].clone())
    };
    assert_eq!(revoked_flag("rogue"), Some(json!(true)));
    assert_eq!(revoked_flag("victim"), Some(json!(false)));
    assert_eq!(nest_state(&hub, "victim"), "ready");
    // Forgetting it lets its id join again (with a new key and a join token).
    let rogue_id = std::fs::read_to_string(rogue.dir.join("node-id"))
        .unwrap()
        .trim()
        .to_owned();
    assert_eq!(
        join(&hub, &boot, &rogue_id).unwrap_err().code(),
        tonic::Code::PermissionDenied
    );
    ok(
        &hub.cli(&["nests", "forget", &rogue_id]).unwrap(),
        "nests forget",
    );
    join(&hub, &boot, &rogue_id).unwrap();

    // The join token is on no command line and in no log.
    let secret = boot.rsplit('.').next().unwrap().to_owned();
    let mut cmdlines = 0;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            cmdlines += 1;
            assert!(
                !String::from_utf8_lossy(&c).contains(&secret),
                "the join token is on the command line of pid {:?}",
                e.file_name()
            );
        }
    }
    assert!(cmdlines > 3);
    for log in [
        hub.proc.log_text(),
        victim.proc.log_text(),
        rogue.proc.log_text(),
    ] {
        assert!(!log.is_empty());
        assert!(!log.contains(&secret), "the join token is in a log");
    }

    // A Nest with a certificate needs the join token no more: revoke it, and the Nest stays,
    // and comes back after a restart.
    let tokens = json_of(&hub.cli(&["tokens", "ls", "-o", "json"]).unwrap(), "ls");
    let boot_id = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "join-token")
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .unwrap();
    ok(
        &hub.cli(&["tokens", "revoke", &boot_id]).unwrap(),
        "revoke boot",
    );
    assert_eq!(
        join(&hub, &boot, "fresh-5").unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    victim.proc.stop(Duration::from_secs(10));
    wait_for("the victim to drop", Duration::from_secs(30), || {
        (nest_state(&hub, "victim") != "ready").then_some(())
    })
    .unwrap();
    let _victim = hub.nest("victim", &[], &[]).unwrap();
}

/// `agen tokens rename`: the name rule applies to the new name, id and secret stay, and the
/// rename is in the audit log.
#[test]
fn a_token_is_renamed_under_the_name_rule_and_keeps_its_secret() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let made = json_of(
        &hub.cli(&[
            "tokens",
            "create",
            "--namespace",
            "default",
            "--role",
            "viewer",
            "--name",
            "old",
            "-o",
            "json",
        ])
        .unwrap(),
        "create",
    );
    let (id, secret) = (
        made["id"].as_str().unwrap(),
        made["secret"].as_str().unwrap(),
    );
    for bad in ["admin", "a\u{1b}[2Jb"] {
        let out = hub.cli(&["tokens", "rename", id, bad]).unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {out:?}");
    }
    let renamed = json_of(
        &hub.cli(&["tokens", "rename", id, "looker", "-o", "json"])
            .unwrap(),
        "rename",
    );
    assert_eq!(
        (renamed["id"].as_str(), renamed["name"].as_str()),
        (Some(id), Some("looker"))
    );
    ok(
        &as_token(&hub, secret, &["tasks"]),
        "the secret still works",
    );
    let audit = json_of(&hub.cli(&["audit", "-o", "json"]).unwrap(), "audit");
    let renames: Vec<&Value> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["call"] == "RenameToken")
        .collect();
    assert_eq!(renames.len(), 3, "{audit:#}");
    assert_eq!(
        renames.iter().filter(|e| e["outcome"] == "ok").count(),
        1,
        "{audit:#}"
    );
}
