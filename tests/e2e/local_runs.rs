//! `agen run`'s local run logs (issue 43: "`agen run` cannot be debugged or resumed: … its
//! local run log cannot be listed, viewed or resumed (`agen run --resume RUN`, `agen runs`,
//! `agen trace --local RUN`), although the SDK can resume"): a standalone run killed with
//! kill -9 in the middle of a side-effecting call is listed `interrupted`, traced from its log,
//! and resumed to its end with the ledger's guarantees, counted.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use agen_tests::{agen_bin, mcp_json, wait_for, write_bundle, FakeModel};
use serde_json::{json, Value};

/// `agen ARGS` with the run logs under `state`.
fn agen(state: &Path, args: &[&str]) -> Output {
    Command::new(agen_bin())
        .args(args)
        .env("XDG_STATE_HOME", state)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .count()
}

/// Kills the process group of the `agen run` it holds (its tool servers included) and the
/// command whose pid is in `.1` (the workspace server starts commands in groups of their own)
/// when dropped.
struct Group(u32, std::path::PathBuf);
impl Drop for Group {
    fn drop(&mut self) {
        use nix::sys::signal::{kill, killpg, Signal};
        use nix::unistd::Pid;
        let _ = killpg(Pid::from_raw(self.0 as i32), Signal::SIGKILL);
        if let Some(pid) = std::fs::read_to_string(&self.1)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// "Agen checkpoints every step, so a run whose instance dies resumes elsewhere. … a call that
/// completed is never repeated on resume, its recorded result is reused." — for `agen run`,
/// whose instance is the process itself.
///
/// A run calls `ws_run` twice (the first completes, the second is killed with the whole
/// process group while it runs); `agen runs` lists it `interrupted`; `agen trace --local RUN`
/// shows the completed call `ok` and the killed one `unfinished`; `agen run --resume RUN`
/// (no bundle folder: the log names it) finishes it: the model is not asked the two answered
/// turns again (3 requests in all), neither command is executed again (1 and 1), the model is
/// told `effect_unknown` for the killed one; then `agen runs` says `succeeded` after 2
/// attempts, a second `--resume` prints the recorded answer, an unknown run exits 4.
#[test]
fn a_killed_agen_run_is_listed_traced_and_resumed_from_its_local_run_log() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let (one, two) = (tmp.path().join("one"), tmp.path().join("two"));
    let requests = tmp.path().join("requests.jsonl");
    let sleeper = tmp.path().join("sleeper.pid");
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"record": requests, "steps": [
            {"tool_calls": [{"name": "ws_run", "arguments": {"command": format!("echo ran >> {}", one.display())}}]},
            {"tool_calls": [{"name": "ws_run", "arguments": {"command": format!("echo $$ > {}; echo ran >> {}; exec sleep 60", sleeper.display(), two.display())}}]},
            {"reply_template": "done: {{last_tool_result}}"}
        ]}),
    )
    .unwrap();
    let dir = tmp.path().join("b");
    write_bundle(
        &dir,
        &[
            (
                "mcp.json",
                mcp_json(&[("ws", json!({"command": "agen", "args": ["mcp", "workspace", "--root", "."]}))]),
            ),
            (
                "x-agen/agent.md",
                format!("---\nname: local\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou run commands.\n", model.base_url()),
            ),
        ],
    )
    .unwrap();

    // The run, killed (kill -9, the whole group) while its second command sleeps.
    let child = Command::new(agen_bin())
        .arg("run")
        .arg(&dir)
        .arg("run both")
        .arg("--approve-all")
        .env("XDG_STATE_HOME", &state)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let group = Group(child.id(), sleeper.clone());
    wait_for("the second command to run", Duration::from_secs(30), || {
        (lines(&two) == 1).then_some(())
    })
    .unwrap();
    drop(group);
    let mut child = child;
    let _ = child.wait();

    let runs = agen(&state, &["runs", "-o", "json"]);
    assert!(runs.status.success(), "{}", text(&runs.stderr));
    let list: Vec<Value> = serde_json::from_slice(&runs.stdout).unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    let run = list[0]["run"].as_str().unwrap().to_string();
    assert_eq!(list[0]["state"], "interrupted", "{list:?}");
    assert_eq!(list[0]["agent"], "local");
    assert_eq!(list[0]["prompt"], "run both");
    assert_eq!(list[0]["attempts"], 1);
    let table = agen(&state, &["runs"]);
    let table_text = text(&table.stdout);
    assert!(
        table_text.contains(&run) && table_text.contains("interrupted"),
        "{table_text}"
    );
    assert!(text(&table.stderr).contains("agen run --resume RUN"));

    let traced = agen(&state, &["trace", "--local", &run, "-o", "json"]);
    assert!(traced.status.success(), "{}", text(&traced.stderr));
    let t: Value = serde_json::from_slice(&traced.stdout).unwrap();
    let statuses = |t: &Value, name: &str| -> Vec<String> {
        t["spans"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["name"] == name)
            .map(|s| s["status"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(statuses(&t, "tool ws.run"), ["ok", "unfinished"], "{t}");
    assert_eq!(statuses(&t, "task local"), ["interrupted"], "{t}");

    // Resumed from the log alone.
    let resumed = agen(&state, &["run", "--resume", &run, "--approve-all"]);
    let out = text(&resumed.stdout);
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed.stderr));
    assert!(
        out.starts_with("done: ") && out.contains("effect_unknown"),
        "{out}"
    );
    assert!(text(&resumed.stderr).contains("attempt 2"));
    assert_eq!(
        (lines(&one), lines(&two)),
        (1, 1),
        "each command executed exactly once"
    );
    assert_eq!(lines(&requests), 3, "answered turns are not asked again");

    let after: Vec<Value> =
        serde_json::from_slice(&agen(&state, &["runs", "-o", "json"]).stdout).unwrap();
    assert_eq!(
        (after[0]["state"].as_str(), after[0]["attempts"].as_u64()),
        (Some("succeeded"), Some(2)),
        "{after:?}"
    );
    let t: Value =
        serde_json::from_slice(&agen(&state, &["trace", "--local", &run, "-o", "json"]).stdout)
            .unwrap();
    assert_eq!(statuses(&t, "task local"), ["succeeded"], "{t}");
    assert_eq!(statuses(&t, "model turn 3"), ["ok"], "{t}");
    let events = agen(
        &state,
        &["trace", "--local", &run, "--events", "-o", "json"],
    );
    let kinds: Vec<(u64, String)> = text(&events.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|e| {
            (
                e["attempt"].as_u64().unwrap(),
                e["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(kinds.first().map(|k| k.0), Some(1), "{kinds:?}");
    assert_eq!(
        kinds.last(),
        Some(&(2, "run.finished".to_string())),
        "{kinds:?}"
    );

    let again = agen(&state, &["run", "--resume", &run]);
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(text(&again.stdout), out, "the recorded answer");
    assert_eq!(lines(&requests), 3);
    let unknown = agen(&state, &["run", "--resume", "no-such-run"]);
    assert_eq!(unknown.status.code(), Some(4), "{}", text(&unknown.stderr));
    assert!(text(&unknown.stderr).contains("agen runs"));
    let unknown = agen(&state, &["trace", "--local", "no-such-run"]);
    assert_eq!(unknown.status.code(), Some(4));
}
