//! The Hub as an A2A server (issue 18), spoken to by the REAL PyPI `a2a-sdk` 1.3 client
//! (`tests/peers/a2a_client.py`, JSON-RPC over HTTP/1.1 on the Hub's TLS port) on a real fleet:
//! the agent card, `SendMessage` to completion, streaming with a progress status update and an
//! artifact the agent saved, `GetTask`, `CancelTask`, a `contextId` continuing a conversation,
//! `TASK_STATE_INPUT_REQUIRED` for an `ask` call, and tokens that may not submit refused (the
//! card too, on a Hub with `--a2a-public-cards=false`).

#![allow(clippy::unwrap_used)] // a test: a panic is a failure with its message

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use agen_tests::{
    free_port, mcp_json, wait_for, write_bundle, FakeModel, HubProcess, NestProcess, Peers,
};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};

pub(crate) struct Fleet {
    pub(crate) tmp: tempfile::TempDir,
    pub(crate) hub: HubProcess,
    pub(crate) _nest: Option<NestProcess>,
    pub(crate) models: Vec<FakeModel>,
}

impl Fleet {
    pub(crate) fn start() -> Fleet {
        let tmp = tempfile::tempdir().unwrap();
        let hub = HubProcess::start(tmp.path()).unwrap();
        let nest = hub.nest("solo", &[], &[]).unwrap();
        Fleet {
            tmp,
            hub,
            _nest: Some(nest),
            models: Vec::new(),
        }
    }

    /// Deploys `name` whose model follows `script`, with more bundle files.
    pub(crate) fn deploy(&mut self, name: &str, script: Value, files: &[(&str, String)]) {
        let model =
            FakeModel::start(&self.tmp.path().join(format!("model-{name}")), &script).unwrap();
        let dir = self.tmp.path().join(name);
        let mut all = vec![(
            "x-agen/agent.md",
            format!(
                "---\nname: {name}\nmodel: openai/fake-model\nbaseUrl: {}\ndescription: The {name} agent, for A2A tests.\n---\n# {name}\n\nYou are {name}.\n",
                model.base_url()
            ),
        )];
        all.extend(files.iter().cloned());
        write_bundle(&dir, &all).unwrap();
        let out = self
            .hub
            .cli(&["deploy", dir.to_str().unwrap(), "--name", name, "--wait"])
            .unwrap();
        assert!(
            out.status.success(),
            "deploy {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.models.push(model);
    }

    pub(crate) fn admin_token(&self) -> String {
        std::fs::read_to_string(self.hub.dir.join("hub/admin-token"))
            .unwrap()
            .trim()
            .to_owned()
    }

    pub(crate) fn token(&self, namespace: &str, role: &str, name: &str) -> String {
        let t = self
            .hub
            .cli_json(&[
                "tokens",
                "create",
                "--namespace",
                namespace,
                "--role",
                role,
                "--name",
                name,
                "-o",
                "json",
            ])
            .unwrap();
        t["secret"].as_str().unwrap().to_owned()
    }

    /// Runs one operation of the a2a-sdk client against deployment `deployment`.
    pub(crate) fn a2a(&self, token: &str, deployment: &str, op: Value) -> Value {
        self.a2a_at(&self.hub.url(), token, deployment, op)
    }

    /// [`Fleet::a2a`] with the Hub at `base` (a public URL).
    pub(crate) fn a2a_at(&self, base: &str, token: &str, deployment: &str, op: Value) -> Value {
        self.a2a_to(&format!("{base}/a2a/default/{deployment}"), token, op)
    }

    /// [`Fleet::a2a`] with the agent at `agent` (its interface URL, the card below it).
    pub(crate) fn a2a_to(&self, agent: &str, token: &str, mut op: Value) -> Value {
        op["agent"] = json!(agent);
        op["token"] = json!(token);
        op["ca_file"] = json!(self.hub.dir.join("hub/tls/ca.pem"));
        let mut child = Command::new(Peers::python())
            .arg(Peers::script("a2a_client.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(op.to_string().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "a2a_client.py printed no JSON ({}): {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    pub(crate) fn state_of(&self, task: &str) -> String {
        let q = self.hub.cli_json(&["query", task, "-o", "json"]).unwrap();
        q["state"].as_str().unwrap_or_default().to_owned()
    }
}

/// The text of a status message.
pub(crate) fn status_text(status: &Value) -> String {
    status["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The task of a one-event (non-streaming) send.
pub(crate) fn sent_task(r: &Value) -> Value {
    let events = r["events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events: {r}"));
    assert_eq!(events.len(), 1, "{r}");
    events[0]["task"].clone()
}

fn writer_script() -> Value {
    json!({"steps": [
        {"tool_calls": [{"name": "report_progress", "arguments": {"step": "drafting the summary"}}]},
        {"delay_ms": 300, "tool_calls": [{"name": "save_artifact", "arguments": {"name": "summary", "content": "# Summary\nall good", "mediaType": "text/markdown"}}]},
        {"reply": "summary saved"}
    ]})
}

#[test]
fn an_a2a_sdk_client_fetches_the_card_sends_streams_gets_cancels_and_continues_a_context() {
    let mut f = Fleet::start();
    f.deploy("writer", writer_script(), &[]);
    f.deploy("echo", json!([{"echo_history": true}]), &[]);
    f.deploy("slow", json!([{"delay_ms": 60000, "reply": "late"}]), &[]);
    let token = f.token("default", "submitter", "a2a-caller");

    // The card: name and description from agent.md, one skill for the agent, streaming, bearer
    // auth, and the JSON-RPC interface on the Hub's URL.
    let card = f.a2a(&token, "writer", json!({"op": "card"}));
    let card = &card["card"];
    assert_eq!(card["name"], "writer", "{card}");
    assert_eq!(
        card["description"], "The writer agent, for A2A tests.",
        "{card}"
    );
    assert_eq!(
        card["supportedInterfaces"],
        json!([{"url": format!("{}/a2a/default/writer", f.hub.url()), "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}]),
        "{card}"
    );
    assert_eq!(card["capabilities"]["streaming"], true, "{card}");
    assert_eq!(card["skills"][0]["id"], "writer", "{card}");
    assert_eq!(
        card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"], "Bearer",
        "{card}"
    );

    // `agen a2a ls` prints each deployment's card URL (the Hub's listen address by default).
    let ls = f.hub.cli_json(&["a2a", "ls", "-o", "json"]).unwrap();
    let listed: Vec<(String, String)> = ls
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["deployment"].as_str().unwrap().to_owned(),
                d["card_url"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let card_url = |d: &str| {
        format!(
            "{}/a2a/default/{d}/.well-known/agent-card.json",
            f.hub.url()
        )
    };
    assert_eq!(
        listed,
        vec![
            ("echo".to_owned(), card_url("echo")),
            ("slow".to_owned(), card_url("slow")),
            ("writer".to_owned(), card_url("writer")),
        ]
    );

    // SendMessage waits for the end: the result, and the artifact with its content.
    let r = f.a2a(
        &token,
        "writer",
        json!({"op": "send", "text": "write the summary"}),
    );
    let t = sent_task(&r);
    assert_eq!(t["status"]["state"], "TASK_STATE_COMPLETED", "{r}");
    assert_eq!(status_text(&t["status"]), "summary saved", "{r}");
    assert_eq!(t["artifacts"].as_array().map(Vec::len), Some(1), "{r}");
    let a = &t["artifacts"][0];
    assert_eq!(
        (
            a["name"].clone(),
            a["parts"][0]["text"].clone(),
            a["parts"][0]["mediaType"].clone()
        ),
        (
            json!("summary"),
            json!("# Summary\nall good"),
            json!("text/markdown")
        ),
        "{r}"
    );
    // The A2A task id is the Agen task id.
    let id = t["id"].as_str().unwrap().to_owned();
    assert_eq!(f.state_of(&id), "succeeded");

    // SendStreamingMessage: the task, a progress status update, the artifact, the end.
    let r = f.a2a(
        &token,
        "writer",
        json!({"op": "send", "text": "again, streamed", "stream": true}),
    );
    let events = r["events"].as_array().unwrap_or_else(|| panic!("{r}"));
    assert!(
        events[0].get("task").is_some(),
        "first event is the task: {r}"
    );
    let sid = events[0]["task"]["id"].as_str().unwrap().to_owned();
    let progress = events.iter().position(|e| {
        e["statusUpdate"]["status"]["state"] == "TASK_STATE_WORKING"
            && status_text(&e["statusUpdate"]["status"]).contains("drafting the summary")
    });
    let artifact = events
        .iter()
        .position(|e| e["artifactUpdate"]["artifact"]["name"] == "summary");
    let last = events.last().unwrap();
    assert!(progress.is_some(), "a progress status update: {r}");
    assert!(artifact.is_some(), "an artifact update: {r}");
    assert!(
        progress < artifact,
        "progress came before the artifact: {r}"
    );
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{r}"
    );
    assert_eq!(last["statusUpdate"]["taskId"], sid.as_str(), "{r}");
    assert_eq!(
        events[artifact.unwrap()]["artifactUpdate"]["artifact"]["parts"][0]["text"],
        "# Summary\nall good"
    );

    // GetTask: the finished task, its input as history.
    let g = f.a2a(&token, "writer", json!({"op": "get", "id": sid}));
    assert_eq!(g["task"]["status"]["state"], "TASK_STATE_COMPLETED", "{g}");
    assert_eq!(
        g["task"]["history"][0]["parts"][0]["text"], "again, streamed",
        "{g}"
    );
    // A task of another deployment is not found here.
    let g = f.a2a(&token, "echo", json!({"op": "get", "id": sid}));
    assert!(
        g["error"].as_str().is_some_and(|e| e.contains("not found")),
        "{g}"
    );

    // A contextId continues a conversation: the second task sees the first message.
    let r1 = f.a2a(
        &token,
        "echo",
        json!({"op": "send", "text": "first", "context_id": "a2a-conversation-1"}),
    );
    let t1 = sent_task(&r1);
    assert_eq!(t1["contextId"], "a2a-conversation-1", "{r1}");
    assert_eq!(status_text(&t1["status"]), "user messages: first", "{r1}");
    let r2 = f.a2a(
        &token,
        "echo",
        json!({"op": "send", "text": "second", "context_id": "a2a-conversation-1"}),
    );
    let t2 = sent_task(&r2);
    assert_eq!(
        status_text(&t2["status"]),
        "user messages: first | second",
        "{r2}"
    );
    assert_ne!(t1["id"], t2["id"]);
    // Without a contextId the Hub makes one, and it continues too.
    let r3 = f.a2a(&token, "echo", json!({"op": "send", "text": "alpha"}));
    let ctx = sent_task(&r3)["contextId"].as_str().unwrap().to_owned();
    let r4 = f.a2a(
        &token,
        "echo",
        json!({"op": "send", "text": "beta", "context_id": ctx}),
    );
    assert_eq!(
        status_text(&sent_task(&r4)["status"]),
        "user messages: alpha | beta",
        "{r4}"
    );
    // A resent message (same messageId) finds its task instead of running again.
    let again = f.a2a(&token, "echo", json!({"op": "send", "text": "alpha", "message_id": r3["events"][0]["task"]["history"][0]["messageId"]}));
    assert_eq!(sent_task(&again)["id"], sent_task(&r3)["id"], "{again}");

    // CancelTask: a running task ends CANCELED; it cannot be cancelled twice or sent to.
    let r = f.a2a(
        &token,
        "slow",
        json!({"op": "send", "text": "take your time", "return_immediately": true}),
    );
    let slow = sent_task(&r)["id"].as_str().unwrap().to_owned();
    wait_for("the slow task to run", Duration::from_secs(60), || {
        (f.state_of(&slow) == "running").then_some(())
    })
    .unwrap();
    let c = f.a2a(&token, "slow", json!({"op": "cancel", "id": slow}));
    assert_eq!(c["task"]["status"]["state"], "TASK_STATE_CANCELED", "{c}");
    assert_eq!(f.state_of(&slow), "cancelled");
    let c = f.a2a(&token, "slow", json!({"op": "cancel", "id": slow}));
    assert!(
        c["error"]
            .as_str()
            .is_some_and(|e| e.contains("already ended")),
        "{c}"
    );
    let s = f.a2a(
        &token,
        "slow",
        json!({"op": "send", "text": "more", "task_id": slow}),
    );
    assert!(
        s["error"]
            .as_str()
            .is_some_and(|e| e.contains("has ended") && e.contains("contextId")),
        "{s}"
    );

    // A stream ends the moment its token is revoked.
    let t = f
        .hub
        .cli_json(&[
            "tokens",
            "create",
            "--namespace",
            "default",
            "--role",
            "submitter",
            "--name",
            "a2a-watcher",
            "-o",
            "json",
        ])
        .unwrap();
    let (watcher_id, watcher) = (
        t["id"].as_str().unwrap().to_owned(),
        t["secret"].as_str().unwrap().to_owned(),
    );
    let r = f.a2a(
        &watcher,
        "slow",
        json!({"op": "send", "text": "watch me", "return_immediately": true}),
    );
    let watched = sent_task(&r)["id"].as_str().unwrap().to_owned();
    let mut op = json!({"op": "subscribe", "id": watched, "announce": true});
    op["agent"] = json!(format!("{}/a2a/default/slow", f.hub.url()));
    op["token"] = json!(watcher);
    op["ca_file"] = json!(f.hub.dir.join("hub/tls/ca.pem"));
    let mut child = Command::new(Peers::python())
        .arg(Peers::script("a2a_client.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(op.to_string().as_bytes())
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert_eq!(first, r#"{"attached": true}"#);
    let out = f.hub.cli(&["tokens", "revoke", &watcher_id]).unwrap();
    assert!(
        out.status.success(),
        "revoke: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let revoked_at = std::time::Instant::now();
    let last: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let ended_in = revoked_at.elapsed();
    child.wait().unwrap();
    assert!(
        last["error"]
            .as_str()
            .is_some_and(|e| e.contains("revoked")),
        "{last}"
    );
    assert!(
        ended_in < Duration::from_secs(5),
        "the stream ended {ended_in:?} after the revoke"
    );
    assert_eq!(f.state_of(&watched), "running", "the task itself goes on");
}

#[test]
fn an_ask_call_is_input_required_over_a2a_and_tokens_that_may_not_submit_are_refused() {
    // The Hub's public URL (here `localhost`, a name its certificate has) makes the card URLs
    // and the cards' interface URLs; clients then reach it there. Its cards are private
    // (`--a2a-public-cards=false`): a card needs a token as the methods do; and detailed
    // (`--a2a-card-details`).
    let port = free_port();
    let public = format!("https://localhost:{port}");
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start_with_args(
        tmp.path(),
        port,
        "3s",
        &[
            "--public-url",
            &public,
            "--a2a-public-cards=false",
            "--a2a-card-details",
        ],
    )
    .unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    let mut f = Fleet {
        tmp,
        hub,
        _nest: Some(nest),
        models: Vec::new(),
    };
    let marker = f.tmp.path().join("run-executions.txt");
    let script = json!({"steps": [
        {"tool_calls": [{"name": "ws_run", "arguments": {"command": format!("echo ran >> {}", marker.display())}}]},
        {"reply_template": "saw: {{last_tool_result}}"}
    ]});
    f.deploy(
        "asker",
        script,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "ws",
                    json!({"command": "agen", "args": ["mcp", "workspace", "--root", "."]}),
                )]),
            ),
            (
                "x-agen/config.json",
                json!({"permissions": {"ask": ["ws.run"]}}).to_string(),
            ),
        ],
    );
    let admin = f.admin_token();
    let ls = f.hub.cli_json(&["a2a", "ls", "-o", "json"]).unwrap();
    assert_eq!(
        ls[0]["card_url"],
        format!("{public}/a2a/default/asker/.well-known/agent-card.json"),
        "{ls}"
    );
    let card = f.a2a_at(&public, &admin, "asker", json!({"op": "card"}));
    assert_eq!(
        card["card"]["supportedInterfaces"][0]["url"],
        format!("{public}/a2a/default/asker"),
        "{card}"
    );
    // `--a2a-card-details`: the well-known card says what the extended card says.
    let ext = f.a2a_at(&public, &admin, "asker", json!({"op": "extended_card"}));
    assert_eq!(
        (
            card["card"]["version"].clone(),
            card["card"]["provider"]["organization"].clone()
        ),
        (
            ext["card"]["version"].clone(),
            json!("Agen deployment default/asker")
        ),
        "{card} {ext}"
    );
    assert_ne!(card["card"]["version"], "generation 1", "{card}");

    // The blocking send comes back when the task needs a person: INPUT_REQUIRED, naming
    // `agen approve`.
    let r = f.a2a_at(
        &public,
        &admin,
        "asker",
        json!({"op": "send", "text": "run it"}),
    );
    let t = sent_task(&r);
    assert_eq!(t["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{r}");
    let id = t["id"].as_str().unwrap().to_owned();
    assert!(
        status_text(&t["status"]).contains(&format!("agen approve {id}")),
        "{r}"
    );
    // A message cannot answer it: refused with an error that names `agen approve`.
    let m = f.a2a(
        &admin,
        "asker",
        json!({"op": "send", "text": "yes", "task_id": id}),
    );
    assert!(
        m["error"]
            .as_str()
            .is_some_and(|e| e.contains("waiting for an approval") && e.contains("agen approve")),
        "{m}"
    );
    assert!(!marker.exists(), "nothing ran before the decision");

    // Approved, a subscriber (attached before: an ended task has nothing to subscribe to) sees
    // it through to the end.
    let mut op = json!({"op": "subscribe", "id": id, "announce": true});
    op["agent"] = json!(format!("{public}/a2a/default/asker"));
    op["token"] = json!(admin);
    op["ca_file"] = json!(f.hub.dir.join("hub/tls/ca.pem"));
    let mut child = Command::new(Peers::python())
        .arg(Peers::script("a2a_client.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(op.to_string().as_bytes())
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), r#"{"attached": true}"#);
    let out = f.hub.cli(&["approve", &id]).unwrap();
    assert!(
        out.status.success(),
        "approve: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    child.wait().unwrap();
    let last = s["events"]
        .as_array()
        .and_then(|e| e.last())
        .cloned()
        .unwrap_or_default();
    let end = last
        .get("statusUpdate")
        .map(|u| u["status"].clone())
        .unwrap_or_else(|| last["task"]["status"].clone());
    assert_eq!(end["state"], "TASK_STATE_COMPLETED", "{s}");
    assert!(status_text(&end).starts_with("saw: "), "{s}");

    // Refused: an unknown token (401), a viewer (403), a submitter of another namespace (403);
    // the card (private on this Hub) as well as the methods.
    let viewer = f.token("default", "viewer", "a2a-viewer");
    let elsewhere = f.token("other", "submitter", "a2a-elsewhere");
    let mut refusals = Vec::new();
    for (who, token) in [
        ("unknown", "agen-not-a-token"),
        ("viewer", &viewer),
        ("elsewhere", &elsewhere),
    ] {
        let card = f.a2a(token, "asker", json!({"op": "card"}));
        let send = f.a2a(token, "asker", json!({"op": "send", "text": "run it"}));
        refusals.push((who, card["error"].is_string(), send["error"].is_string()));
        let code = if who == "unknown" { "401" } else { "403" };
        assert!(
            card["error"].as_str().is_some_and(|e| e.contains(code)),
            "{who}: {card}"
        );
    }
    assert_eq!(
        refusals,
        vec![
            ("unknown", true, true),
            ("viewer", true, true),
            ("elsewhere", true, true)
        ]
    );
    // Size limits: a body over twice the input limit plus 64 KiB is refused before it is read
    // whole (413); an input over the limit in a smaller body is a JSON-RPC error naming it.
    let big = f.a2a(
        &admin,
        "asker",
        json!({"op": "raw_send", "size": 3 * 1024 * 1024}),
    );
    assert_eq!(big["status"], 413, "{big}");
    let over = f.a2a(
        &admin,
        "asker",
        json!({"op": "raw_send", "size": 1024 * 1024 + 1}),
    );
    assert_eq!(over["status"], 200, "{over}");
    assert_eq!(over["body"]["error"]["code"], -32602, "{over}");
    assert!(
        over["body"]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("input")),
        "{over}"
    );
    let tasks = f.hub.cli_json(&["tasks", "-o", "json"]).unwrap();
    assert_eq!(
        tasks.as_array().map(Vec::len),
        Some(1),
        "only the approved task: {tasks}"
    );

    // Nothing ran for them: the one approved call is the only execution.
    let ran = std::fs::read_to_string(&marker).unwrap_or_default();
    assert_eq!(ran.lines().count(), 1, "{ran}");
}

#[test]
fn silent_connections_hold_up_neither_grpc_nor_http1_clients_on_the_one_port() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    // Connections that never start their TLS handshake (a slowloris at the TLS layer).
    let silent: Vec<std::net::TcpStream> = (0..20)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", hub.port)).unwrap())
        .collect();
    let started = std::time::Instant::now();
    // gRPC over h2 still answers.
    let ps = hub.cli_json(&["ps", "-o", "json"]).unwrap();
    assert_eq!(ps, json!([]));
    // HTTP/1.1 (a2a-sdk's httpx) still answers: no deployment `ghost`, so 404 naming it.
    let f = Fleet {
        tmp,
        hub,
        _nest: None,
        models: Vec::new(),
    };
    let admin = f.admin_token();
    let card = f.a2a(&admin, "ghost", json!({"op": "card"}));
    let err = card["error"].as_str().unwrap_or_default();
    assert!(err.contains("404") && err.contains("ghost"), "{card}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "served in {:?} beside {} silent connections (the handshake deadline is 10 s)",
        started.elapsed(),
        silent.len()
    );
}
