//! `agen mcp sql` end to end: the real `agen` binary driven by the official Python MCP SDK client
//! (`tests/peers/mcp_client.py`) against a real PostgreSQL 15 (started here, in a temp data dir,
//! on a free loopback port) and a real SQLite file.
//!
//! What must hold: the three tools are listed with their argument schemas and `readOnlyHint`;
//! they work; every known way to write through a "read-only" SQL tool fails (and the data is
//! checked unchanged afterwards, outside the server); row limits and cell cuts hold; a slow query
//! is stopped at `--timeout`. Postgres missing is a failure, never a skip.

use std::io::Write;
use std::os::unix::fs::{chown, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use agen_tests::postgres::{Cluster, PG_BIN};
use agen_tests::{agen_bin, free_port, Peers};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};

/// A throwaway PostgreSQL server (the tests' [`Cluster`]) with database `shop`.
struct Postgres {
    cluster: Cluster,
    port: u16,
}

impl Postgres {
    /// Starts a server with database `shop` holding `items` (1,500 rows) and a view `cheap`.
    fn start() -> Postgres {
        Self::start_with(false)
    }

    /// The same, also serving TLS with a certificate for `localhost` (only) issued by a test CA
    /// whose certificate is [`Postgres::ca_file`].
    fn start_with_tls() -> Postgres {
        Self::start_with(true)
    }

    fn ca_file(&self) -> PathBuf {
        self.cluster.dir.path().join("ca.crt")
    }

    fn start_with(tls: bool) -> Postgres {
        let cluster = Cluster::start(|dir, uid, gid| {
            let mut opts = " -c fsync=off".to_owned();
            if tls {
                make_certificates(dir, uid, gid);
                opts.push_str(&format!(
                    " -c ssl=on -c ssl_cert_file={0}/server.crt -c ssl_key_file={0}/server.key",
                    dir.display()
                ));
            }
            opts
        });
        cluster.psql("postgres", "CREATE DATABASE shop");
        cluster.psql(
            "shop",
            "CREATE TABLE items (id serial PRIMARY KEY, name text NOT NULL, price numeric(10,2), \
               note text, tags text[], created timestamptz NOT NULL DEFAULT '2026-01-02 03:04:05+00');
             INSERT INTO items (name, price, tags) \
               SELECT 'item ' || g, g * 1.5, ARRAY['t' || g, 'all'] FROM generate_series(1, 1500) g;
             UPDATE items SET note = repeat('x', 5000) WHERE id = 1;
             CREATE VIEW cheap AS SELECT id, name FROM items WHERE price < 10;",
        );
        Postgres {
            port: cluster.port,
            cluster,
        }
    }

    fn dsn(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/shop?sslmode=disable",
            self.port
        )
    }

    /// Runs SQL through `psql` (not through the server under test) and returns its unaligned output.
    fn psql(&self, db: &str, sql: &str) -> String {
        self.cluster.psql(db, sql)
    }

    /// A fingerprint of everything the bypass attempts could touch.
    fn fingerprint(&self) -> String {
        self.psql(
            "shop",
            "SELECT (SELECT count(*) FROM items) || ' rows, ' || \
                    (SELECT md5(string_agg(id || name || coalesce(note, '') , ',' ORDER BY id)) FROM items) || ', ' || \
                    (SELECT string_agg(relname, ',' ORDER BY relname) FROM pg_class c JOIN pg_namespace n \
                       ON n.oid = c.relnamespace WHERE n.nspname = 'public') || ', seq ' || \
                    (SELECT last_value FROM items_id_seq) || ', ro default ' || \
                    (SELECT setting FROM pg_settings WHERE name = 'default_transaction_read_only')",
        )
    }
}

/// A test CA and a server certificate for `localhost` only (not 127.0.0.1), made with openssl;
/// the server's files are handed to the postgres user.
fn make_certificates(dir: &Path, uid: u32, gid: u32) {
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n\
         extendedKeyUsage=serverAuth\n",
    )
    .expect("write server.ext");
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let steps: Vec<Vec<&str>> = vec![
        [
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-subj",
                "/CN=agen-test-ca",
                "-days",
                "2",
            ],
        ]
        .concat(),
        [
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ],
        ]
        .concat(),
        vec![
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    ];
    for args in steps {
        let out = Command::new("openssl")
            .args(&args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
            .expect("run openssl (Debian's postgresql package depends on it)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for file in ["server.crt", "server.key"] {
        chown(dir.join(file), Some(uid), Some(gid)).expect("chown to postgres");
        std::fs::set_permissions(dir.join(file), std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
    }
}

/// Runs `agen mcp sql --dsn-env MYDSN --timeout 1s` under the Python SDK client with `calls`,
/// the DSN only in the server's environment; returns the client's JSON report.
fn drive(dsn: &str, calls: &Value) -> Value {
    let mut child = Command::new(Peers::python())
        .arg(Peers::script("mcp_client.py"))
        .args(["--env", &format!("MYDSN={dsn}"), "--timeout", "60", "--"])
        .arg(agen_bin())
        .args(["mcp", "sql", "--dsn-env", "MYDSN", "--timeout", "1s"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the python MCP client");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(calls.to_string().as_bytes())
        .expect("write calls");
    let (tx, rx) = std::sync::mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(Duration::from_secs(300)) {
        Ok(out) => out.expect("wait for the client"),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("the MCP client did not finish within 300 s");
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the MCP session failed: {stderr}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("client output is not JSON ({e}): {stderr}"))
}

fn call(name: &str, arguments: Value) -> Value {
    json!({"name": name, "arguments": arguments})
}

fn query(sql: &str) -> Value {
    call("query", json!({ "sql": sql }))
}

/// The result texts, asserting the success/failure of each.
fn texts(report: &Value, expect_error: bool) -> Vec<String> {
    report["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| {
            assert_eq!(
                r["is_error"].as_bool(),
                Some(expect_error),
                "call {} gave is_error={} (protocol error: {}): {}",
                r["name"],
                r["is_error"],
                r["error"],
                r["text"]
            );
            assert!(
                r["error"].is_null(),
                "a protocol-level error instead of a tool result: {}",
                r["error"]
            );
            r["text"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

fn json_rows(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("row JSON"))
        .collect()
}

/// What the listing says of one tool.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ListedTool {
    name: String,
    properties: Vec<String>,
    required: Vec<String>,
    read_only: Option<bool>,
}

fn sorted_strings(value: Option<Vec<String>>) -> Vec<String> {
    let mut v = value.unwrap_or_default();
    v.sort();
    v
}

/// The listing: three tools, their contract arguments, all read-only.
fn assert_tool_listing(report: &Value) {
    let tools = report["tools"].as_array().expect("tools");
    let mut listed: Vec<ListedTool> = tools
        .iter()
        .map(|t| ListedTool {
            name: t["name"].as_str().unwrap_or_default().to_owned(),
            properties: sorted_strings(
                t["inputSchema"]["properties"]
                    .as_object()
                    .map(|p| p.keys().cloned().collect()),
            ),
            required: sorted_strings(t["inputSchema"]["required"].as_array().map(|r| {
                r.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })),
            read_only: t["annotations"]["readOnlyHint"].as_bool(),
        })
        .collect();
    listed.sort();
    let tool = |name: &str, properties: &[&str], required: &[&str]| ListedTool {
        name: name.to_owned(),
        properties: properties.iter().map(|s| s.to_string()).collect(),
        required: required.iter().map(|s| s.to_string()).collect(),
        read_only: Some(true),
    };
    assert_eq!(
        listed,
        vec![
            tool("describe", &["table"], &["table"]),
            tool("query", &["limit", "sql"], &["sql"]),
            tool("tables", &[], &[]),
        ]
    );
    assert_eq!(report["server_info"]["name"], json!("agen-sql"));
}

#[test]
fn postgres_tables_describe_and_query_work_through_the_python_sdk() {
    let pg = Postgres::start();
    let report = drive(
        &pg.dsn(),
        &json!([
            call("tables", json!({})),
            call("describe", json!({"table": "items"})),
            call("describe", json!({"table": "public.cheap"})),
            query("SELECT id, name, price, tags, created FROM items WHERE id <= 2 ORDER BY id"),
            query("SHOW transaction_read_only"),
            query("SHOW statement_timeout"),
            call("describe", json!({"table": "pg_class"})),
            call("describe", json!({"table": "PUBLIC.ITEMS"})),
        ]),
    );
    assert_tool_listing(&report);
    let t = texts(&report, false);
    assert_eq!(t[0], "public.cheap (view)\npublic.items (table)\n");
    assert_eq!(
        t[1],
        "items: 6 columns\n\
         id       integer                   not null\n\
         name     text                      not null\n\
         price    numeric(10,2)             null\n\
         note     text                      null\n\
         tags     text[]                    null\n\
         created  timestamp with time zone  not null\n"
    );
    assert!(t[2].starts_with("cheap: 2 columns\n"), "{}", t[2]);
    assert_eq!(
        json_rows(&t[3]),
        vec![
            json!({"id": 1, "name": "item 1", "price": "1.50", "tags": ["t1", "all"], "created": "2026-01-02 03:04:05+00"}),
            json!({"id": 2, "name": "item 2", "price": "3.00", "tags": ["t2", "all"], "created": "2026-01-02 03:04:05+00"}),
        ]
    );
    assert!(
        t[3].contains("(2 rows; columns: id, name, price, tags, created)"),
        "{}",
        t[3]
    );
    assert_eq!(
        json_rows(&t[4]),
        vec![json!({"transaction_read_only": "on"})]
    );
    assert_eq!(json_rows(&t[5]), vec![json!({"statement_timeout": "1s"})]);
    // Catalogs resolve through the search path; unquoted names fold to lower case as in SQL.
    assert!(t[6].starts_with("pg_class: "), "{}", t[6]);
    assert!(t[7].starts_with("items: 6 columns"), "{}", t[7]);
}

#[test]
fn postgres_bypass_attempts_all_fail_and_leave_the_data_unchanged() {
    let pg = Postgres::start();
    let before = pg.fingerprint();
    let attempts = [
        "COMMIT; DROP TABLE items",
        "END; INSERT INTO items (name) VALUES ('evil')",
        "SELECT 1; DELETE FROM items",
        "SELECT 1; COMMIT; DELETE FROM items",
        "/* just a comment */ DELETE FROM items",
        "-- a read\nUPDATE items SET name = 'evil'",
        "DROP TABLE items",
        "TRUNCATE items",
        "CREATE TABLE evil (x int)",
        "INSERT INTO items (name) VALUES ('evil')",
        "SET TRANSACTION READ WRITE",
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
        "SET statement_timeout = 0",
        "RESET statement_timeout",
        "RESET ALL",
        "BEGIN READ WRITE",
        "START TRANSACTION READ WRITE",
        "SELECT set_config('default_transaction_read_only', 'off', false)",
        "SELECT set_config('transaction_read_only', 'off', true)",
        "SELECT pg_catalog.set_config('statement_timeout', '0', true), pg_sleep(3)",
        "WITH gone AS (DELETE FROM items RETURNING *) SELECT count(*) FROM gone",
        "WITH x AS (UPDATE items SET name = 'evil' RETURNING 1) SELECT * FROM x",
        "SELECT * INTO stolen FROM items",
        "SELECT * FROM items FOR UPDATE",
        "EXPLAIN ANALYZE DELETE FROM items",
        "SELECT nextval('items_id_seq')",
        "DO $$ BEGIN DELETE FROM items; END $$",
        "COPY items TO '/tmp/agen-sql-e2e-copy'",
        "PREPARE p AS DELETE FROM items",
        "LOCK TABLE items",
        "SELECT lo_import('/etc/hostname')",
        "SELECT query_to_xml('DELETE FROM items', true, true, '')",
    ];
    let calls: Vec<Value> = attempts.iter().map(|sql| query(sql)).collect();
    let report = drive(&pg.dsn(), &Value::Array(calls));
    let results = report["results"].as_array().expect("results");
    for (sql, result) in attempts.iter().zip(results) {
        assert_eq!(
            result["is_error"],
            json!(true),
            "{sql:?} was not refused: {}",
            result["text"]
        );
        assert!(
            result["error"].is_null(),
            "{sql:?} failed at the protocol level: {}",
            result["error"]
        );
        let text = result["text"].as_str().unwrap_or_default();
        assert!(!text.is_empty(), "{sql:?}: the refusal must say why");
    }
    assert_eq!(pg.fingerprint(), before, "the data changed");
    assert!(!Path::new("/tmp/agen-sql-e2e-copy").exists());
}

#[test]
fn postgres_row_limits_cell_cuts_and_the_timeout_hold() {
    let pg = Postgres::start();
    let report = drive(
        &pg.dsn(),
        &json!([
            query("SELECT id FROM items ORDER BY id"),
            call(
                "query",
                json!({"sql": "SELECT id FROM items ORDER BY id", "limit": 1000})
            ),
            call(
                "query",
                json!({"sql": "SELECT id FROM items ORDER BY id", "limit": 5000})
            ),
            call(
                "query",
                json!({"sql": "SELECT id FROM items ORDER BY id", "limit": 7})
            ),
            query("SELECT note FROM items WHERE id = 1"),
            query("SELECT pg_sleep(10)"),
            query("SELECT 'still serving' AS status"),
            call("describe", json!({"table": "no_such_table"})),
            call("query", json!({"sql": "SELECT 1", "limit": 0})),
            query("SELECT $1::int"),
            query("SELECT * FROM no_such_table"),
        ]),
    );
    let results = report["results"].as_array().expect("results");
    let text = |i: usize| results[i]["text"].as_str().unwrap_or_default().to_owned();
    for i in [0, 1, 2, 3, 4, 6] {
        assert_eq!(
            results[i]["is_error"],
            json!(false),
            "call {i}: {}",
            text(i)
        );
    }
    assert_eq!(json_rows(&text(0)).len(), 100);
    assert!(
        text(0).contains("(100 rows; the query returned more;"),
        "{}",
        text(0)
    );
    assert!(
        text(0).contains("Cut at the row limit (100)"),
        "{}",
        text(0)
    );
    assert_eq!(json_rows(&text(1)).len(), 1000);
    assert_eq!(json_rows(&text(1))[999], json!({"id": 1000}));
    assert_eq!(json_rows(&text(2)).len(), 1000);
    assert!(text(2).contains("above the maximum"), "{}", text(2));
    assert_eq!(json_rows(&text(3)).len(), 7);
    let note = json_rows(&text(4))[0]["note"]
        .as_str()
        .expect("note")
        .to_owned();
    assert_eq!(
        note,
        format!("{}… [cut: 5000 characters]", "x".repeat(1000))
    );
    assert!(
        text(4).contains("longer than 1000 characters"),
        "{}",
        text(4)
    );
    // The slow query: stopped at the 1 s timeout, as a tool error, and the server goes on.
    assert_eq!(results[5]["is_error"], json!(true), "{}", text(5));
    assert!(text(5).contains("stopped after 1s"), "{}", text(5));
    let elapsed = results[5]["elapsed_ms"].as_u64().expect("elapsed");
    assert!(elapsed < 8_000, "the slow query took {elapsed} ms");
    assert_eq!(
        json_rows(&text(6)),
        vec![json!({"status": "still serving"})]
    );
    // Mistakes are tool errors that say what to do.
    for (i, expected) in [
        (7, "table `no_such_table` not found; `tables` lists"),
        (8, "`limit` must be between 1 and 1000"),
        (9, "takes no parameters"),
        (
            10,
            "relation \"no_such_table\" does not exist (SQLSTATE 42P01)",
        ),
    ] {
        assert_eq!(results[i]["is_error"], json!(true), "call {i}: {}", text(i));
        assert!(text(i).contains(expected), "call {i}: {}", text(i));
    }
}

/// A SQLite file with `items` (1,500 rows, one long note) and a view, made with Python's sqlite3.
fn sqlite_fixture(dir: &Path) -> PathBuf {
    let path = dir.join("shop.db");
    let script = format!(
        "import sqlite3\n\
         c = sqlite3.connect({path:?})\n\
         c.executescript('''\n\
           CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, price REAL, note TEXT);\n\
           CREATE VIEW cheap AS SELECT id, name FROM items WHERE price < 10;\n\
         ''')\n\
         c.executemany('INSERT INTO items (id, name, price, note) VALUES (?, ?, ?, ?)',\n\
           [(i, 'item %d' % i, i * 1.5, 'x' * 5000 if i == 1 else None) for i in range(1, 1501)])\n\
         c.commit()\n",
        path = path.to_string_lossy()
    );
    let out = Command::new(Peers::python())
        .args(["-c", &script])
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "sqlite fixture: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

fn sqlite_fingerprint(path: &Path) -> String {
    let script = format!(
        "import sqlite3, hashlib\n\
         c = sqlite3.connect('file:' + {path:?} + '?mode=ro', uri=True)\n\
         rows = c.execute('SELECT id, name, price, note FROM items ORDER BY id').fetchall()\n\
         names = c.execute('SELECT group_concat(name) FROM (SELECT name FROM sqlite_schema ORDER BY name)').fetchone()[0]\n\
         uv = c.execute('PRAGMA user_version').fetchone()[0]\n\
         print(len(rows), hashlib.md5(repr(rows).encode()).hexdigest(), names, uv)\n",
        path = path.to_string_lossy()
    );
    let out = Command::new(Peers::python())
        .args(["-c", &script])
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "sqlite fingerprint: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn sqlite_tools_limits_and_timeout_work_through_the_python_sdk() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = sqlite_fixture(dir.path());
    let report = drive(
        &db.to_string_lossy(),
        &json!([
            call("tables", json!({})),
            call("describe", json!({"table": "items"})),
            query("SELECT id, name, price FROM items WHERE id <= 2 ORDER BY id"),
            query("PRAGMA table_info(items)"),
            query("SELECT id FROM items ORDER BY id"),
            call("query", json!({"sql": "SELECT id FROM items ORDER BY id", "limit": 1000})),
            query("SELECT note FROM items WHERE id = 1"),
            query("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"),
            query("SELECT 'still serving' AS status"),
            call("describe", json!({"table": "no_such_table"})),
            query("SELECT ?1"),
            query("SELECT * FROM no_such_table"),
        ]),
    );
    assert_tool_listing(&report);
    let results = report["results"].as_array().expect("results");
    let text = |i: usize| results[i]["text"].as_str().unwrap_or_default().to_owned();
    for i in [0, 1, 2, 3, 4, 5, 6, 8] {
        assert_eq!(
            results[i]["is_error"],
            json!(false),
            "call {i}: {}",
            text(i)
        );
    }
    assert_eq!(text(0), "cheap (view)\nitems (table)\n");
    assert_eq!(
        text(1),
        "items: 4 columns\nid     INTEGER  null\nname   TEXT     not null\nprice  REAL     null\nnote   TEXT     null\n"
    );
    assert_eq!(
        json_rows(&text(2)),
        vec![
            json!({"id": 1, "name": "item 1", "price": 1.5}),
            json!({"id": 2, "name": "item 2", "price": 3.0})
        ]
    );
    assert_eq!(json_rows(&text(3)).len(), 4);
    assert_eq!(json_rows(&text(4)).len(), 100);
    assert!(
        text(4).contains("Cut at the row limit (100)"),
        "{}",
        text(4)
    );
    assert_eq!(json_rows(&text(5)).len(), 1000);
    assert!(text(5).contains("the query returned more"), "{}", text(5));
    let note = json_rows(&text(6))[0]["note"]
        .as_str()
        .expect("note")
        .to_owned();
    assert_eq!(
        note,
        format!("{}… [cut: 5000 characters]", "x".repeat(1000))
    );
    assert_eq!(results[7]["is_error"], json!(true), "{}", text(7));
    assert!(text(7).contains("stopped after 1s"), "{}", text(7));
    let elapsed = results[7]["elapsed_ms"].as_u64().expect("elapsed");
    assert!(elapsed < 8_000, "the runaway query took {elapsed} ms");
    assert_eq!(
        json_rows(&text(8)),
        vec![json!({"status": "still serving"})]
    );
    for (i, expected) in [
        (9, "table `no_such_table` not found; `tables` lists"),
        (10, "takes no parameters"),
        (11, "no such table: no_such_table"),
    ] {
        assert_eq!(results[i]["is_error"], json!(true), "call {i}: {}", text(i));
        assert!(text(i).contains(expected), "call {i}: {}", text(i));
    }
}

#[test]
fn sqlite_bypass_attempts_all_fail_and_leave_the_file_unchanged() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = sqlite_fixture(dir.path());
    let before = sqlite_fingerprint(&db);
    let other = dir.path().join("other.db");
    let copy = dir.path().join("copy.db");
    let attempts = vec![
        "SELECT 1; DELETE FROM items".to_owned(),
        "SELECT 1; DROP TABLE items".to_owned(),
        "/* a read */ DELETE FROM items".to_owned(),
        "/* /* */ DROP TABLE items /* */".to_owned(),
        "-- a read\nUPDATE items SET name = 'evil'".to_owned(),
        "INSERT INTO items (name) VALUES ('evil')".to_owned(),
        "REPLACE INTO items (id, name) VALUES (1, 'evil')".to_owned(),
        "WITH x AS (SELECT 1) DELETE FROM items".to_owned(),
        "CREATE TABLE evil (x)".to_owned(),
        "CREATE TEMP TABLE evil AS SELECT * FROM items".to_owned(),
        "DROP VIEW cheap".to_owned(),
        "BEGIN; DELETE FROM items; COMMIT".to_owned(),
        "BEGIN IMMEDIATE".to_owned(),
        format!("ATTACH DATABASE '{}' AS other", other.display()),
        "DETACH DATABASE main".to_owned(),
        format!("VACUUM INTO '{}'", copy.display()),
        "VACUUM".to_owned(),
        "SELECT load_extension('/nonexistent/evil.so')".to_owned(),
        "PRAGMA query_only = 0".to_owned(),
        "PRAGMA query_only = OFF".to_owned(),
        "PRAGMA writable_schema = 1".to_owned(),
        "PRAGMA user_version = 42".to_owned(),
        "PRAGMA journal_mode = WAL".to_owned(),
        "ANALYZE".to_owned(),
        "REINDEX".to_owned(),
    ];
    let calls: Vec<Value> = attempts.iter().map(|sql| query(sql)).collect();
    let report = drive(&db.to_string_lossy(), &Value::Array(calls));
    let results = report["results"].as_array().expect("results");
    for (sql, result) in attempts.iter().zip(results) {
        assert_eq!(
            result["is_error"],
            json!(true),
            "{sql:?} was not refused: {}",
            result["text"]
        );
        assert!(
            result["error"].is_null(),
            "{sql:?} failed at the protocol level: {}",
            result["error"]
        );
        assert!(
            !result["text"].as_str().unwrap_or_default().is_empty(),
            "{sql:?}: the refusal must say why"
        );
    }
    assert_eq!(sqlite_fingerprint(&db), before, "the database changed");
    assert!(!other.exists(), "ATTACH created {}", other.display());
    assert!(!copy.exists(), "VACUUM INTO wrote {}", copy.display());
}

#[test]
fn a_missing_dsn_variable_stops_the_server_with_a_clear_error() {
    let out = Command::new(agen_bin())
        .args(["mcp", "sql", "--dsn-env", "AGEN_SQL_E2E_UNSET"])
        .env_remove("AGEN_SQL_E2E_UNSET")
        .stdin(Stdio::null())
        .output()
        .expect("run agen mcp sql");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("AGEN_SQL_E2E_UNSET is not set"), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "stdout is the protocol and must stay clean: {:?}",
        out.stdout
    );
}

#[test]
fn postgres_tls_follows_libpq_sslmode() {
    let pg = Postgres::start_with_tls();
    let ca = pg.ca_file();
    let ca = ca.display();
    let port = pg.port;
    let ssl_in_use = query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()");
    // (DSN, Some(uses TLS) when the call must work, None when it must fail to connect)
    let cases = [
        (
            format!(
                "postgres://postgres@localhost:{port}/shop?sslmode=verify-full&sslrootcert={ca}"
            ),
            Some(true),
        ),
        (
            format!("postgres://postgres@127.0.0.1:{port}/shop?sslmode=verify-ca&sslrootcert={ca}"),
            Some(true),
        ),
        (
            format!("postgres://postgres@127.0.0.1:{port}/shop?sslmode=require"),
            Some(true),
        ),
        (
            format!("postgres://postgres@127.0.0.1:{port}/shop"),
            Some(true),
        ),
        (
            format!("postgres://postgres@127.0.0.1:{port}/shop?sslmode=disable"),
            Some(false),
        ),
        // The certificate names localhost only.
        (
            format!(
                "postgres://postgres@127.0.0.1:{port}/shop?sslmode=verify-full&sslrootcert={ca}"
            ),
            None,
        ),
        // The test CA is not among the system's roots.
        (
            format!("postgres://postgres@localhost:{port}/shop?sslmode=verify-full"),
            None,
        ),
    ];
    for (dsn, expected) in cases {
        let report = drive(&dsn, &json!([ssl_in_use]));
        let result = &report["results"][0];
        let text = result["text"].as_str().unwrap_or_default();
        match expected {
            Some(tls) => {
                assert_eq!(result["is_error"], json!(false), "{dsn}: {text}");
                assert_eq!(json_rows(text), vec![json!({"ssl": tls})], "{dsn}");
            }
            None => {
                assert_eq!(
                    result["is_error"],
                    json!(true),
                    "{dsn} must not connect: {text}"
                );
                assert!(
                    text.contains("cannot connect") && text.contains("certificate"),
                    "{dsn}: {text}"
                );
            }
        }
    }
}

#[test]
fn an_unreachable_postgres_is_a_tool_error_and_the_server_keeps_serving() {
    let port = free_port();
    let dsn = format!("postgres://postgres@127.0.0.1:{port}/shop?sslmode=disable");
    let report = drive(&dsn, &json!([call("tables", json!({})), query("SELECT 1")]));
    assert_tool_listing(&report);
    for text in texts(&report, true) {
        assert!(text.starts_with("cannot connect to the database"), "{text}");
        assert!(
            !text.contains("postgres://"),
            "the DSN must never be echoed: {text}"
        );
    }
}

/// Starts `agen mcp sql --timeout 30s` under the Python SDK, abandons a slow `sql` after 1 s (the
/// SDK then sends `notifications/cancelled`), and times a quick follow-up `check` query; prints
/// `{"abandoned_ms": …, "next_ms": …, "next": <text>, "next_is_error": …}`.
const ABANDON_SCRIPT: &str = r#"
import anyio, json, re, sys, time
from mcp import ClientSession, StdioServerParameters, stdio_client
agen, dsn, slow, check = sys.argv[1:5]
async def main():
    params = StdioServerParameters(command=agen, args=["mcp", "sql", "--dsn-env", "MYDSN", "--timeout", "30s"], env={"MYDSN": dsn})
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            t = time.monotonic()
            with anyio.move_on_after(1):
                await s.call_tool("query", {"sql": slow})
            abandoned = time.monotonic() - t
            t = time.monotonic()
            res = await s.call_tool("query", {"sql": check})
            next_ms = int((time.monotonic() - t) * 1000)
            # The database ends a cancelled statement asynchronously: give it a moment.
            for _ in range(25):
                text = res.content[0].text
                if res.is_error or '"sleeping"' not in text or re.search(r'"sleeping":\s*0\b', text):
                    break
                await anyio.sleep(0.2)
                res = await s.call_tool("query", {"sql": check})
            print(json.dumps({"abandoned_ms": int(abandoned * 1000), "next_ms": next_ms,
                              "next": res.content[0].text, "next_is_error": bool(res.is_error)}))
anyio.run(main)
"#;

fn abandon_slow_query(dsn: &str, slow: &str, check: &str) -> Value {
    let out = Command::new(Peers::python())
        .arg("-c")
        .arg(ABANDON_SCRIPT)
        .arg(agen_bin())
        .args([dsn, slow, check])
        .stdin(Stdio::null())
        .output()
        .expect("run the python MCP client");
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("client JSON")
}

#[test]
fn a_cancelled_call_stops_its_query_in_both_engines() {
    let pg = Postgres::start();
    let report = abandon_slow_query(
        &pg.dsn(),
        "SELECT pg_sleep(20)",
        "SELECT count(*) AS sleeping FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(20)' AND state = 'active'",
    );
    assert_eq!(report["next_is_error"], json!(false), "{report}");
    assert!(
        report["next_ms"].as_u64().expect("ms") < 5_000,
        "the next call waited: {report}"
    );
    assert_eq!(
        json_rows(report["next"].as_str().expect("text")),
        vec![json!({"sleeping": 0})]
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let db = sqlite_fixture(dir.path());
    let report = abandon_slow_query(
        &db.to_string_lossy(),
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
        "SELECT count(*) AS n FROM items",
    );
    assert_eq!(report["next_is_error"], json!(false), "{report}");
    assert!(
        report["next_ms"].as_u64().expect("ms") < 5_000,
        "the next call waited: {report}"
    );
    assert_eq!(
        json_rows(report["next"].as_str().expect("text")),
        vec![json!({"n": 1500})]
    );
}

/// Runs the server like [`drive`], with `--timeout` `timeout`, under a wrapper that records the
/// server's peak resident memory (KiB) and its stderr. Returns (report, peak KiB, stderr).
fn drive_measured(dsn: &str, calls: &Value, timeout: &str) -> (Value, u64, String) {
    const WRAP: &str = "import resource, subprocess, sys\n\
        err = open(sys.argv[1], 'wb')\n\
        p = subprocess.run(sys.argv[3:], stderr=err)\n\
        open(sys.argv[2], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n\
        sys.exit(p.returncode)\n";
    let dir = tempfile::tempdir().expect("temp dir");
    let (err_file, rss_file) = (dir.path().join("stderr"), dir.path().join("rss"));
    let out = Command::new(Peers::python())
        .arg(Peers::script("mcp_client.py"))
        .args(["--env", &format!("MYDSN={dsn}"), "--timeout", "120", "--"])
        .arg(Peers::python())
        .args(["-c", WRAP])
        .arg(&err_file)
        .arg(&rss_file)
        .arg(agen_bin())
        .args(["mcp", "sql", "--dsn-env", "MYDSN", "--timeout", timeout])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(calls.to_string().as_bytes())?;
            child.wait_with_output()
        })
        .expect("run the python MCP client");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the MCP session failed: {stderr}");
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("client output is not JSON ({e}): {stderr}"));
    let rss = std::fs::read_to_string(&rss_file)
        .expect("peak rss")
        .trim()
        .parse()
        .expect("rss number");
    (
        report,
        rss,
        std::fs::read_to_string(&err_file).unwrap_or_default(),
    )
}

#[test]
fn postgres_side_effects_that_outlive_a_call_are_refused_or_reset_and_huge_cells_are_cut_in_the_database(
) {
    let pg = Postgres::start();
    // A function the database's owner wrote, which the screen cannot see into: the reset after
    // each call must still release its session lock.
    pg.psql(
        "shop",
        "CREATE FUNCTION lock_it() RETURNS void LANGUAGE sql AS 'SELECT pg_advisory_lock(42)'",
    );
    // Another backend the agent will try to end.
    let mut other = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(Path::new(PG_BIN).join("psql"))
        .args([
            "-X",
            "-q",
            "-h",
            "127.0.0.1",
            "-p",
            &pg.port.to_string(),
            "-U",
            "postgres",
            "-d",
            "shop",
        ])
        .args(["-c", "SELECT pg_sleep(60) AS victim"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the other backend");
    let victim_sql =
        "SELECT pid FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60) AS victim'";
    let victim = agen_tests::wait_for("the other backend", Duration::from_secs(20), || {
        Some(pg.psql("shop", victim_sql)).filter(|p| !p.is_empty())
    })
    .expect("victim pid");
    let before = pg.fingerprint();
    let refused = [
        format!("SELECT pg_terminate_backend({victim})"),
        format!(r#"SELECT U&"\0070g_terminate_backend"({victim})"#),
        format!(r#"SELECT U&"!0070g_cancel_backend" UESCAPE '!' ({victim})"#),
        format!(r#"SELECT pg_catalog."pg_terminate_backend"({victim})"#),
        r#"SELECT U&"\0070g_advisory_lock"(7)"#.to_owned(),
        "SELECT pg_advisory_lock(7)".to_owned(),
        "SELECT pg_try_advisory_lock(7)".to_owned(),
        "SELECT dblink_exec('dbname=shop', 'DELETE FROM items')".to_owned(),
        r#"SELECT U&"dbl\0069nk_exec"('dbname=shop', 'DELETE FROM items')"#.to_owned(),
        "SELECT pg_reload_conf()".to_owned(),
        "SELECT set_config('statement_timeout', '0', false)".to_owned(),
    ];
    let mut calls: Vec<Value> = refused.iter().map(|sql| query(sql)).collect();
    calls.push(query("SELECT lock_it()"));
    calls.push(query(
        "SELECT count(*) AS locks FROM pg_locks WHERE locktype = 'advisory'",
    ));
    calls.push(query(
        "SELECT repeat('a', 100000000) AS a, repeat('b', 100000000) AS b, repeat('c', 100000000) AS c, 1 AS n",
    ));
    calls.push(query(
        "SELECT ARRAY[repeat('z', 20000)] AS arr, '{\"k\": 1}'::jsonb AS small",
    ));
    let (report, peak_kib, stderr) = drive_measured(&pg.dsn(), &Value::Array(calls), "20s");
    let results = report["results"].as_array().expect("results");
    let text = |i: usize| results[i]["text"].as_str().unwrap_or_default().to_owned();
    let mut passed = Vec::new();
    for (i, sql) in refused.iter().enumerate() {
        if results[i]["is_error"] != json!(true) || !text(i).contains("is refused") {
            passed.push(format!("{sql}: {}", text(i)));
        }
    }
    let n = refused.len();
    assert_eq!(results[n]["is_error"], json!(false), "{}", text(n));
    assert_eq!(
        json_rows(&text(n + 1)),
        vec![json!({"locks": 0})],
        "a session lock outlived its call"
    );
    let huge = json_rows(&text(n + 2));
    assert_eq!(results[n + 2]["is_error"], json!(false), "{}", text(n + 2));
    let a = huge[0]["a"].as_str().expect("a").to_owned();
    assert!(a.starts_with(&"a".repeat(950)), "{a:.80}");
    assert!(a.contains("[cut in the database: "), "{}", &a[950..]);
    assert_eq!(huge[0]["n"], json!(1));
    let small = json_rows(&text(n + 3));
    assert_eq!(small[0]["small"], json!({"k": 1}));
    assert!(small[0]["arr"]
        .as_str()
        .expect("arr")
        .contains("[cut in the database"));
    // Nothing reached another backend or the data.
    let victim_alive = pg.psql("shop", victim_sql);
    let _ = other.kill();
    let _ = other.wait();
    assert_eq!(passed, Vec::<String>::new());
    assert_eq!(victim_alive, victim, "the other backend was ended");
    assert_eq!(pg.fingerprint(), before, "the data changed");
    // 300 MB of cells were asked for; the server held a few KB of them.
    assert!(
        peak_kib < 200 * 1024,
        "the server peaked at {} MiB",
        peak_kib / 1024
    );
    // The test DSN is the superuser: the server says so at start.
    assert!(
        stderr.contains("warning: the DSN's role is a superuser")
            && stderr.contains("the guide recommends connecting as a role that may only read"),
        "{stderr}"
    );
}

#[test]
fn huge_sqlite_values_fail_at_once_within_the_timeout_and_memory_stays_bounded() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = sqlite_fixture(dir.path());
    let attempts = [
        "SELECT randomblob(300000000)",
        "SELECT length(randomblob(300000000))",
        "SELECT zeroblob(300000000)",
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 40) \
         SELECT length(group_concat(randomblob(10000000))) FROM c",
    ];
    let mut calls: Vec<Value> = attempts.iter().map(|sql| query(sql)).collect();
    // printf() past the cap answers NULL at once rather than failing.
    calls.push(query(
        "SELECT printf('%.*c', 300000000, 'x') IS NULL AS capped",
    ));
    // A value under the cap is served, and cut before it is copied out.
    calls.push(query("SELECT randomblob(8000000) AS b, 'ok' AS status"));
    let (report, peak_kib, _) = drive_measured(&db.to_string_lossy(), &Value::Array(calls), "3s");
    let results = report["results"].as_array().expect("results");
    let mut unbounded = Vec::new();
    for (i, sql) in attempts.iter().enumerate() {
        let text = results[i]["text"].as_str().unwrap_or_default();
        let ms = results[i]["elapsed_ms"].as_u64().unwrap_or(u64::MAX);
        if results[i]["is_error"] != json!(true) || ms > 4_000 {
            unbounded.push(format!("{sql}: {ms} ms: {text:.200}"));
        }
    }
    let capped = results[attempts.len()]["text"].as_str().unwrap_or_default();
    assert_eq!(json_rows(capped), vec![json!({"capped": 1})], "{capped}");
    let last = results[attempts.len() + 1]["text"]
        .as_str()
        .unwrap_or_default();
    let rows = json_rows(last);
    assert_eq!(unbounded, Vec::<String>::new());
    assert!(
        results[0]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("select a part of large values with substr()"),
        "{}",
        results[0]["text"]
    );
    assert_eq!(rows[0]["status"], json!("ok"), "{last:.300}");
    assert!(
        rows[0]["b"]
            .as_str()
            .expect("b")
            .ends_with("[cut: 8000000 bytes]"),
        "{last:.300}"
    );
    assert!(
        peak_kib < 400 * 1024,
        "the server peaked at {} MiB",
        peak_kib / 1024
    );
}
