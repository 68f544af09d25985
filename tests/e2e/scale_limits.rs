//! The scale limits of `docs/limits.md` that need a fleet (issue 39): Nests per Hub
//! (`--max-nests`) and instances per Nest (`--max-instances-per-nest`), each sent one over with
//! real Nest processes on a real Hub. Queued tasks per deployment need no Nest and are sent by
//! `limits_table.rs`.

use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

use agen_tests::{agen_bin, free_port, wait_for, FakeModel, HubProcess, Proc};
use serde_json::json;

use crate::limits::bundle;

#[test]
fn a_nest_over_the_hubs_nest_limit_is_refused_and_retries_and_a_nest_gets_no_more_instances_than_the_hub_allows(
) {
    let tmp = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let metrics_listen = format!("127.0.0.1:{metrics_port}");
    let hub = HubProcess::start_with_args(
        tmp.path(),
        free_port(),
        "10s",
        &[
            "--max-nests",
            "1",
            "--max-instances-per-nest",
            "1",
            "--metrics-listen",
            &metrics_listen,
        ],
    )
    .unwrap();
    let mut nest_a = hub.nest("nest-a", &[], &[]).unwrap();

    // One Nest over: refused at Register with the limit, the value and the flag; the Nest logs
    // it and keeps retrying with back-off (it does not exit).
    let dir_b = tmp.path().join("nests/nest-b");
    std::fs::create_dir_all(&dir_b).unwrap();
    let mut cmd = Command::new(agen_bin());
    cmd.args(["nest", "--hub", &hub.url(), "--join-file"])
        .arg(tmp.path().join("hub/join-token"))
        .args(["--name", "nest-b", "--run-as-self", "--data-dir"])
        .arg(&dir_b)
        .env("RUST_LOG", "info");
    let mut nest_b = Proc::spawn("nest-b", cmd, &tmp.path().join("nest-nest-b.log")).unwrap();
    let refusal = "this hub has 1 nests connected, the limit is 1 (agen hub --max-nests)";
    wait_for(
        "nest-b refused twice (a retry)",
        Duration::from_secs(30),
        || (nest_b.log_text().matches(refusal).count() >= 2).then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}\nnest-b log:\n{}", nest_b.log_text()));
    let log = nest_b.log_text();
    assert!(
        log.contains("nests: nest `") && log.contains("reconnecting in"),
        "the Nest says what was refused and that it retries:\n{log}"
    );
    assert!(
        nest_b.child.try_wait().unwrap().is_none(),
        "a refused Nest keeps running:\n{log}"
    );
    let names: Vec<String> = hub
        .nests()
        .unwrap()
        .iter()
        .filter_map(|n| n["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(names, ["nest-a"], "the refused Nest is not registered");
    let refused = refused_nests(metrics_port);
    assert!(
        refused >= 2.0,
        "agen_hub_limit_refused_total{{limit=\"nests\"}} counts the refusals: {refused}"
    );

    // One instance over on a Nest that declares room for 32: the second replica stays pending
    // and says why.
    let model = FakeModel::start(&tmp.path().join("model"), &json!([{"reply": "ok"}])).unwrap();
    let bundle_dir = tmp.path().join("bundle");
    bundle(&bundle_dir, &model);
    let out = hub
        .cli(&[
            "deploy",
            bundle_dir.to_str().unwrap(),
            "--name",
            "runner",
            "--replicas",
            "2",
        ])
        .unwrap();
    assert!(
        out.status.success(),
        "deploy: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    hub.wait_instances(
        "one replica running on nest-a, the other pending naming the limit",
        Duration::from_secs(60),
        |l| {
            let running = l
                .iter()
                .filter(|i| i["state"] == "running" && i["nest"] == "nest-a")
                .count();
            let held = l.iter().filter(|i| {
                i["state"] == "pending"
                    && i["message"].as_str().is_some_and(|m| {
                        m.contains("the hub's limit of 1 instances per nest: agen hub --max-instances-per-nest")
                    })
            });
            l.len() == 2 && running == 1 && held.count() == 1
        },
    )
    .unwrap();

    // The connected Nest goes away: the refused one, still retrying, gets in.
    nest_a.proc.kill9();
    wait_for("nest-b registered", Duration::from_secs(30), || {
        hub.nests()
            .ok()?
            .iter()
            .any(|n| n["name"] == "nest-b" && n["state"] == "ready")
            .then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\nnest-b log:\n{}", nest_b.log_text()));
    nest_b.stop(Duration::from_secs(5));
}

/// `agen_hub_limit_refused_total{limit="nests"}` from the Hub's `/metrics`.
fn refused_nests(port: u16) -> f64 {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("agen_hub_limit_refused_total{limit=\"nests\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no nests refusal series in:\n{text}"))
}
