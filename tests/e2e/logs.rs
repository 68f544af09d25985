//! `agen logs` as an operator uses it: a tool server's stderr (a marker it prints at start and
//! on every call) and an instance's own stderr, read through the Hub from the Nest that keeps
//! them; `-f` shows a line written after it started; a secret the server prints is redacted
//! in what `agen logs` shows and in the Nest's files; daemon logs carry no ANSI codes and
//! no rmcp noise at the default level. An instance the Hub no longer lists (its deployment
//! removed) is still found by id on the Nest that kept its logs, only in its namespace.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agen_tests::{agen_bin, mcp_json, wait_for, write_bundle};
use agen_tests::{FakeModel, HubProcess, Peers};
use serde_json::{json, Value};

const SECRET: &str = "noisy-secret-9d2k";

/// A raw stdio MCP server: prints a start marker and the secret on stderr, and one line per
/// call (`shout` with its argument).
const NOISY_SERVER: &str = r#"
import json, os, sys
secret = os.environ["NOISY"]
print("noisy-start-marker", file=sys.stderr, flush=True)
print("connecting with " + secret, file=sys.stderr, flush=True)
tools = [{"name": "shout", "description": "print a word on stderr",
          "inputSchema": {"type": "object", "properties": {"word": {"type": "string"}}},
          "annotations": {"readOnlyHint": True}}]
def reply(id, **kw):
    sys.stdout.write(json.dumps(dict(jsonrpc="2.0", id=id, **kw)) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    msg = json.loads(line)
    method, id = msg.get("method"), msg.get("id")
    if id is None:
        continue
    if method == "initialize":
        reply(id, result={"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                          "serverInfo": {"name": "noisy", "version": "1"}})
    elif method == "tools/list":
        reply(id, result={"tools": tools})
    elif method == "tools/call":
        word = msg["params"].get("arguments", {}).get("word", "")
        print("shouted " + word, file=sys.stderr, flush=True)
        reply(id, result={"content": [{"type": "text", "text": "ok"}], "isError": False})
    else:
        reply(id, error={"code": -32601, "message": "unknown method " + str(method)})
"#;

fn lines_of(out: &std::process::Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn texts(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| l["text"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn agen_logs_shows_a_tool_servers_and_an_instances_stderr_redacted_and_follows_new_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("logger", &[], &[("NOISY_VALUE", SECRET)]).unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [
            {"tool_calls": [{"name": "noisy_shout", "arguments": {"word": "followed-marker-42"}}]},
            {"reply": "done"}
        ]}),
    )
    .unwrap();
    let python = Peers::python().to_string_lossy().into_owned();
    let bundle = tmp.path().join("noisy");
    write_bundle(
        &bundle,
        &[
            ("server.py", NOISY_SERVER.to_string()),
            (
                "mcp.json",
                mcp_json(&[(
                    "noisy",
                    json!({"command": python, "args": ["server.py"], "env": {"NOISY": "${NOISY}"}}),
                )]),
            ),
            (
                "x-agen/secrets.json",
                json!({"NOISY": {"source": "env", "var": "NOISY_VALUE"}}).to_string(),
            ),
            (
                "x-agen/agent.md",
                format!(
                    "---\nname: noisy\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou shout.\n",
                    model.base_url()
                ),
            ),
        ],
    )
    .unwrap();
    let out = hub
        .cli(&["deploy", bundle.to_str().unwrap(), "--name", "noisy"])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list = hub
        .wait_instances("noisy running", Duration::from_secs(60), |l| {
            l.iter()
                .any(|i| i["deployment"] == "noisy" && i["healthy"] == true)
        })
        .unwrap();
    let instance = list
        .iter()
        .find(|i| i["deployment"] == "noisy")
        .and_then(|i| i["instance"].as_str())
        .unwrap()
        .to_string();

    // The tool server's stderr, by deployment name: the marker, the secret redacted.
    let server_lines = wait_for(
        "the server's start marker in agen logs",
        Duration::from_secs(30),
        || {
            let out = hub
                .cli(&["logs", "noisy", "--server", "noisy", "-o", "json"])
                .ok()?;
            let lines = lines_of(&out);
            texts(&lines)
                .iter()
                .any(|t| t == "noisy-start-marker")
                .then_some(lines)
        },
    )
    .unwrap();
    let server_texts = texts(&server_lines);
    assert!(
        server_texts.contains(&"connecting with [redacted]".to_string()),
        "{server_texts:?}"
    );
    assert!(
        server_lines
            .iter()
            .all(|l| l["instance"] == instance.as_str()
                && l["server"] == "noisy"
                && l["nest"] == "logger"),
        "{server_lines:?}"
    );

    // The instance's own stderr, by instance id: its start line, and no server lines.
    let out = hub.cli(&["logs", &instance, "-o", "json"]).unwrap();
    assert!(
        out.status.success(),
        "logs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let own = texts(&lines_of(&out));
    assert!(
        own.iter().any(|t| t.starts_with("instance starting")),
        "{own:?}"
    );
    assert!(!own.iter().any(|t| t == "noisy-start-marker"), "{own:?}");
    // --tail keeps the last lines only.
    let out = hub
        .cli(&[
            "logs", "noisy", "--server", "noisy", "--tail", "1", "-o", "json",
        ])
        .unwrap();
    assert_eq!(
        lines_of(&out).len(),
        1,
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // An unknown target is "not found" (exit 4), naming it.
    let out = hub.cli(&["logs", "nobody-here"]).unwrap();
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("nobody-here"));

    // -f: started first, then a task makes the server print a new line.
    let mut follow = Command::new(agen_bin())
        .args(["logs", "noisy", "--server", "noisy", "-f", "--tail", "1"])
        .env("AGEN_CONFIG", hub.dir.join("client.toml"))
        .env_remove("AGEN_HUB")
        .env_remove("AGEN_TOKEN")
        .env_remove("AGEN_NAMESPACE")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let stdout = follow.stdout.take().unwrap();
    let sink = seen.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    wait_for(
        "agen logs -f to print the kept line",
        Duration::from_secs(20),
        || (!seen.lock().unwrap().is_empty()).then_some(()),
    )
    .unwrap();
    let out = hub.cli(&["submit", "noisy", "Shout."]).unwrap();
    assert!(
        out.status.success(),
        "submit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let followed = wait_for(
        "agen logs -f to show the new line",
        Duration::from_secs(30),
        || {
            let seen = seen.lock().unwrap();
            seen.iter()
                .any(|l| l.ends_with("shouted followed-marker-42"))
                .then(|| seen.clone())
        },
    );
    let _ = follow.kill();
    let _ = follow.wait();
    let followed = followed.unwrap_or_else(|e| panic!("{e}: {:?}", seen.lock().unwrap()));
    assert!(followed.iter().all(|l| !l.contains(SECRET)), "{followed:?}");

    // The Nest's files hold the lines, redacted, private; the daemon logs are plain text.
    let logs_dir = nest.dir.join("logs");
    let mut files = 0;
    let mut leaks = Vec::new();
    for entry in walkdir(&logs_dir) {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(&entry).unwrap();
        assert_eq!(
            meta.permissions().mode() & 0o077,
            0,
            "{} is not private",
            entry.display()
        );
        if meta.is_file() {
            files += 1;
            if std::fs::read_to_string(&entry)
                .unwrap_or_default()
                .contains(SECRET)
            {
                leaks.push(entry.display().to_string());
            }
        }
    }
    let nest_log = nest.proc.log_text();
    let ansi = nest_log.matches('\u{1b}').count() + hub.proc.log_text().matches('\u{1b}').count();
    let peer_info = nest_log.matches("peer_info").count();
    eprintln!("log files {files}, files holding the secret {}, ANSI escapes {ansi}, rmcp dumps {peer_info}", leaks.len());
    assert!(
        files >= 2,
        "instance.log and server.noisy.log under {}",
        logs_dir.display()
    );
    assert!(leaks.is_empty(), "the secret is in {leaks:?}");
    assert_eq!(ansi, 0, "no ANSI codes in daemon logs written to a file");
    assert_eq!(peer_info, 0, "no rmcp peer_info dump at the default level");
}

fn walkdir(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        }
        out.push(p);
    }
    out
}

/// `agen logs OUT` of `args`, and its stderr.
fn logs(hub: &HubProcess, args: &[&str]) -> (std::process::Output, String) {
    let mut all = vec!["logs"];
    all.extend_from_slice(args);
    let out = hub.cli(&all).unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, err)
}

#[test]
fn agen_logs_finds_a_removed_instance_on_the_nest_that_kept_it_and_only_in_its_namespace() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let secret = [("NOISY_VALUE", SECRET)];
    let north = hub.nest("north", &[], &secret).unwrap();
    let mut south = hub.nest("south", &[], &secret).unwrap();
    let python = Peers::python().to_string_lossy().into_owned();
    let bundle = tmp.path().join("gone");
    write_bundle(
        &bundle,
        &[
            ("server.py", NOISY_SERVER.to_string()),
            (
                "mcp.json",
                mcp_json(&[(
                    "noisy",
                    json!({"command": python, "args": ["server.py"], "env": {"NOISY": "${NOISY}"}}),
                )]),
            ),
            (
                "x-agen/secrets.json",
                json!({"NOISY": {"source": "env", "var": "NOISY_VALUE"}}).to_string(),
            ),
            (
                "x-agen/agent.md",
                // Never called: the instance only has to start its tool server.
                "---\nname: gone\nmodel: openai/fake-model\nbaseUrl: http://127.0.0.1:9/v1\n---\nYou shout.\n".to_string(),
            ),
        ],
    )
    .unwrap();
    let out = hub
        .cli(&["deploy", bundle.to_str().unwrap(), "--name", "gone"])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list = hub
        .wait_instances("gone running", Duration::from_secs(60), |l| {
            l.iter()
                .any(|i| i["deployment"] == "gone" && i["healthy"] == true)
        })
        .unwrap();
    let inst = list.iter().find(|i| i["deployment"] == "gone").unwrap();
    let instance = inst["instance"].as_str().unwrap().to_string();
    let holder = inst["nest"].as_str().unwrap().to_string();
    let other = if holder == "north" { "south" } else { "north" };
    wait_for(
        "the server's start marker while the Hub lists it",
        Duration::from_secs(30),
        || {
            let (out, _) = logs(&hub, &[&instance, "--server", "noisy", "-o", "json"]);
            texts(&lines_of(&out))
                .iter()
                .any(|t| t == "noisy-start-marker")
                .then_some(())
        },
    )
    .unwrap();

    // The deployment goes: the Hub forgets the instance, its Nest keeps the files.
    let out = hub.cli(&["rm", "gone", "--yes"]).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    hub.wait_instances("the instance forgotten", Duration::from_secs(60), |l| {
        !l.iter().any(|i| i["instance"] == instance.as_str())
    })
    .unwrap();

    // Found by id on the Nest that kept it, redacted as ever.
    let (out, err) = logs(&hub, &[&instance, "--server", "noisy", "-o", "json"]);
    assert!(out.status.success(), "{err}");
    let lines = lines_of(&out);
    let t = texts(&lines);
    assert!(t.contains(&"noisy-start-marker".to_string()), "{t:?}");
    assert!(
        t.contains(&"connecting with [redacted]".to_string()),
        "{t:?}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l["instance"] == instance.as_str() && l["nest"] == holder.as_str()),
        "{lines:?}"
    );
    let (out, err) = logs(&hub, &[&instance, "-o", "json"]);
    assert!(out.status.success(), "{err}");
    let own = texts(&lines_of(&out));
    assert!(
        own.iter().any(|t| t.starts_with("instance starting")),
        "{own:?}"
    );

    // Not on the other Nest, and not to a reader of another namespace (nothing of it shown).
    let (out, err) = logs(&hub, &[&instance, "--nest", other]);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains(&format!("searched: {other})")), "{err}");
    let (out, err) = logs(
        &hub,
        &[&instance, "--server", "noisy", "--namespace", "elsewhere"],
    );
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(err.contains("namespace elsewhere"), "{err}");

    // An id no Nest kept: where it was looked for, and why it may be gone.
    let (out, err) = logs(&hub, &["gone-00000000"]);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("gone-00000000") && err.contains("north") && err.contains("south"),
        "{err}"
    );
    assert!(err.contains("last 64 instances"), "{err}");

    // A Nest that is not connected is named as not searched; the holder still answers.
    south.proc.kill9();
    let err = wait_for(
        "south named as not searched",
        Duration::from_secs(30),
        || {
            let (_, err) = logs(&hub, &["gone-00000000"]);
            err.contains("not connected, not searched: south")
                .then_some(err)
        },
    )
    .unwrap();
    assert!(err.contains("searched: north"), "{err}");
    if holder == "north" {
        let (out, err) = logs(&hub, &[&instance, "--server", "noisy"]);
        assert!(out.status.success(), "{err}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("noisy-start-marker"));
    }
    drop(north);
}
