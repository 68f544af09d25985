//! `--metrics-listen` as a Prometheus server scrapes it: the Hub's `/metrics` parsed by a real
//! parser (PyPI prometheus-client's), every named series present, and the task, model, tool,
//! token, run-event and store series moving as a task runs a tool call.

use std::process::Command;
use std::time::Duration;

use agen_tests::{free_port, wait_for, write_bundle, FakeModel, HubProcess, Peers};
use serde_json::{json, Value};

/// One scrape, parsed by prometheus-client's text parser.
fn scrape(port: u16) -> Value {
    let out = Command::new(Peers::python())
        .arg(Peers::script("prom_scrape.py"))
        .arg(format!("http://127.0.0.1:{port}/metrics"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "prom_scrape.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The sum of the samples named `name` whose labels include `labels`.
fn sum(scrape: &Value, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == name)
        .filter(|s| labels.iter().all(|(k, v)| s["labels"][k] == *v))
        .map(|s| s["value"].as_f64().unwrap_or(0.0))
        .sum()
}

#[test]
fn a_prometheus_scrape_parses_and_its_series_move_as_a_task_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let hub = HubProcess::start_with_args(
        tmp.path(),
        free_port(),
        "3s",
        &["--metrics-listen", &format!("127.0.0.1:{metrics_port}")],
    )
    .unwrap();
    let nest_metrics_port = free_port();
    let nest_metrics = format!("127.0.0.1:{nest_metrics_port}");
    let _nest = hub
        .nest(
            "metered",
            &[],
            &[("AGEN_NEST_METRICS_LISTEN", &nest_metrics)],
        )
        .unwrap();
    let model = FakeModel::start(
        &tmp.path().join("model"),
        &json!({"steps": [
            {"tool_calls": [{"name": "save_artifact", "arguments": {"name": "n.txt", "content": "counted"}}]},
            {"reply": "done"}
        ]}),
    )
    .unwrap();
    let bundle = tmp.path().join("metered");
    write_bundle(
        &bundle,
        &[
            ("mcp.json", json!({"mcpServers": {}}).to_string()),
            (
                "x-agen/agent.md",
                format!(
                    "---\nname: metered\nmodel: openai/fake-model\nbaseUrl: {}\n---\nYou save.\n",
                    model.base_url()
                ),
            ),
        ],
    )
    .unwrap();
    let out = hub
        .cli(&["deploy", bundle.to_str().unwrap(), "--name", "metered"])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    hub.wait_instances("metered running", Duration::from_secs(60), |l| {
        l.iter()
            .any(|i| i["deployment"] == "metered" && i["healthy"] == true)
    })
    .unwrap();

    // The Nest's own: its instance running, no restarts, nothing waiting for the Hub.
    let nest = scrape(nest_metrics_port);
    assert_eq!(
        sum(&nest, "agen_nest_instances", &[("state", "running")]),
        1.0,
        "{nest}"
    );
    assert_eq!(
        sum(
            &nest,
            "agen_instance_restarts_total",
            &[("deployment", "metered")]
        ),
        0.0
    );
    assert!(
        nest["families"]["agen_nest_run_events_pending"] == "gauge",
        "{nest}"
    );

    let before = scrape(metrics_port);
    assert!(
        before["content_type"]
            .as_str()
            .unwrap()
            .starts_with("application/openmetrics-text"),
        "{}",
        before["content_type"]
    );
    assert_eq!(
        sum(&before, "agen_queue_depth", &[("deployment", "metered")]),
        0.0
    );
    let age = sum(
        &before,
        "agen_nest_heartbeat_age_seconds",
        &[("nest", "metered")],
    );
    assert!((0.0..10.0).contains(&age), "heartbeat age {age}");

    let out = hub.cli(&["submit", "metered", "Save a note."]).unwrap();
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

    let after = wait_for("the task's series to move", Duration::from_secs(20), || {
        let s = scrape(metrics_port);
        (sum(
            &s,
            "agen_tasks_total",
            &[("deployment", "metered"), ("state", "succeeded")],
        ) >= 1.0)
            .then_some(s)
    })
    .unwrap();
    let moved = |name: &str, labels: &[(&str, &str)]| {
        sum(&after, name, labels) - sum(&before, name, labels)
    };
    let dep = [("deployment", "metered")];
    let counts = [
        (
            "tasks queued",
            moved(
                "agen_tasks_total",
                &[("deployment", "metered"), ("state", "queued")],
            ),
        ),
        (
            "tasks running",
            moved(
                "agen_tasks_total",
                &[("deployment", "metered"), ("state", "running")],
            ),
        ),
        (
            "task durations",
            moved("agen_task_duration_seconds_count", &dep),
        ),
        (
            "dispatch latencies",
            moved("agen_dispatch_latency_seconds_count", &[]),
        ),
        (
            "model turns",
            moved(
                "agen_model_request_duration_seconds_count",
                &[("deployment", "metered"), ("model", "fake-model")],
            ),
        ),
        (
            "tool calls ok",
            moved(
                "agen_tool_calls_total",
                &[
                    ("deployment", "metered"),
                    ("tool", "save_artifact"),
                    ("status", "ok"),
                ],
            ),
        ),
        (
            "tool durations",
            moved(
                "agen_tool_call_duration_seconds_count",
                &[("deployment", "metered"), ("tool", "save_artifact")],
            ),
        ),
        ("run events", moved("agen_run_events_appended_total", &[])),
        ("fsyncs", moved("agen_store_fsyncs_total", &[])),
        (
            "artifact bytes",
            moved("agen_artifact_bytes", &[("namespace", "default")]),
        ),
    ];
    let families = after["families"].as_object().unwrap();
    for name in [
        "agen_tasks",
        "agen_queue_depth",
        "agen_dispatch_latency_seconds",
        "agen_task_duration_seconds",
        "agen_model_request_duration_seconds",
        "agen_model_tokens",
        "agen_tool_calls",
        "agen_tool_call_duration_seconds",
        "agen_instance_restarts",
        "agen_nest_heartbeat_age_seconds",
        "agen_run_events_appended",
        "agen_store_fsyncs",
        "agen_store_fsync_duration_seconds",
        "agen_artifact_bytes",
    ] {
        assert!(families.contains_key(name), "{name} missing: {families:?}");
    }
    eprintln!("series moved: {counts:?}");
    for (what, n) in counts {
        assert!(n >= 1.0, "{what} did not move: {n}");
    }
    assert_eq!(
        moved("agen_model_request_duration_seconds_count", &dep),
        2.0,
        "two model turns"
    );
    assert_eq!(
        moved("agen_artifact_bytes", &[("namespace", "default")]),
        7.0,
        "`counted` is 7 bytes"
    );
    assert_eq!(sum(&after, "agen_queue_depth", &dep), 0.0);
    // The fake model reports 0 tokens per turn: the series exist with what it reported.
    for kind in ["input", "output"] {
        let series = after["samples"].as_array().unwrap().iter().any(|s| {
            s["name"] == "agen_model_tokens_total"
                && s["labels"]["deployment"] == "metered"
                && s["labels"]["model"] == "fake-model"
                && s["labels"]["type"] == kind
        });
        assert!(series, "agen_model_tokens_total {{type={kind}}} missing");
    }
}
