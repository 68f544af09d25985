//! Instance identity on the Nest host (issue 11 item 1), as the attacker: a foreign process that
//! reads every `/proc/*/cmdline` and `/proc/*/environ` of the Nest's processes and then says
//! hello on `nest.sock` as the running instance (forged secret, claimed pid, replayed line, the
//! old secret-less form). Every try is refused, nothing of the placement leaks, and the real
//! instance keeps its connection and finishes its task.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use agen_tests::{mcp_json, wait_for, write_bundle, FakeModel, HubProcess, NestProcess};
use serde_json::{json, Value};

const SECRET_VALUE: &str = "ident-secret-7f3a9c";

/// The pid of the `agen instance` process of `nest` (its cwd is a bundle in the Nest's dir).
fn instance_pid(nest: &NestProcess) -> Option<u32> {
    nest.descendants().into_iter().find(|pid| {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        args.get(1) == Some(&&b"instance"[..])
    })
}

/// Sends `lines` on one fresh connection to `sock` and returns everything the Nest answered
/// before it closed the connection (or 5 s passed). Lines after the Nest closed are dropped.
fn say(sock: &Path, lines: &[String]) -> String {
    let mut s = UnixStream::connect(sock).expect("connect to nest.sock");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for l in lines {
        // The Nest may close the connection after refusing the first line: that is fine.
        if s.write_all(format!("{l}\n").as_bytes()).is_err() {
            break;
        }
    }
    let mut got = String::new();
    let mut r = BufReader::new(s);
    loop {
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => got.push_str(&line),
        }
    }
    got
}

#[test]
fn a_process_on_the_nest_cannot_say_hello_as_a_running_instance() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub
        .nest("ident", &[], &[("IDENT_SECRET", SECRET_VALUE)])
        .unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [
            {"tool_calls": [{"name": "ws_run", "arguments": {"command": "sleep 4; echo slept"}}]},
            {"reply_template": "tool said: {{last_tool_result}}"}
        ]}),
    )
    .unwrap();
    let bundle = tmp.path().join("bundle");
    write_bundle(
        &bundle,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "ws",
                    json!({"command": "agen", "args": ["mcp", "workspace", "--root", "."],
                           "env": {"IDENT": "${IDENT_SECRET}"}}),
                )]),
            ),
            (
                "x-agen/agent.md",
                format!(
                    "---\nname: ident\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou run things.\n",
                    model.base_url()
                ),
            ),
            (
                "x-agen/secrets.json",
                json!({"IDENT_SECRET": {"source": "env", "var": "IDENT_SECRET"}}).to_string(),
            ),
        ],
    )
    .unwrap();
    let out = hub
        .cli(&[
            "deploy",
            bundle.to_str().unwrap(),
            "--name",
            "ident",
            "--wait",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = hub
        .wait_instances("a healthy instance", Duration::from_secs(60), |l| {
            l.iter().any(|i| i["healthy"] == true)
        })
        .unwrap();
    let id = before[0]["instance"].as_str().unwrap().to_owned();
    let pid = wait_for("the instance process", Duration::from_secs(10), || {
        instance_pid(&nest)
    })
    .unwrap();

    // The victim is busy with a task while the attacker works.
    let out = hub.cli(&["submit", "ident", "go"]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task = String::from_utf8(out.stdout).unwrap().trim().to_owned();

    // 1. What the attacker can read of every process of the Nest.
    let sock = nest.dir.join("nest.sock");
    let sock_s = sock.to_string_lossy().into_owned();
    let mut leaks = Vec::new();
    for p in nest.descendants() {
        for what in ["cmdline", "environ"] {
            let raw = std::fs::read(format!("/proc/{p}/{what}")).unwrap_or_default();
            let text = String::from_utf8_lossy(&raw).replace('\0', " ");
            for needle in [id.as_str(), sock_s.as_str(), "nest.sock"] {
                if text.contains(needle) {
                    leaks.push(format!("/proc/{p}/{what} names {needle:?}: {text}"));
                }
            }
        }
    }
    assert_eq!(
        leaks,
        Vec::<String>::new(),
        "identity on a command line or in an environment"
    );

    // 2. Hello as the instance: forged secret with the real pid claimed, a replay of that same
    //    line on one connection, and the old form without a secret.
    let forged = json!({"type": "hello", "instance_id": id, "pid": pid, "secret": "0".repeat(64)})
        .to_string();
    let answers = [
        say(&sock, std::slice::from_ref(&forged)),
        say(&sock, &[forged.clone(), forged.clone()]),
        say(
            &sock,
            &[json!({"type": "hello", "instance_id": id, "pid": pid}).to_string()],
        ),
    ];
    let mut refused = 0;
    for a in &answers {
        assert!(!a.contains(SECRET_VALUE), "secret handed out: {a}");
        assert!(!a.contains("placement"), "placement handed out: {a}");
        for line in a.lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["type"], "refused", "{line}");
            refused += 1;
        }
    }
    assert_eq!(refused, 2, "one refusal per believable hello: {answers:?}");
    // Every refusal is the same text: it names no instance, pid or reason (those go to the
    // Nest's log only), so a prober learns nothing of the others.
    for a in answers.iter().filter(|a| !a.is_empty()) {
        assert!(
            a.contains("hello refused: this connection is not an instance this nest started"),
            "{a}"
        );
        assert!(
            !a.contains(id.as_str()) && !a.contains(&pid.to_string()),
            "{a}"
        );
    }

    // 3. The victim never noticed: its task completes, same instance, never restarted.
    let out = hub
        .cli(&["wait", &task, "-o", "json", "--timeout", "60s"])
        .unwrap();
    let t: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(
        t["outcome"]["result"]
            .as_str()
            .unwrap_or("")
            .contains("slept"),
        "{t}"
    );
    let after = hub.instances().unwrap();
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(
        (after[0]["instance"].as_str(), after[0]["healthy"].as_bool()),
        (Some(id.as_str()), Some(true)),
        "{after:?}"
    );
    assert_eq!(
        instance_pid(&nest),
        Some(pid),
        "the instance process is the same"
    );
    let log = nest.proc.log_text();
    assert!(
        log.contains("hello as instance") && log.contains("refused"),
        "{log}"
    );
    assert!(!log.contains(SECRET_VALUE), "the nest logged the secret");
}
