//! Privacy on the host, as an attacker: another local user (`nobody`) reads nothing of the data
//! dirs `agen up` creates (every folder 0700, every file without group/other bits), a start
//! on a loosened data dir tightens it again and says so; and a secret a tool server prints on
//! stderr, returns JSON-escaped, URL-encoded, shell-quoted or inside a JSON-RPC error never
//! reaches the model, the run log, `agen ps`, the logs or any file under the data dirs.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use agen_tests::{agen_bin, cli, free_port, mcp_json, wait_for, workspace_root, write_bundle};
use agen_tests::{FakeModel, HubProcess, Peers, Proc};
use serde_json::{json, Value};

/// Every entry under `root` (not following symlinks), `root` included.
fn walk(root: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue; // gone meanwhile (sled and temp files come and go)
        };
        if meta.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| e.path()));
            }
        }
        out.push((p, meta));
    }
    out
}

/// The entries of `root` that grant group or other users any access.
fn loose_entries(root: &Path) -> Vec<String> {
    walk(root)
        .into_iter()
        .filter(|(_, m)| !m.file_type().is_symlink())
        .filter(|(_, m)| m.permissions().mode() & 0o077 != 0)
        .map(|(p, m)| format!("{} {:o}", p.display(), m.permissions().mode() & 0o7777))
        .collect()
}

fn start_up(data: &Path, config: &Path, log: &Path) -> Proc {
    let mut cmd = Command::new(agen_bin());
    cmd.args([
        "up",
        "--run-as-self",
        "--listen",
        &format!("127.0.0.1:{}", free_port()),
        "--deploy",
    ])
    .arg(workspace_root().join("examples/hello"))
    .arg("--data-dir")
    .arg(data)
    .env("AGEN_CONFIG", config)
    .env("RUST_LOG", "info");
    let up = Proc::spawn("agen up", cmd, log).unwrap();
    // Asked of the Hub (a restart's own table may still show the instance it had before).
    wait_for(
        "agen up to run the example",
        Duration::from_secs(90),
        || {
            let out = cli(config, &["ps", "--all", "-o", "json"]).ok()?;
            let list: Value = serde_json::from_slice(&out.stdout).ok()?;
            list.as_array()?
                .iter()
                .any(|i| {
                    i["deployment"] == "hello" && i["state"] == "running" && i["healthy"] == true
                })
                .then_some(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", up.log_text()));
    up
}

#[test]
fn another_local_user_reads_nothing_of_the_data_dirs_agen_up_creates() {
    if Command::new("runuser").arg("--help").output().is_err() {
        eprintln!("skipped: runuser is not installed, so there is no other user to attack as");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // The attacker may walk up to the data dir: only the data dir itself protects it.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = tmp.path().join("config.toml");
    let data = tmp.path().join("data");
    let mut up = start_up(&data, &config, &tmp.path().join("up.log"));
    let hub_dir = data.join("hub");
    let nest_dir = data.join("nests/nest-1");
    for must in [
        hub_dir.join("db"),
        hub_dir.join("tls/ca.key"),
        hub_dir.join("admin-token"),
        hub_dir.join("secret.key"),
        nest_dir.join("nest.key"),
        nest_dir.join("node-id"),
        nest_dir.join("bundles"),
        data.join("join-token"),
    ] {
        assert!(must.exists(), "{} missing", must.display());
    }

    // As `nobody`: not one file can be read, not even a listing of the data dir.
    let files: Vec<PathBuf> = walk(&data)
        .into_iter()
        .filter(|(_, m)| m.is_file() || m.file_type().is_socket())
        .map(|(p, _)| p)
        .collect();
    assert!(
        files.len() >= 10,
        "too few files to prove anything: {files:?}"
    );
    let as_nobody = |args: &[&std::ffi::OsStr]| {
        Command::new("runuser")
            .args(["-u", "nobody", "--"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    // The attack works at all: nobody can read a file that is meant to be readable.
    let public = tmp.path().join("public.txt");
    std::fs::write(&public, "hi").unwrap();
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(
        as_nobody(&["cat".as_ref(), public.as_os_str()]),
        "runuser -u nobody cat works"
    );
    let readable: Vec<&PathBuf> = files
        .iter()
        .filter(|f| as_nobody(&["cat".as_ref(), f.as_os_str()]))
        .collect();
    let listable = [&data, &hub_dir, &nest_dir]
        .into_iter()
        .filter(|d| as_nobody(&["ls".as_ref(), d.as_os_str()]))
        .count();
    eprintln!(
        "attacked {} files: {} readable, {listable} folders listable",
        files.len(),
        readable.len()
    );
    assert!(readable.is_empty(), "nobody read: {readable:?}");
    assert_eq!(listable, 0);

    // And by mode: every folder 0700 and every file without group/other bits.
    let loose = loose_entries(&data);
    assert!(loose.is_empty(), "entries others can access: {loose:#?}");
    for key in [
        hub_dir.join("tls/ca.key"),
        nest_dir.join("nest.key"),
        hub_dir.join("admin-token"),
    ] {
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", key.display());
    }
    up.stop(Duration::from_secs(20));

    // Someone loosens it; the next start tightens everything again and logs each fix.
    let loosen =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    loosen(&data, 0o755);
    loosen(&hub_dir, 0o755);
    loosen(&hub_dir.join("db"), 0o755);
    loosen(&hub_dir.join("admin-token"), 0o644);
    loosen(&nest_dir, 0o755);
    loosen(&nest_dir.join("nest.key"), 0o644);
    let log2 = tmp.path().join("up2.log");
    let mut up = start_up(&data, &config, &log2);
    let loose = loose_entries(&data);
    assert!(
        loose.is_empty(),
        "after a restart, entries others can access: {loose:#?}"
    );
    let text = up.log_text();
    let fixed = text
        .lines()
        .filter(|l| l.contains("tightened its mode"))
        .count();
    assert!(
        fixed >= 6,
        "each tightened entry is logged ({fixed}):\n{text}"
    );
    for p in ["admin-token", "nest.key"] {
        assert!(
            text.lines()
                .any(|l| l.contains("tightened its mode") && l.contains(p)),
            "{p} not named:\n{text}"
        );
    }
    up.stop(Duration::from_secs(20));
}

/// The secret: every character that JSON, URLs and shells quote, and a marker that shows up
/// in every form a leak could take.
const SECRET: &str = r#"leak7f3aq9 "pw"/w s'q' \ é&<"#;
const MARKER: &str = "leak7f3aq9";

/// A raw JSON-RPC stdio MCP server (no SDK, so its JSON-RPC error is exactly what we send):
/// it prints the secret on stderr at start and on every call, `json` returns it JSON-escaped
/// (Python's ASCII-only `json.dumps`), `forms` URL-encoded and shell-quoted, and `error`
/// answers with a JSON-RPC error quoting it in a DSN.
const LEAKY_SERVER: &str = r#"
import json, os, shlex, sys, urllib.parse
secret = os.environ["LEAKY"]
print("leaky starting with " + secret, file=sys.stderr, flush=True)
print(json.dumps({"dsn": secret}), file=sys.stderr, flush=True)
tools = [{"name": n, "description": n + " of the secret", "inputSchema": {"type": "object", "properties": {}},
          "annotations": {"readOnlyHint": True}} for n in ("json", "forms", "error")]
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
                          "serverInfo": {"name": "leaky", "version": "1"}})
    elif method == "tools/list":
        reply(id, result={"tools": tools})
    elif method == "tools/call":
        name = msg["params"]["name"]
        print("call " + name + " with " + secret, file=sys.stderr, flush=True)
        if name == "error":
            reply(id, error={"code": -32603, "message": "cannot connect to postgres://app:" + secret + "@db/app"})
        elif name == "json":
            text = json.dumps({"dsn": secret, "ok": True})
            reply(id, result={"content": [{"type": "text", "text": text}], "isError": False})
        else:
            text = "url=" + urllib.parse.quote(secret, safe="") + " plus=" + urllib.parse.quote_plus(secret) + " sh=" + shlex.quote(secret)
            reply(id, result={"content": [{"type": "text", "text": text}], "isError": False})
    else:
        reply(id, error={"code": -32601, "message": "unknown method " + str(method)})
"#;

/// Files under `root` whose bytes contain `needle`.
fn files_containing(root: &Path, needle: &str) -> Vec<PathBuf> {
    walk(root)
        .into_iter()
        .filter(|(_, m)| m.is_file())
        .filter(|(p, _)| {
            std::fs::read(p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
        })
        .map(|(p, _)| p)
        .collect()
}

#[test]
fn a_secret_a_tool_server_leaks_reaches_no_model_log_listing_or_file() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("solo", &[], &[("LEAKY_VALUE", SECRET)]).unwrap();
    let record = tmp.path().join("model-requests.jsonl");
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"record": record, "steps": [
            {"tool_calls": [
                {"name": "leaky_json", "arguments": {}},
                {"name": "leaky_forms", "arguments": {}},
                {"name": "leaky_error", "arguments": {}}
            ]},
            {"reply_template": "done: {{last_tool_result}}"}
        ]}),
    )
    .unwrap();
    let secrets = json!({"LEAKY": {"source": "env", "var": "LEAKY_VALUE"}}).to_string();
    let agent = |name: &str| {
        format!(
            "---\nname: {name}\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou check the database.\n",
            model.base_url()
        )
    };
    let python = Peers::python().to_string_lossy().into_owned();
    let leaky = tmp.path().join("leaky");
    write_bundle(
        &leaky,
        &[
            ("server.py", LEAKY_SERVER.to_string()),
            (
                "mcp.json",
                mcp_json(&[(
                    "leaky",
                    json!({"command": python, "args": ["server.py"], "env": {"LEAKY": "${LEAKY}"}}),
                )]),
            ),
            ("x-agen/secrets.json", secrets.clone()),
            (
                "x-agen/harness.json",
                json!({"traceToolArguments": true}).to_string(),
            ),
            ("x-agen/agent.md", agent("leaky")),
        ],
    )
    .unwrap();
    // A server that dies at start, its last words quoting the secret: they become the
    // instance's `servers_not_connected` reason and message.
    let broken = tmp.path().join("broken");
    write_bundle(
        &broken,
        &[
            (
                "mcp.json",
                mcp_json(&[(
                    "db",
                    json!({"command": python, "args": ["-c",
                        "import json, os, sys; s = os.environ['LEAKY']; print('FATAL: cannot connect with ' + s + ' ' + json.dumps(s), file=sys.stderr); sys.exit(3)"],
                        "env": {"LEAKY": "${LEAKY}"}}),
                )]),
            ),
            ("x-agen/secrets.json", secrets),
            ("x-agen/agent.md", agent("broken")),
        ],
    )
    .unwrap();
    for (dir, name) in [(&leaky, "leaky"), (&broken, "broken")] {
        let out = hub
            .cli(&["deploy", dir.to_str().unwrap(), "--name", name])
            .unwrap();
        assert!(
            out.status.success(),
            "deploy {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let list = hub
        .wait_instances(
            "leaky running and broken saying why its server is down",
            Duration::from_secs(60),
            |l| {
                l.iter()
                    .any(|i| i["deployment"] == "leaky" && i["healthy"] == true)
                    && l.iter().any(|i| {
                        i["deployment"] == "broken"
                            && i["message"].as_str().is_some_and(|m| m.contains("FATAL"))
                    })
            },
        )
        .unwrap();
    let ps = serde_json::to_string(&list).unwrap();
    assert!(
        ps.contains("[redacted]"),
        "the stderr reason is shown, redacted: {ps}"
    );

    let out = hub
        .cli(&["submit", "leaky", "Check the database."])
        .unwrap();
    assert!(
        out.status.success(),
        "submit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let task = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let out = hub
        .cli(&["wait", &task, "-o", "json", "--timeout", "60s"])
        .unwrap();
    let wait = String::from_utf8_lossy(&out.stdout).into_owned();
    let done: Value = serde_json::from_str(&wait)
        .unwrap_or_else(|_| panic!("wait: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(done["state"], "succeeded", "{done}");
    let trace = hub.cli(&["trace", &task]).unwrap();
    let trace = String::from_utf8_lossy(&trace.stdout).into_owned();
    let ps_all = hub.cli(&["ps", "--all", "-o", "json"]).unwrap();
    let ps_all = String::from_utf8_lossy(&ps_all.stdout).into_owned();

    // The model saw the tools' answers, each with the secret redacted.
    let requests = std::fs::read_to_string(&record).unwrap();
    let last: Value = requests
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .next_back()
        .expect("the model was asked");
    let results: Vec<String> = last["body"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(results.len(), 3, "{results:?}");
    assert!(results[0].contains(r#""dsn": "[redacted]""#), "{results:?}");
    assert!(
        results[1].contains("url=[redacted] plus=[redacted] sh='[redacted]'"),
        "{results:?}"
    );
    assert!(
        results[2].contains("cannot connect to postgres://app:[redacted]@db/app"),
        "{results:?}"
    );

    // Nowhere: not the model, the run's result, the trace, `agen ps`, the logs, any file.
    let mut seen = Vec::new();
    for (what, text) in [
        ("model requests", requests.as_str()),
        ("agen wait -o json", wait.as_str()),
        ("agen trace", trace.as_str()),
        ("agen ps --all -o json", ps_all.as_str()),
        ("hub log", &hub.proc.log_text()),
        ("nest log", &nest.proc.log_text()),
    ] {
        if text.contains(MARKER) {
            seen.push(what.to_string());
        }
    }
    let nest_log = nest.proc.log_text();
    assert!(
        nest_log.contains("leaky starting with [redacted]"),
        "the server's stderr is logged, redacted:\n{nest_log}"
    );
    let files = files_containing(tmp.path(), MARKER);
    eprintln!(
        "places holding the secret: {} outputs, {} files",
        seen.len(),
        files.len()
    );
    assert!(seen.is_empty(), "the secret reached: {seen:?}");
    assert!(files.is_empty(), "the secret is in: {files:?}");
}
