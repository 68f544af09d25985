//! Platform secrets: a bundle declares `DATABASE_URL` with `source: platform` and hands it to
//! `agen mcp sql` as `${DATABASE_URL}`. Until `agen secrets set` stores it, the instance is
//! unhealthy and says which secret to set; once set (value on stdin) it is replaced promptly
//! and serves the sql tools; the value appears in no listing, trace, or Hub data file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use agen_tests::{agen_bin, mcp_json, write_bundle, FakeModel, HubProcess, Peers};
use serde_json::{json, Value};

/// `agen ARGS` against `hub` with `stdin` piped in.
fn cli_with_stdin(hub: &HubProcess, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(agen_bin())
        .args(args)
        .env("AGEN_CONFIG", hub.dir.join("client.toml"))
        .env_remove("AGEN_HUB")
        .env_remove("AGEN_TOKEN")
        .env_remove("AGEN_NAMESPACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn agen");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("agen output")
}

/// A SQLite file with one table, made with Python's sqlite3.
fn sqlite_file(path: &Path) {
    let script = format!(
        "import sqlite3\n\
         c = sqlite3.connect({path:?})\n\
         c.executescript('CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL); INSERT INTO orders VALUES (1, 9.5), (2, 20);')\n\
         c.commit()\n",
        path = path.to_string_lossy()
    );
    let out = Command::new(Peers::python())
        .args(["-c", &script])
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "sqlite file: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every file under `dir`.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn ours(list: &[Value]) -> Vec<Value> {
    list.iter()
        .filter(|i| i["deployment"] == "orders")
        .cloned()
        .collect()
}

#[test]
fn a_platform_secret_reaches_the_tool_server_only_after_it_is_set_and_never_leaks() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let nest = hub.nest("solo", &[], &[]).unwrap();
    let db = tmp.path().join("private-orders-4f1c9e.db");
    sqlite_file(&db);
    let dsn = format!("sqlite://{}", db.display());

    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [
            {"tool_calls": [{"name": "db_query", "arguments": {"sql": "SELECT sum(total) AS total FROM orders"}}]},
            {"reply_template": "Total: {{last_tool_result}}"}
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
                    "db",
                    json!({"command": "agen", "args": ["mcp", "sql", "--dsn-env", "DATABASE_URL"], "env": {"DATABASE_URL": "${DATABASE_URL}"}}),
                )]),
            ),
            ("x-agen/secrets.json", json!({"DATABASE_URL": {"source": "platform"}}).to_string()),
            ("x-agen/harness.json", json!({"traceToolArguments": true}).to_string()),
            (
                "x-agen/agent.md",
                format!("---\nname: orders\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou answer from the orders database.\n", model.base_url()),
            ),
        ],
    )
    .unwrap();
    let out = hub
        .cli(&["deploy", bundle.to_str().unwrap(), "--name", "orders"])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Not set yet: unhealthy, and `agen ps --all` says which secret and how to set it.
    let list = hub
        .wait_instances(
            "an unhealthy instance naming DATABASE_URL",
            Duration::from_secs(60),
            |l| {
                ours(l).iter().any(|i| {
                    i["healthy"] == false
                        && i["message"].as_str().is_some_and(|m| {
                            m.contains("DATABASE_URL")
                                && m.contains("agen secrets set DATABASE_URL")
                        })
                })
            },
        )
        .unwrap();
    assert!(
        ours(&list).iter().all(|i| i["healthy"] == false),
        "{list:?}"
    );
    // The Hub keeps replacing it, backing off longer each time.
    hub.wait_instances(
        "a replacement back-off of 8s",
        Duration::from_secs(60),
        |l| {
            ours(l).iter().any(|i| {
                i["message"].as_str().is_some_and(|m| {
                    m.starts_with("replacement back-off 8s") && m.contains("DATABASE_URL")
                })
            })
        },
    )
    .unwrap();

    // Set it, value on stdin: the instance is replaced and loads the sql tools.
    let out = cli_with_stdin(
        &hub,
        &["secrets", "set", "DATABASE_URL"],
        &format!("{dsn}\n"),
    );
    assert!(
        out.status.success(),
        "secrets set: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&dsn));
    // Well within the 8s back-off: setting the secret replaces the instance at once.
    let list = hub
        .wait_instances(
            "a healthy instance with the sql tools",
            Duration::from_secs(5),
            |l| {
                ours(l)
                    .iter()
                    .any(|i| i["state"] == "running" && i["healthy"] == true)
            },
        )
        .unwrap();
    let healthy = ours(&list)
        .into_iter()
        .find(|i| i["healthy"] == true)
        .unwrap();
    assert!(hub
        .proc
        .log_text()
        .contains("secret set: replacing the instances that started without it now"));
    let tools: Vec<&str> = healthy["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for t in ["db.tables", "db.describe", "db.query"] {
        assert!(tools.contains(&t), "{t} missing from {tools:?}");
    }

    // A task queries the database through the secret's DSN.
    let out = hub
        .cli(&["submit", "orders", "What is the total?"])
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
    let done: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("wait: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(
        done["outcome"]["result"].as_str().unwrap().contains("29.5"),
        "{done}"
    );

    // Listing shows the name and times, never the value.
    let listed = hub.cli_json(&["secrets", "ls", "-o", "json"]).unwrap();
    let entries = listed.as_array().unwrap();
    assert_eq!(entries.len(), 1, "{listed}");
    assert_eq!(entries[0]["name"], "DATABASE_URL");
    assert_eq!(entries[0]["namespace"], "default");
    assert!(
        entries[0]["created_at"].is_string() && entries[0]["updated_at"].is_string(),
        "{listed}"
    );
    assert!(!listed.to_string().contains(&dsn));

    // Neither the trace nor the task shows it.
    let trace = hub.cli(&["trace", &task, "-o", "json"]).unwrap();
    assert!(
        trace.status.success(),
        "trace: {}",
        String::from_utf8_lossy(&trace.stderr)
    );
    assert!(!String::from_utf8_lossy(&trace.stdout).contains(&dsn));
    assert!(!done.to_string().contains(&dsn));

    // The Hub's data dir holds the value sealed only; the Nest keeps it in memory only; no
    // log shows it.
    let mut files = files_under(&hub.dir.join("hub"));
    files.extend(files_under(&nest.dir));
    for log in ["hub.log", "nest-solo.log"] {
        assert!(
            hub.dir.join(log).metadata().is_ok_and(|m| m.len() > 0),
            "{log} is written"
        );
        files.push(hub.dir.join(log));
    }
    for f in files {
        let bytes = std::fs::read(&f).unwrap_or_default();
        assert!(
            !bytes.windows(dsn.len()).any(|w| w == dsn.as_bytes()),
            "{} holds the secret value",
            f.display()
        );
    }
    assert!(hub.dir.join("hub/secret.key").exists());

    // Removing it: gone from the listing; removing it again names it.
    let out = hub.cli(&["secrets", "rm", "DATABASE_URL"]).unwrap();
    assert!(
        out.status.success(),
        "rm: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        hub.cli_json(&["secrets", "ls", "-o", "json"]).unwrap(),
        json!([])
    );
    let out = hub.cli(&["secrets", "rm", "DATABASE_URL"]).unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("secret DATABASE_URL not found in namespace default"));
}

#[test]
fn bad_secret_names_and_empty_values_are_refused_with_the_field_named() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let out = cli_with_stdin(&hub, &["secrets", "set", "9-LIVES"], "x");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("name: `9-LIVES` is not a valid secret name"),
        "{err}"
    );

    let out = cli_with_stdin(&hub, &["secrets", "set", "EMPTY"], "");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("the value of EMPTY is empty"));

    let big = "x".repeat(64 * 1024 + 1);
    let out = cli_with_stdin(&hub, &["secrets", "set", "BIG"], &big);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("65537 bytes is over the limit of 65536 bytes"),
        "{stderr}"
    );

    let out = Command::new(agen_bin())
        .args([
            "secrets",
            "set",
            "FROM_ENV",
            "--from-env",
            "AGEN_E2E_SECRET_VALUE",
        ])
        .env("AGEN_CONFIG", hub.dir.join("client.toml"))
        .env("AGEN_E2E_SECRET_VALUE", "from-the-env")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "--from-env: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<Value> = hub
        .cli_json(&["secrets", "ls", "-o", "json"])
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("FROM_ENV")]);
}
