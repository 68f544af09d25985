//! Day two, audit and credentials (issue 42, item 7) on a real Hub: an approval's audit entry
//! says the decision, the tool call, the reason and the client's address, and `agen audit
//! --namespace` keeps to one namespace; audit entries go after `--audit-retention`; the
//! built-in join token expires (`--join-token-ttl`), one an older Hub made without an expiry is
//! given one at start, an expired one is refused naming the expiry and `agen tokens create
//! --join`, and a Nest that joined before restarts fine after it.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use agen_tests::{agen_bin, wait_for, HubProcess, Proc};
use serde_json::Value;

use crate::approvals::{decide, deploy_asker, model, pending_of, submit};

fn audit(hub: &HubProcess, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["audit", "-o", "json"];
    all.extend_from_slice(args);
    match hub.cli_json(&all).unwrap() {
        Value::Array(a) => a,
        other => panic!("audit printed {other}"),
    }
}

fn create_token(hub: &HubProcess, ns: &str, role: &str, name: &str) -> String {
    let v = hub
        .cli_json(&[
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
        ])
        .unwrap();
    v["secret"].as_str().unwrap().to_owned()
}

#[test]
fn an_approvals_audit_entry_says_the_decision_the_call_the_reason_and_the_peer() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let marker = tmp.path().join("run-executions.txt");
    let model = model(tmp.path(), &marker);
    deploy_asker(&hub, &tmp.path().join("asker"), "asker", &model);
    let viewer = create_token(&hub, "default", "viewer", "watcher");
    create_token(&hub, "other", "viewer", "elsewhere");

    // A deny with a reason; a viewer's refused approve; an approve always.
    let denied = submit(&hub, "asker");
    let call_id = pending_of(&hub, &denied)["call_id"]
        .as_str()
        .unwrap()
        .to_string();
    let out = decide(&hub, &["deny", &denied, "--reason", "not on a Friday"]);
    assert!(out.status.success(), "deny: {out:?}");
    let approved = submit(&hub, "asker");
    let approved_call = pending_of(&hub, &approved)["call_id"]
        .as_str()
        .unwrap()
        .to_string();
    let out = decide(&hub, &["approve", &approved, "--token", &viewer]);
    assert!(!out.status.success(), "a viewer cannot decide: {out:?}");
    let out = decide(&hub, &["approve", &approved, "--always"]);
    assert!(out.status.success(), "approve --always: {out:?}");

    let decisions = audit(&hub, &["--action", "DecideApproval"]);
    assert_eq!(decisions.len(), 3, "{decisions:#?}");
    let find = |task: &str, outcome: &str| {
        decisions
            .iter()
            .find(|e| e["target"] == task && e["outcome"] == outcome)
            .unwrap_or_else(|| panic!("no {outcome} entry for {task}: {decisions:#?}"))
    };
    let deny = find(&denied, "ok");
    assert_eq!(deny["decision"], "deny", "{deny}");
    assert_eq!(deny["tool_call"]["task"], denied.as_str(), "{deny}");
    assert_eq!(deny["tool_call"]["call_id"], call_id.as_str(), "{deny}");
    assert_eq!(deny["tool_call"]["tool"], "ws.run", "{deny}");
    assert_eq!(deny["reason"], "not on a Friday", "{deny}");
    let refused = find(&approved, "permission_denied");
    assert_eq!(refused["decision"], "approve", "{refused}");
    assert_eq!(refused["token_name"], "watcher", "{refused}");
    let always = find(&approved, "ok");
    assert_eq!(always["decision"], "approve always", "{always}");
    assert_eq!(always["tool_call"]["call_id"], approved_call.as_str());
    assert_eq!(always["reason"], Value::Null, "{always}");
    // The peer: the CLI's own end of the connection (loopback, not the Hub's port).
    for e in &decisions {
        let peer: SocketAddr = e["peer"]
            .as_str()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no peer address in {e}"));
        assert!(peer.ip().is_loopback(), "{e}");
        assert_ne!(peer.port(), hub.port, "{e}");
    }
    // Entries of other calls carry a peer too, and no decision.
    let created = audit(&hub, &["--action", "CreateToken"]);
    assert!(
        created
            .iter()
            .all(|e| e["peer"].is_string() && e["decision"].is_null()),
        "{created:#?}"
    );

    // The table shows them; `--namespace` keeps to one namespace.
    let table = hub.cli(&["audit", "--action", "DecideApproval"]).unwrap();
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(
        table.contains("PEER") && table.contains("DECISION"),
        "{table}"
    );
    assert!(
        table.contains(&format!(
            "deny ws.run (call {call_id} of task {denied}): \"not on a Friday\""
        )),
        "{table}"
    );
    let other = audit(&hub, &["--namespace", "other"]);
    assert_eq!(other.len(), 1, "{other:#?}");
    assert_eq!(other[0]["call"], "CreateToken", "{other:#?}");
    let default = audit(&hub, &["--namespace", "default"]);
    assert_eq!(
        default
            .iter()
            .filter(|e| e["namespace"] != "default")
            .count(),
        0,
        "{default:#?}"
    );
    assert_eq!(
        default
            .iter()
            .filter(|e| e["call"] == "DecideApproval")
            .count(),
        3
    );
}

#[test]
fn audit_entries_go_after_the_audit_retention_and_newer_ones_stay() {
    let help = Command::new(agen_bin())
        .args(["hub", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--audit-retention"), "{help}");
    assert!(help.contains("[default: 400d]"), "{help}");

    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start_with_args(
        tmp.path(),
        agen_tests::free_port(),
        "3s",
        &["--audit-retention", "5s"],
    )
    .unwrap();
    create_token(&hub, "a", "viewer", "old-one");
    let written = audit(&hub, &[]);
    assert_eq!(written.len(), 1, "{written:#?}");
    assert_eq!(written[0]["namespace"], "a", "{written:#?}");
    wait_for(
        "the entry to pass the retention",
        Duration::from_secs(30),
        || audit(&hub, &[]).is_empty().then_some(()),
    )
    .unwrap();
    // A new entry is kept (only what is older than the retention goes).
    create_token(&hub, "b", "viewer", "new-one");
    let now = audit(&hub, &[]);
    assert_eq!(now.len(), 1, "{now:#?}");
    assert_eq!(now[0]["namespace"], "b", "{now:#?}");
    assert!(
        hub.proc
            .log_text()
            .contains("removed audit records past the audit retention"),
        "{}",
        hub.proc.log_text()
    );
}

/// `agen nest` joining with the token in `join_file`, named `name`, data under the Hub's dir.
fn spawn_nest(hub: &HubProcess, name: &str, join_file: &Path) -> Proc {
    let dir = hub.dir.join("nests").join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = Command::new(agen_bin());
    cmd.args(["nest", "--hub", &hub.url(), "--name", name, "--run-as-self"])
        .arg("--join-file")
        .arg(join_file)
        .arg("--data-dir")
        .arg(&dir)
        .env("RUST_LOG", "info");
    Proc::spawn(name, cmd, &hub.dir.join(format!("nest-{name}.log"))).unwrap()
}

fn ready(hub: &HubProcess, name: &str) -> bool {
    hub.nests()
        .unwrap_or_default()
        .iter()
        .any(|n| n["name"] == name && n["state"] == "ready")
}

fn builtin_join_token(hub: &HubProcess) -> Value {
    let list = hub.cli_json(&["tokens", "ls", "-o", "json"]).unwrap();
    list.as_array()
        .and_then(|l| l.iter().find(|t| t["name"] == "join-token"))
        .cloned()
        .unwrap_or_else(|| panic!("no built-in join token in {list:#}"))
}

#[test]
fn the_builtin_join_token_expires_and_a_joined_nest_restarts_fine_after() {
    // An older Hub's token: no expiry (`--join-token-ttl 0`).
    let tmp = tempfile::tempdir().unwrap();
    let mut hub = HubProcess::start_with_args(
        tmp.path(),
        agen_tests::free_port(),
        "3s",
        &["--join-token-ttl", "0"],
    )
    .unwrap();
    assert_eq!(builtin_join_token(&hub)["expires_at"], Value::Null);

    // The upgraded Hub gives it an expiry at start and logs it.
    hub.extra_args = vec!["--join-token-ttl".into(), "12s".into()];
    hub.restart().unwrap();
    let token = builtin_join_token(&hub);
    assert!(token["expires_at"].is_string(), "{token}");
    assert!(
        hub.proc
            .log_text()
            .contains("the built-in join token had no expiry"),
        "{}",
        hub.proc.log_text()
    );

    // A Nest joins before the expiry.
    let mut early = hub.nest("early", &[], &[]).unwrap();
    wait_for("the join token to expire", Duration::from_secs(30), || {
        (builtin_join_token(&hub)["state"] == "expired").then_some(())
    })
    .unwrap();

    // A new Nest with the expired token is refused, told the expiry and the fix.
    let join_file = hub.dir.join("hub/join-token");
    let mut late = spawn_nest(&hub, "late", &join_file);
    let log = wait_for(
        "the late nest to be refused",
        Duration::from_secs(30),
        || {
            let log = late.log_text();
            log.contains("agen tokens create --join").then_some(log)
        },
    )
    .unwrap();
    assert!(log.contains("expired at 20"), "{log}");
    assert!(!ready(&hub, "late"));
    late.stop(Duration::from_secs(5));

    // The joined Nest restarts fine: it uses its certificate, not the token.
    early.proc.stop(Duration::from_secs(20));
    let _early = hub.nest("early", &[], &[]).unwrap();

    // `agen tokens create --join` makes another (24h unless --ttl); the late Nest joins with it.
    let fresh = hub
        .cli_json(&["tokens", "create", "--join", "-o", "json"])
        .unwrap();
    let expires = fresh["expires_at"].as_str().unwrap_or_default().to_string();
    assert!(!expires.is_empty(), "{fresh}");
    let short = hub
        .cli_json(&["tokens", "create", "--join", "--ttl", "1h", "-o", "json"])
        .unwrap();
    assert!(
        short["expires_at"].as_str().unwrap_or_default() < expires.as_str(),
        "{short} vs {fresh}"
    );
    let file = tmp.path().join("fresh-join-token");
    std::fs::write(&file, short["secret"].as_str().unwrap()).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let _late = spawn_nest(&hub, "late", &file);
    wait_for("the late nest to join", Duration::from_secs(30), || {
        ready(&hub, "late").then_some(())
    })
    .unwrap();
    let ready_count = hub
        .nests()
        .unwrap()
        .iter()
        .filter(|n| n["state"] == "ready")
        .count();
    assert_eq!(ready_count, 2, "early and late");
}

#[test]
fn an_a2a_audit_entry_carries_the_http_peer_address_like_a_grpc_one() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let token = std::fs::read_to_string(hub.dir.join("hub/admin-token")).unwrap();
    let body = r#"{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"messageId": "m-audit", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}}"#;
    // curl, as any HTTP client: a SendMessage to a deployment that does not exist is refused
    // and audited.
    let out = Command::new("curl")
        .args(["-sS", "--cacert"])
        .arg(hub.dir.join("hub/tls/ca.pem"))
        .args([
            "--resolve",
            &format!("localhost:{}:127.0.0.1", hub.port),
            "-H",
            &format!("Authorization: Bearer {}", token.trim()),
            "-H",
            "Content-Type: application/json",
            "--data",
            body,
            &format!("https://localhost:{}/a2a/default/ghost", hub.port),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let entries = wait_for("the A2A audit entry", Duration::from_secs(10), || {
        let a: Vec<Value> = audit(&hub, &[])
            .into_iter()
            .filter(|e| e["call"] == "A2A.SendMessage")
            .collect();
        (!a.is_empty()).then_some(a)
    })
    .unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let e = &entries[0];
    let peer: SocketAddr = e["peer"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no peer address in {e}"));
    assert!(peer.ip().is_loopback(), "{e}");
    assert_ne!(
        peer.port(),
        hub.port,
        "the client's end, not the Hub's: {e}"
    );
    assert_eq!(e["outcome"], "refused", "{e}");
}
