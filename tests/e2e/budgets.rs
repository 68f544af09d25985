//! Task budgets on a real fleet (issue 15 item 5): `agen submit --timeout` fails a task whose
//! tool call hangs with "deadline exceeded" and stops the call; `--max-tokens` stops a
//! multi-turn run before the turn that would pass it (the scripted model reports usage); the
//! bundle's `limits.taskTimeout` / `limits.maxTokens` apply when the submit gives none, the
//! submitter's value wins when it does; `agen query` shows them.

use std::time::Duration;

use agen_tests::wait_for;
use serde_json::{json, Value};

use crate::runs::{fleet, processes_running, Fleet};

#[test]
fn a_task_past_its_timeout_fails_with_deadline_exceeded_and_its_tool_call_stops() {
    let script = json!({"steps": [
        {"tool_calls": [{"name": "ws_run", "arguments": {"command": "sleep 48.25"}}]},
        {"reply": "done"}
    ]});
    let f = fleet(script, json!({"limits": {"taskTimeout": "1h"}}));
    let started = std::time::Instant::now();
    let task = f.submit(&["slow", "--timeout", "2s"]);
    wait_for("the tool call to start", Duration::from_secs(30), || {
        (!processes_running("sleep 48.25").is_empty()).then_some(())
    })
    .unwrap();
    let q = f.hub.cli_json(&["query", &task, "-o", "json"]).unwrap();
    assert_eq!(q["timeout"], "2s", "the submitter's value wins: {q}");
    assert!(q["deadline"].is_string(), "{q}");
    assert_eq!(q["max_tokens"], Value::Null, "{q}");
    let text = f.hub.cli(&["query", &task]).unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("timeout:     2s (deadline "), "{text}");

    let (code, t) = f.wait(&task);
    assert_ne!(code, 0, "{t}");
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["outcome"]["response_type"], "error", "{t}");
    let result = t["outcome"]["result"].as_str().unwrap_or_default();
    assert!(result.starts_with("deadline exceeded"), "{result}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    // The run was cancelled, and with it its tool call.
    wait_for(
        "the tool's process to be gone",
        Duration::from_secs(15),
        || processes_running("sleep 48.25").is_empty().then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}", processes_running("sleep 48.25")));
    let trace = f.hub.cli(&["trace", &task, "--events"]).unwrap();
    let trace = String::from_utf8_lossy(&trace.stdout);
    assert!(trace.contains("run.finished"), "the run ended: {trace}");
    assert!(
        !trace.contains("tool.completed"),
        "the call never completed: {trace}"
    );

    // A task of the bundle submitted without a timeout takes the bundle's.
    let other = f.submit(&["slow"]);
    let q = f.hub.cli_json(&["query", &other, "-o", "json"]).unwrap();
    assert_eq!(q["timeout"], "1h", "{q}");
    let out = f.hub.cli(&["cancel", &other]).unwrap();
    assert!(out.status.success());
}

/// Three model turns that report 400, 600 and 100 tokens (input + output), each of the first
/// two calling `ws_run`.
fn counting_script() -> Value {
    json!({"steps": [
        {"tool_calls": [{"name": "ws_run", "arguments": {"command": "echo one"}}], "usage": {"input_tokens": 300, "output_tokens": 100}},
        {"tool_calls": [{"name": "ws_run", "arguments": {"command": "echo two"}}], "usage": {"input_tokens": 500, "output_tokens": 100}},
        {"reply": "all done", "usage": {"input_tokens": 90, "output_tokens": 10}}
    ]})
}

/// Runs one task with `args` and returns (its ended task JSON, the model requests it made).
fn run_counted(f: &Fleet, args: &[&str]) -> (Value, usize) {
    let before = f.model_requests().len();
    let task = f.submit(args);
    f.wait(&task);
    let q = f.hub.cli_json(&["query", &task, "-o", "json"]).unwrap();
    (q, f.model_requests().len() - before)
}

#[test]
fn max_tokens_stops_a_multi_turn_run_before_the_turn_that_would_exceed_it() {
    let f = fleet(counting_script(), json!({"limits": {"maxTokens": 700}}));

    // The bundle's budget: turn 1 took 400, so turn 2 (which re-sends them) would pass 700.
    let (t, asked) = run_counted(&f, &["count"]);
    assert_eq!(t["max_tokens"], 700, "{t}");
    assert_eq!(t["state"], "failed", "{t}");
    assert_eq!(t["outcome"]["response_type"], "error", "{t}");
    let result = t["outcome"]["result"].as_str().unwrap_or_default();
    assert!(
        result.starts_with(
            "token budget exceeded: 400 of max 700 tokens used, and the next turn would take at least 400 more"
        ),
        "{result}"
    );
    assert_eq!(asked, 1, "stopped before the second turn");

    // The submitter's budget wins: 400 + 600 = 1000 used, past 900, before the third turn.
    let (t, asked) = run_counted(&f, &["count", "--max-tokens", "900"]);
    assert_eq!(t["max_tokens"], 900, "{t}");
    assert_eq!(t["state"], "failed", "{t}");
    let result = t["outcome"]["result"].as_str().unwrap_or_default();
    assert!(
        result.starts_with("token budget exceeded: 1000 of max 900 tokens used"),
        "{result}"
    );
    assert_eq!(asked, 2, "stopped before the third turn");

    // Even above the bundle's: a budget that fits lets the run finish.
    let (t, asked) = run_counted(&f, &["count", "--max-tokens", "5000"]);
    assert_eq!(t["state"], "succeeded", "{t}");
    assert_eq!(t["outcome"]["result"], "all done", "{t}");
    assert_eq!(asked, 3);
}
