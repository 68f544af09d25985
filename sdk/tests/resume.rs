//! A program with an embedded agent crashes mid-run (`kill -9`) and the next start resumes the
//! run from the agent's local run log. The program is this test binary run again as a child
//! process (`child_program`, which does nothing unless started by a test here); its host tool
//! `charge` is side-effecting and writes one fsynced line per real execution to a counter
//! file, the truth of how often it ran.
//!
//! What this shows: a completed side-effecting host tool is not called again on resume (its
//! recorded result is reused); one interrupted mid-call is not called again either (the model
//! is told `effect_unknown`); the run is listed as unfinished until it is resumed.

#![allow(clippy::unwrap_used)] // a test: a panic is a failure with its message

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agen::{Agent, RunOptions, RunState, Tool};
use agen_fake_model::{FakeModel, Script, Step};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};

const CHILD_ENV: &str = "AGEN_SDK_TEST_CHILD";

/// The agent as the program defines it, in the child and in the test alike.
async fn agent(base_url: &str, log: &Path, counter: PathBuf, hang_after_effect: bool) -> Agent {
    let charge = Tool::new("charge", "Charges the customer (a side effect)").json_handler(
        move |args: Value, _cx| {
            let counter = counter.clone();
            async move {
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&counter)
                    .unwrap();
                writeln!(f, "charged {}", args["amount"]).unwrap();
                f.sync_all().unwrap();
                if hang_after_effect {
                    // The crash comes while the call is still in flight.
                    tokio::time::sleep(Duration::from_secs(300)).await;
                }
                Ok::<_, String>(format!("receipt for {}", args["amount"]))
            }
        },
    );
    Agent::builder()
        .name("biller")
        .model("openai/fake")
        .base_url(base_url)
        .api_key("k")
        .run_log(log)
        .tool(charge)
        .build()
        .await
        .unwrap()
}

/// The child program: runs one run until it is killed. Does nothing in a normal test run.
#[test]
fn child_program() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let spec: Value = serde_json::from_str(&spec).unwrap();
    let s = |k: &str| spec[k].as_str().unwrap().to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let agent = agent(
            &s("base_url"),
            Path::new(&s("log")),
            PathBuf::from(s("counter")),
            spec["hang"].as_bool().unwrap(),
        )
        .await;
        let _ = agent
            .run_with("Charge 5", RunOptions::new().run_id(s("run_id")))
            .await;
    });
}

/// Kills the child's process group when dropped.
struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(-(self.0.id() as i32));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

fn start_child(spec: Value) -> Killed {
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_program",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, spec.to_string())
        .stdout(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    Killed(child)
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

fn poll(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs the child until `crash_when`, kills it with SIGKILL, then resumes in this process
/// against `resume_steps`; returns the outcome's result and the counter's lines.
async fn crash_and_resume(
    hang: bool,
    crash_when: impl Fn(&FakeModel, &Path) -> bool,
) -> (String, usize, Vec<String>) {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("runs");
    let counter = tmp.path().join("charges.txt");
    // Before the crash: the model calls `charge`, then never answers the next turn.
    let first = FakeModel::start(
        Script::steps(vec![
            Step::call("charge", json!({"amount": 5})),
            Step {
                delay_ms: Some(300_000),
                ..Step::reply("too late")
            },
        ]),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let child = start_child(json!({
        "base_url": first.openai_base_url(),
        "log": log.to_str().unwrap(),
        "counter": counter.to_str().unwrap(),
        "run_id": "run-crash",
        "hang": hang,
    }));
    poll("the moment of the crash", || crash_when(&first, &counter));
    drop(child); // kill -9 of the program

    let second = FakeModel::start(
        Script::steps(vec![
            Step::call("charge", json!({"amount": 5})),
            Step::template("done: {{last_tool_result}}"),
        ]),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let agent = agent(&second.openai_base_url(), &log, counter.clone(), false).await;
    let unfinished = agent.unfinished_runs().unwrap();
    let out = agent.resume("run-crash").await.unwrap();
    assert_eq!(out.state, RunState::Succeeded, "{}", out.result);
    // Resumed at turn 2: the answered first turn was not asked again.
    assert_eq!(second.requests().len(), 1);
    assert_eq!(agent.unfinished_runs().unwrap(), Vec::<String>::new());
    (out.result, lines(&counter), unfinished)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_side_effecting_host_tool_is_not_called_again_after_a_crash() {
    // The crash comes after the result is recorded: the next model turn was asked.
    let (result, charges, unfinished) =
        crash_and_resume(false, |model, _| model.requests().len() >= 2).await;
    assert_eq!(unfinished, vec!["run-crash".to_string()]);
    assert_eq!(result, "done: receipt for 5");
    assert_eq!(charges, 1, "charge ran {charges} times");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_side_effecting_host_tool_is_reported_effect_unknown_not_called_again() {
    // The crash comes while `charge` is in flight, after its effect.
    let (result, charges, unfinished) =
        crash_and_resume(true, |_, counter| lines(counter) >= 1).await;
    assert_eq!(unfinished, vec!["run-crash".to_string()]);
    assert!(result.starts_with("done: effect_unknown"), "{result}");
    assert_eq!(charges, 1, "charge ran {charges} times");
}
