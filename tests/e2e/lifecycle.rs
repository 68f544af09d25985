//! Day-2 operations (issue 21): deployment lifecycle (`agen deploy` named after the bundle,
//! `scale`, `history`, `rollback`, `rm`) on a real Hub and Nest.

use std::path::Path;
use std::time::Duration;

use agen_tests::{mcp_json, write_bundle, HubProcess};
use serde_json::Value;

/// A bundle with no tool servers (instances start in a moment); `prompt` makes versions.
fn bundle(dir: &Path, prompt: &str) {
    write_bundle(
        dir,
        &[
            ("mcp.json", mcp_json(&[])),
            (
                "x-agen/agent.md",
                format!(
                    "---\nname: life-agent\nmodel: openai/fake-model\nbaseUrl: http://127.0.0.1:9/v1\n---\n{prompt}\n"
                ),
            ),
        ],
    )
    .expect("write bundle");
}

fn ok(hub: &HubProcess, args: &[&str]) -> String {
    let out = hub.cli(args).unwrap();
    assert!(
        out.status.success(),
        "agen {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn history(hub: &HubProcess, name: &str) -> Vec<Value> {
    hub.cli_json(&["history", name, "-o", "json"])
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn digest(hub: &HubProcess, name: &str) -> String {
    let list = hub.cli_json(&["ps", "-o", "json"]).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {list}"))["bundle_digest"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn running_of(hub: &HubProcess, name: &str) -> Vec<Value> {
    hub.instances()
        .unwrap()
        .into_iter()
        .filter(|i| i["deployment"] == name && i["state"] == "running")
        .collect()
}

#[test]
fn deploy_scale_history_rollback_and_rm_without_the_bundle_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = HubProcess::start(tmp.path()).unwrap();
    let _nest = hub.nest("solo", &[], &[]).unwrap();
    let dir = tmp.path().join("bundle");

    // No --name: the deployment is named after the bundle.
    bundle(&dir, "Version one.");
    ok(&hub, &["deploy", dir.to_str().unwrap(), "--wait"]);
    let d1 = digest(&hub, "life-agent");
    bundle(&dir, "Version two.");
    ok(&hub, &["deploy", dir.to_str().unwrap(), "--wait"]);
    let d2 = digest(&hub, "life-agent");
    assert_ne!(d1, d2);

    // Scale without the folder: the running instance stays, one more starts.
    std::fs::remove_dir_all(&dir).unwrap();
    let before: Vec<String> = running_of(&hub, "life-agent")
        .iter()
        .map(|i| i["instance"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(before.len(), 1);
    ok(&hub, &["scale", "life-agent", "2", "--wait"]);
    let after = running_of(&hub, "life-agent");
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(
        after.iter().any(|i| i["instance"] == before[0].as_str()),
        "scaling did not restart {}: {after:?}",
        before[0]
    );

    let h = history(&hub, "life-agent");
    let rows: Vec<(u64, String, u64, String, bool)> = h
        .iter()
        .map(|r| {
            (
                r["generation"].as_u64().unwrap(),
                r["bundle_digest"].as_str().unwrap().to_owned(),
                r["replicas"].as_u64().unwrap(),
                r["change"].as_str().unwrap().to_owned(),
                r["current"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            (1, d1.clone(), 1, "deploy".into(), false),
            (2, d2.clone(), 1, "deploy".into(), false),
            (3, d2.clone(), 2, "scale".into(), true),
        ]
    );
    for r in &h {
        let by = r["deployed_by"].as_str().unwrap();
        assert!(by.starts_with("admin (") && by.contains('@'), "{r}");
        assert!(r["created_at"].is_string(), "{r}");
    }
    let table = ok(&hub, &["history", "life-agent"]);
    assert!(table.starts_with("GENERATION"), "{table}");
    assert_eq!(table.lines().count(), 4, "{table}");

    // Rollback with no generation: back to the previous bundle, replicas kept.
    ok(&hub, &["rollback", "life-agent", "--wait"]);
    assert_eq!(digest(&hub, "life-agent"), d1);
    assert_eq!(running_of(&hub, "life-agent").len(), 2);
    // ... and to a named generation.
    let v = hub
        .cli_json(&[
            "rollback",
            "life-agent",
            "--to-generation",
            "2",
            "-o",
            "json",
        ])
        .unwrap();
    assert_eq!(v["bundle_digest"], d2.as_str());
    assert_eq!(v["generation"], 5);
    let h = history(&hub, "life-agent");
    let changes: Vec<&str> = h.iter().map(|r| r["change"].as_str().unwrap()).collect();
    assert_eq!(
        changes,
        vec![
            "deploy",
            "deploy",
            "scale",
            "rollback to generation 1",
            "rollback to generation 2"
        ]
    );
    let out = hub
        .cli(&["rollback", "life-agent", "--to-generation", "99"])
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "an unknown generation");

    // rm: the deployment, its instances and its history go.
    ok(&hub, &["rm", "life-agent"]);
    assert_eq!(
        hub.cli_json(&["ps", "-o", "json"]).unwrap(),
        Value::Array(vec![])
    );
    hub.wait_instances(
        "the removed deployment's instances to end",
        Duration::from_secs(30),
        |l| !l.iter().any(|i| i["deployment"] == "life-agent"),
    )
    .unwrap();
    let out = hub.cli(&["history", "life-agent"]).unwrap();
    assert_eq!(out.status.code(), Some(4));
    let lost = hub
        .instances()
        .unwrap()
        .iter()
        .filter(|i| i["state"] == "lost")
        .count();
    assert_eq!(lost, 0);
}
