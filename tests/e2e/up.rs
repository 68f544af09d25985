//! `agen up` — the README's first command: a Hub and local Nests in one process, with the
//! example bundle deployed and visible in `agen ps`.

use std::process::Command;
use std::time::Duration;

use agen_tests::{agen_bin, cli, free_port, wait_for, workspace_root, Proc};
use serde_json::Value;

#[test]
fn agen_up_runs_a_hub_and_nests_with_the_example_deployed() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("config.toml");
    let data = tmp.path().join("data");
    let port = free_port();
    let mut cmd = Command::new(agen_bin());
    cmd.args([
        "up",
        "--run-as-self",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--nests",
        "2",
        "--deploy",
    ])
    .arg(workspace_root().join("examples/hello"))
    .arg("--data-dir")
    .arg(&data)
    .env("AGEN_CONFIG", &config);
    let mut up = Proc::spawn("agen up", cmd, &tmp.path().join("up.log")).unwrap();

    // Once deployed, `agen up` prints the instances table.
    wait_for(
        "agen up to deploy the example and print agen ps",
        Duration::from_secs(90),
        || {
            let log = up.log_text();
            (log.contains("hello") && log.contains("running")).then_some(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", up.log_text()));

    // It wrote the client config and the join token.
    assert!(config.exists(), "client config written");
    let token = std::fs::read_to_string(data.join("join-token")).unwrap();
    assert!(token.trim().starts_with("agen1."), "{token}");
    // It says how to join with the file, never the token itself.
    assert!(up.log_text().contains("--join-file"), "{}", up.log_text());
    // And where the web console is.
    assert!(
        up.log_text()
            .contains(&format!("web console: https://127.0.0.1:{port}/ui/")),
        "{}",
        up.log_text()
    );
    assert!(
        !up.log_text().contains(token.trim()),
        "agen up printed the join token"
    );

    let out = cli(&config, &["ps", "--all", "-o", "json"]).unwrap();
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    let hello: Vec<&Value> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["deployment"] == "hello")
        .collect();
    assert_eq!(hello.len(), 1, "{list}");
    assert_eq!(hello[0]["state"], "running");
    assert_eq!(hello[0]["healthy"], true);
    assert!(
        hello[0]["tools_loaded"].as_u64().unwrap() >= 5,
        "the notes workspace tools: {}",
        hello[0]
    );

    let out = cli(&config, &["nests", "-o", "json"]).unwrap();
    let nests: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(nests.as_array().unwrap().len(), 2, "{nests}");
    assert!(nests
        .as_array()
        .unwrap()
        .iter()
        .all(|n| n["state"] == "ready"));

    // SIGTERM stops everything gracefully, instances and tool servers included.
    up.stop(Duration::from_secs(20));
    assert!(
        up.log_text().contains("agen up: stopped"),
        "{}",
        up.log_text()
    );
    wait_for(
        "no process left under the data dir",
        Duration::from_secs(10),
        || agen_tests::processes_under(&data).is_empty().then_some(()),
    )
    .unwrap();
}
