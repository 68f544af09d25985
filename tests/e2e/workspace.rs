//! `agen mcp workspace` driven by the official Python MCP SDK client (PyPI `mcp`) through
//! `tests/peers/mcp_client.py`: initialize, tools/list (names, schemas, annotations; `--no-run`
//! hides `run`), a call of every tool, escapes refused as tool errors, and `run`'s exit codes,
//! output tail and process-group kill on timeout.
//!
//! Needs `target/debug/agen` and `target/peers/venv` (tests/peers/install.sh); a missing peer
//! fails the test.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt as _;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_path_buf()
}

fn agen() -> PathBuf {
    let bin = repo_root().join("target/debug/agen");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p agen-cli`",
        bin.display()
    );
    bin
}

fn python() -> PathBuf {
    let python = repo_root().join("target/peers/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run tests/peers/install.sh",
        python.display()
    );
    python
}

/// Kills the client's process group (the client and the server it started) when dropped.
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0.and_then(|p| i32::try_from(p).ok()) {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Starts `agen mcp workspace --root ROOT EXTRA...` under the Python SDK client, makes `calls`
/// and returns the client's JSON report (`tools`, `results`, ...).
async fn drive(root: &Path, extra: &[&str], calls: Value) -> Value {
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(repo_root().join("tests/peers/mcp_client.py"))
        .arg("--")
        .arg(agen())
        .args(["mcp", "workspace", "--root"])
        .arg(root)
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd.as_std_mut().process_group(0);
    let mut child = cmd.spawn().expect("start the Python MCP client");
    let _guard = GroupGuard(child.id());
    let mut stdin = child.stdin.take().expect("stdin is piped");
    stdin
        .write_all(calls.to_string().as_bytes())
        .await
        .expect("write the calls");
    drop(stdin);
    let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("the MCP session finished within 2 minutes")
        .expect("the client ran");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the Python MCP client failed: {}\n{stderr}",
        output.status
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "client output is not JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// A temp folder with `root/` (the workspace) and `outside/secret.txt` beside it.
fn workspace() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("src")).expect("mkdir");
    std::fs::create_dir_all(tmp.path().join("outside")).expect("mkdir");
    std::fs::write(tmp.path().join("outside/secret.txt"), "SECRET\n").expect("write");
    std::fs::write(
        root.join("src/main.rs"),
        "fn main() {\n    println!(\"hello\");\n}\n",
    )
    .expect("write");
    std::os::unix::fs::symlink("../outside", root.join("escape")).expect("symlink");
    (tmp, root)
}

fn result(report: &Value, index: usize) -> (&str, bool) {
    let r = &report["results"][index];
    assert_eq!(
        r["error"],
        Value::Null,
        "call {index} failed at the protocol level: {r}"
    );
    (
        r["text"].as_str().expect("text"),
        r["is_error"].as_bool().expect("is_error"),
    )
}

#[tokio::test]
async fn workspace_server_lists_tools_with_schemas_and_annotations() {
    let (_tmp, root) = workspace();
    let report = drive(&root, &[], json!([])).await;
    assert_eq!(report["server_info"]["name"], "agen-workspace");
    let summary: Vec<Value> = report["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| {
            let schema = &t["inputSchema"];
            let mut props: Vec<&str> =
                schema["properties"].as_object().expect("properties").keys().map(String::as_str).collect();
            props.sort();
            let mut required: Vec<&str> =
                schema["required"].as_array().expect("required").iter().filter_map(Value::as_str).collect();
            required.sort();
            json!({
                "name": t["name"], "type": schema["type"], "properties": props, "required": required,
                "readOnlyHint": t["annotations"]["readOnlyHint"], "has_description": t["description"].is_string(),
            })
        })
        .collect();
    assert_eq!(
        Value::Array(summary),
        json!([
            {"name": "read", "type": "object", "properties": ["limit", "offset", "path"], "required": ["path"], "readOnlyHint": true, "has_description": true},
            {"name": "list", "type": "object", "properties": ["pattern"], "required": ["pattern"], "readOnlyHint": true, "has_description": true},
            {"name": "grep", "type": "object", "properties": ["glob", "path", "pattern"], "required": ["pattern"], "readOnlyHint": true, "has_description": true},
            {"name": "edit", "type": "object", "properties": ["new_string", "old_string", "path", "replace_all"], "required": ["new_string", "old_string", "path"], "readOnlyHint": false, "has_description": true},
            {"name": "write", "type": "object", "properties": ["content", "path"], "required": ["content", "path"], "readOnlyHint": false, "has_description": true},
            {"name": "run", "type": "object", "properties": ["command", "timeout"], "required": ["command"], "readOnlyHint": false, "has_description": true},
        ])
    );
    for side_effect in [3, 4, 5] {
        assert_eq!(
            report["tools"][side_effect]["annotations"]["destructiveHint"],
            true
        );
    }
}

#[tokio::test]
async fn no_run_leaves_the_run_tool_out() {
    let (_tmp, root) = workspace();
    let report = drive(
        &root,
        &["--no-run"],
        json!([{"name": "run", "arguments": {"command": "touch ran"}}]),
    )
    .await;
    let names: Vec<&str> = report["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["read", "list", "grep", "edit", "write"]);
    let (text, is_error) = result(&report, 0);
    assert!(is_error && text.contains("--no-run"), "{text}");
    assert!(!root.join("ran").exists(), "run must not run with --no-run");
}

#[tokio::test]
async fn every_tool_works_and_escapes_are_tool_errors() {
    let (tmp, root) = workspace();
    let absolute_inside = root.join("src/main.rs").display().to_string();
    let calls = json!([
        {"name": "write", "arguments": {"path": "docs/notes.md", "content": "# Notes\nneedle here\n"}},
        {"name": "read", "arguments": {"path": "src/main.rs"}},
        {"name": "read", "arguments": {"path": absolute_inside, "offset": 2, "limit": 1}},
        {"name": "edit", "arguments": {"path": "src/main.rs", "old_string": "hello", "new_string": "needle"}},
        {"name": "list", "arguments": {"pattern": "**/*"}},
        {"name": "grep", "arguments": {"pattern": "needle", "glob": "*.rs"}},
        {"name": "run", "arguments": {"command": "cat src/main.rs | wc -l"}},
        {"name": "read", "arguments": {"path": "escape/secret.txt"}},
        {"name": "write", "arguments": {"path": "escape/new.txt", "content": "x"}},
        {"name": "read", "arguments": {"path": "../outside/secret.txt"}},
        {"name": "read", "arguments": {"path": "src/missing.rs"}},
        {"name": "edit", "arguments": {"path": "src/main.rs", "old_string": "nothing like this", "new_string": "x"}},
        {"name": "read", "arguments": {"file_path": "src/main.rs"}},
    ]);
    let report = drive(&root, &[], calls).await;
    let canonical_root = std::fs::canonicalize(&root).expect("canonical root");
    let outside_message = format!("`../outside/secret.txt` is outside the workspace root `{}`; use a path relative to the root (absolute paths are accepted only inside the root)", canonical_root.display());
    let expected: Vec<(bool, &str)> = vec![
        (false, "created `docs/notes.md` (2 lines, 20 bytes)"),
        (false, "     1\tfn main() {\n     2\t    println!(\"hello\");\n     3\t}\n"),
        (false, "     2\t    println!(\"hello\");\n(lines 2-2 of 3; call read with offset 3 to see more)"),
        (false, "edited `src/main.rs`: replaced 1 occurrence (at line 2)"),
        (
            false,
            "docs/notes.md\nsrc/main.rs\nskipped `escape`: symbolic link leading outside the workspace root (not followed)",
        ),
        (false, "src/main.rs:2:     println!(\"needle\");\nskipped `escape`: symbolic link leading outside the workspace root (not followed)"),
        (false, "exit code: 0\noutput:\n3\n"),
        (true, "`escape/secret.txt` goes through the symbolic link `escape`, which leads outside the workspace root (to `../outside`); links that leave the root are never followed and the link is left as it is"),
        (true, "`escape/new.txt` goes through the symbolic link `escape`, which leads outside the workspace root (to `../outside`); links that leave the root are never followed and the link is left as it is"),
        (true, &outside_message),
        (true, "`src/missing.rs` does not exist; `list` shows what does"),
        (true, "old_string was not found in `src/main.rs`; read the file and copy the exact text, including whitespace and indentation"),
        (true, "invalid arguments for `read`: unknown field `file_path`, expected one of `path`, `offset`, `limit`"),
    ];
    let got: Vec<(bool, String)> = (0..expected.len())
        .map(|i| {
            let (text, is_error) = result(&report, i);
            (is_error, text.to_string())
        })
        .collect();
    let expected: Vec<(bool, String)> = expected
        .into_iter()
        .map(|(e, t)| (e, t.to_string()))
        .collect();
    assert_eq!(got, expected);
    assert!(
        !tmp.path().join("outside/new.txt").exists(),
        "nothing may be written outside the root"
    );
    assert!(std::fs::symlink_metadata(root.join("escape"))
        .expect("link")
        .file_type()
        .is_symlink());
}

#[tokio::test]
async fn run_reports_exit_codes_and_the_last_20000_characters() {
    let (_tmp, root) = workspace();
    let calls = json!([
        {"name": "run", "arguments": {"command": "echo out; echo err >&2; exit 7"}},
        {"name": "run", "arguments": {"command": "i=0; while [ $i -lt 1000 ]; do printf '%049d\\n' $i; i=$((i+1)); done; printf LAST"}},
        {"name": "run", "arguments": {"command": "kill -9 $$"}},
    ]);
    let report = drive(&root, &[], calls).await;

    let (text, is_error) = result(&report, 0);
    assert_eq!(
        (text, is_error),
        ("exit code: 7\noutput:\nout\nerr\n", false)
    );

    // 1000 lines of 50 characters + "LAST": 50,004 characters, of which the last 20,000 are kept
    let (text, is_error) = result(&report, 1);
    assert!(!is_error);
    let header =
        "exit code: 0\noutput (the last 20000 of 50004 characters; earlier output was cut):\n";
    assert!(text.starts_with(header), "{}", &text[..200.min(text.len())]);
    let tail = &text[header.len()..];
    assert_eq!(tail.chars().count(), 20_000);
    assert!(
        tail.ends_with("00000000000000000000000000000000000000000999\nLAST"),
        "{}",
        &tail[tail.len() - 120..]
    );

    let (text, _) = result(&report, 2);
    assert_eq!(text, "exit code: none (killed by signal 9)\n(no output)");
}

#[tokio::test]
async fn run_timeout_kills_the_whole_group_before_replying() {
    let (_tmp, root) = workspace();
    // The shell and its child both ignore SIGTERM; only a group SIGKILL stops them.
    let stubborn = "trap '' TERM; (trap '' TERM; echo $$ > child.pid; while :; do sleep 1; done) & echo started; wait";
    // Runs right after the reply, in the same session: the child must already be gone.
    let check = "pid=$(cat child.pid); if [ -d /proc/$pid ] && [ \"$(cut -d' ' -f3 /proc/$pid/stat)\" != Z ]; then echo alive $pid; else echo gone; fi";
    let calls = json!([
        {"name": "run", "arguments": {"command": stubborn, "timeout": 2}},
        {"name": "run", "arguments": {"command": check}},
        {"name": "run", "arguments": {"command": "sleep 30"}},
    ]);
    let report = drive(&root, &["--run-timeout", "1s"], calls).await;

    let (text, is_error) = result(&report, 0);
    assert!(is_error, "a timeout is a tool error: {text}");
    assert_eq!(
        text,
        "timed out after 2s: the command and every process it started were killed (exit code: none)\noutput:\nstarted\n"
    );
    let elapsed = report["results"][0]["elapsed_ms"]
        .as_u64()
        .expect("elapsed");
    assert!(
        (2000..10_000).contains(&elapsed),
        "the reply came after {elapsed} ms"
    );

    let (text, _) = result(&report, 1);
    assert_eq!(text, "exit code: 0\noutput:\ngone\n");

    // --run-timeout is the default when a call gives none
    let (text, is_error) = result(&report, 2);
    assert!(is_error && text.starts_with("timed out after 1s"), "{text}");
}

#[tokio::test]
async fn background_processes_stop_when_the_session_ends() {
    let (_tmp, root) = workspace();
    let calls = json!([{"name": "run", "arguments": {"command": "sleep 300 >/dev/null 2>&1 & echo $! > bg.pid"}}]);
    let report = drive(&root, &[], calls).await;
    let (text, is_error) = result(&report, 0);
    assert!(
        !is_error && text.contains("still running in process group"),
        "{text}"
    );
    let pid = std::fs::read_to_string(root.join("bg.pid")).expect("pid file");
    let stat = format!("/proc/{}/stat", pid.trim());
    let gone = || {
        std::fs::read_to_string(&stat).map_or(true, |s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !gone() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        gone(),
        "background process {} outlived the workspace server",
        pid.trim()
    );
}

#[tokio::test]
async fn a_no_run_server_refuses_git_config_and_hooks_and_bounds_a_catastrophic_grep() {
    let (tmp, root) = workspace();
    let git = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(&root)
        .status()
        .expect("git init");
    assert!(git.success());
    let config_before = std::fs::read_to_string(root.join(".git/config")).expect("config");
    // 10 MB of word characters without a non-word one: the worst case for `\w{300}\W`.
    let line = "a".repeat(32 * 1024 - 1) + "\n";
    std::fs::write(root.join("big.txt"), line.repeat(300)).expect("big file");
    let pwned = tmp.path().join("pwned");
    let hook = format!("#!/bin/sh\ntouch {}\n", pwned.display());
    let calls = json!([
        {"name": "write", "arguments": {"path": ".git/config", "content": format!("[core]\n\tfsmonitor = touch {}\n", pwned.display())}},
        {"name": "edit", "arguments": {"path": ".git/config", "old_string": "[core]", "new_string": format!("[core]\n\tfsmonitor = touch {}", pwned.display())}},
        {"name": "write", "arguments": {"path": ".git/hooks/post-checkout", "content": hook}},
        {"name": "write", "arguments": {"path": ".git/hooks/fsmonitor-watchman", "content": hook}},
        {"name": "grep", "arguments": {"pattern": r"\w{300}\W"}},
        {"name": "grep", "arguments": {"pattern": r"(a|aa|aaa){1,100}b"}},
        {"name": "read", "arguments": {"path": "src/main.rs"}},
    ]);
    let report = drive(&root, &["--no-run"], calls).await;
    let mut written = Vec::new();
    for i in 0..4 {
        let (text, is_error) = result(&report, i);
        if !is_error || !text.contains("is inside a `.git` folder") {
            written.push(format!("call {i}: {text}"));
        }
    }
    let mut slow = Vec::new();
    for i in [4, 5] {
        let ms = report["results"][i]["elapsed_ms"]
            .as_u64()
            .unwrap_or(u64::MAX);
        if ms > 13_000 {
            slow.push(format!("grep {i} took {ms} ms"));
        }
    }
    let (read, read_error) = result(&report, 6);
    // The person's next `git status` in the folder runs nothing the agent wrote.
    let status = std::process::Command::new("git")
        .args(["status", "--short"])
        .current_dir(&root)
        .output()
        .expect("git status");
    assert_eq!(written, Vec::<String>::new());
    assert_eq!(slow, Vec::<String>::new());
    assert!(!read_error, "{read}");
    assert!(status.status.success());
    assert_eq!(
        std::fs::read_to_string(root.join(".git/config")).expect("config"),
        config_before
    );
    assert!(!pwned.exists(), "a command the agent wrote ran");
    let hooks: Vec<_> = std::fs::read_dir(root.join(".git/hooks"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        !hooks
            .iter()
            .any(|h| h == "post-checkout" || h == "fsmonitor-watchman"),
        "{hooks:?}"
    );
}
